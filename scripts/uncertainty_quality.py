"""Measure every method's retrieval and uncertainty quality over several seeds, with its
same-encoder InfoNCE baseline, and write the raw figures and their means.

    python scripts/uncertainty_quality.py --seeds 0 1 2 --out runs/quality --results bench/results

trains each method of the demo (`pipelines.run_training` with the baseline, no plots) once per
seed on the built-in data, plus the variants docs/uncertainty_quality.md reports: UML with the
exp evidence map (the option that frees u from [0.27, 0.73], `--evidence exp --tau T` on the
CLI) and TcVSE without its augmentation. It writes RESULTS/uncertainty_quality.json (every seed's figures, the
means, the command, commit and versions) and RESULTS/uncertainty_quality.md (the tables of
docs/uncertainty_quality.md). About 5-9 minutes per method and seed on 2 cores (24 runs for 3 seeds).

RESULTS defaults to the run directory (--out): the committed bench/results/ is written only when
asked for, and only by a full run (every method and variant at the recipes' own sizes and
epochs); a smoke run with --only, --epochs or --n-* into bench/results is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import evidential_ops as eo
from evidential_ops.pipelines import DataSource, get_recipe, run_training
from evidential_ops.pipelines.analysis import jsonable

METHODS = ("tcl", "tcvse", "uml", "fume", "duq")
# name -> (method, model options): the variants measured beside each method's default recipe.
VARIANTS = {
    "uml_exp_tau0.1": ("uml", {"evidence": "exp", "tau": 0.1}),
    "uml_exp_tau0.05": ("uml", {"evidence": "exp", "tau": 0.05}),
    "tcvse_no_augment": ("tcvse", {"augment": False}),
}
QUALITY_KEYS = ("error_auroc", "error_aupr", "aurc", "eaurc", "r1_at_50", "r1_at_80", "ood_auroc")
NAMES = {"tcl": "TCL", "tcvse": "TcVSE", "uml": "UML", "fume": "FUME", "duq": "DUQ"}
SCORE_LABELS = {
    "u": "u = N/S (vacuity)", "u_s": "u_s (ISUM vacuity)", "u_d": "u_d (distance vacuity)",
    "dissonance": "dissonance (top-10)", "neg_top_belief": "−top belief",
    "u_query": "u (query's decision uncertainty)", "u_pair_top1": "u (query ⊕ top-1 result, eq. 10)",
    "neg_top1_similarity": "baseline: −top-1 similarity", "neg_margin": "baseline: −top-1/top-2 margin",
    "neg_top_probability": "InfoNCE baseline: −softmax confidence",
}
# The InfoNCE model's own scores shown beside each method's (its free −top-1 similarity too: under
# FUME's relevance by class its max softmax is handicapped by construction, SPEC §6).
INFONCE_LABELS = {
    "neg_top_probability": "InfoNCE baseline: −softmax confidence",
    "neg_top_class_probability": "InfoNCE baseline: −softmax summed over the top-1's class",
    "neg_top1_similarity": "InfoNCE baseline: −top-1 similarity",
}
COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def _run(name: str, method: str, options: dict, seed: int, args) -> dict:
    recipe = get_recipe(method).with_model_options(**options)
    if args.epochs is not None:
        recipe = recipe.with_overrides(epochs=args.epochs)
    source = DataSource.synthetic(recipe, seed=seed, n_train=args.n_train, n_test=args.n_test, n_ood=args.n_ood,
                                  n_val=args.n_val)
    start = time.perf_counter()
    metrics = run_training(method, recipe, source, Path(args.out) / f"seed{seed}" / name, seed=seed, quiet=True,
                           baseline=True, plots=False, log=lambda *_: None)
    print(f"{name} seed {seed}: rsum {metrics['rsum']:.1f} (InfoNCE {metrics['infonce_baseline']['rsum']:.1f}), "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return _summary(method, metrics)


def _summary(method: str, m: dict) -> dict:
    """The figures the report keeps from one run's metrics.json."""
    keep = {k: m[k] for k in ("i2t_r1", "t2i_r1", "rsum")}
    base = m["infonce_baseline"]
    keep["infonce"] = {k: base[k] for k in ("i2t_r1", "t2i_r1", "rsum")}
    if method == "fume":
        keep["map"], keep["infonce"]["map"] = m["map"], base["map"]
    keep["quality"] = {d: _quality(m["uncertainty_quality"][d]) for d in ("i2t", "t2i")}
    keep["infonce"]["quality"] = {d: _quality(base["uncertainty_quality"][d]) for d in ("i2t", "t2i")}
    keep["checks"] = {name: c["pass"] for name, c in m["done_when"].items()}
    if method == "duq":
        keep["rerank_reading"] = m["rerank_reading"]
        keep["rerank_readings"] = {r: {k: v[k] for k in ("i2t_r1", "t2i_r1", "rsum")}
                                   for r, v in m["rerank_readings"].items()}
        keep["distance_only"] = {k: m["distance_only"][k] for k in ("i2t_r1", "t2i_r1", "rsum")}
        keep["distance_only_min"] = {k: m["distance_only_min"][k] for k in ("i2t_r1", "t2i_r1", "rsum")}
    if method == "uml" and "audit" in m:
        a = m["audit"]
        keep["audit"] = {k: a[k] for k in ("uncertainty_auroc_noisy", "similarity_auroc_noisy", "uncertainty_clean_mean",
                                           "uncertainty_noisy_mean", "uncertainty_min", "uncertainty_max",
                                           "split_accuracy")}
    return keep


def _quality(q: dict) -> dict:
    out = {"r1": q["r1"], "scores": {name: {k: s.get(k) for k in QUALITY_KEYS} for name, s in q["scores"].items()},
           "baselines": q["baselines"]}
    if "ece" in q:
        out["ece"], out["ece_of"] = q["ece"], q["ece_of"]
    return out


def _mean(values: list):
    """Elementwise mean of nested dicts of numbers (None stays None; bools become pass rates)."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _mean([v[k] for v in values]) for k in first}
    if isinstance(first, bool):
        return float(np.mean(values))
    if isinstance(first, list):
        return [_mean([v[k] for v in values]) for k in range(len(first))]
    if isinstance(first, (int, float)) and all(v is not None for v in values):
        return float(np.mean(values))
    return first if all(v == first for v in values) else None


MACHINE_CAVEAT = ("Another machine's arithmetic gives other numbers, within the seeds' spread or beyond it (TCL "
                  "seed 0's rSum moved by about 7 points between machines): compare a fresh run with the ranges, "
                  "not the means, and count seeds, not single runs.")


def machine() -> dict:
    """What the figures were measured on: training's float arithmetic (torch's kernels for the
    encoders, ours for the loss) differs between instruction sets, so a run on another machine
    lands elsewhere within the seeds' spread, not on the same numbers."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "build": eo.build_info()}


def _spread(runs: list, key: str) -> str:
    """min–max of one figure across the seeds' runs."""
    values = [run[key] for run in runs]
    return f"{min(values):.1f}–{max(values):.1f}"


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _quality_table(mean: dict) -> list[str]:
    lines = ["| direction | score | error AUROC | error AUPR | AURC | E-AURC | R@1 @50 % | R@1 @80 % | OOD AUROC |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d in ("i2t", "t2i"):
        rows = [(SCORE_LABELS.get(name, name), s) for name, s in mean["quality"][d]["scores"].items()]
        theirs = mean["infonce"]["quality"][d]["scores"]
        rows += [(label, theirs[name]) for name, label in INFONCE_LABELS.items() if name in theirs]
        for label, s in rows:
            lines.append(f"| {d} | {label} | {_fmt(s['error_auroc'])} | {_fmt(s['error_aupr'])} | "
                         f"{_fmt(s['aurc'])} | {_fmt(s['eaurc'])} | {_fmt(s['r1_at_50'], 1)} | {_fmt(s['r1_at_80'], 1)} | "
                         f"{_fmt(s['ood_auroc'])} |")
    return lines


def summary_table(results: dict) -> list[str]:
    """One row per method: its rSum and the same-encoder InfoNCE baseline's, mean (min–max) over
    the seeds, and on how many seeds the method came out ahead: the verdict the demo's
    rsum_vs_infonce check gives for one run, counted over every run."""
    n = len(results["seeds"])
    lines = ["| method | rSum | InfoNCE rSum | method ahead on | its best score at flagging a wrong top-1: error AUROC i2t / t2i |",
             "|---|---|---|---|---|"]
    for method in METHODS:
        runs, m = results["runs"][method], results["means"][method]
        ahead = sum(run["rsum"] > run["infonce"]["rsum"] for run in runs)
        best = []
        for d in ("i2t", "t2i"):
            scores = m["quality"][d]["scores"]
            name = max((k for k in scores if scores[k]["error_auroc"] is not None),
                       key=lambda k: scores[k]["error_auroc"])
            best.append(f"{scores[name]['error_auroc']:.2f} ({SCORE_LABELS.get(name, name)})")
        lines.append(f"| {NAMES[method]} | {m['rsum']:.1f} ({_spread(runs, 'rsum')}) | {m['infonce']['rsum']:.1f} "
                     f"({_spread([r['infonce'] for r in runs], 'rsum')}) | {ahead} of {n} seeds | {' / '.join(best)} |")
    return lines


def markdown(results: dict) -> str:
    """The tables of docs/uncertainty_quality.md from the means (per method: retrieval beside the
    InfoNCE baseline, then every uncertainty score beside the free baselines and the baseline's own
    confidence)."""
    means, seeds = results["means"], results["seeds"]
    where = results.get("machine")
    out = [f"Means over seeds {', '.join(map(str, seeds))} (`{results['command']}`, commit {results['commit']}), "
           f"min–max across the seeds in brackets.", ""]
    if where:
        named = (f"{where['cpu']}, {where['cores']} cores, torch {results['torch']} (CPU kernels "
                 f"{where['torch_cpu_capability']}), {where['build']}")
    else:
        named = results.get("machine_note", "not recorded")
    out += [f"Machine: {named}. {MACHINE_CAVEAT}", ""]
    out += summary_table(results) + [""]
    for method in METHODS:
        m = means[method]
        out.append(f"#### {NAMES[method]}")
        out.append("")
        # FUME retrieves by class: its quality table judges a top-1 by class, shown beside mAP.
        extra = " | mAP | top-1 right by class i2t | t2i" if method == "fume" else ""
        out.append(f"| model | i2t R@1 | t2i R@1 | rSum{extra} | ECE i2t | ECE t2i |")
        out.append("|---|---|---|---|---|---|" + ("---|---|---|" if method == "fume" else ""))
        runs = results["runs"][method]
        for label, part, per_seed in ((NAMES[method], m, runs),
                                      ("InfoNCE baseline (same encoders)", m["infonce"], [r["infonce"] for r in runs])):
            ece = [part["quality"][d].get("ece") for d in ("i2t", "t2i")]
            by_class = (f" | {part['map']:.3f} | {part['quality']['i2t']['r1']:.1f} | {part['quality']['t2i']['r1']:.1f}"
                        if method == "fume" else "")
            ranged = " | ".join(f"{part[k]:.1f} ({_spread(per_seed, k)})" for k in ("i2t_r1", "t2i_r1", "rsum"))
            out.append(f"| {label} | {ranged}{by_class} | {_fmt(ece[0])} | {_fmt(ece[1])} |")
        out.append("")
        out.extend(_quality_table(m))
        passed = [name for name, rate in m["checks"].items() if rate == 1.0]
        failed = [f"{name} ({rate:.0%} of seeds pass)" for name, rate in m["checks"].items() if rate < 1.0]
        out.append("")
        out.append(f"Demo checks passing on every seed: {', '.join(passed) or 'none'}. "
                   f"Failing on some or all: {', '.join(failed) or 'none'}.")
        out.append("")
        if method == "duq":
            out.append("DUQ eq. 16, R@1 of plain s and of s′ under each reading (default: "
                       f"`{m['rerank_reading']}`):")
            out.append("")
            runs = results["runs"][method]
            out.append("| ranking | i2t R@1 | t2i R@1 | rSum | i2t R@1 per seed | t2i R@1 per seed | rSum per seed |")
            out.append("|---|---|---|---|---|---|---|")
            rankings = [("plain s", m, list(runs))]
            rankings += [(f"s′, `{reading}`", r, [run["rerank_readings"][reading] for run in runs])
                         for reading, r in m["rerank_readings"].items()]
            rankings += [("1 − D alone (max rule, as inference)", m["distance_only"], [r["distance_only"] for r in runs]),
                         ("1 − D alone (min rule for every pair)", m["distance_only_min"],
                          [r["distance_only_min"] for r in runs])]
            for label, r, per_seed in rankings:
                seeds_cols = " | ".join(" / ".join(f"{s[k]:.2f}" for s in per_seed)
                                        for k in ("i2t_r1", "t2i_r1", "rsum"))
                out.append(f"| {label} | {r['i2t_r1']:.1f} | {r['t2i_r1']:.1f} | {r['rsum']:.1f} | {seeds_cols} |")
            out.append("")
    out.append("#### Variants")
    out.append("")
    out.append("| run | i2t R@1 | t2i R@1 | rSum | noisy-pair AUROC of u | of −pair similarity | mean u clean / noisy "
               "| u min–max over all seeds' training pairs |")
    out.append("|---|---|---|---|---|---|---|---|")
    for name in ("uml",) + tuple(VARIANTS):
        m = means[name]
        a = m.get("audit")
        audits = [r["audit"] for r in results["runs"][name] if "audit" in r]
        audit = (f"{_fmt(a['uncertainty_auroc_noisy'])} | {_fmt(a['similarity_auroc_noisy'])} | "
                 f"{_fmt(a['uncertainty_clean_mean'])} / {_fmt(a['uncertainty_noisy_mean'])} | "
                 f"{_fmt(min(x['uncertainty_min'] for x in audits), 2)}–"
                 f"{_fmt(max(x['uncertainty_max'] for x in audits), 2)}") if a else "– | – | – | –"
        label = {"uml": "UML (exp_tanh, τ = 0.1: the paper)"}.get(name, name)
        out.append(f"| {label} | {m['i2t_r1']:.1f} | {m['t2i_r1']:.1f} | {m['rsum']:.1f} | {audit} |")
    out.append(f"| tcvse (augment, default) | {means['tcvse']['i2t_r1']:.1f} | {means['tcvse']['t2i_r1']:.1f} | "
               f"{means['tcvse']['rsum']:.1f} | – | – | – | – |")
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/quality", help="run directories (metrics.json, checkpoints)")
    parser.add_argument("--results", default=None,
                        help="where the .json and .md go (default: --out; bench/results only for a full run)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these (methods or variant names)")
    parser.add_argument("--epochs", type=int, default=None, help="override every recipe's epochs (smoke runs)")
    for name in ("n-train", "n-val", "n-test", "n-ood"):
        parser.add_argument(f"--{name}", type=int, default=None, help="built-in data size override (smoke runs)")
    parser.add_argument("--tables-from", default=None, metavar="JSON",
                        help="rewrite the .md beside a saved uncertainty_quality.json from its figures (no training)")
    args = parser.parse_args(argv)
    if args.tables_from:
        saved = Path(args.tables_from)
        (saved.parent / "uncertainty_quality.md").write_text(markdown(json.loads(saved.read_text())))
        print(f"wrote {saved.parent / 'uncertainty_quality.md'}", flush=True)
        return 0
    results_dir = Path(args.out if args.results is None else args.results)
    partial = [flag for flag, value in (("--only", args.only), ("--epochs", args.epochs), ("--n-train", args.n_train),
                                        ("--n-val", args.n_val), ("--n-test", args.n_test), ("--n-ood", args.n_ood))
               if value is not None]
    if partial and results_dir.resolve() == COMMITTED_RESULTS:
        parser.error(f"--results {args.results}: {', '.join(partial)} make a partial run, which must not overwrite "
                     f"the committed {COMMITTED_RESULTS}; write it elsewhere (the default is --out)")
    runs = {m: (m, {}) for m in METHODS}
    runs.update(VARIANTS)
    if args.only:
        unknown = set(args.only) - set(runs)
        if unknown:
            parser.error(f"--only: unknown {sorted(unknown)}; choose from {sorted(runs)}")
        runs = {k: v for k, v in runs.items() if k in args.only}
    # The commit of the code this process imports, read before training (a long run may outlive HEAD).
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    per_seed = {name: [_run(name, method, options, seed, args) for seed in args.seeds]
                for name, (method, options) in runs.items()}
    results = {
        "command": "python scripts/uncertainty_quality.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit, "seeds": args.seeds, "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "machine": machine(), "runs": per_seed,
        "means": {name: _mean(values) for name, values in per_seed.items()},
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / "uncertainty_quality.json", "w") as f:
        json.dump(jsonable(results), f, indent=1, allow_nan=False)
    if set(METHODS) | set(VARIANTS) <= set(per_seed):
        (results_dir / "uncertainty_quality.md").write_text(markdown(results))
    print(f"wrote {results_dir / 'uncertainty_quality.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
