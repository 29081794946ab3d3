"""Loader (and writer) for the precomputed-feature layout the papers release (SCAN, VSE++, TCL).

Layout of a data directory (e.g. `f30k_precomp/`), one pair of files per split prefix:
    {prefix}_ims.npy    float array (N, regions, dim) of region features, or (N, dim)
    {prefix}_caps.txt   N·c lines, c consecutive captions per image (c = 5 for Flickr30K/COCO),
                        whitespace-tokenised
optional, read when present or asked for:
    {prefix}_caps_{lang}.txt   the same captions in a second language (UML's non-English side)
    {prefix}_labels.npy        (N,) integer class labels (label-based retrieval, FUME)
The standard prefixes are train / dev / test; `load_precomputed` maps them to the split names
train / val / test of the synthetic generator and returns the same `CrossModalBenchmark` type.
The vocabulary is built from the training captions only (words unseen there become <unk>), as the
released VSE/SCAN vocabularies are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from .types import CrossModalBenchmark, CrossModalSplit, Vocabulary, pad_token_lists

__all__ = ["DEFAULT_SPLITS", "load_precomputed", "save_precomputed"]

DEFAULT_SPLITS = {"train": "train", "val": "dev", "test": "test"}


def _split_map(splits) -> dict[str, str]:
    if splits is None:
        return dict(DEFAULT_SPLITS)
    if isinstance(splits, Mapping):
        out = dict(splits)
    elif isinstance(splits, Sequence) and not isinstance(splits, str):
        out = {name: name for name in splits}
    else:
        raise TypeError(
            "splits must be a mapping name -> file prefix or a sequence of prefixes, "
            f"got {type(splits).__name__}"
        )
    if not out:
        raise ValueError("splits must name at least one split")
    for name, prefix in out.items():
        if not isinstance(name, str) or not isinstance(prefix, str) or not name or not prefix:
            raise TypeError(f"splits entries must be non-empty strings, got {name!r}: {prefix!r}")
    return out


def _read_captions(path: Path, lowercase: bool) -> list[list[str]]:
    if not path.is_file():
        raise FileNotFoundError(f"missing caption file {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for k, line in enumerate(lines, start=1):
        tokens = (line.lower() if lowercase else line).split()
        if not tokens:
            raise ValueError(f"{path}: line {k} is empty (every caption needs at least one token)")
        out.append(tokens)
    return out


def _read_images(path: Path, mmap: bool) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"missing image feature file {path}")
    # Copy-on-write mapping: pages load lazily (Flickr30K train regions are ~8 GB) and torch can
    # wrap the array without copying, while the file itself is never modified.
    images = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
    if images.ndim not in (2, 3):
        raise ValueError(f"{path}: expected (N, dim) or (N, regions, dim) features, got shape {images.shape}")
    if images.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{path}: features must be float16/32/64, got {images.dtype}")
    if images.dtype == np.float64:
        images = images.astype(np.float32)
    if images.shape[0] == 0:
        raise ValueError(f"{path}: holds no images")
    return images


def _encode(vocab: Vocabulary, captions: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_token_lists([vocab.encode(c) for c in captions])


def load_precomputed(
    root,
    *,
    splits: Mapping[str, str] | Sequence[str] | None = None,
    captions_per_image: int = 5,
    alt_language: str | None = None,
    vocab: Vocabulary | None = None,
    vocab_alt: Vocabulary | None = None,
    min_count: int = 1,
    lowercase: bool = True,
    mmap: bool = True,
    visual: str | None = None,
) -> CrossModalBenchmark:
    """Load `{prefix}_ims.npy` + `{prefix}_caps.txt` splits into a `CrossModalBenchmark`.

    root: the data directory. splits: {split name: file prefix} (default train→train, val→dev,
    test→test) or a list of prefixes used as names. captions_per_image: c; the caption file must
    have exactly c·N lines for N images. alt_language: e.g. "de" to also read
    `{prefix}_caps_de.txt` as the second language. vocab / vocab_alt: use these vocabularies
    instead of building them from the "train" split's captions (words seen ≥ min_count times,
    most frequent first; ids 0/1/2 = <pad>/<unk>/<mask>). lowercase: lower-case captions before
    splitting on whitespace. mmap: map the feature files instead of reading them. visual:
    "regions" (default for 3-D features), "frames" or "global" (the only choice for 2-D features).

    Raises FileNotFoundError naming the missing file, ValueError for mismatched counts, empty
    captions, or feature arrays of the wrong shape/dtype.
    """
    root = Path(os.fspath(root))
    if not root.is_dir():
        raise FileNotFoundError(f"root {root} is not a directory")
    split_map = _split_map(splits)
    if (
        isinstance(captions_per_image, bool)
        or not isinstance(captions_per_image, int)
        or captions_per_image < 1
    ):
        raise ValueError(f"captions_per_image must be an int >= 1, got {captions_per_image!r}")
    if alt_language is not None and (not isinstance(alt_language, str) or not alt_language):
        raise TypeError(f"alt_language must be a non-empty str or None, got {alt_language!r}")
    if visual not in (None, "regions", "frames", "global"):
        raise ValueError(f"visual must be None, 'regions', 'frames' or 'global', got {visual!r}")
    if vocab is not None and not isinstance(vocab, Vocabulary):
        raise TypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
    if vocab_alt is not None and not isinstance(vocab_alt, Vocabulary):
        raise TypeError(f"vocab_alt must be a Vocabulary, got {type(vocab_alt).__name__}")
    need_train = vocab is None or (alt_language is not None and vocab_alt is None)
    if need_train and "train" not in split_map:
        raise ValueError(
            "splits must include 'train' to build the vocabulary from its captions, or pass vocab=/vocab_alt="
        )

    raw = {}
    for name, prefix in split_map.items():
        images = _read_images(root / f"{prefix}_ims.npy", mmap)
        n = images.shape[0]
        texts = {"en": root / f"{prefix}_caps.txt"}
        if alt_language is not None:
            texts["alt"] = root / f"{prefix}_caps_{alt_language}.txt"
        caps = {}
        for lang, path in texts.items():
            caps[lang] = _read_captions(path, lowercase)
            if len(caps[lang]) != n * captions_per_image:
                raise ValueError(
                    f"{path.name} has {len(caps[lang])} captions but {prefix}_ims.npy has {n} images; "
                    f"captions_per_image={captions_per_image} needs {n * captions_per_image}"
                )
        labels = None
        label_path = root / f"{prefix}_labels.npy"
        if label_path.is_file():
            labels = np.load(label_path, allow_pickle=False)
            if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(
                    f"{label_path.name} must hold {n} integer labels, got {labels.dtype} {labels.shape}"
                )
        raw[name] = (images, caps, labels)

    if vocab is None:
        vocab = Vocabulary.from_corpus(raw["train"][1]["en"], min_count=min_count)
    if alt_language is not None and vocab_alt is None:
        vocab_alt = Vocabulary.from_corpus(raw["train"][1]["alt"], min_count=min_count)

    out = {}
    for name, (images, caps, labels) in raw.items():
        captions, lengths = _encode(vocab, caps["en"])
        captions_alt = lengths_alt = None
        if "alt" in caps:
            captions_alt, lengths_alt = _encode(vocab_alt, caps["alt"])
        kind = "global" if images.ndim == 2 else (visual or "regions")
        if images.ndim == 2 and visual not in (None, "global"):
            raise ValueError(
                f"visual={visual!r} needs (N, R, dim) features, {split_map[name]}_ims.npy is 2-D"
            )
        if images.ndim == 3 and visual == "global":
            raise ValueError(f"visual='global' needs (N, dim) features, {split_map[name]}_ims.npy is 3-D")
        out[name] = CrossModalSplit(
            name=name,
            images=torch.from_numpy(images),
            captions=captions,
            lengths=lengths,
            captions_per_image=captions_per_image,
            labels=torch.from_numpy(labels.astype(np.int64)) if labels is not None else None,
            captions_alt=captions_alt,
            lengths_alt=lengths_alt,
            visual=kind,
        )
    info = {"source": "precomputed", "root": str(root), "splits": split_map, "alt_language": alt_language}
    return CrossModalBenchmark(
        splits=out, vocab=vocab, vocab_alt=vocab_alt if alt_language else None, info=info
    )


def save_precomputed(
    bench: CrossModalBenchmark,
    root,
    *,
    prefixes: Mapping[str, str] | None = None,
    alt_language: str = "alt",
) -> dict[str, str]:
    """Write a benchmark in the layout `load_precomputed` reads (e.g. to share synthetic data).

    prefixes: {split name: file prefix}; by default val → dev and every other split keeps its
    name. Writes {prefix}_ims.npy (float32), {prefix}_caps.txt, {prefix}_labels.npy when the split
    has labels, and {prefix}_caps_{alt_language}.txt when it has second-language captions.
    Returns the split → prefix mapping used (pass it as `splits=` to load the files back).
    """
    if not isinstance(bench, CrossModalBenchmark):
        raise TypeError(f"bench must be a CrossModalBenchmark, got {type(bench).__name__}")
    root = Path(os.fspath(root))
    root.mkdir(parents=True, exist_ok=True)
    mapping = {name: ("dev" if name == "val" else name) for name in bench.splits}
    if prefixes is not None:
        unknown = sorted(set(prefixes) - set(bench.splits))
        if unknown:
            raise ValueError(
                f"prefixes names unknown splits {unknown}; the benchmark has {sorted(bench.splits)}"
            )
        mapping.update(prefixes)
    for name, split in bench.splits.items():
        prefix = mapping[name]
        np.save(root / f"{prefix}_ims.npy", split.images.to(torch.float32).numpy())
        if split.labels is not None:
            np.save(root / f"{prefix}_labels.npy", split.labels.numpy())
        languages = [("en", bench.vocab, f"{prefix}_caps.txt")]
        if split.has_alt:
            languages.append(("alt", bench.vocab_alt, f"{prefix}_caps_{alt_language}.txt"))
        for lang, vocab, filename in languages:
            caps, lens = split.caption_tensors(lang)
            lines = [" ".join(vocab.decode(caps[j, : int(lens[j])].tolist())) for j in range(caps.shape[0])]
            (root / filename).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return mapping
