"""evidential_ops.data: the synthetic benchmark (determinism, shapes, noisy correspondence,
corruption ratio, OOD, learnability), the precomputed-feature loader and the torch helpers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from evidential_ops import data as D
from evidential_ops.metrics import map_at_all, retrieval_metrics

SMALL = dict(n_train=300, n_val=20, n_test=100, n_ood=40)


@pytest.fixture(scope="module")
def bench():
    return D.make_synthetic_benchmark(seed=3, **SMALL)


def _tensors(split):
    return {
        f.name: getattr(split, f.name)
        for f in dataclasses.fields(split)
        if isinstance(getattr(split, f.name), torch.Tensor)
    }


# ----------------------------------------------------------------------------------------------
# determinism
# ----------------------------------------------------------------------------------------------
def test_same_seed_identical_different_seed_different(bench):
    again = D.make_synthetic_benchmark(seed=3, **SMALL)
    assert again.vocab == bench.vocab and again.vocab_alt == bench.vocab_alt
    for name in ("train", "val", "test", "ood"):
        a, b = _tensors(bench[name]), _tensors(again[name])
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    other = D.make_synthetic_benchmark(seed=4, **SMALL)
    assert not torch.equal(other.train.images, bench.train.images)
    assert not torch.equal(other.test.labels, bench.test.labels)
    assert other.train.captions.shape != bench.train.captions.shape or not torch.equal(
        other.train.captions, bench.train.captions
    )


def test_split_streams_are_independent(bench):
    # More training data must not change the evaluation splits (each split has its own stream).
    bigger = D.make_synthetic_benchmark(seed=3, **{**SMALL, "n_train": 350})
    for key, t in _tensors(bench.test).items():
        assert torch.equal(t, _tensors(bigger.test)[key]), key
    assert torch.equal(bigger.ood.images, bench.ood.images)


# ----------------------------------------------------------------------------------------------
# shapes and dtypes
# ----------------------------------------------------------------------------------------------
def test_shapes_dtypes_and_padding(bench):
    cfg = D.SyntheticConfig()
    tr = bench.train
    assert tr.images.shape == (300, cfg.n_regions, cfg.feat_dim) and tr.images.dtype == torch.float32
    assert tr.captions.dtype == torch.int64 and tr.captions.shape[0] == 300 * 5
    assert tr.lengths.dtype == torch.int64 and tr.lengths.shape == (1500,)
    assert tr.captions_per_image == 5 and tr.caption_image.tolist()[:7] == [0, 0, 0, 0, 0, 1, 1]
    for caps, lens in ((tr.captions, tr.lengths), (tr.captions_alt, tr.lengths_alt)):
        pos = torch.arange(caps.shape[1])[None, :]
        inside = pos < lens[:, None]
        assert (caps[~inside] == D.PAD_ID).all() and (caps[inside] > D.MASK_ID).all()
        assert int(lens.max()) == caps.shape[1] and int(lens.min()) >= 2
        assert lens.unique().numel() > 3  # variable length
    assert int(tr.captions.max()) < len(bench.vocab) and int(tr.captions_alt.max()) < len(bench.vocab_alt)
    assert tr.labels.dtype == torch.int64 and set(tr.labels.tolist()) <= set(range(cfg.n_classes))
    assert tr.noisy.dtype == torch.bool and not tr.noisy.any()
    assert torch.equal(tr.caption_source, tr.caption_image)
    assert tr.concepts.shape == (300, cfg.objects_per_image)
    assert bench.vocab.words[:3] == D.SPECIALS
    # The two languages have different vocabularies (no shared non-special word).
    assert not (set(bench.vocab.words[3:]) & set(bench.vocab_alt.words[3:]))


def test_visual_variants_and_single_language():
    frames = D.make_synthetic_benchmark(
        visual="frames",
        n_regions=10,
        n_ood=0,
        second_language=False,
        **{k: SMALL[k] for k in ("n_train", "n_val", "n_test")},
    )
    assert frames.train.images.shape == (300, 10, 64) and frames.train.visual == "frames"
    assert "ood" not in frames and frames.vocab_alt is None and frames.train.captions_alt is None
    # Frames have temporal structure: neighbouring frames are more alike than distant ones.
    im = F.normalize(frames.train.images, dim=2)
    near = (im[:, :-1] * im[:, 1:]).sum(2).mean()
    far = (im[:, 0] * im[:, -1]).sum(1).mean()
    assert near > far + 0.1
    glob = D.make_synthetic_benchmark(visual="global", feat_dim=32, n_train=50, n_val=5, n_test=10, n_ood=5)
    assert glob.train.images.shape == (50, 32) and glob.train.visual == "global"
    one = D.make_synthetic_benchmark(captions_per_image=1, n_train=50, n_val=5, n_test=10, n_ood=5)
    assert one.train.captions.shape[0] == 50


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="noise_rate"):
        D.make_synthetic_benchmark(noise_rate=1.0)
    with pytest.raises(ValueError, match="noise_target"):
        D.make_synthetic_benchmark(noise_target="images")
    with pytest.raises(ValueError, match="second_language"):
        D.make_synthetic_benchmark(noise_rate=0.2, second_language=False)
    with pytest.raises(ValueError, match="objects_per_image"):
        D.make_synthetic_benchmark(objects_per_image=7)
    with pytest.raises(TypeError, match="n_train"):
        D.make_synthetic_benchmark(n_train=10.0)
    with pytest.raises(ValueError, match="visual"):
        D.make_synthetic_benchmark(visual="pixels")
    with pytest.raises(ValueError, match="corruption_ratio"):
        D.make_synthetic_benchmark(corruption_ratio=-0.1)
    with pytest.raises(TypeError, match="config"):
        D.make_synthetic_benchmark({"seed": 1})


# ----------------------------------------------------------------------------------------------
# noisy correspondence
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["second_language", "captions"])
def test_noisy_correspondence_mask_and_rate(bench, target):
    noisy = D.make_synthetic_benchmark(seed=3, noise_rate=0.4, noise_target=target, **SMALL)
    tr, clean = noisy.train, bench.train
    mask = tr.noisy
    assert int(mask.sum()) == round(0.4 * 1500)
    assert (tr.caption_source[mask] != tr.caption_image[mask]).all()
    assert torch.equal(tr.caption_source[~mask], tr.caption_image[~mask])
    assert torch.equal(tr.images, clean.images) and torch.equal(tr.labels, clean.labels)
    # Every switched caption is a clean caption of its source sample.
    c = tr.captions_per_image
    for lang in ("alt", "en") if target == "captions" else ("alt",):
        for j in torch.nonzero(mask).flatten()[:50].tolist():
            src = int(tr.caption_source[j])
            options = [clean.tokens(src * c + r, lang).tolist() for r in range(c)]
            assert tr.tokens(j, lang).tolist() in options
    # Untouched text is identical to the clean data.
    for j in torch.nonzero(~mask).flatten()[:50].tolist():
        assert torch.equal(tr.tokens(j, "alt"), clean.tokens(j, "alt"))
    if target == "second_language":
        assert all(torch.equal(tr.tokens(j), clean.tokens(j)) for j in range(0, 1500, 7))
    # Evaluation splits stay clean.
    for name in ("val", "test", "ood"):
        assert not noisy[name].noisy.any()
        assert torch.equal(noisy[name].captions, bench[name].captions)


# ----------------------------------------------------------------------------------------------
# corruption ratio (TCL Fig. 5)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.3, 0.6])
def test_corruption_ratio_proportions(bench, ratio):
    te = bench.test
    out, stats = D.corrupt_split(
        te, ratio, vocab=bench.vocab, vocab_alt=bench.vocab_alt, seed=1, return_stats=True
    )
    # Regions: the masked share is the ratio (floor + Bernoulli remainder per sample).
    zero_rows = (out.images == 0).all(2)
    assert int(zero_rows.sum()) == stats["regions"]["masked"]
    assert stats["regions"]["masked"] / stats["regions"]["total"] == pytest.approx(ratio, abs=0.02)
    per_sample = zero_rows.sum(1)
    assert per_sample.min() >= int(ratio * 12) and per_sample.max() <= int(ratio * 12) + 1
    for lang, lens_in in (("en", te.lengths), ("alt", te.lengths_alt)):
        st = stats[lang]
        changed = st["masked"] + st["replaced"] + st["deleted"]
        assert st["total"] == int(lens_in.sum())
        assert changed / st["total"] == pytest.approx(ratio, abs=0.02)
        for op in ("masked", "replaced", "deleted"):  # the three operations equally likely
            assert st[op] / changed == pytest.approx(1 / 3, abs=0.04)
        caps, lens = out.caption_tensors(lang)
        assert int((lens_in - lens).sum()) == st["deleted"]
        assert int((caps == D.MASK_ID).sum()) == st["masked"]
        assert int(lens.min()) >= 1
    # Labels and pairing are untouched; a different seed corrupts differently.
    assert torch.equal(out.labels, te.labels) and torch.equal(out.noisy, te.noisy)
    other = D.corrupt_split(te, ratio, vocab=bench.vocab, vocab_alt=bench.vocab_alt, seed=2)
    assert not torch.equal(other.images, out.images)


def test_corruption_in_generator_hits_eval_splits_only(bench):
    corrupted = D.make_synthetic_benchmark(seed=3, corruption_ratio=0.3, **SMALL)
    assert torch.equal(corrupted.train.images, bench.train.images)
    assert torch.equal(corrupted.val.captions, bench.val.captions)
    for name in ("test", "ood"):
        share = (corrupted[name].images == 0).all(2).float().mean().item()
        assert share == pytest.approx(0.3, abs=0.03)
    with pytest.raises(ValueError, match="vocab_alt"):
        D.corrupt_split(bench.test, 0.3, vocab=bench.vocab)
    with pytest.raises(ValueError, match="ratio"):
        D.corrupt_split(bench.test, 1.0, vocab=bench.vocab, vocab_alt=bench.vocab_alt)


# ----------------------------------------------------------------------------------------------
# out-of-distribution samples (FUME Fig. 4)
# ----------------------------------------------------------------------------------------------
def test_ood_concepts_disjoint_from_training(bench):
    cfg = D.SyntheticConfig()
    seen = set(bench.train.concepts.flatten().tolist()) | set(bench.test.concepts.flatten().tolist())
    ood = set(bench.ood.concepts.flatten().tolist())
    assert not (seen & ood)
    assert max(seen) < cfg.n_concepts <= min(ood)
    assert set(bench.ood.labels.tolist()) <= set(bench.info["ood_labels"])
    assert min(bench.ood.labels.tolist()) >= cfg.n_classes
    # No OOD concept word appears in any training caption.
    ood_words = {bench.vocab.encode([f"obj{k}"])[0] for k in ood}
    assert not (set(bench.train.captions.unique().tolist()) & ood_words)


# ----------------------------------------------------------------------------------------------
# learnability: closed-form ridge probes, far above chance
# ----------------------------------------------------------------------------------------------
def _pooled(split):
    im = split.images.double()
    return torch.cat([im.mean(1), im.amax(1)], 1)


def _bag_of_words(split, vocab_size, lang="en"):
    caps, _ = split.caption_tensors(lang)
    bag = torch.zeros(caps.shape[0], vocab_size, dtype=torch.float64)
    bag.scatter_add_(1, caps, torch.ones_like(caps, dtype=torch.float64))
    bag[:, :3] = 0  # specials carry no content
    return bag


def _ridge(x, y, lam=1.0):
    mx, my = x.mean(0), y.mean(0)
    xc = x - mx
    w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(x.shape[1], dtype=x.dtype), xc.T @ (y - my))
    return lambda z: (z - mx) @ w, my


@pytest.mark.parametrize("lang", ["en", "alt"])
def test_learnable_by_linear_probe(lang):
    bench = D.make_synthetic_benchmark(seed=0, n_train=1000, n_val=10, n_test=200, n_ood=10)
    tr, te = bench.train, bench.test
    v = len(bench.vocab if lang == "en" else bench.vocab_alt)
    project, mean_bag = _ridge(_pooled(tr).repeat_interleave(5, 0), _bag_of_words(tr, v, lang))
    sims = (
        F.normalize(project(_pooled(te)), dim=1) @ F.normalize(_bag_of_words(te, v, lang) - mean_bag, dim=1).T
    )
    m = retrieval_metrics(sims, 5)
    # Chance: R@1 = 0.5 % (200 images), rSum ≈ 9.
    assert m["i2t_r1"] > 30 and m["t2i_r1"] > 20 and m["rsum"] > 300
    # Class labels are recoverable too (chance 10 %), and label-based mAP is far above chance.
    classify, _ = _ridge(_pooled(tr), F.one_hot(tr.labels).double())
    assert (classify(_pooled(te)).argmax(1) == te.labels).double().mean() > 0.6
    z = F.normalize(classify(_pooled(te)), dim=1)
    assert map_at_all(z @ z.T, te.labels, te.labels) > 0.4


def test_difficulty_is_controllable():
    def probe_r1(**kw):
        b = D.make_synthetic_benchmark(
            seed=0, n_train=600, n_val=10, n_test=150, n_ood=0, second_language=False, **kw
        )
        project, mean_bag = _ridge(
            _pooled(b.train).repeat_interleave(5, 0), _bag_of_words(b.train, len(b.vocab))
        )
        sims = (
            F.normalize(project(_pooled(b.test)), dim=1)
            @ F.normalize(_bag_of_words(b.test, len(b.vocab)) - mean_bag, dim=1).T
        )
        return retrieval_metrics(sims, 5)["rsum"]

    assert probe_r1(noise_scale=0.3) > probe_r1(noise_scale=1.0) + 30 > probe_r1(noise_scale=2.5) + 60


# ----------------------------------------------------------------------------------------------
# torch Dataset / collate
# ----------------------------------------------------------------------------------------------
def test_pairs_dataset_and_collate(bench):
    ds = D.CrossModalPairs(bench.train, languages=("en", "alt"))
    assert len(ds) == 1500
    item = ds[7]
    assert item["image_index"] == 1 and item["caption_index"] == 7
    assert torch.equal(item["caption"], bench.train.tokens(7)) and torch.equal(
        item["caption_alt"], bench.train.tokens(7, "alt")
    )
    batch = next(iter(DataLoader(ds, batch_size=16, shuffle=False, collate_fn=D.collate_pairs)))
    assert batch["images"].shape == (16, 12, 64) and batch["images"].dtype == torch.float32
    assert batch["captions"].shape == (16, int(batch["lengths"].max()))
    assert batch["captions_alt"].shape[0] == 16 and batch["lengths_alt"].shape == (16,)
    assert batch["image_index"].tolist() == [j // 5 for j in range(16)]
    assert torch.equal(batch["labels"], bench.train.labels[batch["image_index"]])
    assert batch["noisy"].dtype == torch.bool
    for k in range(16):
        assert torch.equal(batch["captions"][k, : batch["lengths"][k]], bench.train.tokens(k))
        assert (batch["captions"][k, batch["lengths"][k] :] == D.PAD_ID).all()


def test_image_mode_one_caption_per_sample_per_epoch(bench):
    ds = D.CrossModalPairs(bench.train, mode="images", seed=5)
    assert len(ds) == 300
    loader = DataLoader(
        ds,
        batch_size=64,
        shuffle=True,
        collate_fn=D.collate_pairs,
        generator=torch.Generator().manual_seed(0),
    )
    for batch in loader:
        assert batch["image_index"].unique().numel() == batch["image_index"].numel()
        assert torch.equal(batch["caption_index"] // 5, batch["image_index"])
    first = [ds[i]["caption_index"] for i in range(300)]
    ds.set_epoch(1)
    second = [ds[i]["caption_index"] for i in range(300)]
    assert first != second
    ds.set_epoch(0)
    assert [ds[i]["caption_index"] for i in range(300)] == first  # deterministic in (seed, epoch)


def test_eval_batches_cover_split_in_order(bench):
    imgs = list(D.eval_batches(bench.test, 32))
    assert torch.equal(torch.cat([b["images"] for b in imgs]), bench.test.images)
    caps = list(D.eval_batches(bench.test, 64, what="captions", language="alt"))
    assert torch.equal(torch.cat([b["index"] for b in caps]), torch.arange(500))
    for b in caps:
        assert b["captions"].shape[1] == int(b["lengths"].max())


def test_torch_helpers_validation(bench):
    with pytest.raises(ValueError, match="languages"):
        D.CrossModalPairs(bench.train, languages=("de",))
    with pytest.raises(ValueError, match="mode"):
        D.CrossModalPairs(bench.train, mode="pairs")
    single = D.make_synthetic_benchmark(second_language=False, n_train=20, n_val=5, n_test=5, n_ood=0)
    with pytest.raises(ValueError, match="alt"):
        D.CrossModalPairs(single.train, languages=("en", "alt"))
    with pytest.raises(ValueError, match="batch_size"):
        next(D.eval_batches(bench.test, 0))
    with pytest.raises(ValueError, match="what"):
        next(D.eval_batches(bench.test, 4, what="videos"))
    with pytest.raises(ValueError, match="seqs"):
        D.pad_sequences([])


# ----------------------------------------------------------------------------------------------
# precomputed-feature loader
# ----------------------------------------------------------------------------------------------
def _write_fixture(root, *, n=(4, 2, 3), regions=True):
    rng = np.random.default_rng(0)
    words = ["A", "dog", "runs", "on", "grass", "the", "cat", "sleeps"]
    for prefix, count in zip(("train", "dev", "test"), n, strict=True):
        shape = (count, 5, 6) if regions else (count, 6)
        np.save(root / f"{prefix}_ims.npy", rng.standard_normal(shape).astype(np.float32))
        lines = [" ".join(rng.choice(words, size=rng.integers(2, 6))) for _ in range(5 * count)]
        if prefix == "test":
            lines[0] = "zebra unseen words"
        (root / f"{prefix}_caps.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return words


def test_loader_reads_layout(tmp_path):
    _write_fixture(tmp_path)
    bench = D.load_precomputed(tmp_path)
    assert sorted(bench.splits) == ["test", "train", "val"]
    tr = bench.train
    assert tr.images.shape == (4, 5, 6) and tr.images.dtype == torch.float32
    assert torch.equal(tr.images, torch.from_numpy(np.load(tmp_path / "train_ims.npy")))
    assert tr.captions.shape[0] == 20 and tr.captions_per_image == 5 and tr.labels is None
    lines = (tmp_path / "train_caps.txt").read_text().splitlines()
    for j, line in enumerate(lines):
        assert bench.vocab.decode(tr.tokens(j).tolist()) == line.lower().split()
    # The vocabulary comes from training captions: test-only words are <unk>.
    assert bench.test.tokens(0).tolist() == [D.UNK_ID] * 3
    assert "a" in bench.vocab.words and "A" not in bench.vocab.words  # lower-cased
    assert bench.val.images.shape == (2, 5, 6) and bench.val.name == "val"


def test_loader_roundtrip_of_synthetic_benchmark(tmp_path, bench):
    mapping = D.save_precomputed(bench, tmp_path)
    assert mapping["val"] == "dev" and (tmp_path / "ood_caps_alt.txt").is_file()
    loaded = D.load_precomputed(tmp_path, splits=mapping, alt_language="alt", mmap=False)
    for name in bench.splits:
        a, b = bench[name], loaded[name]
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        for lang, va, vb in (("en", bench.vocab, loaded.vocab), ("alt", bench.vocab_alt, loaded.vocab_alt)):
            for j in range(0, a.n_captions, 11):
                words = va.decode(a.tokens(j, lang).tolist())
                if name == "train":
                    assert vb.decode(b.tokens(j, lang).tolist()) == words
                else:  # words unseen in training map to <unk>
                    assert vb.decode(b.tokens(j, lang).tolist()) == [
                        w if w in vb.words else "<unk>" for w in words
                    ]


def test_loader_global_features_labels_and_vocab(tmp_path):
    _write_fixture(tmp_path, regions=False)
    np.save(tmp_path / "train_labels.npy", np.array([0, 1, 1, 2]))
    bench = D.load_precomputed(tmp_path, splits={"train": "train", "test": "test"}, min_count=2)
    assert bench.train.images.shape == (4, 6) and bench.train.visual == "global"
    assert bench.train.labels.tolist() == [0, 1, 1, 2] and bench.test.labels is None
    test_only = D.load_precomputed(tmp_path, splits=["test"], vocab=bench.vocab)
    assert test_only.vocab is bench.vocab and sorted(test_only.splits) == ["test"]


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        D.load_precomputed(tmp_path / "nope")
    _write_fixture(tmp_path)
    (tmp_path / "dev_caps.txt").unlink()
    with pytest.raises(FileNotFoundError, match="dev_caps.txt"):
        D.load_precomputed(tmp_path)
    with pytest.raises(FileNotFoundError, match="train_caps_de.txt"):
        D.load_precomputed(tmp_path, splits=["train", "test"], alt_language="de")
    lines = (tmp_path / "train_caps.txt").read_text().splitlines()
    (tmp_path / "train_caps.txt").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="19 captions.*4 images"):
        D.load_precomputed(tmp_path, splits=["train"])
    (tmp_path / "train_caps.txt").write_text("\n".join(lines[:3] + ["  "] + lines[4:]) + "\n")
    with pytest.raises(ValueError, match="line 4 is empty"):
        D.load_precomputed(tmp_path, splits=["train"])
    (tmp_path / "train_caps.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="captions_per_image"):
        D.load_precomputed(tmp_path, splits=["train"], captions_per_image=4)
    with pytest.raises(ValueError, match="'train'"):
        D.load_precomputed(tmp_path, splits=["test"])
    np.save(tmp_path / "test_ims.npy", np.zeros((3, 2, 5, 6), dtype=np.float32))
    with pytest.raises(ValueError, match="test_ims.npy"):
        D.load_precomputed(tmp_path, splits=["train", "test"])
    np.save(tmp_path / "test_ims.npy", np.zeros((3, 6), dtype=np.int32))
    with pytest.raises(ValueError, match="float"):
        D.load_precomputed(tmp_path, splits=["train", "test"])
    np.save(tmp_path / "train_labels.npy", np.array([0, 1]))
    with pytest.raises(ValueError, match="train_labels.npy"):
        D.load_precomputed(tmp_path, splits=["train"])
    with pytest.raises(TypeError, match="splits"):
        D.load_precomputed(tmp_path, splits=3)
