"""Speed comparison of the loss implementations (used by the CLI and by bench/).

Every comparison is made in one process, one run: the fused backends against the plain-PyTorch
reference run eagerly and under torch.compile, and against the floor of three matrix products
(s = x·yᵀ, dx = G·y, dy = Gᵀ·x) that any implementation of the loss and its gradient must do.
"""

from __future__ import annotations

import functools
import math
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

# "reference" = evidential_ops.reference run eagerly in float32 (materialised K×K, stable forms),
# "naive" = the textbook formulas of SPEC §2 with torch.digamma/lgamma/polygamma, i.e. what a
# user would write by hand (fast but wrong in the hard regime), "compiled" = the reference under
# torch.compile, "floor" = the three matrix products; any other name is a fused backend.
BASELINES = ("reference", "naive", "compiled", "floor")


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


def naive_pytorch_loss(x: torch.Tensor, y: torch.Tensor, case: LossCase) -> torch.Tensor:
    """SPEC §2 written the textbook way, one-hot targets, both directions, mean reduction.

    A speed baseline only: it loses all digits of the KL term and NaNs in the log-determinant
    where evidence is large (SPEC §2 "Stable forms"), which is why the reference does not look like this.
    """
    alpha = reference.evidence(x @ y.T, case.evidence, case.tau) + 1.0
    k = alpha.shape[0]
    eye = torch.eye(k, dtype=alpha.dtype)

    def line_losses(a: torch.Tensor) -> torch.Tensor:
        strength = a.sum(1, keepdim=True)
        total = torch.zeros(k, dtype=a.dtype)
        w = case.weights
        if w.get("risk"):
            total = total + w["risk"] * (torch.digamma(strength[:, 0]) - torch.digamma(a.diagonal()))
        if w.get("kl"):
            tilde = eye + (1 - eye) * a
            st = tilde.sum(1, keepdim=True)
            kl = (torch.lgamma(st[:, 0]) - math.lgamma(k) - torch.lgamma(tilde).sum(1)
                  + ((tilde - 1) * (torch.digamma(tilde) - torch.digamma(st))).sum(1))
            total = total + w["kl"] * kl
        p = a / strength
        moment = (eye - p) ** 2 + p * (1 - p) / (strength + 1)
        if w.get("mse"):
            total = total + w["mse"] * moment.sum(1)
        if w.get("fmse") or w.get("logdet"):
            trig = torch.polygamma(1, a)
            if w.get("fmse"):
                total = total + w["fmse"] * (moment * trig).sum(1)
            if w.get("logdet"):
                logdet = torch.log(trig).sum(1) + torch.log(1 - torch.polygamma(1, strength[:, 0]) * (1 / trig).sum(1))
                total = total + w["logdet"] * logdet
        return total

    return line_losses(alpha).mean() + line_losses(alpha.T).mean()


def step_function(impl: str, case: LossCase) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A closure running forward + backward of `impl` on (x, y)."""
    if impl == "floor":
        def floor(x, y):
            with torch.no_grad():
                s = x @ y.T
                x.grad = s @ y  # stand-ins for G·y and Gᵀ·x: same shapes, same cost
                y.grad = s.T @ x
        return floor
    if impl in ("reference", "naive", "compiled"):
        fn = {"reference": plain_pytorch_loss, "naive": naive_pytorch_loss}.get(impl)
        fn = fn or torch.compile(plain_pytorch_loss, dynamic=False)
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
    """Median wall time of `repeats` calls of fn after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _runs_on_cpu(name: str) -> bool:
    try:
        backends.resolve(name, torch.device("cpu"))
    except ValueError:
        return False
    return True


def default_impls() -> list[str]:
    """Every fused backend that is built and runs on the CPU tensors this module makes (a CUDA build
    also lists "cuda": bench/bench_cuda.py times that one), then the plain-PyTorch baselines and
    the GEMM floor."""
    return [b for b in backends.available_backends() if b != "reference" and _runs_on_cpu(b)] + list(BASELINES)


def compare(sizes=(1024,), d: int = 512, cases=("tcl", "uml", "duq"), impls=None, repeats: int = 3):
    """Median fwd+bwd seconds of each implementation, all measured in this one run.

    Returns a list of dicts {case, k, impl, seconds}.
    """
    if impls is None:
        impls = default_impls()
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
    """Markdown table: one line per (case, K): times in ms, then for each fused backend how many
    times faster it is than each baseline, and its time as a multiple of the floor."""
    by_key: dict[tuple, dict[str, float]] = {}
    for r in results:
        by_key.setdefault((r["case"], r["k"]), {})[r["impl"]] = r["seconds"]
    impls = list(dict.fromkeys(r["impl"] for r in results))
    fused = [i for i in impls if i not in BASELINES]
    slower = [b for b in ("reference", "naive", "compiled") if b in impls]
    header = ["loss", "K"] + [f"{i} ms" for i in impls]
    for f in fused:
        header += [f"{f} vs {b}" for b in slower] + ([f"{f} ÷ floor"] if "floor" in impls else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (case, k), times in by_key.items():
        row = [case, str(k)] + [f"{times[i] * 1e3:.1f}" if i in times else "" for i in impls]
        for f in fused:
            t = times.get(f)
            row += [f"{times[b] / t:.1f}×" if t and b in times else "" for b in slower]
            if "floor" in impls:
                row.append(f"{t / times['floor']:.2f}" if t and "floor" in times else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
