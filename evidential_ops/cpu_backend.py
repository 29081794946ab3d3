"""The fused C++ CPU backend: autograd and fake (meta) registrations of the evidential_ops ops.

The schemas and CPU kernels live in csrc/ (ops.cpp, cpu/). Here each forward op gets a fake
implementation (shapes only, for torch.compile and torch.library.opcheck) and an autograd
formula that calls the backward op, itself a registered op with its own fake implementation.
No torch.autograd.Function is involved (those are a silent-wrong-result source under
torch.compile).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import backends, extension
from .checks import output_dtype
from .config import LossConfig
from .results import Opinion

NUM_LINE_STATS = 7  # csrc/kernels/line_terms.h LineStat
ops = torch.ops.evidential_ops


def _register_fakes() -> None:
    @torch.library.register_fake("evidential_ops::loss_forward")
    def _(x, y, target_scale, evidence, tau, weights, rows, cols):
        k = x.shape[0]
        dtype = output_dtype(x.dtype)
        return x.new_empty(k, dtype=dtype), x.new_empty(k, dtype=dtype), x.new_empty((2, NUM_LINE_STATS, k), dtype=torch.float64)

    @torch.library.register_fake("evidential_ops::loss_forward_from_similarity")
    def _(s, target_scale, evidence, tau, weights, rows, cols):
        k = s.shape[0]
        dtype = output_dtype(s.dtype)
        return s.new_empty(k, dtype=dtype), s.new_empty(k, dtype=dtype), s.new_empty((2, NUM_LINE_STATS, k), dtype=torch.float64)

    @torch.library.register_fake("evidential_ops::loss_backward")
    def _(grad_rows, grad_cols, x, y, target_scale, stats, evidence, tau, weights, rows, cols, output_mask):
        # new_empty, not empty_like: the kernels return contiguous gradients for any input strides.
        dx = x.new_empty(x.shape) if output_mask[0] else x.new_empty(0)
        dy = y.new_empty(y.shape) if output_mask[1] else y.new_empty(0)
        return dx, dy

    @torch.library.register_fake("evidential_ops::loss_backward_from_similarity")
    def _(grad_rows, grad_cols, s, target_scale, stats, evidence, tau, weights, rows, cols):
        return s.new_empty(s.shape)

    @torch.library.register_fake("evidential_ops::opinion")
    def _(x, y, evidence, tau):
        dtype = output_dtype(x.dtype)
        return x.new_empty(x.shape[0], dtype=dtype), x.new_empty(y.shape[0], dtype=dtype)

    @torch.library.register_fake("evidential_ops::opinion_from_similarity")
    def _(s, evidence, tau):
        dtype = output_dtype(s.dtype)
        return s.new_empty(s.shape[0], dtype=dtype), s.new_empty(s.shape[1], dtype=dtype)


def _setup_embeddings(ctx, inputs, output):
    x, y, target_scale, evidence, tau, weights, rows, cols = inputs
    _, _, stats = output
    ctx.save_for_backward(x, y, target_scale, stats)
    ctx.options = (evidence, tau, weights, rows, cols)


def _backward_embeddings(ctx, grad_rows, grad_cols, grad_stats):
    x, y, target_scale, stats = ctx.saved_tensors
    evidence, tau, weights, rows, cols = ctx.options
    mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
    dx, dy = ops.loss_backward(
        grad_rows, grad_cols, x, y, target_scale, stats,
        evidence, tau, weights, rows, cols, mask,
    )
    return (dx if mask[0] else None), (dy if mask[1] else None), None, None, None, None, None, None


def _setup_similarity(ctx, inputs, output):
    s, target_scale, evidence, tau, weights, rows, cols = inputs
    _, _, stats = output
    ctx.save_for_backward(s, target_scale, stats)
    ctx.options = (evidence, tau, weights, rows, cols)


def _backward_similarity(ctx, grad_rows, grad_cols, grad_stats):
    s, target_scale, stats = ctx.saved_tensors
    evidence, tau, weights, rows, cols = ctx.options
    ds = ops.loss_backward_from_similarity(
        grad_rows, grad_cols, s, target_scale, stats,
        evidence, tau, weights, rows, cols,
    )
    return ds, None, None, None, None, None, None


def _register_autograd() -> None:
    torch.library.register_autograd(
        "evidential_ops::loss_forward", _backward_embeddings, setup_context=_setup_embeddings
    )
    torch.library.register_autograd(
        "evidential_ops::loss_forward_from_similarity", _backward_similarity, setup_context=_setup_similarity
    )


def _weights(config: LossConfig) -> Tensor:
    # A tensor, not a float list: under torch.compile an annealed weight (TCL's λ) then changes
    # without a recompile (float arguments of an op are specialised on their value).
    return torch.tensor(config.weights, dtype=torch.float64)


class CpuBackend:
    """Fused C++ kernels: tiled, O(K) extra memory, exact float64 evaluation of every element.

    Implements `backends.Backend`; target_scale may be bool (the kernels read it as float64 0/1).
    """

    name = "cpu"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    @staticmethod
    def _pick(rows: Tensor, cols: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
        return (rows if config.rows else rows[:0]), (cols if config.cols else cols[:0])

    def losses(self, x, y, target_scale, config: LossConfig):
        rows, cols, _ = ops.loss_forward(
            x, y, target_scale, config.evidence, config.tau, _weights(config), config.rows, config.cols
        )
        return self._pick(rows, cols, config)

    def losses_from_similarity(self, s, target_scale, config: LossConfig):
        rows, cols, _ = ops.loss_forward_from_similarity(
            s, target_scale, config.evidence, config.tau, _weights(config), config.rows, config.cols
        )
        return self._pick(rows, cols, config)

    def opinion(self, x, y, evidence, tau) -> Opinion:
        return Opinion.from_log_strengths(*ops.opinion(x, y, evidence, tau))

    def opinion_from_similarity(self, s, evidence, tau) -> Opinion:
        return Opinion.from_log_strengths(*ops.opinion_from_similarity(s, evidence, tau))


def cpu_isa(request: str = "") -> str:
    """The instruction-set variant of the CPU tile kernels in use ("generic", "avx2", "avx512"),
    or switch to another one ("best" restores the default). Mainly for tests and benchmarks."""
    return ops.cpu_isa(request)


if extension.loaded():
    _register_fakes()
    _register_autograd()
    backends.register(CpuBackend())
