"""pytest-benchmark suite: forward + backward of each method's loss, per implementation.

    pytest bench/ --benchmark-json=bench/results/cpu.json            # K = 256 only
    pytest bench/ --run-slow --benchmark-json=bench/results/cpu.json # K = 256, 1024, 4096
    python bench/report.py bench/results/cpu.json                    # markdown table

All implementations of one run are timed in the same process, so their ratios are comparable;
numbers from different runs or machines are not.
"""

from __future__ import annotations

import pytest
import torch

from evidential_ops.benchmark import LOSS_CASES, default_impls, make_inputs, step_function

D = 512
SIZES = [256, pytest.param(1024, marks=pytest.mark.slow), pytest.param(4096, marks=pytest.mark.slow)]
IMPLS = default_impls()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(LOSS_CASES))
@pytest.mark.parametrize("k", SIZES)
def test_loss_forward_backward(benchmark, k, case, impl):
    x, y = make_inputs(k, D)
    step = step_function(impl, LOSS_CASES[case])
    benchmark.group = f"{case} K={k}"
    benchmark.extra_info.update({"case": case, "k": k, "d": D, "impl": impl, "threads": torch.get_num_threads()})
    rounds = {256: 10, 1024: 5}.get(k, 3)  # the reference UML loss alone takes ~1 min per round at K = 4096
    benchmark.pedantic(step, args=(x, y), rounds=rounds, iterations=1, warmup_rounds=1)
