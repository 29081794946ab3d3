"""docs/training.md, followed literally: its first Python block sets up data and a model, and
every later block must run after it as written (each in a fresh namespace) and train."""

from __future__ import annotations

import math
import pathlib
import re

import pytest
import torch
from models_fixtures import single_thread

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "training.md"
# Blocks that show another trainer run only where it is installed (accelerate is in the test
# extra; Lightning is no dependency of the package).
OPTIONAL = {"accelerate": "accelerate", "pytorch_lightning": "pytorch-lightning", "lightning": "lightning"}

_one_thread = pytest.fixture(autouse=True)(single_thread)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_page_has_its_blocks():
    blocks = python_blocks()
    assert len(blocks) == 7
    assert "make_loader" in blocks[0] and "model = " in blocks[0]


def _run(index: int) -> tuple[dict, list[torch.Tensor]]:
    blocks = python_blocks()
    for module in re.findall(r"^\s*(?:from|import) (\w+)", blocks[index], flags=re.M):
        if module in OPTIONAL:
            pytest.importorskip(module, reason=f"docs/training.md block {index} needs {OPTIONAL[module]}, "
                                               "which is not installed")
    namespace: dict = {}
    exec(compile(blocks[0], f"{DOC}:block0", "exec"), namespace)
    initial = [p.detach().clone() for p in namespace["model"].parameters()]
    exec(compile(blocks[index], f"{DOC}:block{index}", "exec"), namespace)
    return namespace, initial


@pytest.mark.parametrize("index", range(1, 7))
def test_block_runs_and_trains(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the resume block writes runs/fume
    namespace, initial = _run(index)
    code = python_blocks()[index]
    if "model" in code:  # every block that trains the set-up model moves its weights
        assert any(not torch.equal(a, b.detach()) for a, b in zip(initial, namespace["model"].parameters()))
    if "parts" in namespace:
        assert all(math.isfinite(float(v.detach())) for v in namespace["parts"].values())
    if "records" in namespace:
        steps = [record["step"] for record in namespace["records"]]
        assert steps == list(range(steps[0], steps[0] + len(steps))) and steps
        assert {"epoch", "loss", "lr"} <= set(namespace["records"][-1])
    if "resumed" in namespace:
        assert namespace["resumed"]["train"]["resumed_from"]["epoch"] == 1
        assert [h["epoch"] for h in namespace["resumed"]["train"]["history"]] == [0, 1]
    if "trainer" in namespace:
        assert namespace["trainer"].global_step > 0
    printed = capsys.readouterr().out
    for comment in re.findall(r"print\(.*\)  # (\{'step': \d+)", code):  # a printed result the page quotes
        assert comment in printed
