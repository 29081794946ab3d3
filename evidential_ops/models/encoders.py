"""Small default encoders for the method pipelines (docs/api.md "Pipelines": `evidential_ops.models`).

The papers put their losses on top of large backbones (Faster R-CNN regions + Bi-GRU or BERT for
TCL/TcVSE, CLIP + mBERT for UML, VGG + word2vec subnets for FUME, CLIP frames for DUQ). These are
the small, CPU-trainable stand-ins the built-in data is sized for; every method model accepts any
`nn.Module` with the same call convention instead:

- visual encoders: `encoder(images) -> (B, D)` with images (B, F) global features or (B, R, F)
  region / frame features;
- text encoders: `encoder(tokens, lengths) -> (B, D)` with tokens (B, L) int64 padded with
  `data.PAD_ID` and lengths (B,) int64 (the true lengths, >= 1).

Outputs are not normalised here: the method models L2-normalise them (cosine similarity, as in
all five papers), so a user encoder need not.

Each encoder is `norm(features(...))`: `features` treats every sample on its own, and `norm`
(BatchNorm1d over the embedding, or identity) is the one step that mixes the batch. That split
is what lets `DualEncoder(chunk_size=...)` run `features` in chunks under activation
checkpointing, exactly, at contrastive batch sizes; a user encoder that has the same two members
gets it too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .. import checks
from ..data.types import PAD_ID

__all__ = [
    "AttentionPoolEncoder",
    "BagOfWordsEncoder",
    "GRUTextEncoder",
    "MLPEncoder",
    "MaxPoolEncoder",
]

TEXT_POOLINGS = ("mean", "max", "last")


def _dim(value, name: str) -> int:
    return checks.integer(value, name, minimum=1)


def _mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float) -> nn.Sequential:
    """num_layers Linear layers with ReLU (and dropout) between them."""
    dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
    layers: list[nn.Module] = []
    for k in range(num_layers):
        layers.append(nn.Linear(dims[k], dims[k + 1]))
        if k < num_layers - 1:
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _output_norm(out_dim: int, enabled: bool) -> nn.Module:
    """BatchNorm1d over the embedding, or identity.

    Why: a freshly initialised ReLU network maps every input to a common direction plus a small
    variation, so all cosines of a row are nearly equal up to a shared "hub" candidate, and at
    TCL's τ = 0.05 the evidence of that hub dominates every row: the image-query (row) loss then
    only learns to push the hub away and can stall with all evidence near 0. Centring each
    coordinate over the batch removes the shared direction (VSE∞ puts BatchNorm in its MLPs too).
    """
    return nn.BatchNorm1d(out_dim) if checks.flag(enabled, "batch_norm") else nn.Identity()


def _check_visual(images, in_dim: int, name: str = "images", regions: bool = False) -> Tensor:
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(images).__name__}")
    if regions and images.dim() != 3:
        raise ValueError(f"{name} must be (B, R, F) region/frame features, got shape {tuple(images.shape)}")
    if images.dim() not in (2, 3):
        raise ValueError(f"{name} must be (B, F) or (B, R, F), got shape {tuple(images.shape)}")
    if images.shape[-1] != in_dim:
        raise ValueError(f"{name} must have feature size {in_dim} (last dim), got {tuple(images.shape)}")
    if images.shape[0] == 0 or (images.dim() == 3 and images.shape[1] == 0):
        raise ValueError(f"{name} has an empty dimension: shape {tuple(images.shape)}")
    return images


def _check_tokens(tokens, lengths) -> tuple[Tensor, Tensor]:
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.int64 or tokens.dim() != 2:
        raise TypeError("tokens must be an int64 tensor of shape (B, L)")
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.shape != (tokens.shape[0],):
        raise TypeError(f"lengths must be an int64 tensor of shape ({tokens.shape[0]},)")
    if tokens.shape[0] == 0:
        raise ValueError("tokens must hold at least one caption")
    if int(lengths.min()) < 1 or int(lengths.max()) > tokens.shape[1]:
        raise ValueError(f"lengths must lie in [1, {tokens.shape[1]}] (tokens has L = {tokens.shape[1]})")
    return tokens, lengths


def _valid_mask(lengths: Tensor, width: int) -> Tensor:
    """(B, width) bool: position t of row b is a real token (t < lengths[b])."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


class MLPEncoder(nn.Module):
    """MLP over precomputed global features (FUME's modality subnets, FUME paper §4.1.2).

    Input (B, F), or (B, R, F) region/frame features, which are mean-pooled over R first (a
    global descriptor). Output (B, out_dim).

    Args:
        in_dim: F. out_dim: D. hidden_dim: width of the hidden layers.
        num_layers: number of Linear layers (>= 1). dropout: between hidden layers.
    """

    def __init__(self, in_dim: int, out_dim: int, *, hidden_dim: int = 256, num_layers: int = 2,
                 dropout: float = 0.0, batch_norm: bool = True):
        super().__init__()
        self.in_dim = _dim(in_dim, "in_dim")
        self.out_dim = _dim(out_dim, "out_dim")
        num_layers = _dim(num_layers, "num_layers")
        dropout = checks.real_number(dropout, "dropout", minimum=0.0, maximum=0.99)
        self.net = _mlp(self.in_dim, _dim(hidden_dim, "hidden_dim"), self.out_dim, num_layers, dropout)
        self.norm = _output_norm(self.out_dim, batch_norm)

    def features(self, images: Tensor) -> Tensor:
        """(B, F) or (B, R, F) -> (B, D) before the output norm: per sample (module docstring)."""
        images = _check_visual(images, self.in_dim)
        if images.dim() == 3:
            images = images.mean(dim=1)
        return self.net(images)

    def forward(self, images: Tensor) -> Tensor:
        return self.norm(self.features(images))


class MaxPoolEncoder(nn.Module):
    """Visual semantic embedding with max pooling over local features (TcVSE paper §2.1).

    Every region (or frame) goes through the same MLP into the joint space, then the
    coordinate-wise maximum over regions is the embedding: v = MaxPooling({x_i}). Input
    (B, R, F), output (B, out_dim).

    Args:
        in_dim: F. out_dim: D. hidden_dim, num_layers: the per-region MLP.
    """

    def __init__(self, in_dim: int, out_dim: int, *, hidden_dim: int = 256, num_layers: int = 2,
                 batch_norm: bool = True):
        super().__init__()
        self.in_dim = _dim(in_dim, "in_dim")
        self.out_dim = _dim(out_dim, "out_dim")
        self.net = _mlp(self.in_dim, _dim(hidden_dim, "hidden_dim"), self.out_dim,
                        _dim(num_layers, "num_layers"), 0.0)
        self.norm = _output_norm(self.out_dim, batch_norm)

    def features(self, images: Tensor) -> Tensor:
        """(B, R, F) -> (B, D) before the output norm: per sample (module docstring)."""
        images = _check_visual(images, self.in_dim, regions=True)
        return self.net(images).amax(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        return self.norm(self.features(images))


class AttentionPoolEncoder(nn.Module):
    """Attention pooling over region or frame features, fused with a global mean.

    DUQ's local feature aggregation (DUQ paper §3.3): multi-head attention of `num_queries`
    learned queries over the projected local features (fine-grained details), concatenated with
    their mean (global context), then a linear fusion. Input (B, R, F), output (B, out_dim).

    Args:
        in_dim: F. out_dim: D (divisible by num_heads). num_heads: attention heads.
        num_queries: learned pooling queries (their outputs are averaged).
        hidden_dim: width of the per-region MLP.
    """

    def __init__(self, in_dim: int, out_dim: int, *, hidden_dim: int = 256, num_heads: int = 4,
                 num_queries: int = 1, batch_norm: bool = True):
        super().__init__()
        self.in_dim = _dim(in_dim, "in_dim")
        self.out_dim = _dim(out_dim, "out_dim")
        num_heads = _dim(num_heads, "num_heads")
        if self.out_dim % num_heads:
            raise ValueError(f"out_dim ({out_dim}) must be divisible by num_heads ({num_heads})")
        num_queries = _dim(num_queries, "num_queries")
        self.local = _mlp(self.in_dim, _dim(hidden_dim, "hidden_dim"), self.out_dim, 2, 0.0)
        self.queries = nn.Parameter(torch.randn(num_queries, self.out_dim) / self.out_dim**0.5)
        self.attention = nn.MultiheadAttention(self.out_dim, num_heads, batch_first=True)
        self.fuse = nn.Linear(2 * self.out_dim, self.out_dim)
        self.norm = _output_norm(self.out_dim, batch_norm)

    def features(self, images: Tensor) -> Tensor:
        """(B, R, F) -> (B, D) before the output norm: per sample (module docstring)."""
        images = _check_visual(images, self.in_dim, regions=True)
        local = self.local(images)  # (B, R, D)
        queries = self.queries.unsqueeze(0).expand(local.shape[0], -1, -1)
        pooled, _ = self.attention(queries, local, local, need_weights=False)
        return self.fuse(torch.cat([pooled.mean(dim=1), local.mean(dim=1)], dim=1))

    def forward(self, images: Tensor) -> Tensor:
        return self.norm(self.features(images))


class GRUTextEncoder(nn.Module):
    """(Bi-)GRU over token ids (the Bi-GRU text backbone of TCL/TcVSE, VSE∞ style).

    Word embeddings → GRU over the true lengths (packed) → the two directions' outputs averaged
    (VSE∞) → pooling over the valid positions: "mean", "max" (TcVSE §2.1 max pooling of the token
    features) or "last" (final hidden states). A linear layer maps hidden_dim to out_dim when they
    differ. Input tokens (B, L) int64 padded with `pad_id`, lengths (B,) int64; output (B, out_dim).

    Args:
        vocab_size: number of token ids. out_dim: D. word_dim: embedding size.
        hidden_dim: GRU width (default out_dim). bidirectional: Bi-GRU. pooling: see above.
    """

    def __init__(self, vocab_size: int, out_dim: int, *, word_dim: int = 128, hidden_dim: int | None = None,
                 bidirectional: bool = True, pooling: str = "mean", pad_id: int = PAD_ID,
                 batch_norm: bool = True):
        super().__init__()
        self.vocab_size = _dim(vocab_size, "vocab_size")
        self.out_dim = _dim(out_dim, "out_dim")
        hidden_dim = self.out_dim if hidden_dim is None else _dim(hidden_dim, "hidden_dim")
        self.bidirectional = checks.flag(bidirectional, "bidirectional")
        if pooling not in TEXT_POOLINGS:
            raise ValueError(f"pooling must be one of {TEXT_POOLINGS}, got {pooling!r}")
        self.pooling = pooling
        self.embed = nn.Embedding(self.vocab_size, _dim(word_dim, "word_dim"), padding_idx=pad_id)
        self.gru = nn.GRU(word_dim, hidden_dim, batch_first=True, bidirectional=self.bidirectional)
        self.project = nn.Linear(hidden_dim, self.out_dim) if hidden_dim != self.out_dim else nn.Identity()
        self.norm = _output_norm(self.out_dim, batch_norm)

    def features(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, L), (B,) -> (B, D) before the output norm: per sample (module docstring)."""
        tokens, lengths = _check_tokens(tokens, lengths)
        if int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"tokens holds ids >= vocab_size ({self.vocab_size})")
        packed = pack_padded_sequence(self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, last = self.gru(packed)
        if self.pooling == "last":
            # last: (directions, B, H); averaging the directions as for the per-token outputs.
            return self.project(last.mean(dim=0))
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        if self.bidirectional:
            out = out.view(out.shape[0], out.shape[1], 2, -1).mean(dim=2)
        mask = _valid_mask(lengths.to(out.device), out.shape[1]).unsqueeze(2)
        if self.pooling == "max":
            pooled = out.masked_fill(~mask, float("-inf")).amax(dim=1)
        else:
            pooled = (out * mask).sum(dim=1) / lengths.to(out.device, out.dtype).unsqueeze(1)
        return self.project(pooled)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        return self.norm(self.features(tokens, lengths))


class BagOfWordsEncoder(nn.Module):
    """Mean of word embeddings followed by an MLP: a precomputed-text-feature stand-in
    (FUME's word2vec text features feed fully connected subnets, FUME paper §4.1.2).

    Padding positions are excluded from the mean. Input tokens (B, L), lengths (B,); output
    (B, out_dim).

    Args:
        vocab_size: number of token ids. out_dim: D. word_dim: embedding size.
        hidden_dim, num_layers, dropout: the MLP.
    """

    def __init__(self, vocab_size: int, out_dim: int, *, word_dim: int = 128, hidden_dim: int = 256,
                 num_layers: int = 2, dropout: float = 0.0, pad_id: int = PAD_ID, batch_norm: bool = True):
        super().__init__()
        self.vocab_size = _dim(vocab_size, "vocab_size")
        self.out_dim = _dim(out_dim, "out_dim")
        dropout = checks.real_number(dropout, "dropout", minimum=0.0, maximum=0.99)
        self.embed = nn.Embedding(self.vocab_size, _dim(word_dim, "word_dim"), padding_idx=pad_id)
        self.net = _mlp(word_dim, _dim(hidden_dim, "hidden_dim"), self.out_dim, _dim(num_layers, "num_layers"),
                        dropout)
        self.norm = _output_norm(self.out_dim, batch_norm)

    def features(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, L), (B,) -> (B, D) before the output norm: per sample (module docstring)."""
        tokens, lengths = _check_tokens(tokens, lengths)
        if int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"tokens holds ids >= vocab_size ({self.vocab_size})")
        mask = _valid_mask(lengths, tokens.shape[1]).unsqueeze(2)
        words = self.embed(tokens) * mask
        return self.net(words.sum(dim=1) / lengths.to(words.dtype).unsqueeze(1))

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        return self.norm(self.features(tokens, lengths))


def l2_normalize(x: Tensor) -> Tensor:
    """Row-wise L2 normalisation (eps 1e-12, as `evidential_loss(normalize=True)`): cosine space.

    (B, D) -> (B, D). A float16 or bfloat16 x (an encoder under autocast) is normalised in float32
    and returned in float32: a bfloat16 unit row is only unit to 2^-8, an error that the evidence
    exp(s/τ) at τ = 0.05 turns into ~8 %, and the method terms need float32 (`methods`).
    """
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return F.normalize(x, dim=1, eps=1e-12)
