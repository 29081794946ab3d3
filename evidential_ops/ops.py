"""The evidential_ops operator family, once for every device: layout, fakes, autograd.

The schemas are C++ (csrc/ops.cpp); each device registers kernels on them
(`TORCH_LIBRARY_IMPL(evidential_ops, CPU | CUDA, m)`). This module registers, for every device at
once, what PyTorch needs around those kernels:

- a fake (meta) implementation per op: output shapes, dtypes and devices, and the device checks
  that keep a meta or foreign-device argument from reaching a kernel (torch.compile,
  `torch.library.opcheck`, meta tensors);
- the autograd formula of each loss op, which calls the backward op (itself an op with a fake), and
  a backward of the backward ops that raises: double backward is not implemented.

Kernel families written in Python (Triton) reuse all of this without copies: they define the
same schemas (`schemas()`) under a namespace of their own (a `torch.library.Library`; triton_op
would infer a different schema from type hints), register their kernels, and
`register_family(namespace)` registers the same fakes and autograd there (docs/backends.md "Layout").

Statistics layout (csrc/kernels/line_terms.h, line_finalise.h): `row_stats` (NUM_LINE_STATS, M)
and `col_stats` (NUM_LINE_STATS, N), float64 on the inputs' device; row k of a direction's stats
is LineStat k (α_target, Σ_{j≠y} α, Σ h(α), Σ (α·2^-511)², Σ α(α+1)ψ1(α), Σ ln ψ1(α), Σ r(α)).
A statistic that no term of the mask reads is unspecified (0 on the CPU, accumulated anyway by
some kernels): only line_losses and loss_backward with the same mask read them.
The InfoNCE ops' statistics (csrc/kernels/infonce_lines.h) are (INFONCE_NUM_LINE_STATS = 2, K)
per direction: the log-sum-exp of each line over its candidates, then over its positives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from . import extension
from .checks import output_dtype, weights_as_tensor
from .config import TERMS, LossConfig

NAMESPACE = "evidential_ops"
LOSS_OPS = ("loss_forward", "loss_forward_from_similarity")
BACKWARD_OPS = ("loss_backward", "loss_backward_from_similarity")
INFONCE_OPS = ("infonce_forward", "infonce_backward")  # SPEC §2 "InfoNCE"
OPS = ("line_stats", "line_losses", *LOSS_OPS, *BACKWARD_OPS, "opinion", "opinion_from_similarity", *INFONCE_OPS)


@dataclass(frozen=True)
class StatsLayout:
    """Sizes fixed by the compiled kernels (read from the extension, never copied)."""

    num_line_stats: int
    num_terms: int
    infonce_line_stats: int


def _layout() -> StatsLayout | None:
    module = extension.module()
    if module is None:
        return None
    layout = StatsLayout(num_line_stats=module.NUM_LINE_STATS, num_terms=module.NUM_TERMS,
                         infonce_line_stats=module.INFONCE_NUM_LINE_STATS)
    if layout.num_terms != len(TERMS):
        raise ImportError(f"evidential_ops._C has {layout.num_terms} terms but config.TERMS has {len(TERMS)}: rebuild")
    return layout


LAYOUT = _layout()


def terms_mask(config: LossConfig) -> int:
    """Bit k set iff TERMS[k] is computed (the `terms` argument of the ops)."""
    return sum(1 << k for k, on in enumerate(config.enabled) if on)


def weights_tensor(config: LossConfig, device: torch.device | None = None) -> Tensor:
    """The `weights` argument: float64 (5,), on the CPU unless a family wants it on its device.

    A tensor, not a float list: under torch.compile an annealed weight (TCL's λ) then changes
    without a recompile (float arguments of an op are specialised on their value).
    """
    return weights_as_tensor(config.weights, device)


def _op(namespace: str, name: str):
    return getattr(getattr(torch.ops, namespace), name)


# ------------------------------------------------------------------------------------------ fakes


def _same_device(t: Tensor | None, name: str, like: Tensor) -> None:
    if t is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but the inputs are on {like.device}")


def _check_weights(weights: Tensor, like: Tensor) -> None:
    if weights.device.type != "cpu" and weights.device != like.device:
        raise ValueError(f"weights must be on the CPU or on {like.device}, got {weights.device}")


# The fakes accept exactly the calls the kernels accept (csrc/op_args.cpp), so that a bad direct
# call fails while tracing, not at the first run of the compiled graph.


def _check_embeddings(x: Tensor, y: Tensor) -> None:
    _same_device(y, "y", x)
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must be 2-D with the same embedding size D, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype or not x.is_floating_point():
        raise TypeError(f"x and y must have the same floating dtype, got {x.dtype} and {y.dtype}")


def _check_similarity(s: Tensor) -> None:
    if s.dim() != 2:
        raise ValueError(f"s must be a 2-D similarity matrix, got shape {tuple(s.shape)}")
    if not s.is_floating_point():
        raise TypeError(f"s must be floating, got {s.dtype}")


def _check_square(m, n) -> None:
    if m != n or m < 2:
        raise ValueError(f"the loss needs a square K×K problem with K >= 2, got {m}×{n}")


def _check_strip(m, n, offset: int) -> None:
    if not (n >= 2 and m >= 1 and 0 <= offset <= n - m):
        raise ValueError("a strip is rows [target_offset, target_offset + M) of an N×N problem (N >= 2): got "
                         f"M = {m}, N = {n}, target_offset = {offset}")


def _check_stats(stats: Tensor, name: str, n: int, like: Tensor) -> None:
    _same_device(stats, name, like)
    if stats.dtype != torch.float64:
        raise TypeError(f"{name} must be the float64 statistics of the forward, got {stats.dtype}")
    if tuple(stats.shape) != (LAYOUT.num_line_stats, n):
        raise ValueError(
            f"{name} must be the ({LAYOUT.num_line_stats}, {n}) statistics of the forward, got {tuple(stats.shape)}"
        )


def _stats_pair(like: Tensor, m: int, n: int) -> tuple[Tensor, Tensor]:
    return (like.new_empty((LAYOUT.num_line_stats, m), dtype=torch.float64),
            like.new_empty((LAYOUT.num_line_stats, n), dtype=torch.float64))


def _register_fakes(namespace: str) -> None:
    def fake(name):
        return torch.library.register_fake(f"{namespace}::{name}")

    @fake("line_stats")
    def _(x, y, target_offset, evidence, tau, terms, rows, cols, matmul_precision="ieee"):
        _check_embeddings(x, y)
        _check_strip(x.shape[0], y.shape[0], target_offset)
        return _stats_pair(x, x.shape[0], y.shape[0])

    @fake("line_losses")
    def _(row_stats, col_stats, target_scale, target_offset, weights, terms, rows, cols):
        _same_device(col_stats, "col_stats", row_stats)
        _same_device(target_scale, "target_scale", row_stats)
        _check_weights(weights, row_stats)
        m = row_stats.shape[1] if row_stats.dim() == 2 else -1
        n = col_stats.shape[1] if col_stats.dim() == 2 else -1
        _check_stats(row_stats, "row_stats", m, row_stats)
        _check_stats(col_stats, "col_stats", n, row_stats)
        _check_strip(m, n, target_offset)
        return row_stats.new_empty(m), row_stats.new_empty(n)

    def forward_fake(like, target_scale, weights, m, n):
        _same_device(target_scale, "target_scale", like)
        _check_weights(weights, like)
        dtype = output_dtype(like.dtype)
        return (like.new_empty(m, dtype=dtype), like.new_empty(n, dtype=dtype), *_stats_pair(like, m, n))

    @fake("loss_forward")
    def _(x, y, target_scale, evidence, tau, weights, terms, rows, cols, matmul_precision="ieee"):
        _check_embeddings(x, y)
        _check_square(x.shape[0], y.shape[0])
        return forward_fake(x, target_scale, weights, x.shape[0], y.shape[0])

    @fake("loss_forward_from_similarity")
    def _(s, target_scale, evidence, tau, weights, terms, rows, cols):
        _check_similarity(s)
        _check_square(s.shape[0], s.shape[1])
        return forward_fake(s, target_scale, weights, s.shape[0], s.shape[1])

    def backward_checks(like, grad_rows, grad_cols, target_scale, row_stats, col_stats, weights, m, n):
        for t, name in ((grad_rows, "grad_rows"), (grad_cols, "grad_cols"), (target_scale, "target_scale")):
            _same_device(t, name, like)
        _check_stats(row_stats, "row_stats", m, like)
        _check_stats(col_stats, "col_stats", n, like)
        _check_weights(weights, like)

    @fake("loss_backward")
    def _(grad_rows, grad_cols, x, y, target_scale, row_stats, col_stats, evidence, tau, weights, terms, rows, cols,
          target_offset, output_mask, matmul_precision="ieee"):
        _check_embeddings(x, y)
        _check_strip(x.shape[0], y.shape[0], target_offset)
        backward_checks(x, grad_rows, grad_cols, target_scale, row_stats, col_stats, weights, x.shape[0], y.shape[0])
        # new_empty, not empty_like: the kernels return contiguous gradients for any input strides.
        dx = x.new_empty(x.shape) if output_mask[0] else x.new_empty(0)
        dy = y.new_empty(y.shape) if output_mask[1] else y.new_empty(0)
        return dx, dy

    @fake("loss_backward_from_similarity")
    def _(grad_rows, grad_cols, s, target_scale, row_stats, col_stats, evidence, tau, weights, terms, rows, cols):
        _check_similarity(s)
        _check_square(s.shape[0], s.shape[1])
        backward_checks(s, grad_rows, grad_cols, target_scale, row_stats, col_stats, weights, s.shape[0], s.shape[1])
        return s.new_empty(s.shape)

    @fake("opinion")
    def _(x, y, evidence, tau, matmul_precision="ieee"):
        _check_embeddings(x, y)
        dtype = output_dtype(x.dtype)
        return x.new_empty(x.shape[0], dtype=dtype), x.new_empty(y.shape[0], dtype=dtype)

    @fake("opinion_from_similarity")
    def _(s, evidence, tau):
        _check_similarity(s)
        dtype = output_dtype(s.dtype)
        return s.new_empty(s.shape[0], dtype=dtype), s.new_empty(s.shape[1], dtype=dtype)


# --------------------------------------------------------------------------------------- autograd


def _register_autograd(namespace: str) -> None:
    ops = getattr(torch.ops, namespace)

    def setup_embeddings(ctx, inputs, output):
        x, y, target_scale, evidence, tau, weights, terms, rows, cols, matmul_precision = inputs
        _, _, row_stats, col_stats = output
        ctx.save_for_backward(x, y, target_scale, row_stats, col_stats, weights)
        ctx.options = (evidence, tau, terms, rows, cols, matmul_precision)

    def backward_embeddings(ctx, grad_rows, grad_cols, _grad_row_stats, _grad_col_stats):
        x, y, target_scale, row_stats, col_stats, weights = ctx.saved_tensors
        evidence, tau, terms, rows, cols, matmul_precision = ctx.options
        mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
        dx, dy = ops.loss_backward(grad_rows, grad_cols, x, y, target_scale, row_stats, col_stats,
                                   evidence, tau, weights, terms, rows, cols, 0, mask, matmul_precision)
        return (dx if mask[0] else None), (dy if mask[1] else None), None, None, None, None, None, None, None, None

    def setup_similarity(ctx, inputs, output):
        s, target_scale, evidence, tau, weights, terms, rows, cols = inputs
        _, _, row_stats, col_stats = output
        ctx.save_for_backward(s, target_scale, row_stats, col_stats, weights)
        ctx.options = (evidence, tau, terms, rows, cols)

    def backward_similarity(ctx, grad_rows, grad_cols, _grad_row_stats, _grad_col_stats):
        s, target_scale, row_stats, col_stats, weights = ctx.saved_tensors
        evidence, tau, terms, rows, cols = ctx.options
        ds = ops.loss_backward_from_similarity(grad_rows, grad_cols, s, target_scale, row_stats, col_stats,
                                               evidence, tau, weights, terms, rows, cols)
        return ds, None, None, None, None, None, None, None

    torch.library.register_autograd(f"{namespace}::loss_forward", backward_embeddings, setup_context=setup_embeddings)
    torch.library.register_autograd(
        f"{namespace}::loss_forward_from_similarity", backward_similarity, setup_context=setup_similarity
    )

    # Without an autograd kernel, create_graph=True would hand back gradients that silently carry
    # no history (a second grad returns zeros). Differentiating them is an explicit error instead.
    for name in BACKWARD_OPS:
        def no_double_backward(ctx, *grads, _name=name):
            raise NotImplementedError(
                f"double backward through {namespace}::{_name} is not implemented (the fused evidential "
                f"loss is differentiable once); use backend='reference' for higher-order gradients"
            )

        torch.library.register_autograd(f"{namespace}::{name}", no_double_backward, setup_context=_nothing_to_save)


def _nothing_to_save(ctx, inputs, output) -> None:
    pass


# ------------------------------------------------------------------------------------ InfoNCE


def _check_group(group: Tensor | None, k: int, like: Tensor) -> None:
    if group is None:
        return
    _same_device(group, "group", like)
    if group.dtype != torch.int64:
        raise TypeError(f"group must be an int64 tensor of ids, got {group.dtype}")
    if tuple(group.shape) != (k,):
        raise ValueError(f"group must have shape ({k},), got {tuple(group.shape)}")


def _check_infonce_stats(stats: Tensor, name: str, k: int, like: Tensor) -> None:
    _same_device(stats, name, like)
    if stats.dtype != torch.float64:
        raise TypeError(f"{name} must be the float64 statistics of the forward, got {stats.dtype}")
    if tuple(stats.shape) != (LAYOUT.infonce_line_stats, k):
        raise ValueError(
            f"{name} must be the ({LAYOUT.infonce_line_stats}, {k}) statistics of the forward, got {tuple(stats.shape)}"
        )


def _register_infonce_fakes(namespace: str) -> None:
    @torch.library.register_fake(f"{namespace}::infonce_forward")
    def _(x, y, group, tau, drop_self, rows, cols, matmul_precision="ieee"):
        _check_embeddings(x, y)
        _check_square(x.shape[0], y.shape[0])
        _check_group(group, x.shape[0], x)
        k, dtype = x.shape[0], output_dtype(x.dtype)
        stats = LAYOUT.infonce_line_stats
        return (x.new_empty(k, dtype=dtype), x.new_empty(k, dtype=dtype),
                x.new_empty((stats, k), dtype=torch.float64), x.new_empty((stats, k), dtype=torch.float64))

    @torch.library.register_fake(f"{namespace}::infonce_backward")
    def _(grad_rows, grad_cols, x, y, group, row_stats, col_stats, tau, drop_self, rows, cols, output_mask,
          matmul_precision="ieee"):
        _check_embeddings(x, y)
        _check_square(x.shape[0], y.shape[0])
        _check_group(group, x.shape[0], x)
        for t, name in ((grad_rows, "grad_rows"), (grad_cols, "grad_cols")):
            _same_device(t, name, x)
        _check_infonce_stats(row_stats, "row_stats", x.shape[0], x)
        _check_infonce_stats(col_stats, "col_stats", x.shape[0], x)
        dx = x.new_empty(x.shape) if output_mask[0] else x.new_empty(0)
        dy = y.new_empty(y.shape) if output_mask[1] else y.new_empty(0)
        return dx, dy


def _register_infonce_autograd(namespace: str) -> None:
    ops = getattr(torch.ops, namespace)

    def setup(ctx, inputs, output):
        x, y, group, tau, drop_self, rows, cols, matmul_precision = inputs
        _, _, row_stats, col_stats = output
        ctx.save_for_backward(x, y, group, row_stats, col_stats)
        ctx.options = (tau, drop_self, rows, cols, matmul_precision)

    def backward(ctx, grad_rows, grad_cols, _grad_row_stats, _grad_col_stats):
        x, y, group, row_stats, col_stats = ctx.saved_tensors
        tau, drop_self, rows, cols, matmul_precision = ctx.options
        mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
        dx, dy = ops.infonce_backward(grad_rows, grad_cols, x, y, group, row_stats, col_stats, tau, drop_self,
                                      rows, cols, mask, matmul_precision)
        return (dx if mask[0] else None), (dy if mask[1] else None), None, None, None, None, None, None

    torch.library.register_autograd(f"{namespace}::infonce_forward", backward, setup_context=setup)

    def no_double_backward(ctx, *grads):
        raise NotImplementedError(
            f"double backward through {namespace}::infonce_backward is not implemented (the fused InfoNCE is "
            f"differentiable once); use backend='reference' for higher-order gradients"
        )

    torch.library.register_autograd(f"{namespace}::infonce_backward", no_double_backward,
                                    setup_context=_nothing_to_save)


def register_family(namespace: str) -> None:
    """Register the fakes and autograd formulas of every op in `namespace` (valid on any device)."""
    _register_fakes(namespace)
    _register_autograd(namespace)
    _register_infonce_fakes(namespace)
    _register_infonce_autograd(namespace)


def schemas() -> dict[str, str]:
    """The schema of each op, without its name: what `define_family` defines elsewhere."""
    out = {}
    for name in OPS:
        schema = str(_op(NAMESPACE, name).default._schema)
        out[name] = schema[schema.index("("):]
    return out


def bound_arguments(op, args: tuple, kwargs: dict) -> dict:
    """An op call's arguments by their schema names, defaults filled in (a dispatcher-level call
    may leave trailing defaults out)."""
    bound = {argument.name: argument.default_value for argument in op._schema.arguments}
    bound.update(zip(bound, args))
    bound.update(kwargs)
    return bound


if LAYOUT is not None:
    register_family(NAMESPACE)
