"""The op implementations of the Triton family: argument checks, buffers, kernel launches.

One Python function per op of csrc/ops.cpp, with the same arguments and the same checks (and
messages) as csrc/op_args.cpp. Each is written to be traceable: under torch.compile the ops are
decomposed (registration.py) into these calls, so they never read a tensor's values on the host
while tracing. Value checks (finite weights, a line strength that overflowed double) run on the
host in eager mode (a ValueError, like the C++ kernels) and as `torch._assert_async` in a graph
(evidential_ops.checks.require); the overflow check reads the device only where an overflow is
possible at all for the inputs' dtype, evidence and τ, and the embeddings' norms, read ahead of
the strips, do not rule it out (norm_bound.py; as the CUDA backend).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys

import torch
from torch import Tensor

from ..backends import matmul_precision
from ..checks import require as _require
from ..checks import values_unreadable
from ..config import EVIDENCE_KINDS, MATMUL_PRECISIONS
from ..config import TERMS as TERM_NAMES
from . import configs, kernels
from . import norm_bound
from .norm_bound import NormBound, overflow_possible_below

NUM_LINE_STATS = kernels.NUM_LINE_STATS
NUM_GRADIENT_FIELDS = kernels.NUM_GRADIENT_FIELDS
LINE_BLOCK = 128  # lines per program of the per-line kernels
# Column partials of the one-pass forward (G programs × NS × N float64) may use this much device
# memory; where so few programs fit that they would take longer than two passes, both directions
# run as two passes (one_pass_programs). With the (7, K) statistics of both directions (7 MiB at
# K = 65536) the forward stays below 64 MiB.
PARTIAL_BUDGET_BYTES = int(float(os.environ.get("EO_TRITON_PARTIAL_MIB", "48")) * 2**20)
# The backward where D is wider than a register block stages G = ∂L/∂s through a strip of rows
# (BackwardPlan), and float32 inputs (IEEE products, or TF32 ones at wide D) take s through one
# (similarity_strips). A strip takes what EXTRA_MEMORY_BYTES, the bound on what the ops add to
# device memory, leaves beside the per-line buffers held with it (`strip_budget`), or
# EO_TRITON_STRIP_MIB where that is set (STRIP_BUDGET_BYTES). A float32 dy for 16-bit inputs
# (with the product's float32 result: twice its size) is kept only within
# ACCUMULATOR_BUDGET_BYTES, and taken from the strip's share (docs/backends.md "How the triton
# backend works").
EXTRA_MEMORY_BYTES = 64 * 2**20
_STRIP_MIB = os.environ.get("EO_TRITON_STRIP_MIB")
STRIP_BUDGET_BYTES = int(float(_STRIP_MIB) * 2**20) if _STRIP_MIB else None
# float64 per line of each direction held with a strip: the saved statistics (7), the line
# constants (9) and the upstream gradient (1); the forward's columns' sums of a strip (7) and
# the statistics are less. And 10 more, measured rather than planned: at the peak of a K = 65536
# step on an H200 (bench/memory_peak.py) 8.9 MiB beyond those were live, 7.5 MiB allocated by
# autograd's backward thread (no Python frames; as much beside the cuda backend's op) and 1.4 MiB
# of _scaled_p_flag's temporaries, 142 bytes a line in all, and that step took 69.4 MiB against
# the 64 aimed at. STRIP_SPARE covers a strip's partials (one program per SM, 132 × 6 slots × 180
# rows × 8 bytes = 1.1 MiB at K = 65536) and the allocator's rounding.
PER_LINE_BYTES = 2 * (7 + 9 + 1 + 10) * 8
STRIP_SPARE_BYTES = 2 * 2**20
# A strip or block never gets less than this many bytes a line (64 lines of float64: 32 MiB at
# K = 65536, where the budget above leaves 35). Beyond K ≈ 70000 the per-line buffers alone near
# EXTRA_MEMORY_BYTES, and what they left shrank to strips of 16 rows at K = 131072 and to one row
# at K = 262144 (a budget of -46 MiB: a cuBLAS product and a sweep for every row). The extra memory
# grows as O(K) from there: PER_LINE_BYTES plus this, 944 bytes a line.
MIN_STRIP_BYTES_PER_LINE = 64 * 8
ACCUMULATOR_BUDGET_BYTES = 24 * 2**20
# What a second backward pass costs beyond its G traffic, in bytes of device-memory time per element
# of s: recomputing the element work (about 1.1 cycles an element in the static profile, on an
# H100's 132 SMs at 1.98 GHz against 3.35 TB/s: 15 bytes); its product is not counted, so the
# rule leans to two passes.
RECOMPUTE_BYTES_PER_ELEMENT = 16
# Float32 embeddings with TF32 products wider than this take s from cuBLAS strips in both
# directions (similarity_strips): a tile kernel's 64 float32 rows are then more than 128 KiB, half
# an H100 SM's L1, and come from L2 again for every column tile (bench/gpu_model.py's rule; at
# K = 16384 the model has the tiles ahead at D = 512, 2.9x the floor against 3.3x for TCL, and the
# strips at D = 1024, 2.3x against 5.6x). EO_TRITON_STRIPS_ABOVE_D moves it (a GPU session times
# both sides: bench/gpu_session.sh tiles16k).
SIMILARITY_STRIPS_ABOVE_D = int(os.environ.get("EO_TRITON_STRIPS_ABOVE_D", "512"))
# Float32 embeddings with IEEE products take s from cuBLAS strips wider than this, by default at
# every D. The tiles' IEEE tl.dot is FFMA fed from shared memory, 8 outputs a thread: on the H200
# (bench/results/cuda_nvidia-h200.json, K = 16384, D = 1024, one run) the TCL step with IEEE tiles
# took 214.8 ms against 30.1 ms with TF32 strips; less the two runs' cuBLAS products (floor / 3 a
# product: 10.8 ms IEEE, 1.7 ms TF32) that leaves 170 ms for the two tile products (the forward's s
# and the backward's s again), ~6.5 TFLOP/s against cuBLAS's 51 at the same shape: 2 × 2·K²·D flops
# in 170 ms (UML 222 ms, DUQ 166 ms the same way). Nothing in that ratio depends on D, so no
# width is exempt. EO_TRITON_IEEE_STRIPS_ABOVE_D moves it.
IEEE_SIMILARITY_STRIPS_ABOVE_D = int(os.environ.get("EO_TRITON_IEEE_STRIPS_ABOVE_D", "0"))
# bfloat16 and float16 embeddings take s from cuBLAS strips (tensor-core products with a float32
# result) wider than this, by default at every D. On the H200 (bench/results/gpu_h200_third_lease.md,
# TCL, K = 16384, D = 1024) the bf16 step's tile kernels took 21.5 ms (stats_kernel, one launch)
# and 17.7 ms (grad_block_kernel recomputing s, 40 launches), while the same kernels reading s from
# float32 strips took 2.9 and 2.0 ms in the TF32 step, and the floor's bf16 product of s 0.73 ms.
# The tile stats sweep runs one wave of 128 programs at IPC 1.0, half its stalls waiting on L1
# (ncu, the second lease): bound by its own issue, not by D. EO_TRITON_HALF_STRIPS_ABOVE_D moves it.
HALF_SIMILARITY_STRIPS_ABOVE_D = int(os.environ.get("EO_TRITON_HALF_STRIPS_ABOVE_D", "0"))
# A stored strip or block of s or G starts each row this many bytes apart (a multiple): cuBLAS's
# sm_90 GEMMs read and write through the tensor memory accelerator, which needs 16-byte aligned
# rows; a block of 2731 float32 columns (BackwardPlan "blocks" at K = 16384) took cutlass's sm_80
# kernels instead, 5.0-5.4 ms a product set against 1.4-2.1 ms for the sm_90 ones on the same
# shapes (an H200, python bench/kernel_times.py, triton tcl tf32 K = 16384 D = 1024).
ROW_ALIGN_BYTES = 16


# ----------------------------------------------------------------------------------- launching


def _launch(kernel, grid, *args, **meta):
    """Launch `kernel`: through torch.library.wrap_triton (traceable under torch.compile; the eager
    op disables its tracing, see registration.py), or directly under the interpreter, whose
    kernels wrap_triton does not take. Eager launches on CUDA tensors run with their device made
    current: Triton launches on the current device whatever device the pointers belong to, so a
    tensor on cuda:1 with cuda:0 current would be read from the wrong device (under torch.compile
    the generated code sets the device itself)."""
    if configs.interpreting():
        kernel[grid](*args, **meta)
        return
    like = next((a for a in args if isinstance(a, Tensor)), None)
    if like is not None and like.device.type == "cuda" and not _tracing(like):
        with torch.cuda.device(like.device):
            torch.library.wrap_triton(kernel)[grid](*args, **meta)
    else:
        torch.library.wrap_triton(kernel)[grid](*args, **meta)


def _tracing(t: Tensor) -> bool:
    """No host read of `t`'s values, no benchmark launch: tracing, fake, or CUDA graph capture."""
    return values_unreadable(t)


def _readable(t: Tensor) -> bool:
    """Whether `t`'s values can be read on the host now: not traced, fake or captured, not meta."""
    return not _tracing(t) and t.device.type != "meta"


def _value(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _type(condition: bool, message: str) -> None:
    if not condition:
        raise TypeError(message)


# ------------------------------------------------------------------------ checks (op_args.cpp)


def _evidence_index(evidence: str) -> int:
    _value(evidence in EVIDENCE_KINDS, f"evidence must be one of exp, relu, softplus, exp_tanh; got '{evidence}'")
    return EVIDENCE_KINDS.index(evidence)


def _inverse_tau(tau: float) -> float:
    _value(tau > 0.0 and math.isfinite(tau), f"tau must be a finite number > 0, got {tau}")
    inverse = 1.0 / tau if tau >= 5e-324 else math.inf
    _value(math.isfinite(inverse), f"tau={tau} is so small that 1/tau overflows double precision")
    return inverse


class _Terms:
    """The `terms` bit mask, decoded (risk, kl, mse, fmse, logdet)."""

    def __init__(self, terms: int):
        _value(0 < terms < (1 << 5), "terms must be a non-empty bit mask of the 5 terms (risk=1, kl=2, mse=4, "
               f"fmse=8, logdet=16), got {terms}")
        self.mask = terms
        self.enabled = tuple(bool((terms >> k) & 1) for k in range(5))
        self.risk, self.kl, self.mse, self.fmse, self.logdet = self.enabled

    def stat_flags(self) -> dict:
        return dict(MSE=int(self.mse), KL=int(self.kl), FMSE=int(self.fmse), LOGDET=int(self.logdet))

    def line_flags(self) -> dict:
        return dict(RISK=int(self.risk), **self.stat_flags())

    def num_partials(self) -> int:
        return 1 + self.mse + self.kl + self.fmse + 2 * self.logdet


def _same_device(t: Tensor, name: str, like: Tensor, like_name: str) -> None:
    _value(t.device == like.device, f"{name} is on {t.device} but {like_name} is on {like.device}")


def _stat_flags(terms: _Terms | None) -> dict:
    """The statistic kernels' term flags: the selection's, or none (opinions: α sums only)."""
    return terms.stat_flags() if terms is not None else dict(MSE=0, KL=0, FMSE=0, LOGDET=0)


def _check_weights(weights: Tensor, like: Tensor) -> None:
    _type(weights.dtype == torch.float64, f"weights must be a float64 tensor, got {weights.dtype}")
    _value(weights.dim() == 1 and weights.shape[0] == 5,
           f"weights must have shape (5,) (risk, kl, mse, fmse, logdet), got {tuple(weights.shape)}")
    _value(weights.device.type == "cpu" or weights.device == like.device,
           f"weights must be on the CPU or on {like.device}, got {weights.device}")


class _Weights:
    """The 5 term weights as the per-line kernels take them: host floats (eager, CPU weights: no
    device copy, no synchronisation) or a float64 device tensor (inside a graph, or weights that
    already live on the device).

    Checked finite and zero outside the terms mask (csrc/op_args.cpp host_weights): a ValueError
    for host values, an asynchronous assert for device ones."""

    def __init__(self, weights: Tensor, terms: _Terms, like: Tensor):
        _check_weights(weights, like)
        self.values = (0.0,) * 5
        self.tensor = None
        if weights.device.type == "cpu" and not _tracing(weights):
            values = [float(v) for v in weights.tolist()]
            for k, name in enumerate(TERM_NAMES):
                _value(math.isfinite(values[k]), f"weights['{name}'] must be finite, got {values[k]}")
                _value(terms.enabled[k] or values[k] == 0.0,
                       f"weights['{name}'] is {values[k]} but the term is not in the terms mask")
            self.values = tuple(values)
        else:
            off = torch.tensor([not e for e in terms.enabled], device=weights.device)
            _require(torch.isfinite(weights).all() & ((weights == 0) | ~off).all(),
                     "weights must be finite and zero for every term not in the terms mask")
            self.tensor = weights.to(like.device).contiguous()

    def args(self, like: Tensor) -> tuple:
        """(weights_ptr, w0..w4) of the per-line kernels, and W_FROM_PTR."""
        pointer = self.tensor if self.tensor is not None else like
        return (pointer, *self.values), int(self.tensor is not None)


def _check_embeddings(x: Tensor, y: Tensor) -> None:
    _value(x.dim() == 2 and y.dim() == 2 and x.shape[1] == y.shape[1] and x.shape[1] >= 1,
           f"x and y must be 2-D with the same embedding size D >= 1, got {list(x.shape)} and {list(y.shape)}")
    _type(x.is_floating_point() and x.dtype == y.dtype,
          f"x and y must have the same floating dtype, got {x.dtype} and {y.dtype}")
    _same_device(y, "y", x, "x")


def _check_similarity(s: Tensor) -> None:
    _value(s.dim() == 2, f"s must be 2-D, got {list(s.shape)}")
    _type(s.is_floating_point(), f"s must be a floating tensor, got {s.dtype}")


def _check_square(rows: int, cols: int) -> None:
    _value(rows == cols and rows >= 2, f"the loss needs a square K×K problem with K >= 2, got {rows}×{cols}")


def _check_strip(rows: int, cols: int, offset: int) -> None:
    _value(cols >= 2 and rows >= 1 and offset >= 0 and offset + rows <= cols,
           "a strip is rows [target_offset, target_offset + M) of an N×N problem (N >= 2): got "
           f"M = {rows}, N = {cols}, target_offset = {offset}")


def _check_target_scale(target_scale: Tensor | None, n: int, like: Tensor) -> Tensor | None:
    if target_scale is None:
        return None
    _type(target_scale.is_floating_point() or target_scale.dtype == torch.bool,
          f"target_scale must be a floating or bool tensor, got {target_scale.dtype}")
    _value(target_scale.dim() == 1 and target_scale.shape[0] == n,
           f"target_scale must have shape ({n},), got {list(target_scale.shape)}")
    _same_device(target_scale, "target_scale", like, "the inputs")
    return target_scale.to(torch.float64).contiguous()


def _check_line_stats(stats: Tensor, name: str, n: int, like: Tensor) -> Tensor:
    _type(stats.dtype == torch.float64, f"{name} must be the float64 statistics of the forward, got {stats.dtype}")
    _value(stats.dim() == 2 and stats.shape[0] == NUM_LINE_STATS and stats.shape[1] == n,
           f"{name} must be the ({NUM_LINE_STATS}, {n}) statistics of the forward, got {list(stats.shape)}")
    _same_device(stats, name, like, "the inputs")
    return stats.contiguous()


def _check_upstream(grad: Tensor, name: str, n: int, used: bool, like: Tensor) -> Tensor | None:
    if not used:
        return None
    _value(grad.numel() == n, f"{name} must have {n} entries, got {grad.numel()}")
    _type(grad.is_floating_point(), f"{name} must be floating, got {grad.dtype}")
    _same_device(grad, name, like, "the inputs")
    return grad.reshape(n).to(torch.float64).contiguous()


def _compute_f64(dtype: torch.dtype) -> bool:
    return dtype == torch.float64


def _output_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------- configurations


def _config(kernel: str, variant: tuple, k: int, d: int, dtype: torch.dtype, bench,
            device: torch.device) -> configs.TileConfig:
    """The default configuration for the device, or (EO_TRITON_AUTOTUNE=1) the fastest of
    configs.SPACE[kernel] for (variant, K bucket, D, dtype), timed once by `bench(config)` in eager
    mode."""
    if not configs.autotuning():
        return configs.default(kernel, device)
    key = (kernel, variant, configs.k_bucket(k), d, str(dtype), configs.arch(device))
    picked = configs.tuned(key)
    if picked is not None:
        return picked
    if bench is None:
        return configs.default(kernel, device)
    import triton.testing

    best, best_ms = None, math.inf
    for config in configs.SPACE[kernel]:
        try:
            ms = triton.testing.do_bench(lambda c=config: bench(c), warmup=5, rep=20)
        except Exception:  # a configuration that does not fit this GPU (shared memory, registers)
            continue
        if ms < best_ms:
            best, best_ms = config, ms
    best = best or configs.default(kernel, device)
    configs.remember(key, best)
    return best


def _tf32(dtype: torch.dtype, precision: str) -> int:
    """TF32 tile products for float32 inputs with matmul_precision "tf32" (the op argument)."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be 'ieee' or 'tf32', got {precision!r}")
    return int(precision == "tf32" and dtype == torch.float32)


# ------------------------------------------------------------------------------ line statistics


class _Source:
    """Where the tiles of s come from, seen from the "own" lines (the program's lines): embeddings
    (a: own, b: other), or a given s read by rows (own = rows) or, transposed, by columns."""

    def __init__(self, a: Tensor, b: Tensor | None, transposed: bool = False):
        self.from_s = b is None
        self.is_transposed = transposed
        if self.from_s:
            self.s = self.a = self.b = a
            si, sj = a.stride()
            self.strides = (sj, si, 0, 0) if transposed else (si, sj, 0, 0)
            self.n_own, self.n_other = (a.shape[1], a.shape[0]) if transposed else (a.shape[0], a.shape[1])
            self.d = 1
        else:
            self.a, self.b = a, b
            self.strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
            self.n_own, self.n_other = a.shape[0], b.shape[0]
            self.d = a.shape[1]
        self.dtype = a.dtype

    def transposed(self) -> "_Source":
        if self.from_s:
            return _Source(self.s, None, transposed=not self.is_transposed)
        return _Source(self.b, self.a)


def _resident_d(source: "_Source", precision: str) -> int:
    """BLOCK_K of a stats sweep whose row block stays loaded while it walks the column blocks (the
    FlashAttention forward), or 0 (D stepped per tile): embeddings with D <= configs.resident_d whose
    tile product runs on tensor cores (16-bit, or float32 with TF32), and every float32 product in
    the interpreter, which pays per tile. Float32 "ieee" FFMA products hold the row block in
    registers and spill (8 bytes, DUQ, D = 64)."""
    d = source.d
    limit = configs.resident_d(source.a.device)
    tensor_cores = source.dtype in (torch.float16, torch.bfloat16) or _tf32(source.dtype, precision)
    if source.from_s or d > limit or not (tensor_cores or configs.interpreting()):
        return 0
    return max(16, configs.k_bucket(d))


def _stats_pass(source: _Source, own: Tensor, other: Tensor, partials: Tensor | None, t_off: int, evidence: int,
                inv_tau: float, terms: _Terms | None, has_target: bool, precision: str) -> None:
    """One stats_kernel launch: the own lines' statistics into `own`, and with `partials` the other
    lines' per-program partials and targets (into `other`)."""
    cfg_kernel = "stats"
    flags = _stat_flags(terms)
    other_pass = partials is not None
    f64 = _compute_f64(source.dtype)
    resident = _resident_d(source, precision)
    variant = (evidence, tuple(flags.values()), other_pass, source.from_s, has_target,
               _tf32(source.dtype, precision), resident)

    def run(config, out_own=own, out_other=other, out_part=partials):
        row_blocks = triton_cdiv(source.n_own, config.block_m)
        programs = out_part.shape[0] if out_part is not None else row_blocks
        _launch(kernels.stats_kernel, (programs,),
                source.a, source.b, *source.strides, out_own, source.n_own, out_other, source.n_other,
                out_part if out_part is not None else out_own, programs, triton_cdiv(row_blocks, programs),
                source.d, t_off, inv_tau,
                EVIDENCE=evidence, HAS_TARGET=int(has_target), **flags, OWN=1, OTHER=int(out_part is not None),
                FROM_S=int(source.from_s), F64=int(f64), TF32=_tf32(source.dtype, precision),
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=resident or max(config.block_k, 16),
                RESIDENT=int(resident > 0), num_warps=config.num_warps, num_stages=config.num_stages)

    def bench(config):
        scratch_part = torch.zeros_like(partials) if partials is not None else None
        run(config, out_own=torch.zeros_like(own), out_other=torch.zeros_like(other), out_part=scratch_part)

    config = _config(cfg_kernel, variant, source.n_other, source.d, source.dtype, None if _tracing(own) else bench,
                     own.device)
    run(config)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


# Programs per SM of a grad_block_kernel launch: enough to balance the SMs' work, few enough that
# each program sweeps several column blocks with its rows' line constants formed once.
GRAD_PROGRAMS_PER_SM = 4


def _column_programs(row_blocks: int, col_blocks: int, device: torch.device) -> int:
    """Programs along the columns of a grad_block_kernel launch of row_blocks row blocks: about
    GRAD_PROGRAMS_PER_SM per SM in all, each walking col_blocks / that many column blocks."""
    return max(1, min(col_blocks, triton_cdiv(GRAD_PROGRAMS_PER_SM * _sm_count(device), row_blocks)))


def _line_statistics(source: _Source, t_off: int, evidence: int, inv_tau: float, terms: _Terms | None,
                     has_target: bool, rows: bool, cols: bool, precision: str = "ieee") -> tuple[Tensor, Tensor]:
    """(row_stats (7, M), col_stats (7, N)) float64, zeros for a direction not asked for."""
    like = source.a
    row_stats = torch.zeros((NUM_LINE_STATS, source.n_own), dtype=torch.float64, device=like.device)
    col_stats = torch.zeros((NUM_LINE_STATS, source.n_other), dtype=torch.float64, device=like.device)
    if (rows or cols) and not source.from_s and similarity_strips(source.dtype, source.d, precision, like):
        if rows and cols:
            _strip_statistics(source, t_off, evidence, inv_tau, terms, has_target, precision, row_stats, col_stats)
        elif rows:
            _strip_statistics_one_way(source, t_off, evidence, inv_tau, terms, has_target, precision, row_stats)
        else:
            _strip_statistics_one_way(source.transposed(), -t_off, evidence, inv_tau, terms, has_target, precision,
                                      col_stats)
        return row_stats, col_stats
    if rows and cols:
        ns = terms.num_partials() if terms is not None else 1
        config = configs.default("stats", like.device)
        row_blocks = triton_cdiv(source.n_own, config.block_m)
        programs = one_pass_programs(row_blocks, source.n_other, ns, _sm_count(like.device))
        if programs:
            partials = torch.zeros((programs, ns, source.n_other), dtype=torch.float64, device=like.device)
            _stats_pass(source, row_stats, col_stats, partials, t_off, evidence, inv_tau, terms, has_target, precision)
            flags = _stat_flags(terms)
            _launch(kernels.reduce_partials_kernel, (triton_cdiv(source.n_other, LINE_BLOCK),),
                    partials, programs, col_stats, source.n_other, source.n_other, **flags, BLOCK=LINE_BLOCK,
                    CLEAR=0)
            return row_stats, col_stats
    if rows:
        _stats_pass(source, row_stats, col_stats, None, t_off, evidence, inv_tau, terms, has_target, precision)
    if cols:
        _stats_pass(source.transposed(), col_stats, row_stats, None, -t_off, evidence, inv_tau, terms, has_target,
                    precision)
    return row_stats, col_stats


def one_pass_programs(row_blocks: int, n_other: int, num_partials: int, sms: int) -> int:
    """Programs of the one-pass forward of `row_blocks` row blocks (each sweeping its share of them
    and summing the columns into a float64 partial of its own, num_partials × n_other, within
    PARTIAL_BUDGET_BYTES), or 0 for two passes (rows, then columns with s computed again).

    One pass where a program's share is fewer sweeps than two passes' waves at one program per SM
    (the default tiles' registers leave room for one): at K = 16384 UML's four partials fit 96
    programs, three sweeps each against two passes of two waves. Then as few programs as that many
    sweeps need (86 there): the same time, fewer partials to zero and add up."""
    fit = max(1, PARTIAL_BUDGET_BYTES // (num_partials * n_other * 8))
    sweeps = triton_cdiv(row_blocks, min(row_blocks, fit))
    if sweeps >= 2 * triton_cdiv(row_blocks, sms):
        return 0
    return triton_cdiv(row_blocks, sweeps)


def similarity_strips(dtype: torch.dtype, d: int, precision: str, like: Tensor | None = None) -> bool:
    """Whether s comes from stored strips of cuBLAS products rather than from the tile kernels' own,
    in the forward and the backward: float32 embeddings with IEEE products wider than
    IEEE_SIMILARITY_STRIPS_ABOVE_D (every D by default), with TF32 products wider than
    SIMILARITY_STRIPS_ABOVE_D, and 16-bit embeddings wider than HALF_SIMILARITY_STRIPS_ABOVE_D
    (every D by default; s in float32, `similarity_product`). IEEE: the tiles' FFMA products ran at
    an eighth of cuBLAS's on the H200 (IEEE_SIMILARITY_STRIPS_ABOVE_D's note). TF32: where a
    program's 64 rows exceed half an SM's L1 the tiles step through D and read 4-byte operands
    again for every tile: at K = 16384, D = 1024 a stats sweep moves 48 GiB through L2 (a 64 × 32
    tile reads 384 KiB of operands for 2048 elements), ~7 ms on an H100 against 1.1 ms of TF32
    product, while a strip of s is written and read once, 4 bytes an element (docs/backends.md
    "How the triton backend works", bench/results/gpu_model.md). 16-bit: the tile sweeps took 7-9x
    the strip sweeps' time on the H200 (HALF_SIMILARITY_STRIPS_ABOVE_D's note). Embeddings only: a
    given s is its own strip. Eager launches only (`like`, a tensor of the call, not traced): in a
    traced graph the strips' cuBLAS products would run as torch's TF32 switch says when the graph
    runs, not as `precision` says, and the tile kernels take it as a compile-time argument; such
    calls stay opaque ops under torch.compile (registration._cublas_products)."""
    if like is not None and _tracing(like):
        return False
    if dtype in (torch.float16, torch.bfloat16):
        return d > HALF_SIMILARITY_STRIPS_ABOVE_D
    if dtype != torch.float32:
        return False
    return d > (SIMILARITY_STRIPS_ABOVE_D if _tf32(dtype, precision) else IEEE_SIMILARITY_STRIPS_ABOVE_D)


def similarity_product(a: Tensor, b: Tensor, out: Tensor) -> None:
    """out (rows, n) float32 = a·bᵀ for a (rows, D), b (n, D): float32 operands at the precision the
    caller set (_float32_products), 16-bit ones on the tensor cores with a float32 result (each
    product exact, the sum in float32, as the tiles' tl.dot)."""
    if a.dtype == out.dtype:
        torch.mm(a, b.t(), out=out)
    elif a.is_cuda:
        torch.mm(a, b.t(), out_dtype=out.dtype, out=out)
    else:  # the interpreter's checks: the same products in float32 (exact)
        torch.mm(a.to(out.dtype), b.to(out.dtype).t(), out=out)


def strip_budget(lines: int, reserved: int = 0) -> int:
    """Bytes a strip may take in a problem of `lines` lines a direction: STRIP_BUDGET_BYTES where
    EO_TRITON_STRIP_MIB sets it, else what EXTRA_MEMORY_BYTES leaves beside the per-line buffers,
    the spare and `reserved` bytes held with it (55 MiB at K = 16384, 35 MiB at K = 65536), and
    at least MIN_STRIP_BYTES_PER_LINE a line (64 MiB at K = 131072)."""
    if STRIP_BUDGET_BYTES is not None:
        return STRIP_BUDGET_BYTES
    left = EXTRA_MEMORY_BYTES - STRIP_SPARE_BYTES - PER_LINE_BYTES * lines - reserved
    return max(left, MIN_STRIP_BYTES_PER_LINE * lines)


def aligned_row_length(cols: int, size: int) -> int:
    """Elements from one row of a stored strip or block to the next: `cols` rounded up to
    ROW_ALIGN_BYTES of `size`-byte elements."""
    align = max(1, ROW_ALIGN_BYTES // size)
    return triton_cdiv(cols, align) * align


def aligned_matrix(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised (rows, cols) matrix whose rows lie aligned_row_length(cols) elements apart
    (stride (that, 1)): cuBLAS writes and reads it in place (out=) with its sm_90 kernels."""
    return torch.empty((rows, aligned_row_length(cols, dtype.itemsize)), dtype=dtype, device=device)[:, :cols]


def strip_rows(m: int, n: int, size: int, budget: int | None = None) -> int:
    """Rows of a stored (rows, n) strip of `size`-byte elements (rows aligned_row_length apart)
    within `budget` bytes (default `strip_budget`), evened out over the m rows (the strips of s in
    the forward)."""
    budget = strip_budget(max(m, n)) if budget is None else budget
    rows = max(1, min(m, budget // max(aligned_row_length(n, size) * size, 1)))
    return triton_cdiv(m, triton_cdiv(m, rows))


def _strip_statistics(source: "_Source", t_off: int, evidence: int, inv_tau: float, terms: _Terms | None,
                      has_target: bool, precision: str, row_stats: Tensor, col_stats: Tensor) -> None:
    """Both directions' statistics from strips of s (similarity_strips; row i's target is column
    i + t_off): s[strip] = a[strip]·bᵀ (cuBLAS, as `precision` says, float32 result), then one
    stats_kernel sweep of it read by columns. The columns (every other line, N of them: enough
    programs for every SM) are the own lines, their sums of the strip added to col_stats strip after
    strip; the strip's rows are the other lines, summed per program into partials that
    reduce_partials_kernel adds up into row_stats' columns of the strip. Deterministic: every sum in
    a fixed order. Extra memory: one strip, its partials and the columns' sums of one strip."""
    a, b = source.a, source.b
    m, n = source.n_own, source.n_other
    rows_per_strip = strip_rows(m, n, 4)
    ns = terms.num_partials() if terms is not None else 1
    flags = _stat_flags(terms)
    config = configs.default("stats", a.device)
    programs = strip_programs(triton_cdiv(n, config.block_m), _sm_count(a.device))
    s = aligned_matrix(rows_per_strip, n, torch.float32, a.device)
    partials = torch.zeros((programs * ns * rows_per_strip,), dtype=torch.float64, device=a.device)
    # Every statistic the sweep stores, it stores for every column; those it does not stay 0.
    strip_cols = torch.zeros_like(col_stats)
    with _float32_products(a, precision):
        for r0 in range(0, m, rows_per_strip):
            rows = min(rows_per_strip, m - r0)
            strip = s[:rows]
            similarity_product(a[r0:r0 + rows], b, strip)
            # zero: from the allocation, then from the previous strip's reduction (CLEAR), whose
            # (programs, ns, rows) covered at least this strip's prefix of the buffer
            strip_partials = partials[:programs * ns * rows].view(programs, ns, rows)
            # Column j's target is row j − t_off, the strip's row j − t_off − r0 (where the strip has it).
            _stats_pass(_Source(strip, None, transposed=True), strip_cols, row_stats[:, r0:], strip_partials,
                        -(t_off + r0), evidence, inv_tau, terms, has_target, precision)
            col_stats += strip_cols
            _launch(kernels.reduce_partials_kernel, (triton_cdiv(rows, STRIP_REDUCE_BLOCK),),
                    strip_partials, programs, row_stats[:, r0:], rows, m, **flags, BLOCK=STRIP_REDUCE_BLOCK,
                    CLEAR=1)


def _strip_statistics_one_way(source: "_Source", t_off: int, evidence: int, inv_tau: float, terms: _Terms | None,
                              has_target: bool, precision: str, own_stats: Tensor) -> None:
    """The own lines' statistics alone from strips of s (similarity_strips; own line i's target is
    other line i + t_off; TCL's losses take one direction a model): s[strip] = a[strip]·bᵀ (cuBLAS,
    as `precision` says, float32 result), then one stats_kernel sweep of it by its rows, which are
    whole own lines: no partials, every sum in the kernel's order. Extra memory: one strip and its
    lines' statistics."""
    a, b = source.a, source.b
    m, n = source.n_own, source.n_other
    rows_per_strip = strip_rows(m, n, 4)
    s = aligned_matrix(rows_per_strip, n, torch.float32, a.device)
    with _float32_products(a, precision):
        for r0 in range(0, m, rows_per_strip):
            rows = min(rows_per_strip, m - r0)
            strip = s[:rows]
            # zeros: the sweep leaves the statistics of terms not asked for unwritten
            strip_lines = torch.zeros((NUM_LINE_STATS, rows), dtype=torch.float64, device=a.device)
            similarity_product(a[r0:r0 + rows], b, strip)
            # row r0 + i's target is column r0 + i + t_off: the strip's row i's
            _stats_pass(_Source(strip, None), strip_lines, strip_lines, None, t_off + r0, evidence, inv_tau, terms,
                        has_target, precision)
            own_stats[:, r0:r0 + rows] = strip_lines


# Lines per program of a strip's partial reduction: each program adds up one partial per stats
# program (one per SM), in order, a loop of dependent loads; 8 lines spread a strip of 911 rows
# (K = 16384) over 114 programs, near one per SM, where 32 took 29.
STRIP_REDUCE_BLOCK = 8


def strip_programs(col_blocks: int, sms: int) -> int:
    """Programs of a strip's stats sweep over `col_blocks` column blocks: one per SM (the default
    tile's registers leave room for one), each sweeping its share of the column blocks, so that
    the strip's rows get as few partials to add up as the SMs allow."""
    return max(1, min(col_blocks, sms))


def _overflow_possible(kind: int, dtype: torch.dtype, inv_tau: float, n: int, from_s: bool = False) -> bool:
    """Whether Σα of a line of n candidates can overflow double for inputs of `dtype`, from what the
    host knows (csrc/cuda/evidential_cuda.cpp overflow_possible): if not, no device read. The
    largest s is its dtype's: a given s's own, else the product's, float64 for float64 embeddings
    and float32 for the others (16-bit products are summed in float32: a float16 x·yᵀ is not
    bounded by 65504; at τ >= 92 that bound skipped the check, and an overflowed Σα came out NaN)."""
    if dtype == torch.float64:
        largest = sys.float_info.max
    elif dtype == torch.float16 and from_s:
        largest = 65504.0
    else:
        largest = 3.4028234663852886e38
    return overflow_possible_below(largest, kind, inv_tau, n)


def _norm_bound(source: "_Source", kind: int, inv_tau: float, n: int) -> NormBound | None:
    """The embeddings' norm bound on |s| started ahead of the strips (norm_bound.py), where the
    dtype leaves an overflow possible and the flag would be read on the host: eager, embeddings."""
    if source.from_s or not _readable(source.a) or not _overflow_possible(kind, source.dtype, inv_tau, n):
        return None
    return NormBound(source.a, source.b)


def _flag_read_needed(bound: NormBound | None, kind: int, source: "_Source", inv_tau: float, n: int) -> bool:
    """Whether the overflow check must look at the statistics: an overflow is possible for the
    dtype and the norm bound, where there is one, does not rule it out."""
    if bound is not None:
        return not bound.rules_out_overflow(kind, inv_tau, n)
    return _overflow_possible(kind, source.dtype, inv_tau, n, source.from_s)


def _overflow_check(stats: list[Tensor], message: str) -> None:
    """A line strength beyond double (exp evidence at |s|/τ > 709) is an error naming τ: one
    check (one host read in eager mode) for every direction in `stats`."""
    if stats:
        overflowed = torch.stack([torch.isinf(s[1] + s[0]).any() for s in stats]).any()
        _require(~overflowed, message)


def _tau_message(tau: float, evidence: str) -> str:
    """csrc/op_args.cpp tau_overflow_message, word for word."""
    return (f"tau={tau} is too small for evidence='{evidence}' or the similarities are too large: the line "
            f"strength Σα overflows double precision (exp evidence: |s|/tau > 709, i.e. |s| > {709.0 * tau:g}; any "
            f"evidence: an infinite similarity). {_NORMALISE_HINT}")


# csrc/op_args.h kNormaliseHint and kStrengthOverflowMessage (line_losses sees statistics only:
# no τ, no evidence).
_NORMALISE_HINT = ("The losses expect cosine similarities (|s| <= 1): for raw features pass normalize=True or "
                   "L2-normalise x and y; otherwise use a larger tau.")
_STRENGTH_OVERFLOW_MESSAGE = ("a line strength overflowed double precision (exp evidence: |s|/tau > 709; any "
                              f"evidence: an infinite similarity). {_NORMALISE_HINT}")


# ----------------------------------------------------------------------------------- per line


def _line_losses(stats: Tensor, scale: Tensor | None, scale_offset: int, candidates: int, weights: _Weights,
                 terms: _Terms) -> Tensor:
    n = stats.shape[1]
    out = torch.empty(n, dtype=torch.float64, device=stats.device)
    w_args, from_ptr = weights.args(stats)
    _launch(kernels.line_loss_kernel, (triton_cdiv(n, LINE_BLOCK),),
            stats, n, scale if scale is not None else stats, scale_offset, float(candidates), *w_args, out,
            HAS_SCALE=int(scale is not None), W_FROM_PTR=from_ptr, **terms.line_flags(), BLOCK=LINE_BLOCK)
    return out


def _line_gradients(stats: Tensor, scale: Tensor | None, scale_offset: int, candidates: int, weights: _Weights,
                    terms: _Terms, upstream: Tensor | None) -> Tensor:
    n = stats.shape[1]
    if upstream is None:  # direction not computed: zero constants
        return torch.zeros((NUM_GRADIENT_FIELDS, n), dtype=torch.float64, device=stats.device)
    out = torch.empty((NUM_GRADIENT_FIELDS, n), dtype=torch.float64, device=stats.device)
    w_args, from_ptr = weights.args(stats)
    _launch(kernels.line_gradient_kernel, (triton_cdiv(n, LINE_BLOCK),),
            stats, n, scale if scale is not None else stats, scale_offset, float(candidates), *w_args, upstream, out,
            HAS_SCALE=int(scale is not None), W_FROM_PTR=from_ptr, **terms.line_flags(), BLOCK=LINE_BLOCK)
    return out


# ---------------------------------------------------------------------------------------- ops


def line_stats(x: Tensor, y: Tensor, target_offset: int, evidence: str, tau: float, terms: int, rows: bool,
               cols: bool, precision: str = "ieee") -> tuple[Tensor, Tensor]:
    _check_embeddings(x, y)
    _check_strip(x.shape[0], y.shape[0], target_offset)
    kind, inv_tau = _evidence_index(evidence), _inverse_tau(tau)
    selection = _Terms(terms)
    source = _Source(x, y)
    bound = _norm_bound(source, kind, inv_tau, y.shape[0]) if rows else None
    row_stats, col_stats = _line_statistics(source, target_offset, kind, inv_tau, selection, True, rows, cols,
                                            precision)
    # Columns of a strip are partial: only the caller's sum over every strip can be checked.
    if rows and _flag_read_needed(bound, kind, source, inv_tau, y.shape[0]):
        _overflow_check([row_stats], _tau_message(tau, evidence))
    return row_stats, col_stats


def line_losses(row_stats: Tensor, col_stats: Tensor, target_scale: Tensor | None, target_offset: int,
                weights: Tensor, terms: int, rows: bool, cols: bool) -> tuple[Tensor, Tensor]:
    m = row_stats.shape[1] if row_stats.dim() == 2 else -1
    n = col_stats.shape[1] if col_stats.dim() == 2 else -1
    row_stats = _check_line_stats(row_stats, "row_stats", m, row_stats)
    col_stats = _check_line_stats(col_stats, "col_stats", n, row_stats)
    _check_strip(m, n, target_offset)
    scale = _check_target_scale(target_scale, n, row_stats)
    selection = _Terms(terms)
    w = _Weights(weights, selection, row_stats)
    _overflow_check([row_stats] * rows + [col_stats] * cols, _STRENGTH_OVERFLOW_MESSAGE)
    zeros = lambda k: torch.zeros(k, dtype=torch.float64, device=row_stats.device)
    return (_line_losses(row_stats, scale, target_offset, n, w, selection) if rows else zeros(m),
            _line_losses(col_stats, scale, 0, n, w, selection) if cols else zeros(n))


def _forward(source: _Source, target_scale, evidence, tau, weights, terms, rows, cols, like, precision):
    _check_square(source.n_own, source.n_other)
    k = source.n_own
    scale = _check_target_scale(target_scale, k, like)
    kind, inv_tau = _evidence_index(evidence), _inverse_tau(tau)
    selection = _Terms(terms)
    w = _Weights(weights, selection, like)
    bound = _norm_bound(source, kind, inv_tau, k) if rows or cols else None
    row_stats, col_stats = _line_statistics(source, 0, kind, inv_tau, selection, True, rows, cols, precision)
    out_dtype = _output_dtype(like.dtype)
    zeros = torch.zeros(k, dtype=out_dtype, device=like.device)
    row_losses = _line_losses(row_stats, scale, 0, k, w, selection).to(out_dtype) if rows else zeros
    col_losses = _line_losses(col_stats, scale, 0, k, w, selection).to(out_dtype) if cols else zeros.clone()
    # After every launch of the forward: its one host read (eager, where neither the dtype nor the
    # embeddings' norms rule an overflow out) then waits for the queue instead of holding the
    # per-line kernels back.
    if _flag_read_needed(bound, kind, source, inv_tau, k):
        _overflow_check([row_stats] * rows + [col_stats] * cols, _tau_message(tau, evidence))
    # For the backward's choice of grad_block_kernel variant (_Backward.scaled_variants)
    if not source.from_s and _readable(source.a):
        if bound is not None:
            norm_bound.remember(source.a, source.b, row_stats, col_stats, bound.value())
        else:
            norm_bound.forget(source.a, source.b, row_stats, col_stats)
    return row_losses, col_losses, row_stats, col_stats


def loss_forward(x, y, target_scale, evidence, tau, weights, terms, rows, cols, precision="ieee"):
    _check_embeddings(x, y)
    return _forward(_Source(x, y), target_scale, evidence, tau, weights, terms, rows, cols, x, precision)


def loss_forward_from_similarity(s, target_scale, evidence, tau, weights, terms, rows, cols, precision="ieee"):
    _check_similarity(s)
    return _forward(_Source(s, None), target_scale, evidence, tau, weights, terms, rows, cols, s, precision)


class _Backward:
    """What a backward op needs before its tiles: options and both directions' line constants."""

    def __init__(self, m, n, target_offset, grad_rows, grad_cols, target_scale, row_stats, col_stats, evidence, tau,
                 weights, terms, rows, cols, like, bound: float | None = None):
        _check_strip(m, n, target_offset)
        scale = _check_target_scale(target_scale, n, like)
        row_stats = _check_line_stats(row_stats, "row_stats", m, like)
        col_stats = _check_line_stats(col_stats, "col_stats", n, like)
        up_rows = _check_upstream(grad_rows, "grad_rows", m, rows, like)
        up_cols = _check_upstream(grad_cols, "grad_cols", n, cols, like)
        self.kind, self.inv_tau = _evidence_index(evidence), _inverse_tau(tau)
        self.terms = _Terms(terms)
        w = _Weights(weights, self.terms, like)
        self.row_g = _line_gradients(row_stats, scale, target_offset, n, w, self.terms, up_rows)
        self.col_g = _line_gradients(col_stats, scale, 0, n, w, self.terms, up_cols)
        # exp evidence with float32 element math: which variant of grad_block_kernel does the work
        # is a question, unless the forward's norm bound keeps every line strength small
        self.scaled_p = self.kind == 0 and not _compute_f64(like.dtype) and \
            not _scaled_p_ruled_out(bound, self.inv_tau, max(m, n))
        self._scaled_flag = None
        self._scaled_variants = None

    def scaled_flag(self) -> Tensor:
        """grad_block_kernel's device flag (`_scaled_p_flag`), formed for its first launch only: the
        fused and from-similarity kernels do not read it."""
        if self._scaled_flag is None:
            self._scaled_flag = _scaled_p_flag(self.row_g, self.col_g) if self.scaled_p else \
                torch.zeros(1, dtype=torch.int32, device=self.row_g.device)
        return self._scaled_flag

    def scaled_variants(self) -> tuple[int, ...]:
        """The SCALED_P variants of grad_block_kernel to launch: (0,) without exp evidence in float32
        element math; in eager mode the one variant the device flag selects, read on the host once a
        backward; both where values cannot be read (tracing, fake or meta tensors, CUDA graph capture):
        each launch then finds the flag on the device, and the one that does not match exits at once.
        Both variants at every block doubled the gradient launches of a host-bound step (an H200,
        triton TCL bf16 K = 16384: 112 of its 414 launches, 15.0 ms of GPU idle in 27.6 ms); the read
        is one synchronisation at the backward's start. No read where the forward's norm bound rules
        the scaled variant out (`_scaled_p_ruled_out`: unit-norm embeddings at τ >= 0.027)."""
        if not self.scaled_p:
            return (0,)
        if self._scaled_variants is None:
            flag = self.scaled_flag()
            self._scaled_variants = (int(flag.item()),) if _readable(flag) else (0, 1)
        return self._scaled_variants


# A line strength beyond this makes 1/S subnormal in float32 (and α beyond FLT_MAX needs it)
SCALED_P_ABOVE = 2.0**126


def _scaled_p_ruled_out(bound: float | None, inv_tau: float, n: int) -> bool:
    """Whether the norm bound B of the forward's embeddings (norm_bound.recalled) keeps every line
    strength of exp evidence below SCALED_P_ABOVE: S = Σα <= n·(e^{B/τ} + 1) <= 2n·e^{B/τ}, so
    B/τ + ln 2n < ln SCALED_P_ABOVE (87.3) suffices (unit norms: B/τ = 2/τ and ln 2n <= 11.8 up
    to n = 65536: every τ >= 0.027). Then the flag would be 0 and is neither formed nor read."""
    if bound is None:
        return False
    scaled = bound * inv_tau  # NaN or inf: not ruled out
    return scaled <= math.inf and scaled + math.log(2.0 * n) < math.log(SCALED_P_ABOVE)


def _scaled_p_flag(row_g: Tensor, col_g: Tensor) -> Tensor:
    """int32 (1,): 1 where some line of either direction has a strength S beyond SCALED_P_ABOVE
    (0 < 1/S < 2^-126; 1/S = 0 is a direction not computed, whose constants are all 0), on the
    device, no host read: grad_block_kernel then forms p = α/S from mantissas and exponents."""
    inv_s = torch.cat((row_g[0], col_g[0]))
    return ((inv_s > 0) & (inv_s < 1.0 / SCALED_P_ABOVE)).any().to(torch.int32).reshape(1)


class BackwardPlan:
    """How `loss_backward` computes dx and dy of an (m, n) problem with embedding size D, what that
    costs in GEMM-equivalents (products the size of s = x·yᵀ: each recomputation of s, and G·y,
    Gᵀ·x), and the device memory it adds beyond inputs, outputs, statistics and line constants.

    - "fused" (16-bit inputs, D within one register block, both gradients, sm_90 and newer):
      grad_fused_kernel, one recomputation of each tile for both products, G in registers; dy in
      a float32 buffer (n·D·4 bytes). 3 GEMM-equivalents.
    - "strips": G of `strip` rows at a time (grad_block_kernel, stored in the input dtype), then
      dx[strip] = G·y and, in the same pass, dy += Gᵀ·x[strip] (float32/float64 inputs: into dy
      itself; 16-bit inputs: a float32 dy, and the product's float32 result, where both fit
      ACCUMULATOR_BUDGET_BYTES; one strip of every row: dy one product of it, no accumulator),
      where reading and writing dy again for every further strip costs
      no more than a second pass: its G traffic and RECOMPUTE_BYTES_PER_ELEMENT (strips of at
      least D/3 rows in float32: K = 16384, D = 1024 takes 19 strips of 884 rows, dy moved 2.3 GiB
      against 2 GiB of G and the element work of 2.7e8 elements, ~4 GiB).
      3 GEMM-equivalents (2 for one gradient).
    - "strips, two passes" otherwise: dy from strips of columns, G recomputed. 4 GEMM-equivalents.
      At K = 65536, D = 1024 (strips of 280 bfloat16 rows with s recomputed, 93 with s from strips,
      `s_apart`): dy read and written 234 times would be 117 GiB against 16 GiB for G once more.
    - "blocks" (float32 and float64 inputs, both gradients: dx and dy are their own accumulators):
      G of a (block_rows, block_cols) block at a time, row blocks in order and the column blocks of
      each in order; dx[rows] += G·y[cols] and dy[cols] += Gᵀ·x[rows] (the first product of each
      written). Every gradient row is read and written once per block that adds to it after its
      first: (col_blocks − 1)·m + (row_blocks − 1)·n rows of D in all, which the block shape
      minimises within the budget (`block_shape`), where a strip of full rows (one column block)
      moves dy once per strip. K = 16384, D = 1024, float32: 4 × 5 blocks of 4096 × 3280, 7 rows
      of D a line moved again, against 18 for 19 strips of 884 rows; K = 65536: 19 × 25 blocks of
      3450 × 2624, 42 (where strips took two passes: 4 GEMM-equivalents and the element work
      twice). 3 GEMM-equivalents.
    A strip or block is as large as `strip_budget` allows (what 64 MiB leaves beside the per-line
    buffers and, where dy shares the pass, its float32 accumulator).
    `from_s` (any strip or block plan, where `strips_of_s` says so: similarity_strips): each strip
    or block of s is a cuBLAS product first, stored in place, and grad_block_kernel turns it into
    G there: the same GEMM-equivalents, without the tile kernel's operand re-reads; float32 inputs
    in the same memory. 16-bit inputs (`s_apart`) keep s in a float32 strip beside G's in the input
    dtype (s rounded to 16 bits would move the logits s/τ by up to 2^-9·|s|/τ): 6 bytes an element,
    shorter strips.
    """

    # Float32 inputs take the blocks: dx and dy accumulate in themselves (no extra memory), and the
    # fused kernel's FFMA products in float32 "ieee" spill kilobytes.
    FUSED_DTYPES = (torch.float16, torch.bfloat16)
    BLOCK_DTYPES = (torch.float32, torch.float64)

    @classmethod
    def fuses(cls, dtype: torch.dtype, d: int, need_dx: bool, need_dy: bool, fused: bool = True) -> bool:
        """Whether the plan is "fused" (`fused`: the device has grad_fused_kernel's configuration):
        G in registers, no stored strip and no cuBLAS product."""
        return fused and need_dx and need_dy and dtype in cls.FUSED_DTYPES and _register_d(d) is not None

    def __init__(self, m: int, n: int, d: int, dtype: torch.dtype, need_dx: bool = True, need_dy: bool = True,
                 fused: bool = True, strips_of_s: bool = False):
        size = dtype.itemsize
        acc_size = _output_dtype(dtype).itemsize
        sixteen_bit = dtype in (torch.float16, torch.bfloat16)
        self.block_d = _register_d(d)
        self.dy_in_pass = False
        self.from_s = self.s_apart = False
        self.block_rows = self.block_cols = 0
        if self.fuses(dtype, d, need_dx, need_dy, fused):
            self.kind, self.strip, self.recomputations = "fused", 0, 1
            self.extra_bytes = n * d * acc_size
        elif need_dx and need_dy and dtype in self.BLOCK_DTYPES:
            self.kind, self.strip, self.recomputations = "blocks", 0, 1
            self.block_rows, self.block_cols = block_shape(m, n, strip_budget(max(m, n)) // size, size)
            self.extra_bytes = self.block_rows * aligned_row_length(self.block_cols, size) * size
            self.from_s = strips_of_s
        else:
            longest = max(m, n)
            row_length = aligned_row_length(longest, size)  # a stored strip's row, aligned
            # 16-bit inputs with s from strips: s in a float32 strip of its own beside G's (a
            # row of it aligned within G's row length)
            self.s_apart = strips_of_s and sixteen_bit
            element = size + (4 if self.s_apart else 0)
            accumulator = 2 * n * d * acc_size if sixteen_bit else 0
            shareable = need_dx and need_dy and accumulator <= ACCUMULATOR_BUDGET_BYTES

            def strip_for(reserved: int) -> int:
                return max(1, min(longest, strip_budget(longest, reserved) // (row_length * element)))

            if need_dx and need_dy and strip_for(0) >= m:
                # every row in one strip: dy is a single product of it, written once in its own
                # dtype (cuBLAS rounds the float32 sum once), no accumulator
                accumulator, shareable = 0, True
            self.strip = strip_for(accumulator if shareable else 0)
            # dy in the same pass is read and written again for every strip after the first; a
            # second pass writes and reads G once more and recomputes s: the pass is shared where
            # the first costs no more than the second's G traffic and element work.
            dy_traffic = (triton_cdiv(m, self.strip) - 1) * n * d * acc_size * 2
            self.dy_in_pass = shareable and dy_traffic <= (2 * element + RECOMPUTE_BYTES_PER_ELEMENT) * m * n
            if accumulator and not self.dy_in_pass:
                self.strip = strip_for(0)  # no accumulator held: the strip takes its share
            two_passes = need_dx and need_dy and not self.dy_in_pass
            self.kind = "strips, two passes" if two_passes else "strips"
            self.recomputations = 2 if two_passes else 1
            self.extra_bytes = self.strip * row_length * element + (accumulator if self.dy_in_pass else 0)
            self.from_s = strips_of_s
        self.gemm_equivalents = self.recomputations + int(need_dx) + int(need_dy)


def block_shape(m: int, n: int, elements: int, size: int | None = None) -> tuple[int, int]:
    """(rows, cols) of the G blocks of BackwardPlan "blocks" for an (m, n) problem, at most
    `elements` a block, stored in rows aligned_row_length(cols, size) apart for `size`-byte
    elements (cols apart without a size): of the even splits into row and column blocks that fit, the one that
    reads and writes the fewest gradient rows again, (col_blocks − 1)·m + (row_blocks − 1)·n;
    then the fewest blocks (fewer launches), then the fewest row blocks (dy, beyond L2 at large
    K, is the gradient moved once per row block; dx stays per row block). With a size, cols is a
    multiple of ROW_ALIGN_BYTES too (or n; the last column block is what is left of n, aligned
    where n is): a block's columns are the contiguous, summed-over
    dimension of dx's product, and cuBLAS took its sm_80 align1 kernels for 3277 of them (an H200,
    K = 16384: 8 of the TF32 step's 19.3 ms of kernels), however its rows were aligned."""
    # Traced with dynamic shapes, m and n are SymInts, which a cache cannot hash: int() specialises
    # them, as the search's range() did.
    return _block_shape(int(m), int(n), int(elements), size)


# Cached: the search takes 1.2 ms of host time (CPython), at every backward of the same shape.
@functools.lru_cache(maxsize=256)
def _block_shape(m: int, n: int, elements: int, size: int | None) -> tuple[int, int]:
    align = max(1, ROW_ALIGN_BYTES // size) if size else 1
    best = None
    for col_blocks in range(1, min(n, 4096) + 1):
        cols = min(n, triton_cdiv(triton_cdiv(n, col_blocks), align) * align)
        if triton_cdiv(n, cols) != col_blocks:
            continue  # the same split as a smaller count
        rows = min(m, elements // (aligned_row_length(cols, size) if size else cols))
        if rows < 1:
            continue  # narrower columns may still fit a row
        row_blocks = triton_cdiv(m, rows)
        key = ((col_blocks - 1) * m + (row_blocks - 1) * n, row_blocks * col_blocks, row_blocks)
        if best is None or key < best[0]:
            best = (key, triton_cdiv(m, row_blocks), cols)
    if best is None:  # not even one row of the narrowest columns fits: one element at a time
        return 1, 1
    return best[1], best[2]


def _gradient_block(a: Tensor, b: Tensor, own_g: Tensor, other_g: Tensor, t_off: int, row0: int, rows: int,
                    col0: int, cols: int, g: Tensor, bw: _Backward, precision: str, s: Tensor | None = None) -> None:
    """g[:rows, :cols] = ∂L/∂s of own lines [row0, row0 + rows) against other lines [col0, col0 +
    cols) (grad_block_kernel; a strip where the columns are all of them). `s`: that block of
    s = a·bᵀ, formed already (similarity_strips), read there, G written to g (which may be s
    itself: _strip_buffers, _block_pass); None: the kernel forms s from a and b."""
    n_own, d = a.shape
    n_other = b.shape[0]
    from_s = s is not None
    variant = (bw.kind, tuple(bw.terms.stat_flags().values()), _tf32(a.dtype, precision), from_s)

    def run(config, out):
        # a block of s is read at the block's rows, then overwritten where it is g's own block
        src = s if from_s else a
        row_blocks = triton_cdiv(rows, config.block_m)
        col_blocks = triton_cdiv(cols, config.block_n)
        col_programs = _column_programs(row_blocks, col_blocks, a.device)
        # p = α/S as a product, or (exp evidence) from mantissas and exponents: bw.scaled_variants
        for scaled_p in bw.scaled_variants():
            _launch(kernels.grad_block_kernel, (row_blocks, col_programs),
                    src, b, src.stride(0), src.stride(1), b.stride(0), b.stride(1), out, out.stride(0),
                    out.stride(1), own_g, n_own, other_g, n_other, row0, rows, col0, cols, col_programs,
                    triton_cdiv(col_blocks, col_programs), d, t_off, bw.inv_tau, bw.scaled_flag(),
                    EVIDENCE=bw.kind, **bw.terms.stat_flags(), F64=int(_compute_f64(a.dtype)),
                    TF32=_tf32(a.dtype, precision), BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                    BLOCK_K=max(config.block_k, 16), FROM_S=int(from_s), SCALED_P=scaled_p,
                    num_warps=config.num_warps, num_stages=config.num_stages)

    config = _config("grad", variant, n_other, d, a.dtype, None if _tracing(a) else (lambda c: run(c, g.clone())),
                     a.device)
    run(config, g)


def _accumulate_product(out: Tensor, g: Tensor, b: Tensor) -> None:
    """out += g·b: in place for operands of out's dtype; 16-bit operands on tensor cores with a
    float32 result (cuBLAS), then added."""
    if g.dtype == out.dtype:
        out.addmm_(g, b)
    elif g.is_cuda:
        out.add_(torch.mm(g, b, out_dtype=out.dtype))
    else:
        out.addmm_(g.to(out.dtype), b.to(out.dtype))


def follows_tf32_switch(dtype: torch.dtype) -> bool:
    """Whether cuBLAS products of this dtype take torch's TF32 switch (float32 alone): the ops set
    it around them as matmul_precision says (_float32_products)."""
    return dtype == torch.float32


def _float32_products(like: Tensor, precision: str):
    """cuBLAS float32 products as matmul_precision says (TF32 or IEEE) on CUDA tensors
    (backends.matmul_precision), also while a CUDA graph is captured (cuBLAS takes the switch
    when the call is recorded); nothing to set on the CPU (IEEE products). Never traced: the
    float32 backward stays an opaque op under torch.compile (registration._cublas_products) and
    the forward's strips are eager launches only (similarity_strips)."""
    if like.device.type != "cuda" or not follows_tf32_switch(like.dtype):
        return contextlib.nullcontext()
    return matmul_precision(precision)


def _grad_strips(x: Tensor, y: Tensor, t_off: int, bw: _Backward, plan: BackwardPlan, need_dx: bool,
                 need_dy: bool, precision: str) -> tuple[Tensor, Tensor]:
    """dx, dy through stored strips of G (BackwardPlan "strips"): the products are plain GEMMs
    (cuBLAS, at the input's precision: float32 ones as `precision` says) with their accumulators in
    registers, and the strips are taken in order, so every sum is the same on every run."""
    with _float32_products(x, precision):
        return _strip_passes(x, y, t_off, bw, plan, need_dx, need_dy, precision)


def _strip_passes(x: Tensor, y: Tensor, t_off: int, bw: _Backward, plan: BackwardPlan, need_dx: bool,
                  need_dy: bool, precision: str) -> tuple[Tensor, Tensor]:
    m, d = x.shape
    n = y.shape[0]
    # Contiguous outputs: each strip's product is written in place (out=) into its rows.
    dx = torch.empty((m, d), dtype=x.dtype, device=x.device) if need_dx else x.new_empty(0)
    dy = torch.empty((n, d), dtype=y.dtype, device=y.device) if need_dy else y.new_empty(0)
    if plan.kind == "blocks":
        _block_pass(x, y, t_off, bw, plan, dx, dy, precision)
        return dx, dy
    if need_dx:
        g, s = _strip_buffers(plan, min(plan.strip, m), n, x.dtype, x.device)
        dy_acc = None
        single = plan.dy_in_pass and plan.strip >= m  # dy one product of the one strip
        if plan.dy_in_pass and not single:
            dy_acc = dy.zero_() if dy.dtype == _output_dtype(y.dtype) else torch.zeros(
                (n, d), dtype=_output_dtype(y.dtype), device=y.device)
        for row0 in range(0, m, plan.strip):
            rows = min(plan.strip, m - row0)
            strip, s_strip = g[:rows], s[:rows]
            if plan.from_s:
                similarity_product(x[row0:row0 + rows], y, s_strip)
            _gradient_block(x, y, bw.row_g, bw.col_g, t_off, row0, rows, 0, n, strip, bw, precision,
                            s_strip if plan.from_s else None)
            torch.mm(strip, y, out=dx[row0:row0 + rows])
            if single:
                torch.mm(strip.t(), x, out=dy)
            if dy_acc is not None:
                _accumulate_product(dy_acc, strip.t(), x[row0:row0 + rows])
        if dy_acc is not None and dy_acc is not dy:
            dy.copy_(dy_acc)
        del g, s, strip, s_strip, dy_acc  # freed before the column pass allocates its strips: one at a time
    if need_dy and not plan.dy_in_pass:
        g, s = _strip_buffers(plan, min(plan.strip, n), m, y.dtype, y.device)
        for col0 in range(0, n, plan.strip):
            cols = min(plan.strip, n - col0)
            strip, s_strip = g[:cols], s[:cols]
            if plan.from_s:
                similarity_product(y[col0:col0 + cols], x, s_strip)
            _gradient_block(y, x, bw.col_g, bw.row_g, -t_off, col0, cols, 0, m, strip, bw, precision,
                            s_strip if plan.from_s else None)
            torch.mm(strip, x, out=dy[col0:col0 + cols])
    return dx, dy


def _strip_buffers(plan: BackwardPlan, rows: int, cols: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """(G's strip, s's strip) of a strips plan: s in a float32 strip of its own where the plan keeps
    it apart (16-bit inputs: BackwardPlan.s_apart), else G's strip itself (s formed there, then
    overwritten by G)."""
    g = aligned_matrix(rows, cols, dtype, device)
    return g, aligned_matrix(rows, cols, torch.float32, device) if plan.s_apart else g


def _block_pass(x: Tensor, y: Tensor, t_off: int, bw: _Backward, plan: BackwardPlan, dx: Tensor, dy: Tensor,
                precision: str) -> None:
    """dx and dy through stored blocks of G (BackwardPlan "blocks"), row blocks in order and the
    column blocks of each in order: dx[rows] = Σ G·y[cols] and dy[cols] = Σ Gᵀ·x[rows], each sum
    in block order (the first product written, the others added by cuBLAS), the same on every run."""
    m, n = x.shape[0], y.shape[0]
    g = aligned_matrix(min(plan.block_rows, m), min(plan.block_cols, n), x.dtype, x.device)
    for row0 in range(0, m, plan.block_rows):
        rows = min(plan.block_rows, m - row0)
        for col0 in range(0, n, plan.block_cols):
            cols = min(plan.block_cols, n - col0)
            block = g[:rows, :cols]  # rows ROW_ALIGN_BYTES-aligned apart: cuBLAS writes it in place (out=)
            if plan.from_s:
                similarity_product(x[row0:row0 + rows], y[col0:col0 + cols], block)
            _gradient_block(x, y, bw.row_g, bw.col_g, t_off, row0, rows, col0, cols, block, bw, precision,
                            block if plan.from_s else None)
            if col0 == 0:
                torch.mm(block, y[col0:col0 + cols], out=dx[row0:row0 + rows])
            else:
                dx[row0:row0 + rows].addmm_(block, y[col0:col0 + cols])
            if row0 == 0:
                torch.mm(block.t(), x[row0:row0 + rows], out=dy[col0:col0 + cols])
            else:
                dy[col0:col0 + cols].addmm_(block.t(), x[row0:row0 + rows])


def _register_d(d: int) -> int | None:
    """The one register block that holds D (a power of two >= 16), or None where D is wider than
    a gradient kernel keeps in registers."""
    block = max(16, configs.k_bucket(d))
    limit = configs.INTERPRETER_MAX_REGISTER_D if configs.interpreting() else configs.MAX_REGISTER_D
    return block if block <= limit else None


def _grad_fused(x: Tensor, y: Tensor, t_off: int, bw: _Backward, precision: str,
                block_d: int) -> tuple[Tensor, Tensor]:
    """dx and dy from one recomputation of each tile (kernels.grad_fused_kernel; D in one register
    block of block_d, BackwardPlan.block_d): dx stored once per row block in the input dtype, dy
    added in program order into a float32 buffer and rounded to the input dtype once at the end."""
    m, d = x.shape
    n = y.shape[0]
    acc_dtype = _output_dtype(x.dtype)
    variant = (bw.kind, tuple(bw.terms.stat_flags().values()), _tf32(x.dtype, precision))

    def run(config, dx, dy):
        turns = torch.zeros(triton_cdiv(n, config.block_n), dtype=torch.int32, device=x.device)
        _launch(kernels.grad_fused_kernel, (triton_cdiv(m, config.block_m),),
                x, y, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                dx, dx.stride(0), dx.stride(1), dy, dy.stride(0), dy.stride(1), turns,
                bw.row_g, m, bw.col_g, n, d, t_off, bw.inv_tau,
                EVIDENCE=bw.kind, **bw.terms.stat_flags(), F64=int(_compute_f64(x.dtype)),
                TF32=_tf32(x.dtype, precision), BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                BLOCK_K=max(config.block_k, 16), BLOCK_D=block_d, num_warps=config.num_warps,
                num_stages=config.num_stages)

    def outputs():
        return torch.empty_like(x), torch.zeros((n, d), dtype=acc_dtype, device=y.device)

    config = _config("grad_fused", variant, n, d, x.dtype, None if _tracing(x) else (lambda c: run(c, *outputs())),
                     x.device)
    dx, dy = outputs()
    run(config, dx, dy)
    return dx, dy.to(y.dtype) if dy.dtype != y.dtype else dy


def loss_backward(grad_rows, grad_cols, x, y, target_scale, row_stats, col_stats, evidence, tau, weights, terms, rows,
                  cols, target_offset, output_mask, precision="ieee"):
    _check_embeddings(x, y)
    m, n = x.shape[0], y.shape[0]
    # The bound of a loss forward (square, both directions' statistics its own); not a strip's of
    # line_stats, whose column statistics the caller sums over every strip's rows
    square = m == n and target_offset == 0
    bound = norm_bound.recalled(x, y, row_stats, col_stats) if square and _readable(x) else None
    bw = _Backward(m, n, target_offset, grad_rows, grad_cols, target_scale, row_stats, col_stats, evidence, tau,
                   weights, terms, rows, cols, x, bound)
    plan = BackwardPlan(m, n, x.shape[1], x.dtype, bool(output_mask[0]), bool(output_mask[1]),
                        configs.has_default("grad_fused", x.device),
                        similarity_strips(x.dtype, x.shape[1], precision, x))
    if plan.kind == "fused":
        return _grad_fused(x, y, target_offset, bw, precision, plan.block_d)
    return _grad_strips(x, y, target_offset, bw, plan, bool(output_mask[0]), bool(output_mask[1]), precision)


def loss_backward_from_similarity(grad_rows, grad_cols, s, target_scale, row_stats, col_stats, evidence, tau, weights,
                                  terms, rows, cols):
    _check_similarity(s)
    _check_square(s.shape[0], s.shape[1])
    k = s.shape[0]
    bw = _Backward(k, k, 0, grad_rows, grad_cols, target_scale, row_stats, col_stats, evidence, tau, weights, terms,
                   rows, cols, s)
    ds = torch.empty((k, k), dtype=s.dtype, device=s.device)
    f64 = _compute_f64(s.dtype)

    def run(config, out):
        _launch(kernels.grad_similarity_kernel, (triton_cdiv(k, config.block_m), triton_cdiv(k, config.block_n)),
                s, s.stride(0), s.stride(1), out, out.stride(0), out.stride(1), bw.row_g, k, bw.col_g, k, bw.inv_tau,
                EVIDENCE=bw.kind, **bw.terms.stat_flags(), F64=int(f64), BLOCK_M=config.block_m,
                BLOCK_N=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages)

    variant = (bw.kind, tuple(bw.terms.stat_flags().values()))
    config = _config("grad_similarity", variant, k, 0, s.dtype,
                     None if _tracing(s) else (lambda c: run(c, torch.empty_like(ds))), s.device)
    run(config, ds)
    return ds


def _opinion(source: _Source, evidence: str, tau: float, out_dtype: torch.dtype, precision: str):
    _value(source.n_own >= 1 and source.n_other >= 1, "opinions need at least one query and candidate")
    kind, inv_tau = _evidence_index(evidence), _inverse_tau(tau)
    longest = max(source.n_own, source.n_other)
    bound = _norm_bound(source, kind, inv_tau, longest)
    row_stats, col_stats = _line_statistics(source, 0, kind, inv_tau, None, False, True, True, precision)
    if _flag_read_needed(bound, kind, source, inv_tau, longest):
        _overflow_check([row_stats, col_stats], _tau_message(tau, evidence))
    # No targets: rest is the whole sum S.
    return row_stats[1].log().to(out_dtype), col_stats[1].log().to(out_dtype)


def opinion(x, y, evidence, tau, precision="ieee"):
    _check_embeddings(x, y)
    return _opinion(_Source(x, y), evidence, tau, _output_dtype(x.dtype), precision)


def opinion_from_similarity(s, evidence, tau, precision="ieee"):
    _check_similarity(s)
    return _opinion(_Source(s, None), evidence, tau, _output_dtype(s.dtype), precision)
