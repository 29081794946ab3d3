"""Backend registry: one op family, several implementations (docs/backends.md "Layout").

A backend is registered only when its kernels exist and loaded; `available_backends()` lists
exactly those. `backend="auto"` picks the fastest registered backend for the tensors' device.

Kernels of the C++ family (csrc/) are one `KernelBackend` per device: a device whose kernels are
registered on the `evidential_ops` ops (TORCH_LIBRARY_IMPL(evidential_ops, <key>, m)) becomes a
backend through one line of `KERNEL_DEVICES`. Other families (Triton) register a `KernelBackend`
over their own op namespace (evidential_ops/ops.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from . import ops, reference
from .checks import output_dtype
from .config import LossConfig
from .results import Opinion

# Preference order of backend="auto", fastest first, per device type. CUDA: measured on an H200
# (bench/results/cuda_nvidia-h200.md, TCL/UML/DUQ at K = 16384, D = 1024), the cuda backend took
# 1.8-5.1x the three-GEMM floor and triton 5.0-23x, at every precision.
_AUTO_ORDER = {"cuda": ("cuda", "triton", "reference"), "cpu": ("cpu", "reference")}


class Backend(Protocol):
    """What a backend implements; inputs arrive already validated by the public API (SPEC §5).

    Losses are per line (SPEC §2 Σ_term w_term·term of each row/column), float32 (float64 for
    float64 inputs); a direction that `config` leaves out comes back with 0 entries.
    """

    name: str

    def supports(self, device: torch.device) -> bool:
        """Whether tensors on `device` can run here."""

    def losses(self, x: Tensor, y: Tensor, target_scale: Tensor | None, config: LossConfig) -> tuple[Tensor, Tensor]:
        """Row and column losses (K,), (K,) of s = x·yᵀ; x, y (K, D); target_scale (K,) or None."""

    def losses_from_similarity(
        self, s: Tensor, target_scale: Tensor | None, config: LossConfig
    ) -> tuple[Tensor, Tensor]:
        """Row and column losses (K,), (K,) of a given s (K, K)."""

    def opinion(self, x: Tensor, y: Tensor, evidence: str, tau: float) -> Opinion:
        """Opinions (SPEC §1: b = e/S, u = N/S) of x (N_q, D) over y (N_g, D) and back."""

    def opinion_from_similarity(self, s: Tensor, evidence: str, tau: float) -> Opinion:
        """Opinions of the rows of s (N_q, N_g) over its columns, and of the columns over the rows."""

    def infonce(self, x: Tensor, y: Tensor, group: Tensor | None, tau: float, drop_self: bool, rows: bool,
                cols: bool, precision: str = "ieee") -> tuple[Tensor, Tensor]:
        """InfoNCE row and column losses (K,), (K,) of s = x·yᵀ/τ (SPEC §2 "InfoNCE"); group (K,)
        int64 or None; a direction not asked for comes back with 0 entries; precision: the float32
        products' matmul_precision ("ieee" or "tf32", CUDA)."""


class ReferenceBackend:
    """Plain PyTorch (materialises K×K), computing in float32, or float64 for float64 inputs."""

    name = "reference"

    def supports(self, device: torch.device) -> bool:
        return True

    def losses_from_similarity(self, s, target_scale, config):
        s_c = s.to(output_dtype(s.dtype))
        reference.check_no_overflow(s_c, config.evidence, config.tau, s_c.dtype)
        return reference.losses.weighted_losses(s_c, config, target_scale)

    def losses(self, x, y, target_scale, config):
        dtype = output_dtype(x.dtype)
        # Plain matmuls follow torch's global TF32 switch: set for the product of the forward (the
        # backward's products, run later by autograd, follow whatever is global then).
        with matmul_precision(config.matmul_precision):
            s = reference.similarity(x, y, normalize=False, dtype=dtype)
        return self.losses_from_similarity(s, target_scale, config)

    def opinion_from_similarity(self, s, evidence, tau):
        return reference.opinion_from_similarity(s, evidence=evidence, tau=tau, compute_dtype=None)

    def opinion(self, x, y, evidence, tau):
        return reference.opinion(x, y, evidence=evidence, tau=tau, compute_dtype=None)

    def infonce(self, x, y, group, tau, drop_self, rows, cols, precision="ieee"):
        # As `losses`: the forward's product at the call's precision (the backward's follow the
        # switch when autograd runs them).
        with matmul_precision(precision):
            s = reference.similarity(x, y, normalize=False, dtype=output_dtype(x.dtype))
        row_losses, col_losses = reference.infonce_line_losses(s * (1.0 / tau), group, drop_self)
        return (row_losses if rows else row_losses[:0]), (col_losses if cols else col_losses[:0])


@contextlib.contextmanager
def matmul_precision(precision: str):
    """torch's TF32 switch for CUDA matmuls inside the block: on for "tf32", off for "ieee" (TF32
    costs ~3e-4 relative in e, SPEC §5). For plain-PyTorch matmuls (reference, benchmark
    baselines); the fused ops take the precision as an argument instead."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


class KernelBackend:
    """Fused kernels of one op family on the devices it supports (implements `Backend`).

    Args:
        name: the backend's name ("cpu", "cuda", "triton").
        namespace: the torch.ops namespace of its op family ("evidential_ops" for the C++ kernels).
        supports: device -> whether this backend's kernels run on tensors there.
    """

    def __init__(self, name: str, namespace: str, supports: Callable[[torch.device], bool]):
        self.name = name
        self.namespace = namespace
        self._supports = supports

    @property
    def ops(self):
        """The op family, torch.ops.<namespace> (also used by evidential_ops.distributed)."""
        return getattr(torch.ops, self.namespace)

    def supports(self, device: torch.device) -> bool:
        # Meta tensors run the fakes (shapes only) on every family.
        return device.type == "meta" or self._supports(device)

    def weights(self, config: LossConfig, like: Tensor) -> Tensor:
        """The (5,) float64 term weights of `config` on the CPU, whatever `like`'s device: every
        kernel family reads them there without a device synchronisation."""
        return ops.weights_tensor(config, None)

    def _check_no_functorch(self) -> None:
        # The ops' autograd formulas (torch.library.register_autograd) have no functorch rules:
        # inside torch.func.grad/vmap they would fail deep in PyTorch with an unrelated message.
        if torch._C._are_functorch_transforms_active():
            raise NotImplementedError(
                f"torch.func transforms (grad, vjp, jacrev, vmap, ...) are not supported by the fused backend "
                f"{self.name!r}: its ops have autograd formulas but no functorch rules. Use backend='reference' "
                f"inside torch.func, or torch.autograd.grad / .backward() with this backend."
            )

    @staticmethod
    def _pick(rows: Tensor, cols: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
        return (rows if config.rows else rows[:0]), (cols if config.cols else cols[:0])

    def losses(self, x, y, target_scale, config: LossConfig):
        self._check_no_functorch()
        rows, cols, _, _ = self.ops.loss_forward(
            x, y, target_scale, config.evidence, config.tau, self.weights(config, x), ops.terms_mask(config),
            config.rows, config.cols, config.matmul_precision,
        )
        return self._pick(rows, cols, config)

    def losses_from_similarity(self, s, target_scale, config: LossConfig):
        self._check_no_functorch()
        rows, cols, _, _ = self.ops.loss_forward_from_similarity(
            s, target_scale, config.evidence, config.tau, self.weights(config, s), ops.terms_mask(config),
            config.rows, config.cols,
        )
        return self._pick(rows, cols, config)

    def infonce(self, x, y, group, tau, drop_self, rows, cols, precision="ieee"):
        self._check_no_functorch()
        row_losses, col_losses, _, _ = self.ops.infonce_forward(x, y, group, tau, drop_self, rows, cols, precision)
        return (row_losses if rows else row_losses[:0]), (col_losses if cols else col_losses[:0])

    def opinion(self, x, y, evidence, tau) -> Opinion:
        return Opinion.from_log_strengths(*self.ops.opinion(x, y, evidence, tau))

    def opinion_from_similarity(self, s, evidence, tau) -> Opinion:
        return Opinion.from_log_strengths(*self.ops.opinion_from_similarity(s, evidence, tau))


# Devices of the C++ family: (backend name, dispatch key of its kernels, device type). A device
# whose kernels the extension registered becomes a backend; nothing else to add for a new one.
KERNEL_DEVICES = (("cpu", "CPU", "cpu"), ("cuda", "CUDA", "cuda"))


def _has_kernels(dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{ops.NAMESPACE}::loss_forward", dispatch_key)


_REGISTRY: dict[str, Backend] = {"reference": ReferenceBackend()}
KNOWN_BACKENDS = ("auto", "reference", "cpu", "triton", "cuda")


def register(backend: Backend) -> None:
    """Make a backend selectable; called by a backend's module once its kernels have loaded."""
    _REGISTRY[backend.name] = backend


if ops.LAYOUT is not None:
    for _name, _key, _device_type in KERNEL_DEVICES:
        if _has_kernels(_key):
            register(KernelBackend(_name, ops.NAMESPACE, lambda device, _t=_device_type: device.type == _t))


def available_backends() -> list[str]:
    """Names of the backends whose kernels are built and loaded, e.g. ['reference', 'cpu']."""
    return [name for name in KNOWN_BACKENDS if name in _REGISTRY]


def supporting(device: torch.device) -> list[str]:
    """The available backends whose kernels run on tensors on `device`, in available_backends order."""
    return [name for name in available_backends() if _REGISTRY[name].supports(device)]


def preferred(device: torch.device) -> list[str]:
    """`supporting(device)` in backend="auto"'s order (fastest first), any others after."""
    order = _AUTO_ORDER.get(device.type, ())
    return sorted(supporting(device), key=lambda name: order.index(name) if name in order else len(order))


def check_name(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, one of {KNOWN_BACKENDS}; got {type(name).__name__}")
    if name not in KNOWN_BACKENDS:
        raise ValueError(f"backend must be one of {KNOWN_BACKENDS}, got {name!r}")
    return name


def resolve(name, device: torch.device) -> Backend:
    """The backend object for `name` ("auto" picks the fastest one that supports `device`)."""
    if check_name(name) == "auto":
        for candidate in _AUTO_ORDER.get(device.type, ("reference",)):
            backend = _REGISTRY.get(candidate)
            if backend is not None and backend.supports(device):
                return backend
        return _REGISTRY["reference"]
    backend = _REGISTRY.get(name)
    if backend is None:
        raise ValueError(
            f"backend={name!r} is not available in this build (available: {available_backends()})"
        )
    if not backend.supports(device):
        raise ValueError(f"backend={name!r} does not run on {device} tensors")
    return backend
