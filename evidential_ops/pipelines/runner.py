"""train / eval / demo of one method, end to end: data, model, training, evaluation, files.

Files written to the output directory:
    checkpoint.pt   model + optimiser state, recipe, data source, history, epochs done and the
                    random states (train, demo), and the InfoNCE baseline's state when one was
                    trained; written after every epoch too, so that `run_training(resume=...)`
                    (`train --resume`) continues an interrupted run exactly
    metrics.json    the test-split retrieval keys (SPEC §4) at the top level, the method's
                    uncertainty figures, the uncertainty quality of every score and direction
                    (SPEC §6, "uncertainty_quality"), the calibrated abstention of every
                    score (SPEC §7, "abstention"), the same-encoder InfoNCE baseline
                    ("infonce_baseline"), the untrained model, the training history, the
                    acceptance checks ("done_when") and, for demo, the loss speed
    *.png           training curve, risk–coverage curves, coverage against the guaranteed
                    error level and the method's uncertainty plots (skipped when matplotlib is
                    not installed), named by `PLOT_FILES`
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

import torch

from .. import benchmark
from ..data import SyntheticConfig, load_precomputed, make_synthetic_benchmark
from ..data.types import CrossModalBenchmark
from . import plots as figures
from .abstention import abstention_lines, abstention_report
from .abstention_plot import coverage_vs_alpha
from .analysis import RETRIEVAL_KEYS, analyse, baseline_metrics, jsonable, summary_checks
from .baseline import infonce_baseline
from .quality import quality_of
from .recipes import Recipe
from .training import (
    epoch_lines_enabled,
    fit,
    load_checkpoint,
    make_loader,
    print_line,
    progress_enabled,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)

__all__ = ["PLOT_FILES", "DataError", "DataSource", "ResumeError", "load_data", "plots_available", "resume_state", "run_demo",
           "run_evaluation", "run_training", "speed"]

# One file name per kind of plot, whatever the method, so that a script (or a person) comparing
# methods finds the same figure under the same name in each run directory.
PLOT_FILES = {
    "training": "training_loss.png",  # every method that trained
    "risk_coverage": "risk_coverage.png",  # every method
    "abstention": "abstention_coverage.png",  # every method: coverage at a guaranteed error level α
    "corruption": "uncertainty_corruption.png",  # clean vs corrupted queries: TCL, TcVSE, DUQ
    "noisy_pairs": "uncertainty_noisy_vs_clean.png",  # clean vs noisy training pairs: UML
    "ood": "uncertainty_ood.png",  # in- vs out-of-distribution: FUME
    "deletion": "map_vs_deletion.png",  # mAP@all vs deletion rate: FUME
}

PLOTS_HINT = ("matplotlib is not installed: skipping the plots "
              "(pip install matplotlib, or install evidential_ops with its [plots] extra)")


def plots_available() -> bool:
    """Whether matplotlib can be imported (the PNGs need it; everything else does not)."""
    return importlib.util.find_spec("matplotlib") is not None

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


class DataError(ValueError):
    """Precomputed data that cannot be read as its `DataSource` describes it (a missing file, a
    caption count that does not divide, features of the wrong shape)."""


def load_data(source: dict) -> CrossModalBenchmark:
    """The benchmark a `DataSource` describes (regenerated bit-identically for synthetic data);
    DataError where precomputed data cannot be read."""
    kind = source.get("kind")
    if kind == "synthetic":
        names = {f.name for f in fields(SyntheticConfig)}
        return make_synthetic_benchmark(**{k: v for k, v in source["config"].items() if k in names})
    if kind == "precomputed":
        try:
            return load_precomputed(source["root"], captions_per_image=source["captions_per_image"],
                                    alt_language=source["alt_language"])
        except (OSError, ValueError) as error:
            raise DataError(f"data {source['root']}: {error}") from error
    raise ValueError(f"data source kind must be 'synthetic' or 'precomputed', got {kind!r}")


def _build(recipe: Recipe, bench: CrossModalBenchmark, seed: int, device) -> torch.nn.Module:
    # The initial weights depend on the seed only, so "untrained" is reproducible too.
    torch.manual_seed(seed)
    return recipe.build(bench).to(device)


def _write_outputs(out_dir: Path, method: str, metrics: dict, plot_data: dict, history: list, *,
                   plots: bool = True) -> list[Path]:
    """metrics.json plus (with plots) the PNGs; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "metrics.json"]
    with open(written[0], "w") as f:
        json.dump(jsonable(metrics), f, indent=2, allow_nan=False)
    if not plots:
        return written
    name = method.upper() if method != "tcvse" else "TcVSE"
    if "risk_coverage" in plot_data:
        written.append(figures.risk_coverage(
            plot_data["risk_coverage"], out_dir / PLOT_FILES["risk_coverage"],
            title=f"{name}: R@1 risk of the most certain queries (test split)"))
    if "abstention" in plot_data:
        written.append(coverage_vs_alpha(
            plot_data["abstention"], out_dir / PLOT_FILES["abstention"], delta=metrics["abstention"]["delta"],
            title=f"{name}: queries answered at a guaranteed error level (test halves)"))
    if history:
        extra = "split_accuracy" if method == "uml" and "audit" in metrics else None
        # TCL's loss carries λ·KL with λ annealed upward (TCL eq. 10): the title says what is summed.
        title = f"{name} training" + (": loss = risk + λ·KL + consistency" if method in ("tcl", "tcvse") else "")
        written.append(figures.training_curve(history, out_dir / PLOT_FILES["training"], title=title, extra=extra))
    if method in ("tcl", "tcvse"):
        written.append(figures.uncertainty_histograms(
            {"image queries (model A, i2t)": plot_data["uncertainty_i2t"],
             "text queries (model B, t2i)": plot_data["uncertainty_t2i"]},
            out_dir / PLOT_FILES["corruption"],
            title=f"{name}: query uncertainty u = N/S, clean vs corrupted test data"))
    elif method == "uml" and "uncertainty" in plot_data:
        written.append(figures.uncertainty_histograms(
            {"vision ↔ non-English view": plot_data["uncertainty"]}, out_dir / PLOT_FILES["noisy_pairs"],
            title="UML: pair uncertainty of truly clean vs noisy training pairs"))
    elif method == "fume":
        written.append(figures.deletion_curves(
            {"u (cross-modal uncertainty)": plot_data["curves"]["u"], "s (similarity)": plot_data["curves"]["s"]},
            out_dir / PLOT_FILES["deletion"], title="FUME: mAP@all (i2t) vs deletion rate"))
        written.append(figures.uncertainty_histograms(
            {"image-text pairs": plot_data["uncertainty"]}, out_dir / PLOT_FILES["ood"],
            title="FUME: cross-modal uncertainty, in- vs out-of-distribution"))
    elif method == "duq":
        written.append(figures.uncertainty_histograms(
            {"text queries": plot_data["uncertainty"]}, out_dir / PLOT_FILES["corruption"],
            title="DUQ: similarity uncertainty u_s, clean vs corrupted queries"))
    return written


def _evaluate(method: str, model, bench: CrossModalBenchmark, recipe: Recipe, *, seed: int, history: list,
              untrained: dict | None, source: dict, baseline=None) -> tuple[dict, dict]:
    """Metrics, checks and plot data of a trained model (and of its trained InfoNCE baseline)."""
    audit_batches = None
    if method == "uml":
        # The audit judges the training pairs batch by batch as training does: batches of the
        # training batch size, shuffled with another seed than training's.
        _, audit_batches = make_loader(bench.train, batch_size=recipe.batch_size, languages=recipe.languages,
                                       seed=seed + 1)
    start = time.perf_counter()
    details, plot_data = analyse(method, model, bench, seed=seed, audit_batches=audit_batches, history=history,
                                 noise_ground_truth=source.get("kind") == "synthetic")
    raw_scores = {}
    details["uncertainty_quality"], curves = quality_of(method, model, bench, seed=seed, keep_scores=raw_scores)
    plot_data["risk_coverage"] = {"method": curves, "primary": details["uncertainty_quality"]["primary_score"]}
    details["abstention"], abstention_curves = abstention_report(raw_scores, seed=seed)
    plot_data["abstention"] = {"method": abstention_curves, "primary": details["uncertainty_quality"]["primary_score"]}
    if baseline is not None:
        details["infonce_baseline"], plot_data["risk_coverage"]["infonce"], plot_data["abstention"]["infonce"] = \
            _evaluate_baseline(baseline, bench, seed, details["uncertainty_quality"]["relevance"])
    metrics = {k: details[k] for k in RETRIEVAL_KEYS}
    metrics["method"] = method
    metrics.update({k: v for k, v in details.items() if k not in RETRIEVAL_KEYS})
    metrics["untrained"] = untrained
    metrics["done_when"] = summary_checks(method, details, untrained, details.get("infonce_baseline"))
    metrics["evaluation_seconds"] = time.perf_counter() - start
    return metrics, plot_data


def _evaluate_baseline(baseline, bench: CrossModalBenchmark, seed: int, relevance: str) -> tuple[dict, dict, dict]:
    """Retrieval keys (and mAP with labels) plus the uncertainty quality and calibrated abstention
    of the InfoNCE baseline, judged by the same relevance as its method (by class for FUME), and
    its risk–coverage and coverage-vs-α curves."""
    metrics = baseline.evaluate(bench.test)
    out = {k: metrics[k] for k in RETRIEVAL_KEYS}
    if relevance == "label":  # mAP is the measure of label-based retrieval (FUME) only
        out["map"] = metrics["map"]
    raw_scores = {}
    out["uncertainty_quality"], curves = quality_of("infonce", baseline, bench, seed=seed, relevance=relevance,
                                                    keep_scores=raw_scores)
    out["abstention"], abstention_curves = abstention_report(raw_scores, seed=seed)
    return out, curves, abstention_curves


class ResumeError(ValueError):
    """A checkpoint that cannot continue the run asked for (`resume_state` says why)."""


# Recipe fields a resumed run may change: the epochs to train up to, except where the model's
# own schedule is defined by them (UML's σ(t) = max(γ, 1 − λ_s·t/E) reads E = the epochs).
_RESUMABLE_CHANGES = {"tcl": ("epochs",), "tcvse": ("epochs",), "fume": ("epochs",), "duq": ("epochs",), "uml": ()}


def resume_state(checkpoint, *, method: str, recipe: Recipe, source: dict, seed: int) -> dict:
    """The state of `checkpoint` (a checkpoint.pt of `run_training`), checked to continue the run
    that `method`, `recipe`, `source` and `seed` describe.

    Raises ResumeError naming what differs when the checkpoint was written by another method,
    seed, data source or recipe (only `recipe.epochs` may differ, and not for UML, whose σ(t)
    schedule is defined by the epochs), when it already holds more epochs than recipe.epochs,
    or when it lacks the random states (written before resumable checkpoints, or by a
    data-parallel run, whose ranks draw from their own streams); FileNotFoundError / ValueError
    from `load_checkpoint` for a missing or foreign file.
    """
    state = load_checkpoint(checkpoint)
    where = os.fspath(checkpoint)
    if state.get("distributed") is not None:
        raise ResumeError(f"{where} was written by a data-parallel (torchrun) run, which cannot be resumed in one "
                          "process")
    missing = [key for key in ("rng", "optimizer_state", "epoch", "history") if state.get(key) is None]
    if missing:
        raise ResumeError(f"{where} has no {', '.join(missing)} (written before checkpoints could resume): "
                          "train again from the start")
    wanted = {"method": method, "seed": seed, "data": jsonable(dict(source))}
    differences = [f"{key} {state.get(key)!r} (this run: {value!r})" for key, value in wanted.items()
                   if state.get(key) != value]
    recipe_now, recipe_then = jsonable(asdict(recipe)), state.get("recipe", {})
    # Chunking the encoders changes memory and time, not the run (up to rounding).
    may_change = (*_RESUMABLE_CHANGES.get(method, ()), "encoder_chunk")
    differences += [f"recipe.{key} {recipe_then.get(key)!r} (this run: {value!r})" for key, value in recipe_now.items()
                    if key not in may_change and recipe_then.get(key) != value]
    if differences:
        allowed = ("only the epochs may grow" if _RESUMABLE_CHANGES.get(method) else
                   f"{method}'s schedule depends on the epochs, so none")
        raise ResumeError(f"{where} records another run: {'; '.join(differences)}. Give the options of the run it "
                          f"records ({allowed})")
    done = state["epoch"]
    if done > recipe.epochs:
        raise ResumeError(f"{where} has trained {done} epochs, more than the {recipe.epochs} asked for")
    return state


def _restored_history(history: list) -> list[dict]:
    """A checkpoint's history with JSON's null turned back into NaN (an undefined value)."""
    return [{key: (math.nan if value is None else value) for key, value in record.items()} for record in history]


def _train(model, bench: CrossModalBenchmark, recipe: Recipe, seed: int, *, quiet: bool, desc: str,
           log_step: Callable[[dict], None] | None = None, checkpoint: Path | None = None,
           payload: dict | None = None, resumed: dict | None = None):
    """Adam over `recipe.epochs` of seeded batches (the same batches for a method and its
    baseline); returns (optimizer, history, seconds, batches per epoch, random states at the end).

    checkpoint: written after every epoch (model, optimiser, payload, history, epochs done, random
    states). resumed: a `resume_state` whose model, optimiser, random states and history this
    training continues from its epoch on.
    """
    dataset, loader = make_loader(bench.train, batch_size=recipe.batch_size, languages=recipe.languages, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    earlier, start_epoch = [], 0
    if resumed is not None:
        model.load_state_dict(resumed["model_state"])
        optimizer.load_state_dict(resumed["optimizer_state"])
        restore_rng_state(resumed["rng"], loader)
        earlier, start_epoch = _restored_history(resumed["history"]), resumed["epoch"]
    done = list(earlier)

    def save(epoch: int, record: dict) -> None:
        done.append(record)
        if checkpoint is not None:
            save_checkpoint(checkpoint, model=model, optimizer=optimizer,
                            payload={**(payload or {}), "history": jsonable(done), "epoch": epoch + 1,
                                     "rng": rng_state(loader)})

    start = time.perf_counter()
    history = fit(model, dataset, loader, optimizer, epochs=recipe.epochs, start_epoch=start_epoch,
                  progress=progress_enabled(quiet), desc=desc,
                  log_epoch=print_line if epoch_lines_enabled(quiet) else None, on_epoch_end=save, log_step=log_step)
    return optimizer, earlier + history, time.perf_counter() - start, len(loader), rng_state(loader)


def _resolve_plots(plots: bool | None, log) -> bool:
    """plots=None: draw them if matplotlib is there, else say once how to get them."""
    if plots is None:
        plots = plots_available()
        if not plots:
            log(PLOTS_HINT)
    return bool(plots)


def run_training(method: str, recipe: Recipe, source: DataSource, out_dir, *, seed: int = 0, quiet: bool = False,
                 device: str = "cpu", log=print, baseline: bool = False, plots: bool | None = None,
                 resume=None, log_step: Callable[[dict], None] | None = None) -> dict:
    """Train `method` with `recipe` on `source`, write the checkpoint, metrics.json and the plots
    to out_dir; returns the metrics dict.

    baseline: also train the same-encoder InfoNCE baseline (`pipelines.baseline`) on the same
    batches and compare the method with it in the checks. plots: draw the PNGs (None: when
    matplotlib is installed, else one line says how to get them). Progress: bars on a terminal,
    one line per epoch otherwise, nothing with quiet. out_dir/checkpoint.pt is rewritten after
    every epoch of the method's training.

    resume: a checkpoint.pt of this run (same method, recipe, data and seed; `resume_state`) to
    continue from the epochs it holds up to recipe.epochs, its model, optimiser and random
    states restored: the result is that of the uninterrupted run. The baseline, being a
    comparison, is trained in full again. log_step: called after every training batch of the
    method with {"step", "epoch", loss and its parts, "lr"} (`training.fit`).
    """
    out_dir = Path(os.fspath(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _resolve_plots(plots, log)
    start = time.perf_counter()
    resumed = None
    if resume is not None:
        resumed = resume_state(resume, method=method, recipe=recipe, source=source, seed=seed)
        if not quiet:
            log(f"resuming {method} from {os.fspath(resume)} after epoch {resumed['epoch']} of {recipe.epochs}")
    bench = load_data(source)
    model = _build(recipe, bench, seed, device)
    untrained = baseline_metrics(method, model, bench)
    contrastive = infonce_baseline(method, model) if baseline else None  # from the initial weights, also on resume
    payload = {"method": method, "recipe": jsonable(asdict(recipe)), "data": jsonable(dict(source)), "seed": seed,
               "untrained": untrained}
    optimizer, history, train_seconds, batches, trained_rng = _train(
        model, bench, recipe, seed, quiet=quiet, desc=f"{method} train", log_step=log_step,
        checkpoint=out_dir / "checkpoint.pt", payload=payload, resumed=resumed)
    train = {"epochs": recipe.epochs, "seconds": train_seconds, "history": history, "batches_per_epoch": batches}
    if resumed is not None:
        train["resumed_from"] = {"checkpoint": os.fspath(resume), "epoch": resumed["epoch"]}
    if contrastive is not None:
        _, baseline_history, baseline_seconds, _, _ = _train(contrastive, bench, recipe, seed, quiet=quiet,
                                                             desc=f"{method} InfoNCE baseline train")
        train["baseline_seconds"] = baseline_seconds
        train["baseline_history"] = baseline_history
        payload["baseline_state"] = contrastive.state_dict()
    # The random states are those at the end of the method's training, before the baseline drew
    # from them, so that a longer run resumed from this checkpoint continues the same streams.
    save_checkpoint(out_dir / "checkpoint.pt", model=model, optimizer=optimizer,
                    payload={**payload, "history": jsonable(history), "epoch": recipe.epochs, "rng": trained_rng})
    metrics, plot_data = _evaluate(method, model, bench, recipe, seed=seed, history=history, untrained=untrained,
                                   source=source, baseline=contrastive)
    metrics["seed"] = seed
    metrics["data"] = dict(source)
    metrics["recipe"] = asdict(recipe)
    metrics["train"] = train
    metrics["total_seconds"] = time.perf_counter() - start
    _write_outputs(out_dir, method, metrics, plot_data, history, plots=plots)
    return metrics


def run_evaluation(checkpoint, out_dir, *, device: str = "cpu", log=print, plots: bool | None = None) -> dict:
    """Evaluate a checkpoint written by `run_training` on its data's test split (and ood, UML
    training audit..., and its InfoNCE baseline when it holds one), writing metrics.json and the
    plots to out_dir; returns the metrics."""
    plots = _resolve_plots(plots, log)
    state = load_checkpoint(checkpoint)
    method = state["method"]
    recipe_fields = dict(state["recipe"])
    recipe_fields["languages"] = tuple(recipe_fields["languages"])
    recipe = Recipe(**recipe_fields)
    bench = load_data(state["data"])
    model = _build(recipe, bench, state["seed"], device)
    contrastive = None
    if state.get("baseline_state") is not None:
        contrastive = infonce_baseline(method, model)
        contrastive.load_state_dict(state["baseline_state"])
    model.load_state_dict(state["model_state"])
    history = state.get("history", [])
    metrics, plot_data = _evaluate(method, model, bench, recipe, seed=state["seed"], history=history,
                                   untrained=state.get("untrained"), source=state["data"], baseline=contrastive)
    metrics["seed"] = state["seed"]
    metrics["data"] = state["data"]
    metrics["checkpoint"] = os.fspath(checkpoint)
    _write_outputs(Path(os.fspath(out_dir)), method, metrics, plot_data, [], plots=plots)
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
             device: str = "cpu", bench_k: int | None = 1024, log=print, baseline: bool = True,
             plots: bool | None = None) -> dict:
    """`run_training` (with the InfoNCE baseline unless baseline=False), then the fused loss's
    speed (unless bench_k is None), metrics.json rewritten with it, and a console report."""
    metrics = run_training(method, recipe, source, out_dir, seed=seed, quiet=quiet, device=device, log=log,
                           baseline=baseline, plots=plots)
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


# How the R@1 of an uncertainty-quality block judges a top-1 (SPEC §6), said on the line itself:
# FUME's is by class while the retrieval line above it is by instance, and a user comparing the
# two numbers must see why they differ.
RELEVANCE_WORDS = {"instance": "instance-level, as the retrieval line",
                   "label": "by class: any result of the query's class is right"}


def _quality_lines(quality: dict, who: str) -> list[str]:
    """A table per direction of the uncertainty-quality figures (SPEC §6) of every score."""
    relevance = RELEVANCE_WORDS.get(quality.get("relevance"), quality.get("relevance"))
    lines = [f"uncertainty quality of {who} (test; a wrong top-1 is the event to flag; OOD: ood queries "
             f"over the test gallery):"]
    head = f"    {'score':<32}{'err AUROC':>10}{'AUPR':>7}{'AURC':>7}{'E-AURC':>8}{'R@1@50%':>9}{'R@1@80%':>9}{'OOD AUROC':>11}"
    for direction in ("i2t", "t2i"):
        q = quality.get(direction)
        if q is None:
            continue
        extra = f", ECE of the {q['ece_of'].replace('_', ' ')} {q['ece']:.3f}" if "ece" in q else ""
        lines.append(f"  {direction}: R@1 {q['r1']:.2f} ({relevance}) over {q['n_queries']} queries{extra}")
        lines.append(head)
        for name, s in q["scores"].items():
            label = name + (" (baseline)" if name in q["baselines"] else "")
            ood = f"{s['ood_auroc']:.3f}" if s.get("ood_auroc") is not None else "-"
            lines.append(f"    {label:<32}{s['error_auroc']:>10.3f}{s['error_aupr']:>7.3f}{s['aurc']:>7.3f}"
                         f"{s['eaurc']:>8.3f}{s['r1_at_50']:>9.2f}{s['r1_at_80']:>9.2f}{ood:>11}")
    return lines


def report(metrics: dict) -> str:
    """A human-readable summary of a run's metrics."""
    m = metrics
    lines = [f"== {m['method']} (seed {m.get('seed')}) =="]
    if "train" in m:
        lines.append(f"trained {m['train']['epochs']} epochs in {m['train']['seconds']:.1f} s "
                     f"(total {m.get('total_seconds', float('nan')):.1f} s)")
    # R@K is by instance (SPEC §4: the query's own image or captions are right) for every
    # method; FUME's mAP and its uncertainty-quality R@1 are by class.
    by_class = m.get("uncertainty_quality", {}).get("relevance") == "label"
    head = "retrieval (test, by instance): "
    lines.append(head + "  ".join(f"{k} {m[k]:.2f}" for k in RETRIEVAL_KEYS)
                 + (f"  map (by class) {m['map']:.4f}" if by_class and "map" in m else ""))
    if by_class:
        lines.append(f"  ({m['method']} is trained to match classes, not instances: by instance only the query's own "
                     "image or captions are right, so its R@K is low by design; by class, any result of the "
                     "query's class is right: that is its map here and the R@1 of its uncertainty quality below)")
    if m.get("untrained"):
        lines.append("untrained:".ljust(len(head)) + "  ".join(f"{k} {v:.3g}" for k, v in m["untrained"].items()))
    if "infonce_baseline" in m:
        b = m["infonce_baseline"]
        lines.append("InfoNCE baseline:".ljust(len(head)) + "  ".join(f"{k} {b[k]:.2f}" for k in RETRIEVAL_KEYS)
                     + (f"  map (by class) {b['map']:.4f}" if "map" in b else ""))
    if "uncertainty_quality" in m:
        lines.extend(_quality_lines(m["uncertainty_quality"], m["method"]))
        if "infonce_baseline" in m:
            lines.extend(_quality_lines(m["infonce_baseline"]["uncertainty_quality"], "InfoNCE baseline"))
    if "abstention" in m:
        lines.extend(abstention_lines(m["abstention"], m["method"]))
        if "abstention" in m.get("infonce_baseline", {}):
            lines.extend(abstention_lines(m["infonce_baseline"]["abstention"], "InfoNCE baseline"))
    for name, check in m.get("done_when", {}).items():
        note = f"  <- {check['note']}" if check.get("note") and not check["pass"] else ""
        lines.append(f"  [{'ok' if check['pass'] else 'FAIL'}] {name}: {_fmt(check['value'])}{note}")
    for row in m.get("speed", []):
        if "fused_ms" in row:
            lines.append(f"speed {row['case']} loss fwd+bwd K={row['k']} D={row['d']}: fused {row['fused_backend']} "
                         f"{row['fused_ms']:.1f} ms vs plain PyTorch eager {row['reference_ms']:.1f} ms "
                         f"({row['speedup']:.1f}x), textbook PyTorch {row['naive_ms']:.1f} ms "
                         f"({row['speedup_vs_naive']:.1f}x)")
        else:
            lines.append(f"speed {row['case']}: plain PyTorch {row['reference_ms']:.1f} ms (no fused backend built)")
    return "\n".join(lines)
