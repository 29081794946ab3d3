"""Backend registry: one op family, several implementations (README "Layout").

A backend is registered only when its kernels exist and loaded; `available_backends()` lists
exactly those. `backend="auto"` picks the fastest registered backend for the tensors' device.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from . import reference
from .checks import output_dtype
from .config import LossConfig
from .results import Opinion

# Preference order of backend="auto", fastest first, per device type.
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
        with _matmul_precision(config.matmul_precision, x.device):
            s = reference.similarity(x, y, normalize=False, dtype=dtype)
        return self.losses_from_similarity(s, target_scale, config)

    def opinion_from_similarity(self, s, evidence, tau):
        return reference.opinion_from_similarity(s, evidence=evidence, tau=tau, compute_dtype=None)

    def opinion(self, x, y, evidence, tau):
        return reference.opinion(x, y, evidence=evidence, tau=tau, compute_dtype=None)


class _matmul_precision:
    """Context that allows TF32 in CUDA matmuls only when asked (it costs ~3e-4 relative in e, SPEC §5)."""

    def __init__(self, precision: str, device: torch.device):
        self.active = device.type == "cuda"
        self.allow = precision == "tf32"

    def __enter__(self):
        if self.active:
            self.saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = self.allow

    def __exit__(self, *exc):
        if self.active:
            torch.backends.cuda.matmul.allow_tf32 = self.saved


_REGISTRY: dict[str, Backend] = {"reference": ReferenceBackend()}
KNOWN_BACKENDS = ("auto", "reference", "cpu", "triton", "cuda")


def register(backend: Backend) -> None:
    """Make a backend selectable; called by a backend's module once its kernels have loaded."""
    _REGISTRY[backend.name] = backend


def available_backends() -> list[str]:
    """Names of the backends whose kernels are built and loaded, e.g. ['reference', 'cpu']."""
    return [name for name in KNOWN_BACKENDS if name in _REGISTRY]


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
