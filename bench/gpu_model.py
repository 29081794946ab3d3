#!/usr/bin/env python3
"""GPU performance model of one training step (forward + backward) from the code: no GPU needed.

    python bench/gpu_model.py [--out bench/results/gpu_model.md] [--device h100-sxm h200 a100-sxm]
                              [--backend cuda triton] [--loss tcl uml duq] [--precision ieee tf32 bf16]
                              [--k 4096 16384 65536] [--d 512 1024] [--ceilings FILE] [--profile FILE]
    python bench/gpu_model.py --measure-ceilings ceilings.json          # on a GPU: the real ceilings
    python bench/gpu_model.py --ceilings ceilings.json --compare cuda_*.json   # measured beside predicted

What a step does is derived from the code, per backend:
- CUDA (csrc/cuda/evidential_cuda.cpp): the forward's strips of `plan_strips` and the backward's
  blocks of `plan_gradient_blocks` (csrc/cuda/strip_plan.h, ported here with its constants read
  from the header), and per strip or block the cuBLAS products (the backward recomputes s), the
  element kernels, the partial-sum reductions; the K×D buffers (dy in float32 for bfloat16 inputs,
  or where that buffer exceeds the budget a second backward sweep over sᵀ that writes dy once; dx[r]
  read and written once per column block), the launches of the per-line work and, where
  `overflow_possible` says an overflow is possible, the overflow check's norm bound read ahead,
  which rules it out for the model's unit-norm inputs (no flag read).
- Triton (evidential_ops/triton_backend/launch.py): the one-pass or two-pass forward chosen as
  `_line_statistics` chooses it (PARTIAL_BUDGET_BYTES, the SM count), the tile sizes of
  configs.DEFAULTS_BY_ARCH, the backward as `launch.BackwardPlan` plans it (grad_fused_kernel, or
  G blocks (float32) or strips (16-bit, in one or two passes) from grad_block_kernel with cuBLAS
  products: its blocks or strips, GEMM-equivalents and extra bytes), each tile's operand loads,
  the partial-sum and dx, dy read-modify-writes; the fused kernel's per-element counts are taken as grad_block_kernel's
  (the profile compiles the float32 input path).
- Element instructions per element, by class, and registers: the static SASS profile of the
  compiled kernels (bench/static_profile.py's JSON: reused when newer than the sources, else
  profiled again; --profile names one).

Time of a kernel (all its launches together) = max(GEMM + element time, DRAM bytes / HBM bandwidth,
L2 bytes / L2 bandwidth) + launches × launch latency + host reads × sync latency; a step is the sum
over its kernels. Assumptions (also printed in the report):
- GEMM flops at the precision's ceiling (cuBLAS or Triton alike): "ieee" float32 on the FP32 FMA
  pipes (no tensor cores), "tf32" and "bf16" at the dense tensor-core rate; a product's operands
  move once (ideal tiling) except where the code re-reads them (strips, tiles: counted).
- Element time = elements × cycles per element / (SMs × clock); cycles per element is the most
  loaded of: issue (every instruction, 4 warp schedulers = 128 lanes/clk/SM), FP32, FP64, MUFU
  (16/clk/SM), integer, conversion, load/store, each at its rate per SM per clock (CUDA C
  Programming Guide, arithmetic instruction throughput), from the static counts of the hot loop
  (both sides of a branch: an upper bound where the code branches; the CUDA rows are the
  instantiation the loss runs, its evidence map and float32 s and ∂L/∂s compiled in; bfloat16
  inputs' backward stores ∂L/∂s as bfloat16 instead, one conversion per element more). Full occupancy is
  assumed to hide latency; the Triton element counts are those of the float32 input path.
- A fused kernel's GEMM and element work add up (same SMs, no overlap assumed); compute and memory
  traffic overlap (the max).
- Bytes: DRAM for what must come from device memory (an operand larger than L2 comes again for
  each wave of resident programs); L2 for re-reads of data a concurrent wave shares, and for
  read-modify-writes whose working set fits in L2; a launch with fewer blocks than SMs gets
  blocks/SMs of the bandwidth.
- Launch latency and host syncs are counted in full (back-to-back launches of long kernels hide
  most of it: an upper bound); the per-op Python and autograd bookkeeping is not modelled.
- Extra device memory: the buffers the op code allocates (workspace, statistics, line constants,
  gradient accumulators and casts), peak over the step, and beyond the two K×D gradients.

Device ceilings default to datasheet figures (`DEVICES`, cited there); `--ceilings FILE` (JSON, as
`--measure-ceilings` writes on a GPU: a large device copy, an L2-resident copy, a large cuBLAS GEMM
per precision, an empty launch, a host read) overrides them. Writes OUT (markdown) and OUT with
.json; exits 0 without writing, saying so, where no static profile can be had (no nvcc or triton).
`make gpu-model` regenerates bench/results/gpu_model.md and .json (part of `make test`).
"""

from __future__ import annotations

import copy
import glob
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import static_profile  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "gpu_model.md")
DEFAULT_PROFILE = os.path.join(HERE, "results", "static_profile.json")
STRIP_PLAN_H = os.path.join(ROOT, "csrc", "cuda", "strip_plan.h")
MIB = 2**20

# ------------------------------------------------------------------------------ device ceilings

# Datasheet figures. H100 SXM5 and H200 SXM: NVIDIA H100 / H200 Tensor Core GPU datasheets (FP32
# 67 TFLOP/s, TF32 Tensor Core 494.7 TFLOP/s dense (989 with sparsity), BF16 989.4 TFLOP/s dense
# (1979 with sparsity); HBM3 3.35 TB/s (H100 80 GB), HBM3e 4.8 TB/s (H200 141 GB)); 132 SMs, 50 MB
# L2 (H100 architecture whitepaper; the H200 is the same GH100 die); 1.98 GHz boost, the clock the
# FP32 figure implies (132 SMs × 128 FP32 lanes × 2 × 1.98 GHz = 67 TFLOP/s). A100 SXM4 80 GB: A100
# datasheet (FP32 19.5, TF32 156 dense, BF16 312 dense TFLOP/s, HBM2e 2.039 TB/s), 108 SMs, 40 MB
# L2, 1.41 GHz boost (A100 whitepaper). Per-SM rates per clock: CUDA C Programming Guide,
# "Arithmetic Instructions" throughput table (compute capability 8.0 and 9.0).
# Not datasheet figures (no vendor number exists): L2 bandwidth, launch and sync latency; they are
# assumptions of the order microbenchmarks report, flagged as such in the report, and the first
# thing --measure-ceilings replaces.
DEVICES = {
    "h100-sxm": dict(
        name="NVIDIA H100 SXM5 80 GB", arch=90, sms=132, clock_ghz=1.98, hbm_tbs=3.35, l2_mib=50, l1_kib=256,
        gemm_tflops={"ieee": 67.0, "tf32": 494.7, "bf16": 989.4},
        rates=dict(issue=128, fp32=128, fp64=64, mufu=16, int=64, conv=16, mem=32),
        regs_per_sm=65536, threads_per_sm=2048, blocks_per_sm=32,
        l2_tbs=7.0, launch_us=3.0, sync_us=20.0, source="datasheet"),
    "a100-sxm": dict(
        name="NVIDIA A100 SXM4 80 GB", arch=80, sms=108, clock_ghz=1.41, hbm_tbs=2.039, l2_mib=40, l1_kib=192,
        gemm_tflops={"ieee": 19.5, "tf32": 156.0, "bf16": 312.0},
        rates=dict(issue=128, fp32=64, fp64=32, mufu=16, int=64, conv=16, mem=32),
        regs_per_sm=65536, threads_per_sm=2048, blocks_per_sm=32,
        l2_tbs=4.5, launch_us=3.0, sync_us=20.0, source="datasheet"),
}
# The H200 is the H100's GH100 die with HBM3e: only the memory differs.
DEVICES["h200"] = dict(DEVICES["h100-sxm"], name="NVIDIA H200 SXM 141 GB", hbm_tbs=4.8)
DEVICES = {name: DEVICES[name] for name in ("h100-sxm", "h200", "a100-sxm")}  # the report's order
MEASURABLE = ("hbm_tbs", "l2_tbs", "gemm_tflops", "launch_us", "sync_us")

# The step's inputs per precision (bench/device_bench.py PRECISIONS): bytes of x, y and the
# ceiling their products run at.
PRECISIONS = {"ieee": dict(input_bytes=4), "tf32": dict(input_bytes=4), "bf16": dict(input_bytes=2)}
TARGETS = {"cuda": dict(ratio=3.0, beyond_mib=128.0), "triton": dict(ratio=2.0, beyond_mib=64.0)}
TARGET_K, TARGET_D, MEMORY_K = 16384, 1024, 65536
TERM_NAMES = ("gemm", "element", "dram", "l2", "launch", "sync")


def load_ceilings(device: str, path: str | None = None) -> dict:
    """The ceilings of `device` (a DEVICES key), with those a ceilings file names (JSON: any of
    MEASURABLE, gemm_tflops per precision) put in their place; `source` says which."""
    ceilings = copy.deepcopy(DEVICES[device])
    ceilings["key"] = device
    ceilings["measured"] = []
    if path:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
        for key in MEASURABLE:
            if key not in given:
                continue
            if key == "gemm_tflops":
                ceilings[key].update({p: float(v) for p, v in given[key].items() if p in PRECISIONS})
                ceilings["measured"] += [f"gemm_tflops.{p}" for p in given[key] if p in PRECISIONS]
            else:
                ceilings[key] = float(given[key])
                ceilings["measured"].append(key)
        ceilings["source"] = f"{os.path.basename(path)} ({given.get('device', 'measured')}), datasheet otherwise"
    return ceilings


# ------------------------------------------------------------------------------ kernel accounting


@dataclass
class Kernel:
    """One kernel of a step, all its launches together: the work it does and what it moves."""

    phase: str                 # forward, backward
    name: str
    launches: int = 1
    flops: float = 0.0         # GEMM flops at the step's precision
    elements: float = 0.0      # element evaluations (s entries)
    cycles_per_element: float = 0.0  # SM cycles per element (the most loaded pipe)
    dram: dict = field(default_factory=dict)   # what -> bytes from/to device memory
    l2: dict = field(default_factory=dict)     # what -> bytes through L2 only
    fill: float = 1.0          # fraction of the SMs one launch occupies
    syncs: int = 0             # host reads of a device value
    note: str = ""

    def terms(self, c: dict, precision: str) -> dict:
        """Seconds per term, the kernel's time (`total`) and the term that binds it."""
        t = dict(gemm=self.flops / (c["gemm_tflops"][precision] * 1e12),
                 element=self.elements * self.cycles_per_element / (c["sms"] * c["clock_ghz"] * 1e9),
                 dram=sum(self.dram.values()) / (c["hbm_tbs"] * 1e12 * self.fill),
                 l2=sum(self.l2.values()) / (c["l2_tbs"] * 1e12 * self.fill),
                 launch=self.launches * c["launch_us"] * 1e-6, sync=self.syncs * c["sync_us"] * 1e-6)
        compute = t["gemm"] + t["element"]
        busy = max(compute, t["dram"], t["l2"])
        t["total"] = busy + t["launch"] + t["sync"]
        options = {"gemm" if t["gemm"] >= t["element"] else "element": compute, "dram": t["dram"], "l2": t["l2"]}
        bound = max(options, key=options.get)
        t["bound"] = bound if busy >= t["launch"] + t["sync"] else ("sync" if t["sync"] > t["launch"] else "launch")
        return t


def step_time(kernels: list, c: dict, precision: str) -> dict:
    """Predicted seconds of a step (Σ kernel times), each term summed over the kernels (unmaxed:
    what that term alone would cost) and the largest of them."""
    out = {name: 0.0 for name in TERM_NAMES}
    out["total"] = 0.0
    for k in kernels:
        t = k.terms(c, precision)
        for name in (*TERM_NAMES, "total"):
            out[name] += t[name]
    out["largest"] = max(TERM_NAMES, key=lambda n: out[n])
    return out


def pipe_cycles(per_element: dict, rates: dict) -> tuple:
    """(cycles per element per SM, binding pipe, {pipe: cycles}) from per-element instruction counts
    by static_profile class: issue takes every instruction, the pipes their own classes."""
    cycles = dict(issue=per_element["total"] / rates["issue"])
    for pipe in ("fp32", "fp64", "mufu", "int", "conv", "mem"):
        cycles[pipe] = per_element.get(pipe, 0.0) / rates[pipe]
    bound = max(cycles, key=cycles.get)
    return cycles[bound], bound, cycles


def occupancy(registers: int, threads: int, c: dict) -> int:
    """Resident blocks per SM by registers (allocated per warp in units of 256), threads and the
    block limit; shared memory is not known statically here and not counted."""
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = c["regs_per_sm"] // (per_warp * math.ceil(threads / 32))
    return max(1, min(by_regs, c["threads_per_sm"] // threads, c["blocks_per_sm"]))


# ---------------------------------------------------------------------------- static profile


def model_inputs() -> list:
    """What the model reads, sorted: the CUDA kernels and the kernel math they compile
    (csrc/kernels/), the Triton backend, the benchmark helpers, this script and the profiler."""
    return sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*")) +
                  glob.glob(os.path.join(ROOT, "csrc", "kernels", "*.h")) +
                  glob.glob(os.path.join(ROOT, "evidential_ops", "triton_backend", "*.py")) +
                  [os.path.join(ROOT, "evidential_ops", "benchmark.py"), __file__, static_profile.__file__])


def _source_mtime() -> float:
    return max(os.path.getmtime(p) for p in model_inputs())


def load_profile(path: str | None = None, refresh_to: str = DEFAULT_PROFILE) -> dict | None:
    """The static profile: `path` if given; else bench/results/static_profile.json when it is newer
    than the kernel sources (make static-profile just wrote it); else a fresh profile written
    there. None where none can be had (no compiler)."""
    if path:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if os.path.exists(refresh_to) and os.path.getmtime(refresh_to) > _source_mtime():
        with open(refresh_to, encoding="utf-8") as handle:
            return json.load(handle)
    print("gpu-model: static profile missing or older than the kernel sources: profiling (about 30 s)")
    static_profile.main(["--out", os.path.splitext(refresh_to)[0] + ".md"])
    if not os.path.exists(refresh_to) or os.path.getmtime(refresh_to) <= _source_mtime():
        return None
    with open(refresh_to, encoding="utf-8") as handle:
        return json.load(handle)


def profile_row(profile: dict, backend: str, method: str, direction: str, variant: str = "tile") -> dict | None:
    """The profile's row for a kernel: for cuda the instantiation the loss runs (its evidence map,
    float32 s and ∂L/∂s compiled in), for triton the default configuration sweeping its own tiles
    (variant "tile") or stored strips of s ("strip"; a profile without those rows gives the tile
    kernel's)."""
    for row in profile["rows"]:
        if (row["backend"], row["method"], row["direction"], row.get("variant", "tile")) == \
                (backend, method, direction, variant) and row.get("hot"):
            return row
    return profile_row(profile, backend, method, direction) if variant != "tile" else None


def per_element(row: dict) -> dict:
    """Instructions per element by class in the row's hot loop, plus its share of the stage
    around it (the CUDA forward's warp reduction: static_profile.stage_share)."""
    return {k: static_profile.per_element(row, k) for k in row["hot"]["own"]}


# ------------------------------------------------------------------------ CUDA strip plan (port)


def strip_constants(path: str = STRIP_PLAN_H) -> dict:
    """The `constexpr` integers of strip_plan.h (kThreads, kStatSlots, kTargetBlocks, ...)."""
    found = static_profile.source_ints(path)
    needed = ("kThreads", "kStatSlots", "kTargetBlocks", "kMinGroupRows", "kMaxRowGroups", "kAlignment",
              "kScalarBytes", "kDefaultWorkspaceMiB", "kColumnAlignment")
    missing = [n for n in needed if n not in found]
    if missing:
        raise RuntimeError(f"strip_plan.h no longer defines {missing}: update bench/gpu_model.py's port")
    return found


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def row_groups_for(rows: int, col_blocks: int, k: dict) -> int:
    """strip_plan.h row_groups_for."""
    wanted = _ceil_div(k["kTargetBlocks"], max(col_blocks, 1))
    most = max(1, rows // k["kMinGroupRows"])
    return max(1, min(wanted, most, k["kMaxRowGroups"]))


def plan_strips(m: int, n: int, tile_bytes: int, half_bytes: int, partials: bool, scalars: bool, budget: int,
                k: dict | None = None) -> dict:
    """strip_plan.h plan_strips, line for line: strip_rows, strips, col_blocks, row_groups and the
    workspace's total_bytes (and its sub-buffer sizes)."""
    k = k or strip_constants()
    align = lambda b: _ceil_div(b, k["kAlignment"]) * k["kAlignment"]  # noqa: E731
    col_blocks = _ceil_div(n, k["kThreads"])
    stat_bytes = k["kStatSlots"] * 8
    max_groups = row_groups_for(m, col_blocks, k)
    if partials:
        max_groups = max(1, min(max_groups, budget // 2 // (stat_bytes * n)))
    fixed = (align(max_groups * stat_bytes * n) if partials else 0) + (k["kScalarBytes"] if scalars else 0) \
        + 4 * k["kAlignment"]
    per_row = n * (tile_bytes + half_bytes) + (col_blocks * stat_bytes if partials else 0)
    rows = m
    if per_row > 0:
        rows = min(m, max(1, (budget - fixed) // per_row))
        rows = _ceil_div(m, _ceil_div(m, rows))
    row_groups = min(row_groups_for(rows, col_blocks, k), max_groups)
    sizes = dict(tile=rows * n * tile_bytes, half=rows * n * half_bytes,
                 row_partial=col_blocks * stat_bytes * rows if partials else 0,
                 col_partial=row_groups * stat_bytes * n if partials else 0,
                 scalars=k["kScalarBytes"] if scalars else 0)
    total = max(sum(align(b) for b in sizes.values()), k["kAlignment"])
    return dict(strip_rows=rows, strips=_ceil_div(m, rows), col_blocks=col_blocks, row_groups=row_groups,
                total_bytes=total, sizes=sizes)


def square_side(element_bytes: int, row_bytes: int, room: int) -> int:
    """strip_plan.h square_side: the largest r >= 1 with r·r·element_bytes + r·row_bytes <= room."""
    if element_bytes <= 0:
        return room
    r = 1
    while r < room and (2 * r) ** 2 * element_bytes + 2 * r * row_bytes <= room:
        r *= 2
    step = r // 2
    while step >= 1:
        if (r + step) ** 2 * element_bytes + (r + step) * row_bytes <= room:
            r += step
        step //= 2
    return r


def plan_gradient_blocks(m: int, n: int, d: int, tile_bytes: int, half_bytes: int, scalars: bool,
                         accumulator_bytes: int, budget: int, k: dict | None = None) -> dict:
    """strip_plan.h plan_gradient_blocks, line for line: the backward's blocks (block_rows,
    row_blocks, block_cols, col_blocks) and the workspace's total_bytes (and its sub-buffer sizes)."""
    k = k or strip_constants()
    align = lambda b: _ceil_div(b, k["kAlignment"]) * k["kAlignment"]  # noqa: E731
    element = tile_bytes + half_bytes
    room = max(budget - ((k["kScalarBytes"] if scalars else 0) + 4 * k["kAlignment"]), 0)
    accumulator_row = d * accumulator_bytes

    def rows_for(cols: int) -> int:
        per_row = cols * element + (accumulator_row if cols < n else 0)
        if per_row <= 0:
            return m
        rows = min(m, max(1, room // per_row))
        return _ceil_div(m, _ceil_div(m, rows))

    cols = n
    if element > 0 and room > 0:
        side = square_side(element, accumulator_row, room)
        step = k["kColumnAlignment"]
        widest = side // step * step if side >= step else side
        even = _ceil_div(n, _ceil_div(n, widest))
        cut = _ceil_div(even, step) * step if side >= step else even
        if n > side and (n * element > room or _ceil_div(m, rows_for(cut)) < _ceil_div(m, rows_for(n))):
            cols = cut
    rows = rows_for(cols)
    col_blocks = _ceil_div(n, cols)
    sizes = dict(tile=rows * cols * tile_bytes, half=rows * cols * half_bytes,
                 accumulator=rows * accumulator_row if col_blocks > 1 else 0,
                 scalars=k["kScalarBytes"] if scalars else 0)
    total = max(sum(align(b) for b in sizes.values()), k["kAlignment"])
    return dict(block_rows=rows, row_blocks=_ceil_div(m, rows), block_cols=cols, col_blocks=col_blocks,
                total_bytes=total, sizes=sizes)


def norm_bound_kernel(k: int, d: int, e_in: int, evidence: str, tau: float, rule: str) -> "Kernel":
    """The overflow check of a forward whose dtype leaves an overflow possible, for the model's
    unit-norm inputs (SPEC §1 "The overflow check without a wait"): the norm bound B read ahead
    (two row norms and their maxima, a product, a copy to pinned memory: 6 launches, x and y read
    once) rules it out, and the flag is not read: no wait."""
    return Kernel("forward", "norm bound B = 2·max‖x‖·max‖y‖ read ahead (no flag read)", 6,
                  dram={"x and y read": 2 * k * d * e_in},
                  note=f"{evidence} evidence, τ = {tau}: {rule}; B/τ = {2 / tau:g}")


def cuda_overflow_possible(evidence: str, value_bytes: int, inv_tau: float, n: int) -> bool:
    """evidential_cuda.cpp overflow_possible (value type float32 or float64)."""
    largest = (1.7976931348623157e308 if value_bytes == 8 else 3.4028234663852886e38) * inv_tau
    if evidence == "exp":
        return largest + math.log(n) > 709.0
    if evidence in ("relu", "softplus"):
        return n * (largest + 2.0) > 1e307
    return False


# ------------------------------------------------------------------------------- loss cases


def loss_cases() -> dict:
    """{name: (evidence, tau, terms enabled)} from evidential_ops.benchmark.LOSS_CASES (the cases the
    device benchmark times)."""
    from evidential_ops.benchmark import LOSS_CASES

    return {name: (case.evidence, case.tau, tuple(case.weights)) for name, case in LOSS_CASES.items()}


# ------------------------------------------------------------------------------ CUDA backend


def cuda_step(loss: str, precision: str, k: int, d: int, c: dict, profile: dict, budget: int | None = None) -> dict:
    """Kernels and extra memory of a CUDA step (loss_forward + loss_backward from embeddings)."""
    sp = strip_constants()
    budget = budget or sp["kDefaultWorkspaceMiB"] * MIB
    evidence, tau, terms = loss_cases()[loss]
    e_in = PRECISIONS[precision]["input_bytes"]
    e_prod = 4  # the products of float32 and half inputs are float32 (evidential_cuda.cpp product_type)
    bf16 = precision == "bf16"
    slots = static_profile.enabled_slots("kl" in terms, "fmse" in terms, "logdet" in terms)
    fwd_row, bwd_row = profile_row(profile, "cuda", loss, "fwd"), profile_row(profile, "cuda", loss, "bwd")
    fwd_cycles, fwd_pipe, _ = pipe_cycles(per_element(fwd_row), c["rates"])
    bwd_cycles, bwd_pipe, _ = pipe_cycles(per_element(bwd_row), c["rates"])
    kk, kd = k * k, k * d
    out = []
    # ---- forward
    f = plan_strips(k, k, e_prod, 0, True, False, budget, sp)
    rows, strips = f["strip_rows"], f["strips"]
    out.append(Kernel("forward", "zero line statistics (7×K float64, rows and columns)", 2,
                      dram={"statistics": 2 * 7 * k * 8}))
    out.append(Kernel("forward", "similarity GEMM (cuBLAS, per strip)", strips, flops=2.0 * kk * d,
                      dram={"x strips": kd * e_in, "y re-read per strip": strips * kd * e_in,
                            "s strip written (float32)": kk * e_prod},
                      note=f"{strips} strips of {rows} rows"))
    out.append(Kernel("forward", "forward_stats_kernel (per strip)", strips, elements=kk,
                      cycles_per_element=fwd_cycles,
                      dram={"s strip read back": kk * e_prod,
                            "row partials written": f["col_blocks"] * slots * k * 8,
                            "column partials written": strips * f["row_groups"] * slots * k * 8},
                      note=f"{fwd_cycles:.2f} cycles/element ({fwd_pipe}); grid {f['col_blocks']}×{f['row_groups']}"))
    # forward_kernels.cu reduce_partials, one launch for both directions: a block per 32 rows and
    # statistic slot, and per 256 columns and slot
    reduce_blocks = (_ceil_div(rows, 32) + _ceil_div(k, 256)) * slots
    out.append(Kernel("forward", "reduce_partials, rows and columns (per strip)", strips,
                      dram={"row partials read": f["col_blocks"] * slots * k * 8, "row statistics": slots * k * 8,
                            "column partials read": strips * f["row_groups"] * slots * k * 8,
                            "column statistics read-modify-write": strips * slots * k * 16},
                      fill=min(1.0, reduce_blocks / c["sms"]), note=f"{reduce_blocks} working block(s) per launch"))
    if cuda_overflow_possible(evidence, e_prod, 1.0 / tau, k):
        out.append(norm_bound_kernel(k, d, e_in, evidence, tau, "overflow_possible"))
    out.append(Kernel("forward", "line losses and casts", 4, dram={"statistics": 2 * 7 * k * 8}))
    # ---- backward: 2-D blocks, column blocks inside row blocks (strip_plan.h plan_gradient_blocks)
    # Half inputs whose float32 dy accumulator would exceed the budget take dy from a second sweep
    # over sᵀ's blocks instead (evidential_cuda.cpp loss_backward: dy_by_columns).
    dy_by_columns = e_in < e_prod and kd * 4 > budget
    accumulator = 4 if e_in < e_prod else 0  # dx[r] summed in float32 off to the side for half outputs
    b = plan_gradient_blocks(k, k, d, e_prod, 2 if bf16 else 0, False, accumulator, budget, sp)
    blocks = b["row_blocks"] * b["col_blocks"]
    e_g = 2 if bf16 else e_prod
    out.append(Kernel("backward", "line constants (zeros, upstream cast, line_gradients)", 6,
                      dram={"line constants": 2 * 9 * k * 8}))
    if not dy_by_columns:
        out.append(Kernel("backward", "zero dy (float32)", 1, dram={"dy": kd * e_prod}))
    # (label, its product, the output that product sums over column blocks, whether dy is accumulated too)
    sweeps = [("", "dx GEMM G·y (per block)", "dx", not dy_by_columns)]
    if dy_by_columns:
        sweeps.append((" (sᵀ sweep)", "dy GEMM (∂L/∂sᵀ)·x (per block)", "dy", False))
    block_note = f"{b['row_blocks']} × {b['col_blocks']} blocks of {b['block_rows']} × {b['block_cols']}"
    for label, product, output, accumulates_dy in sweeps:
        out.append(Kernel("backward", f"similarity GEMM again (recompute, per block){label}", blocks,
                          flops=2.0 * kk * d,
                          dram={"x row blocks": kd * e_in, "y re-read per row block": b["row_blocks"] * kd * e_in,
                                "s block written (float32)": kk * e_prod},
                          l2={"x row block again per column block": (b["col_blocks"] - 1) * kd * e_in},
                          note=block_note))
        out.append(Kernel("backward", f"gradient_kernel (per block){label}", blocks, elements=kk,
                          cycles_per_element=bwd_cycles,
                          dram={"s block read back": kk * e_prod,
                                f"∂L/∂s written ({'bfloat16' if bf16 else 'float32'})": kk * e_g},
                          note=f"{bwd_cycles:.2f} cycles/element ({bwd_pipe})"))
        summed = b["col_blocks"] > 1
        acc_bytes = accumulator or e_in  # where the rows' sum is kept: float32 beside, or the output
        product_dram = {"∂L/∂s read": kk * e_g, "y re-read per row block": b["row_blocks"] * kd * e_in,
                        f"{output} written": kd * (acc_bytes if summed else e_in)}
        if summed:  # not counted on to stay in L2 beside the s and G blocks (strip_plan.h)
            product_dram[f"{output}[r] read-modify-write per column block"] = (b["col_blocks"] - 1) * kd * acc_bytes * 2
        out.append(Kernel("backward", product, blocks, flops=2.0 * kk * d, dram=product_dram))
        if summed and accumulator:
            out.append(Kernel("backward", f"{output}[r] cast float32 → input dtype (per row block)", b["row_blocks"],
                              dram={f"{output} written": kd * e_in, "accumulator read": kd * accumulator}))
        if accumulates_dy:
            out.append(Kernel("backward", "dy GEMM Gᵀ·x (per block)", blocks, flops=2.0 * kk * d,
                              dram={"∂L/∂s read": kk * e_g, "x row blocks": kd * e_in,
                                    "dy accumulator read-modify-write per row block (float32)":
                                        b["row_blocks"] * kd * e_prod * 2},
                              l2={"x row block again per column block": (b["col_blocks"] - 1) * kd * e_in}))
    if e_prod != e_in and not dy_by_columns:
        out.append(Kernel("backward", "dy cast float32 → input dtype", 1, dram={"dy float32 read": kd * e_prod,
                                                                                  "dy written": kd * e_in}))
    # ---- memory: what the op code holds at the backward's peak (the forward's is smaller)
    saved = 2 * 7 * k * 8
    fwd_peak = saved + f["total_bytes"] + 2 * k * 8 + 2 * k * 4
    bwd_items = {"saved statistics": saved, "line constants": 2 * 9 * k * 8, "upstream in float64": 2 * k * 8,
                 "dx": kd * e_in, "workspace": b["total_bytes"]}
    if dy_by_columns:
        bwd_items["dy"] = kd * e_in
    else:
        bwd_items["dy accumulator (float32)"] = kd * e_prod
        if e_prod != e_in:
            bwd_items["dy cast"] = kd * e_in
    memory = _memory(max(fwd_peak, sum(bwd_items.values())), bwd_items, kd * e_in)
    memory["workspace_forward_mib"] = f["total_bytes"] / MIB
    plans = dict(forward=_plan_summary(f), backward=_plan_summary(b), budget_mib=budget / MIB,
                 dy_by_columns=dy_by_columns)
    return dict(kernels=out, memory=memory, plans=plans, element_cycles=dict(forward=fwd_cycles, backward=bwd_cycles))


def _plan_summary(p: dict) -> dict:
    keys = ("block_rows", "row_blocks", "block_cols", "col_blocks") if "block_rows" in p else \
        ("strip_rows", "strips", "col_blocks", "row_groups")
    return {k: p[k] for k in (*keys, "total_bytes")}


def _memory(peak: int, items: dict, grad_bytes: int) -> dict:
    return dict(peak_extra_mib=peak / MIB, beyond_grads_mib=(peak - 2 * grad_bytes) / MIB,
                items_mib={k: v / MIB for k, v in items.items()})


# ---------------------------------------------------------------------------- Triton backend


def _triton_modules():
    from evidential_ops.triton_backend import configs, launch

    return configs, launch


def triton_step(loss: str, precision: str, k: int, d: int, c: dict, profile: dict) -> dict:
    """Kernels and extra memory of a Triton step (launch.loss_forward + launch.loss_backward)."""
    configs, launch = _triton_modules()
    from evidential_ops.config import EVIDENCE_KINDS, TERMS

    evidence, tau, terms = loss_cases()[loss]
    e_in = PRECISIONS[precision]["input_bytes"]
    mask = sum(1 << TERMS.index(t) for t in terms)
    ns = launch._Terms(mask).num_partials()
    defaults = configs.DEFAULTS_BY_ARCH[90 if c["arch"] >= 90 else 80]
    st, gr = defaults["stats"], defaults["grad"]
    # float32 (IEEE, or TF32 at wide D) and 16-bit inputs: s from cuBLAS strips in both directions
    # (launch.similarity_strips, BackwardPlan.from_s), the element loops those of the strip sweeps
    strips_of_s = launch.similarity_strips(_torch_dtype(precision), d, "tf32" if precision == "tf32" else "ieee")
    sweep = "strip" if strips_of_s else "tile"
    fwd_row = profile_row(profile, "triton", loss, "fwd", sweep)
    bwd_row = profile_row(profile, "triton", loss, "bwd", sweep)
    fwd_cycles, fwd_pipe, _ = pipe_cycles(per_element(fwd_row), c["rates"])
    bwd_cycles, bwd_pipe, _ = pipe_cycles(per_element(bwd_row), c["rates"])
    l2_bytes, l1_half = c["l2_mib"] * MIB, c["l1_kib"] * 1024 // 2
    kk, kd = k * k, k * d
    out = []

    def operand_traffic(block_m, block_n, programs_per_sm, concurrent, row_blocks, passes_of_b, what):
        """L2 and DRAM bytes of a sweep where each of `row_blocks` programs' blocks reads its own
        (block_m, D) rows once per column tile and every other line's (block_n, D) tile."""
        l2, dram = {}, {}
        l2[f"{what}: other lines' tiles re-read per row block"] = passes_of_b * row_blocks * kd * e_in
        if programs_per_sm * block_m * d * e_in > l1_half:  # own rows evicted from L1 between column tiles
            l2[f"{what}: own rows re-read per column tile"] = _ceil_div(k, block_n) * kd * e_in
        waves = _ceil_div(row_blocks, concurrent)
        dram[f"{what}: own rows"] = kd * e_in
        dram[f"{what}: other lines per wave of resident programs"] = (waves if kd * e_in > l2_bytes else 1) * kd * e_in
        return l2, dram, waves

    # ---- forward (launch._line_statistics, rows and columns)
    out.append(Kernel("forward", "zero line statistics", 2, dram={"statistics": 2 * 7 * k * 8}))
    strip_extra = _similarity_strip_forward(out, k, d, e_in, ns, st, fwd_cycles, fwd_pipe, c, launch) \
        if strips_of_s else 0
    row_blocks = _ceil_div(k, st.block_m)
    programs = 0 if strips_of_s else launch.one_pass_programs(row_blocks, k, ns, c["sms"])
    one_pass = programs > 0
    per_sm = occupancy(fwd_row["resources"].get("registers", 255), 32 * st.num_warps, c)
    partial_bytes = programs * ns * k * 8 if one_pass else 0
    passes = [] if strips_of_s else [("stats_kernel, rows and column partials", programs)] if one_pass else \
        [("stats_kernel, rows (pass 1 of 2)", row_blocks), ("stats_kernel, columns (pass 2 of 2: s again)", row_blocks)]
    if one_pass:
        out.append(Kernel("forward", "zero column partials", 1, dram={"partials": partial_bytes}))
    for name, grid in passes:
        concurrent = min(grid, per_sm * c["sms"])
        l2, dram, waves = operand_traffic(st.block_m, st.block_n, per_sm, concurrent, row_blocks, 1, "tile product")
        if one_pass:
            rmw = row_blocks * ns * k * 16
            (l2 if partial_bytes <= l2_bytes else dram)["column partials read-modify-write per row block"] = rmw
        out.append(Kernel("forward", name, 1, flops=2.0 * kk * d, elements=kk, cycles_per_element=fwd_cycles,
                          l2=l2, dram=dram, fill=min(1.0, grid / c["sms"]),
                          note=f"{st.name()}, {grid} programs, {per_sm}/SM, {waves} wave(s); {fwd_cycles:.2f} "
                               f"cycles/element ({fwd_pipe})"))
    if one_pass:
        out.append(Kernel("forward", "reduce_partials_kernel", 1, dram={"partials read": partial_bytes,
                                                                        "column statistics": ns * k * 8}))
    if launch._overflow_possible(EVIDENCE_KINDS.index(evidence), _torch_dtype(precision), 1.0 / tau, k):
        out.append(norm_bound_kernel(k, d, e_in, evidence, tau, "_overflow_possible"))
    out.append(Kernel("forward", "line losses and casts", 4, dram={"statistics": 2 * 7 * k * 8}))
    # ---- backward (launch.loss_backward as launch.BackwardPlan plans it)
    out.append(Kernel("backward", "line constants (upstream casts, line_gradient_kernel)", 4,
                      dram={"line constants": 2 * 9 * k * 8}))
    plan = launch.BackwardPlan(k, k, d, _torch_dtype(precision), strips_of_s=strips_of_s)
    acc_bytes = 8 if e_in == 8 else 4
    per_sm_g = occupancy(bwd_row["resources"].get("registers", 255), 32 * gr.num_warps, c)
    bwd_note = f"{bwd_cycles:.2f} cycles/element ({bwd_pipe})"
    # exp evidence: grad_block_kernel has two variants (p = α/S as a product, or scaled); an eager
    # step launches one (_Backward.scaled_variants): the product where the forward's norm bound
    # rules the other out (the model's unit-norm inputs: B = 2), else the one the device flag,
    # read once, selects; the profile is the product's
    if evidence == "exp" and e_in != 8 and plan.kind != "fused":  # grad_block_kernel's launches only
        if launch._scaled_p_ruled_out(2.0, 1.0 / tau, k):
            out.append(Kernel("backward", "p flag ruled out by the forward's norm bound (a zero flag)", 1,
                              dram={"flag": 4}))
        else:
            out.append(Kernel("backward", "p flag: a line strength beyond 2^126 (launch._scaled_p_flag, torch, one "
                              "host read)", 6, dram={"1/S of both directions": 2 * k * 8}, syncs=1))
    if plan.kind == "fused":
        fu = defaults.get("grad_fused", gr)
        grid = _ceil_div(k, fu.block_m)
        concurrent = min(grid, per_sm_g * c["sms"])
        l2, dram, waves = operand_traffic(fu.block_m, fu.block_n, per_sm_g, concurrent, grid, 1, "s tile, G·y, Gᵀ·x")
        # Every row block adds its Gᵀ·x into the float32 dy in program order.
        (l2 if kd * acc_bytes <= l2_bytes else dram)["float32 dy read-modify-write per row block"] = \
            grid * kd * acc_bytes * 2
        dram["dx written"] = kd * e_in
        out.append(Kernel("backward", "zero dy (float32) and its turns", 1, dram={"dy": kd * acc_bytes}))
        out.append(Kernel("backward", "grad_fused_kernel (s recomputed once, G in registers)", 1, flops=6.0 * kk * d,
                          elements=kk, cycles_per_element=bwd_cycles, l2=l2, dram=dram, fill=min(1.0, grid / c["sms"]),
                          note=f"{fu.name()}, {grid} programs, {per_sm_g}/SM, {waves} wave(s); {bwd_note}"))
        out.append(Kernel("backward", "dy cast float32 → input dtype", 1,
                          dram={"accumulator read": kd * acc_bytes, "written": kd * e_in}))
    elif plan.kind == "blocks":
        out.extend(_block_backward(plan, k, d, e_in, gr, per_sm_g, bwd_cycles, bwd_note, c, operand_traffic))
    else:
        strips = _ceil_div(k, plan.strip)
        g_bytes = plan.strip * k * e_in
        sweeps = [("rows", True, plan.dy_in_pass)] + ([("columns", False, True)] if plan.recomputations == 2 else [])
        for lines, with_dx, with_dy in sweeps:
            grid = _ceil_div(plan.strip, gr.block_m) * _ceil_div(k, gr.block_n)
            concurrent = min(grid, per_sm_g * c["sms"])
            if plan.from_s:  # s of the strip from cuBLAS (float32), into the strip or one beside it; G over it
                s_bytes = plan.strip * k * 4
                out.append(_strip_product(f"cuBLAS s of {strips} strips of {plan.strip} {lines}", "backward",
                                          strips, k, d, e_in, s_bytes, c))
                l2, dram, waves = {}, {}, 1
                (l2 if s_bytes <= l2_bytes else dram)["s strip read (float32)"] = kk * 4
                flops, what = 0.0, "(s from the strip)"
            else:
                l2, dram, waves = operand_traffic(gr.block_m, gr.block_n, per_sm_g, concurrent,
                                                  _ceil_div(k, gr.block_m), 1, f"G strips over {lines}")
                flops, what = 2.0 * kk * d, "(s recomputed)"
            (l2 if g_bytes <= l2_bytes else dram)["G written, strip by strip"] = kk * e_in
            out.append(Kernel("backward", f"grad_block_kernel: G of {strips} strips of {plan.strip} {lines} {what}",
                              strips, flops=flops, elements=kk, cycles_per_element=bwd_cycles,
                              l2=l2, dram=dram, fill=min(1.0, grid / c["sms"]),
                              note=f"{gr.name()}, {grid} programs a strip, {per_sm_g}/SM; {bwd_note}"))
            operand = kd * e_in
            where_operand = l2 if operand <= l2_bytes else dram
            products = [("G·y into dx", with_dx), ("Gᵀ·x into dy", with_dy)]
            for name, wanted in products:
                if not wanted:
                    continue
                p_l2, p_dram = {}, {}
                (p_l2 if g_bytes <= l2_bytes else p_dram)["G read"] = kk * e_in
                (p_l2 if where_operand is l2 else p_dram)["other operand read per strip"] = strips * operand
                accumulates = name.startswith("Gᵀ") and lines == "rows"
                if accumulates:  # dy += Gᵀ·x[strip] for every strip: read and written each time
                    dy_bytes = kd * (acc_bytes if e_in < 4 else e_in)
                    (p_l2 if dy_bytes <= l2_bytes else p_dram)["dy read-modify-write per strip"] = strips * dy_bytes * 2
                else:
                    p_dram["written"] = kd * (acc_bytes if e_in < 4 else e_in)
                out.append(Kernel("backward", f"cuBLAS {name} ({strips} products)", strips, flops=2.0 * kk * d,
                                  l2=p_l2, dram=p_dram, note="at the precision's GEMM ceiling"))
        if e_in < 4:
            out.append(Kernel("backward", "dx, dy cast float32 → input dtype", 2,
                              dram={"accumulators read": 2 * kd * acc_bytes, "written": 2 * kd * e_in}))
    # ---- memory
    saved = 2 * 7 * k * 8
    fwd_peak = saved + partial_bytes + strip_extra + 2 * k * 8 + 2 * k * 4
    items = {"saved statistics": saved, "line constants": 2 * 9 * k * 8, "upstream in float64": 2 * k * 8,
             "dx (output)": kd * e_in, "dy (output)": kd * e_in, f"backward plan ({plan.kind})": plan.extra_bytes}
    memory = _memory(max(fwd_peak, sum(items.values())), items, kd * e_in)
    memory["partials_forward_mib"] = partial_bytes / MIB
    plans = dict(forward=dict(one_pass=one_pass, programs=programs if one_pass else row_blocks, config=st.name(),
                              programs_per_sm=per_sm, strips_of_s=strips_of_s, strip_mib=strip_extra / MIB),
                 backward=dict(kind=plan.kind, strip=plan.strip, block_rows=plan.block_rows,
                               block_cols=plan.block_cols, gemm_equivalents=plan.gemm_equivalents,
                               dy_in_pass=plan.dy_in_pass, from_s=plan.from_s, extra_mib=plan.extra_bytes / MIB,
                               config=gr.name(),
                               programs_per_sm=per_sm_g))
    return dict(kernels=out, memory=memory, plans=plans, element_cycles=dict(forward=fwd_cycles, backward=bwd_cycles))


def _block_backward(plan, k: int, d: int, e_in: int, gr, per_sm: int, cycles: float, note: str, c: dict,
                    operand_traffic) -> list:
    """launch._block_pass: per (block_rows, block_cols) block of G, row blocks in order and the
    column blocks of each in order: s of the block (cuBLAS where plan.from_s, else recomputed in
    grad_block_kernel), G over it, then dx[rows] += G·y[cols] and dy[cols] += Gᵀ·x[rows] (the
    first product into each written). dx's rows of a row block are added to by its column blocks
    one after another (L2 where they fit in half of it); dy's by every row block."""
    rows, cols = plan.block_rows, plan.block_cols
    row_blocks, col_blocks = _ceil_div(k, rows), _ceil_div(k, cols)
    blocks = row_blocks * col_blocks
    kk, kd = k * k, k * d
    l2_bytes = c["l2_mib"] * MIB
    g_bytes = rows * cols * e_in
    where_g = "l2" if g_bytes <= l2_bytes else "dram"
    out = []
    shape = f"{row_blocks} × {col_blocks} blocks of {rows} × {cols}"
    if plan.from_s:
        l2, dram = {}, {"own rows, once a column block": col_blocks * kd * e_in}
        (l2 if kd * e_in <= l2_bytes else dram)["other lines, once a row block"] = row_blocks * kd * e_in
        (l2 if where_g == "l2" else dram)["s blocks written (float32)"] = kk * 4
        out.append(Kernel("backward", f"cuBLAS s of {shape}", blocks, flops=2.0 * kk * d, l2=l2, dram=dram,
                          note="at the precision's GEMM ceiling"))
        l2, dram, flops, what = {}, {}, 0.0, "(s from the block)"
        (l2 if where_g == "l2" else dram)["s block read"] = kk * e_in
    else:
        l2, dram, _ = operand_traffic(gr.block_m, gr.block_n, per_sm, per_sm * c["sms"], _ceil_div(k, gr.block_m),
                                      1, "G blocks")
        flops, what = 2.0 * kk * d, "(s recomputed)"
    (l2 if where_g == "l2" else dram)["G written, block by block"] = kk * e_in
    grid = _ceil_div(rows, gr.block_m) * _ceil_div(cols, gr.block_n)
    out.append(Kernel("backward", f"grad_block_kernel: G of {shape} {what}", blocks, flops=flops,
                      elements=kk,
                      cycles_per_element=cycles, l2=l2, dram=dram, fill=min(1.0, grid / c["sms"]),
                      note=f"{gr.name()}, {grid} programs a block, {per_sm}/SM; {note}"))
    # (name, blocks adding to each gradient row after the first, rows of a gradient block, operand
    # rows read per product)
    for name, again, acc_rows, others in (("G·y into dx", col_blocks - 1, rows, row_blocks),
                                          ("Gᵀ·x into dy", row_blocks - 1, k, col_blocks)):
        p_l2, p_dram = {}, {}
        (p_l2 if where_g == "l2" else p_dram)["G read"] = kk * e_in
        (p_l2 if kd * e_in <= l2_bytes else p_dram)["operand read per block"] = others * kd * e_in
        # what is read and written again: L2 where the rows it cycles through fit in half of it
        (p_l2 if acc_rows * d * e_in <= l2_bytes // 2 else p_dram)["read-modify-write per block after the first"] = \
            again * kd * e_in * 2
        p_dram["written"] = kd * e_in
        out.append(Kernel("backward", f"cuBLAS {name} ({blocks} products)", blocks, flops=2.0 * kk * d,
                          l2=p_l2, dram=p_dram, note="at the precision's GEMM ceiling"))
    return out


def _strip_product(name: str, phase: str, strips: int, k: int, d: int, e_in: int, strip_bytes: int, c: dict) -> Kernel:
    """cuBLAS s[strip] = a[strip]·bᵀ for every strip (float32 result): a once, b once per strip (from
    L2 where it fits), the strips of s written (to L2 where one fits)."""
    kd, kk = k * d, k * k
    l2, dram = {}, {"own rows": kd * e_in}
    (l2 if kd * e_in <= c["l2_mib"] * MIB else dram)["other lines read per strip"] = strips * kd * e_in
    (l2 if strip_bytes <= c["l2_mib"] * MIB else dram)["s strips written (float32)"] = kk * 4
    return Kernel(phase, name, strips, flops=2.0 * kk * d, l2=l2, dram=dram, note="at the precision's GEMM ceiling")


def _similarity_strip_forward(out: list, k: int, d: int, e_in: int, ns: int, st, cycles: float, pipe: str, c: dict,
                              launch) -> int:
    """launch._strip_statistics: the partials zeroed once, then per strip of s its cuBLAS product,
    one stats_kernel sweep by columns (the strip's rows into partials), the partials reduced (and
    zeroed again for the next strip) and the columns' sums of the strip added to theirs. Returns
    the forward's extra bytes (strip, partials and the columns' sums of a strip)."""
    kk = k * k
    rows = launch.strip_rows(k, k, 4)
    strips = _ceil_div(k, rows)
    strip_bytes = rows * k * 4
    programs = launch.strip_programs(_ceil_div(k, st.block_m), c["sms"])
    partial_bytes = programs * ns * rows * 8
    where = lambda b: "l2" if b <= c["l2_mib"] * MIB else "dram"  # noqa: E731
    out.append(_strip_product(f"cuBLAS s of {strips} strips of {rows} rows", "forward", strips, k, d, e_in,
                              strip_bytes, c))
    out.append(Kernel("forward", "zero partials (once)", 1, dram={"partials": partial_bytes}))
    sweep = {"s strips read": kk * 4,
             "strip rows' partials read-modify-write per column block": _ceil_div(k, st.block_m) * ns * k * 16,
             "columns' sums of the strip stored": strips * 7 * k * 8}
    l2, dram = {}, {}
    for what, b in sweep.items():
        (l2 if where(strip_bytes) == "l2" else dram)[what] = b
    out.append(Kernel("forward", "stats_kernel from each strip (read by columns)", strips, elements=kk,
                      cycles_per_element=cycles, l2=l2, dram=dram, fill=min(1.0, programs / c["sms"]),
                      note=f"{st.name()}, {programs} programs a strip; {cycles:.2f} cycles/element ({pipe})"))
    out.append(Kernel("forward", "reduce_partials_kernel (per strip)", strips,
                      dram={"partials read": strips * partial_bytes, "partials zeroed again": strips * partial_bytes,
                            "row statistics": ns * k * 8},
                      fill=min(1.0, _ceil_div(rows, launch.STRIP_REDUCE_BLOCK) / c["sms"])))
    out.append(Kernel("forward", "columns' sums of each strip added (torch)", strips,
                      dram={"read twice, written": strips * 3 * 7 * k * 8}))
    return partial_bytes + strip_bytes + 7 * k * 8


def _torch_dtype(precision: str):
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


# --------------------------------------------------------------------------------------- floor


def floor_step(precision: str, k: int, d: int) -> list:
    """The three K×K×D products of the floor (evidential_ops.benchmark: s = x·yᵀ, s·y, sᵀ·x) as torch
    runs them: s in the inputs' dtype, each operand moved once."""
    e = PRECISIONS[precision]["input_bytes"]
    kk, kd = k * k, k * d
    return [Kernel("floor", "s = x·yᵀ", 1, flops=2.0 * kk * d, dram={"x, y": 2 * kd * e, "s written": kk * e}),
            Kernel("floor", "s·y", 1, flops=2.0 * kk * d, dram={"s, y": kk * e + kd * e, "written": kd * e}),
            Kernel("floor", "sᵀ·x", 1, flops=2.0 * kk * d, dram={"s, x": kk * e + kd * e, "written": kd * e})]


# ----------------------------------------------------------------------------------- the model


def predict(backend: str, loss: str, precision: str, k: int, d: int, c: dict, profile: dict) -> dict:
    """One row: predicted step time with its terms and kernels, the floor, memory and the targets."""
    step = (cuda_step if backend == "cuda" else triton_step)(loss, precision, k, d, c, profile)
    time = step_time(step["kernels"], c, precision)
    floor = step_time(floor_step(precision, k, d), c, precision)
    kernels = []
    for kern in step["kernels"]:
        t = kern.terms(c, precision)
        kernels.append(dict(phase=kern.phase, name=kern.name, launches=kern.launches, flops=kern.flops,
                            elements=kern.elements, cycles_per_element=kern.cycles_per_element,
                            dram_bytes=kern.dram, l2_bytes=kern.l2, fill=kern.fill, syncs=kern.syncs, note=kern.note,
                            seconds={n: t[n] for n in (*TERM_NAMES, "total")}, bound=t["bound"]))
    target = TARGETS[backend]
    return dict(device=c["key"], backend=backend, loss=loss, precision=precision, k=k, d=d,
                predicted_s=time["total"], terms_s={n: time[n] for n in TERM_NAMES}, largest=time["largest"],
                floor_s=floor["total"], ratio=time["total"] / floor["total"],
                launches=sum(x.launches for x in step["kernels"]), syncs=sum(x.syncs for x in step["kernels"]),
                gemm_flops=sum(x.flops for x in step["kernels"]), floor_flops=6.0 * k * k * d,
                memory=step["memory"], plans=step["plans"], kernels=kernels, least=least_step(step, precision, k, d, c),
                targets=dict(ratio=target["ratio"] if (k, d) == (TARGET_K, TARGET_D) else None,
                             beyond_mib=target["beyond_mib"] if k == MEMORY_K else None))


def least_step(step: dict, precision: str, k: int, d: int, c: dict) -> dict:
    """What no plan of the same element code can go below: s once in the forward and once in the
    backward, G·y and Gᵀ·x (4 GEMM-equivalents) at the precision's ceiling, plus one forward's and one
    backward's element work (the static profile's cycles), nothing overlapped and nothing else
    (no bytes, launches or syncs); and the element time a step could have beside those products
    within the backend's target ratio."""
    gemms = 4 * 2.0 * k * k * d / (c["gemm_tflops"][precision] * 1e12)
    cycles = step["element_cycles"]["forward"] + step["element_cycles"]["backward"]
    element = k * k * cycles / (c["sms"] * c["clock_ghz"] * 1e9)
    return dict(gemm_s=gemms, element_s=element, total_s=gemms + element)


# ------------------------------------------------------------------------------------ report


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _verdict(value: float, limit: float | None, fmt: str) -> str:
    if limit is None:
        return ""
    return f"{'✓' if value <= limit else '✗'} ≤ {format(limit, fmt)}"


def inputs_digest() -> str:
    """sha256 (12 hex digits) of what the model reads (model_inputs); the same digest, the same
    report."""
    digest = hashlib.sha256()
    for p in model_inputs():
        with open(p, "rb") as handle:
            digest.update(os.path.relpath(p, ROOT).encode() + b"\0" + handle.read())
    return digest.hexdigest()[:12]


def markdown(report: dict) -> str:
    """The report: assumptions, ceilings, one table per device, and where the time goes at the
    target size on the first device."""
    h = report["header"]
    lines = [
        "# GPU performance model (predicted, not measured)",
        "",
        f"Written by `bench/gpu_model.py` (`make gpu-model`) from the code (inputs digest `{h['digest']}`) and the "
        f"static SASS profile of its kernels (nvcc {h['profile']['nvcc']}, triton {h['profile']['triton']}, sm_90). "
        "Every figure here is a model prediction; measured figures come only from a GPU session "
        "(`bash bench/gpu_session.sh ceilings bench16k model`, which prints measured beside predicted).",
        "",
        "## Model",
        "",
    ]
    lines += [f"- {a}" for a in h["assumptions"]]
    lines += ["", "## Device ceilings", "",
              "| device | SMs | clock GHz | HBM TB/s | L2 TB/s* | L2 MiB | GEMM TFLOP/s ieee / tf32 / bf16 | "
              "launch µs* | sync µs* | source |",
              "|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for c in report["ceilings"].values():
        g = c["gemm_tflops"]
        lines.append(f"| {c['name']} | {c['sms']} | {c['clock_ghz']} | {c['hbm_tbs']} | {c['l2_tbs']} | {c['l2_mib']} | "
                     f"{g['ieee']} / {g['tf32']} / {g['bf16']} | {c['launch_us']} | {c['sync_us']} | {c['source']}"
                     + (f"; measured: {', '.join(c['measured'])}" if c["measured"] else "") + " |")
    lines += ["", "\\* not datasheet figures: assumptions until a GPU session measures them.", ""]
    rows = report["rows"]
    first = next(iter(report["ceilings"]))
    for device, c in report["ceilings"].items():
        mine = [r for r in rows if r["device"] == device]
        if not mine:
            continue
        lines += [f"## {c['name']}", "",
                  "Predicted forward + backward per step. Terms (ms) are each summed over the kernels on their own "
                  "(a kernel costs max(GEMM + element, DRAM, L2) + launches + syncs, so they do not add up to the "
                  "prediction); *largest* names the biggest. Memory: peak extra device memory of the op code, and "
                  "beyond the two K×D gradients (what the targets bound).", "",
                  "| backend | loss | prec | K | D | predicted ms | floor ms | × floor | target | GEMM | element | "
                  "DRAM | L2 | launch (n) | sync (n) | largest | extra MiB | beyond grads MiB | target |",
                  "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
        for r in mine:
            t, m = r["terms_s"], r["memory"]
            lines.append(
                f"| {r['backend']} | {r['loss'].upper()} | {r['precision']} | {r['k']} | {r['d']} | "
                f"{_ms(r['predicted_s'])} | {_ms(r['floor_s'])} | {r['ratio']:.2f} | "
                f"{_verdict(r['ratio'], r['targets']['ratio'], 'g')} | {_ms(t['gemm'])} | {_ms(t['element'])} | "
                f"{_ms(t['dram'])} | {_ms(t['l2'])} | {_ms(t['launch'])} ({r['launches']}) | {_ms(t['sync'])} "
                f"({r['syncs']}) | {r['largest']} | {m['peak_extra_mib']:.0f} | {m['beyond_grads_mib']:.0f} | "
                f"{_verdict(m['beyond_grads_mib'], r['targets']['beyond_mib'], 'g')} |")
        lines.append("")
        if device != first:
            continue
        # the target size in every precision, and the largest K in bfloat16, where the strips are shortest
        focus = [r for r in mine if (r["k"], r["d"]) == (TARGET_K, TARGET_D)]
        focus += [r for r in mine if (r["k"], r["d"], r["precision"]) == (MEMORY_K, TARGET_D, "bf16")]
        if focus:
            lines += [f"## Where the time goes: {c['name']}, K = {TARGET_K} (and K = {MEMORY_K} in bf16), "
                      f"D = {TARGET_D}", "",
                      "Per kernel (all its launches): its terms in ms, what binds it, and its largest byte items "
                      "(DRAM unless marked L2).", ""]
        for r in focus:
            lines += [f"### {r['backend']} {r['loss'].upper()} {r['precision']} K = {r['k']}: {_ms(r['predicted_s'])} ms "
                      "predicted, "
                      f"{r['ratio']:.2f} × the floor ({_ms(r['floor_s'])} ms)", "",
                      "| phase | kernel | launches | total | GEMM | element | DRAM | L2 | bound | largest bytes | note |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
            for kern in r["kernels"]:
                s = kern["seconds"]
                items = [(v, f"{name} {v / MIB:.0f} MiB") for name, v in kern["dram_bytes"].items()]
                items += [(v, f"{name} {v / MIB:.0f} MiB (L2)") for name, v in kern["l2_bytes"].items()]
                biggest = "; ".join(text for _, text in sorted(items, reverse=True)[:2])
                lines.append(f"| {kern['phase']} | {kern['name']} | {kern['launches']} | {_ms(s['total'])} | "
                             f"{_ms(s['gemm'])} | {_ms(s['element'])} | {_ms(s['dram'])} | {_ms(s['l2'])} | "
                             f"{kern['bound']} | {biggest} | {kern['note']} |")
            lines.append("")
        if focus:
            lines += [f"## What the targets leave the element work: {c['name']}, K = {TARGET_K}, D = {TARGET_D}", "",
                      "The least step of the same element code (`least_step`): 4 GEMM-equivalents (s in the forward, "
                      "s again, G·y and Gᵀ·x in the backward) at the precision's ceiling plus one forward's and one "
                      "backward's element work, nothing overlapped and nothing else moved or launched. *Room* is "
                      "what the target ratio leaves the element work beside those products; *cut* the share of the "
                      "element work that would have to go even then.", "",
                      "| backend | loss | prec | floor ms | 4 GEMMs ms | element ms | least ms | least × floor | "
                      "target | room ms | cut |",
                      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for r in focus:
                if (r["k"], r["d"]) != (TARGET_K, TARGET_D):
                    continue
                least, limit = r["least"], r["targets"]["ratio"]
                room = limit * r["floor_s"] - least["gemm_s"]
                cut = max(0.0, 1.0 - room / least["element_s"]) if least["element_s"] > 0 else 0.0
                lines.append(f"| {r['backend']} | {r['loss'].upper()} | {r['precision']} | {_ms(r['floor_s'])} | "
                             f"{_ms(least['gemm_s'])} | {_ms(least['element_s'])} | {_ms(least['total_s'])} | "
                             f"{least['total_s'] / r['floor_s']:.2f} | {limit:g} | {_ms(room)} | {cut:.0%} |")
            lines.append("")
        mem = [r for r in mine if r["k"] == MEMORY_K and r["d"] == TARGET_D]
        if mem:
            lines += [f"## Extra device memory at K = {MEMORY_K}, D = {TARGET_D}", "",
                      "| backend | loss | prec | beyond grads MiB | target | items (MiB) |", "|---|---|---|---:|---|---|"]
            for r in mem:
                m = r["memory"]
                items = ", ".join(f"{name} {v:.0f}" for name, v in m["items_mib"].items())
                lines.append(f"| {r['backend']} | {r['loss'].upper()} | {r['precision']} | "
                             f"{m['beyond_grads_mib']:.0f} | {_verdict(m['beyond_grads_mib'], r['targets']['beyond_mib'], 'g')}"
                             f" | {items} |")
            lines.append("")
    if report["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s}" for s in report["skipped"]] + [""]
    return "\n".join(lines)


ASSUMPTIONS = [
    "A step is loss_forward + loss_backward from embeddings, both directions, the loss cases of "
    "evidential_ops.benchmark (TCL risk + kl, exp, τ = 0.05; UML fmse + logdet, exp_tanh, τ = 0.1; DUQ mse, "
    "relu, τ = 1), inputs float32 (ieee, tf32) or bfloat16 (bf16).",
    "Kernel time = max(GEMM + element, DRAM bytes / HBM bandwidth, L2 bytes / L2 bandwidth) + launches × launch "
    "latency + host reads × sync latency; a step is the sum over its kernels (one stream, no overlap between "
    "kernels).",
    "GEMM flops at the precision's ceiling: ieee on the FP32 pipes (cuBLAS CUBLAS_COMPUTE_32F and Triton "
    "input_precision=\"ieee\" do not use tensor cores), tf32 and bf16 at the dense tensor-core rate; an operand "
    "moves once per product except where the code re-reads it (counted: y per CUDA strip, tiles per Triton row "
    "block, accumulators per column tile).",
    "Element time = elements × cycles per element / (SMs × clock), cycles per element the most loaded of issue "
    "(128 instructions/clk/SM) and the FP32, FP64, MUFU, integer, conversion and load/store pipes at their "
    "per-SM rates, from the static counts of the hot loop (bench/static_profile.py: both sides of a branch "
    "counted; CUDA: the build with the loss's evidence map fixed; Triton: the float32 input path for every "
    "precision, and the sweeps of stored strips of s where the step takes them; the sm_90 code's counts on the "
    "A100 too). Full occupancy hides latency.",
    "DRAM: data that must come from device memory; an operand larger than L2 comes again for each wave of "
    "resident Triton programs (occupancy from the compiled registers). L2: re-reads a wave shares, and "
    "read-modify-writes whose working set fits in L2. L1 hits are assumed only for a Triton program's own rows "
    "when its resident programs' rows fit in half of L1. A launch with fewer blocks than SMs gets blocks/SMs of "
    "the bandwidth.",
    "Launch and sync latencies are charged in full (an upper bound where long kernels queue back to back); "
    "Python, autograd and the losses' O(K) reductions outside the ops are not modelled.",
    "The floor is the three K×K×D products of evidential_ops.benchmark at the same precision (s in the inputs' "
    "dtype, each operand moved once), through the same ceilings.",
    "Memory: the buffers the op code allocates (workspace, statistics, line constants, accumulators, casts) at "
    "the step's peak; 'beyond grads' subtracts the two K×D gradients, as bench/device_bench.py reports it.",
]


# ------------------------------------------------------------------------ measured ceilings


def measure_ceilings(path: str) -> dict:
    """On a CUDA GPU: HBM bandwidth (a 4 GiB device copy), L2 bandwidth (a copy of a buffer a
    quarter of L2, repeated), the torch/cuBLAS GEMM rate per precision on the step's own shapes (the
    floor's three products at K = 16384, D = 1024: s = x·yᵀ, s·y, sᵀ·x; an 8192³ product ran 26 %
    faster in TF32 on the H200 than these, bench/results/gpu_h200_first_lease.md), the time of an
    empty launch, and of a host read (.item()). Written to `path` as JSON for --ceilings."""
    import torch

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)

    def timed(fn, repeats=20):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = math.inf
        for _ in range(3):
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / repeats)
        return best

    def copy_bandwidth(elements, repeats):
        src = torch.empty(elements, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        return 2 * elements * 4 / timed(lambda: dst.copy_(src), repeats) / 1e12

    hbm = copy_bandwidth(2**30, 5)  # 4 GiB each way: far beyond any L2
    # two buffers of an eighth of L2 each: both stay resident across the repeats
    l2 = copy_bandwidth(max(1024, getattr(props, "L2_cache_size", 50 * MIB) // 8 // 4), 200)
    gemm = {}
    k, d = 16384, 1024
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for precision, dtype, tf32 in (("ieee", torch.float32, False), ("tf32", torch.float32, True),
                                       ("bf16", torch.bfloat16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x = torch.randn(k, d, device=device, dtype=dtype)
            y = torch.randn(k, d, device=device, dtype=dtype)

            def floor_products():
                s = x @ y.T
                s @ y
                s.T @ x

            gemm[precision] = 3 * 2.0 * k * k * d / timed(floor_products, 3) / 1e12
            del x, y
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    tiny = torch.zeros(1, device=device)
    launch = timed(lambda: tiny.add_(1.0), 1000) * 1e6
    sync = min(_host_read(tiny) for _ in range(50)) * 1e6
    result = dict(device=props.name, sms=props.multi_processor_count, hbm_tbs=round(hbm, 3), l2_tbs=round(l2, 3),
                  gemm_tflops={p: round(v, 1) for p, v in gemm.items()}, gemm_shape=f"floor K={k} D={d}",
                  launch_us=round(launch, 2),
                  sync_us=round(sync, 2), torch=torch.__version__)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(f"gpu-model: measured ceilings of {props.name}: {result}")
    return result


def _host_read(t) -> float:
    import time

    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    t.add_(1.0).item()
    return time.perf_counter() - start


def compare(report: dict, bench_paths: list) -> str:
    """Measured (bench/device_bench.py JSON records) beside predicted, for every predicted row of the
    first device: time, × floor and memory beyond the gradients."""
    measured = {}
    for path in bench_paths:
        with open(path, encoding="utf-8") as handle:
            for r in json.load(handle)["records"]:
                if "median_s" in r:
                    measured[(r["impl"], r["case"], r["precision"], r["k"], r["d"])] = r
    device = next(iter(report["ceilings"]))
    lines = ["| backend | loss | prec | K | D | predicted ms | measured ms | measured ÷ predicted | predicted × floor | "
             "measured × floor | predicted floor ms | measured floor ms | predicted MiB | measured MiB |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if r["device"] != device:
            continue
        m = measured.get((r["backend"], r["loss"], r["precision"], r["k"], r["d"]), {})
        fl = measured.get(("floor", r["loss"], r["precision"], r["k"], r["d"]), {})
        ms, fs = m.get("median_s"), fl.get("median_s")
        over = f"{ms / r['predicted_s']:.2f}" if ms else "–"
        ratio = f"{ms / fs:.2f}" if ms and fs else "–"
        mib = f"{m['beyond_gradients_mib']:.0f}" if "beyond_gradients_mib" in m else "–"
        lines.append(
            f"| {r['backend']} | {r['loss'].upper()} | {r['precision']} | {r['k']} | {r['d']} | {_ms(r['predicted_s'])} | "
            f"{_ms(ms) if ms else '–'} | {over} | {r['ratio']:.2f} | {ratio} | {_ms(r['floor_s'])} | "
            f"{_ms(fs) if fs else '–'} | {r['memory']['beyond_grads_mib']:.0f} | {mib} |")
    return "\n".join(lines) + "\n"


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def to_json(report: dict, detailed_device: str) -> str:
    """The report as JSON, one row a line, six significant digits; per-kernel detail for the rows of
    `detailed_device` only (the others keep their terms), so the tracked file stays small."""
    rows = []
    for r in report["rows"]:
        r = dict(r) if r["device"] == detailed_device else {k: v for k, v in r.items() if k != "kernels"}
        rows.append(json.dumps(_rounded(r), ensure_ascii=False))
    head = {k: v for k, v in report.items() if k != "rows"}
    return (json.dumps(_rounded(head), indent=1, ensure_ascii=False)[:-2] + ',\n "rows": [\n'
            + ",\n".join(rows) + "\n ]\n}\n")


# --------------------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    """Command line (see the module docstring)."""
    parser = static_profile.report_parser(__doc__, DEFAULT_OUT)
    parser.add_argument("--device", nargs="+", choices=tuple(DEVICES), default=list(DEVICES),
                        help="the first gets the per-kernel breakdown and is the one --compare uses")
    parser.add_argument("--ceilings", help="JSON of measured ceilings (--measure-ceilings) for the first device")
    parser.add_argument("--profile", help="a static_profile.py JSON (default: the current code's, profiled if stale)")
    parser.add_argument("--backend", nargs="+", choices=("cuda", "triton"), default=["cuda", "triton"])
    parser.add_argument("--loss", nargs="+", choices=("tcl", "uml", "duq"), default=["tcl", "uml", "duq"])
    parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--k", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--d", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--measure-ceilings", metavar="FILE", help="measure this GPU's ceilings into FILE and exit")
    parser.add_argument("--compare", nargs="+", metavar="BENCH_JSON",
                        help="bench/device_bench.py results: print measured beside predicted")
    args = parser.parse_args(argv)
    if args.measure_ceilings:
        measure_ceilings(args.measure_ceilings)
        return 0
    profile = load_profile(args.profile)
    if profile is None:
        print("gpu-model: no static profile (nvcc or triton cannot compile here): skipping, nothing written")
        return 0
    ceilings = {dev: load_ceilings(dev, args.ceilings if i == 0 else None) for i, dev in enumerate(args.device)}
    rows, skipped = [], []
    backends = list(args.backend)
    if "triton" in backends:
        try:
            _triton_modules()
        except Exception as error:  # no triton: the CUDA rows alone
            backends.remove("triton")
            skipped.append(f"triton rows: the launch code cannot be imported ({type(error).__name__}: {error})")
    for backend in backends:
        missing = [(m, dr) for m in args.loss for dr in ("fwd", "bwd") if profile_row(profile, backend, m, dr) is None]
        if missing:
            backends = [b for b in backends if b != backend]
            skipped.append(f"{backend} rows: no static profile of {missing}")
            print(f"gpu-model: {skipped[-1]}: skipping them")
    for device, c in ceilings.items():
        for backend in backends:
            for loss in args.loss:
                for precision in args.precision:
                    for k in args.k:
                        for d in args.d:
                            rows.append(predict(backend, loss, precision, k, d, c, profile))
    ph = profile["header"]
    report = dict(header=dict(digest=inputs_digest(), assumptions=ASSUMPTIONS,
                              profile=dict(nvcc=ph.get("nvcc"), triton=ph.get("triton"), arch=ph.get("arch"),
                                           commit=ph.get("commit"))),
                  ceilings=ceilings, rows=rows, skipped=skipped)
    first = args.device[0]
    for r in rows:
        if r["device"] == first and (r["k"], r["d"]) == (TARGET_K, TARGET_D):
            print(f"gpu-model: {first} {r['backend']:6s} {r['loss'].upper()} {r['precision']:4s} K={r['k']} "
                  f"D={r['d']}: {_ms(r['predicted_s'])} ms = {r['ratio']:.2f} × floor ({_ms(r['floor_s'])} ms), "
                  f"largest term {r['largest']}")
    if args.compare:
        print(compare(report, args.compare))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(markdown(report))
    with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as handle:
        handle.write(to_json(report, first))
    print(f"gpu-model: {len(rows)} rows written to {args.out} (+ .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
