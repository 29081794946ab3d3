"""Evaluation of a trained method on its benchmark: the retrieval metrics (SPEC §4) plus the
uncertainty experiments of each paper, as JSON-able metrics and arrays for the plots.

- TCL / TcVSE: ensemble vs each model; query uncertainty at corruption ratios 0.0 / 0.3 / 0.6
  (TCL Fig. 5, TcVSE Fig. 3).
- UML: clean/noisy split accuracy and pair uncertainty of truly clean vs noisy training pairs
  (UML Fig. 5), vision ↔ non-English retrieval.
- FUME: mAP@all unfiltered vs filtered at cross-modal uncertainty 0.5 (Table 1), mAP against the
  deletion rate (Fig. 3), in- vs out-of-distribution cross-modal uncertainty (Fig. 4).
- DUQ: R@K with plain s vs the re-ranking of eq. 16; u_s on clean vs corrupted queries.

`summary_checks` turns the figures into the acceptance checks (values, pass flags and, for a
failing comparison, a note that says plainly what was not beaten). Beside the untrained model,
every method is compared with the same-encoder InfoNCE baseline trained in the same run (rSum,
FUME: mAP) and its primary uncertainty with the free scores of its own ranking (SPEC §6).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..data import corrupt_split
from ..data.types import CrossModalBenchmark
from ..metrics import auroc as _auroc
from ..metrics import retrieval_metrics
from ..models.tcl import uncertainty_summary

__all__ = ["RETRIEVAL_KEYS", "analyse", "auroc", "baseline_metrics", "summary_checks"]

RETRIEVAL_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum",
                  "i2t_medr", "i2t_meanr", "t2i_medr", "t2i_meanr")
CORRUPTION_RATIOS = (0.0, 0.3, 0.6)
# "Wide margin" over an untrained model, made concrete: rSum is a sum of six percentages
# (0-600, chance about 6 on 500 test images); mAP is in [0, 1] (chance about 1/C).
RSUM_MARGIN = 100.0
MAP_MARGIN = 0.3


def auroc(positive: Tensor, negative: Tensor) -> float:
    """P(a score of `positive` > one of `negative`), ties counting ½ (the Mann-Whitney AUROC,
    `metrics.auroc` on the two groups); NaN when a group is empty. Here: how well the
    uncertainty separates noisy from clean pairs, or OOD from in-distribution samples."""
    pos, neg = positive.double().flatten(), negative.double().flatten()
    flags = torch.cat([torch.ones(pos.numel(), dtype=torch.bool), torch.zeros(neg.numel(), dtype=torch.bool)])
    return _auroc(torch.cat([pos, neg]), flags) if pos.numel() and neg.numel() else float("nan")


def _retrieval(metrics: dict) -> dict:
    return {k: metrics[k] for k in RETRIEVAL_KEYS}


def _median(t: Tensor) -> float:
    return float(t.double().quantile(0.5))


def baseline_metrics(method: str, model: nn.Module, bench: CrossModalBenchmark) -> dict:
    """The retrieval keys (and FUME's mAP) of a model on the test split: used for the model
    before training, the "untrained" reference of the acceptance checks."""
    metrics = model.evaluate(bench.test)
    out = _retrieval(metrics)
    if method == "fume":
        out["map"] = metrics["map"]
    return out


def _analyse_tcl(model, bench: CrossModalBenchmark, seed: int, **_) -> tuple[dict, dict]:
    test = bench.test
    c = test.captions_per_image
    metrics, plot = {}, {"uncertainty_i2t": {}, "uncertainty_t2i": {}}
    corruption = {}
    for k, ratio in enumerate(CORRUPTION_RATIOS):
        split = test if ratio == 0.0 else corrupt_split(test, ratio, vocab=bench.vocab, vocab_alt=bench.vocab_alt,
                                                       seed=seed * 1000 + k)
        out = model.infer(split)
        ens = retrieval_metrics(out.similarity, c)
        corruption[f"{ratio:.1f}"] = {"rsum": ens["rsum"], **uncertainty_summary(out)}
        plot["uncertainty_i2t"][f"CR {ratio:.1f}"] = out.image_query_uncertainty.numpy()
        plot["uncertainty_t2i"][f"CR {ratio:.1f}"] = out.text_query_uncertainty.numpy()
        if ratio == 0.0:
            metrics.update(ens)
            metrics["model_a"] = retrieval_metrics(out.similarity_a, c)
            metrics["model_b"] = retrieval_metrics(out.similarity_b, c)
            metrics.update(uncertainty_summary(out))
            top = out.topk(k=5, direction="rows")
            metrics["example_i2t_top5"] = {
                "query": 0, "indices": top.indices[0].tolist(), "beliefs": top.beliefs[0].tolist(),
                "uncertainty": float(top.uncertainty[0]),
            }
    metrics["corruption"] = corruption
    return metrics, plot


def _analyse_uml(model, bench: CrossModalBenchmark, seed: int, *, audit_batches, history,
                 noise_ground_truth: bool, **_) -> tuple[dict, dict]:
    metrics = model.evaluate(bench.test)
    audit = model.audit(audit_batches)
    plot = {}
    judged_clean = audit["labels_vt"]
    u = audit["uncertainty_vt"]
    metrics["judged"] = {
        "pairs": int(judged_clean.numel()),
        "clean_fraction": float(judged_clean.double().mean()),
        "uncertainty_judged_clean_mean": float(u[judged_clean].double().mean()) if bool(judged_clean.any()) else float("nan"),
        "uncertainty_judged_noisy_mean": float(u[~judged_clean].double().mean()) if bool((~judged_clean).any()) else float("nan"),
    }
    if noise_ground_truth and "noisy" in audit:
        noisy = audit["noisy"]
        u = audit["uncertainty_vt"]
        metrics["audit"] = {
            "pairs": int(noisy.numel()),
            "noise_rate": float(noisy.double().mean()),
            "split_accuracy": float((audit["labels_vt"] == ~noisy).double().mean()),
            "clean_recall": float(audit["labels_vt"][~noisy].double().mean()) if bool((~noisy).any()) else float("nan"),
            "noisy_recall": float((~audit["labels_vt"][noisy]).double().mean()) if bool(noisy.any()) else float("nan"),
            "uncertainty_clean_mean": float(u[~noisy].double().mean()) if bool((~noisy).any()) else float("nan"),
            "uncertainty_noisy_mean": float(u[noisy].double().mean()) if bool(noisy.any()) else float("nan"),
            "uncertainty_clean_median": _median(u[~noisy]) if bool((~noisy).any()) else float("nan"),
            "uncertainty_noisy_median": _median(u[noisy]) if bool(noisy.any()) else float("nan"),
            "uncertainty_auroc_noisy": auroc(u[noisy], u[~noisy]),
            "uncertainty_min": float(u.min()),
            "uncertainty_max": float(u.max()),
        }
        if "similarity_vt" in audit:
            # The free baseline: a pair whose own cosine is low is suspect, no opinion needed.
            s = audit["similarity_vt"]
            metrics["audit"]["similarity_auroc_noisy"] = auroc(-s[noisy], -s[~noisy])
        plot["uncertainty"] = {"clean pairs": u[~noisy].numpy(), "noisy pairs": u[noisy].numpy()}
        if history and "split_accuracy" in history[-1]:
            metrics["last_epoch_split_accuracy"] = history[-1]["split_accuracy"]
    return metrics, plot


def _analyse_fume(model, bench: CrossModalBenchmark, seed: int, **_) -> tuple[dict, dict]:
    test = bench.test
    metrics = model.evaluate(test)
    curves = model.deletion_curves(test)
    metrics["deletion_curve"] = {name: {"deletion_rate": c["deletion_rate"].tolist(), "map": c["map"].tolist()}
                                 for name, c in curves.items()}
    plot = {"curves": curves}
    in_u = model.infer(test).pair_uncertainty(test.captions_per_image)
    metrics["id_cross_modal_uncertainty_median"] = _median(in_u)
    plot["uncertainty"] = {"in-distribution (test)": in_u.numpy()}
    if "ood" in bench:
        ood = bench.ood
        ood_u = model.infer(ood).pair_uncertainty(ood.captions_per_image)
        metrics["ood_cross_modal_uncertainty_median"] = _median(ood_u)
        metrics["ood_auroc"] = auroc(ood_u, in_u)
        plot["uncertainty"]["out-of-distribution"] = ood_u.numpy()
    return metrics, plot


def _analyse_duq(model, bench: CrossModalBenchmark, seed: int, **_) -> tuple[dict, dict]:
    test = bench.test
    metrics = model.evaluate(test, seed=seed)
    corrupted = corrupt_split(test, 0.6, vocab=bench.vocab, vocab_alt=bench.vocab_alt, seed=seed * 1000 + 7)
    clean_out, corrupt_out = model.infer(test, seed=seed), model.infer(corrupted, seed=seed)
    metrics["corrupted_0.6_similarity_uncertainty_t2v_median"] = _median(corrupt_out.similarity_uncertainty_t2v)
    plot = {"uncertainty": {"clean queries": clean_out.similarity_uncertainty_t2v.numpy(),
                            "corrupted queries (CR 0.6)": corrupt_out.similarity_uncertainty_t2v.numpy()}}
    return metrics, plot


_ANALYSES = {"tcl": _analyse_tcl, "tcvse": _analyse_tcl, "uml": _analyse_uml, "fume": _analyse_fume,
             "duq": _analyse_duq}


@torch.no_grad()
def analyse(method: str, model: nn.Module, bench: CrossModalBenchmark, *, seed: int = 0, audit_batches=None,
            history=(), noise_ground_truth: bool = False) -> tuple[dict, dict]:
    """(metrics, plot data) of a trained model on `bench`; see the module docstring.

    audit_batches: UML only, the training batches to audit the clean/noisy split on.
    history: the per-epoch training records.
    noise_ground_truth: the splits' "noisy" flags are the truth (synthetic data); precomputed
        data only has the default all-clean flags, so UML's split accuracy is not defined there.
    """
    if method not in _ANALYSES:
        raise ValueError(f"method must be one of {tuple(_ANALYSES)}, got {method!r}")
    if method == "uml" and audit_batches is None:
        raise ValueError("audit_batches is required for method='uml'")
    return _ANALYSES[method](model, bench, seed, audit_batches=audit_batches, history=list(history),
                             noise_ground_truth=noise_ground_truth)


def _check(value, passed, note: str | None = None) -> dict:
    out = {"value": value, "pass": bool(passed)}
    if note is not None:
        out["note"] = note
    return out


def _quality_checks(method: str, quality: dict, baseline: dict | None) -> dict:
    """The primary uncertainty of each direction against the free scores of the same ranking and,
    with a baseline, against the InfoNCE model's own confidence (SPEC §6): by AURC (the errors
    made answering the most certain queries first, which the more accurate model wins more
    easily) and by E-AURC (the same with each model's accuracy taken out)."""
    checks = {}
    primary = quality["primary_score"]
    for direction in ("i2t", "t2i"):
        q = quality[direction]
        mine = q["scores"][primary]
        best = max(q["baselines"], key=lambda name: q["scores"][name]["error_auroc"])
        theirs = q["scores"][best]["error_auroc"]
        checks[f"{primary}_error_auroc_vs_free_scores_{direction}"] = _check(
            [mine["error_auroc"], theirs], mine["error_auroc"] > theirs,
            f"{method}'s {primary} flags wrong {direction} top-1 results no better than {best} of the same ranking")
        if mine.get("ood_auroc") is not None:
            free = q["scores"]["neg_top1_similarity"]["ood_auroc"]
            checks[f"{primary}_ood_auroc_vs_neg_top1_similarity_{direction}"] = _check(
                [mine["ood_auroc"], free], mine["ood_auroc"] > free,
                f"{method}'s {primary} detects out-of-distribution {direction} queries no better than the top-1 "
                f"similarity")
        if baseline is not None:
            # AURC mixes each model's accuracy into the comparison; E-AURC (AURC minus the oracle's
            # at the same errors) compares only how well each score orders its own model's answers.
            other = baseline["uncertainty_quality"][direction]["scores"]["neg_top_probability"]
            checks[f"aurc_vs_infonce_{direction}"] = _check(
                [mine["aurc"], other["aurc"]], mine["aurc"] < other["aurc"],
                f"answering the most certain {direction} queries first, {method} with {primary} makes more "
                f"errors (AURC) than the InfoNCE baseline with its softmax confidence")
            checks[f"eaurc_vs_infonce_{direction}"] = _check(
                [mine["eaurc"], other["eaurc"]], mine["eaurc"] < other["eaurc"],
                f"with each model's accuracy taken out (E-AURC), {method}'s {primary} orders its {direction} "
                f"answers no better than the InfoNCE baseline's softmax confidence orders its own")
    return checks


def summary_checks(method: str, metrics: dict, untrained: dict | None, baseline: dict | None = None) -> dict:
    """The acceptance figures of one run as {name: {"value": ..., "pass": bool[, "note": str]}}.

    Every comparison can fail: against the untrained model, against the same-encoder InfoNCE
    baseline trained in the same run (`baseline`: its retrieval keys, mAP for FUME, and
    uncertainty quality), and the primary uncertainty against the free scores of the ranking.
    """
    checks = {}
    label = "mAP" if method == "fume" else "rSum"
    key = "map" if method == "fume" else "rsum"
    if untrained is not None:
        # FUME is label-based retrieval (paper Table 1: mAP@all); the instance methods use rSum.
        margin = MAP_MARGIN if method == "fume" else RSUM_MARGIN
        checks[f"{key}_vs_untrained"] = _check([metrics[key], untrained[key]], metrics[key] - untrained[key] >= margin,
                                               f"{method} is not {margin} {label} above an untrained model")
    if baseline is not None:
        checks[f"{key}_vs_infonce"] = _check(
            [metrics[key], baseline[key]], metrics[key] >= baseline[key],
            f"{method} does not beat the same-encoder InfoNCE baseline on {label} "
            f"({metrics[key]:.4g} vs {baseline[key]:.4g})")
    if "uncertainty_quality" in metrics:
        checks.update(_quality_checks(method, metrics["uncertainty_quality"], baseline))
    if method in ("tcl", "tcvse"):
        cr = metrics["corruption"]
        for d in ("i2t", "t2i"):
            lo, hi = cr["0.0"][f"uncertainty_{d}_median"], cr["0.6"][f"uncertainty_{d}_median"]
            checks[f"median_uncertainty_{d}_cr0.6_vs_cr0.0"] = _check([hi, lo], hi > lo)
        single = max(metrics["model_a"]["rsum"], metrics["model_b"]["rsum"])
        checks["ensemble_rsum_vs_best_single"] = _check([metrics["rsum"], metrics["model_a"]["rsum"],
                                                         metrics["model_b"]["rsum"]], metrics["rsum"] >= single)
    elif method == "uml" and "audit" in metrics:
        a = metrics["audit"]
        checks["split_accuracy"] = _check(a["split_accuracy"], a["split_accuracy"] >= 0.8)
        checks["uncertainty_noisy_vs_clean_mean"] = _check([a["uncertainty_noisy_mean"], a["uncertainty_clean_mean"]],
                                                           a["uncertainty_noisy_mean"] > a["uncertainty_clean_mean"])
        checks["uncertainty_noisy_vs_clean_median"] = _check(
            [a["uncertainty_noisy_median"], a["uncertainty_clean_median"]],
            a["uncertainty_noisy_median"] > a["uncertainty_clean_median"])
        if "similarity_auroc_noisy" in a:
            checks["noisy_auroc_u_vs_pair_similarity"] = _check(
                [a["uncertainty_auroc_noisy"], a["similarity_auroc_noisy"]],
                a["uncertainty_auroc_noisy"] > a["similarity_auroc_noisy"],
                "u separates noisy from clean training pairs no better than the pair's own similarity")
    elif method == "fume":
        checks["map_filtered_u0.5_vs_unfiltered"] = _check([metrics["map_filtered"], metrics["map"]],
                                                           metrics["map_filtered"] > metrics["map"])
        checks["map_filtered_zero_u0.5_vs_unfiltered"] = _check([metrics["map_filtered_zero"], metrics["map"]],
                                                                metrics["map_filtered_zero"] > metrics["map"])
        if "ood_cross_modal_uncertainty_median" in metrics:
            ood, ind = metrics["ood_cross_modal_uncertainty_median"], metrics["id_cross_modal_uncertainty_median"]
            checks["ood_vs_id_cross_modal_uncertainty_median"] = _check([ood, ind], ood > ind)
    elif method == "duq":
        plain = [metrics["i2t_r1"], metrics["t2i_r1"]]
        rerank = [metrics["reranked"]["i2t_r1"], metrics["reranked"]["t2i_r1"]]
        checks["rerank_r1_vs_plain"] = _check(
            {"plain": plain, "reranked": rerank}, all(r >= p for r, p in zip(rerank, plain)),
            f"eq. 16 ({metrics.get('rerank_reading', 'reranked')} reading) lowers R@1 below the plain similarity")
    return checks


def jsonable(value):
    """Recursively convert numpy/torch scalars and arrays to plain Python for json.dump."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Tensor):
        return jsonable(value.tolist())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and value != value:
        return None  # JSON has no NaN; null marks "not defined" (e.g. an empty group)
    return value
