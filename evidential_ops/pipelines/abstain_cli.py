"""`python -m evidential_ops abstain`: calibrate one score of a checkpoint at a guaranteed error
level and answer queries with abstention (`risk_control`).

The checkpoint's test gallery plays the deployed gallery. A seeded random share of the test
queries of the chosen direction (`--calibration-share`, labels used) calibrates the threshold;
the other test queries, and the OOD queries when the data has them, are then answered or
abstained on. Writes OUT/abstain_<direction>_<score>.json: the rule (threshold, direction,
guarantee), what it did on the held-out queries (answered share, realised error, every query's
answer: the top-1 gallery index or null for an abstention) and on the OOD queries.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from .. import risk_control
from .analysis import jsonable
from .baseline import infonce_baseline
from .cli import HelpFormatter, at_least, device_option, refused_inputs
from .distributed import refuse_torchrun
from .quality import DIRECTIONS, quality_of
from .recipes import Recipe
from .runner import _build, load_data
from .training import load_checkpoint

__all__ = ["CalibrationRefused", "add_abstain_subcommand", "calibrate_checkpoint"]


class CalibrationRefused(ValueError):
    """What calibrate_checkpoint cannot do with the options given: an unknown direction or score,
    a calibration share outside (0, 1), too few queries to certify anything."""


def _probability(text: str) -> float:
    import argparse

    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {value}")
    return value


def _load(checkpoint, device: str, baseline: bool):
    """(method name as scored, model, benchmark) of a checkpoint written by train or demo."""
    state = load_checkpoint(checkpoint)
    fields = dict(state["recipe"])
    fields["languages"] = tuple(fields["languages"])
    recipe = Recipe(**fields)
    bench = load_data(state["data"])
    model = _build(recipe, bench, state["seed"], device)
    if baseline:
        if state.get("baseline_state") is None:
            raise SystemExit(f"--baseline: {checkpoint} holds no InfoNCE baseline (train it with demo or "
                             f"train --baseline)")
        contrastive = infonce_baseline(state["method"], model)
        contrastive.load_state_dict(state["baseline_state"])
        return "infonce", state, contrastive, bench
    model.load_state_dict(state["model_state"])
    return state["method"], state, model, bench


@torch.no_grad()
def calibrate_checkpoint(checkpoint, *, score: str, direction: str, alpha: float, delta: float,
                         calibration_share: float = 0.5, seed: int = 0, baseline: bool = False,
                         device: str = "cpu") -> dict:
    """Calibrate `score` (an uncertainty name of `quality.quality_of`: u, neg_top_belief,
    neg_top1_similarity, neg_top_probability, ...) of the checkpoint's `direction` queries on a
    seeded `calibration_share` of its test queries, and answer the rest and the OOD queries.
    Returns the JSON-able result (see the module docstring); CalibrationRefused for an unknown
    score or direction, or a calibration part too small to certify anything."""
    if direction not in DIRECTIONS:
        raise CalibrationRefused(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not 0.0 < calibration_share < 1.0:
        raise CalibrationRefused(f"calibration_share must lie in (0, 1), got {calibration_share}")
    method, state, model, bench = _load(checkpoint, device, baseline)
    relevance = "label" if state["method"] == "fume" else "instance"
    raw = {}
    quality_of(method, model, bench, seed=state["seed"], relevance=relevance, keep_scores=raw)
    d = raw[direction]
    if score not in d["scores"]:
        raise CalibrationRefused(f"score {score!r} is not one of {method}'s {direction} scores: {sorted(d['scores'])}")
    # Every score here is an uncertainty (higher = less sure): confidences enter negated (SPEC §6).
    u = d["scores"][score].double().numpy()
    wrong = d["wrong"].numpy()
    n = u.size
    order = np.random.default_rng(seed).permutation(n)
    n_cal = int(round(calibration_share * n))
    cal, held = np.sort(order[:n_cal]), np.sort(order[n_cal:])
    try:
        rule = risk_control.calibrate(u[cal], ~wrong[cal], alpha, delta, higher_is_uncertain=True, seed=seed)
    except risk_control.TooFewQueries as error:
        raise CalibrationRefused(str(error)) from error
    answer = risk_control.apply(u[held], rule)
    top1 = d["top1"].numpy()
    result = {
        "checkpoint": os.fspath(checkpoint), "method": state["method"], "model": method, "direction": direction,
        "score": score, "higher_is_uncertain": True, "calibration": rule.summary(),
        "guarantee": (f"with probability >= {1 - delta:g} over the calibration queries, the error rate among answered "
                      f"queries drawn like them (same gallery, same distribution) is <= {alpha:g}"
                      if rule.certified else "nothing certified: abstain on every query"),
        "calibration_queries": cal.tolist(),
        "held_out": {"n_queries": int(held.size), "answered": int(answer.sum()),
                     "coverage": float(answer.mean()) if held.size else 0.0,
                     "realised_error": float(wrong[held][answer].mean()) if answer.any() else None,
                     "answers": [{"query": int(q), "answer": int(top1[q]) if a else None}
                                 for q, a in zip(held, answer)]},
    }
    if d["ood_scores"] is not None:
        ood_answer = risk_control.apply(d["ood_scores"][score].double().numpy(), rule)
        ood_top1 = d["ood_top1"].numpy()
        result["ood"] = {"n_queries": int(ood_answer.size), "answered": int(ood_answer.sum()),
                         "coverage": float(ood_answer.mean()) if ood_answer.size else 0.0,
                         "note": "OOD queries have no relevant item in the gallery: every answer is wrong",
                         "answers": [{"query": q, "answer": int(ood_top1[q]) if a else None}
                                     for q, a in enumerate(ood_answer.tolist())]}
    return result


def _run(args) -> int:
    refuse_torchrun("abstain")
    with refused_inputs("--checkpoint"):
        try:
            result = calibrate_checkpoint(args.checkpoint, score=args.score, direction=args.direction,
                                          alpha=args.alpha, delta=args.delta, calibration_share=args.calibration_share,
                                          seed=args.seed, baseline=args.baseline, device=args.device)
        except CalibrationRefused as error:
            raise SystemExit(f"abstain: {error}") from None
    out = Path(args.out or Path(args.checkpoint).parent)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"abstain_{args.direction}_{args.score}{'_infonce' if args.baseline else ''}.json"
    with open(path, "w") as f:
        json.dump(jsonable(result), f, indent=1, allow_nan=False)
    c, held = result["calibration"], result["held_out"]
    print(f"{result['model']} {args.direction} score {args.score}: {c['rule']} "
          f"(calibrated on {c['n_calibration']} test queries at α = {args.alpha:g}, δ = {args.delta:g}; "
          f"p-value {c['p_value']:.3g})")
    print(f"guarantee: {result['guarantee']}")
    error = "-" if held["realised_error"] is None else f"{100 * held['realised_error']:.1f} %"
    print(f"held-out test queries: answered {held['answered']} of {held['n_queries']} "
          f"({100 * held['coverage']:.1f} %), realised error among them {error}")
    if "ood" in result:
        o = result["ood"]
        print(f"OOD queries (not covered by the guarantee): answered {o['answered']} of {o['n_queries']}"
              + (", every one wrong (no relevant item in the gallery)" if o["answered"] else ""))
    print(f"wrote {path}")
    return 0


def add_abstain_subcommand(sub) -> None:
    """Register `abstain` on an argparse subparsers object."""
    p = sub.add_parser("abstain", formatter_class=HelpFormatter, description=__doc__, help="calibrate a checkpoint's score at a guaranteed error rate and answer "
                                       "with abstention")
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt written by train or demo")
    p.add_argument("--score", required=True,
                   help="uncertainty to calibrate, e.g. u, neg_top_belief, dissonance, neg_top1_similarity, "
                        "neg_margin (u_s, u_d for duq; u_query, u_pair_top1 for fume; neg_top_probability with "
                        "--baseline)")
    p.add_argument("--direction", default="t2i", choices=DIRECTIONS, help="query direction")
    p.add_argument("--alpha", type=_probability, default=0.1,
                   help="error rate among answered queries to guarantee")
    p.add_argument("--delta", type=_probability, default=0.1,
                   help="allowed probability that the guarantee fails")
    p.add_argument("--calibration-share", type=_probability, default=0.5,
                   help="share of the test queries that calibrates; the rest are answered")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the calibration split")
    p.add_argument("--baseline", action="store_true", help="calibrate the checkpoint's InfoNCE baseline instead")
    p.add_argument("--out", default=None, help="output directory (default: next to the checkpoint)")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device of the model")
    p.set_defaults(run=_run)
