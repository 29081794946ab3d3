"""bench/tf32x3_error.py's emulation pieces: TF32 rounding, the split, the tensor-core sum."""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tf32x3_error as t


def test_tf32_rounding_is_to_nearest_ties_away_with_ten_stored_bits():
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # TF32's spacing at 1
    cases = [(one + ulp / 4, one), (one + ulp / 2, one + ulp), (one + 3 * ulp / 4, one + ulp),
             (-(one + ulp / 2), -(one + ulp)), (one + ulp, one + ulp)]
    for value, expected in cases:
        assert t.round_tf32(np.array([value], dtype=np.float32))[0] == expected, value
    # the operand a tensor core reads drops the low bits instead (toward zero)
    assert t.tf32_operand(np.array([one + 3 * ulp / 4], dtype=np.float32))[0] == one


def test_head_and_tail_carry_all_but_two_to_the_minus_21_of_a_float32():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(10000).astype(np.float32)
    hi = t.round_tf32(a)
    lo = t.tf32_operand(a - hi)
    assert np.all(np.abs(hi.astype(np.float64) - a) <= 2.0**-11 * np.abs(a))
    assert np.all(np.abs(hi.astype(np.float64) + lo - a) <= 2.0**-21 * np.abs(a))


def test_exact_inputs_give_exact_dots_and_truncation_never_rounds_up():
    rng = np.random.default_rng(2)
    x = rng.integers(-8, 8, (50, 64)).astype(np.float32) / 8  # TF32-exact, sums exact in float32
    y = rng.integers(-8, 8, (50, 64)).astype(np.float32) / 8
    exact = (x.astype(np.float64) * y).sum(axis=1)
    for mode in ("RN", "RZ"):
        assert np.array_equal(t.tf32x3_dot(x, y, mode, 16), exact.astype(np.float32))
    v = np.array([1.0 + 2.0**-30, -(1.0 + 2.0**-30), 3.0], dtype=np.float64)
    assert np.all(np.abs(t.to_float32(v, "RZ").astype(np.float64)) <= np.abs(v))
    assert t.to_float32(v, "RN")[0] == np.float32(1.0) and t.to_float32(v, "RZ")[2] == np.float32(3.0)


def test_the_table_rows_compare_each_method_with_the_exact_dot():
    e = t.errors(200, 203, 0.99, seed=0)
    assert set(e) == {"ieee FFMA", "TF32"} | {f"tf32x3 {m} k{k}" for k in t.BLOCK_KS for m in ("RN", "RZ")}
    assert e["TF32"][0] > 10 * e["ieee FFMA"][0] > 0  # TF32 alone is far coarser than float32
