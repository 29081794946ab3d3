"""The evidential loss of the global batch of a torch.distributed group (docs/distributed.md).

Rank r holds x_r, y_r (K_r, D), rows [o_r, o_r + K_r) of the global batch x, y (K, D), K = Σ K_r.
The fused path (a backend with the strip ops `line_stats`, `line_losses`, `loss_backward`):

forward
    1. agree (comm.agree): all-gather a small vector per rank: K_r, D, dtype, options, and whether
       its input passed the checks. Sizes of uneven strips come from it; a bad input anywhere
       raises on every rank here, before any data moves.
    2. all-gather y (K, D) (and target_scale (K,) if given).
    3. line_stats(x_r, y, o_r): complete statistics of the own rows, partial statistics (these
       rows only) of all K columns. The row losses of the own rows need nothing else.
    4. one all-reduce (SUM, float64) of [column statistics (7·K), Σ own row losses, error flag]:
       every column statistic is a sum over rows, so the sum over the strips is the global one.
    5. line_losses(..., cols): the K column losses, identical on every rank. The returned value
       is mean(rows) + mean(cols) of the global batch (or the sum), replicated on every rank.
backward (upstream gradient g of the replicated value)
    6. loss_backward(x_r, y, o_r, global column statistics): dx_r complete, and this strip's part of
       dy for all K columns (with the reduce-scatter's buffers).
    7. one small all-reduce of [g, error flag] ([error flag] for reduction "none"): ḡ = mean over
       the ranks of g (the replicated loss counts once), and whether any rank's step 6 failed.
    8. a reduce-scatter (SUM) hands each rank the sum of the parts for its own rows of y. Never an
       all-reduce of K × D; nothing K × K anywhere.

Failure. A rank whose step 3, 5 or 6 raises (out of memory on the K × D copies, an overflowing
strength, ...) sets the error flag of the next all-reduce instead of leaving; every rank then
raises at the same point: the failing rank its own error, the others a `PeerError` (a
`PeerInputError` in the forward) naming the failing rank and quoting its error. Only the
collectives themselves (and their own buffer allocations in step 2) are outside this net.

Empty strips. A rank may hold K_r = 0 pairs (K = Σ K_r >= 2): its row statistics and losses are
empty, its partial column statistics zero, its part of dy zero; it still takes part in every
collective and returns the global value (or two empty vectors for reduction "none").

Autograd. The collectives live inside one `torch.autograd.Function` (`_GlobalBatchLoss`), which the
project's design otherwise avoids for custom ops because torch.compile may trace into a bare
Function and get it silently wrong. Here it is the only way to put collectives in the backward, and
the public function is `torch.compiler.disable`d: under torch.compile, Dynamo breaks the graph at
the call and runs it eagerly (the surrounding model still compiles), so it is supported and cannot
be traced wrongly (python_tests/test_distributed.py runs it under torch.compile).

Gradient convention. Every quantity of the global batch counts once in the objective whose
gradient the backward computes: a replicated scalar (reduction "mean"/"sum") as the mean over the
ranks of its copies' upstream gradients, per-line losses (reduction "none": each rank returns the
rows and columns of its own pairs) by their owner. With `loss.backward()` on every rank, x_r.grad
and y_r.grad are exactly ∂L/∂x_r and ∂L/∂y_r of the single-process loss on the concatenation;
summed over the ranks, parameter gradients are the single-process ones. DistributedDataParallel
*averages* them instead: pass `ddp=True` and each rank's gradients are scaled by the world size, so
that DDP's average is again the single-process gradient (the returned value is unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from .. import backends, checks, ops
from ..config import DIRECTIONS, EVIDENCE_KINDS, MATMUL_PRECISIONS, REDUCTIONS, TERMS
from ..autocast import autocast_inputs
from ..evidence import unit_rows
from ..losses import scaled
from . import comm

__all__ = ["EvidentialLoss", "FIELDS", "communication_volume", "evidential_loss"]

WHO = "evidential_ops.distributed.evidential_loss"

# The agreement vector (comm.agree): one float64 per field.
FIELDS = (
    "status", "rows", "dim", "dtype", "device_type", "path", "evidence", "tau",
    *(f"weight_{t}" for t in TERMS), "enabled", "direction", "reduction", "normalize", "target_scale",
    "check_finite", "matmul_precision", "ddp", "x_requires_grad", "y_requires_grad",
    "x_finite", "y_finite", "target_scale_in_range",
)
MUST_MATCH = tuple(f for f in FIELDS if f not in ("status", "rows", "x_finite", "y_finite", "target_scale_in_range"))
VALUE_CHECKS = {
    "x_finite": "x contains NaN or Inf (pass check_finite=False to skip this check)",
    "y_finite": "y contains NaN or Inf (pass check_finite=False to skip this check)",
    "target_scale_in_range": "target_scale must lie in [0, 1] (and contain no NaN)",
}
DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")
PATHS = ("fused", "reference")


@torch.compiler.disable
def evidential_loss(
    x: Tensor,
    y: Tensor,
    *,
    group=None,
    ddp: bool = False,
    evidence: str = "exp",
    tau: float | Tensor | None = None,
    weights: Mapping[str, float | Tensor] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    normalize: bool = False,
    reduction: str = "mean",
    backend: str = "auto",
    check_finite: bool = True,
    matmul_precision: str = "ieee",
    logit_scale: float | Tensor | None = None,
):
    """`evidential_ops.evidential_loss` of the global batch of a torch.distributed group.

    Every rank of `group` calls it with its own rows; the result is the loss of the concatenation
    (in rank order) of every rank's x and y, as `evidential_ops.evidential_loss` would compute it in
    one process, without any rank holding a K_global × K_global matrix (module docstring,
    docs/distributed.md).

    Args:
        x, y: this rank's (K_r, D) pairs, K_r >= 0 (may differ between ranks, and be 0 on some;
            K_global >= 2). Same dtype, device, D and options on every rank.
        group: the process group (None: the default group).
        ddp: True when the gradients are then averaged over the ranks (DistributedDataParallel):
            each rank's x and y gradients are scaled by the world size so that the average is the
            gradient of the global loss. False (default): x.grad, y.grad are exactly ∂L/∂x_r, ∂L/∂y_r.
        target_scale: this rank's (K_r,) c (its pairs' entries of the global c).
        evidence, tau, logit_scale, weights, direction, normalize, backend, check_finite,
            matmul_precision: as in `evidential_ops.evidential_loss`. A tensor tau or logit_scale
            (the same value on every rank, e.g. a DDP parameter) scales this rank's x; its gradient
            on each rank is this rank's share of ∂L/∂τ: with ddp=True their average over the ranks
            is the whole of it (as for the model's parameters), with ddp=False sum them. A backend with strip kernels (cpu; cuda and triton
            where built) runs the fused path; "reference" (and "auto" on a device without fused
            kernels) gathers x and y and materialises the K_global × K_global matrix on every rank.
        reduction: "mean" / "sum": the global loss, the same value on every rank; "none": (rows of
            this rank's pairs (K_r,), columns of this rank's pairs (K_r,)): concatenated over the
            ranks, the single-process (rows, cols).

    Every rank must call it (and backward through it) the same number of times, like any
    collective. A bad input on one rank raises there (ValueError/TypeError naming the argument)
    and a `PeerInputError` on the others, before any data moves. An error of one rank's kernels or
    copies later on (forward or backward, e.g. out of memory) raises there and a `PeerError`
    naming that rank on the others, at the same point (module docstring, "Failure").
    """
    values: dict = {}
    error = None
    try:
        plan = _check_local(x, y, values, group=group, ddp=ddp, evidence=evidence, tau=tau,
                            logit_scale=logit_scale, weights=weights,
                            direction=direction, target_scale=target_scale, normalize=normalize,
                            reduction=reduction, backend=backend, check_finite=check_finite,
                            matmul_precision=matmul_precision)
    except Exception as e:  # whatever this rank's checks raise, the other ranks must hear of it
        error = e
    layout, _ = comm.agree(group, FIELDS, values, error, must_match=MUST_MATCH, value_checks=VALUE_CHECKS,
                           rows_field="rows", who=WHO)
    if layout.total < 2:
        raise ValueError(f"{WHO}: the global batch needs K >= 2 pairs (a Dirichlet over >= 2 candidates), got "
                         f"K_r = {list(layout.sizes)} on ranks 0..{layout.world - 1}")
    x, y, c, config, impl = plan
    c_all = None if c is None else comm.gather_rows(c.to(torch.float64), layout)
    if isinstance(impl, backends.KernelBackend):
        out = _GlobalBatchLoss.apply(x, y, _FusedPlan(layout, config, impl, c_all, ddp, x))
    else:
        out = _reference_loss(x, y, c_all, config, impl, layout, ddp)
    return out if config.reduction == "none" else out[0]


def _check_local(x, y, values: dict, *, group, ddp, evidence, tau, logit_scale, weights, direction, target_scale,
                 normalize, reduction, backend, check_finite, matmul_precision):
    """This rank's checks (no collective): fills `values` for the agreement vector, returns the plan."""
    comm.group_info(group)
    checks.flag(ddp, "ddp")
    checks.temperature_arguments(tau, logit_scale)
    tensor_temperature = isinstance(tau, Tensor) or isinstance(logit_scale, Tensor)
    float_tau = None if tensor_temperature else checks.temperature(tau, logit_scale, None)[0]
    config = checks.loss_config(evidence=evidence, tau=1.0 if tensor_temperature else float_tau, weights=weights,
                                direction=direction, reduction=reduction, check_finite=check_finite,
                                matmul_precision=matmul_precision)
    checks.flag(normalize, "normalize")
    # Any strip, empty included, is valid; K_global >= 2 is checked once the sizes are known.
    x, y = autocast_inputs(x, y)  # as the single-process loss does (SPEC §5 "Mixed precision")
    x = checks.float_matrix(x, "x", False, min_rows=0)
    y = checks.float_matrix(y, "y", False, min_rows=0)
    checks.same_kind(x, y, "x", "y")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape (K_r, D) (pair i = (x_i, y_i)), got x {tuple(x.shape)} "
                         f"and y {tuple(y.shape)}")
    if x.device.type not in DEVICE_TYPES:
        raise ValueError(f"x is on {x.device}; the distributed loss runs on {DEVICE_TYPES} tensors")
    c = None
    if target_scale is not None:
        c = checks.target_scale_vector(target_scale, x.shape[0], x, False)
    impl = backends.resolve(backend, x.device)
    fused = isinstance(impl, backends.KernelBackend)
    if fused:
        impl._check_no_functorch()
    if normalize:
        x, y = unit_rows(x, y)
    if tensor_temperature:
        x = scaled(x, checks.temperature(tau, logit_scale, x)[1], check_finite)
    grad = torch.is_grad_enabled()
    values.update(
        rows=x.shape[0], dim=x.shape[1], dtype=checks.FLOAT_DTYPES.index(x.dtype),
        device_type=DEVICE_TYPES.index(x.device.type), path=PATHS.index("fused" if fused else "reference"),
        evidence=EVIDENCE_KINDS.index(config.evidence), tau=config.tau,
        **{f"weight_{t}": float(w) for t, w in zip(TERMS, config.weights)},
        enabled=ops.terms_mask(config), direction=DIRECTIONS.index(config.direction),
        reduction=REDUCTIONS.index(config.reduction), normalize=normalize, target_scale=c is not None,
        check_finite=check_finite, matmul_precision=MATMUL_PRECISIONS.index(config.matmul_precision), ddp=ddp,
        x_requires_grad=grad and x.requires_grad, y_requires_grad=grad and y.requires_grad,
        x_finite=torch.isfinite(x).all() if check_finite else 1.0,
        y_finite=torch.isfinite(y).all() if check_finite else 1.0,
        target_scale_in_range=1.0 if c is None or c.dtype == torch.bool or not check_finite
        else ((c >= 0) & (c <= 1)).all(),
    )
    return x, y, c, config, impl


# ------------------------------------------------------------------------------------ fused path


class _FusedPlan:
    """Everything the fused Function needs besides x and y (non-tensor state and the gathered c),
    and the strip kernels' calls, with the empty strip (K_r = 0, which the kernels reject) done here."""

    def __init__(self, layout: comm.Layout, config, impl, c_all: Tensor | None, ddp: bool, like: Tensor):
        self.layout = layout
        self.config = config
        self.ops = impl.ops
        self.terms = ops.terms_mask(config)
        self.weights = impl.weights(config, like)
        self.c_all = c_all
        self.ddp = ddp
        self.work = checks.output_dtype(like.dtype)

    def line_stats(self, x_w: Tensor, y_all: Tensor) -> tuple[Tensor, Tensor]:
        """(row statistics (7, K_r) of the own rows, partial column statistics (7, K) summed over
        the own rows only), float64. An empty strip's are empty and zero (the identity of the sum)."""
        config = self.config
        if self.layout.local == 0:
            f64 = dict(dtype=torch.float64, device=x_w.device)
            n_stats = ops.LAYOUT.num_line_stats
            return torch.zeros(n_stats, 0, **f64), torch.zeros(n_stats, self.layout.total, **f64)
        return self.ops.line_stats(x_w, y_all, self.layout.offset, config.evidence, config.tau, self.terms,
                                   config.rows, config.cols, config.matmul_precision)

    def stats_to_losses(self, row_stats: Tensor, col_stats: Tensor, rows: bool, cols: bool) -> tuple[Tensor, Tensor]:
        """(row losses (K_r,), column losses (K,)), float64, from the statistics (`line_losses`).

        Args:
            row_stats: (7, K_r) float64 statistics of this rank's rows (global row o + i in column i).
            col_stats: (7, K) float64 statistics of all K columns, global ones (summed over the
                ranks) whenever `cols` is asked for.
            rows, cols: which of the two vectors to compute; the other is zeros of its length.

        Uses the plan's weights, terms and gathered target scales c (K,) (entry o + i is row i's).
        A loss of row i needs row i's statistics only, a column loss its column's only: an empty
        strip's column losses come from a one-row placeholder strip at offset 0 with rows=False.
        """
        o = self.layout.offset
        if row_stats.shape[1] == 0:
            rows_out = row_stats.new_zeros(0)
            if not cols:
                return rows_out, col_stats.new_zeros(col_stats.shape[1])
            placeholder = row_stats.new_zeros(row_stats.shape[0], 1)
            return rows_out, self.ops.line_losses(placeholder, col_stats, self.c_all, 0, self.weights, self.terms,
                                                  False, True)[1]
        return self.ops.line_losses(row_stats, col_stats, self.c_all, o, self.weights, self.terms, rows, cols)

    def loss_backward(self, grad_rows, grad_cols, x_w, y_all, row_stats, col_stats, need: list[bool]):
        """(dx (K_r, D), this strip's part of dy (K, D)) (`loss_backward`; an empty tensor where
        `need` is False). An empty strip contributes nothing to dy: zeros."""
        config = self.config
        if self.layout.local == 0:
            return (x_w.new_zeros(x_w.shape) if need[0] else x_w.new_empty(0),
                    y_all.new_zeros(y_all.shape) if need[1] else y_all.new_empty(0))
        return self.ops.loss_backward(
            grad_rows, grad_cols, x_w, y_all, self.c_all, row_stats, col_stats, config.evidence, config.tau,
            self.weights, self.terms, config.rows, config.cols, self.layout.offset, need, config.matmul_precision)


class _GlobalBatchLoss(torch.autograd.Function):
    """Forward and backward of the fused path (module docstring, steps 2-8). Returns (value,) for
    reduction mean/sum, (own rows, own columns) for "none"."""

    @staticmethod
    def forward(ctx, x, y, plan: _FusedPlan):
        layout, config = plan.layout, plan.config
        k, o, m = layout.total, layout.offset, layout.local
        rows, cols, summed = config.rows, config.cols, config.reduction != "none"
        # The all-gather itself stays outside the try: a rank that failed before issuing it could
        # not join the all-reduce below in step with the others (they would be in the all-gather).
        y_gathered = comm.all_gather_padded(y, layout)
        local_error = None
        x_w = y_all = row_stats = col_stats = row_losses = None
        try:
            # 16-bit inputs go to the kernels in float32, which is what they compute in anyway: the
            # partial dy of step 6 is then summed across ranks in float32, not rounded to 16 bits first.
            y_all = comm.unpad_rows(y_gathered, layout).to(plan.work)
            del y_gathered
            x_w = x.to(plan.work)
            row_stats, col_stats = plan.line_stats(x_w, y_all)
            if rows:
                row_losses = plan.stats_to_losses(row_stats, col_stats, True, False)[0]
        except Exception as e:  # an overflowing row strength, out of memory...: any error of one
            local_error = e      # rank's copies or kernels must stop the others too (the flag below)
        # One all-reduce: [column statistics | Σ own row losses | error flag].
        n_stats = ops.LAYOUT.num_line_stats
        buffer = torch.zeros(n_stats * k * cols + (rows and summed) + 1, dtype=torch.float64, device=x.device)
        if local_error is None:
            if cols:
                buffer[: n_stats * k] = col_stats.reshape(-1)
            if rows and summed:
                buffer[-2] = row_losses.sum()
        else:
            buffer[-1] = 1.0
        comm.all_reduce_sum(buffer, layout.group)
        comm.fail_together(local_error, bool(buffer[-1] != 0), layout.group, who=WHO,
                           what="the forward (a strip's copies, statistics or row losses)",
                           peer_error=comm.PeerInputError)
        if cols:
            col_stats = buffer[: n_stats * k].view(n_stats, k)
            col_losses = plan.stats_to_losses(row_stats, col_stats, False, True)[1]
        out_dtype = plan.work
        ctx.plan = plan
        ctx.save_for_backward(x_w, y_all, row_stats, col_stats)
        ctx.input_dtypes = (x.dtype, y.dtype)
        if summed:
            value = torch.zeros((), dtype=torch.float64, device=x.device)
            mean = config.reduction == "mean"
            if rows:
                value = value + (buffer[-2] / k if mean else buffer[-2])
            if cols:
                value = value + (col_losses.mean() if mean else col_losses.sum())
            return (value.to(out_dtype),)
        empty = torch.zeros(0, dtype=out_dtype, device=x.device)
        return ((row_losses.to(out_dtype) if rows else empty),
                (col_losses[o: o + m].to(out_dtype) if cols else empty))

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        layout, config = plan.layout, plan.config
        x_w, y_all, row_stats, col_stats = ctx.saved_tensors
        k, m = layout.total, layout.local
        need_dx, need_dy = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        device = x_w.device
        f64 = dict(dtype=torch.float64, device=device)
        summed = config.reduction != "none"
        grad_cols_all = None
        if not summed and config.cols:  # a collective: issued by every rank, outside the try below
            grad_cols_all = comm.gather_rows(grads[1].to(plan.work), layout)
        # Step 7's buffer, [g, error flag] ([error flag] for "none"); allocated before anything can fail.
        flags = torch.zeros(1 + summed, dtype=plan.work, device=device)
        local_error = None
        dx = dy_buffers = None
        try:
            if summed:
                # Unit upstream in the kernels, the mean ḡ of the ranks' g applied after step 7.
                unit = 1.0 / k if config.reduction == "mean" else 1.0
                grad_rows = torch.full((m,), unit, **f64) if config.rows else torch.zeros(m, **f64)
                grad_cols = torch.full((k,), unit, **f64) if config.cols else torch.zeros(k, **f64)
                flags[0] = grads[0].detach().reshape(())
            else:
                grad_rows = grads[0].to(torch.float64) if config.rows else torch.zeros(m, **f64)
                grad_cols = grad_cols_all.to(torch.float64) if config.cols else torch.zeros(k, **f64)
            dx, dy_parts = plan.loss_backward(grad_rows, grad_cols, x_w, y_all, row_stats, col_stats,
                                              [need_dx, need_dy])
            if need_dy:  # every allocation of the reduce-scatter, before any rank issues it
                dy_buffers = comm.scatter_buffers(dy_parts, layout)
                del dy_parts
        except Exception as e:  # out of memory on the K × D part of dy, ...: the others must hear
            local_error = e      # of it before the reduce-scatter, or they would wait in it
        if local_error is not None:
            flags[-1] = 1.0
        comm.all_reduce_sum(flags, layout.group)
        comm.fail_together(local_error, bool(flags[-1] != 0), layout.group, who=WHO,
                           what="the backward (loss_backward on a strip, or its buffers)")
        dy = comm.reduce_scatter_buffers(dy_buffers, layout) if need_dy else None
        scale = float(layout.world) if plan.ddp else 1.0
        if summed:
            # Mean over the ranks of the replicated loss's upstream gradient (sum with ddp=True).
            scale = flags[0] / layout.world * scale
        x_dtype, y_dtype = ctx.input_dtypes
        dx = (dx * scale).to(x_dtype) if need_dx else None
        dy = (dy * scale).to(y_dtype) if need_dy else None
        return dx, dy, None


def communication_volume(sizes, dim: int, *, dtype: torch.dtype = torch.float32, direction: str = "both",
                         reduction: str = "mean", target_scale: bool = False, normalize: bool = False,
                         need_dx: bool = True, need_dy: bool = True) -> dict[str, int]:
    """Bytes per rank per forward + backward of the fused path, for strips of `sizes` rows of D = dim
    (comm.communication_volume; docs/distributed.md has the formula)."""
    work = checks.output_dtype(dtype)
    return comm.communication_volume(
        list(sizes), dim, embedding_dtype=work if normalize else dtype, work_dtype=work,
        num_line_stats=ops.LAYOUT.num_line_stats, num_fields=len(FIELDS),
        rows=direction in ("rows", "both"), cols=direction in ("cols", "both"), reduction=reduction,
        target_scale=target_scale, need_dx=need_dx, need_dy=need_dy)


# -------------------------------------------------------------------------------- reference path


class _GatherRows(torch.autograd.Function):
    """All-gather of rows whose backward is the reduce-scatter (SUM) of the gathered gradient."""

    @staticmethod
    def forward(ctx, t, layout):
        ctx.layout = layout
        return comm.gather_rows(t, layout)

    @staticmethod
    def backward(ctx, grad):
        return comm.scatter_rows(grad, ctx.layout), None


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, factor: float):
        ctx.factor = factor
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _reference_loss(x, y, c_all, config, impl, layout: comm.Layout, ddp: bool):
    """The judge's way: gather x and y and materialise the K × K loss on every rank (the reference
    backend has no strip kernels). Same values and gradient convention as the fused path."""
    x_all = _GatherRows.apply(x, layout) if x.requires_grad else comm.gather_rows(x, layout)
    y_all = _GatherRows.apply(y, layout) if y.requires_grad else comm.gather_rows(y, layout)
    rows, cols = impl.losses(x_all, y_all, c_all, config)
    if config.reduction == "none":
        o, m = layout.offset, layout.local
        own = (rows[o: o + m] if config.rows else rows, cols[o: o + m] if config.cols else cols)
        return tuple(_ScaleGradient.apply(t, float(layout.world)) for t in own) if ddp else own
    # Every rank holds the same value: each copy carries 1/W of it (W/W with ddp=True).
    return (_ScaleGradient.apply(config.reduce(rows, cols), 1.0 if ddp else 1.0 / layout.world),)


# --------------------------------------------------------------------------------------- module


class EvidentialLoss(nn.Module):
    """`EvidentialLoss(group=..., **keywords)(x, y)` == `evidential_loss(x, y, group=..., **keywords)`.

    The nn.Module form of the global-batch loss; keywords as `evidential_ops.EvidentialLoss` (no
    from_similarity: a similarity matrix cannot be split into strips without its embeddings), plus
    `group` and `ddp`. `weights` is a plain attribute (anneal it between steps).
    """

    def __init__(self, *, group=None, ddp: bool = False, evidence: str = "exp", tau: float | Tensor | None = None,
                 weights: Mapping[str, float | Tensor] | None = None, direction: str = "both",
                 normalize: bool = False, reduction: str = "mean", backend: str = "auto", check_finite: bool = True,
                 matmul_precision: str = "ieee", logit_scale: float | Tensor | None = None):
        super().__init__()
        checks.temperature_arguments(tau, logit_scale)
        checks.loss_config(evidence=evidence, weights=weights, direction=direction, reduction=reduction,
                           check_finite=check_finite, matmul_precision=matmul_precision)
        checks.flag(normalize, "normalize")
        checks.flag(ddp, "ddp")
        backends.check_name(backend)
        self.group = group
        self.ddp = ddp
        self.evidence = evidence
        self.tau = checks.DEFAULT_TAU if tau is None and logit_scale is None else tau
        self.logit_scale = logit_scale
        self.weights = dict(weights) if weights is not None else None
        self.direction = direction
        self.normalize = normalize
        self.reduction = reduction
        self.backend = backend
        self.check_finite = check_finite
        self.matmul_precision = matmul_precision

    def forward(self, x: Tensor, y: Tensor, target_scale: Tensor | None = None):
        return evidential_loss(
            x, y, group=self.group, ddp=self.ddp, evidence=self.evidence, tau=self.tau,
            logit_scale=self.logit_scale, weights=self.weights,
            direction=self.direction, target_scale=target_scale, normalize=self.normalize,
            reduction=self.reduction, backend=self.backend, check_finite=self.check_finite,
            matmul_precision=self.matmul_precision,
        )

    def extra_repr(self) -> str:
        return (f"evidence={self.evidence!r}, tau={self.tau}, weights={self.weights}, direction={self.direction!r}, "
                f"reduction={self.reduction!r}, backend={self.backend!r}, ddp={self.ddp}")
