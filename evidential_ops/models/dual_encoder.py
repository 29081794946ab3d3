"""A visual encoder and a text encoder projecting into one cosine space (SPEC notation x, y).

Every method model is built from one or more `DualEncoder`s. The batch format is the one of
`data.collate_pairs`: a dict with "images" (B, R, F) or (B, F), "captions" (B, L) int64 and
"lengths" (B,) int64, optionally "captions_alt"/"lengths_alt" (second language), "labels" (B,),
"noisy" (B,). `embed_split` encodes a whole `CrossModalSplit` in the (N, N·c) layout of
`metrics.retrieval_metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from .. import checks
from ..data.torch_data import eval_batches
from ..data.types import CrossModalSplit
from .chunking import ChunkedEncoding
from .encoders import l2_normalize

__all__ = ["DualEncoder", "batch_tensor", "embed_split"]


def batch_tensor(batch, key: str) -> Tensor:
    """batch[key], with a ValueError naming the key when the batch lacks it."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a dict (see data.collate_pairs), got {type(batch).__name__}")
    if key not in batch:
        raise ValueError(f"batch has no {key!r} entry (keys: {sorted(batch)}); see data.collate_pairs")
    value = batch[key]
    if not isinstance(value, Tensor):
        raise TypeError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_batch_size(batch_size: int, *tensors: tuple[str, Tensor]) -> int:
    sizes = {name: t.shape[0] for name, t in tensors}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch entries disagree on the batch size: {sizes}")
    k = next(iter(sizes.values()))
    if k < batch_size:
        raise ValueError(f"the method needs a batch of >= {batch_size} pairs, got {k}")
    return k


class DualEncoder(ChunkedEncoding, nn.Module):
    """Image (or video) encoder + text encoder; both outputs L2-normalised (B, D).

    Args:
        image_encoder: `images -> (B, D)` (see `models.encoders`).
        text_encoder: `(tokens, lengths) -> (B, D)`, the same D.
        chunk_size: None (default), or encode batches of more than this many samples in chunks
            of it under activation checkpointing while gradients are recorded
            (`models.chunking`). Needs encoders of the form `norm(features(...))` with a per-sample
            `features`, as the built-in ones are; the result and the gradients are those of the
            unchunked batch up to the rounding of the chunks' own GEMMs.
    """

    _CHUNKED_ENCODERS = ("image_encoder", "text_encoder")

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, *, chunk_size: int | None = None):
        super().__init__()
        if not isinstance(image_encoder, nn.Module):
            raise TypeError(f"image_encoder must be an nn.Module, got {type(image_encoder).__name__}")
        if not isinstance(text_encoder, nn.Module):
            raise TypeError(f"text_encoder must be an nn.Module, got {type(text_encoder).__name__}")
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.chunk_size = chunk_size

    def encode_images(self, images: Tensor) -> Tensor:
        """(B, R, F) or (B, F) → (B, D) unit rows."""
        return _embedding(self._encode(self.image_encoder, images), "image_encoder", images.shape[0])

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, L), (B,) → (B, D) unit rows."""
        return _embedding(self._encode(self.text_encoder, tokens, lengths), "text_encoder", tokens.shape[0])

    def forward(self, batch, *, language: str = "en") -> tuple[Tensor, Tensor]:
        """Embeddings (x, y) of a batch's images and captions ("en") or second-language captions
        ("alt"); pair i = (x_i, y_i), positives on the diagonal of x·yᵀ."""
        if language not in ("en", "alt"):
            raise ValueError(f"language must be 'en' or 'alt', got {language!r}")
        images = batch_tensor(batch, "images")
        key, lengths_key = ("captions", "lengths") if language == "en" else ("captions_alt", "lengths_alt")
        tokens, lengths = batch_tensor(batch, key), batch_tensor(batch, lengths_key)
        _check_batch_size(2, ("images", images), (key, tokens), (lengths_key, lengths))
        return self.encode_images(images), self.encode_texts(tokens, lengths)


def _embedding(out, who: str, n: int) -> Tensor:
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != n:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"{who} must return a (B, D) tensor with B = {n}, got {shape}")
    return l2_normalize(out)


@torch.no_grad()
def embed_split(
    image_fn, text_fn, split: CrossModalSplit, *, language: str = "en", batch_size: int = 512,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Encode every sample and every caption of a split, in order, without gradient.

    image_fn: images (B, ...) -> (B, D); text_fn: (tokens, lengths) -> (B, D). The caller puts
    its modules in eval mode. Returns (images (N, D), captions (N·c, D)) float32 on the CPU:
    caption j belongs to sample j // c (the layout of `metrics.retrieval_metrics`).
    """
    if not isinstance(split, CrossModalSplit):
        raise TypeError(f"split must be a CrossModalSplit, got {type(split).__name__}")
    batch_size = checks.integer(batch_size, "batch_size", minimum=1)
    images = [image_fn(b["images"].to(device)).float().cpu() for b in eval_batches(split, batch_size, what="images")]
    texts = [
        text_fn(b["captions"].to(device), b["lengths"].to(device)).float().cpu()
        for b in eval_batches(split, batch_size, what="captions", language=language)
    ]
    return torch.cat(images), torch.cat(texts)
