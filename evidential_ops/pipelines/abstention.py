"""Calibrated abstention of every score and direction of a trained model (`risk_control`).

The test queries of a direction stand for the queries a deployed gallery serves. Each of
`n_splits` random splits cuts them in two halves: the calibration half picks the threshold of a
score at error level α with confidence 1 − δ (`risk_control.calibrate`), the other half is
answered with it (`risk_control.apply`). Per score this reports

- validity: the share of splits whose threshold has an error rate ≤ α among *all* test queries
  it answers. The halves are drawn from the test set, so the test set is the population of this
  experiment and that rate is the selective risk the guarantee bounds: the share must be
  ≥ 1 − δ up to the noise of `n_splits` splits (a split that certifies nothing counts as valid).
  Drawing without replacement is expected only to help: the hypergeometric law of the
  calibration errors is more concentrated than the binomial the p-values assume (Hoeffding 1963,
  §6, in the convex order); this column is the empirical check;
- held-out validity: the share of splits whose realised error among the answered held-out
  queries is ≤ α. Not guaranteed: a finite batch scatters around the selective risk (binomial
  noise), and the two halves of one test set err in opposite directions (the errors a lucky
  calibration half lacks are in the held-out half), so it can fall below 1 − δ;
- coverage: the mean share of held-out queries answered; error: the mean realised error among
  them (over the splits that answer something); certified: the share of splits that certify a
  threshold at all;
- the shift counterexample (with an "ood" split): the same thresholds applied to a stream of the
  held-out half plus every OOD query (unseen concepts over the same gallery, whose top-1 is
  wrong by construction): the share of OOD queries answered, and the stream's realised error
  and validity. Exchangeability is broken there, and nothing is guaranteed.

`coverage_curves` gives the mean coverage against α (fewer splits) for the plot.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import risk_control
from ..metrics import risk_coverage_curve

__all__ = ["ALPHA", "ALPHA_GRID", "DELTA", "N_SPLITS", "abstention_lines", "abstention_report", "split_experiment"]

ALPHA, DELTA = 0.1, 0.1
N_SPLITS = 200
CURVE_SPLITS = 40
ALPHA_GRID = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
CALIBRATION_SHARE = 0.5


def _numpy(a) -> np.ndarray:
    return a.detach().cpu().double().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.float64)


def split_experiment(scores, wrong, *, alpha: float = ALPHA, delta: float = DELTA, n_splits: int = N_SPLITS,
                     seed: int = 0, ood_scores=None) -> dict:
    """Calibrate on a random half of the queries, answer the other half, `n_splits` times.

    scores: (N,) uncertainty (higher = less sure) of the in-distribution queries; wrong: (N,)
    bool, their top-1 is wrong; ood_scores: optional (N_ood,) the same score of OOD queries
    (every one counted wrong). Returns {"validity", "held_out_validity", "coverage", "error",
    "certified"} (module docstring) and with
    ood_scores {"ood_answered", "mixed_error", "mixed_validity"}: means over the splits, error
    means over the splits that answer something (None when none does).
    """
    s, w = _numpy(scores), _numpy(wrong).astype(bool)
    ood = None if ood_scores is None else _numpy(ood_scores)
    n = s.size
    n_cal = int(round(CALIBRATION_SHARE * n))
    n_tested = n_cal - int(round(risk_control.DEFAULT_LEARN_FRACTION * n_cal))
    if n_tested < risk_control.minimum_test_size(alpha, delta):
        # Too few queries to certify anything: say so instead of reporting an empty experiment.
        none = {"validity": None, "held_out_validity": None, "coverage": None, "error": None, "certified": None,
                "too_few_queries": f"{n} queries: a calibration half tests {n_tested} < "
                                   f"{risk_control.minimum_test_size(alpha, delta)} needed at α = {alpha}, δ = {delta}"}
        if ood is not None:
            none.update(ood_answered=None, mixed_error=None, mixed_validity=None)
        return none
    rng = np.random.default_rng(seed)
    valid, held_valid, coverage, errors, certified = [], [], [], [], []
    ood_answered, mixed_errors, mixed_valid = [], [], []
    for split in range(n_splits):
        order = rng.permutation(n)
        cal, held = order[:n_cal], order[n_cal:]
        rule = risk_control.calibrate(s[cal], ~w[cal], alpha, delta, higher_is_uncertain=True, seed=split)
        answer = risk_control.apply(s[held], rule)
        everywhere = risk_control.apply(s, rule)
        valid.append(not everywhere.any() or w[everywhere].mean() <= alpha)
        wrong_answers = int(w[held][answer].sum())
        certified.append(rule.certified)
        coverage.append(answer.mean())
        if answer.any():
            errors.append(wrong_answers / answer.sum())
        held_valid.append(not answer.any() or wrong_answers / answer.sum() <= alpha)
        if ood is not None:
            ood_answer = risk_control.apply(ood, rule)
            ood_answered.append(ood_answer.mean())
            answered = answer.sum() + ood_answer.sum()
            mixed = (wrong_answers + ood_answer.sum()) / answered if answered else 0.0
            if answered:
                mixed_errors.append(mixed)
            mixed_valid.append(mixed <= alpha)
    out = {"validity": float(np.mean(valid)), "held_out_validity": float(np.mean(held_valid)),
           "coverage": float(np.mean(coverage)),
           "error": float(np.mean(errors)) if errors else None, "certified": float(np.mean(certified))}
    if ood is not None:
        out.update(ood_answered=float(np.mean(ood_answered)),
                   mixed_error=float(np.mean(mixed_errors)) if mixed_errors else None,
                   mixed_validity=float(np.mean(mixed_valid)))
    return out


def coverage_curves(scores, wrong, *, delta: float = DELTA, alphas=ALPHA_GRID, n_splits: int = CURVE_SPLITS,
                    seed: int = 0) -> dict:
    """Mean held-out coverage (and validity) at each α of `alphas` over `n_splits` halves.
    Returns {"alpha": [...], "coverage": [...], "validity": [...]}."""
    rows = [split_experiment(scores, wrong, alpha=a, delta=delta, n_splits=n_splits, seed=seed) for a in alphas]
    nan = float("nan")  # too few queries at that α: a gap in the plot
    return {"alpha": list(alphas), "coverage": [nan if r["coverage"] is None else r["coverage"] for r in rows],
            "validity": [nan if r["validity"] is None else r["validity"] for r in rows]}


def abstention_report(raw: dict, *, seed: int = 0, alpha: float = ALPHA, delta: float = DELTA,
                      n_splits: int = N_SPLITS, curves: bool = True) -> tuple[dict, dict]:
    """(report, curves) for the scores `quality.quality_of(..., keep_scores=raw)` collected.

    raw: {direction: {"scores": {name: (N,)}, "wrong": (N,) bool, "baselines": [names],
    "ood_scores": {name: (N_ood,)} or None}}. report: {"alpha", "delta", "n_splits",
    "calibration_share", direction: {"n_queries", "error_rate", "scores": {name:
    `split_experiment` plus "hindsight_coverage" (the largest most-certain-first share whose error
    on the whole test set is ≤ α, labels known, no guarantee) and with curves "coverage_by_alpha"
    ({α: mean coverage} over `CURVE_SPLITS` splits)}, "baselines", "most_answered": the score with the largest mean
    coverage among those whose validity ≥ 1 − δ (None if none answers)}}; curves: {direction:
    {name: `coverage_curves`}} (empty with curves=False).
    """
    report = {"alpha": alpha, "delta": delta, "n_splits": n_splits, "calibration_share": CALIBRATION_SHARE}
    plot = {}
    for direction, d in raw.items():
        wrong = _numpy(d["wrong"]).astype(bool)
        ood = d.get("ood_scores")
        rows = {name: split_experiment(u, wrong, alpha=alpha, delta=delta, n_splits=n_splits, seed=seed,
                                       ood_scores=None if ood is None else ood[name])
                for name, u in d["scores"].items()}
        for name, u in d["scores"].items():
            # Without any guarantee, knowing every label: the most queries answered most-certain-first
            # whose error is ≤ α on the whole test set. What a calibration half could hope to certify.
            curve = risk_coverage_curve(u, torch.as_tensor(wrong))
            within = curve["coverage"][curve["risk"] <= alpha + 1e-12]
            rows[name]["hindsight_coverage"] = float(within.max()) if within.size else 0.0
        eligible = {name: r["coverage"] for name, r in rows.items()
                    if r["validity"] is not None and r["validity"] >= 1 - delta and r["coverage"] > 0}
        report[direction] = {"n_queries": int(wrong.size), "error_rate": float(wrong.mean()), "scores": rows,
                             "baselines": list(d.get("baselines", [])),
                             "most_answered": max(eligible, key=eligible.get) if eligible else None}
        if curves:
            plot[direction] = {name: coverage_curves(u, wrong, delta=delta, seed=seed) for name, u in d["scores"].items()}
            for name, c in plot[direction].items():
                rows[name]["coverage_by_alpha"] = {f"{a:g}": (None if v != v else v)
                                                   for a, v in zip(c["alpha"], c["coverage"])}
    return report, plot


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def abstention_lines(report: dict, who: str) -> list[str]:
    """The console table of `abstention_report`, one block per direction."""
    lines = [f"abstention of {who} at α = {report['alpha']}, δ = {report['delta']} ({report['n_splits']} random "
             f"calibration/held-out halves of the test queries; validity = share of splits whose threshold errs on "
             f"≤ α of the test queries it answers, guaranteed ≥ {1 - report['delta']:.2f}; held-out = the same for "
             f"the realised error on the held-out half, not guaranteed; coverage = share of held-out queries "
             f"answered, error = their realised error; hindsight = the share answerable at error ≤ α knowing every "
             f"label, no guarantee):"]
    for direction in ("i2t", "t2i"):
        q = report.get(direction)
        if q is None:
            continue
        has_ood = any("ood_answered" in r for r in q["scores"].values())
        lines.append(f"  {direction}: {q['n_queries']} queries, error rate of the top-1 {100 * q['error_rate']:.1f} %")
        head = (f"    {'score':<32}{'validity':>9}{'held-out':>9}{'coverage':>9}{'error':>7}{'certified':>10}"
                f"{'hindsight':>10}")
        if has_ood:
            head += f"{'OOD answered':>13}{'with OOD: error':>16}{'held-out':>9}"
        lines.append(head)
        for name, r in q["scores"].items():
            label = name + (" (baseline)" if name in q["baselines"] else "")
            if r.get("too_few_queries"):
                lines.append(f"    {label:<32}not measured: {r['too_few_queries']}")
                continue
            row = (f"    {label:<32}{r['validity']:>9.3f}{r['held_out_validity']:>9.3f}{r['coverage']:>9.3f}"
                   f"{_fmt(r['error']):>7}"
                   f"{r['certified']:>10.2f}{r['hindsight_coverage']:>10.3f}")
            if has_ood:
                row += f"{r['ood_answered']:>13.3f}{_fmt(r['mixed_error']):>16}{r['mixed_validity']:>9.3f}"
            lines.append(row)
        best = q["most_answered"]
        lines.append("    most answered at the guaranteed error: "
                     + (f"{best} ({100 * q['scores'][best]['coverage']:.1f} % of queries)" if best else "none"))
    return lines
