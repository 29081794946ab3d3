"""The torch.compile baseline stays compiled for every (loss case, K) of a benchmark run.

evidential_ops.benchmark compiles one function, plain_pytorch_loss, for each case and shape; past
Dynamo's recompile_limit the function silently runs eagerly, and a "compiled" column then times the
eager reference (it did for DUQ at K = 4096, the ninth compile of a `make bench` run)."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from evidential_ops.benchmark import LOSS_CASES, make_inputs, recompile_limit_name, step_function


def test_compiled_step_compiles_past_the_recompile_limit():
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(**{recompile_limit_name(): 1}):  # a second shape would be past the limit
        step = step_function("compiled", LOSS_CASES["duq"])
        for k in (8, 12):
            x, y = make_inputs(k, 16)
            step(x, y)
    limited = [reason for reason in counters["unimplemented"] if "recompile" in reason.lower()]
    assert not limited, limited
    assert counters["frames"]["ok"] == 2, dict(counters["frames"])
    torch._dynamo.reset()
