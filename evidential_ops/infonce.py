"""Public InfoNCE API (SPEC §2 "InfoNCE", §5): the contrastive loss of every method's training
step as one fused op of the family, O(K) memory instead of K×K logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import backends, checks
from .autocast import autocast_inputs
from .config import MATMUL_PRECISIONS, LossConfig
from .evidence import unit_rows
from .losses import LossOutput, scaled


def _reduction(direction: str, reduction: str, matmul_precision: str) -> LossConfig:
    # LossConfig carries the reductions and the product precision shared with the evidential
    # losses; its evidence fields are unused here.
    return LossConfig(evidence="exp", tau=1.0, weights=(), enabled=(), direction=direction, reduction=reduction,
                      check_finite=True, matmul_precision=matmul_precision)


def _options(direction, reduction, drop_self, normalize, check_finite, matmul_precision) -> LossConfig:
    checks.choice(direction, "direction", ("rows", "cols", "both"))
    checks.choice(reduction, "reduction", ("mean", "mean_of_directions", "sum", "none"))
    checks.flag(drop_self, "drop_self")
    checks.flag(normalize, "normalize")
    checks.flag(check_finite, "check_finite")
    checks.choice(matmul_precision, "matmul_precision", MATMUL_PRECISIONS)
    return _reduction(direction, reduction, matmul_precision)


def _has_infonce_kernels(impl, device: torch.device) -> bool:
    """Whether a backend's op family has InfoNCE kernels for `device` (the cuda family has none yet)."""
    if not isinstance(impl, backends.KernelBackend) or device.type == "meta":
        return True
    key = "CUDA" if device.type == "cuda" else "CPU"
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{impl.namespace}::infonce_forward", key)


def _resolve(name, device: torch.device):
    """The backend of an InfoNCE call: `backends.resolve`, skipping under "auto" a family without
    InfoNCE kernels for the device; naming such a backend is a ValueError."""
    impl = backends.resolve(name, device)
    if _has_infonce_kernels(impl, device):
        return impl
    if name != "auto":
        raise ValueError(f"backend={name!r} has no InfoNCE kernels (README Limitations); use 'auto', 'triton' or "
                         f"'reference'")
    for candidate in backends.supporting(device):
        impl = backends.resolve(candidate, device)
        if candidate != "reference" and _has_infonce_kernels(impl, device):
            return impl
    return backends.resolve("reference", device)


def infonce_loss(
    x: Tensor,
    y: Tensor,
    *,
    tau: float | Tensor = checks.DEFAULT_TAU,
    group: Tensor | None = None,
    drop_self: bool = False,
    direction: str = "both",
    reduction: str = "mean",
    normalize: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
    matmul_precision: str = "ieee",
) -> LossOutput:
    """InfoNCE of the logits s = x·yᵀ/τ (SPEC §2 "InfoNCE"), differentiable in x, y (and a tensor τ).

    Row i (x_i querying y): ℓ_i = −ln(Σ_{j∈P(i)} e^{s_ij} / Σ_{j∈D(i)} e^{s_ij}), P(i) the positives
    ({i}, or every j with group[j] == group[i]) and D(i) the candidates (every j); column j the
    same on sᵀ. drop_self=True removes the self term j = i from both (FUME's released code; needs
    group ids in which every line has another member). The fused backends never store s whole: one pass
    of tiles forward, a recomputing backward, O(K) extra memory (the triton backend on CUDA: strips
    of s within 256 MiB, EO_TRITON_INFONCE_STRIP_MIB, and for float16 a float32 copy of an input).

    Args:
        x, y: (K, D) float32/float16/bfloat16/float64, same dtype and device, K >= 2; L2-normalised
            by the caller unless normalize=True (then eps 1e-12, differentiated).
        tau: τ > 0, a float or a 0-d tensor on the inputs' device (learnable: ∂L/∂τ flows through
            (x/τ)·yᵀ, SPEC §2 "Learnable temperature"). Default 0.05.
        group: optional (K,) integer ids; pairs with equal ids are each other's positives (FUME
            eq. 6; duplicate images in a batch). A constant.
        drop_self: exclude j = i from candidates and positives.
        direction: "rows", "cols" or "both".
        reduction: "mean" → mean(rows) + mean(cols); "mean_of_directions" → half that (open_clip
            ClipLoss); "sum"; "none" → (rows (K,), cols (K,)), empty for a direction not computed.
        backend: "auto" (fastest available for the device), "reference", "cpu", "triton", ...
        check_finite: reject NaN/Inf inputs (costs a read of x and y).
        matmul_precision: "ieee" (default) or "tf32": the products of float32 inputs on CUDA
            (the triton backend's cuBLAS strips, forward and backward; the reference's forward
            matmul), s off by up to 2⁻⁹·Σ|x_k y_k| (SPEC §2 "InfoNCE"); the tile kernels, the CPU
            and 16-bit inputs are unaffected.

    Returns:
        A float32 scalar (float64 for float64 inputs), or the (rows, cols) pair for "none".
    """
    x, y = autocast_inputs(x, y)
    x, y = checks.embedding_pair(x, y, check_finite)
    kernel_tau, inv_tau = checks.temperature(tau, None, x)
    config = _options(direction, reduction, drop_self, normalize, check_finite, matmul_precision)
    ids = checks.group_ids(group, x.shape[0], x, drop_self)
    impl = _resolve(backend, x.device)
    if normalize:
        x, y = unit_rows(x, y)
    if inv_tau is not None:
        x = scaled(x, inv_tau, check_finite)
    rows, cols = impl.infonce(x, y, ids, kernel_tau, drop_self, config.rows, config.cols, config.matmul_precision)
    return config.reduce(rows, cols)


class InfoNCELoss(nn.Module):
    """Criterion form: `InfoNCELoss(**keywords)(x, y, group=None)` == `infonce_loss(x, y, **keywords)`.

    A learnable temperature: pass `tau=nn.Parameter(torch.tensor(0.05))`, which then belongs to this
    module's parameters. Keywords are validated at construction; group ids vary per batch and are
    passed per call.
    """

    def __init__(
        self,
        *,
        tau: float | Tensor = checks.DEFAULT_TAU,
        drop_self: bool = False,
        direction: str = "both",
        reduction: str = "mean",
        normalize: bool = False,
        backend: str = "auto",
        check_finite: bool = True,
        matmul_precision: str = "ieee",
    ):
        super().__init__()
        checks.temperature_now(tau, None)
        _options(direction, reduction, drop_self, normalize, check_finite, matmul_precision)
        backends.check_name(backend)
        self.tau = tau
        self.drop_self = drop_self
        self.direction = direction
        self.reduction = reduction
        self.normalize = normalize
        self.backend = backend
        self.check_finite = check_finite
        self.matmul_precision = matmul_precision

    def forward(self, x: Tensor, y: Tensor, group: Tensor | None = None) -> LossOutput:
        return infonce_loss(
            x, y, tau=self.tau, group=group, drop_self=self.drop_self, direction=self.direction,
            reduction=self.reduction, normalize=self.normalize, backend=self.backend, check_finite=self.check_finite,
            matmul_precision=self.matmul_precision,
        )

    def extra_repr(self) -> str:
        return (f"tau={self.tau}, drop_self={self.drop_self}, direction={self.direction!r}, "
                f"reduction={self.reduction!r}, backend={self.backend!r}, matmul_precision={self.matmul_precision!r}")
