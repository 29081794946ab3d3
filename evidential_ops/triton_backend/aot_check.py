"""Ahead-of-time compile check of the Triton kernels: no GPU needed.

    python -m evidential_ops.triton_backend.aot_check [--arch 90 80] [--quick]

Compiles every kernel in every configuration of configs.SPACE (and the defaults) for
GPUTarget("cuda", 90, 32) and ("cuda", 80, 32), each in its heaviest specialisations (all five
terms; exp evidence, whose scaled path is the longest; float32 and bfloat16 inputs; both
directions at once), runs the ptxas that ships with Triton with -v on the PTX, and prints the
registers, stack frame and spill bytes of each, and how many threads hold each element of the s
tile (`replication`: 1, every element evaluated once). Each generation is compiled with its own default
configurations (configs.DEFAULTS_BY_ARCH). Exits 1 if anything fails to compile, a default
configuration spills (on the --strict-arch targets: both by default) or repeats tile elements
across threads; exits 0 with a message where
triton cannot compile here (not importable, or no ptxas). Run by `make triton-aot-check` (part of
`make test`).

Instruction counts of the compiled code (per element in the hot loop, by class, float64 DMUL/DFMA
apart) are bench/static_profile.py's, which compiles the default configurations the same way
(`compile_environment`).

It also compiles every default-configuration kernel as torch.compile's Inductor sees it: Inductor
does not call our kernels, it rebuilds each one's source from the global names it uses
(`inductor_rebuild`), and a helper it cannot resolve there (a module alias, a module-level float)
fails only on a GPU, at the first compiled training step.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, replace

# The term sets of the methods (README "How each paper maps onto the API") with their evidence,
# and every term at once (the test suite's combination). Default configurations must compile
# without spills for the methods' sets; the all-terms set is compiled and reported.
TERM_SETS = {
    "tcl": (dict(MSE=0, KL=1, FMSE=0, LOGDET=0), 0),   # risk + kl, exp
    "uml": (dict(MSE=0, KL=0, FMSE=1, LOGDET=1), 3),   # fmse + logdet, exp_tanh
    "duq": (dict(MSE=1, KL=0, FMSE=0, LOGDET=0), 1),   # mse, relu
    "all": (dict(MSE=1, KL=1, FMSE=1, LOGDET=1), 0),   # every term, exp
}
REQUIRED = ("tcl", "uml", "duq")
# Input paths of the tile products: float32 "ieee" (FMA), float32 "tf32" and bfloat16 (tensor cores).
DTYPE_PATHS = {"f32": ("fp32", 0), "tf32": ("fp32", 1), "bf16": ("bf16", 0)}


@dataclass
class Job:
    kernel: str
    config: str
    variant: str
    default: bool  # a default configuration in a required term set: must not spill
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    attrs: dict | None = None  # ASTSource attrs: the specialisations of a real launch (`_launch_attrs`)
    coverage: bool = False  # compiled in every run (--quick too) so that it compiles at all; spills not gated


def _signature(fn, types: dict, constexprs: dict) -> dict:
    """Triton signature: every parameter typed ("*fp32", "i32", "fp64") or "constexpr"."""
    return {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}


# What a launch on contiguous (K, D) embeddings with D a multiple of 16 (every realistic embedding
# size) lets the JIT specialise: the unit strides become constants 1, and the pointers, D and the
# row strides are known multiples of 16. Without them the tile loads of 16-bit inputs cannot be
# vectorised to the 4 bytes an asynchronous copy needs, and the pipeliner leaves them synchronous:
# the compile would not be the one the GPU runs.
UNIT_STRIDES = ("stride_ak", "stride_bk", "stride_gj", "stride_dak", "stride_dbk")
ALIGNED = ("a_ptr", "b_ptr", "g_ptr", "da_ptr", "db_ptr", "stride_ai", "stride_bj", "stride_gi", "stride_dai",
           "stride_dbj", "D")


def _launch_attrs(fn, constexprs: dict, unit=UNIT_STRIDES, aligned=ALIGNED) -> dict:
    """Adds the unit strides to `constexprs`; the divisibility attributes of the aligned arguments."""
    for name in unit:
        if name in fn.arg_names:
            constexprs[name] = 1
    return {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned if name in fn.arg_names}


# A strip of s read by columns (launch._strip_statistics: the own lines are the strip's columns):
# unit stride along the own lines, the row stride (the strip's width, K) a multiple of 16.
STRIP_BY_COLUMNS = dict(unit=("stride_ai",), aligned=("a_ptr", "stride_ak", "own_ptr", "part_ptr"))


def _variants(default: bool, quick: bool):
    """(term set, dtype path) pairs: all of them for a default configuration; for the others the
    all-terms set in each dtype path and TCL in bfloat16."""
    if default:
        return [(t, d) for t in TERM_SETS for d in DTYPE_PATHS]
    return [] if quick else [("all", d) for d in DTYPE_PATHS] + [("tcl", "bf16")]


def _stats_types(dtype: str) -> dict:
    """stats_kernel's runtime arguments for inputs of `dtype` ("fp32", "bf16", "fp64")."""
    return dict(a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", stride_ai="i32", stride_ak="i32", stride_bj="i32",
                stride_bk="i32", own_ptr="*fp64", n_own="i32", other_ptr="*fp64", n_other="i32", part_ptr="*fp64",
                n_programs="i32", blocks_per_program="i32", D="i32", t_off="i32", inv_tau="fp64")


def _grad_types(dtype: str) -> dict:
    """grad_block_kernel's runtime arguments for inputs of `dtype`."""
    return dict(a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", stride_ai="i32", stride_ak="i32", stride_bj="i32",
                stride_bk="i32", g_ptr=f"*{dtype}", stride_gi="i32", stride_gj="i32", own_ptr="*fp64", n_own="i32",
                other_ptr="*fp64", n_other="i32", row0="i32", n_rows="i32", col0="i32", n_cols="i32",
                n_col_programs="i32", col_blocks_per_program="i32", D="i32", t_off="i32", inv_tau="fp64",
                scaled_ptr="*i32")


def _similarity_types(dtype: str) -> dict:
    """grad_similarity_kernel's runtime arguments for a given s of `dtype`."""
    return dict(s_ptr=f"*{dtype}", stride_si="i32", stride_sj="i32", ds_ptr=f"*{dtype}", stride_di="i32",
                stride_dj="i32", row_ptr="*fp64", n_rows="i32", col_ptr="*fp64", n_cols="i32", inv_tau="fp64")


def jobs(arch: int, quick: bool = False) -> list[Job]:
    """What to compile for sm_<arch>: that generation's default configurations (configs.
    DEFAULTS_BY_ARCH) in every required variant, and the autotuning space."""
    from . import configs, kernels

    defaults = configs.DEFAULTS_BY_ARCH[90 if arch >= 90 else 80]
    out = []
    for kernel in ("stats", "grad", "grad_fused"):
        if kernel not in defaults:
            continue  # not launched on this generation
        for config in dict.fromkeys((defaults[kernel], *configs.SPACE[kernel])):
            is_default = config == defaults[kernel]
            for term_set, path in _variants(is_default, quick):
                if kernel == "grad_fused" and path != "bf16":
                    continue  # launch.BackwardPlan fuses 16-bit inputs only
                flags, evidence = TERM_SETS[term_set]
                dtype, tf32 = DTYPE_PATHS[path]
                # How the sweeps get their s tiles: stepping through D ("tiled"), from a given s
                # (float32), with the row block resident across the sweep (D <= RESIDENT_D,
                # tensor-core paths: launch._resident_d), compiled at the widest such D, or from
                # stored strips of cuBLAS products ("strip": float32 inputs with IEEE products, or
                # with TF32 ones wider than that, and 16-bit inputs, launch.similarity_strips; the
                # stats sweep reads its strip by columns, a float32 strip whatever the inputs: the
                # 16-bit one is the float32 one; the gradient of 16-bit inputs reads s in float32
                # and stores G in the input dtype, BackwardPlan.s_apart).
                modes = ["tiled"]
                if kernel == "stats" and is_default:
                    modes += ["from-s"] if path == "f32" else ["resident"] if arch >= 90 else []
                if kernel in ("stats", "grad") and is_default and path in ("f32", "tf32"):
                    modes += ["strip"]
                if kernel == "grad" and is_default and path == "bf16":
                    modes += ["strip"]
                # exp evidence's gradient kernel also in its second variant, p = α/S from mantissas
                # and exponents (line strengths beyond 2^126: grad_block_kernel SCALED_P)
                scaled = (0, 1) if kernel == "grad" and evidence == 0 else (0,)
                for mode, scaled_p in [(m, p) for p in scaled for m in modes]:
                    from_s = mode in ("from-s", "strip")
                    if kernel == "stats":
                        fn = kernels.stats_kernel
                        constexprs = dict(EVIDENCE=evidence, HAS_TARGET=1, **flags, OWN=1, OTHER=1,
                                          FROM_S=int(from_s), F64=0, TF32=tf32, BLOCK_M=config.block_m,
                                          BLOCK_N=config.block_n, BLOCK_K=max(config.block_k, 16), RESIDENT=0)
                        if mode == "resident":
                            constexprs.update(BLOCK_K=configs.RESIDENT_D, RESIDENT=1)
                        types = _stats_types(dtype)
                    elif kernel == "grad":
                        fn = kernels.grad_block_kernel
                        constexprs = dict(EVIDENCE=evidence, **flags, F64=0, TF32=tf32, BLOCK_M=config.block_m,
                                          BLOCK_N=config.block_n, BLOCK_K=max(config.block_k, 16),
                                          FROM_S=int(from_s), SCALED_P=scaled_p)
                        types = _grad_types(dtype)
                        if from_s:
                            types["a_ptr"] = "*fp32"
                    else:
                        fn = kernels.grad_fused_kernel
                        constexprs = dict(EVIDENCE=evidence, **flags, F64=0, TF32=tf32, BLOCK_M=config.block_m,
                                          BLOCK_N=config.block_n, BLOCK_K=max(config.block_k, 16),
                                          BLOCK_D=configs.MAX_REGISTER_D)
                        types = dict(a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", stride_ai="i32", stride_ak="i32",
                                     stride_bj="i32", stride_bk="i32", da_ptr=f"*{dtype}", stride_dai="i32",
                                     stride_dak="i32", db_ptr="*fp32", stride_dbj="i32", stride_dbk="i32",
                                     turn_ptr="*i32", own_ptr="*fp64", n_own="i32", other_ptr="*fp64",
                                     n_other="i32", D="i32", t_off="i32", inv_tau="fp64")
                    variant = f"{term_set} {path}" + ("" if mode == "tiled" else f" {mode}") + \
                        (" scaled-p" if scaled_p else "")
                    if mode == "from-s":
                        attrs = None
                    elif mode == "strip" and kernel == "stats":
                        attrs = _launch_attrs(fn, constexprs, **STRIP_BY_COLUMNS)
                    else:
                        attrs = _launch_attrs(fn, constexprs)
                    out.append(Job(kernel, config.name(), variant, is_default and term_set in REQUIRED, fn,
                                   _signature(fn, types, constexprs), constexprs, config.num_warps,
                                   config.num_stages, attrs))
    for config in dict.fromkeys((defaults["grad_similarity"], *configs.SPACE["grad_similarity"])):
        is_default = config == defaults["grad_similarity"]
        for term_set in (tuple(TERM_SETS) if is_default else () if quick else ("all",)):
            flags, evidence = TERM_SETS[term_set]
            fn = kernels.grad_similarity_kernel
            constexprs = dict(EVIDENCE=evidence, **flags, F64=0, BLOCK_M=config.block_m, BLOCK_N=config.block_n)
            types = _similarity_types("fp32")
            out.append(Job("grad_similarity", config.name(), f"{term_set} f32", is_default and term_set in REQUIRED,
                           fn, _signature(fn, types, constexprs), constexprs, config.num_warps, config.num_stages))
    # per-line kernels (fixed launch: BLOCK = 128 lines, 4 warps), every term
    line_types = dict(stats_ptr="*fp64", n="i32", scale_ptr="*fp64", scale_offset="i32", candidates="fp64",
                      weights_ptr="*fp64", w0="fp64", w1="fp64", w2="fp64", w3="fp64", w4="fp64",
                      upstream_ptr="*fp64", out_ptr="*fp64")
    all_flags = TERM_SETS["all"][0]
    for name, fn in (("line_loss", kernels.line_loss_kernel), ("line_gradient", kernels.line_gradient_kernel)):
        constexprs = dict(HAS_SCALE=1, W_FROM_PTR=1, RISK=1, **all_flags, BLOCK=128)
        types = {k: v for k, v in line_types.items() if k in fn.arg_names}
        out.append(Job(name, "b128w4", "all f64", True, fn, _signature(fn, types, constexprs), constexprs, 4, 1))
    constexprs = dict(**all_flags, BLOCK=128, CLEAR=1)
    types = dict(part_ptr="*fp64", n_partials="i32", stats_ptr="*fp64", n="i32", stats_stride="i32")
    out.append(Job("reduce_partials", "b128w4", "all f64", True, kernels.reduce_partials_kernel,
                   _signature(kernels.reduce_partials_kernel, types, constexprs), constexprs, 4, 1))
    return out + coverage_jobs(defaults)


def coverage_jobs(defaults: dict) -> list[Job]:
    """Kernels compiled for coverage only: the float64 variants of the sweeps (float64 inputs; the
    first GPU run, triton 3.6, rejected their tl.dot accumulators where the interpreter, which runs
    float32 only, had taken them) and the InfoNCE kernels in float32 and float64, D in one register
    block and accumulated (infonce_launch.py's fixed tiles)."""
    from . import infonce_kernels, infonce_launch, kernels

    out = []
    flags, evidence = TERM_SETS["all"]
    stats, grad = defaults["stats"], defaults["grad"]
    for from_s in (0, 1):
        constexprs = dict(EVIDENCE=evidence, HAS_TARGET=1, **flags, OWN=1, OTHER=1, FROM_S=from_s, F64=1, TF32=0,
                          BLOCK_M=stats.block_m, BLOCK_N=stats.block_n, BLOCK_K=max(stats.block_k, 16), RESIDENT=0)
        fn = kernels.stats_kernel
        out.append(Job("stats", stats.name(), "all f64" + (" from-s" if from_s else ""), False, fn,
                       _signature(fn, _stats_types("fp64"), constexprs), constexprs, stats.num_warps,
                       stats.num_stages, coverage=True))
    constexprs = dict(EVIDENCE=evidence, **flags, F64=1, TF32=0, BLOCK_M=grad.block_m, BLOCK_N=grad.block_n,
                      BLOCK_K=max(grad.block_k, 16), FROM_S=0, SCALED_P=0)
    fn = kernels.grad_block_kernel
    out.append(Job("grad", grad.name(), "all f64", False, fn, _signature(fn, _grad_types("fp64"), constexprs),
                   constexprs, grad.num_warps, grad.num_stages, coverage=True))
    similarity = defaults["grad_similarity"]
    constexprs = dict(EVIDENCE=evidence, **flags, F64=1, BLOCK_M=similarity.block_m, BLOCK_N=similarity.block_n)
    fn = kernels.grad_similarity_kernel
    out.append(Job("grad_similarity", similarity.name(), "all f64", False, fn,
                   _signature(fn, _similarity_types("fp64"), constexprs), constexprs, similarity.num_warps,
                   similarity.num_stages, coverage=True))
    tiles = dict(BLOCK_M=infonce_launch.BLOCK_M, BLOCK_N=infonce_launch.BLOCK_N, BLOCK_K=infonce_launch.BLOCK_K)
    config = f"m{tiles['BLOCK_M']}n{tiles['BLOCK_N']}k{tiles['BLOCK_K']}"
    stats_types = dict(stride_qi="i32", stride_qk="i32", stride_cj="i32", stride_ck="i32", g_ptr="*i64",
                       out_ptr="*fp64", state_ptr="*fp64", M="i32", ROW0="i32", N="i32", COL0="i32", K="i32",
                       D="i32", inv_tau="fp64")
    for dtype, f64 in (("fp32", 0), ("fp64", 1)):
        fn = infonce_kernels.infonce_stats_kernel
        constexprs = dict(HAS_GROUP=1, DROP_SELF=1, F64=f64, FROM_S=0, LOAD=0, FINISH=1, **tiles)
        types = dict(q_ptr=f"*{dtype}", c_ptr=f"*{dtype}", **stats_types)
        out.append(Job("infonce_stats", config, f"group {dtype[2:]}", False, fn, _signature(fn, types, constexprs),
                       constexprs, 4, 3, coverage=True))
    # The strips (infonce_launch.uses_strips): the stats kernel reading a stored float32 strip, its
    # lines' running sums carried over, and G formed over a strip in place.
    strip_tiles = dict(BLOCK_M=infonce_launch.STRIP_BLOCK_M, BLOCK_N=infonce_launch.STRIP_BLOCK_N)
    strip_config = f"m{strip_tiles['BLOCK_M']}n{strip_tiles['BLOCK_N']}"
    for finish in (0, 1):
        fn = infonce_kernels.infonce_stats_kernel
        constexprs = dict(HAS_GROUP=1, DROP_SELF=1, F64=0, FROM_S=1, LOAD=1, FINISH=finish, BLOCK_K=16, **strip_tiles)
        types = dict(q_ptr="*fp32", c_ptr="*fp32", **stats_types)
        out.append(Job("infonce_stats", strip_config, "group strip" + (" finish" if finish else ""), False, fn,
                       _signature(fn, types, constexprs), constexprs, 4, 3, coverage=True))
    fn = infonce_kernels.infonce_strip_grad_kernel
    for split, part in ((0, "fp32"), (1, "bf16")):
        constexprs = dict(HAS_GROUP=1, DROP_SELF=1, OWN=1, OTHER=1, SPLIT=split, **strip_tiles)
        types = dict(s_ptr="*fp32", stride_si="i32", stride_sj="i32", hi_ptr=f"*{part}", lo_ptr=f"*{part}",
                     stride_pi="i32", g_ptr="*i64", own_ptr="*fp64", own_up_ptr="*fp64", own_miss_ptr="*fp64",
                     other_ptr="*fp64", other_up_ptr="*fp64", other_miss_ptr="*fp64", M="i32", ROW0="i32", K="i32",
                     inv_tau="fp64")
        out.append(Job("infonce_strip_grad", strip_config, "group strip" + (" split bf16" if split else ""), False,
                       fn, _signature(fn, types, constexprs), constexprs, 4, 3, coverage=True))
    for dtype, f64 in (("fp32", 0), ("fp64", 1)):
        for accumulate, block_d in ((0, 128), (1, infonce_launch.MAX_BLOCK_D)):
            fn = infonce_kernels.infonce_grad_kernel
            constexprs = dict(HAS_GROUP=1, DROP_SELF=1, OWN=1, OTHER=1, F64=f64, ACCUMULATE=accumulate,
                              BLOCK_D=block_d, **tiles)
            types = dict(q_ptr=f"*{dtype}", c_ptr=f"*{dtype}", stride_qi="i32", stride_qk="i32", stride_cj="i32",
                         stride_ck="i32", g_ptr="*i64", out_ptr=f"*{dtype}", stride_oi="i32", stride_ok="i32",
                         own_ptr="*fp64", own_up_ptr="*fp64", own_miss_ptr="*fp64", other_ptr="*fp64",
                         other_up_ptr="*fp64", other_miss_ptr="*fp64", K="i32", D="i32", inv_tau="fp64")
            out.append(Job("infonce_grad", config, f"group {dtype[2:]}" + (" accumulate" if accumulate else ""),
                           False, fn, _signature(fn, types, constexprs), constexprs, 4, 3, coverage=True))
    return out


def compile_environment() -> None:
    """The environment `compile_with_log` needs, set before triton is first used: a real compile
    whatever the caller's environment, and a fresh one each time."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # the ptxas log exists only for a real compile


def compile_with_log(job: Job, target) -> tuple[object, str]:
    """Compile `job` for `target`; the ptxas -v log of Triton's own ptxas run (its options, its
    ptxas), captured through the TRITON_DUMP_PTXAS_LOG knob."""
    import contextlib
    import io

    import triton
    from triton import knobs

    src = triton.compiler.ASTSource(fn=job.fn, signature=job.signature, constexprs=job.constexprs, attrs=job.attrs)
    buffer = io.StringIO()
    with knobs.nvidia.scope():
        knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(buffer):
            compiled = triton.compile(src, target=target,
                                      options=dict(num_warps=job.num_warps, num_stages=job.num_stages))
    return compiled, buffer.getvalue()


_LAYOUT = re.compile(r"^#(\w+) = #ttg\.(blocked|nvidia_mma)<\{(.*)\}>", re.M)


def _layout_cover(kind: str, body: str) -> list[int]:
    """Rows and columns one repetition of a 2-D distributed layout spans (all threads, all warps)."""
    def field(name):
        match = re.search(name + r" = \[([\d, ]+)\]", body)
        return [int(v) for v in match.group(1).split(",")]

    if kind == "blocked":
        return [a * b * c for a, b, c in zip(field("sizePerThread"), field("threadsPerWarp"), field("warpsPerCTA"))]
    # wgmma (v3): a warp holds 16 rows × instrShape N; mma.sync (v2): 16 × 8 per repetition
    major = int(re.search(r"versionMajor = (\d+)", body).group(1))
    per_warp = [16, field("instrShape")[1]] if major == 3 else [16, 8]
    return [w * p for w, p in zip(field("warpsPerCTA"), per_warp)]


def replication(ttgir: str, block_m: int, block_n: int) -> int:
    """How many threads hold each element of an s-tile-shaped tensor (BLOCK_M × BLOCK_N, or its
    transpose), worst over the layouts those tensors take in the compiled kernel: 1 when every
    element is evaluated once. A layout spanning more rows (columns) than the tile has repeats
    them across warps, and every per-element function runs on each copy (a 16-row tile in an MMA
    layout with warpsPerCTA [2, 2] spans 32 rows: factor 2)."""
    layouts = {name: _layout_cover(kind, body) for name, kind, body in _LAYOUT.findall(ttgir)}
    worst = 1
    for rows, cols, name in re.findall(r"tensor<(\d+)x(\d+)x\w+, #(\w+)>", ttgir):
        shape = [int(rows), int(cols)]
        if name not in layouts or sorted(shape) != sorted([block_m, block_n]):
            continue
        factor = 1
        for extent, cover in zip(shape, layouts[name]):
            factor *= max(1, cover // extent)
        worst = max(worst, factor)
    return worst


def inductor_rebuild(fn, directory: str):
    """The kernel `fn` rebuilt the way Inductor rebuilds a user-defined Triton kernel for a compiled
    graph: its transitive-closure source in a module of its own (written under `directory`), the
    kernel itself jitted as Inductor's own decorator does. None where this torch has no such function
    (a private API)."""
    import importlib.util

    import triton

    try:
        from torch._inductor.codegen.wrapper import (
            user_defined_triton_kernel_transitive_closure_source_code as closure_source,
        )
    except ImportError:
        return None
    name = fn.fn.__name__
    source = "import triton\nimport triton.language as tl\n\n" + closure_source(fn)
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(f"eo_inductor_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return triton.jit(getattr(module, name))


def resources(log: str) -> dict:
    """Registers, stack frame and spill bytes from a ptxas -v log (one entry function)."""
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    target = re.search(r"for '(sm_\w+)'", log)
    if regs is None:
        raise RuntimeError("no ptxas -v output captured (a cached compile?): set TRITON_ALWAYS_COMPILE=1")
    return dict(target=target.group(1) if target else "?", registers=int(regs.group(1)),
                stack=int(frame.group(1)) if frame else 0, spill_stores=int(frame.group(2)) if frame else 0,
                spill_loads=int(frame.group(3)) if frame else 0)


def inductor_failures(all_jobs: list, target) -> list:
    """Compile the default-configuration jobs with each kernel rebuilt as Inductor rebuilds it;
    the failures, as lines."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="eo-inductor-") as directory:
        try:
            rebuilt = {}
            for job in all_jobs:
                if job.default and job.fn not in rebuilt:
                    rebuilt[job.fn] = inductor_rebuild(job.fn, directory)
        except Exception as error:  # the rebuild itself failing is a finding, not a skip
            return [f"Inductor rebuild: {type(error).__name__}: {error}"]
        if None in rebuilt.values():
            print("triton-aot-check: this torch cannot rebuild kernels as Inductor does: Inductor check skipped")
            return []
        failures = []
        for job in all_jobs:
            if not job.default:
                continue
            try:
                compile_with_log(replace(job, fn=rebuilt[job.fn]), target)
            except Exception as error:
                failures.append(f"{job.kernel} {job.config} {job.variant} as Inductor rebuilds it: "
                                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    print(f"triton-aot-check: {len(rebuilt)} kernels rebuilt as Inductor does, "
          f"{sum(j.default for j in all_jobs)} default variants compiled for sm_{target.arch}, "
          f"{len(failures)} failures")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--quick", action="store_true", help="default configurations only")
    parser.add_argument("--strict-arch", type=int, nargs="*", default=[90, 80],
                        help="archs on which a spill in a default configuration fails the check (default: both; "
                             "each generation is checked with its own defaults)")
    args = parser.parse_args(argv)
    compile_environment()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
    except Exception as error:
        print(f"triton-aot-check: triton cannot compile here ({type(error).__name__}: {error}): skipping")
        return 0
    jobs_by_arch = {arch: [j for j in jobs(arch, args.quick) if j.default or j.coverage or not args.quick]
                    for arch in args.arch}
    print(f"triton-aot-check: triton {triton.__version__}, "
          + ", ".join(f"{len(j)} kernel variants for sm_{a}" for a, j in jobs_by_arch.items()))
    print(f"{'kernel':16s} {'config':18s} {'variant':34s} {'arch':7s} {'regs':>4s} {'stack':>5s} {'spill st/ld':>11s} "
          f"{'copies':>6s}")
    failures, default_spills, replicated = [], [], []
    start = time.time()
    for arch in args.arch:
        target = GPUTarget("cuda", arch, 32)
        for job in jobs_by_arch[arch]:
            try:
                compiled, log = compile_with_log(job, target)
                res = resources(log)
                copies = (replication(compiled.asm["ttgir"], job.constexprs["BLOCK_M"], job.constexprs["BLOCK_N"])
                          if "BLOCK_N" in job.constexprs else 1)
            except Exception as error:
                failures.append(f"{job.kernel} {job.config} {job.variant} sm_{arch}: {type(error).__name__}: "
                                f"{str(error).splitlines()[0] if str(error) else ''}")
                print(f"{job.kernel:16s} {job.config:18s} {job.variant:34s} sm_{arch}  FAILED")
                continue
            spills = res["spill_stores"] + res["spill_loads"]
            mark = "*" if job.default else " "
            print(f"{job.kernel:16s} {job.config + mark:18s} {job.variant:34s} {res['target']:7s} {res['registers']:4d} "
                  f"{res['stack']:5d} {res['spill_stores']:5d}/{res['spill_loads']:<5d} {copies:6d}")
            if job.default and copies > 1:
                replicated.append(f"{job.kernel} {job.config} {job.variant} sm_{arch}: each tile element held by "
                                  f"{copies} threads")
            if job.default and spills:
                default_spills.append((arch in args.strict_arch, f"{job.kernel} {job.config} {job.variant} "
                                                                 f"{res['target']} ({spills} bytes)"))
    print(f"triton-aot-check: compiled in {time.time() - start:.0f} s (* = default configuration)")
    failures += inductor_failures(jobs_by_arch[args.arch[0]], GPUTarget("cuda", args.arch[0], 32))
    for failure in failures:
        print(f"triton-aot-check: FAILED {failure}")
    for line in replicated:
        print(f"triton-aot-check: DUPLICATED element work in a default configuration: {line}")
    for strict, spill in default_spills:
        print(f"triton-aot-check: {'SPILLS' if strict else 'warning: spills'} in a default configuration: {spill}")
    strict_spills = [spill for strict, spill in default_spills if strict]
    gated = f"sm_{'/'.join(map(str, args.strict_arch))}" if args.strict_arch else "no arch (not gated)"
    print(f"triton-aot-check: {len(failures)} compile failures, {len(strict_spills)} default-configuration spills on "
          f"{gated}, {len(default_spills) - len(strict_spills)} elsewhere")
    return 1 if failures or strict_spills or replicated else 0


if __name__ == "__main__":
    sys.exit(main())
