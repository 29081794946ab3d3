"""The reduced float32 special-function sweep (bench/float32_special_sweep.py --reduced) as a test:
the C++ float32 functions against mpmath on a subset of the full sweep's points, each error held to
the bound the committed full sweep measured (bench/results/float32_special_functions.json)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import float32_special_sweep as sweep  # noqa: E402

needs_toolchain = pytest.mark.skipif(
    shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="needs cmake and a C++ compiler to build the float32 driver",
)


@pytest.mark.parametrize("domain", sorted(sweep.DOMAINS))
def test_reduced_grid_is_a_subset_of_the_full_one(domain):
    """The committed maxima bound the reduced sweep's only because its points are among the full sweep's."""
    points = sweep.DOMAINS[domain][0]
    reduced, full = points(True), points(False)
    assert np.isin(reduced, full).all()


@needs_toolchain
def test_reduced_sweep_within_committed_bounds():
    drivers = sweep.build_drivers()
    assert drivers, "no float32 driver variant could be built and run"
    report = sweep.sweep(True, 2, drivers)
    failures = sweep.check_against_bounds(report)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_generated_coefficients_are_current():
    script = HERE.parent / "csrc" / "kernels" / "make_special_functions_f32.py"
    subprocess.run([sys.executable, str(script), "--check"], check=True)
