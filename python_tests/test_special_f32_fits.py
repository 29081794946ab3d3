"""The Triton kernels' float32 coefficients are the C++ ones (SPEC §2 "Float32 element math").

csrc/kernels/make_special_functions_f32.py writes both csrc/kernels/special_functions_f32_fits.h and
evidential_ops/triton_backend/special_f32_fits.py; these tests read both files as text (no compiler,
no Triton) and require the same functions, the same Horner steps and the same float32 values, so
that neither can be edited, or regenerated alone, without the other. The constants that special.py
takes from elementary_f32.h and special_functions_f32.h are held to those headers the same way.
"""

from __future__ import annotations

import ast
import math
import pathlib
import re
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "csrc" / "kernels" / "special_functions_f32_fits.h"
MODULE = ROOT / "evidential_ops" / "triton_backend" / "special_f32_fits.py"
SPECIAL = ROOT / "evidential_ops" / "triton_backend" / "special.py"
FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def f32_bits(value) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def c_constants(text: str) -> dict[str, int]:
    """`constexpr float kName = <literal>f;` -> {kName: float32 bits}."""
    return {name: f32_bits(np.float32(value))
            for name, value in re.findall(rf"constexpr float (k\w+) = ({FLOAT})f;", text)}


def c_functions(text: str) -> dict[str, list[tuple]]:
    """Each `EO_HOST_DEVICE float name(float v) {...}` as its Horner steps: ("init", bits),
    ("step", bits or None for `p = p * v;`), ("hi_lo", lo bits, hi bits) or ("return",)."""
    out = {}
    for name, body in re.findall(r"EO_HOST_DEVICE float (\w+)\(float \w\) \{\n(.*?)\n\}", text, re.S):
        steps = []
        for line in body.strip().splitlines():
            line = line.strip()
            if m := re.fullmatch(rf"float p = ({FLOAT})f;", line):
                steps.append(("init", f32_bits(np.float32(m.group(1)))))
            elif m := re.fullmatch(rf"p = p \* \w \+ ({FLOAT})f;", line):
                steps.append(("step", f32_bits(np.float32(m.group(1)))))
            elif re.fullmatch(r"p = p \* \w;", line):
                steps.append(("step", None))
            elif m := re.fullmatch(rf"return \(p \* \w \+ ({FLOAT})f\) \+ ({FLOAT})f;.*", line):
                steps.append(("hi_lo", f32_bits(np.float32(m.group(1))), f32_bits(np.float32(m.group(2)))))
            elif line == "return p;":
                steps.append(("return",))
            else:
                raise AssertionError(f"{name}: unexpected line {line!r}")
        out[name] = steps
    return out


def number(node: ast.expr) -> float:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -number(node.operand)
    assert isinstance(node, ast.Constant) and isinstance(node.value, float | int), ast.dump(node)
    return float(node.value)


def exact_f32_bits(value: float) -> int:
    """The float32 bits of a Python float that must be a float32 value exactly."""
    assert float(np.float32(value)) == value, f"{value!r} is not a float32 value"
    return f32_bits(value)


def python_functions(tree: ast.Module) -> dict[str, list[tuple]]:
    """The generated module's device functions as the same steps as `c_functions`."""
    out = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        steps = []
        for stmt in fn.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstring
            if isinstance(stmt, ast.Assign) and not isinstance(stmt.value, ast.BinOp):
                steps.append(("init", exact_f32_bits(number(stmt.value))))
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value.op, ast.Add):
                steps.append(("step", exact_f32_bits(number(stmt.value.right))))
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value.op, ast.Mult):
                steps.append(("step", None))
            elif isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.BinOp):
                lo = number(stmt.value.left.right)
                steps.append(("hi_lo", exact_f32_bits(lo), exact_f32_bits(number(stmt.value.right))))
            elif isinstance(stmt, ast.Return):
                steps.append(("return",))
            else:
                raise AssertionError(f"{fn.name}: unexpected statement {ast.unparse(stmt)!r}")
        out[fn.name] = steps
    return out


def python_constants(tree: ast.Module) -> dict[str, float]:
    """Module-level `NAME = tl.constexpr(<number or expression>)` -> {NAME: value}."""
    out = {}
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and ast.unparse(stmt.value.func) == "tl.constexpr"):
            out[stmt.targets[0].id] = stmt.value.args[0]
    return out


def python_name(c_name: str) -> str:
    """kDigammaRootHi -> DIGAMMA_ROOT_HI (make_special_functions_f32.python_constant_name)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", c_name[1:]).upper()


def test_generated_module_has_the_header_coefficients():
    header = HEADER.read_text(encoding="utf-8")
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    assert MODULE.read_text(encoding="utf-8").startswith("# GENERATED by csrc/kernels/make_special_functions_f32.py")
    c_fns, py_fns = c_functions(header), python_functions(tree)
    assert len(c_fns) == 29  # 11 fits in s, 8 in t (exp_tanh), 10 series
    assert sorted(f"{name}_f32" for name in c_fns) == sorted(py_fns)
    for name, steps in c_fns.items():
        assert py_fns[f"{name}_f32"] == steps, name
    constants = python_constants(tree)
    c_consts = c_constants(header)
    assert len(c_consts) == 10
    assert sorted(python_name(n) for n in c_consts) == sorted(constants)
    for name, bits in c_consts.items():
        assert exact_f32_bits(number(constants[python_name(name)])) == bits, name


# special.py's constants from elementary_f32.h and special_functions_f32.h (special.py derives them
# from their definitions; the headers hold the float32 literals).
ELEMENTARY_CONSTANTS = {
    "kLn2HiF": "LN2_HI_F32", "kLn2LoF": "LN2_LO_F32", "kLog2eF": "LOG2E_F32", "kRoundMagicF": "ROUND_MAGIC_F32",
    "kMaxExpArgF": "MAX_EXP_ARG_F32", "kMinExpArgF": "MIN_EXP_ARG_F32",
    "kHalfLog2PiF": "HALF_LOG_2PI_F32", "kHalfLog2PiMinusHalfF": "HALF_LOG_2PI_MINUS_HALF_F32",
}


def test_special_py_constants_are_the_headers():
    triton_backend = pytest.importorskip("evidential_ops.triton_backend.special", reason="needs triton")
    headers = "".join((ROOT / "csrc" / "kernels" / name).read_text(encoding="utf-8")
                      for name in ("elementary_f32.h", "special_functions_f32.h"))
    c_consts = c_constants(headers)
    for c_name, py_name in ELEMENTARY_CONSTANTS.items():
        value = getattr(triton_backend, py_name).value
        assert exact_f32_bits(value) == c_consts[c_name], (c_name, value)
    # literals inside the C++ functions
    assert triton_backend.SQRT2_F32.value == float(np.float32("1.41421354"))  # log_f's mantissa split
    assert triton_backend.FLT_MAX_F32.value == float(np.float32("3.40282347e38"))  # finite_argument
    # exp_f's and log_f's Taylor coefficients, 1.0f / 5040.0f ...: Python's double quotient rounds to
    # the same float32 as C++'s float quotient (no double rounding at these values)
    for a, b in ((1, 5040), (1, 720), (1, 120), (1, 24), (1, 6), (2, 11), (2, 9), (2, 7), (2, 5), (2, 3)):
        assert np.float32(a / b) == np.float32(a) / np.float32(b)
    # exp evidence's float64 α: its reduction reaches past ln DBL_MAX (+inf there) with n <= 1024
    # (alpha_f64_of_f32's exponent bits cannot carry into the sign)
    assert triton_backend.EXP_DOUBLE_ARG_F32.value > math.log(sys.float_info.max)
    assert round(triton_backend.EXP_DOUBLE_ARG_F32.value * math.log2(math.e)) == 1024
