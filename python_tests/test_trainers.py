"""The method models driven by a trainer that owns backward() and step() (docs/training.md):
`losses()` under CPU bfloat16 autocast, and a few steps of each method through HF accelerate with
gradient accumulation and bfloat16 mixed precision."""

from __future__ import annotations

import math

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.models import TCL
from evidential_ops.pipelines import get_recipe

_one_thread = pytest.fixture(autouse=True)(single_thread)

METHODS = ("tcl", "uml", "fume", "duq")
ACCUMULATION = 2


def _model_and_batches(method: str, *, windows: int):
    """A tiny model of `method` and windows × ACCUMULATION distinct training batches of 16 pairs."""
    bench = tiny_bench(noise_rate=0.4, visual="frames" if method == "duq" else "regions")
    torch.manual_seed(0)
    # UML: epoch 0 is inside its warm-up, where every pair counts as clean.
    model = get_recipe(method).with_overrides(embed_dim=8, epochs=8).build(bench)
    languages = ("en", "alt") if method == "uml" else ("en",)
    batches = [tiny_batch(bench, k=16, languages=languages, epoch=e) for e in range(windows * ACCUMULATION)]
    return model, batches


@pytest.mark.parametrize("method", METHODS)
def test_losses_under_bf16_autocast_encode_in_bf16_and_compute_the_terms_in_float32(method):
    """The encoders run under the autocast (the loss moves), the method terms in float32 (the
    loss is float32 and finite), and the gradient reaches every encoder."""
    model, batches = _model_and_batches(method, windows=1)
    model.train()
    torch.manual_seed(1)
    plain = model.losses(batches[0], 1)
    torch.manual_seed(1)  # the same DUQ ε draws
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = model.losses(batches[0], 1)
    assert mixed.keys() == plain.keys()
    assert mixed["loss"].dtype == torch.float32 and math.isfinite(float(mixed["loss"].detach()))
    assert float(mixed["loss"].detach()) != float(plain["loss"].detach())  # bf16 encoders: another value
    assert float(mixed["loss"].detach()) == pytest.approx(float(plain["loss"].detach()), rel=0.1)
    mixed["loss"].backward()
    encoders = [m for name, m in model.named_modules() if name.endswith(("image_encoder", "text_encoder",
                                                                          "visual_encoder", "english_encoder",
                                                                          "other_encoder"))]
    assert encoders
    for encoder in encoders:
        assert any(p.grad is not None and torch.isfinite(p.grad).all() and float(p.grad.abs().max()) > 0
                   for p in encoder.parameters()), type(encoder).__name__


@pytest.fixture(scope="module")
def accelerator():
    accelerate = pytest.importorskip(
        "accelerate", reason="accelerate is not installed (pip install accelerate; the test extra has it)")
    return accelerate.Accelerator(mixed_precision="bf16", gradient_accumulation_steps=ACCUMULATION, cpu=True)


def _window_updates(model, window: list, epoch: int) -> list[list]:
    """The optimiser updates of one accumulation window: a list per update of one loss callable
    per micro-batch. TCL's Algorithm 1 makes 1 + R updates per batch (`training_updates`): update
    r of every micro-batch accumulates into the window's r-th step. Other methods: one update."""
    if isinstance(model, TCL):
        return [list(updates) for updates in zip(*(model.training_updates(batch, epoch) for batch in window))]
    return [[lambda batch=batch: model.losses(batch, epoch) for batch in window]]


@pytest.mark.parametrize("method", METHODS)
def test_accelerate_trains_with_gradient_accumulation_and_bf16(method, accelerator):
    """accelerate's accumulate / backward / autocast and its wrapped optimiser: the parameters
    move only on every second micro-batch, every loss is finite, and the loss falls."""
    windows, epoch = 6, 1  # TCL: epoch 1 has its consistency rounds
    model, batches = _model_and_batches(method, windows=windows)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    seen = []  # (window, update, micro-batch, loss parts as floats)
    for w in range(windows):
        window = batches[w * ACCUMULATION:(w + 1) * ACCUMULATION]
        for u, micro_updates in enumerate(_window_updates(model, window, epoch)):
            for m, update in enumerate(micro_updates):
                before = [p.detach().clone() for p in model.parameters()]
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
                        parts = update()
                    accelerator.backward(parts["loss"])
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 2.0)
                    optimizer.step()
                    optimizer.zero_grad()
                moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
                assert moved == (m == ACCUMULATION - 1), (w, u, m)  # a step once per window
                seen.append((w, u, m, {k: float(v.detach()) for k, v in parts.items()}))
    assert all(math.isfinite(v) for *_, parts in seen for v in parts.values())
    # The first update of each window is the method's main loss (TCL: L_u; its rounds are L_c).
    mean_loss = lambda w: sum(p["loss"] for ww, u, _, p in seen if ww == w and u == 0) / ACCUMULATION
    first, last = mean_loss(0), mean_loss(windows - 1)
    updates_per_window = len({u for _, u, _, _ in seen})
    print(f"\naccelerate bf16, accumulation {ACCUMULATION}: {method} loss by window "
          f"{[round(mean_loss(w), 4) for w in range(windows)]} ({updates_per_window} optimiser step(s) per window)")
    if method == "tcl":
        rounds = [round(p["loss"], 5) for w, u, _, p in seen if u > 0 and w == windows - 1]
        print(f"  tcl consistency L_c of the last window's rounds: {rounds}")
    assert last < first
