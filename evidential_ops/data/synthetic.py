"""A built-in, deterministic, seedable synthetic cross-modal benchmark (images/videos ↔ captions).

Why synthetic: the papers' benchmarks (Flickr30K/MS-COCO region features, Multi30K, VATEX,
XMediaNet…) are gigabytes and not redistributable; tests, examples and the CLI need data that
installs with the package, trains in about a minute on a laptop CPU, and exposes each protocol the
methods are evaluated under (SPEC §3-4):

- instance retrieval with 5 captions per image (TCL/TcVSE/DUQ: R@K, rSum);
- class labels for label-based mAP@all (FUME Table 1, Fig. 3);
- a second, non-English language with its own vocabulary, word order and compounds, and a
  controllable rate of noisy correspondence (UML Fig. 3: switched vision/non-English pairs);
- a corruption ratio that masks regions and masks/replaces/deletes words (TCL Fig. 5);
- out-of-distribution samples built from concepts never seen in training (FUME Fig. 4);
- region features (n_regions × feat_dim, for max-pool / attention pooling encoders, TcVSE §2.1),
  frame features with temporal structure (DUQ/TcVSE video), or one global vector per sample.

Generative model (all from one `numpy.random.SeedSequence(seed)`; each part draws from its own
child stream, so changing n_train leaves the lexicon, val, test and ood splits unchanged):
1. Concepts (objects) and attributes have random unit visual prototypes in R^feat_dim. Classes own
   disjoint pools of `concepts_per_class` concepts; `n_ood_classes` further pools are reserved for
   the ood split and never appear in train/val/test.
2. A sample of class c has `objects_per_image` distinct objects: each from c's pool with
   probability 1 − concept_overlap, otherwise from any in-distribution concept (overlap between
   classes, the knob for label-retrieval difficulty), each with a random attribute.
3. Visual: object feature = prototype + attribute_scale · attribute vector. Regions: one region per
   object, the rest either a second view of a random object or clutter (a random unit vector),
   in random order. Frames: objects occupy contiguous random segments of the clip, with
   temporally correlated noise. Global: the normalised sum of the object features. Every region /
   frame / vector gets Gaussian noise of norm ≈ noise_scale (the knob for instance difficulty).
4. Captions mention each object with probability mention_prob (at least one) in random order,
   each with its attribute word with probability attribute_mention_prob, joined by connectives,
   with optional content-free prefixes/suffixes (variable length). The second language is a
   "translation" of the same plan with a different lexicon: its own word ids, noun-before-adjective
   order, and some concepts written as two tokens (compounds).

Defaults (measured on 2 CPU cores, torch 2.13 CPU): generation takes ~0.6 s. A closed-form
ridge probe from pooled regions to caption bag-of-words reaches i2t R@1 70 %, t2i R@1 50 %, rSum
467 on the 500-image test split (chance R@1 0.2 %), and a linear classifier 84 % class accuracy
(chance 10 %). A small encoder (per-region 2-layer MLP + max-pool; mean of word embeddings; D =
256) trained with symmetric InfoNCE, batch 128 in mode="images", Adam 2e-3, reaches rSum 496
after 3 epochs and 547 after 10 (i2t R@1 87 %, t2i R@1 72 %) in ~30 s; on the same model test
corruption 0.3 / 0.6 drops rSum to 368 / 126, and the 200-sample ood split (a smaller, so
easier, gallery) reaches only 156, both with lower evidence strength. Easier: noise_scale 0.5
(probe rSum 514, encoder 567). Harder: noise_scale 1.5 (probe rSum 392) or mention_prob 0.6
(probe rSum 360). concept_overlap 0.5 makes classes overlap (probe class accuracy 84 → 59 %)
while instance retrieval stays about as hard (probe rSum 480).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .types import MASK_ID, SPECIALS, CrossModalBenchmark, CrossModalSplit, Vocabulary, pad_token_lists

__all__ = ["SyntheticConfig", "corrupt_split", "make_synthetic_benchmark"]

NOISE_TARGETS = ("second_language", "captions")
VISUALS = ("regions", "frames", "global")

# Function words: content-free, so a model must learn to ignore them. The second language uses a
# disjoint invented lexicon so no token id or string is shared between the two vocabularies.
_EN_DET = ("a", "the")
_EN_CONNECT = ("and", "with", "near", "beside")
_EN_PREFIX = ((), ("photo", "of"), ("there", "is"))
_EN_SUFFIX = ((), ("in", "the", "scene"), ("on", "display"))
_ALT_DET = ("lo", "ka")
_ALT_CONNECT = ("e", "kon", "pres", "lado")
_ALT_PREFIX = ((), ("foto",), ("ya", "esti"))
_ALT_SUFFIX = ((), ("en", "sena"), ("mostra",))
_ALT_COMPOUND = ("ba", "di", "gu", "po", "ru")
_COMPOUND_PROB = 0.3  # share of concepts the second language writes as two tokens
_CHILD = {"lexicon": 0, "train": 1, "val": 2, "test": 3, "ood": 4, "noise": 5, "corrupt": 6}


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of `make_synthetic_benchmark` (defaults train a method in ~1 min on 2 cores).

    seed: master seed (same seed → identical tensors).
    n_train, n_val, n_test, n_ood: samples per split (n_ood = 0 omits the ood split).
    captions_per_image: captions per sample (5 = COCO/Flickr protocol).
    visual: "regions" (N, n_regions, feat_dim), "frames" (N, n_regions, feat_dim) video-like, or
        "global" (N, feat_dim).
    n_regions: regions (or frames) per sample, >= objects_per_image. feat_dim: feature size.
    n_classes, concepts_per_class: class pools (n_classes · concepts_per_class concepts).
    n_ood_classes: extra pools used only by the ood split (labels n_classes, n_classes + 1, …).
    objects_per_image: objects per sample (<= concepts_per_class). n_attributes: attribute count.
    concept_overlap in [0, 1]: chance an object comes from any class's pool instead of its own.
    noise_scale >= 0: norm of the Gaussian noise on each region/frame (prototypes have norm 1).
    attribute_scale >= 0: weight of the attribute vector in an object's feature.
    mention_prob, attribute_mention_prob in (0, 1]: how much of a sample a caption describes.
    second_language: also generate non-English captions (UML).
    noise_rate in [0, 1): share of training captions whose text belongs to another sample.
    noise_target: "second_language" (only the non-English caption is switched: UML's machine-
        translation noise) or "captions" (the whole text side is switched: noisy correspondence
        for single-language methods).
    corruption_ratio in [0, 1): corruption applied to the test and ood splits (TCL Fig. 5), see
        `corrupt_split`.
    """

    seed: int = 0
    n_train: int = 2000
    n_val: int = 200
    n_test: int = 500
    n_ood: int = 200
    captions_per_image: int = 5
    visual: str = "regions"
    n_regions: int = 12
    feat_dim: int = 64
    n_classes: int = 10
    concepts_per_class: int = 6
    n_ood_classes: int = 3
    objects_per_image: int = 3
    n_attributes: int = 8
    concept_overlap: float = 0.2
    noise_scale: float = 1.0
    attribute_scale: float = 0.6
    mention_prob: float = 0.85
    attribute_mention_prob: float = 0.8
    second_language: bool = True
    noise_rate: float = 0.0
    noise_target: str = "second_language"
    corruption_ratio: float = 0.0

    def __post_init__(self):
        def integer(name, lo):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")

        def real(name, lo, hi, hi_open):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
            if not (math.isfinite(v) and v >= lo and (v < hi if hi_open else v <= hi)):
                raise ValueError(f"{name} must lie in [{lo}, {hi}{')' if hi_open else ']'}, got {v}")

        integer("seed", 0)
        for name in ("n_train", "n_val", "n_test"):
            integer(name, 2)
        integer("n_ood", 0)
        for name in ("captions_per_image", "n_regions", "feat_dim", "objects_per_image", "n_attributes"):
            integer(name, 1)
        integer("n_classes", 2)
        integer("concepts_per_class", 1)
        integer("n_ood_classes", 1 if self.n_ood else 0)
        real("concept_overlap", 0.0, 1.0, False)
        real("noise_scale", 0.0, math.inf, True)
        real("attribute_scale", 0.0, math.inf, True)
        real("mention_prob", 0.0, 1.0, False)
        real("attribute_mention_prob", 0.0, 1.0, False)
        real("noise_rate", 0.0, 1.0, True)
        real("corruption_ratio", 0.0, 1.0, True)
        if self.mention_prob <= 0:
            raise ValueError("mention_prob must be > 0")
        if self.visual not in VISUALS:
            raise ValueError(f"visual must be one of {VISUALS}, got {self.visual!r}")
        if self.objects_per_image > self.concepts_per_class:
            raise ValueError(
                f"objects_per_image ({self.objects_per_image}) must be <= concepts_per_class "
                f"({self.concepts_per_class}) so a sample's objects can be distinct"
            )
        if self.visual != "global" and self.n_regions < self.objects_per_image:
            raise ValueError(
                f"n_regions ({self.n_regions}) must be >= objects_per_image ({self.objects_per_image})"
            )
        if not isinstance(self.second_language, bool):
            raise TypeError("second_language must be a bool")
        if self.noise_target not in NOISE_TARGETS:
            raise ValueError(f"noise_target must be one of {NOISE_TARGETS}, got {self.noise_target!r}")
        if self.noise_rate > 0 and self.noise_target == "second_language" and not self.second_language:
            raise ValueError(
                "noise_target='second_language' needs second_language=True; use noise_target='captions' "
                "for noisy correspondence of single-language data"
            )

    @property
    def n_concepts(self) -> int:
        return self.n_classes * self.concepts_per_class

    @property
    def n_ood_concepts(self) -> int:
        return self.n_ood_classes * self.concepts_per_class


@dataclass(frozen=True)
class _Lexicon:
    prototypes: np.ndarray  # (n_concepts + n_ood_concepts, F), unit rows
    attributes: np.ndarray  # (n_attributes, F), unit rows
    vocab: Vocabulary
    vocab_alt: Vocabulary | None
    alt_concept_tokens: tuple  # per concept: tuple of second-language words
    alt_attribute_words: tuple  # per attribute: its second-language word


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    v = rng.standard_normal((n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _lexicon(cfg: SyntheticConfig, rng: np.random.Generator) -> _Lexicon:
    n_all = cfg.n_concepts + cfg.n_ood_concepts
    prototypes = _unit_rows(rng, n_all, cfg.feat_dim)
    attributes = _unit_rows(rng, cfg.n_attributes, cfg.feat_dim)
    en_words = (
        sorted(set(_EN_DET + _EN_CONNECT + sum(_EN_PREFIX + _EN_SUFFIX, ())))
        + [f"obj{k}" for k in range(n_all)]
        + [f"attr{m}" for m in range(cfg.n_attributes)]
    )
    vocab = Vocabulary(SPECIALS + tuple(en_words))
    # Second language: a different word for every concept/attribute (a random relabelling, so
    # word ids carry no shared order), and compounds for some concepts.
    concept_perm = rng.permutation(n_all)
    attr_perm = rng.permutation(cfg.n_attributes)
    compound = rng.random(n_all) < _COMPOUND_PROB
    compound_part = rng.integers(0, len(_ALT_COMPOUND), n_all)
    alt_concepts = tuple(
        (f"ko{concept_perm[k]}", _ALT_COMPOUND[compound_part[k]])
        if compound[k]
        else (f"ko{concept_perm[k]}",)
        for k in range(n_all)
    )
    vocab_alt = None
    if cfg.second_language:
        alt_words = (
            sorted(set(_ALT_DET + _ALT_CONNECT + sum(_ALT_PREFIX + _ALT_SUFFIX, ()) + _ALT_COMPOUND))
            + [f"ko{j}" for j in range(n_all)]
            + [f"ta{j}" for j in range(cfg.n_attributes)]
        )
        vocab_alt = Vocabulary(SPECIALS + tuple(alt_words))
    alt_attributes = tuple(f"ta{attr_perm[m]}" for m in range(cfg.n_attributes))
    return _Lexicon(prototypes, attributes, vocab, vocab_alt, alt_concepts, alt_attributes)


def _sample_objects(cfg: SyntheticConfig, rng, labels: np.ndarray, ood: bool) -> np.ndarray:
    """(N, objects_per_image) distinct concept ids per sample."""
    n, o, p = labels.shape[0], cfg.objects_per_image, cfg.concepts_per_class
    objects = np.empty((n, o), dtype=np.int64)
    pool_start = labels * p  # ood labels continue after the in-distribution classes
    # One permutation of the own pool per sample gives distinct own-pool objects cheaply.
    own = pool_start[:, None] + np.argsort(rng.random((n, p)), axis=1)[:, :o]
    from_any = rng.random((n, o)) < (0.0 if ood else cfg.concept_overlap)
    anywhere = rng.integers(0, cfg.n_concepts, (n, o))
    for i in range(n):
        row = own[i].copy()
        for s in np.nonzero(from_any[i])[0]:
            if anywhere[i, s] not in row:
                row[s] = anywhere[i, s]
        objects[i] = row
    return objects


def _visual(cfg: SyntheticConfig, rng, lex: _Lexicon, objects: np.ndarray, attrs: np.ndarray) -> np.ndarray:
    n, o = objects.shape
    d, r = cfg.feat_dim, cfg.n_regions
    obj = lex.prototypes[objects] + cfg.attribute_scale * lex.attributes[attrs]  # (N, O, F)
    noise_std = cfg.noise_scale / math.sqrt(d)
    if cfg.visual == "global":
        g = obj.sum(1) / math.sqrt(o)
        return g + noise_std * rng.standard_normal((n, d))
    if cfg.visual == "regions":
        extra = r - o
        view_of = rng.integers(0, o, (n, extra))
        is_view = rng.random((n, extra)) < 0.5
        clutter = rng.standard_normal((n, extra, d))
        clutter /= np.linalg.norm(clutter, axis=2, keepdims=True)
        views = np.take_along_axis(obj, view_of[..., None], axis=1)
        regions = np.concatenate([obj, np.where(is_view[..., None], views, clutter)], axis=1)
        regions = regions + noise_std * rng.standard_normal((n, r, d))
        order = np.argsort(rng.random((n, r)), axis=1)
        return np.take_along_axis(regions, order[..., None], axis=1)
    # frames: objects occupy contiguous segments; cut points are o-1 distinct positions in 1..r-1.
    cuts = np.sort(np.argsort(rng.random((n, r - 1)), axis=1)[:, : o - 1] + 1, axis=1)
    t = np.arange(r)
    segment = (t[None, :, None] >= cuts[:, None, :]).sum(2)  # (N, T) object index of each frame
    frames = np.take_along_axis(obj, segment[..., None], axis=1)
    # AR(1) noise: consecutive frames of a clip are correlated, as real frame features are.
    rho = 0.5
    eps = rng.standard_normal((n, r, d))
    noise = np.empty_like(eps)
    noise[:, 0] = eps[:, 0]
    for k in range(1, r):
        noise[:, k] = rho * noise[:, k - 1] + math.sqrt(1 - rho * rho) * eps[:, k]
    return frames + noise_std * noise


def _captions(cfg: SyntheticConfig, rng, lex: _Lexicon, objects: np.ndarray, attrs: np.ndarray):
    """Token-id lists in both languages for the N·c captions (c consecutive per sample)."""
    n, o = objects.shape
    c = cfg.captions_per_image
    m = n * c
    owner = np.repeat(np.arange(n), c)
    mention = rng.random((m, o)) < cfg.mention_prob
    u_order = rng.random((m, o))
    none = ~mention.any(1)
    mention[none, np.argmin(u_order[none], axis=1)] = True  # every caption names an object
    say_attr = rng.random((m, o)) < cfg.attribute_mention_prob
    connect = rng.integers(0, len(_EN_CONNECT), (m, o))
    det = rng.integers(0, len(_EN_DET), m)
    prefix = rng.integers(0, len(_EN_PREFIX), m)
    suffix = rng.integers(0, len(_EN_SUFFIX), m)
    order = np.argsort(u_order, axis=1)

    # Ids looked up once per word type; the per-caption loop then only concatenates int lists.
    ev, av = lex.vocab.encode, lex.vocab_alt.encode if lex.vocab_alt is not None else None
    n_all = lex.prototypes.shape[0]
    en_det, en_con = [ev([w]) for w in _EN_DET], [ev([w]) for w in _EN_CONNECT]
    en_pre, en_suf = [ev(p) for p in _EN_PREFIX], [ev(p) for p in _EN_SUFFIX]
    en_obj = [ev([f"obj{k}"]) for k in range(n_all)]
    en_att = [ev([f"attr{a}"]) for a in range(cfg.n_attributes)]
    if av is not None:
        alt_det, alt_con = [av([w]) for w in _ALT_DET], [av([w]) for w in _ALT_CONNECT]
        alt_pre, alt_suf = [av(p) for p in _ALT_PREFIX], [av(p) for p in _ALT_SUFFIX]
        alt_obj = [av(t) for t in lex.alt_concept_tokens]
        alt_att = [av([w]) for w in lex.alt_attribute_words]
    en, alt = [], []
    for j in range(m):
        i = owner[j]
        slots = [s for s in order[j] if mention[j, s]]
        words = en_pre[prefix[j]] + en_det[det[j]]
        alt_words = alt_pre[prefix[j]] + alt_det[det[j]] if av is not None else None
        for k, s in enumerate(slots):
            concept, attribute, say = objects[i, s], attrs[i, s], say_attr[j, s]
            if k:
                words = words + en_con[connect[j, k]]
            words = words + (en_att[attribute] + en_obj[concept] if say else en_obj[concept])
            if av is not None:
                if k:
                    alt_words = alt_words + alt_con[connect[j, k]]
                # Noun before adjective in the second language: a different word order to learn.
                alt_words = alt_words + (alt_obj[concept] + alt_att[attribute] if say else alt_obj[concept])
        en.append(words + en_suf[suffix[j]])
        if av is not None:
            alt.append(alt_words + alt_suf[suffix[j]])
    return en, (alt if av is not None else None)


def _pad(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    return pad_token_lists(seqs)


def _apply_noise(cfg: SyntheticConfig, rng, n: int, en: list, alt: list | None):
    """Switch a noise_rate share of the captions to another sample's caption (training only).

    Each chosen caption j (annotated with sample j // c) receives a clean caption of a uniformly
    drawn *different* sample, so every flagged pair is truly mismatched (a plain shuffle could
    return a caption to its own sample and silently lower the real noise rate).
    """
    c = cfg.captions_per_image
    m = n * c
    noisy = np.zeros(m, dtype=bool)
    source = np.repeat(np.arange(n), c)
    k = int(round(cfg.noise_rate * m))
    if k == 0:
        return noisy, source, en, alt
    chosen = rng.choice(m, size=k, replace=False)
    src_img = (source[chosen] + rng.integers(1, n, k)) % n
    src_cap = src_img * c + rng.integers(0, c, k)
    clean_en, clean_alt = list(en), (list(alt) if alt is not None else None)
    en, alt = list(en), (list(alt) if alt is not None else None)
    for j, sc in zip(chosen, src_cap, strict=True):
        if cfg.noise_target == "captions":
            en[j] = clean_en[sc]
        if alt is not None:
            alt[j] = clean_alt[sc]
    noisy[chosen] = True
    source[chosen] = src_img
    return noisy, source, en, alt


def _make_split(cfg, name, n, rng, noise_rng, lex, ood: bool) -> CrossModalSplit:
    if ood:
        labels = cfg.n_classes + rng.integers(0, cfg.n_ood_classes, n)
    else:
        labels = rng.integers(0, cfg.n_classes, n)
    objects = _sample_objects(cfg, rng, labels, ood)
    attrs = rng.integers(0, cfg.n_attributes, objects.shape)
    images = _visual(cfg, rng, lex, objects, attrs)
    en, alt = _captions(cfg, rng, lex, objects, attrs)
    noisy = source = None
    if noise_rng is not None and cfg.noise_rate > 0:
        noisy, source, en, alt = _apply_noise(cfg, noise_rng, n, en, alt)
        noisy, source = torch.from_numpy(noisy), torch.from_numpy(source)
    captions, lengths = _pad(en)
    captions_alt, lengths_alt = _pad(alt) if alt is not None else (None, None)
    return CrossModalSplit(
        name=name,
        images=torch.from_numpy(images.astype(np.float32)),
        captions=captions,
        lengths=lengths,
        captions_per_image=cfg.captions_per_image,
        labels=torch.from_numpy(labels.astype(np.int64)),
        captions_alt=captions_alt,
        lengths_alt=lengths_alt,
        noisy=noisy,
        caption_source=source,
        concepts=torch.from_numpy(objects),
        visual=cfg.visual,
    )


def make_synthetic_benchmark(config: SyntheticConfig | None = None, **overrides) -> CrossModalBenchmark:
    """Generate the synthetic benchmark (splits train, val, test and, if n_ood > 0, ood).

    `make_synthetic_benchmark(seed=1, noise_rate=0.4)` or `make_synthetic_benchmark(cfg)`; the
    keyword arguments are `SyntheticConfig`'s fields. Deterministic: the same configuration gives
    bit-identical tensors on every platform (numpy's PCG64 streams, float64 then cast to float32).

    Shapes (N samples of a split, c = captions_per_image): images (N, n_regions, feat_dim) for
    "regions"/"frames" or (N, feat_dim) for "global", float32; captions (N·c, L) int64 padded with
    0; labels (N,) in [0, n_classes) (ood: in [n_classes, n_classes + n_ood_classes)); noisy (N·c,)
    bool, only the train split can have True entries; concepts (N, objects_per_image).
    """
    if config is None:
        config = SyntheticConfig(**overrides)
    elif not isinstance(config, SyntheticConfig):
        raise TypeError(f"config must be a SyntheticConfig, got {type(config).__name__}")
    elif overrides:
        config = replace(config, **overrides)
    cfg = config
    children = np.random.SeedSequence(cfg.seed).spawn(len(_CHILD))
    lex = _lexicon(cfg, np.random.default_rng(children[_CHILD["lexicon"]]))
    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test, "ood": cfg.n_ood}
    splits = {}
    for name, n in sizes.items():
        if n == 0:
            continue
        rng = np.random.default_rng(children[_CHILD[name]])
        # Noisy correspondence is a property of collected training pairs; evaluation stays clean.
        noise_rng = np.random.default_rng(children[_CHILD["noise"]]) if name == "train" else None
        splits[name] = _make_split(cfg, name, n, rng, noise_rng, lex, ood=(name == "ood"))
    if cfg.corruption_ratio > 0:
        for k, name in enumerate(n for n in ("test", "ood") if n in splits):
            splits[name] = corrupt_split(
                splits[name],
                cfg.corruption_ratio,
                vocab=lex.vocab,
                vocab_alt=lex.vocab_alt,
                seed=int(children[_CHILD["corrupt"]].generate_state(1)[0]) + k,
            )
    info = asdict(cfg)
    info["source"] = "synthetic"
    info["ood_labels"] = list(range(cfg.n_classes, cfg.n_classes + cfg.n_ood_classes)) if cfg.n_ood else []
    return CrossModalBenchmark(splits=splits, vocab=lex.vocab, vocab_alt=lex.vocab_alt, info=info)


# ----------------------------------------------------------------------------------------------
# corruption (TCL Fig. 5 / TcVSE Fig. 3)
# ----------------------------------------------------------------------------------------------
def _counts(rng, ratio: float, sizes: np.ndarray) -> np.ndarray:
    """floor(ratio·size) plus one with probability frac(ratio·size): exact in expectation."""
    target = ratio * sizes
    base = np.floor(target)
    return (base + (rng.random(sizes.shape) < (target - base))).astype(np.int64)


def _corrupt_tokens(rng, ratio: float, caps: Tensor, lens: Tensor, vocab_size: int):
    n_special = len(SPECIALS)
    if vocab_size <= n_special + 1:
        raise ValueError(
            f"vocab must have at least two ordinary words to replace words, got size {vocab_size}"
        )
    lengths = lens.numpy()
    n_change = _counts(rng, ratio, lengths)
    stats = {"masked": 0, "replaced": 0, "deleted": 0, "total": int(lengths.sum())}
    out = []
    for j in range(caps.shape[0]):
        tokens = caps[j, : lengths[j]].tolist()
        k = int(n_change[j])
        if k == 0:
            out.append(tokens)
            continue
        positions = rng.choice(lengths[j], size=k, replace=False)
        ops = rng.integers(0, 3, k)  # 0 mask, 1 replace, 2 delete: equally likely (TCL §4.4)
        if (ops == 2).all() and k == lengths[j]:
            ops[0] = 0  # keep at least one token: an empty caption has no representation
        delete = np.zeros(lengths[j], dtype=bool)
        for p, op in zip(positions, ops, strict=True):
            if op == 0:
                tokens[p] = MASK_ID
            elif op == 1:
                # Draw from the ordinary words other than the current one, so a replacement
                # always changes the word and the ratio is exact.
                w = int(rng.integers(n_special, vocab_size - 1))
                tokens[p] = w + 1 if w >= tokens[p] and tokens[p] >= n_special else w
            else:
                delete[p] = True
        stats["masked"] += int((ops == 0).sum())
        stats["replaced"] += int((ops == 1).sum())
        stats["deleted"] += int((ops == 2).sum())
        out.append([t for t, d in zip(tokens, delete, strict=True) if not d])
    padded, new_lengths = _pad(out)
    return padded, new_lengths, stats


def corrupt_split(
    split: CrossModalSplit,
    ratio: float,
    *,
    vocab: Vocabulary | int,
    vocab_alt: Vocabulary | int | None = None,
    seed: int = 0,
    return_stats: bool = False,
):
    """Corrupt a split in the proportion `ratio` (TCL §4.4 Fig. 5, "corruption ratio").

    Visual: in each sample, floor(ratio·R) regions (or frames; feature dimensions for "global"
    features) plus one more with probability frac(ratio·R) are masked, i.e. set to zero, so the
    masked share equals ratio in expectation. Text: in each caption the same count rule picks
    positions, and each picked word is masked (<mask>), replaced (by a different ordinary word,
    uniformly) or deleted, with probability 1/3 each; at least one token always remains.
    Both languages are corrupted. vocab / vocab_alt: the Vocabulary (or its size) of each language.

    Returns the corrupted split (labels, noisy mask, concepts unchanged); with return_stats also a
    dict {"regions": {"masked", "total"}, "en": {"masked", "replaced", "deleted", "total"},
    "alt": {...} (if present)}.
    """
    if not isinstance(split, CrossModalSplit):
        raise TypeError(f"split must be a CrossModalSplit, got {type(split).__name__}")
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not (0.0 <= ratio < 1.0):
        raise ValueError(f"ratio must be a real number in [0, 1), got {ratio!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")

    def size(v, name):
        if isinstance(v, Vocabulary):
            return len(v)
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return int(v)
        raise TypeError(f"{name} must be a Vocabulary or its size, got {type(v).__name__}")

    vocab_size = size(vocab, "vocab")
    if split.has_alt and vocab_alt is None:
        raise ValueError("vocab_alt is required: the split has second-language captions")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xC0]))

    images = split.images.clone()
    units = images.shape[1]  # regions, frames, or feature dimensions of global vectors
    n_mask = _counts(rng, float(ratio), np.full(images.shape[0], units))
    ranks = np.argsort(np.argsort(rng.random((images.shape[0], units)), axis=1), axis=1)
    masked = torch.from_numpy(ranks < n_mask[:, None])
    if images.dim() == 3:
        images[masked] = 0.0
    else:
        images = images.masked_fill(masked, 0.0)
    stats = {"regions": {"masked": int(masked.sum()), "total": masked.numel()}}

    captions, lengths, stats["en"] = _corrupt_tokens(
        rng, float(ratio), split.captions, split.lengths, vocab_size
    )
    captions_alt = lengths_alt = None
    if split.has_alt:
        captions_alt, lengths_alt, stats["alt"] = _corrupt_tokens(
            rng, float(ratio), split.captions_alt, split.lengths_alt, size(vocab_alt, "vocab_alt")
        )
    out = replace(
        split,
        images=images,
        captions=captions,
        lengths=lengths,
        captions_alt=captions_alt,
        lengths_alt=lengths_alt,
    )
    return (out, stats) if return_stats else out
