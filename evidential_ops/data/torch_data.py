"""torch Dataset and collate helpers over a `CrossModalSplit`, usable in any training loop.

Training iterates (visual sample, caption) pairs; the evidential losses put pair i's positive on
the diagonal of a batch's similarity matrix (SPEC §2-3), so a batch holding two captions of the
same sample gives that sample a false negative. `mode="captions"` is the VSE++/TCL convention (one
item per caption, such duplicates possible); `mode="images"` yields one item per sample with one of
its captions drawn afresh each epoch (`set_epoch`), so a batch never holds a sample twice.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .types import PAD_ID, CrossModalSplit

__all__ = ["CrossModalPairs", "collate_pairs", "eval_batches", "pad_sequences"]

LANGUAGES = ("en", "alt")


def pad_sequences(seqs: Sequence[Tensor], pad_id: int = PAD_ID) -> tuple[Tensor, Tensor]:
    """Stack 1-D int64 token tensors into (B, L_max) padded with pad_id, and their lengths (B,)."""
    if len(seqs) == 0:
        raise ValueError("seqs must hold at least one sequence")
    for k, s in enumerate(seqs):
        if not isinstance(s, Tensor) or s.dim() != 1:
            raise TypeError(f"seqs[{k}] must be a 1-D tensor of token ids")
    lengths = torch.tensor([s.shape[0] for s in seqs], dtype=torch.int64)
    out = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.int64)
    for k, s in enumerate(seqs):
        out[k, : s.shape[0]] = s
    return out, lengths


class CrossModalPairs(Dataset):
    """(visual sample, caption) pairs of a split as a torch Dataset.

    split: a `CrossModalSplit`. languages: ("en",), ("alt",) or ("en", "alt") — with both, an item
    is a UML triplet (visual, English, non-English caption of the same annotated pair).
    mode: "captions" — item j is caption j with sample j // c (len = N·c);
          "images" — item i is sample i with caption i·c + r_i, r_i drawn per epoch from
          (seed, epoch), so batches never hold a sample twice (len = N).
    Items are dicts: image (R, F) or (F,) float, caption / caption_alt (L_j,) int64 unpadded,
    image_index, caption_index, label (-1 when the split has none), noisy (bool tensor).
    """

    def __init__(
        self,
        split: CrossModalSplit,
        *,
        languages: Sequence[str] = ("en",),
        mode: str = "captions",
        seed: int = 0,
    ):
        if not isinstance(split, CrossModalSplit):
            raise TypeError(f"split must be a CrossModalSplit, got {type(split).__name__}")
        languages = tuple(languages) if not isinstance(languages, str) else (languages,)
        if (
            not languages
            or any(lang not in LANGUAGES for lang in languages)
            or len(set(languages)) != len(languages)
        ):
            raise ValueError(f"languages must be a non-empty subset of {LANGUAGES}, got {languages}")
        if "alt" in languages and not split.has_alt:
            raise ValueError(
                f"languages includes 'alt' but split {split.name!r} has no second-language captions"
            )
        if mode not in ("captions", "images"):
            raise ValueError(f"mode must be 'captions' or 'images', got {mode!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.split = split
        self.languages = languages
        self.mode = mode
        self.seed = int(seed)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Redraw which caption each sample uses (mode="images"); deterministic in (seed, epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = int(epoch)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch]))
        c = self.split.captions_per_image
        self._choice = torch.from_numpy(rng.integers(0, c, self.split.n_images))

    def __len__(self) -> int:
        return self.split.n_images if self.mode == "images" else self.split.n_captions

    def __getitem__(self, index: int) -> dict:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} items")
        index %= n
        c = self.split.captions_per_image
        if self.mode == "images":
            image, caption = index, index * c + int(self._choice[index])
        else:
            image, caption = index // c, index
        item = {
            "image": self.split.images[image],
            "image_index": image,
            "caption_index": caption,
            "label": int(self.split.labels[image]) if self.split.labels is not None else -1,
            "noisy": bool(self.split.noisy[caption]),
        }
        for lang in self.languages:
            item["caption" if lang == "en" else "caption_alt"] = self.split.tokens(caption, lang)
        return item


def collate_pairs(batch: Sequence[dict], pad_id: int = PAD_ID) -> dict:
    """Batch `CrossModalPairs` items: images (B, R, F) float32, captions (B, L) + lengths (B,)
    (and captions_alt, lengths_alt), image_index, caption_index, labels (B,) int64, noisy (B,) bool.
    Usable as `DataLoader(ds, batch_size=…, shuffle=True, collate_fn=collate_pairs)`."""
    if len(batch) == 0:
        raise ValueError("batch must not be empty")
    out = {
        "images": torch.stack([b["image"] for b in batch]).to(torch.float32),
        "image_index": torch.tensor([b["image_index"] for b in batch], dtype=torch.int64),
        "caption_index": torch.tensor([b["caption_index"] for b in batch], dtype=torch.int64),
        "labels": torch.tensor([b["label"] for b in batch], dtype=torch.int64),
        "noisy": torch.tensor([b["noisy"] for b in batch], dtype=torch.bool),
    }
    for key, caps_key, lengths_key in (
        ("caption", "captions", "lengths"),
        ("caption_alt", "captions_alt", "lengths_alt"),
    ):
        if key in batch[0]:
            out[caps_key], out[lengths_key] = pad_sequences([b[key] for b in batch], pad_id)
    return out


def eval_batches(
    split: CrossModalSplit, batch_size: int = 256, *, what: str = "images", language: str = "en"
) -> Iterator[dict]:
    """In-order batches for encoding a whole split at evaluation (no shuffling, no DataLoader).

    what="images": {"images": (B, R, F) float32, "index": (B,)} over the N samples;
    what="captions": {"captions": (B, L) trimmed to the batch's longest, "lengths": (B,),
    "index": (B,)} over the N·c captions in `language`. Encoding the images, then the captions,
    in this order gives the (N, N·c) similarity layout `metrics.retrieval_metrics` expects.
    """
    if not isinstance(split, CrossModalSplit):
        raise TypeError(f"split must be a CrossModalSplit, got {type(split).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if what == "images":
        for start in range(0, split.n_images, batch_size):
            stop = min(start + batch_size, split.n_images)
            yield {"images": split.images[start:stop].to(torch.float32), "index": torch.arange(start, stop)}
    elif what == "captions":
        caps, lens = split.caption_tensors(language)
        for start in range(0, split.n_captions, batch_size):
            stop = min(start + batch_size, split.n_captions)
            lengths = lens[start:stop]
            yield {
                "captions": caps[start:stop, : int(lengths.max())],
                "lengths": lengths,
                "index": torch.arange(start, stop),
            }
    else:
        raise ValueError(f"what must be 'images' or 'captions', got {what!r}")
