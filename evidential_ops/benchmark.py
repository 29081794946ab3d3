"""Speed and memory comparison of the loss implementations (used by the CLI and by bench/).

Every comparison is made in one process, one run: the fused backends against the plain-PyTorch
reference run eagerly and under torch.compile, and against the floor of three matrix products
(s = x·yᵀ, dx = G·y, dy = Gᵀ·x) that any implementation of the loss and its gradient must do,
at the same precision. On CUDA tensors steps are timed with CUDA events (the host waits for the
device once per measurement, not per kernel) and the peak extra device memory of a step is
`torch.cuda.max_memory_allocated` after a reset, minus what was allocated before it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import backends, checks, reference
from .backends import matmul_precision
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


def make_inputs(k: int, d: int, *, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
    """Unit-norm (K, D) embeddings with positives at cosine ≈ 0.6, as mid-training (drawn on the
    CPU with a seeded generator, so every device sees the same values)."""
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(k, d, generator=g), dim=1)
    y = F.normalize(0.6 * x + 0.8 * F.normalize(torch.randn(k, d, generator=g), dim=1), dim=1)
    return x.to(device=device, dtype=dtype).requires_grad_(), y.to(device=device, dtype=dtype).requires_grad_()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module knows of it."""
    brand = platform.processor() or platform.machine() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            brand = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), brand)
    except OSError:
        pass
    return brand


def device_name(device) -> str:
    """The GPU's name, or the CPU's model and core count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


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
    eye = torch.eye(k, dtype=alpha.dtype, device=alpha.device)

    def line_losses(a: torch.Tensor) -> torch.Tensor:
        strength = a.sum(1, keepdim=True)
        total = torch.zeros(k, dtype=a.dtype, device=a.device)
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


def floor_step(precision: str = "ieee") -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The floor of any loss-and-gradient step from embeddings x, y (K, D): the three K×K×D
    products s = x·yᵀ, G·y and Gᵀ·x at `precision`, with s itself standing in for G (same shapes,
    same cost), no element work."""
    def floor(x, y):
        with torch.no_grad(), matmul_precision(precision):
            s = x @ y.T
            x.grad = s @ y
            y.grad = s.T @ x
    return floor


def step_function(impl: str, case: LossCase, *, device="cpu",
                  precision: str = "ieee") -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A closure running forward + backward of `impl` on (x, y) (tensors on `device`), with
    matmuls at `precision` ("ieee" or "tf32"; bf16/fp16 inputs run their products in bf16/fp16)."""
    if impl == "floor":
        return floor_step(precision)
    if impl in ("reference", "naive", "compiled"):
        fn = {"reference": plain_pytorch_loss, "naive": naive_pytorch_loss}.get(impl)
        fn = fn or torch.compile(plain_pytorch_loss, dynamic=False)
        room = _recompile_room() if impl == "compiled" else contextlib.nullcontext
        def plain(x, y):
            x.grad = y.grad = None
            with matmul_precision(precision), room():
                fn(x, y, case).backward()
        return plain
    backends.resolve(impl, torch.device(device))  # a clear error for a backend that is not built

    def fused(x, y):
        x.grad = y.grad = None
        evidential_loss(x, y, backend=impl, check_finite=False, matmul_precision=precision,
                        **case.keywords).backward()
    return fused


# Every compiled step compiles the same function, plain_pytorch_loss, once per loss case, shape and
# dtype: a benchmark run has more of those than Dynamo's recompile_limit (8), past which the
# function silently runs eagerly ("compiled" DUQ at K = 4096 then timed the eager reference: 1538
# against 1544 ms, where compiled it takes about 800).
_RECOMPILES_PER_RUN = 256


def recompile_limit_name() -> str:
    """The name of Dynamo's per-function recompile limit: recompile_limit (cache_size_limit before
    torch 2.6)."""
    import torch._dynamo  # noqa: F401  (a submodule torch imports lazily)

    return "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


def _recompile_room():
    """A context in which plain_pytorch_loss may be compiled for another (case, shape, dtype) past
    Dynamo's default recompile limit."""
    return functools.partial(torch._dynamo.config.patch, **{recompile_limit_name(): _RECOMPILES_PER_RUN})


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of(fn: Callable[[], None], device="cpu") -> float:
    """Wall time of one call: CUDA events around it on a GPU (kernels are asynchronous), the
    host clock on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    start_time = time.perf_counter()
    fn()
    return time.perf_counter() - start_time


def timings(fn: Callable[[], None], *, repeats: int = 3, warmup: int = 1, device="cpu") -> list[float]:
    """Seconds of `repeats` calls of fn after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    _synchronize(torch.device(device))
    return [seconds_of(fn, device) for _ in range(repeats)]


def interleaved_minima(steps: dict[str, Callable[[torch.Tensor, torch.Tensor], None]], x: torch.Tensor,
                       y: torch.Tensor, rounds: int, device="cpu") -> dict[str, float]:
    """Fastest seconds of each step(x, y) over `rounds` rounds, after one warm-up call each, the
    steps alternating within a round (their order reversed every other round): on a shared machine
    whose speed drifts, each step's minimum is then taken over the same stretch of time."""
    for step in steps.values():
        step(x, y)
    _synchronize(torch.device(device))
    best = {name: float("inf") for name in steps}
    for r in range(rounds):
        for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            best[name] = min(best[name], seconds_of(lambda: steps[name](x, y), device))
    return best


def median_seconds(fn: Callable[[], None], *, repeats: int = 3, warmup: int = 1, device="cpu") -> float:
    """Median time of `repeats` calls of fn after `warmup` untimed ones."""
    return statistics.median(timings(fn, repeats=repeats, warmup=warmup, device=device))


def peak_extra_device_mib(fn: Callable[[], None], device) -> float:
    """Peak CUDA memory allocated during one call of fn beyond what was allocated before it
    (inputs, their previous gradients released), in MiB. CUDA only: the CPU figure needs a fresh
    process (bench/memory_probe.py)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"peak_extra_device_mib measures CUDA memory, got device {device}")
    _synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def fused_backends(device="cpu") -> list[str]:
    """The built fused backends that run on `device`, the one backend="auto" takes first (a CUDA
    build lists cuda, not for CPU tensors)."""
    return [b for b in backends.preferred(torch.device(device)) if b != "reference"]


def default_impls(device="cpu") -> list[str]:
    """Every fused backend built for `device`, then the plain-PyTorch baselines and the GEMM floor."""
    return fused_backends(device) + list(BASELINES)


def compare(sizes=(1024,), d: int = 512, cases=("tcl", "uml", "duq"), impls=None, repeats: int = 3,
            device="cpu"):
    """Median fwd+bwd seconds of each implementation, all measured in this one run.

    Returns a list of dicts {case, k, impl, seconds}.
    """
    if impls is None:
        impls = default_impls(device)
    results = []
    for k in sizes:
        x, y = make_inputs(k, d, device=device)
        for case_name in cases:
            case = LOSS_CASES[case_name]
            for impl in impls:
                step = functools.partial(step_function(impl, case, device=device), x, y)
                seconds = median_seconds(step, repeats=repeats, device=device)
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
