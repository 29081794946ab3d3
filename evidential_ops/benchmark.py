"""Speed comparison of the loss implementations (used by the CLI and by bench/).

Every comparison is made in one process, one run: the fused backends against the plain-PyTorch
reference run eagerly and under torch.compile, and against the floor of three matrix products
(s = x·yᵀ, dx = G·y, dy = Gᵀ·x) that any implementation of the loss and its gradient must do.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import backends, checks, reference
from .losses import evidential_loss


@dataclass(frozen=True)
class LossCase:
    """One method's evidential loss configuration (SPEC §3)."""

    name: str
    description: str
    evidence: str
    tau: float
    weights: dict

    @property
    def keywords(self) -> dict:
        return {"evidence": self.evidence, "tau": self.tau, "weights": self.weights}


LOSS_CASES = {
    "tcl": LossCase("tcl", "TCL: risk + 0.1·kl, exp, τ = 0.05", "exp", 0.05, {"risk": 1.0, "kl": 0.1}),
    "uml": LossCase("uml", "UML: fmse − 0.01·logdet, exp_tanh, τ = 0.1", "exp_tanh", 0.1, {"fmse": 1.0, "logdet": -0.01}),
    "duq": LossCase("duq", "DUQ ISUM: mse, relu, τ = 1", "relu", 1.0, {"mse": 1.0}),
}

# "reference" = plain PyTorch eager (materialised K×K, torch.digamma/lgamma), "compiled" = the
# same under torch.compile, "floor" = the three matrix products; other names are backends.
BASELINES = ("reference", "compiled", "floor")


def make_inputs(k: int, d: int, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Unit-norm (K, D) embeddings with positives at cosine ≈ 0.6, as mid-training."""
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(k, d, generator=g), dim=1)
    y = F.normalize(0.6 * x + 0.8 * F.normalize(torch.randn(k, d, generator=g), dim=1), dim=1)
    return x.to(dtype).requires_grad_(), y.to(dtype).requires_grad_()


def plain_pytorch_loss(x: torch.Tensor, y: torch.Tensor, case: LossCase) -> torch.Tensor:
    """The reference loss with no input checks, so that torch.compile sees one graph."""
    config = checks.loss_config(reduction="mean", direction="both", **case.keywords)
    s = x @ y.T
    return config.reduce(*reference.losses.weighted_losses(s, config, None))


def step_function(impl: str, case: LossCase) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A closure running forward + backward of `impl` on (x, y)."""
    if impl == "floor":
        def floor(x, y):
            with torch.no_grad():
                s = x @ y.T
                x.grad = s @ y  # stand-ins for G·y and Gᵀ·x: same shapes, same cost
                y.grad = s.T @ x
        return floor
    if impl in ("reference", "compiled"):
        fn = plain_pytorch_loss if impl == "reference" else torch.compile(plain_pytorch_loss, dynamic=False)
        def plain(x, y):
            x.grad = y.grad = None
            fn(x, y, case).backward()
        return plain
    backends.resolve(impl, torch.device("cpu"))  # a clear error for a backend that is not built

    def fused(x, y):
        x.grad = y.grad = None
        evidential_loss(x, y, backend=impl, check_finite=False, **case.keywords).backward()
    return fused


def median_seconds(fn: Callable[[], None], *, repeats: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(sizes=(1024,), d: int = 512, cases=("tcl", "uml", "duq"), impls=None, repeats: int = 3):
    """Median fwd+bwd seconds of each implementation, all measured in this one run.

    Returns a list of dicts {case, k, impl, seconds}.
    """
    if impls is None:
        impls = [b for b in backends.available_backends() if b != "reference"] + list(BASELINES)
    results = []
    for k in sizes:
        x, y = make_inputs(k, d)
        for case_name in cases:
            case = LOSS_CASES[case_name]
            for impl in impls:
                step = functools.partial(step_function(impl, case), x, y)
                seconds = median_seconds(step, repeats=repeats)
                results.append({"case": case_name, "k": k, "impl": impl, "seconds": seconds})
    return results


def format_table(results) -> str:
    """Markdown table: one line per (case, K), times in ms and ratios to the baselines."""
    by_key: dict[tuple, dict[str, float]] = {}
    for r in results:
        by_key.setdefault((r["case"], r["k"]), {})[r["impl"]] = r["seconds"]
    impls = list(dict.fromkeys(r["impl"] for r in results))
    fused = [i for i in impls if i not in BASELINES]
    header = ["loss", "K"] + [f"{i} ms" for i in impls]
    for f in fused:
        header += [f"{f}: × faster than eager", "× faster than compiled", "÷ floor"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (case, k), times in by_key.items():
        row = [case, str(k)] + [f"{times[i] * 1e3:.1f}" if i in times else "" for i in impls]
        for f in fused:
            t = times.get(f)
            row += [
                f"{times['reference'] / t:.1f}" if t and "reference" in times else "",
                f"{times['compiled'] / t:.1f}" if t and "compiled" in times else "",
                f"{t / times['floor']:.2f}" if t and "floor" in times else "",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
