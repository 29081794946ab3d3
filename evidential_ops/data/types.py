"""The dataset type shared by the synthetic generator and the precomputed-feature loader.

A `CrossModalBenchmark` holds named `CrossModalSplit`s (train/val/test, optionally ood) and the
vocabularies of its one or two caption languages. A split stores everything as tensors in the
layout of the papers' precomputed features (SCAN/VSE++/TCL): N visual samples, then
captions_per_image consecutive captions per sample, so caption j belongs to sample
j // captions_per_image — exactly the column layout `metrics.retrieval_metrics` expects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
from torch import Tensor

__all__ = ["CrossModalBenchmark", "CrossModalSplit", "MASK_ID", "PAD_ID", "SPECIALS", "UNK_ID", "Vocabulary"]

SPECIALS = ("<pad>", "<unk>", "<mask>")
PAD_ID, UNK_ID, MASK_ID = 0, 1, 2
VISUAL_KINDS = ("regions", "frames", "global")


def pad_token_lists(seqs: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """(N, L_max) int64 ids padded with PAD_ID and (N,) lengths, from N non-empty id lists.

    One flat copy plus a boolean scatter: per-row tensor construction costs ~10 µs a row, which
    dominated building 10^4-caption splits.
    """
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(lengths.max()) if len(seqs) else 0
    out = np.full((len(seqs), width), PAD_ID, dtype=np.int64)
    out[np.arange(width)[None, :] < lengths[:, None]] = np.fromiter(chain.from_iterable(seqs), dtype=np.int64)
    return torch.from_numpy(out), torch.from_numpy(lengths)


@dataclass(frozen=True)
class Vocabulary:
    """Word ↔ id mapping; ids 0, 1, 2 are <pad>, <unk>, <mask> (padding, unknown word, masked word).

    words: the word of every id, specials first. Unknown words encode to UNK_ID.
    """

    words: tuple[str, ...]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        words = tuple(self.words)
        if words[: len(SPECIALS)] != SPECIALS:
            raise ValueError(f"words must start with the special tokens {SPECIALS}, got {words[:3]}")
        index = {w: i for i, w in enumerate(words)}
        if len(index) != len(words):
            dup = [w for w, c in Counter(words).items() if c > 1]
            raise ValueError(f"words must be unique; duplicated: {dup[:5]}")
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "_index", index)

    def __len__(self) -> int:
        return len(self.words)

    pad_id = PAD_ID
    unk_id = UNK_ID
    mask_id = MASK_ID

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self._index.get(t, UNK_ID) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.words[int(i)] for i in ids]

    @classmethod
    def from_corpus(cls, sentences: Iterable[Sequence[str]], min_count: int = 1) -> "Vocabulary":
        """Words seen at least min_count times, most frequent first, ties alphabetical (deterministic)."""
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be an int >= 1, got {min_count!r}")
        counts = Counter(t for sentence in sentences for t in sentence)
        kept = sorted(
            (w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
            key=lambda w: (-counts[w], w),
        )
        return cls(SPECIALS + tuple(kept))


def _check_tokens(captions: Tensor, lengths: Tensor, name: str, n_captions: int) -> None:
    if not isinstance(captions, Tensor) or captions.dtype != torch.int64 or captions.dim() != 2:
        raise TypeError(f"{name} must be an int64 tensor (N_captions, L)")
    if captions.shape[0] != n_captions:
        raise ValueError(f"{name} has {captions.shape[0]} rows, expected {n_captions}")
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.shape != (n_captions,):
        raise ValueError(f"lengths of {name} must be an int64 tensor of shape ({n_captions},)")
    if n_captions and (int(lengths.min()) < 1 or int(lengths.max()) > captions.shape[1]):
        raise ValueError(f"lengths of {name} must lie in [1, {captions.shape[1]}]")
    if captions.numel() and int(captions.min()) < 0:
        raise ValueError(f"{name} holds negative token ids")


@dataclass(frozen=True)
class CrossModalSplit:
    """One split: N visual samples with captions_per_image captions each (one or two languages).

    images: float tensor (N, R, F) region features, (N, T, F) frame features or (N, F) global
        features (`visual` says which); may be backed by a memory-mapped file.
    captions, lengths: int64 (N·c, L) token ids padded with PAD_ID, and (N·c,) true lengths;
        caption j is annotated as describing sample j // c.
    captions_alt, lengths_alt: the same for the second (non-English) language, or None.
    labels: int64 (N,) class labels (label-based retrieval, FUME), or None.
    noisy: bool (N·c,) ground truth of noisy correspondence: True where the caption (or, with
        noise on the second language, its non-English caption) actually describes another sample.
    caption_source: int64 (N·c,) the sample the noisy-language caption really describes
        (= j // c where not noisy).
    concepts: int64 (N, n_objects) latent concepts of each sample (synthetic data), or None.
    """

    name: str
    images: Tensor
    captions: Tensor
    lengths: Tensor
    captions_per_image: int
    labels: Tensor | None = None
    captions_alt: Tensor | None = None
    lengths_alt: Tensor | None = None
    noisy: Tensor | None = None
    caption_source: Tensor | None = None
    concepts: Tensor | None = None
    visual: str = "regions"

    def __post_init__(self):
        if not isinstance(self.images, Tensor) or not self.images.is_floating_point():
            raise TypeError("images must be a floating-point tensor")
        if self.images.dim() not in (2, 3):
            raise ValueError(f"images must be (N, F) or (N, R, F), got shape {tuple(self.images.shape)}")
        if self.visual not in VISUAL_KINDS:
            raise ValueError(f"visual must be one of {VISUAL_KINDS}, got {self.visual!r}")
        if (self.visual == "global") != (self.images.dim() == 2):
            raise ValueError(
                f"visual={self.visual!r} does not match images of shape {tuple(self.images.shape)}"
            )
        c = self.captions_per_image
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"captions_per_image must be an int >= 1, got {c!r}")
        n = self.images.shape[0]
        _check_tokens(self.captions, self.lengths, "captions", n * c)
        if (self.captions_alt is None) != (self.lengths_alt is None):
            raise ValueError("captions_alt and lengths_alt must be given together")
        if self.captions_alt is not None:
            _check_tokens(self.captions_alt, self.lengths_alt, "captions_alt", n * c)
        if self.labels is not None and (self.labels.dtype != torch.int64 or self.labels.shape != (n,)):
            raise ValueError(f"labels must be an int64 tensor of shape ({n},)")
        noisy = self.noisy if self.noisy is not None else torch.zeros(n * c, dtype=torch.bool)
        if noisy.dtype != torch.bool or noisy.shape != (n * c,):
            raise ValueError(f"noisy must be a bool tensor of shape ({n * c},)")
        source = self.caption_source if self.caption_source is not None else self.caption_image
        if source.dtype != torch.int64 or source.shape != (n * c,):
            raise ValueError(f"caption_source must be an int64 tensor of shape ({n * c},)")
        if self.concepts is not None and (self.concepts.dim() != 2 or self.concepts.shape[0] != n):
            raise ValueError(f"concepts must have shape ({n}, n_objects)")
        object.__setattr__(self, "noisy", noisy)
        object.__setattr__(self, "caption_source", source)

    @property
    def n_images(self) -> int:
        return self.images.shape[0]

    @property
    def n_captions(self) -> int:
        return self.captions.shape[0]

    @property
    def caption_image(self) -> Tensor:
        """(N·c,) the sample each caption is annotated with: j // captions_per_image."""
        return torch.arange(self.n_images * self.captions_per_image) // self.captions_per_image

    @property
    def has_alt(self) -> bool:
        return self.captions_alt is not None

    def tokens(self, j: int, language: str = "en") -> Tensor:
        """Unpadded token ids of caption j in language "en" (captions) or "alt" (captions_alt)."""
        caps, lens = self.caption_tensors(language)
        return caps[j, : int(lens[j])]

    def caption_tensors(self, language: str = "en") -> tuple[Tensor, Tensor]:
        """(captions (N·c, L), lengths (N·c,)) of language "en" or "alt" (second language)."""
        if language == "en":
            return self.captions, self.lengths
        if language == "alt":
            if self.captions_alt is None:
                raise ValueError(f"split {self.name!r} has no second-language captions (language='alt')")
            return self.captions_alt, self.lengths_alt
        raise ValueError(f"language must be 'en' or 'alt', got {language!r}")


@dataclass(frozen=True)
class CrossModalBenchmark:
    """Named splits plus vocabularies. `bench["train"]` or `bench.train`; `info` records provenance
    (the generator's configuration or the loader's root)."""

    splits: Mapping[str, CrossModalSplit]
    vocab: Vocabulary
    vocab_alt: Vocabulary | None = None
    info: Mapping = field(default_factory=dict)

    def __post_init__(self):
        for name, split in self.splits.items():
            if not isinstance(split, CrossModalSplit):
                raise TypeError(f"splits[{name!r}] must be a CrossModalSplit, got {type(split).__name__}")
            if split.captions.numel() and int(split.captions.max()) >= len(self.vocab):
                raise ValueError(
                    f"splits[{name!r}].captions holds ids outside vocab (size {len(self.vocab)})"
                )
            if split.has_alt:
                if self.vocab_alt is None:
                    raise ValueError(f"splits[{name!r}] has captions_alt but vocab_alt is None")
                if split.captions_alt.numel() and int(split.captions_alt.max()) >= len(self.vocab_alt):
                    raise ValueError(f"splits[{name!r}].captions_alt holds ids outside vocab_alt")

    def __getitem__(self, name: str) -> CrossModalSplit:
        if name not in self.splits:
            raise KeyError(f"no split {name!r}; this benchmark has {sorted(self.splits)}")
        return self.splits[name]

    def __contains__(self, name: str) -> bool:
        return name in self.splits

    @property
    def train(self) -> CrossModalSplit:
        return self["train"]

    @property
    def val(self) -> CrossModalSplit:
        return self["val"]

    @property
    def test(self) -> CrossModalSplit:
        return self["test"]

    @property
    def ood(self) -> CrossModalSplit:
        return self["ood"]
