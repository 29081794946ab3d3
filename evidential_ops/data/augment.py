"""Training-time data augmentation of TcVSE (TcVSE paper §2.1 and Algorithm 1, x' = Augment(x)).

The paper: "we randomly discard the region features extracted by the backbone network ... to
achieve data augmentation ... Meanwhile, 'Mask', 'Discard', or 'Swap' operations are performed
on the word tokens", following VSE∞ (Chen et al. 2021), whose released loaders do it per sample:
every region is dropped with probability 0.2, and every word is picked with probability 0.2 and
then masked (1/2 of the picks), swapped for a random vocabulary word (1/10) or discarded (4/10).
**[choice]** Those rates are the defaults here, and "Swap" is read as VSE∞'s random-word
substitution (the word is swapped for another), not as exchanging two positions.

Batches are the dense tensors of `collate_pairs`, so a dropped region cannot leave the tensor:
it is overwritten by a copy of a kept region of the same sample. Under max pooling (TcVSE's
encoders) a duplicate changes nothing, so this is exactly dropping the region; under mean or
attention pooling it re-weights the kept ones instead. Every sample keeps at least one region and
every caption at least one token.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .types import MASK_ID, PAD_ID, SPECIALS

__all__ = ["DEFAULT_REGION_DROP", "DEFAULT_WORD_RATE", "augment_batch", "augment_tokens", "drop_regions"]

DEFAULT_REGION_DROP = 0.2  # VSE∞: keep a region where rand > 0.2
DEFAULT_WORD_RATE = 0.2  # VSE∞: a word is picked with probability 0.2
MASK_SHARE, SWAP_SHARE = 0.5, 0.1  # of the picked words; the remaining 0.4 are discarded


def _rate(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be a real number in [0, 1), got {value!r}")
    return float(value)


def _uniform(shape, like: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, generator=generator, device=like.device)


def drop_regions(images: Tensor, rate: float = DEFAULT_REGION_DROP, *, generator: torch.Generator | None = None) -> Tensor:
    """Discard each region (or frame) of (B, R, F) features with probability `rate`, replacing it
    by a uniformly chosen kept region of the same sample (module docstring); at least one region
    of every sample is kept. (B, F) global features have no regions and come back unchanged.
    Returns a new tensor; `images` is not modified."""
    rate = _rate(rate, "region_drop")
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise TypeError("images must be a floating-point tensor (B, R, F) or (B, F)")
    if images.dim() == 2 or rate == 0.0:
        return images.clone()
    if images.dim() != 3 or images.shape[1] == 0:
        raise ValueError(f"images must be (B, R, F) with R >= 1, or (B, F), got shape {tuple(images.shape)}")
    b, r, _ = images.shape
    keep = _uniform((b, r), images, generator) >= rate
    # A sample that lost every region keeps one, chosen at random.
    rescue = torch.randint(0, r, (b,), generator=generator, device=images.device)
    keep[torch.arange(b, device=images.device), rescue] |= ~keep.any(dim=1)
    # Each slot draws a kept region of its sample; kept slots keep their own.
    donor = torch.multinomial(keep.to(torch.float32), r, replacement=True, generator=generator)
    source = torch.where(keep, torch.arange(r, device=images.device).expand(b, r), donor)
    return images.gather(1, source.unsqueeze(2).expand_as(images))


def augment_tokens(tokens: Tensor, lengths: Tensor, *, vocab_size: int, rate: float = DEFAULT_WORD_RATE,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Mask / swap / discard words of padded captions (module docstring): each real token is
    picked with probability `rate`; a picked token becomes <mask> (1/2), another ordinary word
    drawn uniformly (1/10), or is removed (4/10). At least one token stays.

    tokens: (B, L) int64 padded with PAD_ID; lengths: (B,) int64. vocab_size: ids below it are
    valid, the first len(SPECIALS) are <pad>, <unk>, <mask>. Returns new (tokens (B, L'), lengths
    (B,)) with L' the longest remaining caption."""
    rate = _rate(rate, "word_rate")
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.int64 or tokens.dim() != 2:
        raise TypeError("tokens must be an int64 tensor (B, L)")
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.shape != (tokens.shape[0],):
        raise TypeError(f"lengths must be an int64 tensor of shape ({tokens.shape[0]},)")
    n_special = len(SPECIALS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < n_special + 2:
        raise ValueError(f"vocab_size must be an int >= {n_special + 2} (specials plus two words), got {vocab_size!r}")
    b, width = tokens.shape
    device = tokens.device
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    picked = real & (_uniform((b, width), tokens, generator) < rate)
    operation = _uniform((b, width), tokens, generator)
    mask = picked & (operation < MASK_SHARE)
    swap = picked & (operation >= MASK_SHARE) & (operation < MASK_SHARE + SWAP_SHARE)
    discard = picked & (operation >= MASK_SHARE + SWAP_SHARE)
    out = tokens.clone()
    out[mask] = MASK_ID
    # A different ordinary word, uniformly: for an ordinary token draw among the other
    # vocab_size − n_special − 1 words (skip over the current id); a special token has them all.
    other = torch.randint(n_special, int(vocab_size) - 1, (b, width), generator=generator, device=device)
    other = other + (other >= tokens).to(torch.int64)
    any_word = torch.randint(n_special, int(vocab_size), (b, width), generator=generator, device=device)
    out = torch.where(swap, torch.where(tokens >= n_special, other, any_word), out)
    keep = real & ~discard
    # A caption that lost every word keeps its first one (as it was after mask/swap).
    keep[:, 0] |= ~keep.any(dim=1)
    # Stable compaction: kept tokens move to the front in order, the rest becomes padding.
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    out = torch.where(keep, out, torch.full_like(out, PAD_ID)).gather(1, order)
    new_lengths = keep.sum(dim=1)
    return out[:, : int(new_lengths.max())].contiguous(), new_lengths


def augment_batch(batch: dict, *, vocab_size: int, region_drop: float = DEFAULT_REGION_DROP,
                  word_rate: float = DEFAULT_WORD_RATE, generator: torch.Generator | None = None) -> dict:
    """x' = Augment(x) of TcVSE Algorithm 1 on a `collate_pairs` batch: `drop_regions` on
    "images" and `augment_tokens` on "captions"/"lengths" (the English captions TcVSE trains
    on). Other entries are passed through; the input batch is not modified."""
    if not isinstance(batch, dict):
        raise TypeError(f"batch must be a dict (see data.collate_pairs), got {type(batch).__name__}")
    for key in ("images", "captions", "lengths"):
        if key not in batch:
            raise ValueError(f"batch has no {key!r} entry (keys: {sorted(batch)}); see data.collate_pairs")
    out = dict(batch)
    out["images"] = drop_regions(batch["images"], region_drop, generator=generator)
    out["captions"], out["lengths"] = augment_tokens(batch["captions"], batch["lengths"], vocab_size=vocab_size,
                                                     rate=word_rate, generator=generator)
    return out
