"""Loads the compiled extension evidential_ops._C (its import registers the C++ schemas and kernels)."""

from __future__ import annotations

from types import ModuleType

import torch  # noqa: F401  (loads libtorch and libc10, which _C links against)

try:
    from . import _C

    LOAD_ERROR: str | None = None
except ImportError as error:  # a source checkout that was never built, or a broken build
    _C = None
    LOAD_ERROR = str(error)


def loaded() -> bool:
    return LOAD_ERROR is None


def module() -> ModuleType | None:
    """The compiled module (constants NUM_LINE_STATS, NUM_TERMS, ...), or None if it did not load."""
    return _C


def build_info() -> str:
    """Compiler, OpenMP, CPU instruction set, whether the CPU tile GEMMs use the BLAS's packed
    GEMM (`cpu_packed_gemm=on|off|unavailable`; EO_CPU_PACKED_GEMM=0 turns it off) and CUDA
    settings of the compiled extension, or why it did not load. A bad EO_CPU_ISA shows as
    `cpu_isa=invalid(EO_CPU_ISA=...)` (the ops raise)."""
    if _C is None:
        return f"extension not loaded: {LOAD_ERROR}"
    return _C.build_info()


def cpu_isa(request: str = "") -> str:
    """The instruction-set variant of the CPU tile kernels in use ("generic", "avx2", "avx512"),
    or switch to another one ("best" restores the default); ValueError for a variant that was not
    built or that this CPU cannot run. The initial choice is EO_CPU_ISA's, else the best."""
    if _C is None:
        raise RuntimeError(f"the C++ extension is not loaded: {LOAD_ERROR}")
    if not isinstance(request, str):
        raise TypeError(f"request must be a str, got {type(request).__name__}")
    return _C.cpu_isa(request)


def cuda_workspace_bytes(budget: int | None = None) -> int:
    """The working budget of the CUDA kernels in bytes: the strips or blocks of s that one op keeps
    on the device at a time (docs/backends.md "Backends"). With `budget`, set it (any positive number
    of bytes; a forward strip is never less than one row of s, a backward block never less than
    1 × 1). Initially EO_CUDA_WORKSPACE_MIB MiB, default 64 MiB. Read at every op call; exists in
    every build (it only matters where the cuda backend runs)."""
    if _C is None:
        raise RuntimeError(f"the C++ extension is not loaded: {LOAD_ERROR}")
    if budget is None:
        return _C.cuda_workspace_bytes()
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(f"budget must be an int number of bytes, got {type(budget).__name__}")
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes, got {budget}")
    return _C.cuda_workspace_bytes(budget)
