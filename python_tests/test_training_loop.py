"""The CLI's training loop (pipelines.training): the per-step logging hook, the random states a
checkpoint keeps, and resuming a run through `run_training(resume=...)`."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from models_fixtures import single_thread, tiny_bench

from evidential_ops.pipelines import get_recipe
from evidential_ops.pipelines.analysis import jsonable
from evidential_ops.pipelines.runner import DataSource, ResumeError, resume_state, run_training
from evidential_ops.pipelines.training import (
    fit,
    load_checkpoint,
    make_loader,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)

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


def test_rng_state_survives_a_checkpoint_and_restores_every_stream(tmp_path):
    _, bench, _ = _fume()
    _, loader = make_loader(bench.train, batch_size=16, seed=5)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)

    def draws():
        return (torch.rand(3), np.random.rand(3), random.random(), list(loader.sampler))

    holder = torch.nn.Linear(1, 1)  # its initialisation draws from torch's RNG: made before the capture
    state = rng_state(loader)
    save_checkpoint(tmp_path / "c.pt", model=holder, optimizer=None, payload={"rng": state})
    first = draws()
    restore_rng_state(load_checkpoint(tmp_path / "c.pt")["rng"], loader)  # read back with weights_only
    second = draws()
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2] and first[3] == second[3]
    assert draws()[3] != second[3]  # the loader's shuffle does move on: the comparison above can fail
    with pytest.raises(ValueError, match="rng_state"):
        restore_rng_state({"torch": state["torch"]})


TINY_DATA = dict(n_train=40, n_val=4, n_test=10, n_ood=6)
TIMINGS = ("seconds", "total_seconds", "evaluation_seconds", "baseline_seconds")


def _run(method: str, out, *, epochs: int, resume=None, log_step=None, baseline: bool = False, **changes):
    recipe = get_recipe(method).with_overrides(epochs=epochs, batch_size=16, embed_dim=16, **changes)
    source = DataSource.synthetic(recipe, seed=0, **TINY_DATA)
    return run_training(method, recipe, source, out, quiet=True, plots=False, resume=resume, log_step=log_step,
                        baseline=baseline)


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS and k != "resumed_from"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"  # NaN != NaN; an undefined value in both runs is the same record
    return value


def _assert_same_run(resumed: dict, uninterrupted: dict, resumed_dir, uninterrupted_dir):
    """Bitwise: the resumed run repeats the uninterrupted run's operations on bitwise equal
    weights, optimiser moments, random streams and batches, in the same process and thread
    count, so any difference at all means a state was lost."""
    assert _without_timings(resumed) == _without_timings(uninterrupted)
    a, b = load_checkpoint(resumed_dir / "checkpoint.pt"), load_checkpoint(uninterrupted_dir / "checkpoint.pt")
    assert a["model_state"].keys() == b["model_state"].keys()
    assert all(torch.equal(a["model_state"][k], b["model_state"][k]) for k in a["model_state"])
    assert all(torch.equal(a["baseline_state"][k], b["baseline_state"][k]) for k in b.get("baseline_state", {}))
    moments = lambda state: [t for s in state["optimizer_state"]["state"].values() for t in s.values()]
    assert all(torch.equal(x, y) for x, y in zip(moments(a), moments(b), strict=True))


def test_resume_after_a_crash_gives_the_uninterrupted_run(tmp_path):
    """TcVSE draws its augmentation from the global torch RNG at every batch and runs the
    consistency rounds from epoch 1 on: a crash in epoch 2 of 3, then --resume."""
    full = _run("tcvse", tmp_path / "full", epochs=3)

    def crash(step: dict):
        if step["epoch"] == 2:
            raise KeyboardInterrupt("simulated crash")

    with pytest.raises(KeyboardInterrupt):
        _run("tcvse", tmp_path / "crashed", epochs=3, log_step=crash)
    assert load_checkpoint(tmp_path / "crashed" / "checkpoint.pt")["epoch"] == 2
    steps = []
    resumed = _run("tcvse", tmp_path / "crashed", epochs=3, resume=tmp_path / "crashed" / "checkpoint.pt",
                   log_step=steps.append)
    assert resumed["train"]["resumed_from"]["epoch"] == 2 and {s["epoch"] for s in steps} == {2}
    assert [h["epoch"] for h in resumed["train"]["history"]] == [0, 1, 2]
    _assert_same_run(resumed, full, tmp_path / "crashed", tmp_path / "full")


def test_resume_extends_a_finished_run_and_its_baseline(tmp_path):
    """A 1-epoch run (with the InfoNCE baseline, which draws from the same global RNG after the
    method) resumed to 3 epochs is the 3-epoch run, baseline included: the checkpoint keeps
    the random states of the end of the method's training, not those after the baseline."""
    full = _run("tcvse", tmp_path / "full", epochs=3, baseline=True)
    _run("tcvse", tmp_path / "short", epochs=1, baseline=True)
    resumed = _run("tcvse", tmp_path / "short", epochs=3, baseline=True, resume=tmp_path / "short" / "checkpoint.pt")
    _assert_same_run(resumed, full, tmp_path / "short", tmp_path / "full")


def test_resume_refuses_another_run(tmp_path):
    _run("fume", tmp_path / "fume", epochs=1)
    checkpoint = tmp_path / "fume" / "checkpoint.pt"
    recipe = get_recipe("fume").with_overrides(epochs=1, batch_size=16, embed_dim=16)
    source = DataSource.synthetic(recipe, seed=0, **TINY_DATA)
    assert resume_state(checkpoint, method="fume", recipe=recipe.with_overrides(epochs=4), source=source,
                        seed=0)["epoch"] == 1
    # The encoder chunks change memory and time, not the run: a resume may pick others.
    assert resume_state(checkpoint, method="fume", recipe=recipe.with_overrides(encoder_chunk=5), source=source,
                        seed=0)["epoch"] == 1
    with pytest.raises(ResumeError, match=r"recipe\.lr 0\.001 \(this run: 0\.5\)"):
        resume_state(checkpoint, method="fume", recipe=recipe.with_overrides(lr=0.5), source=source, seed=0)
    with pytest.raises(ResumeError, match=r"seed 0 \(this run: 1\)"):
        resume_state(checkpoint, method="fume", recipe=recipe, source=source, seed=1)
    with pytest.raises(ResumeError, match="method 'fume'"):
        resume_state(checkpoint, method="duq", recipe=recipe, source=source, seed=0)
    with pytest.raises(ResumeError, match="data"):
        resume_state(checkpoint, method="fume", recipe=recipe, seed=0,
                     source=DataSource.synthetic(recipe, seed=0, **{**TINY_DATA, "n_train": 48}))
    state = load_checkpoint(checkpoint)

    def rewritten(name: str, **changes):
        path = tmp_path / name
        torch.save({**state, **changes}, path)
        return path

    with pytest.raises(ResumeError, match="has trained 5 epochs, more than the 4 asked for"):
        resume_state(rewritten("ahead.pt", epoch=5), method="fume", recipe=recipe.with_overrides(epochs=4),
                     source=source, seed=0)
    # UML's σ(t) is defined by the total epochs: a longer UML run is another schedule.
    uml = replace(recipe, method="uml")
    uml_checkpoint = rewritten("uml.pt", method="uml", recipe=jsonable(asdict(uml)))
    assert resume_state(uml_checkpoint, method="uml", recipe=uml, source=source, seed=0)["epoch"] == 1
    with pytest.raises(ResumeError, match=r"recipe\.epochs 1 \(this run: 4\).*uml's schedule depends on the epochs"):
        resume_state(uml_checkpoint, method="uml", recipe=uml.with_overrides(epochs=4), source=source, seed=0)
    # Checkpoints written before they kept the random states, or by a data-parallel run, cannot
    # resume exactly.
    with pytest.raises(ResumeError, match="has no rng"):
        resume_state(rewritten("old.pt", rng=None), method="fume", recipe=recipe, source=source, seed=0)
    with pytest.raises(ResumeError, match="data-parallel"):
        resume_state(rewritten("ranks.pt", distributed={"world_size": 2}), method="fume", recipe=recipe,
                     source=source, seed=0)
