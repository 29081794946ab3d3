"""pytest-benchmark suite: forward + backward of each method's loss, per implementation.

    pytest bench/ --benchmark-json=bench/results/cpu.json            # K = 256 only
    pytest bench/ --run-slow --benchmark-json=bench/results/cpu.json # K = 256, 1024, 4096
    python bench/report.py bench/results/cpu.json                    # markdown table

All implementations of one run are timed in the same process, so their ratios are comparable;
numbers from different runs or machines are not. On a shared VM the machine's speed drifts between
the blocks of rounds pytest-benchmark runs per implementation (the floor's fastest round moved by
12% between the loss cases of one run), so the fused-to-floor ratio is also measured paired: fused
and floor steps alternating in one loop (test_fused_against_floor_interleaved, K = 4096), and so is
the fused op against torch.compile where that ratio is near 3 (test_fused_against_compiled_interleaved).
"""

from __future__ import annotations

import pytest
import torch

from evidential_ops.benchmark import (LOSS_CASES, default_impls, fused_backends, interleaved_minima, make_inputs,
                                      step_function)

D = 512
SIZES = [256, pytest.param(1024, marks=pytest.mark.slow), pytest.param(4096, marks=pytest.mark.slow)]
IMPLS = default_impls()
FAST_IMPLS = [impl for impl in IMPLS if impl not in ("reference", "naive", "compiled")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(LOSS_CASES))
@pytest.mark.parametrize("k", SIZES)
def test_loss_forward_backward(benchmark, k, case, impl):
    x, y = make_inputs(k, D)
    step = step_function(impl, LOSS_CASES[case])
    benchmark.group = f"{case} K={k}"
    benchmark.extra_info.update({"case": case, "k": k, "d": D, "impl": impl, "threads": torch.get_num_threads()})
    # The reference UML loss alone takes ~1 min per round at K = 4096: the plain baselines get few
    # rounds there; the fused op and the floor (under 0.5 s a round) always 10, so the ratio
    # between them compares two minima over as many rounds on this shared machine.
    rounds = 10 if impl in FAST_IMPLS else {256: 10, 1024: 5}.get(k, 3)
    benchmark.pedantic(step, args=(x, y), rounds=rounds, iterations=1, warmup_rounds=1)


PAIRED_K = 4096
PAIRED_ROUNDS = 20


@pytest.mark.slow
@pytest.mark.parametrize("impl", fused_backends("cpu"))
@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_fused_against_floor_interleaved(benchmark, case, impl):
    x, y = make_inputs(PAIRED_K, D)
    steps = {impl: step_function(impl, LOSS_CASES[case]), "floor": step_function("floor", LOSS_CASES[case])}
    best = {}
    benchmark.pedantic(lambda: best.update(interleaved_minima(steps, x, y, PAIRED_ROUNDS)), rounds=1, iterations=1)
    benchmark.group = f"{case} K={PAIRED_K} paired"
    benchmark.extra_info.update({"case": case, "k": PAIRED_K, "d": D, "impl": impl, "paired_rounds": PAIRED_ROUNDS,
                                 "fused_seconds": best[impl], "floor_seconds": best["floor"],
                                 "threads": torch.get_num_threads()})


# torch.compile of the DUQ reference (mse with relu: a few fused K×K passes besides the three
# products) is the one compiled step near 3× the fused op; TCL's and UML's take 5 and 48 s a step
# at K = 4096, 11× and over 100× the fused op, and would make a paired loop last minutes.
PAIRED_COMPILED_CASES = ["duq"]
PAIRED_COMPILED_ROUNDS = 10


@pytest.mark.slow
@pytest.mark.parametrize("impl", fused_backends("cpu"))
@pytest.mark.parametrize("case", PAIRED_COMPILED_CASES)
def test_fused_against_compiled_interleaved(benchmark, case, impl):
    x, y = make_inputs(PAIRED_K, D)
    steps = {impl: step_function(impl, LOSS_CASES[case]), "floor": step_function("floor", LOSS_CASES[case]),
             "compiled": step_function("compiled", LOSS_CASES[case])}
    best = {}
    benchmark.pedantic(lambda: best.update(interleaved_minima(steps, x, y, PAIRED_COMPILED_ROUNDS)), rounds=1,
                       iterations=1)
    benchmark.group = f"{case} K={PAIRED_K} paired with compiled"
    benchmark.extra_info.update({"case": case, "k": PAIRED_K, "d": D, "impl": impl,
                                 "paired_rounds": PAIRED_COMPILED_ROUNDS, "fused_seconds": best[impl],
                                 "floor_seconds": best["floor"], "compiled_seconds": best["compiled"],
                                 "threads": torch.get_num_threads()})
