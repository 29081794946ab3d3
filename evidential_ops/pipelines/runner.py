"""train / eval / demo of one method, end to end: data, model, training, evaluation, files.

Files written to the output directory:
    checkpoint.pt   model + optimiser state, recipe, data source, history (train, demo)
    metrics.json    the test-split retrieval keys (SPEC §4) at the top level, the method's
                    uncertainty figures, the untrained baseline, the training history, the
                    issue's acceptance checks ("done_when") and, for demo, the loss speed
    *.png           training curve and the method's uncertainty plots
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch

from .. import benchmark
from ..data import SyntheticConfig, load_precomputed, make_synthetic_benchmark
from ..data.types import CrossModalBenchmark
from . import plots
from .analysis import RETRIEVAL_KEYS, analyse, baseline_metrics, jsonable, summary_checks
from .recipes import Recipe
from .training import fit, load_checkpoint, make_loader, progress_enabled, save_checkpoint

__all__ = ["DataSource", "load_data", "run_demo", "run_evaluation", "run_training", "speed"]

SPEED_CASES = {"tcl": ("tcl",), "tcvse": ("tcl",), "uml": ("uml",), "duq": ("duq",),
               # FUME has no Dirichlet-over-candidates loss: show every fused loss instead.
               "fume": ("tcl", "uml", "duq")}


class DataSource(dict):
    """Where a run's data comes from, as a JSON-able dict stored in checkpoints:
    {"kind": "synthetic", "config": {SyntheticConfig fields}} or
    {"kind": "precomputed", "root": str, "captions_per_image": int, "alt_language": str | None}."""

    @classmethod
    def synthetic(cls, recipe: Recipe, *, seed: int, **overrides) -> DataSource:
        config = dict(recipe.data)
        config.update({k: v for k, v in overrides.items() if v is not None})
        config["seed"] = seed
        return cls(kind="synthetic", config=asdict(SyntheticConfig(**config)))

    @classmethod
    def precomputed(cls, root, *, captions_per_image: int = 5, alt_language: str | None = None) -> DataSource:
        return cls(kind="precomputed", root=os.fspath(root), captions_per_image=captions_per_image,
                   alt_language=alt_language)


def load_data(source: dict) -> CrossModalBenchmark:
    """The benchmark a `DataSource` describes (regenerated bit-identically for synthetic data)."""
    kind = source.get("kind")
    if kind == "synthetic":
        names = {f.name for f in fields(SyntheticConfig)}
        return make_synthetic_benchmark(**{k: v for k, v in source["config"].items() if k in names})
    if kind == "precomputed":
        return load_precomputed(source["root"], captions_per_image=source["captions_per_image"],
                                alt_language=source["alt_language"])
    raise ValueError(f"data source kind must be 'synthetic' or 'precomputed', got {kind!r}")


def _build(recipe: Recipe, bench: CrossModalBenchmark, seed: int, device) -> torch.nn.Module:
    # The initial weights depend on the seed only, so "untrained" is reproducible too.
    torch.manual_seed(seed)
    return recipe.build(bench).to(device)


def _write_outputs(out_dir: Path, method: str, metrics: dict, plot_data: dict, history: list) -> list[Path]:
    """metrics.json plus the PNGs; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "metrics.json"]
    with open(written[0], "w") as f:
        json.dump(jsonable(metrics), f, indent=2, allow_nan=False)
    name = method.upper() if method != "tcvse" else "TcVSE"
    if history:
        extra = "split_accuracy" if method == "uml" and "audit" in metrics else None
        written.append(plots.training_curve(history, out_dir / "training_loss.png", title=f"{name} training",
                                            extra=extra))
    if method in ("tcl", "tcvse"):
        written.append(plots.uncertainty_histograms(
            {"image queries (model A, i2t)": plot_data["uncertainty_i2t"],
             "text queries (model B, t2i)": plot_data["uncertainty_t2i"]},
            out_dir / "uncertainty_corruption.png",
            title=f"{name}: query uncertainty u = N/S, clean vs corrupted test data"))
    elif method == "uml" and "uncertainty" in plot_data:
        written.append(plots.uncertainty_histograms(
            {"vision ↔ non-English view": plot_data["uncertainty"]}, out_dir / "uml_noisy_vs_clean.png",
            title="UML: pair uncertainty of truly clean vs noisy training pairs"))
    elif method == "fume":
        written.append(plots.deletion_curves(
            {"u (cross-modal uncertainty)": plot_data["curves"]["u"], "s (similarity)": plot_data["curves"]["s"]},
            out_dir / "fume_map_vs_deletion.png", title="FUME: mAP@all (i2t) vs deletion rate"))
        written.append(plots.uncertainty_histograms(
            {"image-text pairs": plot_data["uncertainty"]}, out_dir / "fume_ood_uncertainty.png",
            title="FUME: cross-modal uncertainty, in- vs out-of-distribution"))
    elif method == "duq":
        written.append(plots.uncertainty_histograms(
            {"text queries": plot_data["uncertainty"]}, out_dir / "duq_uncertainty_corruption.png",
            title="DUQ: similarity uncertainty u_s, clean vs corrupted queries"))
    return written


def _evaluate(method: str, model, bench: CrossModalBenchmark, recipe: Recipe, *, seed: int, history: list,
              untrained: dict | None, source: dict) -> tuple[dict, dict]:
    audit_batches = None
    if method == "uml":
        # The audit re-draws the training batches as in training (same batch size and seed).
        _, audit_batches = make_loader(bench.train, batch_size=recipe.batch_size, languages=recipe.languages,
                                       seed=seed + 1)
    start = time.perf_counter()
    details, plot_data = analyse(method, model, bench, seed=seed, audit_batches=audit_batches, history=history,
                                 noise_ground_truth=source.get("kind") == "synthetic")
    metrics = {k: details[k] for k in RETRIEVAL_KEYS}
    metrics["method"] = method
    metrics.update({k: v for k, v in details.items() if k not in RETRIEVAL_KEYS})
    metrics["untrained"] = untrained
    metrics["done_when"] = summary_checks(method, details, untrained)
    metrics["evaluation_seconds"] = time.perf_counter() - start
    return metrics, plot_data


def run_training(method: str, recipe: Recipe, source: DataSource, out_dir, *, seed: int = 0, quiet: bool = False,
                 device: str = "cpu", log=print) -> dict:
    """Train `method` with `recipe` on `source`, write the checkpoint, metrics.json and the plots
    to out_dir; returns the metrics dict."""
    out_dir = Path(os.fspath(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    bench = load_data(source)
    model = _build(recipe, bench, seed, device)
    untrained = baseline_metrics(method, model, bench)
    dataset, loader = make_loader(bench.train, batch_size=recipe.batch_size, languages=recipe.languages, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    payload = {"method": method, "recipe": jsonable(asdict(recipe)), "data": jsonable(dict(source)), "seed": seed,
               "untrained": untrained}
    train_start = time.perf_counter()
    history = fit(model, dataset, loader, optimizer, epochs=recipe.epochs, progress=progress_enabled(quiet),
                  desc=f"{method} train")
    train_seconds = time.perf_counter() - train_start
    save_checkpoint(out_dir / "checkpoint.pt", model=model, optimizer=optimizer,
                    payload={**payload, "history": jsonable(history), "epoch": recipe.epochs})
    metrics, plot_data = _evaluate(method, model, bench, recipe, seed=seed, history=history, untrained=untrained,
                                   source=source)
    metrics["seed"] = seed
    metrics["data"] = dict(source)
    metrics["recipe"] = asdict(recipe)
    metrics["train"] = {"epochs": recipe.epochs, "seconds": train_seconds, "history": history,
                        "batches_per_epoch": len(loader)}
    metrics["total_seconds"] = time.perf_counter() - start
    _write_outputs(out_dir, method, metrics, plot_data, history)
    return metrics


def run_evaluation(checkpoint, out_dir, *, device: str = "cpu") -> dict:
    """Evaluate a checkpoint written by `run_training` on its data's test split (and ood, UML
    training audit...), writing metrics.json and the plots to out_dir; returns the metrics."""
    state = load_checkpoint(checkpoint)
    method = state["method"]
    recipe_fields = dict(state["recipe"])
    recipe_fields["languages"] = tuple(recipe_fields["languages"])
    recipe = Recipe(**recipe_fields)
    bench = load_data(state["data"])
    model = _build(recipe, bench, state["seed"], device)
    model.load_state_dict(state["model_state"])
    history = state.get("history", [])
    metrics, plot_data = _evaluate(method, model, bench, recipe, seed=state["seed"], history=history,
                                   untrained=state.get("untrained"), source=state["data"])
    metrics["seed"] = state["seed"]
    metrics["data"] = state["data"]
    metrics["checkpoint"] = os.fspath(checkpoint)
    _write_outputs(Path(os.fspath(out_dir)), method, metrics, plot_data, [])
    return metrics


def speed(method: str, *, k: int = 1024, d: int = 512, repeats: int = 3, device: str = "cpu") -> list[dict]:
    """Forward + backward milliseconds of the method's loss on `device`: the fused backend vs
    plain PyTorch eager, both the package's reference ("reference", stable forms) and the
    textbook formulas ("naive") (`evidential_ops.benchmark`; torch.compile's warm-up is too slow
    for a demo)."""
    fused = benchmark.fused_backends(device)[:1]
    results = benchmark.compare(sizes=[k], d=d, cases=SPEED_CASES[method],
                                impls=fused + ["reference", "naive"], repeats=repeats, device=device)
    out = []
    for case in SPEED_CASES[method]:
        times = {r["impl"]: r["seconds"] for r in results if r["case"] == case}
        row = {"case": case, "k": k, "d": d, "reference_ms": 1e3 * times["reference"],
               "naive_ms": 1e3 * times["naive"]}
        if fused:
            row.update(fused_backend=fused[0], fused_ms=1e3 * times[fused[0]],
                       speedup=times["reference"] / times[fused[0]],
                       speedup_vs_naive=times["naive"] / times[fused[0]])
        out.append(row)
    return out


def run_demo(method: str, recipe: Recipe, source: DataSource, out_dir, *, seed: int = 0, quiet: bool = False,
             device: str = "cpu", bench_k: int | None = 1024, log=print) -> dict:
    """`run_training`, then the fused loss's speed (unless bench_k is None), metrics.json
    rewritten with it, and a console report."""
    metrics = run_training(method, recipe, source, out_dir, seed=seed, quiet=quiet, device=device, log=log)
    if bench_k is not None:
        metrics["speed"] = speed(method, k=bench_k, device=device)
        with open(Path(os.fspath(out_dir)) / "metrics.json", "w") as f:
            json.dump(jsonable(metrics), f, indent=2, allow_nan=False)
    log(report(metrics))
    return metrics


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def report(metrics: dict) -> str:
    """A human-readable summary of a run's metrics."""
    m = metrics
    lines = [f"== {m['method']} (seed {m.get('seed')}) =="]
    if "train" in m:
        lines.append(f"trained {m['train']['epochs']} epochs in {m['train']['seconds']:.1f} s "
                     f"(total {m.get('total_seconds', float('nan')):.1f} s)")
    lines.append("retrieval (test): " + "  ".join(f"{k} {m[k]:.2f}" for k in RETRIEVAL_KEYS))
    if m.get("untrained"):
        lines.append("untrained:        " + "  ".join(f"{k} {v:.3g}" for k, v in m["untrained"].items()))
    for name, check in m.get("done_when", {}).items():
        lines.append(f"  [{'ok' if check['pass'] else 'FAIL'}] {name}: {_fmt(check['value'])}")
    for row in m.get("speed", []):
        if "fused_ms" in row:
            lines.append(f"speed {row['case']} loss fwd+bwd K={row['k']} D={row['d']}: fused {row['fused_backend']} "
                         f"{row['fused_ms']:.1f} ms vs plain PyTorch eager {row['reference_ms']:.1f} ms "
                         f"({row['speedup']:.1f}x), textbook PyTorch {row['naive_ms']:.1f} ms "
                         f"({row['speedup_vs_naive']:.1f}x)")
        else:
            lines.append(f"speed {row['case']}: plain PyTorch {row['reference_ms']:.1f} ms (no fused backend built)")
    return "\n".join(lines)
