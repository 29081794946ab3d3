"""Default encoders (models.encoders) and DualEncoder."""

from __future__ import annotations

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.data.types import PAD_ID
from evidential_ops.models import DualEncoder, embed_split
from evidential_ops.models.encoders import (
    AttentionPoolEncoder,
    BagOfWordsEncoder,
    GRUTextEncoder,
    MaxPoolEncoder,
    MLPEncoder,
    l2_normalize,
)


_one_thread = pytest.fixture(autouse=True)(single_thread)


@pytest.mark.parametrize("cls", [MLPEncoder, MaxPoolEncoder, AttentionPoolEncoder])
def test_visual_encoders_shapes_and_order(cls):
    torch.manual_seed(0)
    enc = cls(6, 8).eval()
    images = torch.randn(3, 5, 6)
    out = enc(images)
    assert out.shape == (3, 8) and torch.isfinite(out).all()
    # Pooling is order-free over regions.
    torch.testing.assert_close(enc(images.flip(1)), out, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(enc(torch.zeros(2, 4, 6))).all()  # a fully masked sample stays finite
    with pytest.raises(ValueError, match="feature size"):
        enc(torch.randn(3, 5, 7))


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_gru_ignores_padding(pooling, bidirectional):
    torch.manual_seed(0)
    enc = GRUTextEncoder(20, 8, word_dim=4, pooling=pooling, bidirectional=bidirectional).eval()
    tokens = torch.tensor([[3, 4, 5, PAD_ID], [6, 7, PAD_ID, PAD_ID]])
    lengths = torch.tensor([3, 2])
    out = enc(tokens, lengths)
    wider = torch.cat([tokens, torch.full((2, 3), PAD_ID)], dim=1)
    torch.testing.assert_close(enc(wider, lengths), out, rtol=1e-5, atol=1e-6)
    alone = enc(tokens[1:, :2], lengths[1:])
    torch.testing.assert_close(alone, out[1:], rtol=1e-5, atol=1e-6)


def test_bag_of_words_and_token_checks():
    enc = BagOfWordsEncoder(10, 4, hidden_dim=8).eval()
    tokens, lengths = torch.tensor([[3, 4, PAD_ID]]), torch.tensor([2])
    assert enc(tokens, lengths).shape == (1, 4)
    with pytest.raises(ValueError, match="vocab_size"):
        enc(torch.tensor([[3, 40]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="lengths"):
        enc(tokens, torch.tensor([4]))
    with pytest.raises(TypeError, match="tokens"):
        enc(tokens.float(), lengths)
    with pytest.raises(ValueError, match="pooling"):
        GRUTextEncoder(10, 4, pooling="sum")


def test_dual_encoder_normalises_and_embeds_a_split():
    bench = tiny_bench()
    torch.manual_seed(0)
    model = DualEncoder(MLPEncoder(16, 8), BagOfWordsEncoder(len(bench.vocab), 8)).eval()
    x, y = model(tiny_batch(bench, k=4))
    torch.testing.assert_close(x.norm(dim=1), torch.ones(4))
    xs, ys = embed_split(model.encode_images, model.encode_texts, bench.test, batch_size=5)
    assert xs.shape == (bench.test.n_images, 8) and ys.shape == (bench.test.n_captions, 8)
    with pytest.raises(TypeError, match="image_encoder"):
        DualEncoder(None, model.text_encoder)
    with pytest.raises(ValueError, match="language"):
        model(tiny_batch(bench, k=4), language="fr")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_embeddings_are_normalised_in_float32(dtype):
    """An encoder under autocast hands over bfloat16 or float16 rows: they come out float32 and
    unit to float32's precision, not to the 2^-8 of a bfloat16 norm."""
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    unit = l2_normalize(x)
    assert unit.dtype == torch.float32
    torch.testing.assert_close(unit.double().norm(dim=1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(unit, torch.nn.functional.normalize(x.float(), dim=1), rtol=0, atol=0)
    same = torch.randn(3, 4)
    assert l2_normalize(same).dtype == torch.float32 and l2_normalize(same.double()).dtype == torch.float64
