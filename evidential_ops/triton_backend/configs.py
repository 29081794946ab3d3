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


# The fixed defaults on a GPU, per generation (compute capability 9.x: Hopper; 8.x: Ampere/Ada):
# the largest tiles found to compile without register spills there for the methods' term sets
# (TCL, UML, DUQ) in float32 "ieee", TF32 and bfloat16 (aot_check compiles each generation's own
# defaults and fails on a spill). The per-element special functions keep many values live; small
# tiles with several warps keep that within 255 registers. ptxas allocates differently per
# target: with the float32 element math (SPEC §2 "Float32 element math", triton 3.9) the stats
# tile m16n16k32w4 is spill-free on sm_90 and sm_80, where m16n16k16w4 (sm_80's default before)
# spills 8 bytes in UML float32, so both generations share it. Larger tiles are in the autotuning
# space.
# With triton 3.6 (the lent GPU machines' version), measured with the element math before the
# float32 one, no candidate stats tile was spill-free: over the 12 required stats variants the
# sm_90 default spilled 52 bytes in all (at most 32 in one, TCL float32 at 128 registers), and each
# of m16n16k16w4, m16n16k{16,32}w8, m16n32k32w8 28-140; sm_80's default 32. Not measured again
# (aot_check under triton 3.6); whether spills cost time is for the GPU benchmark.
DEFAULTS_BY_ARCH = {
    90: {
        "stats": TileConfig(16, 16, 32, 4, 1),
        "grad": TileConfig(32, 32, 32, 8, 1, block_d=64),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
    },
    80: {
        "stats": TileConfig(16, 16, 32, 4, 1),
        "grad": TileConfig(32, 32, 32, 8, 1, block_d=64),
        "grad_similarity": TileConfig(64, 32, 0, 8, 1),
    },
}

# The autotuning space: the defaults and larger tiles (more operand reuse in the tile products, at
# the price of some spills in the heaviest term sets; aot_check prints them).
SPACE = {
    "stats": (
        TileConfig(16, 16, 32, 4, 1),
        TileConfig(16, 16, 16, 4, 1),
        TileConfig(16, 32, 32, 8, 1),
        TileConfig(32, 32, 32, 8, 2),
        TileConfig(64, 32, 32, 8, 2),
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
