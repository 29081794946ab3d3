"""TcVSE's training augmentation (data.augment; TcVSE paper §2.1, Algorithm 1 x' = Augment(x))."""

from __future__ import annotations

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.data import augment_batch, augment_tokens, drop_regions
from evidential_ops.data.types import MASK_ID, PAD_ID
from evidential_ops.models import DualEncoder, TcVSE
from evidential_ops.models.encoders import MaxPoolEncoder
from evidential_ops.pipelines import get_recipe

_one_thread = pytest.fixture(autouse=True)(single_thread)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_dropped_regions_are_copies_of_kept_ones_and_max_pooling_drops_them():
    images = torch.randn(400, 10, 6, generator=_gen(1))
    before = images.clone()
    out = drop_regions(images, 0.2, generator=_gen(2))
    assert torch.equal(images, before)  # the input is not modified
    # Every output region is one of the sample's regions; unchanged slots are the kept ones.
    same = (out.unsqueeze(2) == images.unsqueeze(1)).all(dim=3)  # (B, R_out, R_in)
    assert bool(same.any(dim=2).all())
    kept = (out == images).all(dim=2)
    dropped_share = 1.0 - kept.double().mean().item()
    assert 0.17 < dropped_share < 0.23  # 4000 Bernoulli(0.2) draws: 3 standard deviations ≈ 0.019
    # Each replacement copies a kept region, so max pooling over out is max pooling over the kept set.
    encoder = MaxPoolEncoder(6, 4, hidden_dim=8, batch_norm=False)
    with torch.no_grad():
        pooled = encoder(out)
        for i in range(5):
            torch.testing.assert_close(pooled[i], encoder(images[i : i + 1, kept[i]])[0])


def test_every_sample_keeps_a_region_and_global_features_pass_through():
    images = torch.randn(300, 3, 4, generator=_gen(3))
    out = drop_regions(images, 0.95, generator=_gen(4))
    kept = (out == images).all(dim=2)
    assert bool(kept.any(dim=1).all())
    flat = torch.randn(5, 4)
    assert torch.equal(drop_regions(flat, 0.5), flat)
    assert torch.equal(drop_regions(images, 0.0), images)


def test_word_operations_have_the_vse_infinity_shares():
    # Captions of distinct ids 3..14 in a large vocabulary: every output token is identifiable.
    b, width, vocab = 3000, 12, 10_000
    tokens = torch.arange(3, 3 + width).repeat(b, 1)
    lengths = torch.full((b,), width, dtype=torch.int64)
    out, new_lengths = augment_tokens(tokens, lengths, vocab_size=vocab, rate=0.2, generator=_gen(5))
    real = torch.arange(out.shape[1]).unsqueeze(0) < new_lengths.unsqueeze(1)
    assert bool((out[~real] == PAD_ID).all()) and bool((new_lengths >= 1).all())
    total = b * width
    masked = int((out[real] == MASK_ID).sum())
    swapped = int((out[real] >= 3 + width).sum())
    discarded = total - int(new_lengths.sum())
    # Expected shares of all tokens: 0.2·0.5 masked, 0.2·0.1 swapped, 0.2·0.4 discarded.
    assert masked / total == pytest.approx(0.10, abs=0.006)
    assert swapped / total == pytest.approx(0.02, abs=0.003)
    assert discarded / total == pytest.approx(0.08, abs=0.006)
    # The untouched words keep their order (a compaction, never a shuffle).
    for row, n in zip(out[:50], new_lengths[:50]):
        original = [t for t in row[:n].tolist() if 3 <= t < 3 + width]
        assert original == sorted(original)


def test_swapped_words_are_other_ordinary_words_and_captions_keep_a_token():
    tokens = torch.tensor([[3, 4], [5, PAD_ID]])
    lengths = torch.tensor([2, 1])
    for seed in range(200):
        out, new_lengths = augment_tokens(tokens, lengths, vocab_size=6, rate=0.99, generator=_gen(seed))
        assert bool((new_lengths >= 1).all())
        first = out[:, 0]
        assert bool(((first == MASK_ID) | (first >= 3)).all()) and bool((out < 6).all())
    same, same_lengths = augment_tokens(tokens, lengths, vocab_size=6, rate=0.0)
    assert torch.equal(same, tokens) and torch.equal(same_lengths, lengths)


def test_augment_batch_and_its_validation():
    bench = tiny_bench()
    batch = tiny_batch(bench)
    out = augment_batch(batch, vocab_size=len(bench.vocab), generator=_gen(6))
    assert out["images"].shape == batch["images"].shape and out["captions"].shape[0] == batch["captions"].shape[0]
    assert torch.equal(out["labels"], batch["labels"]) and not torch.equal(out["captions"], batch["captions"])
    with pytest.raises(ValueError, match="region_drop"):
        drop_regions(batch["images"], 1.0)
    with pytest.raises(ValueError, match="word_rate"):
        augment_tokens(batch["captions"], batch["lengths"], vocab_size=20, rate=-0.1)
    with pytest.raises(ValueError, match="vocab_size"):
        augment_tokens(batch["captions"], batch["lengths"], vocab_size=3)
    with pytest.raises(ValueError, match="captions"):
        augment_batch({"images": batch["images"]}, vocab_size=20)


def test_tcvse_trains_on_augmented_batches_by_default(monkeypatch):
    """Every forward of a training step (step 1 and each consistency round) encodes the same
    x' = Augment(x), drawn once per step; without augment, the batch itself."""
    bench = tiny_bench()
    torch.manual_seed(0)
    model = TcVSE.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, t_max=2)
    assert model.augment and model.vocab_size == len(bench.vocab)
    assert get_recipe("tcvse").build(bench).augment  # on in the recipe too
    seen = []
    encode = DualEncoder.forward
    monkeypatch.setattr(DualEncoder, "forward", lambda self, batch, **kw: seen.append(batch) or encode(self, batch, **kw))
    batch = tiny_batch(bench)
    model.training_step(batch, 1, torch.optim.SGD(model.parameters(), lr=0.0))
    assert len(seen) == 2 * (1 + 2)  # both query models, step 1 and T_max = 2 rounds
    assert not torch.equal(seen[0]["captions"], batch["captions"]) or not torch.equal(seen[0]["images"],
                                                                                     batch["images"])
    for other in seen[1:]:
        assert all(torch.equal(other[key], seen[0][key]) for key in ("images", "captions", "lengths"))
    first, seen[:] = seen[0], []
    model.training_step(batch, 1, torch.optim.SGD(model.parameters(), lr=0.0))
    assert not all(torch.equal(seen[0][key], first[key]) for key in ("images", "captions"))  # a new draw
    plain = TcVSE.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, augment=False)
    seen.clear()
    plain.training_step(batch, 1, torch.optim.SGD(plain.parameters(), lr=0.0))
    assert seen and all(torch.equal(b[key], batch[key]) for b in seen for key in ("images", "captions", "lengths"))
    with pytest.raises(ValueError, match="region_drop"):
        TcVSE.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, region_drop=1.5)
