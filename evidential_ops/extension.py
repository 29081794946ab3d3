"""Loads the compiled extension evidential_ops._C (its import registers the C++ ops)."""

from __future__ import annotations

import torch

try:
    from . import _C  # noqa: F401  (import for its side effect: op registration)

    LOAD_ERROR: str | None = None
except ImportError as error:  # a source checkout that was never built, or a broken build
    LOAD_ERROR = str(error)


def loaded() -> bool:
    return LOAD_ERROR is None


def build_info() -> str:
    """Compiler, OpenMP and CUDA settings of the compiled extension, or why it did not load."""
    if LOAD_ERROR is not None:
        return f"extension not loaded: {LOAD_ERROR}"
    return torch.ops.evidential_ops.build_info()
