"""Launch configurations of the Triton tile kernels: a fixed default and a small autotuning space.

Default (autotuning off, the default): one fixed configuration per kernel, so results are bitwise
reproducible run to run (the tiling fixes every summation order). `EO_TRITON_AUTOTUNE=1` times the
configurations of `SPACE` once per key (kernel variant, K bucket, D, dtype) on the first eager call
with that key and reuses the fastest (results then depend on the pick: deterministic for a given
pick, not across picks). Under torch.compile the choice is made at trace time from that cache
(the default where nothing was tuned): benchmarks cannot run on fake tensors.

The interpreter (TRITON_INTERPRET=1) ignores warps and stages and pays per tile, not per element:
it gets large tiles (`INTERPRETER`).

Every configuration of every kernel compiles ahead of time for sm_90 and sm_80 in CI
(`python -m evidential_ops.triton_backend.aot_check`, `make triton-aot-check`), which prints
registers and spills and fails on a spill in a default configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """block_m: own lines per program; block_n: other lines per tile; block_k: the D step of the
    tile product."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}"


# The fixed defaults on a GPU, per generation (compute capability 9.x: Hopper; 8.x: Ampere/Ada).
# Forward (stats): the FlashAttention shape. A program owns 64 rows and walks the column blocks;
# the s tile (64 × 32) is a tensor-core product in registers, its D steps loaded through a
# 3-stage software pipeline (asynchronous copies), and every element is held by one thread:
# with 8 warps the wgmma layout is warpsPerCTA [4, 2] of 16 × 16 instructions, 64 × 32 exactly
# (aot_check's "copies" column; 16-row tiles, the default before, spanned 32 rows in the MMA
# layout, so two of the four warps evaluated every element again). BLOCK_M >= 64 is what lets
# sm_90 issue wgmma (HGMMA) for tf32 and bfloat16; float32 "ieee" tiles are FFMA products in
# the same shape. Spill-free for the methods' term sets on sm_90 and sm_80 in float32, tf32 and
# bfloat16 (triton 3.9, compiled with a real launch's specialisations, aot_check); 64 × 64 tiles
# hold 16 elements a thread and spill 24-84 bytes in float32.
# Backward: "grad_fused" (FlashAttention-2 shape, 16-bit inputs with D <= MAX_REGISTER_D) the same
# tile, its three products on wgmma (Gᵀ·x as (xᵀ·G)ᵀ, whose M is D: with BLOCK_N = 32 rows as M
# it was mma.sync), 178-255 registers without spills; "grad" (G of a strip of rows, a program
# walking a few column blocks with its rows' constants held) the same tile again. sm_80 has no fused default: with mma.sync the same tile spills
# 88 bytes (UML) and the transposed product's layout repeats elements; it takes the strips.
DEFAULTS_BY_ARCH = {
    90: {
        # BLOCK_K 16: at 32 ptxas holds TCL's float32 sweep (exp evidence's ex2 reduction) to 128
        # registers and reloads 16-24 spilled bytes in the loop; at 16 it takes 170, spill-free
        "stats": TileConfig(64, 32, 16, 8, 3),
        "grad": TileConfig(64, 32, 32, 8, 3),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
        "grad_fused": TileConfig(64, 32, 32, 8, 3),
    },
    80: {
        "stats": TileConfig(64, 32, 32, 8, 3),
        # BLOCK_K 16: with its rows' line constants held through the column sweep, the gradient
        # kernel at 32 spills 8-16 bytes on sm_80, where ptxas keeps it to 128 registers
        "grad": TileConfig(64, 32, 16, 8, 3),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
    },
}

# The autotuning space (Hopper-sized: BLOCK_M 64-128, BLOCK_N 32-64, 4-8 warps, 2-4 stages): the
# defaults and larger tiles (more operand reuse in the tile products, at the price of spills in
# the heaviest term sets; aot_check prints them).
SPACE = {
    "stats": (
        TileConfig(64, 32, 16, 8, 3),
        TileConfig(64, 32, 32, 8, 3),
        TileConfig(64, 32, 64, 8, 2),
        TileConfig(64, 64, 32, 8, 3),
        TileConfig(128, 32, 32, 8, 4),
        TileConfig(64, 32, 32, 4, 2),
    ),
    "grad": (
        TileConfig(64, 32, 32, 8, 3),
        TileConfig(64, 32, 16, 8, 3),
        TileConfig(64, 32, 64, 8, 2),
        TileConfig(64, 64, 32, 8, 3),
        TileConfig(128, 32, 32, 8, 4),
    ),
    "grad_similarity": (
        TileConfig(64, 32, 0, 8, 1),
        TileConfig(32, 32, 0, 4, 1),
        TileConfig(64, 64, 0, 8, 1),
    ),
    "grad_fused": (
        TileConfig(64, 32, 32, 8, 3),
        TileConfig(64, 32, 64, 8, 2),
        TileConfig(64, 64, 32, 8, 3),
        TileConfig(128, 32, 32, 8, 4),
    ),
}

INTERPRETER = {
    "stats": TileConfig(64, 64, 64, 4, 1),
    "grad": TileConfig(64, 64, 64, 4, 1),
    "grad_similarity": TileConfig(64, 64, 0, 4, 1),
    "grad_fused": TileConfig(64, 64, 64, 4, 1),
}

# The fused backward (grad_fused_kernel) keeps its (block_m, D) accumulator and the row block of
# the input in registers when D fits in this many columns; wider D stages G through stored
# strips (launch.BackwardPlan).
# The forward keeps the row block loaded across the column sweep (stats_kernel RESIDENT) up to this
# D on sm_90: 64 × 128 tf32 is 32 KiB of shared memory, with 3 stages of 32 × 128 column tiles
# 80 KiB, spill-free with one copy per element (tf32, bf16; aot_check); wider D steps through
# BLOCK_K. Not on sm_80, where ptxas holds DUQ's bfloat16 sweep to 128 registers and spills 24 bytes.
RESIDENT_D = 128
INTERPRETER_RESIDENT_D = 256


def resident_d(device=None) -> int:
    """The widest D whose row block the forward keeps resident on `device` (0: none)."""
    if interpreting():
        return INTERPRETER_RESIDENT_D
    return RESIDENT_D if arch(device) >= 90 else 0
MAX_REGISTER_D = 64
INTERPRETER_MAX_REGISTER_D = 256


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter: TRITON_INTERPRET read as Triton's own knob
    reads it (1, true, on, yes, y in any case), so the interpreter's tiles go with the
    interpreter. From the environment, not the knob: torch.compile traces this call, and Dynamo
    does not trace into triton."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y")


def autotuning() -> bool:
    return os.environ.get("EO_TRITON_AUTOTUNE", "0") == "1" and not interpreting()


def arch(device=None) -> int:
    """The DEFAULTS_BY_ARCH generation of a CUDA device (90 for compute capability 9.x and newer,
    80 below)."""
    import torch

    major, _ = torch.cuda.get_device_capability(device)
    return 90 if major >= 9 else 80


def default(kernel: str, device=None) -> TileConfig:
    """The fixed configuration of `kernel` for `device`'s generation (the interpreter's own)."""
    if interpreting():
        return INTERPRETER[kernel]
    return DEFAULTS_BY_ARCH[arch(device)][kernel]


def has_default(kernel: str, device=None) -> bool:
    """Whether `kernel` has a configuration for `device`'s generation (the interpreter has all)."""
    return interpreting() or kernel in DEFAULTS_BY_ARCH[arch(device)]


def k_bucket(k: int) -> int:
    """Power-of-two bucket of a line count (the autotuning key's K)."""
    return 1 << max(0, (int(k) - 1).bit_length())


_TUNED: dict[tuple, TileConfig] = {}


def tuned(key: tuple) -> TileConfig | None:
    return _TUNED.get(key)


def remember(key: tuple, config: TileConfig) -> None:
    _TUNED[key] = config


def tuned_table() -> dict[tuple, TileConfig]:
    """What autotuning picked so far (key -> config), e.g. to report it in a benchmark."""
    return dict(_TUNED)
