"""The README's API section, followed literally: its first code block is a training loop on raw
features and must run as written (a new user's first contact with the API)."""

from __future__ import annotations

import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def api_training_block() -> str:
    """The first ```python block under the README's '## API' heading."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## API\n"):]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "the README's API section has no python block"
    return match.group(1)


def test_readme_api_loop_trains_on_raw_features():
    code = api_training_block()
    assert "normalize=True" in code and "torch.randn" in code  # raw features, as a CLIP tower gives them
    namespace: dict = {}
    torch.manual_seed(0)
    exec(compile(code, str(README), "exec"), namespace)
    loss = namespace["loss"]
    assert torch.isfinite(loss)
    for tower in (namespace["image_tower"], namespace["text_tower"]):
        assert all(torch.isfinite(p.grad).all() for p in tower.parameters())
