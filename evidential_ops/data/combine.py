"""Concatenating splits: one gallery for queries of several origins (SPEC §6 OOD protocol)."""

from __future__ import annotations

import torch

from .types import PAD_ID, CrossModalSplit

__all__ = ["concat_splits"]


def _pad_to(tokens: torch.Tensor, width: int) -> torch.Tensor:
    if tokens.shape[1] == width:
        return tokens
    pad = torch.full((tokens.shape[0], width - tokens.shape[1]), PAD_ID, dtype=tokens.dtype)
    return torch.cat([tokens, pad], dim=1)


def _cat_tokens(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    width = max(a.shape[1], b.shape[1])
    return torch.cat([_pad_to(a, width), _pad_to(b, width)])


def concat_splits(first: CrossModalSplit, second: CrossModalSplit, *, name: str | None = None) -> CrossModalSplit:
    """`first` followed by `second` as one split: samples 0..N1−1 are first's, N1.. second's, and
    caption j of second becomes caption N1·c + j (the layout of `metrics.retrieval_metrics`).

    Both need the same captions_per_image, visual kind and feature shape. Optional parts (labels,
    second-language captions, concepts) are kept only when both splits have them (concepts also
    need the same width). caption_source of second is shifted by N1.
    """
    for s, label in ((first, "first"), (second, "second")):
        if not isinstance(s, CrossModalSplit):
            raise TypeError(f"{label} must be a CrossModalSplit, got {type(s).__name__}")
    if first.captions_per_image != second.captions_per_image:
        raise ValueError(f"captions_per_image differ: {first.captions_per_image} vs {second.captions_per_image}")
    if first.visual != second.visual or first.images.shape[1:] != second.images.shape[1:]:
        raise ValueError(f"visual features differ: {first.visual} {tuple(first.images.shape[1:])} vs "
                         f"{second.visual} {tuple(second.images.shape[1:])}")
    both = lambda a, b: a is not None and b is not None
    concepts = None
    if both(first.concepts, second.concepts) and first.concepts.shape[1] == second.concepts.shape[1]:
        concepts = torch.cat([first.concepts, second.concepts])
    return CrossModalSplit(
        name=name or f"{first.name}+{second.name}",
        images=torch.cat([first.images, second.images.to(first.images.dtype)]),
        captions=_cat_tokens(first.captions, second.captions),
        lengths=torch.cat([first.lengths, second.lengths]),
        captions_per_image=first.captions_per_image,
        labels=torch.cat([first.labels, second.labels]) if both(first.labels, second.labels) else None,
        captions_alt=(_cat_tokens(first.captions_alt, second.captions_alt)
                      if both(first.captions_alt, second.captions_alt) else None),
        lengths_alt=(torch.cat([first.lengths_alt, second.lengths_alt])
                     if both(first.captions_alt, second.captions_alt) else None),
        noisy=torch.cat([first.noisy, second.noisy]),
        caption_source=torch.cat([first.caption_source, second.caption_source + first.n_images]),
        concepts=concepts,
        visual=first.visual,
    )
