"""The CLI's training loop (pipelines.training): the per-step logging hook."""

from __future__ import annotations

import math

import pytest
import torch
from models_fixtures import single_thread, tiny_bench

from evidential_ops.pipelines import get_recipe
from evidential_ops.pipelines.training import fit, make_loader

_one_thread = pytest.fixture(autouse=True)(single_thread)


def _fume(lr: float = 1e-3):
    torch.manual_seed(0)
    bench = tiny_bench()
    model = get_recipe("fume").build(bench)
    return model, bench, torch.optim.Adam(model.parameters(), lr=lr)


def test_log_step_receives_every_step_with_its_loss_and_learning_rate():
    model, bench, optimizer = _fume(lr=2e-3)
    dataset, loader = make_loader(bench.train, batch_size=16, seed=0)
    steps = []
    history = fit(model, dataset, loader, optimizer, epochs=2, log_step=steps.append)
    per_epoch = len(loader)
    assert per_epoch >= 2
    assert [s["step"] for s in steps] == list(range(1, 2 * per_epoch + 1))
    assert [s["epoch"] for s in steps] == [0] * per_epoch + [1] * per_epoch
    assert all(s["lr"] == 2e-3 and math.isfinite(s["loss"]) for s in steps)
    for record in history:  # the epoch's line is the mean of the steps the hook saw
        losses = [s["loss"] for s in steps if s["epoch"] == record["epoch"]]
        assert record["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)
    # A resumed loop goes on counting where the first one stopped.
    later = []
    fit(model, dataset, loader, optimizer, epochs=3, start_epoch=2, log_step=later.append)
    assert [s["step"] for s in later] == list(range(2 * per_epoch + 1, 3 * per_epoch + 1))
    with pytest.raises(TypeError, match="log_step"):
        fit(model, dataset, loader, optimizer, epochs=1, log_step="wandb")


def test_log_step_sees_the_parts_of_the_loss():
    torch.manual_seed(0)
    bench = tiny_bench()
    model = get_recipe("tcl").with_overrides(embed_dim=8).build(bench)
    dataset, loader = make_loader(bench.train, batch_size=16, seed=0)
    steps = []
    fit(model, dataset, loader, torch.optim.Adam(model.parameters(), lr=1e-3), epochs=2, log_step=steps.append)
    assert {"loss", "loss_u", "loss_risk", "loss_kl", "loss_c", "kl_weight", "lr"} <= set(steps[-1])
    assert math.isnan(steps[0]["loss_c"]) and math.isfinite(steps[-1]["loss_c"])  # step 2 from epoch 1 on
