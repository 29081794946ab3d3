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
    tile product; block_d: the D chunk of the backward's second product (grad kernel only)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    block_d: int = 0

    def name(self) -> str:
        d = f"d{self.block_d}" if self.block_d else ""
        return f"m{self.block_m}n{self.block_n}k{self.block_k}{d}w{self.num_warps}s{self.num_stages}"


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
DEFAULTS_BY_ARCH = {
    90: {
        "stats": TileConfig(64, 32, 32, 8, 3),
        "grad": TileConfig(32, 32, 32, 8, 1, block_d=64),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
    },
    80: {
        "stats": TileConfig(64, 32, 32, 8, 3),
        "grad": TileConfig(32, 32, 32, 8, 1, block_d=64),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
    },
}

# The autotuning space (Hopper-sized: BLOCK_M 64-128, BLOCK_N 32-64, 4-8 warps, 2-4 stages): the
# defaults and larger tiles (more operand reuse in the tile products, at the price of spills in
# the heaviest term sets; aot_check prints them).
SPACE = {
    "stats": (
        TileConfig(64, 32, 32, 8, 3),
        TileConfig(64, 32, 64, 8, 2),
        TileConfig(64, 64, 32, 8, 3),
        TileConfig(128, 32, 32, 8, 4),
        TileConfig(64, 32, 32, 4, 2),
    ),
    "grad": (
        TileConfig(32, 32, 32, 8, 1, block_d=64),
        TileConfig(64, 32, 32, 8, 1, block_d=64),
        TileConfig(32, 32, 32, 4, 2, block_d=64),
        TileConfig(64, 32, 32, 8, 2, block_d=128),
    ),
    "grad_similarity": (
        TileConfig(64, 32, 0, 8, 1),
        TileConfig(32, 32, 0, 4, 1),
        TileConfig(64, 64, 0, 8, 1),
    ),
}

INTERPRETER = {
    "stats": TileConfig(64, 64, 64, 4, 1),
    "grad": TileConfig(64, 64, 64, 4, 1, block_d=256),
    "grad_similarity": TileConfig(64, 64, 0, 4, 1),
}

# The grad kernel keeps its (block_m, D) accumulator in registers when D fits in this many
# columns (one chunk), else it adds each tile's product into the output chunk by chunk.
MAX_REGISTER_D = 64
INTERPRETER_MAX_REGISTER_D = 256


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


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
