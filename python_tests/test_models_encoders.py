"""Default encoders (models.encoders) and DualEncoder."""

from __future__ import annotations

import pytest
import torch
from conftest import reordered_sum_bound
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


def _chunk_case_encoders(kind: str, vocab: int):
    if kind == "tcl":  # attention pooling over regions + Bi-GRU, BatchNorm on both outputs
        return AttentionPoolEncoder(16, 8, hidden_dim=8), GRUTextEncoder(vocab, 8, word_dim=6)
    if kind == "vse":  # max pooling + max-pooled GRU, no BatchNorm
        return MaxPoolEncoder(16, 8, batch_norm=False), GRUTextEncoder(vocab, 8, word_dim=6, pooling="max")
    return MLPEncoder(16, 8, dropout=0.3), BagOfWordsEncoder(vocab, 8, dropout=0.3)  # dropout: RNG replayed


@pytest.mark.parametrize("kind", ["tcl", "vse", "mlp_dropout"])
def test_chunked_encoding_matches_the_whole_batch(kind):
    """DualEncoder(chunk_size=c): checkpointed chunks of `features`, the output norm once over the
    batch. Checked against the same computation without checkpointing, in float64:
    - embeddings and BatchNorm's running statistics bitwise (the same operations on the same
      chunks: the output norm sees the whole batch, as an unchunked forward does);
    - each parameter's gradient: the recomputation gives each chunk's contribution g_c with the
      same operations, and autograd adds the n contributions in an order of its own, so the two
      are within the reordered-sum bound 2(n − 1)·u·Σ_c |g_c|.
    `features` treats samples independently, so the chunked batch is mathematically the whole
    batch; with dropout, chunks draw their masks chunk by chunk (a different sample of the same
    distribution), and checkpointing replays each chunk's own masks in the recomputation."""
    bench = tiny_bench()
    batch = tiny_batch(bench, k=23)
    chunk, tau = 5, 0.1
    inputs = {"image": (batch["images"].double(),), "text": (batch["captions"], batch["lengths"])}

    def build():
        torch.manual_seed(0)
        return DualEncoder(*_chunk_case_encoders(kind, len(bench.vocab))).double().train()

    # Reference: chunks without checkpointing, each chunk's parameter gradient kept apart.
    reference = build()
    torch.manual_seed(1)
    features = {name: [getattr(reference, f"{name}_encoder").features(*(t[i:i + chunk] for t in ins))
                       for i in range(0, 23, chunk)] for name, ins in inputs.items()}
    x = l2_normalize(reference.image_encoder.norm(torch.cat(features["image"])))
    y = l2_normalize(reference.text_encoder.norm(torch.cat(features["text"])))
    loss = (x @ y.T / tau).logsumexp(dim=1).sum()
    pieces = [f for name in inputs for f in features[name]]
    upstream = torch.autograd.grad(loss, pieces, retain_graph=True)
    per_chunk = {}
    for name in inputs:
        encoder = getattr(reference, f"{name}_encoder")
        params = [p for pname, p in encoder.named_parameters() if not pname.startswith("norm.")]
        for f, g in zip(features[name], upstream[:len(features[name])] if name == "image" else upstream[len(features["image"]):]):
            grads = torch.autograd.grad(f, params, g, retain_graph=True, allow_unused=True)
            for p, gp in zip(params, grads):
                per_chunk.setdefault(p, []).append(torch.zeros_like(p) if gp is None else gp)

    chunked = build()
    chunked.chunk_size = chunk
    torch.manual_seed(1)
    x1 = chunked.encode_images(*inputs["image"])
    y1 = chunked.encode_texts(*inputs["text"])
    torch.testing.assert_close(x1, x, rtol=0, atol=0)
    torch.testing.assert_close(y1, y, rtol=0, atol=0)
    for b0, b1 in zip(reference.buffers(), chunked.buffers()):
        torch.testing.assert_close(b1, b0, rtol=0, atol=0)
    (x1 @ y1.T / tau).logsumexp(dim=1).sum().backward()
    ref_params = dict(reference.named_parameters())
    for pname, p1 in chunked.named_parameters():
        p0 = ref_params[pname]
        if p0 not in per_chunk:
            continue  # the output norm's own weights: one unchunked computation in both
        parts = torch.stack(per_chunk[p0])
        bound = reordered_sum_bound(parts.shape[0], torch.float64, parts.abs().sum(dim=0))
        assert ((p1.grad - parts.sum(dim=0)).abs() <= bound).all(), pname


def test_chunk_size_checks():
    bench = tiny_bench()
    model = DualEncoder(MLPEncoder(16, 8), BagOfWordsEncoder(len(bench.vocab), 8))
    with pytest.raises(ValueError, match="chunk_size"):
        model.chunk_size = 0
    with pytest.raises(TypeError, match="chunk_size"):
        model.chunk_size = 2.5
    opaque = DualEncoder(torch.nn.Linear(16, 8), model.text_encoder)
    with pytest.raises(ValueError, match="chunk_size needs encoders"):
        opaque.chunk_size = 4
    from evidential_ops.models import TCL, set_chunk_size
    tcl = TCL.default(16, len(bench.vocab), embed_dim=8)
    assert set_chunk_size(tcl, 7) == 2 and tcl.model_a.chunk_size == 7 and tcl.model_b.chunk_size == 7
    with pytest.raises(ValueError, match="holds no encoders"):
        set_chunk_size(torch.nn.Linear(2, 2), 4)
    # Without gradients (evaluation) nothing is chunked: no activations are kept anyway.
    with torch.no_grad():
        model.chunk_size = 3
        x, _ = model(tiny_batch(bench, k=8))
    assert x.shape == (8, 8)


def test_uml_encodes_in_chunks(monkeypatch):
    """UML's three encoders (no DualEncoder) go through the same chunked path as DualEncoder's,
    whose results test_chunked_encoding_matches_the_whole_batch checks: here, that every encoder
    runs its features chunk by chunk while training, and whole when evaluating."""
    from evidential_ops.models import UML, set_chunk_size
    bench = tiny_bench(second_language=True)
    torch.manual_seed(0)
    model = UML.default(16, len(bench.vocab), len(bench.vocab_alt), total_epochs=2, embed_dim=8).train()
    batch = tiny_batch(bench, k=12, languages=("en", "alt"))
    sizes = []
    for name in UML._CHUNKED_ENCODERS:
        encoder = getattr(model, name)
        monkeypatch.setattr(encoder, "features", lambda *t, f=encoder.features: sizes.append(t[0].shape[0]) or f(*t))
    assert set_chunk_size(model, 5) == 1 and model.chunk_size == 5
    v, s, t = model.embed(batch)
    assert sizes == [5, 5, 2] * 3 and v.shape == s.shape == t.shape == (12, 8)
    sizes.clear()
    with torch.no_grad():
        model.embed(batch)
    assert sizes == [12] * 3
