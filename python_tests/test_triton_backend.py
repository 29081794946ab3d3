"""Triton-specific tests (the shared suite, test_fused_backends.py, covers the op contract).

They need the triton backend: on a GPU, or in Triton's interpreter on CPU tensors with
TRITON_INTERPRET=1 set before the import (`make triton-test`). Elsewhere they are skipped.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import torch

import evidential_ops as eo
from conftest import hard_pairs, random_pairs

pytestmark = pytest.mark.skipif("triton" not in eo.available_backends(),
                                reason=f"triton backend not available: {eo.triton_backend.UNAVAILABLE}")

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def tile_kernels_for_ieee(monkeypatch):
    """These tests are about the tile kernels unless they say otherwise: eager launches would take
    float32 IEEE embeddings' s from cuBLAS strips (launch.similarity_strips), and a test that forces
    a tile sweep's partials, passes or plans would then pass without running them. The strips'
    own tests set the width back (or replace similarity_strips). 16-bit inputs likewise."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 1 << 30)
    monkeypatch.setattr(launch, "HALF_SIMILARITY_STRIPS_ABOVE_D", 1 << 30)


# ------------------------------------------------------------------------- special functions


triton = pytest.importorskip("triton")
tl = triton.language
from evidential_ops.triton_backend import special as sp  # noqa: E402

# Compiled (a GPU), the float32 set takes the GPU's approximate reciprocal, quotient and exp, as
# elementary_f32.h does in the CUDA build (special.py); the interpreter runs the IEEE forms, the
# CPU's (exp evidence's e^x excepted: its ex2 reduction, with 2^f correctly rounded). The
# function-level bounds and the bits below are the IEEE forms'; compiled, the kernels'
# losses and gradients are held to SPEC §5 by the loss-level tests here, as the CUDA build's are by
# its emulated test (csrc/tests/test_cuda_emulated.cpp), which moves each approximation further.
COMPILED = not sp.INTERPRETED
ieee_forms_only = pytest.mark.skipif(COMPILED, reason="checks the IEEE forms of the float32 set, which only the "
                                     "interpreter runs (compiled: the GPU's approximations)")


@triton.jit
def _special_kernel(x_ptr, r_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """(11, BLOCK): ψ, ψ1, ψ2, lnΓ, h, v, r, x·r', ln ψ1, ψ(x+r) − ψ(x), ψ1(x+r) − ψ1(x)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=2.0)
    r = tl.load(r_ptr + i, mask=m, other=2.0)
    small, xs, zz, log_z, u = sp.plain_argument(x)
    dg, tg, ttg, lg, xtg, x2ttg = sp.polygammas_scaled(small, xs, zz, log_z, u)
    v, _xv = sp.kl_v(x, tg, u)
    rr, xrp = sp.fisher_remainder(x, tg, ttg, u)
    tl.store(o_ptr + i, dg, mask=m)
    tl.store(o_ptr + BLOCK + i, tg, mask=m)
    tl.store(o_ptr + 2 * BLOCK + i, ttg, mask=m)
    tl.store(o_ptr + 3 * BLOCK + i, lg, mask=m)
    tl.store(o_ptr + 4 * BLOCK + i, sp.kl_h(xs, small, dg, lg, log_z, u), mask=m)
    tl.store(o_ptr + 5 * BLOCK + i, v, mask=m)
    tl.store(o_ptr + 6 * BLOCK + i, rr, mask=m)
    tl.store(o_ptr + 7 * BLOCK + i, xrp, mask=m)
    tl.store(o_ptr + 8 * BLOCK + i, sp.log_trigamma(small, tg, xtg, log_z), mask=m)
    tl.store(o_ptr + 9 * BLOCK + i, sp.digamma_difference(x, r), mask=m)
    tl.store(o_ptr + 10 * BLOCK + i, sp.trigamma_difference(x, r), mask=m)


def _special_values(xs: torch.Tensor, rs: torch.Tensor) -> torch.Tensor:
    block = triton.next_power_of_2(max(16, xs.numel()))
    out = torch.zeros(11 * block, dtype=xs.dtype, device=xs.device)
    _special_kernel[(1,)](xs, rs, out, xs.numel(), block)
    return out.view(11, block)[:, : xs.numel()].cpu()


def _mp_reference(x: float, r: float) -> list[float]:
    import mpmath

    with mpmath.workdps(60):
        x, r = mpmath.mpf(x), mpmath.mpf(r)
        t1, t2 = mpmath.psi(1, x), mpmath.psi(2, x)
        return [float(v) for v in (
            mpmath.digamma(x), t1, t2, mpmath.loggamma(x), (x - 1) * mpmath.digamma(x) - mpmath.loggamma(x) - x,
            1 - (x - 1) * t1, 1 / t1 - x + mpmath.mpf(1) / 2, x * (-t2 / t1**2 - 1), mpmath.log(t1),
            mpmath.digamma(x + r) - mpmath.digamma(x), mpmath.psi(1, x + r) - t1)]


XS = [1.0, 1.3, 2.0, 5.5, 7.99, 8.0, 9.5, 15.9, 16.0, 29.0, 31.0, 100.0, 1e4, 4.9e8]
RS = [0.0, 0.5, 3.0, 1e-3, 100.0, 7.0, 1e5, 2.0, 1e-8, 50.0, 1e3, 1e6, 1.0, 3e8]
NAMES = ("digamma", "trigamma", "tetragamma", "lgamma", "kl_h", "kl_v", "r", "x_r_prime", "log_trigamma",
         "digamma_difference", "trigamma_difference")


def test_triton_special_functions_against_mpmath():
    """The float64 tl ports of csrc/kernels/special_functions.h against 60-digit mpmath: relative
    error, or absolute where the value is near 0 (lnΓ(2) = 0). Float32 inputs take the float32 set
    (test_triton_float32_special_functions_*)."""
    xs = torch.tensor(XS, dtype=torch.float64, device=device())
    rs = torch.tensor(RS, dtype=torch.float64, device=device())
    got = _special_values(xs, rs)
    for j, name in enumerate(NAMES):
        for i, (x, r) in enumerate(zip(xs.tolist(), rs.tolist())):
            ref = _mp_reference(x, r)[j]
            # Relative error; absolute where a value is near 0 (lnΓ(2) = 0) and for r and x·r', which
            # are small corrections summed against (N − 1)/2 (their direct forms below the series
            # threshold cancel: ~1e-12 relative at 8).
            absolute = name == "lgamma" or name in ("r", "x_r_prime")
            error = abs(float(got[j, i]) - ref) / max(abs(ref), 1.0 if absolute else 1e-300)
            assert error <= (8e-13 if absolute else 2e-13), (name, x, r, float(got[j, i]), ref, error)


# ------------------------------------------------------------------ float32 special functions
#
# special.py's float32 set mirrors csrc/kernels/special_functions_f32.h and elementary_f32.h (SPEC §2
# "Float32 element math"). Held here to the SPEC's ulp table: the bounds the full sweep measured
# for the C++ functions, per function and interval, at the points and with the mpmath values of
# csrc/tests/float32_reference_table.h (what the C++ unit test reads). The test kernels are
# launched without floating-point contraction, so a GPU rounds every step as the interpreter (IEEE
# float32 operations, one rounding each) and as the C++ generic build do; the loss kernels contract
# multiply-adds into FMAs as the AVX2 and AVX-512 builds, whose errors the same bounds include.

F32_TABLE = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "tests" / "float32_reference_table.h"
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)


def _reference_table() -> dict:
    """{domain: dict(functions, x, reference, lo, hi, bound)} parsed from the C++ header (±1e300
    stand for unbounded intervals there)."""
    import re

    text = F32_TABLE.read_text(encoding="utf-8")
    out = {}
    for domain, names in re.findall(r"// Domain (\w+): functions ([^(]+) \(", text):
        def numbers(field):
            start = text.index(f"k_{domain}_{field}")
            body = text[text.index("{", start) + 1: text.index("};", start)]
            body = re.sub(r"//[^\n]*", "", body)
            values = [float(v.rstrip("f")) for v in re.findall(r"-?[\d.]+(?:e[-+]?\d+)?f?", body)]
            return np.array([math.copysign(math.inf, v) if abs(v) == 1e300 else v for v in values])

        functions = [n.strip() for n in names.split(",")]
        x = numbers("x").astype(np.float32)
        lo, hi = numbers("interval_lo"), numbers("interval_hi")
        out[domain] = dict(functions=functions, x=x, lo=lo, hi=hi,
                           reference=numbers("reference").reshape(len(x), len(functions)),
                           bound=numbers("bound").reshape(len(functions), len(lo)))
    return out


def _ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got − ref| in float32 ulps at ref (2^-149 below FLT_MIN); a ref beyond FLT_MAX must be
    matched by an infinity of its sign (bench/float32_special_sweep.py `ulps`)."""
    got = got.astype(np.float64)
    overflow = np.abs(ref) >= FLT_MAX * (1 + 2.0**-24)
    _, e = np.frexp(np.maximum(np.abs(ref), FLT_MIN))
    ulp = np.ldexp(1.0, e - 24)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(np.isfinite(got), np.abs(got - ref) / ulp, np.inf)
    return np.where(overflow, np.where(np.isinf(got) & (np.sign(got) == np.sign(ref)), 0.0, np.inf), err)


F32_ALPHA_FUNCTIONS = ("digamma", "lgamma", "x_trigamma", "x2_tetragamma", "kl_h_plus_one", "x_kl_v",
                       "log_trigamma", "remainder", "x_remainder_prime", "fisher_slope",
                       "tetragamma_trigamma_ratio", "exp", "log", "log1p")


@triton.jit
def _special_f32_kernel(x_ptr, o_ptr, n, BEYOND: tl.constexpr, BLOCK: tl.constexpr):
    """F32_ALPHA_FUNCTIONS at x (α), or with BEYOND at α = e^x beyond FLT_MAX (the kernels' log-space
    entry); exp, log, log1p of x itself. Output (14, BLOCK)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=2.0)
    if BEYOND:
        alpha = sp.inf_f32(x)
        beyond = tl.full(x.shape, 1, tl.int1)
    else:
        alpha = x
        beyond = tl.full(x.shape, 0, tl.int1)
    series, s, log_z, inv_z, dg, lg, xt, x2t = sp.element_polygammas_f32(alpha, beyond, x)
    r, xrp = sp.fisher_remainder_f32(series, s, inv_z)
    values = (dg, lg, xt, x2t, sp.kl_h_plus_one_f32(alpha, series, s, log_z, inv_z), sp.x_kl_v_f32(series, s, inv_z),
              sp.log_trigamma_f32(alpha, series, s, log_z, inv_z), r, xrp, sp.fisher_slope_f32(alpha, series, s, inv_z),
              sp.tetragamma_trigamma_ratio_f32(xt, x2t), sp.exp_f32(x), sp.log_f32(x), sp.log1p_f32(x))
    for k in tl.static_range(14):
        tl.store(o_ptr + k * BLOCK + i, values[k], mask=m)


F32_TANH_FUNCTIONS = ("kl_h_plus_one", "x_kl_v", "x_trigamma", "log_trigamma", "remainder", "x_remainder_prime",
                      "fisher_slope", "tetragamma_trigamma_ratio")


@triton.jit
def _tanh_f32_kernel(t_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """F32_TANH_FUNCTIONS at α = 1 + e^t (exp_tanh's functions of t). Output (8, BLOCK)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    t = tl.load(t_ptr + i, mask=m, other=0.0)
    h, xt, lt, r = sp.element_forward_of_tanh_f32(t, True, True, True)
    kv, fs, ratio, xrp = sp.element_backward_of_tanh_f32(t, True, True, True)
    values = (h, kv, xt, lt, r, xrp, fs, ratio)
    for k in tl.static_range(8):
        tl.store(o_ptr + k * BLOCK + i, values[k], mask=m)


def _tanh_f32_values(t: np.ndarray) -> dict[str, np.ndarray]:
    block = triton.next_power_of_2(max(16, t.size))
    ts = torch.from_numpy(t.astype(np.float32)).to(device())
    out = torch.zeros(8 * block, dtype=torch.float32, device=device())
    _tanh_f32_kernel[(1,)](ts, out, t.size, block, enable_fp_fusion=False)
    return dict(zip(F32_TANH_FUNCTIONS, out.view(8, block)[:, : t.size].cpu().numpy()))


def _domain_values(domain: str, x: np.ndarray) -> dict[str, np.ndarray]:
    return _tanh_f32_values(x) if domain == "tanh" else _special_f32_values(x, domain == "log_alpha")


def _special_f32_values(x: np.ndarray, beyond: bool) -> dict[str, np.ndarray]:
    block = triton.next_power_of_2(max(16, x.size))
    xs = torch.from_numpy(x.astype(np.float32)).to(device())
    out = torch.zeros(14 * block, dtype=torch.float32, device=device())
    _special_f32_kernel[(1,)](xs, out, x.size, int(beyond), block, enable_fp_fusion=False)
    values = out.view(14, block)[:, : x.size].cpu().numpy()
    result = dict(zip(F32_ALPHA_FUNCTIONS, values))
    result["kl_h"] = result["kl_h_plus_one"] - np.float32(1.0)  # special_functions_f32.h kl_h: (h + 1) − 1
    return result


@pytest.mark.parametrize("domain", ["alpha", "log_alpha", "tanh", "exp", "log", "log1p"])
@ieee_forms_only
def test_triton_float32_special_functions_within_the_spec_ulp_bounds(domain):
    table = _reference_table()[domain]
    x = table["x"]
    beyond = domain == "log_alpha"
    got = _domain_values(domain, x)
    checked = 0
    for k, name in enumerate(table["functions"]):
        for interval, (lo, hi) in enumerate(zip(table["lo"], table["hi"])):
            inside = (x.astype(np.float64) >= lo) & (x.astype(np.float64) < hi)
            if beyond and math.isfinite(hi):
                continue  # the kernels enter ln α only beyond FLT_MAX; below, they have α itself
            if not inside.any():
                continue
            ref = table["reference"][inside, k]
            if beyond and name in ("remainder", "x_remainder_prime"):
                # u = 1/α is 0 in the kernels' log-space entry (α = +inf in float32), where C++ takes
                # e^-ln α, subnormal up to ln α = 104: r and x·r' are themselves O(u), so they come
                # out 0 instead of a subnormal; the losses add them to terms of order one.
                error = np.abs(got[name][inside].astype(np.float64) - ref)
                assert float(error.max()) < FLT_MIN, (name, float(error.max()))
            else:
                error = _ulps(got[name][inside], ref)
                worst = int(np.argmax(error))
                assert error[worst] <= table["bound"][k, interval], (
                    name, f"[{lo}, {hi})", float(x[inside][worst]), float(got[name][inside][worst]), float(ref[worst]),
                    float(error[worst]), table["bound"][k, interval])
            checked += int(inside.sum())
    assert checked > 0


def _generic_cpp_driver() -> str | None:
    """csrc/tests/float32_special_values built for the generic instruction set (CMake in build/ctest,
    as bench/float32_special_sweep.py builds it), or None without cmake and a C++ compiler."""
    import shutil
    import subprocess

    if shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None):
        return None
    root = pathlib.Path(__file__).resolve().parent.parent
    build = root / "build" / "ctest"
    subprocess.run(["cmake", "-S", str(root), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", "float32_special_values_generic", "-j1"], check=True,
                   stdout=subprocess.DEVNULL)
    return str(build / "float32_special_values_generic")


def _float32_grid() -> dict[str, np.ndarray]:
    """Points of each domain: α over every binade to FLT_MAX (dense below 8, where the fits are) and
    every float32 within 32 ulps of 1, 2, 4, 8 and the zeros of ψ and ln ψ1; ln α beyond ln FLT_MAX;
    exp, log, log1p over their ranges."""
    bits = lambda v: int(np.float32(v).view(np.uint32))  # noqa: E731
    around = lambda v: np.arange(bits(v) - 32, bits(v) + 33).astype(np.uint32).view(np.float32)  # noqa: E731
    alpha = [np.geomspace(1.0, 8.0, 20000), np.geomspace(8.0, 2.0**24, 4000), np.geomspace(2.0**24, FLT_MAX, 2000)]
    alpha += [around(v) for v in (2.0, 4.0, 8.0, 1.4616321325302124, 1.4262551069259644)]
    alpha += [np.arange(bits(1.0), bits(1.0) + 33).astype(np.uint32).view(np.float32)]
    tanh = [np.linspace(-1.0, 1.0, 20001), -around(1.0)[:33], around(1.0)[:33], -around(0.8527172)]
    return {"alpha": np.unique(np.concatenate(alpha).astype(np.float32)),
            "log_alpha": np.geomspace(88.7229, 1000.0, 500).astype(np.float32),
            "tanh": np.unique(np.concatenate(tanh).astype(np.float32)),
            "exp": np.linspace(-103.97, 88.72, 20001).astype(np.float32),
            "log": np.geomspace(FLT_MIN, FLT_MAX, 20001).astype(np.float32),
            "log1p": np.concatenate([[0.0], np.geomspace(1e-38, FLT_MAX, 20000)]).astype(np.float32)}


@ieee_forms_only
def test_triton_float32_special_functions_are_the_cpp_ones_bit_for_bit():
    """Without contraction (the interpreter; a GPU launched with enable_fp_fusion=False) the float32
    set gives the C++ functions' own bits: same forms, coefficients, constants and order of
    operations (the C++ generic build, scalar and `omp simd` code, at ~73k points). The one
    difference is by design: beyond FLT_MAX the kernels' u = 1/α is 0 (see
    test_triton_float32_special_functions_within_the_spec_ulp_bounds)."""
    import subprocess
    import tempfile

    driver = _generic_cpp_driver()
    if driver is None:
        pytest.skip("needs cmake and a C++ compiler to build the C++ float32 functions")
    listing = subprocess.run([driver, "--list"], check=True, capture_output=True, text=True).stdout
    names = {line.split()[0]: line.split()[1:] for line in listing.strip().splitlines()}
    for domain, x in _float32_grid().items():
        with tempfile.TemporaryDirectory() as tmp:
            x.tofile(f"{tmp}/in.bin")
            subprocess.run([driver, domain, f"{tmp}/in.bin", f"{tmp}/out.bin"], check=True)
            cpp = np.fromfile(f"{tmp}/out.bin", dtype=np.float32).reshape(len(names[domain]), 2, x.size)
        got = _domain_values(domain, x)
        for k, name in enumerate(names[domain]):
            if domain == "log_alpha" and name in ("remainder", "x_remainder_prime"):
                continue
            for path in range(2):
                same = (got[name].view(np.uint32) == cpp[k, path].view(np.uint32))
                assert same.all(), (domain, name, path, float(x[~same][0]), float(got[name][~same][0]),
                                    float(cpp[k, path][~same][0]))


def test_triton_float32_log_pair_is_log_f_bit_for_bit():
    """ln x and ln(x/4) from one reduction are the two log_f values (the fits' s = ln(x/4))."""

    @triton.jit
    def pair(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=2.0)
        a, b = sp.log_and_quarter_log_f32(x)
        tl.store(o_ptr + i, a, mask=m)
        tl.store(o_ptr + BLOCK + i, b, mask=m)
        tl.store(o_ptr + 2 * BLOCK + i, sp.log_f32(x), mask=m)
        tl.store(o_ptr + 3 * BLOCK + i, sp.log_f32(x * 0.25), mask=m)

    x = _reference_table()["alpha"]["x"]
    block = triton.next_power_of_2(x.size)
    out = torch.zeros(4 * block, dtype=torch.float32, device=device())
    pair[(1,)](torch.from_numpy(x).to(device()), out, x.size, block)
    out = out.view(4, block)[:, : x.size].cpu()
    assert torch.equal(out[0], out[2]) and torch.equal(out[1], out[3])


# ---------------------------------------------------------------- K = 130: partial tiles, 3 blocks


@pytest.mark.parametrize("evidence,tau", [("exp", 0.05), ("relu", 0.1), ("softplus", 0.05), ("exp_tanh", 0.1)])
def test_triton_k130_hard_regime_every_term_forward_and_backward(gen, evidence, tau):
    k, d = 130, 203
    x, y = hard_pairs(k, d, generator=gen)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence=evidence, tau=tau, weights=ALL_WEIGHTS, target_scale=c, reduction="sum")
    xt, yt = x.clone().to(device()).requires_grad_(), y.clone().to(device()).requires_grad_()
    loss = eo.evidential_loss(xt, yt, backend="triton", **{**kwargs, "target_scale": c.to(device())})
    loss.backward()
    xr, yr = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    ref = eo.reference.evidential_loss(xr, yr, **{**kwargs, "target_scale": c.double()})
    ref.backward()
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    assert abs(float(loss) - float(ref)) / abs(float(ref)) <= 1e-4 + allowance
    for got, want in ((xt.grad, xr.grad), (yt.grad, yr.grad)):
        assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 1e-4 + allowance


# ----------------------------------------------------------------------------- code paths


def test_triton_results_are_bitwise_deterministic(gen):
    x, y = hard_pairs(113, 64, generator=gen)
    x, y = x.to(device()), y.to(device())
    runs = []
    for _ in range(2):
        xt, yt = x.clone().requires_grad_(), y.clone().requires_grad_()
        loss = eo.evidential_loss(xt, yt, weights=ALL_WEIGHTS, backend="triton")
        loss.backward()
        runs.append((loss.detach(), xt.grad, yt.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_triton_two_pass_forward_matches_the_column_partials(gen, monkeypatch):
    """Both directions in one pass (column partials) or, when so few programs' partials fit that
    they would take longer (launch.one_pass_programs), as two passes: the same statistics."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(100, 40, generator=gen)
    x, y = x.to(device()), y.to(device())
    ops = eo.backends.resolve("triton", x.device).ops
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    passes = []
    original = launch._stats_pass
    monkeypatch.setattr(launch, "_stats_pass", lambda *args: (passes.append(args[3] is None), original(*args)))
    one = ops.loss_forward(x, y, None, "exp", 0.05, w, mask, True, True)
    # One program's partials against two row blocks on SMs enough for both: two sweeps either way.
    monkeypatch.setattr(launch, "PARTIAL_BUDGET_BYTES", 0)
    monkeypatch.setattr(launch, "_sm_count", lambda device: 10**6)
    two = ops.loss_forward(x, y, None, "exp", 0.05, w, mask, True, True)
    assert passes == [False, True, True]
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_triton_backward_beyond_one_register_block(gen):
    """D beyond what the fused backward keeps in registers: G staged through strips."""
    from evidential_ops.triton_backend import configs

    d = 2 * (configs.INTERPRETER_MAX_REGISTER_D if configs.interpreting() else configs.MAX_REGISTER_D) + 3
    x, y = random_pairs(40, d, generator=gen, positive_cos=0.8)
    xt, yt = x.clone().to(device()).requires_grad_(), y.clone().to(device()).requires_grad_()
    eo.evidential_loss(xt, yt, weights=ALL_WEIGHTS, tau=0.1, backend="triton").backward()
    xr, yr = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    eo.reference.evidential_loss(xr, yr, weights=ALL_WEIGHTS, tau=0.1).backward()
    for got, want in ((xt.grad, xr.grad), (yt.grad, yr.grad)):
        assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 2e-4


def test_triton_graph_mode_paths_match_eager(gen, monkeypatch):
    """What the ops do inside a torch.compile graph (weights read by the kernels from a device
    tensor, value checks as asynchronous asserts), exercised on real tensors: bitwise the eager
    results where both take s from the tile kernels (eager float32 IEEE launches would take cuBLAS
    strips, a graph never: test_triton_traced_graph_keeps_the_tile_kernels_at_wide_d)."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(70, 24, generator=gen)
    x, y = x.to(device()), y.to(device())
    ops = eo.backends.resolve("triton", x.device).ops
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    c = torch.rand(70, generator=gen).to(x.device)
    eager = ops.loss_forward(x, y, c, "exp", 0.05, w, mask, True, True)
    eager_grads = ops.loss_backward(eager[0], eager[1], x, y, c, eager[2], eager[3], "exp", 0.05, w, mask, True, True,
                                    0, [True, True])
    monkeypatch.setattr(launch, "_tracing", lambda t: True)
    monkeypatch.setattr(eo.checks, "values_unreadable", lambda t: True)
    graph = ops.loss_forward(x, y, c, "exp", 0.05, w, mask, True, True)
    graph_grads = ops.loss_backward(graph[0], graph[1], x, y, c, graph[2], graph[3], "exp", 0.05, w, mask, True, True,
                                    0, [True, True])
    for a, b in zip((*eager, *eager_grads), (*graph, *graph_grads)):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="weights"):
        ops.loss_forward(x, y, c, "exp", 0.05, torch.tensor([1.0, math.nan, 0, 0, 0], dtype=torch.float64), mask,
                         True, True)


def test_triton_tf32_agrees(gen):
    """matmul_precision="tf32" reaches the kernels as the ops' argument, backward included
    (tensor-core products on a GPU: ~3e-4 relative in e; the interpreter computes them in float32)."""
    x, y = random_pairs(50, 32, generator=gen, positive_cos=0.8)
    x, y = x.to(device()), y.to(device())
    ieee = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="triton")
    tf32 = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="triton", matmul_precision="tf32")
    torch.testing.assert_close(tf32, ieee, rtol=5e-3 / 0.05, atol=0)


@pytest.mark.parametrize("programs", [1, 2])
def test_triton_one_program_over_several_row_blocks_matches(gen, monkeypatch, programs):
    """On a GPU from K of a few thousand a stats program sweeps several row blocks, read-modify-
    writing its column partials between them; the interpreter's default never does. Force it (a
    partial budget for one program, or two for the three row blocks: the second one's last pass
    lies past the last block) and compare bitwise, for the losses of every term."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(130, 24, generator=gen)
    x, y = x.to(device()), y.to(device())
    expected = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="triton")
    partials = 6  # launch._Terms.num_partials() of ALL_WEIGHTS: rest, squares, kl, fisher, two logdet
    monkeypatch.setattr(launch, "PARTIAL_BUDGET_BYTES", programs * partials * y.shape[0] * 8)
    several = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="triton")
    for a, b in zip(expected, several):
        assert torch.equal(a, b)


@pytest.mark.parametrize("col_programs", [1, 2])
def test_triton_gradient_programs_sweeping_column_blocks_match(gen, monkeypatch, col_programs):
    """A gradient program walks several column blocks with its rows' line constants formed once
    (launch._column_programs): one program per row block walking all of them, or two (one of them
    past the last block on its second step), give the G of one block per program, bitwise."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(130, 24, generator=gen)
    runs = []
    for programs in (lambda rows, cols, dev: cols, lambda rows, cols, dev: min(cols, col_programs)):
        monkeypatch.setattr(launch, "_column_programs", programs)
        xt, yt = x.clone().to(device()).requires_grad_(), y.clone().to(device()).requires_grad_()
        eo.evidential_loss(xt, yt, weights=ALL_WEIGHTS, reduction="sum", backend="triton").backward()
        runs.append((xt.grad, yt.grad))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# Bounds on the float32 evidence maps, in units of 2^-23 relative, each the sum of its steps: exp_f
# within 1.0 (SPEC's table), log1p_f 1.17, each rounding 0.5, a rounded input's error carried
# through a step whose relative condition number is at most 1.
# exp: e = e_r·2^n (special.exp_reduction_ex2_f32), e_r = 2^f·(1 + lo·ln 2): 2^f correctly rounded
#   0.5, the FMA 0.5, the omitted (lo·ln 2)²/2 0.012: 1.02; α = e + 1: 1.02 + 0.5; ρ = e/α:
#   1.02 + 1.52 + 0.5. Beyond FLT_MAX, the same e_r·2^n widened: within α's 1.52.
# relu: α = x + 1: 0.5; ρ = 1/α: 0.5 + 0.5.
# softplus: ln(1 + e^-|x|): 1.0 + 1.17, + max(x, 0): 2.67, + 1: 3.17; sigmoid = (1 or e^-|x|)/(1 + e^-|x|):
#   1.0 + 1.5 + 0.5; ρ = sigmoid/α: 3.0 + 3.17 + 0.5.
# exp_tanh: |t| = (1 − q)·1/(1 + q), q = e^-2|x|: absolute error 3 (2.5 relative to |t| <= 1, 0.5 from q);
#   e = exp(t): 3 + 1; α = e + 1: 4·e/α (<= 2.72/3.72) + 0.5; ρ = e·4q·inv·inv/α: 4 + 1 + 2·2 + 0.5 + 3.4 + 0.5.
EVIDENCE_BOUNDS = {"exp": (1.52, 3.04), "relu": (0.5, 1.0), "softplus": (3.17, 6.67), "exp_tanh": (3.4, 13.4)}
# Compiled, the same sums with the GPU's approximations (elementary_f32.h): a reciprocal within 1.0
# (0.5 above), a quotient a·rcp(b) within 2.0, exp_f within 3.0, ex2.approx within 2.0 (0.5 above),
# log1p_f within 1.28 (1.17 + 0.11: log_f's quotient s = f/(2 + f) enters ln(1 + f) as s·(f²/2 + R),
# at most 0.052 of it at f = √2 − 1, so 2 ulps of s move the result by 0.11).
# exp: e 2.0 + 0.5 + 0.012; α 2.52 + 0.5; ρ = e/α: 2.52 + 3.02 + 2.0.
# relu: α 0.5; ρ = 1·rcp(α): 0.5 + 1.0.
# softplus: ln(1 + e^-|x|): 3.0 + 1.28, + max(x, 0): 4.78, + 1: 5.28; sigmoid: 3.0 + 3.5 + 2.0;
#   ρ = sigmoid/α: 8.5 + 5.28 + 2.0.
# exp_tanh: |t|: absolute error 4.5 (3.0 relative to |t| <= 1, 1.5 from q); e = exp(t): 4.5 + 3;
#   α = e + 1: 7.5·e/α + 0.5 (6.0); ρ = e·4q·inv·inv/α: 7.5 + 3 + 2·3.0 + 0.5 + 6.0 + 2.0 (the
#   products' roundings as the IEEE sum counts them, covered by q's error being counted in both
#   t and ρ).
if COMPILED:
    EVIDENCE_BOUNDS = {"exp": (3.02, 7.54), "relu": (0.5, 1.5), "softplus": (5.28, 15.78), "exp_tanh": (6.0, 25.0)}


@triton.jit
def _evidence_f32_kernel(x_ptr, o_ptr, n, EVIDENCE: tl.constexpr, BLOCK: tl.constexpr):
    """(α in float64 as the stats kernel forms it, ρ, (α·2^-511)², α·(1/(4α)) as the backward's p, t:
    exp_tanh's tanh x)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=1.0)
    alpha, rho, e_r, k, beyond, t = sp.evidence_f32(x, EVIDENCE)
    alpha64 = sp.alpha_f64_of_f32(alpha, e_r, k, beyond)
    a_m = tl.where(beyond, e_r, alpha)
    a_k = tl.where(beyond, k, 0)
    s_m, s_k = sp.split_f64(0.25 / alpha64)
    tl.store(o_ptr + i, alpha64, mask=m)
    tl.store(o_ptr + BLOCK + i, rho.to(tl.float64), mask=m)
    tl.store(o_ptr + 2 * BLOCK + i, sp.scaled_square_f64(a_m, a_k), mask=m)
    tl.store(o_ptr + 3 * BLOCK + i, sp.scaled_product_f32(a_m, a_k, s_m, s_k).to(tl.float64), mask=m)
    tl.store(o_ptr + 4 * BLOCK + i, t.to(tl.float64), mask=m)


@pytest.mark.parametrize("evidence", eo.EVIDENCE_KINDS)
def test_triton_float32_evidence_and_its_float64_widening(evidence):
    """evidence_f32 at float32 x (x = s·(1/τ) is a float32 product) against the maps in float64 at the
    same x, within EVIDENCE_BOUNDS; exp evidence across FLT_MAX (α widened by its exponent bits)
    and beyond DBL_MAX (+inf, for the overflow error); the squares of the MSE statistic and the
    backward's p = α/S formed without a float64 product: one float32 rounding each (0.5), p's 1/S
    rounded to float32 once more (0.5); exp_tanh's t (the variable of its functions) within 3 units
    of 2^-23 absolute of tanh x (4.5 compiled), 0 for the other maps."""
    import mpmath

    x = np.concatenate([np.linspace(-150, 750, 3001), np.linspace(-3, 3, 2001), np.geomspace(1e-30, 1, 201),
                        -np.geomspace(1e-30, 1, 201), [0.0, 88.72283, 88.7228394, 88.72284, 709.78, 709.79]])
    x = x.astype(np.float32)
    block = triton.next_power_of_2(x.size)
    out = torch.zeros(5 * block, dtype=torch.float64, device=device())
    _evidence_f32_kernel[(1,)](torch.from_numpy(x).to(device()), out, x.size, eo.EVIDENCE_KINDS.index(evidence), block,
                               enable_fp_fusion=False)
    alpha, rho, square, p, t = out.view(5, block)[:, : x.size].cpu().numpy()
    want_t = np.tanh(x.astype(np.float64)) if evidence == "exp_tanh" else np.zeros(x.size)
    t_bound = (4.5 if COMPILED else 3.0) * 2.0**-23  # EVIDENCE_BOUNDS' |t|
    assert float(np.abs(t - want_t).max()) <= t_bound, float(np.abs(t - want_t).max())
    with mpmath.workdps(40):
        def maps(v):
            v = mpmath.mpf(float(v))
            g, dg = {"exp": (mpmath.exp(v), mpmath.exp(v)), "relu": (max(v, 0), 1 if v > 0 else 0),
                     "softplus": (mpmath.log1p(mpmath.exp(v)), 1 / (1 + mpmath.exp(-v))),
                     "exp_tanh": (mpmath.exp(mpmath.tanh(v)), mpmath.exp(mpmath.tanh(v)) * mpmath.sech(v) ** 2)}[evidence]
            return g + 1, dg / (g + 1)

        ref = np.array([[float(mpmath.mpf(t)) for t in maps(v)] for v in x])
    finite = np.isfinite(ref[:, 0])
    assert np.isinf(alpha[~finite]).all() and (alpha[~finite] > 0).all()  # e^x beyond DBL_MAX
    alpha_bound, rho_bound = EVIDENCE_BOUNDS[evidence]
    alpha_error = np.abs(alpha[finite] / ref[finite, 0] - 1) / 2.0**-23
    assert float(alpha_error.max()) <= alpha_bound, (float(alpha_error.max()), float(x[finite][np.argmax(alpha_error)]))
    normal = finite & (ref[:, 1] > FLT_MIN)  # ρ below FLT_MIN is subnormal in float32
    rho_error = np.abs(rho[normal] / ref[normal, 1] - 1) / 2.0**-23
    assert float(rho_error.max()) <= rho_bound, (float(rho_error.max()), float(x[normal][np.argmax(rho_error)]))
    with np.errstate(over="ignore"):
        exact_square = (alpha * 2.0**-511) ** 2
    kept = np.isfinite(exact_square)
    assert float(np.abs(square[kept] / exact_square[kept] - 1).max()) <= 0.5 * 2.0**-23
    kept = np.isfinite(alpha)
    assert float(np.abs(p[kept] / 0.25 - 1).max()) <= 1.0 * 2.0**-23


@pytest.mark.parametrize("scale, reads, raises", [(1.0, 0, False), (5.0, 1, False), (40.0, 1, True)],
                         ids=["unit-norms", "norms-5", "norms-40"])
@pytest.mark.parametrize("op", ["loss", "line_stats", "opinion"])
def test_triton_overflow_flag_is_read_only_where_the_norm_bound_leaves_an_overflow_possible(
        gen, monkeypatch, scale, reads, raises, op):
    """exp evidence at τ = 0.05 (an overflow possible for float32 inputs): unit-norm embeddings
    bound |s|/τ by 2·1·1/0.05 = 40, far below 709 − ln K, and the flag is not read; at norms 5
    the bound (2·25/0.05 = 1000) leaves it possible, the flag is read and no line overflows
    (|s|/τ <= 500: a finite loss; test_fused_backends.py holds its value to the reference); at
    norms 40 the positives do (|s_ii|/τ ≈ 31700), and the flag's read raises the error naming τ."""
    from evidential_ops.triton_backend import launch

    checks = []
    real_check = launch._overflow_check

    def counted_check(stats, message):
        checks.append(1)
        real_check(stats, message)

    monkeypatch.setattr(launch, "_overflow_check", counted_check)
    x, y = (scale * t for t in random_pairs(24, 16, generator=gen, positive_cos=0.99))
    x, y = x.to(device()), y.to(device())
    backend = eo.backends.resolve("triton", x.device)
    mask = eo.ops.terms_mask(eo.checks.loss_config(evidence="exp", tau=0.05, weights=None, direction="both",
                                                   reduction="mean"))
    call = {"loss": lambda: eo.evidential_loss(x, y, tau=0.05, backend="triton"),
            "line_stats": lambda: backend.ops.line_stats(x, y, 0, "exp", 0.05, mask, True, True),
            "opinion": lambda: eo.opinion(x, y, tau=0.05, backend="triton")}[op]
    if raises:
        with pytest.raises(ValueError, match="tau=0.05"):
            call()
    elif op == "loss":
        assert torch.isfinite(call())
    else:
        call()
    assert len(checks) == reads


def test_triton_float16_embeddings_take_their_float32_products_range_for_the_overflow_check(gen):
    """float16 embeddings' s is a float32 sum (tl.dot and cuBLAS strips alike): at τ = 100 the
    dtype's bound is float32's, an overflow is possible and checked, and norms of 1000 (|s|/τ up to
    1e4) raise the error naming τ; only a given float16 s is bounded by 65504 (65504/100 + ln 16 <
    709: nothing to check). test_fused_backends.py holds every backend to the same error."""
    from evidential_ops.triton_backend import launch

    assert launch._overflow_possible(0, torch.float16, 0.01, 16)
    assert not launch._overflow_possible(0, torch.float16, 0.01, 16, from_s=True)
    x, y = (1000 * t for t in random_pairs(16, 32, generator=gen, positive_cos=0.99))
    with pytest.raises(ValueError, match="tau=100"):
        eo.evidential_loss(x.half().to(device()), y.half().to(device()), tau=100.0, backend="triton")


def test_triton_norm_bound_is_twice_the_largest_norms_product_and_rules_out_nothing_unbounded(
        gen, monkeypatch):
    """B = 2·max‖a_i‖·max‖b_j‖, the norms of float32 inputs in float32: within (D + 2)·2^-24 each
    of the float64 ones (D = 5 squares summed, a square root), 2^-8 each for bfloat16 inputs (the
    norms rounded to bfloat16, beside which their float32 sums' error is negligible); an infinite
    or NaN embedding, or D beyond MAX_BOUNDED_D, leaves every overflow possible; exp_tanh evidence
    never overflows."""
    from evidential_ops.triton_backend import norm_bound

    a = torch.randn(7, 5, dtype=torch.float32, generator=gen)
    b = torch.randn(9, 5, dtype=torch.float32, generator=gen)
    want = 2.0 * float(a.double().norm(dim=1).max()) * float(b.double().norm(dim=1).max())
    bound = norm_bound.NormBound(a.to(device()), b.to(device()))
    assert bound.value() == pytest.approx(want, rel=2 * 7 * 2.0**-24)
    a16, b16 = a.bfloat16(), b.bfloat16()
    want16 = 2.0 * float(a16.double().norm(dim=1).max()) * float(b16.double().norm(dim=1).max())
    bound16 = norm_bound.NormBound(a16.to(device()), b16.to(device()))
    assert bound16.value() == pytest.approx(want16, rel=2 * 2.0**-8)
    assert bound.rules_out_overflow(0, 1.0, 7) and not bound.rules_out_overflow(0, 1e4, 7)
    for bad in (math.inf, math.nan):
        a_bad = a.clone()
        a_bad[3, 2] = bad
        assert not norm_bound.NormBound(a_bad.to(device()), b.to(device())).rules_out_overflow(0, 1.0, 7)
        assert not norm_bound.overflow_possible_below(bad, 3, 1.0, 7)  # exp_tanh: α <= e + 1
    monkeypatch.setattr(norm_bound, "MAX_BOUNDED_D", 4)
    assert not norm_bound.NormBound(a.to(device()), b.to(device())).rules_out_overflow(0, 1.0, 7)


def test_triton_backward_recalls_the_bound_its_forward_read_of_the_same_unchanged_tensors(gen):
    """norm_bound.recalled: the B a loss forward read, for the backward of the very same embeddings
    and statistics; nothing for an equal-valued clone, swapped embeddings, statistics not that
    forward's, after `forget`, once an embedding changed in place, or for inference tensors (no
    version counter: the forward and opinions still run). A recalled B rules the scaled p out only
    where B/τ + ln 2n < 126·ln 2 (87.3: 2·20 + ln 131072 = 51.8 does, 2·43 + ln 48 = 89.9 does not)."""
    from evidential_ops.triton_backend import launch, norm_bound

    x, y = (t.to(device()) for t in random_pairs(24, 16, generator=gen, positive_cos=0.9))
    backend = eo.backends.resolve("triton", x.device)
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=None, direction="both", reduction="mean")
    weights, mask = backend.weights(config, x), eo.ops.terms_mask(config)

    def forward(a, b):
        return backend.ops.loss_forward(a, b, None, "exp", 0.05, weights, mask, True, True)[2:]

    row_stats, col_stats = forward(x, y)
    assert norm_bound.recalled(x, y, row_stats, col_stats) == pytest.approx(2.0, rel=1e-6)
    assert norm_bound.recalled(x.clone(), y, row_stats, col_stats) is None
    assert norm_bound.recalled(y, x, row_stats, col_stats) is None
    assert norm_bound.recalled(x, y, row_stats.clone(), col_stats) is None
    again = forward(x, y)
    assert norm_bound.recalled(x, y, *again) == pytest.approx(2.0, rel=1e-6)
    norm_bound.forget(x, y, *again)
    assert norm_bound.recalled(x, y, *again) is None
    x.mul_(1.0)
    assert norm_bound.recalled(x, y, row_stats, col_stats) is None
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()
        assert norm_bound.recalled(xi, yi, *forward(xi, yi)) is None
        assert torch.isfinite(eo.evidential_loss(xi, yi, tau=0.05, backend="triton"))
        assert torch.isfinite(eo.opinion(xi, yi, tau=0.05, backend="triton").row_uncertainty).all()
    assert launch._scaled_p_ruled_out(2.0, 20.0, 65536) and not launch._scaled_p_ruled_out(2.0, 43.0, 24)
    assert not launch._scaled_p_ruled_out(math.nan, 20.0, 24) and not launch._scaled_p_ruled_out(None, 20.0, 24)


def test_triton_strip_backward_recalls_no_bound(gen, monkeypatch):
    """The backward of a strip of rows (line_stats: the distributed loss, whose column statistics
    are summed over every strip's rows) never takes a bound: the strip's own embeddings bound its
    rows, not the columns' sums."""
    from evidential_ops.triton_backend import norm_bound

    asked = []
    monkeypatch.setattr(norm_bound, "recalled", lambda *tensors: asked.append(1))
    x, y = (t.to(device()) for t in random_pairs(24, 16, generator=gen, positive_cos=0.9))
    backend = eo.backends.resolve("triton", x.device)
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=None, direction="both", reduction="mean")
    weights, mask = backend.weights(config, x), eo.ops.terms_mask(config)
    ones = torch.ones(24, dtype=torch.float64, device=x.device)
    strip = x[8:16]
    row_stats, col_stats = backend.ops.line_stats(strip, y, 8, "exp", 0.05, mask, True, True)
    backend.ops.loss_backward(ones[:8], ones, strip, y, None, row_stats, col_stats, "exp", 0.05, weights, mask, True,
                              True, 8, [True, True])
    assert asked == []
    row_stats, col_stats = backend.ops.loss_forward(x, y, None, "exp", 0.05, weights, mask, True, True)[2:]
    backend.ops.loss_backward(ones, ones, x, y, None, row_stats, col_stats, "exp", 0.05, weights, mask, True, True, 0,
                              [True, True])
    assert asked == [1]


# ----------------------------------------------------------------------------- backward plans


def _backward_against_reference(gen, k, d, requires=(True, True), tau=0.05):
    """Hard regime (near-duplicate positives at cosine 0.99, τ = 0.05), every term, a target scale:
    the triton gradients against the float64 reference on the same float32 inputs, within
    SPEC §5's 1e-4 plus the from-embeddings allowance 8·√D·2^-24/τ (max-abs relative)."""
    x, y = hard_pairs(k, d, generator=gen)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence="exp", tau=tau, weights=ALL_WEIGHTS, reduction="sum")
    xt = x.clone().to(device()).requires_grad_(requires[0])
    yt = y.clone().to(device()).requires_grad_(requires[1])
    eo.evidential_loss(xt, yt, backend="triton", target_scale=c.to(device()), **kwargs).backward()
    xr, yr = x.double().requires_grad_(requires[0]), y.double().requires_grad_(requires[1])
    eo.reference.evidential_loss(xr, yr, target_scale=c.double(), **kwargs).backward()
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    grads = []
    for got, want, needed in ((xt.grad, xr.grad, requires[0]), (yt.grad, yr.grad, requires[1])):
        if not needed:
            assert got is None
            continue
        assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 1e-4 + allowance
        grads.append(got)
    return grads


def _record_plans(monkeypatch, launch) -> list:
    """Every launch.BackwardPlan made from here on, in order."""
    plans, original = [], launch.BackwardPlan.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plans.append(self)

    monkeypatch.setattr(launch.BackwardPlan, "__init__", record)
    return plans


def _record_strip_statistics(monkeypatch, launch, what) -> list:
    """what(arguments) of every launch._strip_statistics call from here on, in order."""
    calls, original = [], launch._strip_statistics
    monkeypatch.setattr(launch, "_strip_statistics", lambda *a: (calls.append(what(a)), original(*a)))
    return calls


@pytest.mark.parametrize("path", ["fused", "one block", "blocks", "one strip", "strips", "strips, two passes",
                                  "dx only", "dy only"])
def test_triton_backward_paths_match_the_reference(gen, monkeypatch, path):
    """Every way launch.BackwardPlan computes the gradients, at odd sizes (K = 113, D = 203; the
    fused kernel holds D in one register block, so D = 63 for it, within configs.MAX_REGISTER_D on
    a GPU): the fused FlashAttention-2 kernel (dy added in program order), G staged through one or
    several blocks (float32 inputs: dx and dy added up block by block), through one or several
    strips with dy accumulated in the same pass (the plan of 16-bit inputs, taken here by float32
    ones), dy from strips of columns, and one gradient."""
    from evidential_ops.triton_backend import configs, launch

    requires = (True, True)
    if path == "fused" and not configs.has_default("grad_fused", device()):
        pytest.skip("no fused backward on this GPU generation (configs.DEFAULTS_BY_ARCH)")
    if path == "fused":
        monkeypatch.setattr(launch.BackwardPlan, "FUSED_DTYPES", (torch.float32,))
    else:
        monkeypatch.setattr(launch.BackwardPlan, "FUSED_DTYPES", ())
    if "strip" in path:
        monkeypatch.setattr(launch.BackwardPlan, "BLOCK_DTYPES", ())
    if path in ("blocks", "strips", "strips, two passes", "dx only", "dy only"):
        # 16 stored rows of 116 elements (113 rounded up to launch.ROW_ALIGN_BYTES): 16 rows of a
        # strip, 8 strips, the last partial; or 2 × 4 blocks of 57 × 32 (launch.block_shape: 4
        # gradient rows a line moved again, as 3 × 3 of 38 × 40 would, in fewer blocks; columns a
        # multiple of 16 bytes), the last of each partial
        monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * launch.aligned_row_length(113, 4) * 4)
    if path == "strips, two passes":
        monkeypatch.setattr(launch, "ACCUMULATOR_BUDGET_BYTES", -1)
    if path == "dx only":
        requires = (True, False)
    if path == "dy only":
        requires = (False, True)
    plans = _record_plans(monkeypatch, launch)
    # With 8 strips of 16 rows dy is shared with dx's pass while 7·D·8 <= (8 + 16)·113, D <= 48
    # (BackwardPlan's traffic rule)
    _backward_against_reference(gen, 113, {"strips": 13, "fused": 63}.get(path, 203), requires)
    expected = {"fused": "fused", "strips, two passes": "strips, two passes"}.get(path, "strips")
    if "block" in path:
        expected = "blocks"
    assert [p.kind for p in plans] == [expected]
    if "block" in path:
        assert (plans[0].block_rows, plans[0].block_cols) == {"one block": (113, 113), "blocks": (57, 32)}[path]
    else:
        assert plans[0].strip == {"fused": 0, "one strip": 113}.get(path, 16)


@pytest.mark.parametrize("tau", [0.05, 0.01])
def test_triton_backward_takes_p_as_a_product_unless_a_line_strength_exceeds_2_126(gen, monkeypatch, tau):
    """exp evidence: grad_block_kernel's two variants, p = α/S as one float32 product (SCALED_P 0)
    or from mantissas and exponents (1), the device flag (launch._scaled_p_flag) choosing. At
    τ = 0.05 (α <= e^20) every line takes the product: the forward's norm bound (B/τ = 40, unit
    norms) rules the scaled variant out and no flag is formed; without the bound the flag is
    formed and 0. At τ = 0.01 (B/τ = 200, not ruled out) the near-duplicate positives' α = e^99
    lies beyond FLT_MAX and the flag is set. Both against the float64 reference (hard regime,
    every term, K = 113, D = 203); and at τ = 0.01 the product forced is not finite (what the
    second variant is for)."""
    from evidential_ops.triton_backend import launch, norm_bound

    flags = []
    original = launch._scaled_p_flag
    monkeypatch.setattr(launch, "_scaled_p_flag", lambda *a: flags.append(original(*a)) or flags[-1])
    gen.manual_seed(5)
    _backward_against_reference(gen, 113, 203, tau=tau)
    assert [int(f) for f in flags] == ([1] if tau == 0.01 else [])
    flags.clear()
    monkeypatch.setattr(norm_bound, "recalled", lambda *tensors: None)
    gen.manual_seed(5)
    _backward_against_reference(gen, 113, 203, tau=tau)
    assert [int(f) for f in flags] == [int(tau == 0.01)]
    if tau == 0.01:
        monkeypatch.setattr(launch, "_scaled_p_flag", lambda row_g, col_g: torch.zeros(1, dtype=torch.int32,
                                                                                      device=row_g.device))
        gen.manual_seed(5)
        with pytest.raises(AssertionError):
            _backward_against_reference(gen, 113, 203, tau=tau)


@pytest.mark.parametrize("tau", [0.05, 0.01])
def test_triton_backward_launches_one_p_variant_in_eager_mode_and_both_where_values_are_unreadable(
        gen, monkeypatch, tau):
    """exp evidence: in eager mode the backward launches one grad_block_kernel variant, 0 at τ = 0.05
    (the forward's norm bound rules 1 out: no flag read), 1 at τ = 0.01 with near-duplicate
    positives (the flag read on the host once); where values cannot be read (tracing, CUDA graph
    capture: launch._tracing, and no bound recalled) it launches both at every block, the one not
    selected exiting at once, with the same gradients bit for bit (the same kernel does the work,
    over the same blocks)."""
    from evidential_ops.triton_backend import kernels, launch, norm_bound

    variants, original = [], launch._launch

    def record(kernel, grid, *args, **meta):
        if kernel is kernels.grad_block_kernel:
            variants.append(meta["SCALED_P"])
        original(kernel, grid, *args, **meta)

    monkeypatch.setattr(launch, "_launch", record)
    # blocks of 57 × 32 (test_triton_backward_paths_match_the_reference "blocks")
    monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * launch.aligned_row_length(113, 4) * 4)
    gen.manual_seed(5)
    eager = _backward_against_reference(gen, 113, 203, tau=tau)
    blocks = len(variants)
    assert blocks > 1 and variants == [int(tau == 0.01)] * blocks
    variants.clear()
    tracing = launch._tracing
    monkeypatch.setattr(launch, "_tracing", lambda t: True if t.dtype == torch.int32 else tracing(t))
    monkeypatch.setattr(norm_bound, "recalled", lambda *tensors: None)
    gen.manual_seed(5)
    unreadable = _backward_against_reference(gen, 113, 203, tau=tau)
    assert variants == [0, 1] * blocks
    for got, want in zip(unreadable, eager):
        assert torch.equal(got, want)


def test_triton_block_shape_fits_its_budget_where_a_full_column_does_not():
    """launch.block_shape for budgets below one full column (113 elements) as well: 100 elements
    give blocks of 11 × 9 (split into 13 column blocks), not 1 × 1; every shape fits its budget."""
    from evidential_ops.triton_backend import launch

    assert launch.block_shape(113, 113, 100) == (11, 9)
    for size in (None, 8, 4, 2):  # rows stored aligned_row_length apart (float64 to 16-bit elements)
        for elements in (100, 113, 1808, 113 * 113):
            rows, cols = launch.block_shape(113, 113, elements, size)
            stored = launch.aligned_row_length(cols, size) if size else cols
            assert rows * stored <= elements and rows * stored > elements // 4
            # Whole columns, or a multiple of 16 bytes of them: cuBLAS's sm_90 kernels.
            assert cols == 113 or size is None or (cols * size) % launch.ROW_ALIGN_BYTES == 0


def test_triton_block_shape_takes_the_symbolic_sizes_of_a_dynamic_trace():
    """block_shape's search is cached by its integer arguments; traced with dynamic shapes K comes
    as a SymInt, which no cache can hash: the same shape as for the plain integer."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from evidential_ops.triton_backend import launch

    env = ShapeEnv()
    k = env.create_symintnode(env.create_symbol(113, ConstantSource("k")), hint=113)
    budget = 16 * launch.aligned_row_length(113, 4)
    assert launch.block_shape(k, k, budget, 4) == launch.block_shape(113, 113, budget, 4) == (57, 32)


def test_triton_blocks_at_the_measured_sizes_keep_cublas_on_sm90_kernels():
    """The H200's third lease: blocks of 4096 × 3277 float32 at K = 16384 (a column count that is
    not a multiple of 4) ran dx's and dy's products on cuBLAS's sm_80 align1 kernels. At the
    budgets of K = 16384 and 65536 every block's columns are now a multiple of 16 bytes."""
    from evidential_ops.triton_backend import launch

    for k in (16384, 65536):
        for dtype in (torch.float32, torch.bfloat16):
            size = dtype.itemsize
            rows, cols = launch.block_shape(k, k, launch.strip_budget(k) // size, size)
            assert (cols * size) % launch.ROW_ALIGN_BYTES == 0 and rows * cols * size <= launch.strip_budget(k)


@pytest.mark.parametrize("k", [131072, 262144])
def test_triton_strips_keep_64_lines_of_bytes_beyond_k65536(k):
    """Beyond K ≈ 70000 the per-line buffers alone near the 64 MiB the ops aim at: what they left
    (launch.strip_budget) had shrunk to strips of 16 rows at K = 131072 and of one row at 262144
    (a negative budget), a cuBLAS product and a sweep for every row. Now a strip or block gets at
    least MIN_STRIP_BYTES_PER_LINE a line: forward strips of 128 float32 rows, backward strips of
    85 (16-bit inputs, s apart: 6 bytes an element) or 256 bfloat16 rows, float32 blocks of
    millions of elements; the extra memory O(K) within that floor and the per-line buffers."""
    from evidential_ops.triton_backend import launch

    d = 1024
    floor = launch.MIN_STRIP_BYTES_PER_LINE * k
    assert launch.strip_budget(k) == floor
    assert launch.strip_rows(k, k, 4) == 128
    plans = [launch.BackwardPlan(k, k, d, torch.bfloat16, strips_of_s=True), launch.BackwardPlan(k, k, d, torch.bfloat16),
             launch.BackwardPlan(k, k, d, torch.float32, strips_of_s=True)]
    assert [(p.kind, p.strip) for p in plans[:2]] == [("strips, two passes", 85), ("strips, two passes", 256)]
    assert plans[2].kind == "blocks" and plans[2].block_rows * plans[2].block_cols >= 2**24
    for plan in plans:
        assert plan.extra_bytes <= floor


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_triton_stored_strips_rows_are_16_byte_aligned(dtype):
    """cuBLAS's sm_90 GEMMs need 16-byte aligned rows (launch.ROW_ALIGN_BYTES); a block of 2731
    float32 columns fell back to sm_80 kernels at a third of the speed on an H200."""
    from evidential_ops.triton_backend import launch

    for cols in (1, 113, 2731, 2732):
        block = launch.aligned_matrix(7, cols, dtype, torch.device("cpu"))
        assert block.shape == (7, cols) and block.stride(1) == 1
        assert block.stride(0) >= cols and (block.stride(0) * dtype.itemsize) % launch.ROW_ALIGN_BYTES == 0
        assert block.stride(0) - cols < launch.ROW_ALIGN_BYTES // dtype.itemsize  # no more than needed


def test_triton_fused_backward_is_bitwise_deterministic(gen, monkeypatch):
    """dy's contributions are added in program order (no float atomics): two runs, the same bits."""
    from evidential_ops.triton_backend import configs, launch

    if not configs.has_default("grad_fused", device()):
        pytest.skip("no fused backward on this GPU generation (configs.DEFAULTS_BY_ARCH)")
    monkeypatch.setattr(launch.BackwardPlan, "FUSED_DTYPES", (torch.float32,))
    runs = []
    for _ in range(2):
        gen.manual_seed(1)
        runs.append(_backward_against_reference(gen, 70, 24))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_triton_one_pass_forward_where_its_programs_take_fewer_sweeps_than_two_passes(monkeypatch):
    """launch.one_pass_programs on an H100 (132 SMs; BLOCK_M 64: 256 row blocks at K = 16384) with
    the default 48 MiB of partials."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "PARTIAL_BUDGET_BYTES", 48 * 2**20)
    # UML's four partials (rest, fisher, two logdet): 96 programs fit, 3 sweeps each against two
    # passes of two waves; balanced to the 86 programs 3 sweeps need.
    assert launch.one_pass_programs(256, 16384, 4, 132) == 86
    assert launch.one_pass_programs(256, 16384, 2, 132) == 128  # TCL's two: 192 fit, 2 sweeps
    assert launch.one_pass_programs(1024, 65536, 2, 132) == 0  # 48 fit: 22 sweeps against 2 × 8 waves
    assert launch.one_pass_programs(2, 100, 6, 1) == 2  # every row block a program of its own


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_extra_memory_at_k65536_d1024_is_below_64_mib(dtype):
    """The device memory the Triton ops add beyond inputs, outputs and per-line arrays at
    K = 65536, D = 1024 (planned, not allocated): the forward's column partials (at most
    PARTIAL_BUDGET_BYTES) with both directions' (7, K) statistics, and the backward plan's
    strip of G and float32 accumulator beside the saved statistics, line constants and upstream
    gradients. And what the plan costs in GEMM-equivalents."""
    from evidential_ops.triton_backend import launch

    k, d = 65536, 1024
    forward = launch.PARTIAL_BUDGET_BYTES + 2 * launch.NUM_LINE_STATS * k * 8
    plan = launch.BackwardPlan(k, k, d, dtype)
    backward = plan.extra_bytes + launch.PER_LINE_BYTES * k
    assert forward < 64 * 2**20 and backward < 64 * 2**20
    # A strip or block takes what 64 MiB leaves beside 2 MiB spare and 2·27 float64 a line (27 MiB,
    # launch.PER_LINE_BYTES): 35 MiB. bfloat16: strips of 280 rows of 65536, where dy read and
    # written once a strip would move more bytes than G once more (and a float32 dy would be
    # 256 MiB): two passes. float32: blocks of 3450 × 2624 (19 × 25, columns a multiple of 16 bytes), dx and
    # dy their own accumulators, one pass.
    if dtype == torch.float32:
        assert (plan.kind, plan.gemm_equivalents, plan.block_rows, plan.block_cols) == ("blocks", 3, 3450, 2624)
    else:
        assert (plan.kind, plan.gemm_equivalents, plan.strip) == ("strips, two passes", 4, 280)
    # s from strips in the forward (launch.similarity_strips: float32 at IEEE or at TF32 here, and
    # 16-bit inputs): one strip of s in float32, the partials of its rows from at most one program
    # per SM (200 here) and the columns' sums of one strip, beside both directions' statistics
    rows = launch.strip_rows(k, k, 4)
    strip_forward = rows * k * 4 + launch.strip_programs(k // 64, 200) * 6 * rows * 8 \
        + 3 * launch.NUM_LINE_STATS * k * 8
    assert rows == 140 and strip_forward < 64 * 2**20
    from_s = launch.BackwardPlan(k, k, d, dtype, strips_of_s=True)
    if dtype == torch.float32:  # s in the block, G written over it
        assert from_s.extra_bytes == plan.extra_bytes
    else:  # s in a float32 strip beside G's: 6 bytes an element, strips of 93 rows
        assert (from_s.kind, from_s.s_apart, from_s.strip) == ("strips, two passes", True, 93)
        assert from_s.extra_bytes + launch.PER_LINE_BYTES * k < 64 * 2**20
    # 16-bit strips with dy in their pass: every row in one strip, dy a single product of it (no
    # float32 accumulator: the strip alone, 8 MiB); or 13 strips of 1336 rows beside a float32 dy
    # and the product's float32 result (16 MiB, within ACCUMULATOR_BUDGET_BYTES)
    single = launch.BackwardPlan(2048, 2048, 1024, torch.bfloat16, fused=False)
    assert (single.kind, single.strip, single.dy_in_pass, single.extra_bytes) == ("strips", 2048, True, 8 * 2**20)
    shared = launch.BackwardPlan(16384, 16384, 128, torch.bfloat16, fused=False)
    assert (shared.kind, shared.dy_in_pass) == ("strips", True)
    assert shared.extra_bytes == shared.strip * 16384 * 2 + 16 * 2**20 and launch.triton_cdiv(16384, shared.strip) > 1
    small = launch.BackwardPlan(k, k, 64, torch.bfloat16)
    if not launch.configs.interpreting():
        assert (small.kind, small.gemm_equivalents, small.extra_bytes) == ("fused", 3, k * 64 * 4)


@pytest.mark.parametrize("resident", [True, False])
def test_triton_forward_with_the_row_block_resident_or_stepped_through_d(gen, monkeypatch, resident):
    """The stats sweep with the row block loaded once across the column blocks (D <= RESIDENT_D, the
    FlashAttention forward) and with each tile's product stepped through D: both match the float64
    reference on the same float32 inputs (SPEC §5: 1e-5 relative, 1e-4 for the Fisher terms, plus
    8·√D·2^-24/τ), hard regime, every term, K = 113, D = 203."""
    from evidential_ops.triton_backend import configs, launch

    if not resident:
        monkeypatch.setattr(configs, "INTERPRETER_RESIDENT_D", 0)
        monkeypatch.setattr(configs, "RESIDENT_D", 0)
    k, d, tau = 113, 203, 0.05
    x, y = hard_pairs(k, d, generator=gen)
    source = launch._Source(x.to(device()), y.to(device()))
    assert (launch._resident_d(source, "ieee") > 0) == (resident and configs.interpreting())
    kwargs = dict(evidence="exp", tau=tau, weights=ALL_WEIGHTS, reduction="none")
    rows, cols = eo.evidential_loss(x.to(device()), y.to(device()), backend="triton", direction="both", **kwargs)
    ref_rows, ref_cols = eo.reference.evidential_loss(x.double(), y.double(), direction="both", **kwargs)
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    for got, want in ((rows, ref_rows), (cols, ref_cols)):
        error = (got.double().cpu() - want).abs() / want.abs().clamp_min(1e-3)
        assert float(error.max()) <= 1e-4 + allowance


@pytest.mark.parametrize("strips", ["one strip", "strips", "strips, dx only"])
def test_triton_similarity_strips_match_the_reference(gen, monkeypatch, strips):
    """s from stored strips of cuBLAS products (launch.similarity_strips: TF32 products of float32
    inputs wider than SIMILARITY_STRIPS_ABOVE_D; forced here for every float32 input, so that on a
    GPU the products are IEEE and the tolerances SPEC §5's): the forward's column sums added strip
    after strip, the strip rows' partials reduced into their lines, the backward's G formed over
    each block of s (both gradients) or strip of rows (dx alone) in place. Hard regime, every term,
    a target scale, K = 113, D = 203, one strip or eight (16 rows, the last partial): both
    directions' losses and the gradients against the float64 reference within 1e-4 + 8·√D·2^-24/τ."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "similarity_strips", lambda dtype, d, precision, like=None: dtype == torch.float32)
    if strips != "one strip":  # 16 stored rows of 113 elements aligned (launch.aligned_row_length)
        monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * launch.aligned_row_length(113, 4) * 4)
    forwards = _record_strip_statistics(monkeypatch, launch, lambda a: a[0].n_own)
    plans = _record_plans(monkeypatch, launch)
    k, d, tau = 113, 203, 0.05
    x, y = hard_pairs(k, d, generator=gen)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence="exp", tau=tau, weights=ALL_WEIGHTS, reduction="none", direction="both")
    rows, cols = eo.evidential_loss(x.to(device()), y.to(device()), backend="triton",
                                    target_scale=c.to(device()), **kwargs)
    ref_rows, ref_cols = eo.reference.evidential_loss(x.double(), y.double(), target_scale=c.double(), **kwargs)
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    for got, want in ((rows, ref_rows), (cols, ref_cols)):
        error = (got.double().cpu() - want).abs() / want.abs().clamp_min(1e-3)
        assert float(error.max()) <= 1e-4 + allowance
    gen.manual_seed(3)
    requires = (True, False) if strips == "strips, dx only" else (True, True)
    _backward_against_reference(gen, k, d, requires, tau=tau)
    assert forwards == [k, k]  # this forward and the backward's
    # the backward's blocks of s (float32, both gradients: 2 × 4 of 57 × 32 within 16 rows' budget),
    # or strips of rows for one gradient
    got = [(p.kind, p.from_s, p.strip, p.block_rows, p.block_cols) for p in plans]
    assert got == [{"one strip": ("blocks", True, 0, k, k), "strips": ("blocks", True, 0, 57, 32),
                    "strips, dx only": ("strips", True, 16, 0, 0)}[strips]]


@pytest.mark.parametrize("requires", [(True, True), (True, False), (False, True)], ids=["both", "dx", "dy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_similarity_strips_match_the_reference(gen, monkeypatch, dtype, requires):
    """16-bit embeddings take s from strips too (launch.similarity_strips, every D by default): s in
    float32 from the tensor cores' products (launch.similarity_product), G in the input dtype in a
    strip of its own beside it (BackwardPlan.s_apart, 6 bytes an element). Forced into eight
    strips of rows (and, for both gradients, a second pass over strips of columns: a float32 dy
    beside them would exceed its budget), the fused backward off. Hard regime, every term, a
    target scale, K = 113, D = 203: losses and gradients against the float64 reference on the same
    rounded inputs within SPEC §5's 1e-2 for 16-bit inputs."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "HALF_SIMILARITY_STRIPS_ABOVE_D", 0)
    monkeypatch.setattr(launch.BackwardPlan, "FUSED_DTYPES", ())
    monkeypatch.setattr(launch, "ACCUMULATOR_BUDGET_BYTES", -1)
    k, d, tau = 113, 203, 0.05
    # 8 strips: 16 rows of 113 elements, G's row aligned to 16 bytes, at 2 + 4 bytes an element
    monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * launch.aligned_row_length(k, dtype.itemsize) * 6)
    forwards = _record_strip_statistics(monkeypatch, launch, lambda a: a[0].n_own)
    plans = _record_plans(monkeypatch, launch)
    x, y = hard_pairs(k, d, generator=gen)
    x, y = x.to(dtype), y.to(dtype)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence="exp", tau=tau, weights=ALL_WEIGHTS, reduction="none", direction="both")
    xt = x.clone().to(device()).requires_grad_(requires[0])
    yt = y.clone().to(device()).requires_grad_(requires[1])
    rows, cols = eo.evidential_loss(xt, yt, backend="triton", target_scale=c.to(device()), **kwargs)
    (rows.float().sum() + cols.float().sum()).backward()
    xr, yr = x.double().requires_grad_(requires[0]), y.double().requires_grad_(requires[1])
    ref_rows, ref_cols = eo.reference.evidential_loss(xr, yr, target_scale=c.double(), **kwargs)
    (ref_rows.sum() + ref_cols.sum()).backward()
    for got, want in ((rows, ref_rows), (cols, ref_cols)):
        error = (got.detach().double().cpu() - want.detach()).abs() / want.detach().abs().clamp_min(1e-3)
        assert float(error.max()) <= 1e-2
    for got, want, needed in ((xt.grad, xr.grad, requires[0]), (yt.grad, yr.grad, requires[1])):
        assert (got is not None) == needed
        if needed:
            assert got.dtype == dtype
            assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 1e-2
    assert forwards == [k]
    two_passes = requires == (True, True)
    assert [(p.kind, p.from_s, p.s_apart, p.strip) for p in plans] == [
        ("strips, two passes" if two_passes else "strips", True, True, 16)]


@pytest.mark.parametrize("strips", ["one strip", "strips"])
@pytest.mark.parametrize("direction", ["rows", "cols"])
def test_triton_similarity_strips_of_one_direction_match_the_reference(gen, monkeypatch, direction, strips):
    """One direction's statistics from strips of s (TCL takes one direction a model): each strip's
    rows are whole own lines, swept by rows with no partials (the columns' lines from strips of
    the transposed problem). Strips forced for every float32 input; hard regime, every term, a
    target scale, K = 113, D = 203, one strip or eight: the losses against the float64 reference
    within 1e-4 + 8·√D·2^-24/τ. A strip of lines with a target offset (the distributed loss's
    line_stats) gives the statistics the tile kernels give, within what the two products' orders
    may differ by."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "similarity_strips", lambda dtype, d, precision, like=None: dtype == torch.float32)
    if strips != "one strip":
        monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * 113 * 4)
    calls, original = [], launch._strip_statistics_one_way
    monkeypatch.setattr(launch, "_strip_statistics_one_way", lambda *a: (calls.append((a[0].n_own, a[1])),
                                                                           original(*a)))
    k, d, tau = 113, 203, 0.05
    x, y = hard_pairs(k, d, generator=gen)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence="exp", tau=tau, weights=ALL_WEIGHTS, reduction="none", direction=direction)
    pick = 0 if direction == "rows" else 1  # (row losses, column losses), the other one empty
    got = eo.evidential_loss(x.to(device()), y.to(device()), backend="triton", target_scale=c.to(device()),
                             **kwargs)[pick]
    want = eo.reference.evidential_loss(x.double(), y.double(), target_scale=c.double(), **kwargs)[pick]
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    error = (got.double().cpu() - want).abs() / want.abs().clamp_min(1e-3)
    assert got.shape == (k,) and float(error.max()) <= 1e-4 + allowance
    assert calls == [(k, 0)]
    # rows 30..113 of the problem, targets at columns 30..113: the one-way sweep with t_off = 30,
    # TCL's terms (the statistics of the others stay 0), strips of 14 rows but a last one of 13
    tcl = eo.checks.loss_config(evidence="exp", tau=tau, weights={"risk": 1.0, "kl": 0.1}, direction="rows",
                                reduction="none")
    ops, mask = eo.backends.resolve("triton", torch.device(device())).ops, eo.ops.terms_mask(tcl)
    xs, yd = x[30:].to(device()), y.to(device())
    strip_rows, _ = ops.line_stats(xs, yd, 30, "exp", tau, mask, True, False)
    assert calls[-1] == (k - 30, 30)
    monkeypatch.setattr(launch, "similarity_strips", lambda dtype, d, precision, like=None: False)
    tile_rows, _ = ops.line_stats(xs, yd, 30, "exp", tau, mask, True, False)
    assert bool((tile_rows[3:] == 0).all())  # MSE, Fisher, logdet: not asked for
    torch.testing.assert_close(strip_rows, tile_rows, rtol=4 * math.sqrt(d) * 2.0**-24 / tau, atol=0)


@pytest.mark.parametrize("strips", [False, True])
def test_triton_reads_no_buffer_before_writing_it(gen, monkeypatch, strips):
    """No buffer is read before it is written: with every torch.empty of the op filled with NaN,
    the losses and gradients are finite and the same bits as without (same kernels, same
    summation order), for the one-pass forward and for strips of s (whose column partials are
    zeroed once, then again by each strip's reduction as it reads them: reduce_partials_kernel
    CLEAR). K = 113 (the interpreter's 64-row tiles: two programs, the second's block partial),
    D = 40, every term, exp and exp_tanh evidence."""
    from evidential_ops.triton_backend import launch

    if strips:  # s from strips of 16 rows (8 strips), both directions
        monkeypatch.setattr(launch, "similarity_strips", lambda dtype, d, precision, like=None: True)
        monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 16 * 113 * 4)
    x, y = hard_pairs(113, 40, generator=gen)
    x, y = x.to(device()), y.to(device())
    empty = torch.empty

    def run(evidence):
        xt, yt = x.clone().requires_grad_(), y.clone().requires_grad_()
        rows, cols = eo.evidential_loss(xt, yt, backend="triton", evidence=evidence, tau=0.05, weights=ALL_WEIGHTS,
                                        direction="both", reduction="none")
        (rows.sum() + cols.sum()).backward()
        return rows.detach(), cols.detach(), xt.grad, yt.grad

    for evidence in ("exp", "exp_tanh"):
        clean = run(evidence)
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
        poisoned = run(evidence)
        monkeypatch.setattr(torch, "empty", empty)
        for a, b in zip(clean, poisoned):
            assert bool(torch.isfinite(b).all()) and torch.equal(a, b)


@pytest.mark.parametrize("n_q,n_g", [(7, 500), (300, 70)])
def test_triton_similarity_strips_opinions_of_unequal_sides(gen, monkeypatch, n_q, n_g):
    """Opinions (no targets) from strips of s on problems whose sides differ (strips forced as above,
    each of 4 rows of the longer side's width: the query side in 2 or 75 strips, the last partial):
    both sides' log strengths against the float64 reference within 1e-5 + 8·√D·2^-24/τ."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "similarity_strips", lambda dtype, d, precision, like=None: dtype == torch.float32)
    monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 4 * n_g * 4)
    taken = []
    original = launch._strip_statistics
    monkeypatch.setattr(launch, "_strip_statistics", lambda *a: (taken.append(a[0].n_own), original(*a)))
    x, _ = random_pairs(n_q, 48, generator=gen)
    y, _ = random_pairs(n_g, 48, generator=gen)
    got = eo.opinion(x.to(device()), y.to(device()), tau=0.05, backend="triton")
    ref = eo.reference.opinion(x, y, tau=0.05)
    assert taken == [n_q]
    for name in ("row_log_strength", "col_log_strength"):
        error = (getattr(got, name).double().cpu() - getattr(ref, name)).abs()
        assert float(error.max()) <= 1e-5 + 8 * math.sqrt(48) * 2.0**-24 / 0.05, name


def test_triton_similarity_strips_of_row_strips_with_a_target_offset(gen, monkeypatch):
    """Rows [a, b) of an N×N problem, as distributed training asks for them (line_stats and
    loss_backward with target offset a), with s from strips (SIMILARITY_STRIPS_ABOVE_D lowered to
    16, strips of 8 rows; TF32 products) against the square problem through the tile kernels. On
    the 2^-8 grid (conftest.on_exact_grid) s is exact in float32 and TF32 alike, so only summation
    orders differ: each row's and the summed columns' float64 statistics within
    reordered_sum_bound (Σ|ln ψ1| for the sign-changing log-trigamma sums; the logdet's two with
    float32 tile partials, float32's bound added), each strip's dx and the
    strips' summed dy within two float32 GEMM orders of the square ones' (|G| from the reference)."""
    from conftest import on_exact_grid, reordered_sum_bound, unit_roundoff
    from evidential_ops.triton_backend import launch

    n, d, tau = 70, 24, 0.05
    x, y = (on_exact_grid(t) for t in hard_pairs(n, d, generator=gen))
    x, y = x.to(device()), y.to(device())
    config = eo.checks.loss_config(evidence="exp", tau=tau, weights=ALL_WEIGHTS, direction="both", reduction="none")
    ops, mask, w = eo.backends.resolve("triton", x.device).ops, eo.ops.terms_mask(config), eo.ops.weights_tensor(config)
    grad_rows, grad_cols = torch.rand(n, generator=gen).to(x), torch.rand(n, generator=gen).to(x)
    _, _, row_stats, col_stats = ops.loss_forward(x, y, None, "exp", tau, w, mask, True, True, "tf32")
    dx, dy = ops.loss_backward(grad_rows, grad_cols, x, y, None, row_stats, col_stats, "exp", tau, w, mask, True, True,
                               0, [True, True], "tf32")
    monkeypatch.setattr(launch, "SIMILARITY_STRIPS_ABOVE_D", 16)
    monkeypatch.setattr(launch, "STRIP_BUDGET_BYTES", 8 * n * 4)
    offsets = _record_strip_statistics(monkeypatch, launch, lambda a: a[1])
    plans = _record_plans(monkeypatch, launch)
    s = x.double().cpu() @ y.double().cpu().T  # exact: the grid
    log_trigamma = torch.polygamma(1, s.div(tau).exp() + 1).log().abs()
    magnitude = [row_stats.abs().cpu(), col_stats.abs().cpu()]
    magnitude[0][5], magnitude[1][5] = log_trigamma.sum(1), log_trigamma.sum(0)  # Σ ln ψ1: LineStat 5
    row_bound, col_bound = (reordered_sum_bound(n, torch.float64, m) for m in magnitude)
    for bound, m in zip((row_bound, col_bound), magnitude):
        # ln ψ1 and r (LineStats 5, 6) are summed in float32 within a tile (kernels._tile_column_sum):
        # partials of at most a tile's side (64 lines, here the line's 70) before the float64 sum
        bound[5:] += reordered_sum_bound(n, torch.float32, m[5:])
    s_ref = s.clone().requires_grad_()
    ref_rows, ref_cols = eo.reference.evidential_loss_from_similarity(s_ref, evidence="exp", tau=tau,
                                                                      weights=ALL_WEIGHTS, reduction="none")
    (g_ref,) = torch.autograd.grad((ref_rows * grad_rows.double().cpu()).sum()
                                   + (ref_cols * grad_cols.double().cpu()).sum(), s_ref)
    u = unit_roundoff(torch.float32)
    dx_bound = 2 * ((2 * n + 2) * u * (g_ref.abs() @ y.double().cpu().abs()) + u * dx.double().cpu().abs())
    dy_bound = 2 * ((2 * (n + 3) + 2) * u * (g_ref.abs().T @ x.double().cpu().abs()) + u * dy.double().cpu().abs())

    def within(got, want, bound):
        excess = (got.double().cpu() - want.double().cpu()).abs() - bound
        assert float(excess.max()) <= 0, float(excess.max())

    bounds = [0, 13, 41, n]
    strips = [ops.line_stats(x[a:b], y, a, "exp", tau, mask, True, True, "tf32") for a, b in zip(bounds, bounds[1:])]
    summed_cols = sum(col for _, col in strips)
    within(summed_cols, col_stats, col_bound)
    dy_sum = torch.zeros_like(dy)
    for (a, b), (strip_rows, _) in zip(zip(bounds, bounds[1:]), strips):
        within(strip_rows, row_stats[:, a:b], row_bound[:, a:b])
        dx_strip, dy_part = ops.loss_backward(grad_rows[a:b], grad_cols, x[a:b], y, None, strip_rows, summed_cols,
                                              "exp", tau, w, mask, True, True, a, [True, True], "tf32")
        within(dx_strip, dx[a:b], dx_bound[a:b])
        dy_sum += dy_part
    within(dy_sum, dy, dy_bound)
    assert offsets == bounds[:-1] and [p.from_s for p in plans] == [True] * 3


def test_triton_similarity_strips_where_float32_tiles_would_read_their_rows_again(monkeypatch):
    """Which inputs take s from strips: float32 with TF32 products wider than
    SIMILARITY_STRIPS_ABOVE_D (512: 64 float32 rows beyond half an H100 SM's L1), and float32 with
    IEEE products at every D (the tiles' FFMA products ran at an eighth of cuBLAS's on an H200), in
    both directions; not 16-bit inputs or narrower TF32 D. (A given s is never re-formed: the
    from-similarity tests fail if _line_statistics asks for strips of it.)"""
    from evidential_ops.triton_backend import launch

    def strips(d, precision="tf32", dtype=torch.float32):
        source = launch._Source(torch.zeros(2, d, dtype=dtype), torch.zeros(3, d, dtype=dtype))
        return launch.similarity_strips(source.dtype, source.d, precision, source.a)

    monkeypatch.setattr(launch, "SIMILARITY_STRIPS_ABOVE_D", 512)  # the defaults (EO_TRITON_STRIPS_ABOVE_D,
    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 0)  # EO_TRITON_IEEE_STRIPS_ABOVE_D)
    assert strips(1024)
    assert strips(513)
    assert not strips(512)
    assert strips(1024, "ieee") and strips(16, "ieee") and strips(1, "ieee")
    assert not strips(1024, dtype=torch.bfloat16)
    assert not strips(1024, "ieee", dtype=torch.float16)
    assert not strips(1024, "ieee", dtype=torch.float64)
    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 64)
    assert strips(65, "ieee") and not strips(64, "ieee")
    assert launch.BackwardPlan(16384, 16384, 1024, torch.float32, strips_of_s=True).from_s
    assert not launch.BackwardPlan(16384, 16384, 1024, torch.float32).from_s
    # A traced graph keeps the tile kernels: the strips' cuBLAS products would take torch's TF32
    # switch when the graph runs, not the op's precision.
    monkeypatch.setattr(launch, "_tracing", lambda t: True)
    assert not strips(1024) and not strips(1024, "ieee")


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_triton_traced_graph_keeps_the_tile_kernels_at_wide_d(gen, monkeypatch, precision):
    """What a traced graph does with float32 inputs that eager launches take through strips (TF32
    products wider than SIMILARITY_STRIPS_ABOVE_D, lowered here to 16; IEEE products at every D):
    no cuBLAS strips of s in the forward or the backward, and the same results as the eager
    launches (strips) within what the two ways of forming s may differ by."""
    from evidential_ops.triton_backend import launch

    monkeypatch.setattr(launch, "SIMILARITY_STRIPS_ABOVE_D", 16)
    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 0)
    x, y = hard_pairs(70, 24, generator=gen)
    x, y = x.to(device()), y.to(device())
    ops = eo.backends.resolve("triton", x.device).ops
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    strips = _record_strip_statistics(monkeypatch, launch, lambda a: 1)
    plans = _record_plans(monkeypatch, launch)
    runs = []
    for traced in (False, True):
        if traced:
            monkeypatch.setattr(launch, "_tracing", lambda t: True)
            monkeypatch.setattr(eo.checks, "values_unreadable", lambda t: True)
        out = ops.loss_forward(x, y, None, "exp", 0.05, w, mask, True, True, precision)
        grads = ops.loss_backward(out[0], out[1], x, y, None, out[2], out[3], "exp", 0.05, w, mask, True, True, 0,
                                  [True, True], precision)
        runs.append((*out[:2], *grads))
    assert strips == [1] and [p.from_s for p in plans] == [True, False]  # eager: strips; traced: tiles
    # Each way's s is within D·2^-24 of the exact one for unit vectors (float32 sums), plus 2^-10 on
    # a GPU with TF32 (it rounds both operands to 2^-11 relative, cuBLAS and the tiles each in its
    # own way; the interpreter's products are float32). So |Δ(s/τ)| <= 2·(2^-10 + D·2^-24)/τ, the
    # relative change of each α and of what is built from them.
    tf32_rounding = 2.0**-10 if COMPILED and precision == "tf32" else 0.0
    bound = 2 * (tf32_rounding + 24 * 2.0**-24) / 0.05
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=bound, atol=bound * float(b.abs().max()))


def test_every_default_tile_is_in_the_autotuning_space():
    """Autotuning picks among configs.SPACE: a default outside it would never be timed against the
    others, and aot_check would compile it only as a default."""
    from evidential_ops.triton_backend import configs

    for arch, defaults in configs.DEFAULTS_BY_ARCH.items():
        for kernel, config in defaults.items():
            assert config in configs.SPACE[kernel], (arch, kernel, config)


@pytest.mark.parametrize("value, interpreting", [("1", True), ("true", True), ("ON", True), ("yes", True),
                                                 ("y", True), (" 1", False), ("0", False), ("false", False),
                                                 ("", False)])
def test_interpreting_reads_the_variable_as_triton_does(monkeypatch, value, interpreting):
    from evidential_ops.triton_backend import configs

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert configs.interpreting() is interpreting


CONTRACTION_PROBE = r'''
import os, re, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, sys.argv[1])
import triton
from triton.backends.compiler import GPUTarget
from evidential_ops.triton_backend import infonce_kernels as ik
fn = ik.infonce_stats_kernel
types = dict(q_ptr="*fp32", c_ptr="*fp32", stride_qi="i32", stride_qk="i32", stride_cj="i32", stride_ck="i32",
             g_ptr="*i64", out_ptr="*fp64", state_ptr="*fp64", M="i32", ROW0="i32", N="i32", COL0="i32", K="i32",
             D="i32", inv_tau="fp64")
for group in (0, 1):
    for drop_self in (0, 1):
        const = dict(HAS_GROUP=group, DROP_SELF=drop_self, F64=0, FROM_S=0, LOAD=0, FINISH=1, BLOCK_M=32,
                     BLOCK_N=32, BLOCK_K=32)
        sig = {n: "constexpr" if n in const else types[n] for n in fn.arg_names}
        src = triton.compiler.ASTSource(fn=fn, signature=sig,
                                        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3)).asm["ptx"]
        negated = set(re.findall(r"neg\.f32\s+(%r\d+)", ptx))
        addends = re.findall(r"fma\.rn\.f32\s+%r\d+, %r\d+, %r\d+, (%r\d+);", ptx)
        print(group, drop_self, sum(a in negated for a in addends))
'''


def test_infonce_logits_are_rounded_once_in_the_compiled_kernel(tmp_path):
    """The first GPU run (H200, triton 3.6) had the InfoNCE gradients off by up to 2.8e3x their
    tolerance: FP fusion contracted v − shift of the candidates' log-sum-exp into fma(s, 1/τ, −shift),
    the unrounded logit, where the positives' used the rounded one, so ℓ = LSE_D − LSE_P (tiny on a
    confident line, and every gradient is proportional to 1 − e^{−ℓ}) carried v's rounding, ~1e-6.
    The interpreter never contracts. Compiled for sm_90 (no GPU needed), no float32 FMA of the stats
    kernel may take a negated operand as its addend."""
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(CONTRACTION_PROBE)
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, env=env)
    if run.returncode != 0 and ("ModuleNotFoundError" in run.stderr or "cannot compile" in run.stderr):
        pytest.skip(f"triton cannot compile for sm_90 here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    for line in run.stdout.split("\n"):
        if line.strip():
            group, drop_self, contracted = line.split()
            assert contracted == "0", f"group={group} drop_self={drop_self}: {contracted} contracted logits"


def test_cublas_calls_stay_one_op_under_torch_compile(monkeypatch):
    """The float32 backward multiplies its strips or blocks of G with cuBLAS at the op's own
    matmul_precision, set around the products in eager mode: traced into a graph, they would run
    at torch's global TF32 switch instead (an H200: opcheck's compiled "tf32" gradient differed by
    up to 14 % an element). The float32 forward ops take s from cuBLAS strips at IEEE precision (at
    every D) and at TF32 beyond SIMILARITY_STRIPS_ABOVE_D: traced, they would take the tile kernels
    (an H200: opcheck's traced line_stats differed from the eager one), and so do 16-bit inputs at
    every D (their s in float32) in the backward too, unless it is one fused kernel. The InfoNCE ops of float32
    and 16-bit inputs take cuBLAS strips (their tile kernels took 29-32x plain PyTorch's time
    there). Those calls stay whole under torch.compile, with arguments given by position or by
    name; float64 calls and the other ops still decompose into their Triton kernels."""
    from evidential_ops.triton_backend import launch, registration

    monkeypatch.setattr(launch, "SIMILARITY_STRIPS_ABOVE_D", 512)  # the defaults (EO_TRITON_STRIPS_ABOVE_D,
    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 0)  # EO_TRITON_IEEE_STRIPS_ABOVE_D,
    monkeypatch.setattr(launch, "HALF_SIMILARITY_STRIPS_ABOVE_D", 0)  # EO_TRITON_HALF_STRIPS_ABOVE_D)
    family = getattr(torch.ops, eo.ops.NAMESPACE)
    opaque = lambda name, *args, **kwargs: registration._cublas_products(getattr(family, name).default, name, args,
                                                                         kwargs)
    wide, narrow = launch.SIMILARITY_STRIPS_ABOVE_D + 1, launch.SIMILARITY_STRIPS_ABOVE_D

    def backward(dtype, name="loss_backward", d=2):
        x = torch.zeros(3, d, dtype=dtype, device=device())
        if name == "infonce_backward":
            return opaque(name, None, None, x, x, None, None, None, 0.05, False, True, True, [True, True])
        return opaque(name, None, None, x, x, None, None, None, "exp", 0.05, None, 1, True, True, 0, [True, True],
                      "tf32")

    def forward(dtype, d, *precision, **named):
        x = torch.zeros(3, d, dtype=dtype, device=device())
        return (opaque("loss_forward", x, x, None, "exp", 0.05, None, 1, True, True, *precision, **named),
                opaque("line_stats", x, x, 0, "exp", 0.05, 1, True, True, *precision, **named),
                opaque("opinion", x, x, "exp", 0.05, *precision, **named))

    assert backward(torch.float32) and not backward(torch.float64)
    assert forward(torch.float64, wide) == (False, False, False)
    fused = launch.configs.has_default("grad_fused", device())  # 16-bit backwards in registers at small D
    for dtype in (torch.bfloat16, torch.float16):  # s from strips at every D, in float32
        assert backward(dtype, d=wide) and backward(dtype, d=2) == (not fused)
        assert forward(dtype, 2) == (True, True, True)
    assert forward(torch.float32, 2) == (True, True, True)  # IEEE, the schemas' default
    assert forward(torch.float32, 2, matmul_precision="ieee") == (True, True, True)
    assert forward(torch.float32, narrow, "tf32") == (False, False, False)
    assert forward(torch.float32, wide, matmul_precision="tf32") == (True, True, True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.zeros(3, 2, dtype=dtype, device=device())
        assert opaque("infonce_forward", x, x, None, 0.05, False, True, True)
        assert backward(dtype, "infonce_backward")
    x = torch.zeros(3, 2, dtype=torch.float64, device=device())
    assert not opaque("infonce_forward", x, x, None, 0.05, False, True, True)
    assert not opaque("loss_forward_from_similarity", x, None, "exp", 0.05, None, 1, True, True)
