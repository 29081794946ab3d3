"""Calibrated abstention of every method's scores over several seeds: how many test queries each
score answers at a guaranteed error level, and whether the guarantee holds.

    python scripts/abstention.py --seeds 0 1 2 --out runs/abstention --results bench/results

trains each method of the demo with its same-encoder InfoNCE baseline (`pipelines.run_training`,
no plots) once per seed on the built-in data and keeps the "abstention" block of its metrics
(`pipelines.abstention`: per direction and score, at α = δ = 0.1 over 200 random
calibration/held-out halves of the test queries, validity, coverage, realised error, the share
answerable in hindsight, coverage at other α, and the OOD counterexample). It writes
RESULTS/abstention.json (every seed's figures, the means, command, commit, versions) and
RESULTS/abstention.md (the tables and the closing note, computed from the means).

RESULTS defaults to --out; the committed bench/results/ is written only by a full run (every
method at the recipes' own sizes and epochs).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from evidential_ops.pipelines import DataSource, get_recipe, run_training
from evidential_ops.pipelines.analysis import jsonable
from evidential_ops.pipelines.quality import PRIMARY_SCORE

METHODS = ("tcl", "tcvse", "uml", "fume", "duq")
NAMES = {"tcl": "TCL", "tcvse": "TcVSE", "uml": "UML", "fume": "FUME", "duq": "DUQ"}
SCORE_LABELS = {
    "u": "u = N/S (vacuity)", "u_s": "u_s (ISUM vacuity)", "u_d": "u_d (distance vacuity, as eq. 16 defines it)",
    "dissonance": "dissonance (top-10)", "neg_top_belief": "−top belief",
    "u_query": "u (query's decision uncertainty)", "u_pair_top1": "u (query ⊕ top-1 result, eq. 10)",
    "neg_top1_similarity": "baseline: −top-1 similarity", "neg_margin": "baseline: −top-1/top-2 margin",
}
INFONCE_LABELS = {
    "neg_top_probability": "InfoNCE baseline: −softmax confidence",
    "neg_top_class_probability": "InfoNCE baseline: −softmax summed over the top-1's class",
    "neg_top1_similarity": "InfoNCE baseline: −top-1 similarity",
    "neg_margin": "InfoNCE baseline: −top-1/top-2 margin",
}
KEEP = ("validity", "held_out_validity", "coverage", "error", "certified", "hindsight_coverage", "ood_answered", "mixed_error",
        "mixed_validity")
COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def _scores(block: dict) -> dict:
    out = {}
    for d in ("i2t", "t2i"):
        q = block[d]
        out[d] = {"n_queries": q["n_queries"], "error_rate": q["error_rate"], "most_answered": q["most_answered"],
                  "scores": {name: {**{k: r.get(k) for k in KEEP}, "coverage_by_alpha": r.get("coverage_by_alpha")}
                             for name, r in q["scores"].items()}}
    return out


def _run(method: str, seed: int, args) -> dict:
    recipe = get_recipe(method)
    if args.epochs is not None:
        recipe = recipe.with_overrides(epochs=args.epochs)
    source = DataSource.synthetic(recipe, seed=seed, n_train=args.n_train, n_test=args.n_test, n_ood=args.n_ood)
    start = time.perf_counter()
    metrics = run_training(method, recipe, source, Path(args.out) / f"seed{seed}" / method, seed=seed, quiet=True,
                           baseline=True, plots=False, log=lambda *_: None)
    print(f"{method} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    return {"alpha": metrics["abstention"]["alpha"], "delta": metrics["abstention"]["delta"],
            "n_splits": metrics["abstention"]["n_splits"], "method": _scores(metrics["abstention"]),
            "infonce": _scores(metrics["infonce_baseline"]["abstention"])}


def _mean(values: list):
    """Elementwise mean of nested dicts of numbers over the seeds that have a value (a realised
    error exists only where something was answered); None where no seed has one; strings kept
    when every seed agrees, else the list of them."""
    first = next((v for v in values if v is not None), None)
    if isinstance(first, dict):
        return {k: _mean([None if v is None else v.get(k) for v in values]) for k in first}
    present = [v for v in values if v is not None]
    if not present:
        return None
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return float(np.mean(present))
    return first if all(v == first for v in values) else list(values)


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _percent(share: float) -> str:
    if share == 0:
        return "0 %"
    return f"{100 * share:.1f} %" if share >= 0.0005 else "< 0.1 %"


def _rows(part: dict, labels: dict, only=None):
    for name, r in part["scores"].items():
        if only is None or name in only:
            yield labels.get(name, name), name, r


def _best(part: dict, labels: dict, delta: float):
    """(coverage, label) of the score of `part` with the largest mean coverage at α among those
    whose mean validity is ≥ 1 − δ; None when none answers anything."""
    candidates = [(r["coverage"], label) for label, _, r in _rows(part, labels)
                  if r["validity"] is not None and r["validity"] >= 1 - delta and r["coverage"]]
    return max(candidates) if candidates else None


def markdown(results: dict) -> str:
    """The tables of docs/abstention.md and the closing note, from the means."""
    means, seeds = results["means"], results["seeds"]
    alpha, delta = results["alpha"], results["delta"]
    out = [f"Means over seeds {', '.join(map(str, seeds))} (`{results['command']}`, commit {results['commit']}).",
           "",
           f"Each score is calibrated at α = {alpha}, δ = {delta} on a random half of the test queries and applied "
           f"to the other half, {results['n_splits']} times per seed. validity: share of splits whose threshold errs "
           f"on ≤ α of all the test queries it answers (the test set is the population the halves are drawn from: "
           f"this is the guaranteed quantity, ≥ {1 - delta:.2f}; a split that certifies nothing counts as valid); "
           "held-out validity: the same for the realised error among answered held-out queries (not guaranteed: "
           "a finite batch scatters, and the two halves of one test set err in opposite directions); coverage: "
           "mean share of held-out queries answered; error: mean realised error among them (over the splits and "
           "seeds that answer something); certified: share of splits that certify any threshold; hindsight: the "
           "largest most-certain-first share with error ≤ α on the whole test set, every label known (no "
           "guarantee: the ceiling); cov. α = 0.2 / 0.3: mean coverage at those levels (40 splits); OOD: the "
           "thresholds applied to the held-out half plus every OOD query (all wrong by construction): share of "
           "OOD queries answered, realised error and held-out validity of that stream.",
           ""]
    note = []
    for method in METHODS:
        m = means[method]
        out.append(f"#### {NAMES[method]}")
        out.append("")
        out.append("| direction | score | validity | held-out validity | coverage | error | certified | hindsight | "
                   "cov. α = 0.2 | cov. α = 0.3 | OOD answered | error with OOD | held-out validity with OOD |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for d in ("i2t", "t2i"):
            rows = list(_rows(m["method"][d], SCORE_LABELS))
            rows += list(_rows(m["infonce"][d], INFONCE_LABELS))
            for label, _, r in rows:
                by_alpha = r.get("coverage_by_alpha") or {}
                out.append(f"| {d} | {label} | {_fmt(r['validity'])} | {_fmt(r['held_out_validity'])} | "
                           f"{_fmt(r['coverage'])} | {_fmt(r['error'])} | "
                           f"{_fmt(r['certified'], 2)} | {_fmt(r['hindsight_coverage'])} | {_fmt(by_alpha.get('0.2'))} | "
                           f"{_fmt(by_alpha.get('0.3'))} | {_fmt(r['ood_answered'])} | {_fmt(r['mixed_error'])} | "
                           f"{_fmt(r['mixed_validity'])} |")
        out.append("")
        lowest = min((run[part][d]["scores"][name]["validity"], d, name)
                     for run in results["runs"][method] for part in ("method", "infonce") for d in ("i2t", "t2i")
                     for name in run[part][d]["scores"] if run[part][d]["scores"][name]["validity"] is not None)
        out.append(f"Lowest validity of any score, direction and seed: {lowest[0]:.3f} ({lowest[1]}, {lowest[2]}).")
        for d in ("i2t", "t2i"):
            own, theirs = _best(m["method"][d], SCORE_LABELS, delta), _best(m["infonce"][d], INFONCE_LABELS, delta)
            primary = m["method"][d]["scores"][PRIMARY_SCORE[method]]
            note.append(f"{NAMES[method]} {d}: " +
                        (f"{own[1]} answers {_percent(own[0])}" if own else "none of its scores answers a query") +
                        (f" (its primary score {SCORE_LABELS[PRIMARY_SCORE[method]]}: "
                         f"{_percent(primary['coverage'])})" if primary["coverage"] is not None else "") +
                        "; the InfoNCE baseline (another model, its own accuracy): " +
                        (f"{theirs[1].removeprefix('InfoNCE baseline: ')} answers {_percent(theirs[0])}"
                         if theirs else "nothing"))
        out.append("")
    out.append("#### Which score answers the most queries at the guaranteed error")
    out.append("")
    out.append(f"At α = {alpha}, δ = {delta}, the score with the largest mean coverage among those whose mean "
               f"validity is ≥ {1 - delta:.2f}, among the method's own scores and among its InfoNCE baseline's:")
    out.append("")
    out.extend(f"- {line}" for line in note)
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/abstention", help="run directories (metrics.json, checkpoints)")
    parser.add_argument("--results", default=None,
                        help="where the .json and .md go (default: --out; bench/results only for a full run)")
    parser.add_argument("--only", nargs="+", default=None, choices=METHODS, help="run only these methods")
    parser.add_argument("--epochs", type=int, default=None, help="override every recipe's epochs (smoke runs)")
    for name in ("n-train", "n-test", "n-ood"):
        parser.add_argument(f"--{name}", type=int, default=None, help="built-in data size override (smoke runs)")
    parser.add_argument("--markdown-from", default=None, metavar="JSON",
                        help="only recompute the means from the per-seed runs of an abstention.json this script "
                             "wrote, and re-render abstention.md next to it")
    args = parser.parse_args(argv)
    if args.markdown_from is not None:
        source = Path(args.markdown_from)
        results = json.loads(source.read_text())
        results["means"] = {method: _mean(runs) for method, runs in results["runs"].items()}
        source.write_text(json.dumps(jsonable(results), indent=1, allow_nan=False))
        (source.parent / "abstention.md").write_text(markdown(results))
        print(f"wrote {source} (means) and {source.parent / 'abstention.md'}")
        return 0
    results_dir = Path(args.out if args.results is None else args.results)
    partial = [flag for flag, value in (("--only", args.only), ("--epochs", args.epochs), ("--n-train", args.n_train),
                                        ("--n-test", args.n_test), ("--n-ood", args.n_ood)) if value is not None]
    if partial and results_dir.resolve() == COMMITTED_RESULTS:
        parser.error(f"--results {args.results}: {', '.join(partial)} make a partial run, which must not overwrite "
                     f"the committed {COMMITTED_RESULTS}; write it elsewhere (the default is --out)")
    methods = tuple(args.only) if args.only else METHODS
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    per_seed = {method: [] for method in methods}
    # Seed by seed, every method, and the files rewritten after each seed: a run cut short still
    # leaves the complete seeds behind (their list is in the files).
    for done, seed in enumerate(args.seeds, start=1):
        for method in methods:
            per_seed[method].append(_run(method, seed, args))
        _write(results_dir, per_seed, args.seeds[:done], commit, argv)
    return 0


def _write(results_dir: Path, per_seed: dict, seeds: list, commit: str, argv) -> None:
    first = next(iter(per_seed.values()))[0]
    results = {
        "command": "python scripts/abstention.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit, "seeds": seeds, "alpha": first["alpha"], "delta": first["delta"],
        "n_splits": first["n_splits"], "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "runs": per_seed,
        "means": {method: _mean(runs) for method, runs in per_seed.items()},
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / "abstention.json", "w") as f:
        json.dump(jsonable(results), f, indent=1, allow_nan=False)
    if set(METHODS) <= set(per_seed):
        (results_dir / "abstention.md").write_text(markdown(results))
    print(f"wrote {results_dir / 'abstention.json'} (seeds {', '.join(map(str, seeds))})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
