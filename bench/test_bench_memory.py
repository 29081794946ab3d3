"""Extra peak memory of forward + backward, each measured in a fresh process (see memory_probe.py).

The fused backends must stay O(K) (+ the K×D gradients): at K = 4096, D = 512 below 32 MiB,
where plain PyTorch materialises a dozen K×K float32 matrices (over 1 GiB).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from evidential_ops import available_backends

PROBE = pathlib.Path(__file__).with_name("memory_probe.py")
FUSED = [b for b in available_backends() if b not in ("reference", "triton", "cuda")]
SIZES = [1024, pytest.param(4096, marks=pytest.mark.slow)]


def measure(impl: str, case: str, k: int, d: int = 512) -> float:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, str(PROBE), "--impl", impl, "--case", case, "--k", str(k), "--d", str(d)],
        env=env, capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "unavailable" in result:
        pytest.skip(result["unavailable"])
    return result["extra_peak_mib"]


@pytest.mark.parametrize("impl", FUSED + ["reference"])
@pytest.mark.parametrize("case", ["tcl", "uml", "duq"])
@pytest.mark.parametrize("k", SIZES)
def test_extra_peak_memory(benchmark, k, case, impl):
    result = {}
    benchmark.pedantic(lambda: result.update(mib=measure(impl, case, k)), rounds=1, iterations=1)
    benchmark.group = f"memory {case} K={k}"
    benchmark.extra_info.update({"case": case, "k": k, "d": 512, "impl": impl, "extra_peak_mib": result["mib"]})
    if impl != "reference":
        # O(K) statistics + tiles + the 2·K·D float32 gradients: the bound is 32 MiB at
        # K = 4096, D = 512; scaled with K (plus 4 MiB of allocator slack) at smaller sizes.
        assert result["mib"] < 32 * (k / 4096) + 4, result["mib"]
