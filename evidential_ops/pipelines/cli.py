"""Subcommands train / eval / demo of `python -m evidential_ops` (the bench subcommand lives in
`evidential_ops.__main__`)."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
from dataclasses import fields, replace
from pathlib import Path

from ..config import EVIDENCE_KINDS
from ..data import SyntheticConfig
from ..models import TCL, UML, TcVSE
from .analysis import jsonable
from .distributed import launched_by_torchrun, refuse_torchrun, run_training_distributed
from .recipes import AUTO_CHUNK_ABOVE, AUTO_ENCODER_CHUNK, EVIDENTIAL_OPINION_METHODS, METHODS, get_recipe
from .runner import (
    PLOTS_HINT,
    DataError,
    DataSource,
    ResumeError,
    plots_available,
    report,
    run_demo,
    run_evaluation,
    run_training,
)
from .training import CheckpointError, TrainingDiverged

__all__ = ["HelpFormatter", "add_subcommands", "at_least", "device_option", "refused_inputs"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default: argparse's "(default: X)" after a concrete default.

    Options whose default is None (the method's own value, or computed from other options) and
    on/off flags get none from here: their help text says what happens without them, since
    "(default: None)" would tell a user nothing. Descriptions keep their line breaks.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def _per_method(values: dict) -> str:
    """"tcl 5, tcvse 5, ..." or the one value when every method has the same."""
    distinct = set(values.values())
    if len(distinct) == 1:
        return str(distinct.pop())
    return ", ".join(f"{method} {value}" for method, value in values.items())


def _recipe_defaults(name: str) -> str:
    """The recipes' value of `name` (epochs, batch_size, lr, embed_dim) per method, for --help."""
    return _per_method({method: getattr(get_recipe(method), name) for method in METHODS})


_OPINION_MODELS = {"tcl": TCL, "tcvse": TcVSE, "uml": UML}


def _opinion_defaults(name: str) -> str:
    """The evidence kind or τ each evidential-opinion method trains with when not overridden:
    its recipe's model option, else its constructor's default (searched up the class tree,
    since TcVSE passes τ on to TCL)."""
    values = {}
    for method in EVIDENTIAL_OPINION_METHODS:
        value = get_recipe(method).model.get(name, inspect.Parameter.empty)
        for cls in _OPINION_MODELS[method].__mro__:
            if value is not inspect.Parameter.empty:
                break
            parameter = inspect.signature(cls.__init__).parameters.get(name) if "__init__" in vars(cls) else None
            if parameter is not None:
                value = parameter.default
        values[method] = value
    return _per_method(values)


_SYNTHETIC_DEFAULTS = {f.name: f.default for f in fields(SyntheticConfig)}


def _data_defaults(name: str) -> str:
    """The built-in data's `name` (n_train, ...) per method: the recipe's override, else
    `SyntheticConfig`'s default."""
    return _per_method({method: get_recipe(method).data.get(name, _SYNTHETIC_DEFAULTS[name]) for method in METHODS})


def at_least(minimum: int, why: str = ""):
    """An argparse type: an int >= minimum (`why` follows the error when given)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{why}, got {value}")
        return value
    parse.__name__ = "int"  # argparse names the type in "invalid int value"
    return parse


_positive_int = at_least(1)
# Every method's loss contrasts each sample with the others of its batch (SPEC §2: K >= 2).
_batch_size = at_least(2, " (a batch contrasts each pair with the others)")


def device_option(text: str) -> str:
    """An argparse type: a torch device this machine has (e.g. cpu, cuda, cuda:1), refused at
    parse time instead of after the data is built."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:0)") from None
    if device.type == "cpu":
        return text
    if device.type == "cuda":  # counted, not allocated on: torchrun's ranks pick their GPU later
        count = torch.cuda.device_count()  # 0 where torch has no CUDA
        if count == 0:
            build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise argparse.ArgumentTypeError(f"{text!r} is not available here: torch {torch.__version__} ({build}) "
                                             "sees no CUDA device")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r} is not available here: {count} CUDA device(s)")
        return text
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        reason = str(error).splitlines()[0].split(". ")[0] if str(error) else type(error).__name__
        raise argparse.ArgumentTypeError(f"{text!r} is not available here: {reason}") from None
    return text


def _encoder_chunk(text: str) -> int | str:
    """--encoder-chunk: "auto", 0 (never) or a positive chunk size."""
    if text == "auto":
        return text
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be auto, 0 or a positive size, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _training_options(p: argparse.ArgumentParser, *, allow_all: bool) -> None:
    choices = METHODS + (("all",) if allow_all else ())
    p.add_argument("--method", required=True, choices=choices,
                   help="method to run" + (" ('all' runs each into OUT/<method>)" if allow_all else ""))
    p.add_argument("--out", default=None,
                   help="output directory (default: runs/<method>" + ("; with --method all, runs/demo)"
                                                                     if allow_all else ")"))
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the data, the initial weights and the batches")
    p.add_argument("--epochs", type=_positive_int, default=None,
                   help=f"training epochs (default: the method's, {_recipe_defaults('epochs')})")
    p.add_argument("--batch-size", type=_batch_size, default=None,
                   help=f"batch size K (default: the method's, {_recipe_defaults('batch_size')})")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help=f"Adam learning rate (default: the method's, {_recipe_defaults('lr')})")
    p.add_argument("--embed-dim", type=_positive_int, default=None,
                   help=f"joint-space size (default: {_recipe_defaults('embed_dim')}; fume ignores it: its joint "
                        "space has one dimension per class)")
    p.add_argument("--data", default=None,
                   help="directory of precomputed features ({split}_ims.npy, {split}_caps.txt, ...); "
                        "default: the built-in synthetic benchmark")
    p.add_argument("--captions-per-image", type=_positive_int, default=5, help="captions per image, with --data")
    p.add_argument("--alt-language", default=None,
                   help="with --data: read {split}_caps_LANG.txt (UML; default: no second language)")
    for name, what in (("n-train", "training"), ("n-val", "validation"), ("n-test", "test")):
        default = _data_defaults(name.replace("-", "_"))
        p.add_argument(f"--{name}", type=at_least(2), default=None,
                       help=f"built-in data: number of {what} samples (default: {default})"
                       + ("; generated with the data, read by no pipeline: none selects a model on it"
                          if name == "n-val" else ""))
    p.add_argument("--n-ood", type=at_least(0), default=None,
                   help=f"built-in data: out-of-distribution samples, 0 for none (default: {_data_defaults('n_ood')})")
    p.add_argument("--evidence", default=None, choices=EVIDENCE_KINDS,
                   help="evidence map of the method's opinions (tcl, tcvse, uml; e.g. UML with exp evidence frees "
                        f"u from [0.27, 0.73]) (default: {_opinion_defaults('evidence')})")
    p.add_argument("--tau", type=_positive_float, default=None,
                   help=f"τ of the evidence map (tcl, tcvse, uml) (default: {_opinion_defaults('tau')})")
    p.add_argument("--encoder-chunk", type=_encoder_chunk, default=None, metavar="N|auto|0",
                   help="encode a batch in checkpointed chunks of N samples: the encoders' activation memory "
                        "is that of N samples instead of the batch's, for one more encoder forward per update "
                        f"(0: never; default auto: chunks of {AUTO_ENCODER_CHUNK} above batch size "
                        f"{AUTO_CHUNK_ABOVE})")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device of the model")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output (bars on a terminal, one line per epoch otherwise)")


def _source(args, recipe, seed: int) -> DataSource:
    if args.data is not None:
        if not Path(args.data).is_dir():
            raise SystemExit(f"--data: {args.data} is not a directory")
        return DataSource.precomputed(args.data, captions_per_image=args.captions_per_image,
                                      alt_language=args.alt_language)
    return DataSource.synthetic(recipe, seed=seed, n_train=args.n_train, n_val=args.n_val, n_test=args.n_test,
                                n_ood=args.n_ood)


def _recipe(args, method: str, *, every_method: bool = False):
    """The recipe of `method` with the command line's overrides. every_method (--method all):
    --evidence/--tau go to the methods with evidential opinions and the others keep their own,
    where for one method alone they are an error."""
    recipe = get_recipe(method).with_overrides(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                               embed_dim=args.embed_dim)
    if args.encoder_chunk is not None:
        recipe = replace(recipe, encoder_chunk=None if args.encoder_chunk == 0 else args.encoder_chunk)
    if method == "uml" and args.data is not None and args.alt_language is None:
        raise SystemExit("--method uml with --data needs --alt-language LANG: UML learns from captions in a second "
                         "language ({split}_caps_LANG.txt)")
    opinion = {k: v for k, v in (("evidence", args.evidence), ("tau", args.tau)) if v is not None}
    if opinion:
        if method not in EVIDENTIAL_OPINION_METHODS:
            if every_method:
                return recipe
            raise SystemExit(f"--evidence/--tau apply to {', '.join(EVIDENTIAL_OPINION_METHODS)}, not {method}")
        kinds = _OPINION_MODELS[method].EVIDENCE_KINDS
        if args.evidence is not None and args.evidence not in kinds:
            raise SystemExit(f"--evidence {args.evidence}: {method} takes {', '.join(kinds)}")
        recipe = recipe.with_model_options(**opinion)
    return recipe


@contextlib.contextmanager
def refused_inputs(checkpoint_option: str | None = None):
    """What the user gave that the run cannot use (a checkpoint or data file, a learning rate that
    diverges) as one line and exit status 1, not a traceback; a checkpoint's error names the option
    that gave it (checkpoint_option: --checkpoint, --resume)."""
    try:
        yield
    except (FileNotFoundError, CheckpointError, ResumeError) as error:
        raise SystemExit(f"{checkpoint_option + ': ' if checkpoint_option else ''}{error}") from None
    except DataError as error:
        raise SystemExit(str(error)) from None
    except TrainingDiverged as error:
        raise SystemExit(f"{error} (--lr)") from None


def _plots() -> bool:
    """Checked before any training: without matplotlib the run goes on and only skips the PNGs."""
    if plots_available():
        return True
    print(PLOTS_HINT, flush=True)
    return False


def _wrote(*paths, plots: bool) -> str:
    return "wrote " + ", ".join(str(p) for p in paths) + (" and plots" if plots else " (no plots)")


def _train(args) -> int:
    out = Path(args.out or os.path.join("runs", args.method))
    recipe = _recipe(args, args.method)
    plots = _plots()
    if launched_by_torchrun():  # data-parallel, global-batch loss; rank 0 writes (pipelines/distributed.py)
        if args.baseline:
            raise SystemExit("--baseline is not available under torchrun: train the InfoNCE baseline in one process")
        if args.resume is not None:
            raise SystemExit("--resume is not available under torchrun: a data-parallel run is trained in one go")
        with refused_inputs():
            metrics = run_training_distributed(args.method, recipe, _source(args, recipe, args.seed), out,
                                               seed=args.seed, quiet=args.quiet, device=args.device, plots=plots)
        if metrics is None:
            return 0
    else:
        # The resume checkpoint is read before the data is built (run_training): a missing or
        # mismatched one is refused at once, naming --resume.
        with refused_inputs("--resume" if args.resume is not None else None):
            metrics = run_training(args.method, recipe, _source(args, recipe, args.seed), out, seed=args.seed,
                                   quiet=args.quiet, device=args.device, baseline=args.baseline, plots=plots,
                                   resume=args.resume)
    print(report(metrics))
    print(_wrote(out / "checkpoint.pt", out / "metrics.json", plots=plots))
    return 0


def _eval(args) -> int:
    refuse_torchrun("eval")
    out = Path(args.out or Path(args.checkpoint).parent / "eval")
    plots = _plots()
    with refused_inputs("--checkpoint"):
        metrics = run_evaluation(args.checkpoint, out, device=args.device, plots=plots)
    print(report(metrics))
    print(_wrote(out / "metrics.json", plots=plots))
    return 0


def _demo(args) -> int:
    refuse_torchrun("demo")
    methods = METHODS if args.method == "all" else (args.method,)
    root = Path(args.out or os.path.join("runs", "demo" if args.method == "all" else args.method))
    bench_k = None if args.no_bench else args.bench_size
    # Bad options fail before any training.
    recipes = {method: _recipe(args, method, every_method=args.method == "all") for method in methods}
    if args.method == "all" and (args.evidence is not None or args.tau is not None):
        print(f"--evidence/--tau apply to {', '.join(EVIDENTIAL_OPINION_METHODS)}; the others keep their own",
              flush=True)
    plots = _plots()
    summary = {}
    for method in methods:
        out = root / method if args.method == "all" else root
        recipe = recipes[method]
        with refused_inputs():
            metrics = run_demo(method, recipe, _source(args, recipe, args.seed), out, seed=args.seed,
                               quiet=args.quiet, device=args.device, bench_k=bench_k,
                               baseline=not args.no_baseline, plots=plots)
        summary[method] = {"rsum": metrics["rsum"], "done_when": metrics["done_when"],
                           "seconds": metrics["total_seconds"]}
        print(_wrote(out / "metrics.json", plots=plots) + "\n")
    if args.method == "all":
        with open(root / "summary.json", "w") as f:
            json.dump(jsonable(summary), f, indent=2, allow_nan=False)
        failed = [f"{m}:{name}" for m, s in summary.items() for name, c in s["done_when"].items() if not c["pass"]]
        print(f"wrote {root / 'summary.json'}; " + (f"checks failing: {failed}" if failed else "every check passes"))
    return 0


def add_subcommands(sub) -> None:
    """Register train, eval and demo on an argparse subparsers object."""
    p = sub.add_parser("train", formatter_class=HelpFormatter,
                       help="train a method; writes checkpoint.pt, metrics.json, plots")
    _training_options(p, allow_all=False)
    p.add_argument("--baseline", action="store_true",
                   help="also train the same-encoder InfoNCE baseline and compare with it (as demo does)")
    p.add_argument("--resume", default=None, metavar="CHECKPOINT",
                   help="continue the run that CHECKPOINT (a checkpoint.pt of train, rewritten after every epoch) "
                        "records, from the epochs it holds up to --epochs, with its model, optimiser and random "
                        "states: the result is that of the uninterrupted run. The other options must be those of "
                        "that run (--epochs may grow, except for uml); default: train from the start")
    p.set_defaults(run=_train)

    p = sub.add_parser("eval", formatter_class=HelpFormatter, help="evaluate a checkpoint on its data's test split")
    p.add_argument("--checkpoint", required=True, help="checkpoint.pt written by train or demo")
    p.add_argument("--out", default=None, help="output directory (default: next to the checkpoint, eval/)")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device of the model")
    p.add_argument("--quiet", action="store_true", help="accepted for symmetry; eval shows no bars")
    p.set_defaults(run=_eval)

    p = sub.add_parser("demo", formatter_class=HelpFormatter,
                       help="the README's main job: train on the built-in data with the fused loss, evaluate, plot, "
                            "and time the fused loss against plain PyTorch")
    _training_options(p, allow_all=True)
    p.add_argument("--bench-size", type=_batch_size, default=1024, help="K of the speed comparison")
    p.add_argument("--no-bench", action="store_true", help="skip the speed comparison")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the same-encoder InfoNCE baseline (and the checks against it)")
    p.set_defaults(run=_demo)
