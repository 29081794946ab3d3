#!/usr/bin/env python3
"""Static GPU profile of the compiled element kernels for sm_90: no GPU needed.

    python bench/static_profile.py [--out bench/results/static_profile.md] [--label before]
                                   [--backend cuda cuda-any triton] [--loss tcl uml duq]
                                   [--direction fwd bwd line] [--triton-path f32]

What it does, per kernel:
- CUDA (csrc/cuda/*.cu, torch-free): nvcc -cubin for sm_90 with the flags of
  csrc/tests/nvcc_check.sh, registers and spills from ptxas -v. The element kernels are templated
  on the terms, and on their float32 path on the evidence map and the stored types of s and ∂L/∂s
  for every product of embeddings: "cuda" profiles the instantiation a method runs (its map,
  float32 s and ∂L/∂s); "cuda-any" the generic one (half views of a given s), whose loop switches
  on the map and the dtypes per element.
- Triton: the default configuration of stats_kernel (forward) and grad_fused_kernel and
  grad_block_kernel (backward) of
  each method, compiled ahead of time for GPUTarget("cuda", 90, 32) through
  evidential_ops.triton_backend.aot_check (its jobs, its compile, its ptxas log).
- The cubin is disassembled with nvdisasm (the CUDA toolkit's, or the copy Triton ships); the
  SASS is split into basic blocks, loops are the natural loops of its back edges (a branch to a
  block that dominates it: in this code a `BRA` to an earlier label). The hot loop (HOT_RULES)
  is, for the CUDA element kernels, the per-row loop of a thread: the innermost loop that loads
  from global memory; for Triton the loop over column blocks: the loop enclosing the tile
  product's loop over D, which is reported on its own, as is the backward's second product.
  Every loop is printed with its address ranges, depth and size, so the choice can be checked.
- Instructions are counted by class (`CLASSES`), in the hot loop's own body and in the whole
  kernel (called subroutines, the slow paths of division, included; NOP padding not), and the
  loop counts are divided by the elements one thread handles per iteration: for the CUDA
  element kernels the columns a thread owns (kColumnsPerThread of the kernel file, else 1), one
  row of them per iteration (checked on the "cuda" rows, whose loop must load s once per
  element), BLOCK_M·BLOCK_N/(32·num_warps) for Triton.

Counts are static: a loop body holds both sides of every branch. "max path" is the longest path
through the loop's own body (nested loops contribute nothing): an upper bound on what one
iteration issues, slow-path subroutines aside.

Writes OUT (markdown) and OUT with .json; skips a backend, saying so, where its compiler is
missing, and exits 0 without writing where nothing could be profiled. `make static-profile`
runs it for the current code (part of `make test`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "static_profile.md")
ARCH = 90
NVCC_FLAGS = ["-std=c++17", "-O3", f"-I{os.path.join(ROOT, 'csrc')}",
              "-gencode", f"arch=compute_{ARCH},code=sm_{ARCH}", "-cubin", "-Xptxas", "-v"]

# ------------------------------------------------------------------------ instruction classes

CLASSES = ("fp64", "fp32", "mufu", "int", "conv", "mem", "tensor", "control", "other")
CLASS_TITLES = {"fp64": "FP64", "fp32": "FP32", "mufu": "MUFU", "int": "int/logic", "conv": "conv",
                "mem": "mem", "tensor": "tensor", "control": "control", "other": "other"}
_FP64 = {"DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX"}
_FP32 = {"FADD", "FMUL", "FFMA", "FSETP", "FSET", "FMNMX", "FSEL", "FCHK", "FSWZADD", "FADD32I", "FMUL32I",
         "FFMA32I", "HADD2", "HMUL2", "HFMA2", "HSETP2", "HSET2", "HMNMX2"}
_CONV = {"F2F", "F2I", "I2F", "I2FP", "F2IP", "FRND", "I2I", "I2IP", "F2FP"}
_INT = {"IADD3", "IADD", "IMAD", "IMUL", "ISCADD", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "ICMP",
        "IMNMX", "VIMNMX", "VIMNMX3", "VIADD", "VIADDMNMX", "IABS", "POPC", "FLO", "BREV", "BMSK", "SGXT", "PRMT",
        "SEL", "MOV", "MOV32I", "PLOP3", "P2R", "R2P", "IDP", "R2UR", "VABSDIFF", "VABSDIFF4"}
_MEM = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDC", "ATOM", "ATOMG", "ATOMS", "RED", "REDG",
        "LDSM", "STSM", "LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG", "UTMAPF", "SUST", "SULD", "TLD", "TEX"}
_TENSOR = {"HMMA", "HGMMA", "IMMA", "IGMMA", "DMMA", "BMMA", "BGMMA", "QGMMA"}
_CONTROL = {"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "BREAK", "BPT", "WARPSYNC", "YIELD",
            "KILL", "NANOSLEEP", "BAR", "BMOV", "DEPBAR", "LDGDEPBAR", "WARPGROUP", "SYNCS", "ACQBULK", "ELECT"}


def classify(opcode: str) -> str:
    """Class of a SASS opcode ("DFMA", "F2F.F64.F32", "IMAD.MOV.U32", "ULDC.64"): FP64 is
    everything on the FP64 pipe, conversions to or from float64 included; constant loads (LDC,
    ULDC) count as memory; uniform-datapath ALU ops as integer; the rest of `CLASSES` by name."""
    parts = opcode.split(".")
    base = parts[0]
    if base in _FP64:
        return "fp64"
    if base in _CONV:
        return "fp64" if "F64" in parts[1:] else "conv"
    if base == "MUFU":
        return "mufu"
    if base in _FP32:
        return "fp32"
    if base in _TENSOR:
        return "tensor"
    if base in _MEM or base == "ULDC":
        return "mem"
    if base in _CONTROL:
        return "control"
    if base in _INT or (base.startswith("U") and base[1:] in _INT | {"MOV", "IMAD", "SEL"}):
        return "int"
    return "other"


def class_counts(opcodes) -> dict:
    """{class: count} over `CLASSES`, with "total" and "dmul_dfma" (the DMUL and DFMA among the
    FP64). NOPs (alignment padding) are left out."""
    counts = Counter()
    for op in opcodes:
        if op.split(".")[0] == "NOP":
            continue
        counts[classify(op)] += 1
        counts["total"] += 1
        if op.split(".")[0] in ("DMUL", "DFMA"):
            counts["dmul_dfma"] += 1
    return {k: counts.get(k, 0) for k in ("total", *CLASSES, "dmul_dfma")}


# ------------------------------------------------------------------------------- SASS parsing


@dataclass
class Instruction:
    """One SASS instruction as nvdisasm prints it."""

    addr: int
    guard: str       # "" or the predicate, "@!P0"
    opcode: str      # with its modifiers, "IMAD.MOV.U32"
    operands: str
    targets: list    # branch target labels (BRA, BRX with nvdisasm's BRANCH_TARGETS, JMP, JMX)


@dataclass
class Function:
    """The instructions and labels of one kernel's text section (its subroutines included)."""

    name: str
    instructions: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> address


_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s*(.*?)\s*;?\s*$")
_GUARD = re.compile(r"^(@!?U?P[T0-9]+)\s+")
_SECTION = re.compile(r"^\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^([.$\w][^\s:]*):\s*$")


def parse_sass(text: str) -> dict:
    """nvdisasm output -> {function name: Function}. Labels (".L_x_12", subroutine names) map to
    the address of the instruction that follows them."""
    functions, current, pending = {}, None, []
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            current = functions[section.group(1)] = Function(section.group(1))
            pending = []
            continue
        if current is None:
            continue
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        match = _INSTR.match(line)
        if not match:
            continue
        addr, body = int(match.group(1), 16), match.group(2)
        annotation = re.search(r'\(\*"BRANCH_TARGETS ([^"]*)"\*\)', body)
        body = re.sub(r"\(\*.*?\*\)", "", body).strip().rstrip(";").strip()
        guard = _GUARD.match(body)
        if guard:
            body = body[guard.end():]
        opcode, _, operands = body.partition(" ")
        base = opcode.split(".")[0]
        targets = []
        if base in ("BRA", "JMP", "BRX", "JMX"):
            targets = re.findall(r"`\(([^)]+)\)", operands)
            if annotation:
                targets += [t.strip() for t in annotation.group(1).split(",") if t.strip()]
        for name in pending:
            current.labels[name] = addr
        pending = []
        current.instructions.append(Instruction(addr, guard.group(1) if guard else "", opcode, operands.strip(),
                                                targets))
    return functions


# ------------------------------------------------------------------------- control flow, loops


@dataclass
class Block:
    """A basic block: instructions from a label or a branch to the next branch or label."""

    index: int
    start: int                 # address of the first instruction
    end: int                   # address of the last instruction
    instructions: list
    successors: list = field(default_factory=list)


@dataclass
class Loop:
    """A natural loop: its header, every block of its body, and its place in the loop nest."""

    header: int                # block index
    blocks: set
    latches: list              # blocks branching back to the header
    parent: "Loop | None" = None
    children: list = field(default_factory=list)
    depth: int = 1

    def own_blocks(self) -> set:
        """The body without the blocks of the loops nested in it."""
        nested = set()
        for child in self.children:
            nested |= child.blocks
        return self.blocks - nested


def _falls_through(ins: Instruction) -> bool:
    base = ins.opcode.split(".")[0]
    unconditional = ins.guard in ("", "@PT")
    if base in ("EXIT", "RET", "KILL"):
        return not unconditional
    if base in ("BRX", "JMX"):
        return False
    if base in ("BRA", "JMP"):
        # `BRA P1, label` and BRA.DIV/.CONV branch on a condition of their own
        conditional_form = "." in ins.opcode or not ins.operands.startswith("`")
        return not unconditional or conditional_form
    return True


def basic_blocks(fn: Function) -> list:
    """The function's basic blocks with their successor edges (calls fall through: a subroutine
    is reached only through CALL, so it is not part of the caller's flow graph)."""
    ins = fn.instructions
    if not ins:
        return []
    label_addrs = set(fn.labels.values())
    leaders = {ins[0].addr} | label_addrs
    for a, b in zip(ins, ins[1:]):
        if a.opcode.split(".")[0] in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "KILL"):
            leaders.add(b.addr)
    blocks, current = [], []
    for i in ins:
        if i.addr in leaders and current:
            blocks.append(current)
            current = []
        current.append(i)
    blocks.append(current)
    out = [Block(n, b[0].addr, b[-1].addr, b) for n, b in enumerate(blocks)]
    by_start = {b.start: b.index for b in out}
    for block in out:
        last = block.instructions[-1]
        succ = []
        for target in last.targets:
            if target in fn.labels and fn.labels[target] in by_start:
                succ.append(by_start[fn.labels[target]])
        if _falls_through(last) and block.index + 1 < len(out):
            succ.append(block.index + 1)
        block.successors = list(dict.fromkeys(succ))
    return out


def _dominators(blocks: list, reachable: list) -> dict:
    """Iterative dominator sets over the blocks reachable from the entry (block 0)."""
    preds = {b: [] for b in reachable}
    for b in reachable:
        for s in blocks[b].successors:
            if s in preds:
                preds[s].append(b)
    every = set(reachable)
    dom = {b: set(every) for b in reachable}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in reachable[1:]:
            new = set.intersection(*(dom[p] for p in preds[b])) if preds[b] else set()
            new = new | {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def find_loops(blocks: list) -> list:
    """Natural loops (one per header, its back edges merged), with parent/children and depth set;
    outermost first."""
    if not blocks:
        return []
    seen, stack = {0}, [0]
    while stack:
        b = stack.pop()
        for s in blocks[b].successors:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    reachable = sorted(seen)
    dom = _dominators(blocks, reachable)
    preds = {b: [] for b in reachable}
    for b in reachable:
        for s in blocks[b].successors:
            preds[s].append(b)
    latches = {}
    for b in reachable:
        for s in blocks[b].successors:
            if s in dom[b]:
                latches.setdefault(s, []).append(b)
    loops = []
    for header, tails in latches.items():
        body, work = {header}, list(tails)
        while work:
            b = work.pop()
            if b not in body:
                body.add(b)
                work.extend(preds[b])
        loops.append(Loop(header, body, sorted(tails)))
    loops.sort(key=lambda lp: -len(lp.blocks))
    for i, inner in enumerate(loops):
        for outer in reversed(loops[:i]):  # the smallest enclosing loop
            if inner.blocks < outer.blocks:
                inner.parent = outer
                outer.children.append(inner)
                break
    for lp in loops:
        d, p = 1, lp.parent
        while p is not None:
            d, p = d + 1, p.parent
        lp.depth = d
    return loops


def _ranges(blocks: list, indices) -> list:
    """Contiguous address ranges [first, last] covered by the given blocks."""
    spans = sorted((blocks[i].start, blocks[i].end) for i in indices)
    out = []
    for start, end in spans:
        if out and start <= out[-1][1] + 16:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _max_path(blocks: list, loop: Loop) -> int | None:
    """Instructions on the longest path from the loop's header to a latch through its own body,
    each nested loop collapsed to a node of weight 0; None if that graph has a cycle."""
    rep = {b: b for b in loop.blocks}
    for child in loop.children:
        for b in child.blocks:
            rep[b] = ("loop", child.header)
    weight = Counter()
    for b in loop.own_blocks():
        weight[b] = sum(1 for i in blocks[b].instructions if i.opcode.split(".")[0] != "NOP")
    edges = {}
    for b in loop.blocks:
        for s in blocks[b].successors:
            if s in loop.blocks and s != loop.header and rep[s] != rep[b]:
                edges.setdefault(rep[b], set()).add(rep[s])
    ends = {rep[t] for t in loop.latches}
    best, state = {}, {}

    def longest(node):  # longest weighted path from node to a latch; -inf if none
        if state.get(node) == 1:
            raise ValueError("cycle")
        if node in best:
            return best[node]
        state[node] = 1
        tail = max((longest(s) for s in edges.get(node, ())), default=float("-inf"))
        if node in ends:
            tail = max(tail, 0)
        state[node] = 2
        best[node] = weight.get(node, 0) + tail if tail != float("-inf") else float("-inf")
        return best[node]

    sys.setrecursionlimit(max(10000, 4 * len(blocks)))
    try:
        result = longest(rep[loop.header])
    except ValueError:
        return None
    return None if result == float("-inf") else int(result)


HOT_RULES = {
    "element-load": "the innermost loop with a global load (LDG) in its own body: the per-row loop, the one "
                    "loop that reads s (the forward's other innermost loop adds up shared-memory warp sums)",
    "tile-sweep": "the loop that directly encloses the first innermost loop in address order: the tile "
                  "product's loop over D (_s_tile) opens the column-block loop's body (stats_kernel, grad_block_kernel, "
                  "grad_fused_kernel, whose wait for its turn to add into dy is a later nested loop)",
}


def _hot_loop(loops: list, blocks: list, rule: str) -> "Loop | None":
    innermost = [lp for lp in loops if not lp.children]
    if rule == "element-load":
        loading = [lp for lp in innermost
                   if any(i.opcode.split(".")[0] == "LDG" for b in lp.own_blocks() for i in blocks[b].instructions)]
        return max(loading, key=lambda lp: len(lp.own_blocks()), default=None)
    if rule == "tile-sweep":
        first = min(innermost, key=lambda lp: blocks[lp.header].start, default=None)
        return first.parent if first is not None and first.parent is not None else first
    raise ValueError(f"unknown hot-loop rule {rule!r}")


def analyse(fn: Function, rule: str | None = None) -> dict:
    """Whole-kernel class counts, every loop (address ranges, depth, own-body counts, longest
    path), and the hot loop chosen by `rule` (a HOT_RULES key; None: no hot loop)."""
    blocks = basic_blocks(fn)
    loops = find_loops(blocks)
    hot = _hot_loop(loops, blocks, rule) if rule else None
    entries = []
    for lp in loops:
        own = lp.own_blocks()
        opcodes = [i.opcode for b in own for i in blocks[b].instructions]
        entries.append(dict(
            header=f"{blocks[lp.header].start:#06x}",
            ranges=[f"{a:#06x}-{b:#06x}" for a, b in _ranges(blocks, lp.blocks)],
            depth=lp.depth,
            nested=[f"{blocks[c.header].start:#06x}" for c in lp.children],
            body=sum(1 for b in lp.blocks for i in blocks[b].instructions if i.opcode.split(".")[0] != "NOP"),
            own=class_counts(opcodes),
            own_ranges=[f"{a:#06x}-{b:#06x}" for a, b in _ranges(blocks, own)],
            max_path=_max_path(blocks, lp),
            calls=sum(1 for b in own for i in blocks[b].instructions if i.opcode.startswith("CALL")),
            opcodes=dict(Counter(i.opcode for b in own for i in blocks[b].instructions
                                 if not i.opcode.startswith("NOP")).most_common()),
            hot=lp is hot,
        ))
    all_ops = [i.opcode for i in fn.instructions]
    subroutine_start = min((a for name, a in fn.labels.items() if name.startswith("$")), default=None)
    sub_ops = [i.opcode for i in fn.instructions if subroutine_start is not None and i.addr >= subroutine_start]
    return dict(counts=class_counts(all_ops), subroutines=class_counts(sub_ops), loops=entries, hot_rule=rule,
                hot=next((e for e in entries if e["hot"]), None))


# ------------------------------------------------------------------------------------ tools


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _release(tool: str) -> str:
    try:
        out = _run([tool, "--version"]).stdout
    except OSError:
        return "?"
    match = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return f"{match.group(1)} ({match.group(2)})" if match else out.strip().splitlines()[-1]


def find_nvcc() -> str | None:
    """$NVCC, nvcc on PATH, or /usr/local/cuda/bin/nvcc (as csrc/tests/nvcc_check.sh)."""
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_nvdisasm(nvcc: str | None) -> str | None:
    """$NVDISASM, the toolkit's nvdisasm (next to the real nvcc), nvdisasm on PATH, or the copy
    Triton ships. nvdisasm, not cuobjdump: only its dataflow pass names the targets of an
    indirect branch (BRX), without which the blocks of a switch look unreachable."""
    candidates = [os.environ.get("NVDISASM")]
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), "nvdisasm"))
        candidates.append(os.path.join(os.path.dirname(nvcc), "nvdisasm"))
    candidates.append(shutil.which("nvdisasm"))
    try:
        from triton import knobs

        candidates.append(knobs.nvidia.nvdisasm.path)
    except Exception:  # no triton, or no nvdisasm in it
        pass
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def disassemble(nvdisasm: str, cubin: str) -> dict:
    """{function: Function} of a cubin file."""
    run = _run([nvdisasm, "-c", cubin])
    if run.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin}:\n{run.stdout}")
    return parse_sass(run.stdout)


def ptxas_resources(log: str) -> dict:
    """{mangled name: {registers, stack, spill_stores, spill_loads}} from a ptxas -v log."""
    out, name = {}, None
    for line in log.splitlines():
        entry = re.search(r"(?:Compiling entry function|Function properties for) '?([\w$]+)'?", line)
        if entry:
            name = entry.group(1)
            out.setdefault(name, dict(registers=0, stack=0, spill_stores=0, spill_loads=0))
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if frame and name:
            out[name].update(stack=int(frame.group(1)), spill_stores=int(frame.group(2)),
                             spill_loads=int(frame.group(3)))
        regs = re.search(r"Used (\d+) registers", line)
        if regs and name:
            out[name]["registers"] = int(regs.group(1))
    return out


# -------------------------------------------------------------------------------- profiles

# The methods' term sets (README "How each paper maps onto the API"): the CUDA template flags
# <kKl, kFmse, kLogdet> (MSE has no flag: its statistic is always formed), the evidence kind
# (evidential_ops.config.EVIDENCE_KINDS index) and aot_check's term-set name.
METHODS = {
    "tcl": dict(flags=(1, 0, 0), evidence=0, evidence_name="exp"),
    "uml": dict(flags=(0, 1, 1), evidence=3, evidence_name="exp_tanh"),
    "duq": dict(flags=(0, 0, 0), evidence=1, evidence_name="relu"),
}
# evidential_ops.config.EVIDENCE_KINDS in index order (the CUDA kernels' kEvidence), without
# importing the package (and torch) here.
EVIDENCE_NAMES = ("exp", "relu", "softplus", "exp_tanh")
CUDA_FILES = {"fwd": "forward_kernels.cu", "bwd": "backward_kernels.cu", "line": "line_kernels.cu"}
CUDA_KERNELS = {"fwd": "forward_stats_kernel", "bwd": "gradient_kernel"}
LINE_KERNELS = ("line_losses_kernel", "line_gradients_kernel")

# The CUDA element kernels' template arguments: <kFloat32, stored type of s, [of ∂L/∂s,] evidence,
# kKl, kFmse, kLogdet>, in their mangled form. The float32 path's main instantiations fix the
# stored types (float32 s; ∂L/∂s float32 or bfloat16) and the evidence map (its EVIDENCE_KINDS
# index); its generic one (half views of a given s, rarer output kinds) takes both at run time.
STORED = {"fwd": {"float32": "f"}, "bwd": {"float32": "ff", "bf16 ∂L/∂s": "f13__nv_bfloat16"}}
# the generic instantiation's stored types (the backward's second one is a back-reference)
ANY_STORED = {"fwd": r"NS0_9AnyStoredE", "bwd": r"NS0_9AnyStoredES\d*_"}
CUDA_BUILDS = {"cuda": "float32", "cuda-any": None}  # build -> stored key (None: the generic one)
INSTANTIATION = re.compile(r"ILb1E(?P<stored>.*?)Li(?P<evidence>n1|\d)ELb(?P<kl>\d)ELb(?P<fmse>\d)ELb(?P<logdet>\d)EE")


def _cuda_symbol(functions: dict, kernel: str, flags, evidence, stored: str | None) -> str | None:
    """The float32-path instantiation of `kernel` for the term flags: with `stored` (a STORED key)
    and the evidence map fixed, or (stored None) the generic one."""
    if stored is None:
        arguments = ANY_STORED[_direction_of(kernel)] + "Lin1E"
    else:
        arguments = re.escape(STORED[_direction_of(kernel)][stored]) + f"Li{evidence}E"
    pattern = re.compile(rf"{kernel}ILb1E{arguments}Lb{flags[0]}ELb{flags[1]}ELb{flags[2]}EE")
    return next((name for name in functions if pattern.search(name)), None)


def _direction_of(kernel: str) -> str:
    return next(d for d, k in CUDA_KERNELS.items() if k == kernel)


def _instantiation(direction: str, symbol: str) -> dict | None:
    """A float32-path instantiation's template arguments from its symbol: stored (a STORED key or
    "any"), evidence (index, None for run-time), flags ("klfmselogdet" digits); None otherwise."""
    found = re.search(CUDA_KERNELS[direction] + INSTANTIATION.pattern, symbol)
    if not found:
        return None
    stored = next((k for k, v in STORED[direction].items() if v == found["stored"]), None)
    if stored is None and not re.fullmatch(ANY_STORED[direction], found["stored"]):
        return None
    return dict(stored=stored or "any", evidence=None if found["evidence"] == "n1" else int(found["evidence"]),
                flags=found["kl"] + found["fmse"] + found["logdet"])


def _float32_s_loads(opcodes: dict) -> int:
    """32-bit global loads in the loop body of an instantiation with float32 s: the loads of s; the
    LineGradient constants of the backward are 64-bit loads."""
    return sum(n for op, n in opcodes.items() if re.fullmatch(r"LDG(\.E)?(\.(CONSTANT|EF|EL|LU|EU|NA|SYS|GPU|"
                                                             r"STRONG\.\w+|ZFILL))*", op))


def cuda_elements_per_iteration(direction: str) -> int:
    """Elements one thread handles per iteration of its row loop: the direction's kernel file's
    kColumnsPerThread (its columns, unrolled), 1 for a kernel without that constant (one column
    per thread). The "cuda" build checks it: its loop body loads s once per element."""
    return source_ints(os.path.join(ROOT, "csrc", "cuda", CUDA_FILES[direction])).get("kColumnsPerThread", 1)


def source_ints(path: str) -> dict:
    """The `constexpr int kName = <integer product>;` constants of a source file."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return {m.group(1): math.prod(int(f) for f in m.group(2).split("*"))
            for m in re.finditer(r"constexpr\s+(?:int|std::int64_t)\s+(k\w+)\s*=\s*(\d+(?:\s*\*\s*\d+)*)\s*;", text)}


def enabled_slots(kl: bool, fmse: bool, logdet: bool) -> int:
    """Statistic slots the CUDA forward sums per element for these terms (forward_kernels.cu
    slot_enabled, ported): rest and squares always, kl h, fisher, and the logdet's two."""
    return 2 + bool(kl) + bool(fmse) + 2 * bool(logdet)


def cuda_stage_rows(method: str) -> int:
    """Rows per warp stage of forward_stats_kernel's float32 path (forward_kernels.cu stage_rows,
    ported): after that many iterations of its row loop, the warp adds up the rows' lane sums
    staged in shared memory, in the enclosing loop's own body."""
    forward = source_ints(os.path.join(ROOT, "csrc", "cuda", "forward_kernels.cu"))
    plan = source_ints(os.path.join(ROOT, "csrc", "cuda", "strip_plan.h"))
    slots = enabled_slots(*METHODS[method]["flags"])
    warps = plan["kThreads"] // forward["kColumnsPerThread"] // 32
    free = forward["kStaticSharedBytes"] - forward["kRowChunk"] * plan["kStatSlots"] * warps * 8
    rows = 8
    while rows > 1 and warps * slots * rows * forward["kStageLanes"] * 8 > free:
        rows //= 2
    return rows


def stage_share(row: dict, key: str) -> float:
    """Instructions of class `key` per element in the stage around a CUDA forward's row loop (its
    own body, once per stage_rows iterations of the row loop); 0 for every other kernel."""
    stage = row.get("stage")
    if not stage:
        return 0.0
    value = stage["own"][key] if key in stage["own"] else stage[key]
    return (value or 0) / stage["elements"]


def profile_cuda(nvcc: str, nvdisasm: str, methods, directions, builds, workdir: str) -> tuple:
    """Rows of the CUDA builds `builds` (CUDA_BUILDS keys) for the methods and directions, and the
    whole-kernel counts of every float32-path instantiation of the element kernels."""
    rows, instantiations = [], []
    for direction in directions:
        source = os.path.join(ROOT, "csrc", "cuda", CUDA_FILES[direction])
        cubin = os.path.join(workdir, os.path.basename(source) + ".cubin")
        compiled = _run([nvcc, *NVCC_FLAGS, source, "-o", cubin], cwd=ROOT)
        if compiled.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source}:\n{compiled.stdout}")
        resources = ptxas_resources(compiled.stdout)
        functions = disassemble(nvdisasm, cubin)
        if direction != "line":
            for symbol, fn in functions.items():
                found = _instantiation(direction, symbol)
                if found:
                    counts = analyse(fn)["counts"]
                    used = [m for m in METHODS if "".join(map(str, METHODS[m]["flags"])) == found["flags"]]
                    instantiations.append(dict(direction=direction, kernel=CUDA_KERNELS[direction], methods=used,
                                               registers=resources.get(symbol, {}).get("registers"), **found,
                                               **counts))
        if direction == "line":  # part of the "cuda" build (no instantiations to choose from)
            targets = [(None, None, k, next((n for n in functions if k in n), None)) for k in LINE_KERNELS
                       if "cuda" in builds]
        else:
            kernel = CUDA_KERNELS[direction]
            targets = [(m, build, kernel, _cuda_symbol(functions, kernel, METHODS[m]["flags"], METHODS[m]["evidence"],
                                                       CUDA_BUILDS[build]))
                       for build in builds for m in methods]
        for method, build, kernel, symbol in targets:
            if symbol is None:
                raise RuntimeError(f"{kernel} ({method}, {build}) not found in {cubin}")
            result = analyse(functions[symbol], None if direction == "line" else "element-load")
            fixed = (f"evidence {METHODS[method]['evidence_name']}, float32 s and ∂L/∂s" if build == "cuda" else
                     "evidence map and dtypes at run time")
            row = dict(backend=build or "cuda", method=method or "any", direction=direction, kernel=kernel,
                       symbol=symbol, source=os.path.relpath(source, ROOT) + (f" ({fixed})" if method else ""),
                       resources=resources.get(symbol, {}), **result)
            if direction == "line":
                row["elements_per_iteration"] = None  # one thread per line, no element loop
            else:
                elements = cuda_elements_per_iteration(direction)
                row["elements_per_iteration"] = elements
                hot = row["hot"]
                stage = next((lp for lp in row["loops"] if hot is not None and hot["header"] in lp["nested"]), None)
                if direction == "fwd" and stage is not None:
                    rows_per_stage = cuda_stage_rows(method)
                    row["stage"] = dict(own=stage["own"], max_path=stage["max_path"], rows=rows_per_stage,
                                        elements=rows_per_stage * elements)
                if build == "cuda" and row["hot"] is not None:
                    loads = _float32_s_loads(row["hot"]["opcodes"])
                    row["s_loads_in_loop"] = loads
                    if loads and loads % elements == 0 and loads != elements:
                        # the compiler unrolled the row loop: that many rows per iteration
                        row["elements_per_iteration"] = loads
                        row["unrolled_rows"] = loads // elements
                    elif loads != elements:
                        row["warning"] = (f"{loads} float32 loads of s in the loop body, {elements} elements "
                                          f"expected: elements per iteration taken as {elements}")
            rows.append(row)
    return rows, instantiations


def profile_triton(methods, directions, dtype_path: str, nvdisasm: str, workdir: str) -> list:
    """Rows of the Triton default configurations (stats_kernel forward; grad_fused_kernel and
    grad_block_kernel backward), and of the same kernels sweeping stored strips of s (float32
    inputs with IEEE products, or TF32 ones at wide D, launch.similarity_strips: row "variant"
    "strip", whose element loop is the innermost loop that loads s; compiled from the TF32 jobs,
    a strip's sweep issues no product)."""
    sys.path.insert(0, ROOT)
    from evidential_ops.triton_backend import aot_check
    from triton.backends.compiler import GPUTarget

    aot_check.compile_environment()
    target = GPUTarget("cuda", ARCH, 32)
    wanted = {"fwd": ("stats",), "bwd": ("grad_fused", "grad")}
    rules = {"stats": "tile-sweep", "grad_fused": "tile-sweep", "grad": "tile-sweep"}
    sweeps = [(d, k, "tile") for d in directions for k in wanted.get(d, ())]
    sweeps += [(d, k, "strip") for d in directions for k in {"fwd": ("stats",), "bwd": ("grad",)}.get(d, ())]
    rows = []
    for direction, kernel, sweep in sweeps:
        for method in methods:
            variant = f"{method} {dtype_path}" if sweep == "tile" else f"{method} tf32 strip"
            job = next((j for j in aot_check.jobs(ARCH, quick=True)
                        if j.default and j.kernel == kernel and j.variant == variant), None)
            if job is None:  # the fused backward takes 16-bit inputs only
                continue
            compiled, log = aot_check.compile_with_log(job, target)
            cubin = os.path.join(workdir, f"triton_{job.kernel}_{method}_{sweep}.cubin")
            with open(cubin, "wb") as handle:
                handle.write(compiled.asm["cubin"])
            functions = disassemble(nvdisasm, cubin)
            name = next(iter(functions))
            block = job.constexprs["BLOCK_M"] * job.constexprs["BLOCK_N"]
            row = dict(backend="triton", method=method, direction=direction, kernel=f"{job.kernel}_kernel",
                       symbol=name, source=f"{job.config} {variant} (aot_check job)", variant=sweep,
                       resources=aot_check.resources(log), elements_per_iteration=block / (32 * job.num_warps),
                       **analyse(functions[name], rules[kernel] if sweep == "tile" else "element-load"))
            if block < 32 * job.num_warps:
                row["warning"] = "a tile smaller than the program's threads: elements are replicated across threads"
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------- report


def per_element(row: dict, key: str) -> float | None:
    """Per element: the hot loop's own body, plus its share of the stage around it (CUDA forward)."""
    if row.get("hot") is None or not row.get("elements_per_iteration"):
        return None
    value = row["hot"]["own"][key] if key in row["hot"]["own"] else row["hot"][key]
    return None if value is None else value / row["elements_per_iteration"] + stage_share(row, key)


def _fmt(x, digits=1) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x)}"


def _title(row: dict) -> str:
    direction = {"fwd": "forward", "bwd": "backward", "line": "per line"}[row["direction"]]
    method = row["method"].upper() if row["method"] != "any" else ""
    return f"{method} {direction}".strip()


def _build(row: dict) -> str:
    if row["backend"] == "cuda":
        if row["direction"] == "line":
            return "CUDA"
        return f"CUDA ({METHODS[row['method']]['evidence_name']}, float32 s and ∂L/∂s)"
    if row["backend"] == "cuda-any":
        return "CUDA generic (run-time evidence and dtypes)"
    kernel = row["kernel"].removesuffix("_kernel")
    return f"Triton {kernel} " + row["source"].split(" ")[0] + (" strip of s" if row.get("variant") == "strip" else "")


def markdown(report: dict) -> str:
    """The report as markdown: header, per-element table, whole-kernel table, loop listing."""
    h = report["header"]
    lines = [
        f"# Static profile of the element kernels, sm_{ARCH} ({h['label']})",
        "",
        f"Written by `bench/static_profile.py` at commit `{h['commit']}`; nvcc {h['nvcc']}, triton "
        f"{h['triton']} (ptxas {h['triton_ptxas']}), nvdisasm {h['nvdisasm']}. No GPU involved: "
        "static SASS of the cubins, counted per instruction class.",
        "",
    ]
    lines += [f"- {note}" for note in h["notes"]]
    lines += [
        "",
        "Per element: the instructions in the hot loop's own body (see Loops below) divided by the "
        "elements one thread handles per iteration (elem/it). Static: both sides of every branch are "
        "counted; \"max path\" is the longest path through that body, an upper bound on what one "
        "iteration issues (slow-path subroutines aside). FP64 includes conversions to or from float64; "
        "mem includes constant loads; DMUL+DFMA is part of FP64. CUDA forward: plus the share of each element in "
        "the warp's stage reduction around the row loop (its own body, once per stage of rows: \"stage\" column, "
        "included in the others).",
        "",
        "## Instructions per element in the hot loop",
        "",
        "| kernel | build | elem/it | total | max path | stage | FP64 | DMUL+DFMA | "
        + " | ".join(CLASS_TITLES[c] for c in CLASSES[1:]) + " |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(CLASSES) - 1),
    ]
    for row in report["rows"]:
        if row.get("hot") is None:
            continue
        cells = [per_element(row, k) for k in ("total", "max_path")]
        cells.append(round(stage_share(row, "total"), 1) if row.get("stage") else None)
        cells += [per_element(row, k) for k in ("fp64", "dmul_dfma", *CLASSES[1:])]
        lines.append(f"| {_title(row)} | {_build(row)} | {_fmt(row['elements_per_iteration'])} | "
                     + " | ".join(_fmt(c) for c in cells) + " |")
    lines += [
        "",
        "## Whole kernel (static instruction counts)",
        "",
        "Every instruction of the kernel, its slow-path subroutines (division, reciprocal) included; "
        "\"in subr.\" is the part of DMUL+DFMA that lies in those subroutines.",
        "",
        "| kernel | build | total | FP64 | DMUL+DFMA | in subr. | FP32 | MUFU | regs | stack | spill st/ld |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        k, r = row["counts"], row["resources"]
        name = _title(row) if row["direction"] != "line" else row["kernel"]
        lines.append(f"| {name} | {_build(row)} | {k['total']} | {k['fp64']} | {k['dmul_dfma']} | "
                     f"{row['subroutines']['dmul_dfma']} | {k['fp32']} | {k['mufu']} | {r.get('registers', '?')} | "
                     f"{r.get('stack', '?')} | {r.get('spill_stores', '?')}/{r.get('spill_loads', '?')} |")
    if report["cuda_instantiations"]:
        lines += [
            "",
            "Every float32-path instantiation of the CUDA element kernels, whole-kernel instructions (DMUL+DFMA "
            "in brackets): per term set <kKl, kFmse, kLogdet>, with float32 s and ∂L/∂s for each evidence "
            "map, with bfloat16 ∂L/∂s (the bfloat16 inputs' path; the backward), and the generic one (evidence "
            "map and dtypes switched at run time: half views of a given s):",
            "",
        ]
        columns = [("float32", e) for e in range(len(EVIDENCE_NAMES))] + [("bf16 ∂L/∂s", e)
                                                                        for e in range(len(EVIDENCE_NAMES))]
        columns.append(("any", None))
        present = {(k["stored"], k["evidence"]) for k in report["cuda_instantiations"]}
        columns = [c for c in columns if c in present]
        lines.append("| kernel | kKl kFmse kLogdet | term set of | "
                     + " | ".join(("generic" if s == "any" else f"{EVIDENCE_NAMES[e]}" + (", bf16 ∂L/∂s" if s != "float32" else ""))
                                  for s, e in columns) + " | regs |")
        lines.append("|---|---|---|" + "---:|" * len(columns) + "---|")
        by_key = {(k["kernel"], k["flags"], k["stored"], k["evidence"]): k for k in report["cuda_instantiations"]}
        for kernel, flags in sorted({(k["kernel"], k["flags"]) for k in report["cuda_instantiations"]},
                                    key=lambda kf: (kf[0], kf[1][::-1])):
            cells, registers = [], []
            for stored, evidence in columns:
                k = by_key.get((kernel, flags, stored, evidence))
                cells.append(f"{k['total']} ({k['dmul_dfma']})" if k else "–")
                if k:
                    registers.append(k["registers"])
            used = next(k["methods"] for k in report["cuda_instantiations"] if (k["kernel"], k["flags"]) == (kernel, flags))
            regs = [r for r in registers if r is not None]
            lines.append(f"| {kernel} | {' '.join(flags)} | {', '.join(m.upper() for m in used)} | " + " | ".join(cells)
                         + (f" | {min(regs)}–{max(regs)} |" if regs else " | ? |"))
    lines += [
        "",
        "## Loops",
        "",
        "Every natural loop of each kernel: header address, address ranges of its blocks, nesting depth, "
        "instructions in the whole body and in its own body (without nested loops), the longest path "
        "through the own body, and the CALLs (slow paths, not counted) in it. The hot loop (*), for the "
        "CUDA element kernels: " + HOT_RULES["element-load"] + "; for Triton: " + HOT_RULES["tile-sweep"] + ".",
        "",
        "| kernel | build | symbol | loop | ranges | depth | body | own | max path | calls |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        symbol = row["symbol"] if len(row["symbol"]) < 40 else "…" + row["symbol"][-36:]
        for lp in row["loops"]:
            lines.append(f"| {_title(row) if row['direction'] != 'line' else row['kernel']} | {_build(row)} | "
                         f"`{symbol}` | {lp['header']}{'*' if lp['hot'] else ''} | {', '.join(lp['ranges'])} | "
                         f"{lp['depth']} | {lp['body']} | {lp['own']['total']} | {_fmt(lp['max_path'])} | "
                         f"{lp['calls']} |")
    unrolled = [f"{_title(r)} {_build(r)}: the compiler unrolled the row loop {r['unrolled_rows']}×, so its body "
                f"holds {r['elements_per_iteration']} elements (its loads of s)" for r in report["rows"]
                if r.get("unrolled_rows")]
    if unrolled:
        lines += ["", "Unrolled row loops:", ""] + [f"- {u}" for u in unrolled]
    warnings = [f"{_title(r)} {_build(r)}: {r['warning']}" for r in report["rows"] if r.get("warning")]
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    lines.append("")
    return "\n".join(lines)


def _commit() -> str:
    run = _run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT)
    commit = run.stdout.strip() if run.returncode == 0 else "unknown"
    dirty = _run(["git", "status", "--porcelain", "--", "csrc", "evidential_ops"], cwd=ROOT)
    return commit + ("+uncommitted changes to csrc/ or evidential_ops/" if dirty.stdout.strip() else "")


def report_parser(doc: str, default_out: str) -> argparse.ArgumentParser:
    """The command line of a bench script that writes a markdown report (and its JSON): the
    module docstring's first paragraph as description, its third on as epilog, and --out."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=doc.split("\n\n", 2)[2])
    parser.add_argument("--out", default=default_out, help="markdown report; the JSON goes next to it "
                        "(default: %(default)s)")
    return parser


def main(argv=None) -> int:
    """Command line (see the module docstring); 0 also where nothing could be compiled."""
    parser = report_parser(__doc__, DEFAULT_OUT)
    parser.add_argument("--label", help="name of this profile in the report's title (default: from --out, "
                        "static_profile_<label>.md, else 'current')")
    parser.add_argument("--backend", nargs="+", choices=(*CUDA_BUILDS, "triton"), default=[*CUDA_BUILDS, "triton"],
                        help="cuda: the CUDA element kernels the methods run for float32 s and ∂L/∂s (their "
                             "evidence map and dtypes compiled in); cuda-any: the generic instantiation, which "
                             "switches on both per element; triton: the default Triton configurations")
    parser.add_argument("--loss", nargs="+", choices=tuple(METHODS), default=list(METHODS))
    parser.add_argument("--direction", nargs="+", choices=("fwd", "bwd", "line"), default=["fwd", "bwd", "line"],
                        help="line: the CUDA per-line kernels (whole-kernel counts only)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the report's header (repeatable)")
    parser.add_argument("--triton-path", choices=("f32", "tf32", "bf16"), default="f32",
                        help="input path of the Triton tile product (aot_check.DTYPE_PATHS)")
    args = parser.parse_args(argv)
    label = args.label or (re.fullmatch(r"static_profile_(.+)\.md", os.path.basename(args.out)) or
                           [None, "current"])[1]
    start = time.time()
    notes, rows, instantiations = [], [], []
    nvcc = find_nvcc()
    nvdisasm = find_nvdisasm(nvcc)
    if nvdisasm is None:
        print("static-profile: no nvdisasm (CUDA toolkit or triton's copy): skipping")
        return 0
    try:
        import triton

        triton_version, triton_ptxas = triton.__version__, triton.knobs.nvidia.ptxas.version
    except Exception as error:
        triton_version, triton_ptxas = None, None
        triton_error = f"{type(error).__name__}: {error}"
    with tempfile.TemporaryDirectory(prefix="eo-static-profile-") as workdir:
        cuda_builds = [b for b in args.backend if b.startswith("cuda")]
        if cuda_builds and nvcc is None:
            print("static-profile: nvcc not found: skipping the CUDA kernels (set NVCC=/path/to/nvcc)")
            notes.append("CUDA kernels skipped: no nvcc")
        elif cuda_builds:
            cuda_rows, instantiations = profile_cuda(nvcc, nvdisasm, args.loss, args.direction, cuda_builds,
                                                     workdir)
            rows += cuda_rows
        if "triton" in args.backend and triton_version is None:
            print(f"static-profile: triton cannot compile here ({triton_error}): skipping the Triton kernels")
            notes.append("Triton kernels skipped: triton not importable")
        elif "triton" in args.backend:
            rows += profile_triton(args.loss, args.direction, args.triton_path, nvdisasm, workdir)
    if not rows:
        print("static-profile: nothing profiled: no report written")
        return 0
    notes.insert(0, "CUDA element kernels: a thread owns a few columns (forward: "
                    f"{cuda_elements_per_iteration('fwd')}, strided by 32; backward: "
                    f"{cuda_elements_per_iteration('bwd')}), one row of them (elem/it elements) per iteration of its "
                    "row loop. The kernels are instantiated per evidence map and stored types of s and ∂L/∂s "
                    "for the float32 path of every product of embeddings (s float32, ∂L/∂s float32 or bfloat16): "
                    "\"CUDA (map, float32 s and ∂L/∂s)\" is the one a method runs; \"generic\" the instantiation "
                    "for other views (a given half s), which switches on the map and the dtypes per element.")
    if "triton" in args.backend and triton_version is not None:
        notes.append(f"Triton: default sm_{ARCH} configurations (configs.DEFAULTS_BY_ARCH), {args.triton_path} "
                     "input path, compiled as aot_check compiles them (forward: stats_kernel with the own and the "
                     "other lines' statistics, OWN=OTHER=1; backward: grad_fused_kernel, 16-bit inputs with D in "
                     "one register block, and grad_block_kernel, G of a strip of rows); "
                     "elem/it = BLOCK_M·BLOCK_N/(32·num_warps).")
    notes += args.note
    report = dict(header=dict(label=label, commit=_commit(), arch=f"sm_{ARCH}",
                              nvcc=_release(nvcc) if nvcc else None, triton=triton_version,
                              triton_ptxas=triton_ptxas, nvdisasm=_release(nvdisasm), nvdisasm_path=nvdisasm,
                              notes=notes, seconds=round(time.time() - start, 1)),
                  rows=rows, cuda_instantiations=instantiations)
    for row in rows:
        print(f"static-profile: {_title(row):14s} {_build(row):46s} "
              + (f"loop {'+'.join(row['hot']['ranges'])}: {per_element(row, 'total'):6.1f} instr/elem, "
                 f"{per_element(row, 'dmul_dfma'):5.1f} DMUL+DFMA/elem; " if row.get("hot") else "")
              + f"{row['counts']['dmul_dfma']} DMUL+DFMA in the kernel, {row['resources'].get('registers')} regs")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(markdown(report))
    with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    print(f"static-profile: {len(rows)} kernels in {time.time() - start:.0f} s, written to {args.out} (+ .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
