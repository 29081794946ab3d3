"""evidential_ops.metrics (SPEC §4; FUME Table 1 / eq. 11 / Fig. 3): hand-computed cases, a
brute-force Python-loop reference on random inputs (with ties), and the opinion helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import evidential_ops as eo
from evidential_ops import metrics as M


# ----------------------------------------------------------------------------------------------
# brute-force references: explicit sorted lists, one query at a time
# ----------------------------------------------------------------------------------------------
def _ranked(scores, relevant, ties):
    """Gallery indices in ranked order; ties put irrelevant first (pessimistic) or last."""
    key = (
        (lambda j: (-scores[j], relevant[j]))
        if ties == "pessimistic"
        else (lambda j: (-scores[j], not relevant[j]))
    )
    return sorted(range(len(scores)), key=key)


def brute_ranks(sims, cpi, ties="pessimistic"):
    s = sims.tolist()
    n_img, n_cap = len(s), len(s[0])
    i2t = []
    for i in range(n_img):
        rel = [j // cpi == i for j in range(n_cap)]
        order = _ranked(s[i], rel, ties)
        i2t.append(next(p for p, j in enumerate(order) if rel[j]) + 1)
    t2i = []
    for j in range(n_cap):
        col = [s[i][j] for i in range(n_img)]
        rel = [i == j // cpi for i in range(n_img)]
        order = _ranked(col, rel, ties)
        t2i.append(order.index(j // cpi) + 1)
    return i2t, t2i


def brute_ap(scores, relevant, keep=None, ties="pessimistic"):
    """(AP or None when no retained relevant item, number of retained results)."""
    keep = keep if keep is not None else [True] * len(scores)
    order = [j for j in _ranked(scores, relevant, ties) if keep[j]]
    hits, total = 0, 0.0
    for p, j in enumerate(order, start=1):
        if relevant[j]:
            hits += 1
            total += hits / p
    return (total / hits if hits else None), len(order)


def brute_map(sims, ql, gl, keep=None, no_relevant="zero", ties="pessimistic"):
    aps = []
    for i in range(len(ql)):
        rel = [ql[i] == g for g in gl]
        ap, retained = brute_ap(sims[i], rel, None if keep is None else keep[i], ties)
        if retained == 0:
            continue
        if ap is None:
            if no_relevant == "skip":
                continue
            ap = 0.0
        aps.append(ap)
    return float(np.mean(aps)) if aps else float("nan")


def fume_released_withUncertainty(sims, labels, uncertainty, threshold):
    """FUME's released fx_calc_map_label_withUncertainty, restated (distance = −similarity,
    removed results pushed to the end and never counted, queries without a hit dropped)."""
    res = []
    for i in range(sims.shape[0]):
        dist = [3.0 if uncertainty[i][j] > threshold else -sims[i][j] for j in range(sims.shape[1])]
        order = sorted(range(len(dist)), key=lambda j: dist[j])
        p = r = 0.0
        for rank, j in enumerate(order):
            if labels[i] == labels[j] and dist[j] < 3:
                r += 1
                p += r / (rank + 1)
        if r > 0:
            res.append(p / r)
    return float(np.mean(res))


def _scores_from_orders(orders):
    """Row i gets scores n, n-1, …, 1 along the column order orders[i]."""
    n = len(orders[0])
    s = torch.zeros(len(orders), n, dtype=torch.float64)
    for i, order in enumerate(orders):
        for pos, j in enumerate(order):
            s[i, j] = n - pos
    return s


# A 3 × 15 matrix with 5 captions per image; see test_hand_computed_5_caption_protocol.
HAND = _scores_from_orders(
    [
        [0, 5, 6, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14],
        [0, 10, 5, 6, 7, 8, 9, 1, 2, 3, 4, 11, 12, 13, 14],
        [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 6, 7, 8, 9],
    ]
)


# ----------------------------------------------------------------------------------------------
# R@K, rSum, MdR, MnR
# ----------------------------------------------------------------------------------------------
def test_hand_computed_5_caption_protocol():
    # i2t: image 0's best own caption (col 0) is ranked 1st; image 1's (col 5) 3rd behind cols 0,
    # 10; image 2's (col 10) 7th behind cols 0-5. R@1 = 1/3, R@5 = 2/3, R@10 = 1.
    # t2i: column 0 scores 15 for every image, a three-way tie: pessimistic rank 3. Columns 1-6
    # and 10 have exactly one other image above their own (rank 2); columns 7-9, 11-14 rank 1.
    i2t, t2i = M.retrieval_ranks(HAND, 5)
    assert i2t.tolist() == [1, 3, 7]
    assert t2i.tolist() == [3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 1, 1, 1, 1]
    m = M.retrieval_metrics(HAND, captions_per_image=5)
    assert set(m) == {
        "i2t_r1",
        "i2t_r5",
        "i2t_r10",
        "t2i_r1",
        "t2i_r5",
        "t2i_r10",
        "rsum",
        "i2t_medr",
        "i2t_meanr",
        "t2i_medr",
        "t2i_meanr",
    }
    assert m["i2t_r1"] == pytest.approx(100 / 3)
    assert m["i2t_r5"] == pytest.approx(200 / 3)
    assert m["i2t_r10"] == pytest.approx(100.0)
    assert m["t2i_r1"] == pytest.approx(700 / 15)
    assert m["t2i_r5"] == pytest.approx(100.0)
    assert m["t2i_r10"] == pytest.approx(100.0)
    assert m["rsum"] == pytest.approx(100 / 3 + 200 / 3 + 100 + 700 / 15 + 100 + 100)
    assert m["i2t_medr"] == 3.0 and m["i2t_meanr"] == pytest.approx(11 / 3)
    assert m["t2i_medr"] == 2.0 and m["t2i_meanr"] == pytest.approx(24 / 15)
    # Optimistic ties: column 0 ranks 1 instead of 3.
    opt = M.retrieval_metrics(HAND, 5, ties="optimistic")
    assert opt["t2i_r1"] == pytest.approx(800 / 15) and opt["t2i_meanr"] == pytest.approx(22 / 15)
    assert opt["i2t_r1"] == m["i2t_r1"]


def test_one_caption_identity_and_even_median():
    m = M.retrieval_metrics(torch.eye(4), 1)
    assert m["rsum"] == 600.0 and m["i2t_medr"] == 1.0 and m["t2i_meanr"] == 1.0
    # Ranks 1, 1, 2, 4 (even count): exact median (1 + 2) / 2.
    s = torch.tensor([[9.0, 1, 2, 3], [1, 9, 2, 3], [0, 3, 2, 1], [5, 6, 7, 1]])
    i2t, _ = M.retrieval_ranks(s, 1)
    assert i2t.tolist() == [1, 1, 2, 4]
    assert M.retrieval_metrics(s, 1)["i2t_medr"] == 1.5


def test_constant_matrix_gets_worst_rank_when_pessimistic():
    m = M.retrieval_metrics(torch.zeros(4, 20), 5)
    # Every image ties with all 20 captions: 15 irrelevant ahead of the first own caption.
    assert m["i2t_meanr"] == 16.0 and m["i2t_r10"] == 0.0
    assert m["t2i_meanr"] == 4.0
    assert M.retrieval_metrics(torch.zeros(4, 20), 5, ties="optimistic")["rsum"] == 600.0


@pytest.mark.parametrize("cpi", [1, 5])
@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("discrete", [False, True])
def test_ranks_match_brute_force(cpi, ties, discrete):
    g = torch.Generator().manual_seed(7 + cpi)
    n = 23
    s = torch.randn(n, n * cpi, generator=g)
    if discrete:  # many ties
        s = torch.randint(0, 4, (n, n * cpi), generator=g).to(torch.float32)
    i2t, t2i = M.retrieval_ranks(s, cpi, ties=ties)
    b_i2t, b_t2i = brute_ranks(s, cpi, ties)
    assert i2t.tolist() == b_i2t and t2i.tolist() == b_t2i
    # Chunking changes nothing.
    i2t_c, t2i_c = M.retrieval_ranks(s, cpi, ties=ties, chunk_size=3)
    assert torch.equal(i2t, i2t_c) and torch.equal(t2i, t2i_c)


def test_metrics_accept_numpy_and_low_precision():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(10, 50, generator=g)
    ref = M.retrieval_metrics(s, 5)
    assert M.retrieval_metrics(s.numpy(), 5) == ref
    assert M.retrieval_metrics(s.double(), 5) == ref
    # bf16 rounding creates ties but stays a valid evaluation.
    m16 = M.retrieval_metrics(s.to(torch.bfloat16), 5)
    assert 0 <= m16["rsum"] <= 600
    # Integer scores work (ranks only need comparisons).
    assert M.retrieval_metrics(torch.eye(5, dtype=torch.int64), 1)["rsum"] == 600.0


def test_large_gallery_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(11)
    s = torch.randn(400, 2000, generator=g)
    a = M.retrieval_metrics(s, 5)
    b = M.retrieval_metrics(s, 5, chunk_size=37)
    assert a == b


# ----------------------------------------------------------------------------------------------
# mAP@all
# ----------------------------------------------------------------------------------------------
ROW = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
GALLERY = [0, 1, 0, 2, 1, 0]


def test_map_known_answers():
    sims = torch.tensor([ROW, ROW, ROW])
    ql = torch.tensor([0, 1, 3])
    gl = torch.tensor(GALLERY)
    ap, n_rel = M.average_precision(sims, ql, gl)
    # label 0: relevant at ranks 1, 3, 6 → (1/1 + 2/3 + 3/6) / 3; label 1: ranks 2, 5 → (1/2 + 2/5) / 2.
    assert ap[0].item() == pytest.approx((1 + 2 / 3 + 3 / 6) / 3)
    assert ap[1].item() == pytest.approx((1 / 2 + 2 / 5) / 2)
    assert math.isnan(ap[2].item()) and n_rel.tolist() == [3, 2, 0]
    # A query without any relevant item: AP 0 by default, or left out.
    expected_zero = ((1 + 2 / 3 + 0.5) / 3 + 0.45 + 0.0) / 3
    assert M.map_at_all(sims, ql, gl) == pytest.approx(expected_zero)
    assert M.map_at_all(sims, ql, gl, no_relevant="skip") == pytest.approx(((1 + 2 / 3 + 0.5) / 3 + 0.45) / 2)
    assert math.isnan(M.map_at_all(sims[2:], ql[2:], gl, no_relevant="skip"))
    assert M.map_at_all(torch.eye(5), torch.arange(5), torch.arange(5)) == 1.0


def test_map_ties():
    sims = torch.tensor([[1.0, 1.0, 0.0]])
    ql, gl = torch.tensor([0]), torch.tensor([0, 1, 0])
    # Pessimistic: the irrelevant tie comes first → relevance [0, 1, 1]: (1/2 + 2/3) / 2.
    assert M.map_at_all(sims, ql, gl) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert M.map_at_all(sims, ql, gl, ties="optimistic") == pytest.approx((1 + 2 / 3) / 2)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
def test_map_adjacent_floats_are_not_ties(ties):
    # The tie-break key must not reorder scores one float32 ulp apart.
    hi = torch.tensor(0.7, dtype=torch.float32)
    lo = torch.nextafter(hi, torch.tensor(-1.0))
    sims = torch.stack([hi, lo, hi, lo]).reshape(2, 2)
    ql, gl = torch.tensor([0, 1]), torch.tensor([0, 1])
    # Query 0: its relevant item is the higher score (AP 1); query 1: the lower one (AP 1/2).
    assert M.map_at_all(sims, ql, gl, ties=ties) == pytest.approx((1 + 0.5) / 2)


def test_map_multi_hot_labels():
    sims = torch.tensor([ROW])
    ql = torch.tensor([[1, 0, 1]])
    gl = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0], [1, 1, 0], [0, 1, 0]])
    # Shares a class with items 0, 2, 4 → ranks 1, 3, 5.
    assert M.map_at_all(sims, ql, gl) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)
    assert M.map_at_all(sims, ql.bool(), gl.float()) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_map_matches_brute_force(ties, discrete, dtype):
    # float32/16 take the single-sort tie-break key, float64 and integers the two-sort path.
    g = torch.Generator().manual_seed(5)
    n_q, n_g = 17, 41
    s = torch.randn(n_q, n_g, generator=g).to(dtype) if dtype.is_floating_point else None
    if discrete or s is None:
        s = torch.randint(0, 3, (n_q, n_g), generator=g).to(dtype)
    ql = torch.randint(0, 6, (n_q,), generator=g)
    gl = torch.randint(0, 5, (n_g,), generator=g)  # label 5 queries have no relevant item
    for no_rel in ("zero", "skip"):
        want = brute_map(s.double().tolist(), ql.tolist(), gl.tolist(), no_relevant=no_rel, ties=ties)
        assert M.map_at_all(s, ql, gl, no_relevant=no_rel, ties=ties) == pytest.approx(want, abs=1e-12)
        assert M.map_at_all(s, ql, gl, no_relevant=no_rel, ties=ties, chunk_size=4) == pytest.approx(
            want, abs=1e-12
        )


def test_instance_labels_give_5_caption_map():
    s = HAND
    img, cap = M.instance_labels(3, 5)
    assert cap.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    # Image 0's own captions sit at ranks 1, 4, 5, 6, 7 of its row.
    ap0 = (1 / 1 + 2 / 4 + 3 / 5 + 4 / 6 + 5 / 7) / 5
    ap, _ = M.average_precision(s, img, cap)
    assert ap[0].item() == pytest.approx(ap0)


# ----------------------------------------------------------------------------------------------
# uncertainty-aware evaluation (FUME)
# ----------------------------------------------------------------------------------------------
def test_uncertainty_filtered_map_hand_computed():
    sims = torch.tensor([ROW, ROW, ROW])
    ql, gl = torch.tensor([0, 1, 3]), torch.tensor(GALLERY)
    u_row = [0.1, 0.9, 0.6, 0.2, 0.3, 0.4]
    u = torch.tensor([u_row] * 3)
    # Items 1, 2 exceed 0.5 and leave. Label 0 keeps relevance [1, 0, 0, 1] → (1 + 2/4) / 2;
    # label 1 keeps [0, 0, 1, 0] → 1/3; label 3 has none → 0 ("zero") or skipped.
    r = M.uncertainty_filtered_map(sims, ql, gl, u, 0.5)
    assert r["map"] == pytest.approx((0.75 + 1 / 3 + 0.0) / 3)
    assert r["deletion_rate"] == pytest.approx(2 / 6) and r["n_counted"] == 3 and r["n_abstained"] == 0
    r = M.uncertainty_filtered_map(sims, ql, gl, u, 0.5, no_relevant="skip")
    assert r["map"] == pytest.approx((0.75 + 1 / 3) / 2) and r["n_counted"] == 2
    # Equal to the threshold is kept.
    assert M.uncertainty_filtered_map(sims, ql, gl, u, 0.6)["deletion_rate"] == pytest.approx(1 / 6)
    # Everything removed from query 0: it abstains instead of scoring 0.
    u2 = u.clone()
    u2[0] = 1.0
    r = M.uncertainty_filtered_map(sims, ql, gl, u2, 0.5)
    assert r["n_abstained"] == 1 and r["map"] == pytest.approx((1 / 3 + 0.0) / 2)


def test_uncertainty_filtered_map_per_query_and_cross_modal():
    sims = torch.tensor([ROW, ROW, ROW])
    ql, gl = torch.tensor([0, 1, 3]), torch.tensor(GALLERY)
    # Per-query: query 1 (u = 0.7) abstains entirely.
    r = M.uncertainty_filtered_map(sims, ql, gl, torch.tensor([0.2, 0.7, 0.1]), 0.5)
    assert r["map"] == pytest.approx(((1 + 2 / 3 + 0.5) / 3 + 0.0) / 2)
    assert r["deletion_rate"] == pytest.approx(1 / 3) and r["n_abstained"] == 1
    # Per-sample uncertainties combine by FUME eq. 10, same as passing the pair matrix.
    uq = torch.tensor([0.1, 0.3, 0.0])
    ug = torch.tensor([0.0, 0.5, 0.2, 0.4, 0.05, 0.3])
    pair = 1 - (1 - uq[:, None]) * (1 - ug[None, :])
    a = M.uncertainty_filtered_map(sims, ql, gl, uq, 0.45, gallery_uncertainty=ug)
    b = M.uncertainty_filtered_map(sims, ql, gl, pair, 0.45)
    assert a == b


def test_skip_mode_follows_fume_released_code():
    g = torch.Generator().manual_seed(21)
    n = 40
    x = F.normalize(torch.randn(n, 8, generator=g), dim=1)
    y = F.normalize(torch.randn(n, 8, generator=g), dim=1)
    sims = (x @ y.T).double()
    labels = torch.randint(0, 4, (n,), generator=g)
    u = torch.rand(n, n, generator=g, dtype=torch.float64)
    want = fume_released_withUncertainty(sims.numpy(), labels.tolist(), u.numpy(), 0.5)
    got = M.uncertainty_filtered_map(sims, labels, labels, u, 0.5, no_relevant="skip")["map"]
    assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("no_rel", ["zero", "skip"])
def test_filtered_map_matches_brute_force(no_rel):
    g = torch.Generator().manual_seed(9)
    n_q, n_g = 13, 29
    s = torch.randint(0, 4, (n_q, n_g), generator=g).to(torch.float32)
    ql = torch.randint(0, 4, (n_q,), generator=g)
    gl = torch.randint(0, 4, (n_g,), generator=g)
    u = torch.rand(n_q, n_g, generator=g)
    keep = (u <= 0.4).tolist()
    want = brute_map(s.tolist(), ql.tolist(), gl.tolist(), keep=keep, no_relevant=no_rel)
    got = M.uncertainty_filtered_map(s, ql, gl, u, 0.4, no_relevant=no_rel, chunk_size=5)["map"]
    assert got == pytest.approx(want, abs=1e-12)


def test_map_vs_deletion_rate_result_level_matches_brute_force():
    g = torch.Generator().manual_seed(4)
    n_q, n_g = 12, 30
    s = torch.randn(n_q, n_g, generator=g, dtype=torch.float64)
    ql = torch.randint(0, 3, (n_q,), generator=g)
    gl = torch.randint(0, 3, (n_g,), generator=g)
    u = torch.rand(n_q, n_g, generator=g, dtype=torch.float64)
    rates = [0.0, 0.25, 0.5, 0.8]
    out = M.map_vs_deletion_rate(s, ql, gl, u, deletion_rates=rates, chunk_size=5)
    assert set(out) == {"target_rate", "deletion_rate", "threshold", "map", "n_counted"}
    assert all(isinstance(v, np.ndarray) and v.shape == (4,) for v in out.values())
    flat = sorted(u.reshape(-1).tolist(), reverse=True)
    for k, r in enumerate(rates):
        m = round(r * n_q * n_g)
        t = flat[m - 1] if m else math.inf
        keep = (u < t).tolist()  # eq. 11 deletes D >= t
        assert out["threshold"][k] == t
        assert out["deletion_rate"][k] == pytest.approx(m / (n_q * n_g))  # continuous: exact rate
        assert out["map"][k] == pytest.approx(
            brute_map(s.tolist(), ql.tolist(), gl.tolist(), keep=keep), abs=1e-12
        )
    assert out["map"][0] == pytest.approx(M.map_at_all(s, ql, gl))


def test_map_vs_deletion_rate_query_level_and_similarity_baseline():
    g = torch.Generator().manual_seed(8)
    n_q, n_g = 10, 25
    s = torch.randn(n_q, n_g, generator=g, dtype=torch.float64)
    ql = torch.randint(0, 3, (n_q,), generator=g)
    gl = torch.randint(0, 3, (n_g,), generator=g)
    u = torch.rand(n_q, generator=g, dtype=torch.float64)
    out = M.map_vs_deletion_rate(s, ql, gl, u, deletion_rates=[0.0, 0.3, 0.5])
    ap, _ = M.average_precision(s, ql, gl)
    ap = torch.nan_to_num(ap, nan=0.0)
    for k, frac in enumerate([0.0, 0.3, 0.5]):
        kept = torch.argsort(u)[: n_q - round(frac * n_q)]  # the least uncertain queries
        assert out["deletion_rate"][k] == pytest.approx(round(frac * n_q) / n_q)
        assert out["map"][k] == pytest.approx(ap[kept].mean().item())
        assert out["n_counted"][k] == len(kept)
    # Similarity baseline: the least similar results go first.
    base = M.map_vs_deletion_rate(s, ql, gl, deletion_rates=[0.4])
    cut = sorted(s.reshape(-1).tolist())[round(0.4 * n_q * n_g) - 1]
    keep = (s > cut).tolist()
    assert base["map"][0] == pytest.approx(brute_map(s.tolist(), ql.tolist(), gl.tolist(), keep=keep))
    # Default rates: 0, 0.1, …, 0.9.
    assert np.allclose(M.map_vs_deletion_rate(s, ql, gl)["target_rate"], np.arange(10) / 10)


def test_deletion_curve_rewards_informative_uncertainty():
    g = torch.Generator().manual_seed(2)
    n_q, n_g = 60, 60
    ql = torch.randint(0, 5, (n_q,), generator=g)
    gl = torch.randint(0, 5, (n_g,), generator=g)
    rel = (ql[:, None] == gl[None, :]).double()
    s = rel + 1.5 * torch.randn(n_q, n_g, generator=g, dtype=torch.float64)
    # Oracle-ish per-result uncertainty: high for irrelevant results.
    u = (1 - rel) * 0.8 + 0.2 * torch.rand(n_q, n_g, generator=g, dtype=torch.float64)
    # 20.6 % of the pairs are relevant: deleting 80 % leaves only relevant results.
    out = M.map_vs_deletion_rate(s, ql, gl, u, deletion_rates=[0.0, 0.4, 0.8])
    assert out["map"][0] < out["map"][1] < out["map"][2]
    assert out["map"][2] == pytest.approx(1.0)
    # The similarity baseline on the same data improves less (FUME Fig. 3, 's' vs 'u').
    base = M.map_vs_deletion_rate(s, ql, gl, deletion_rates=[0.0, 0.4, 0.8])
    assert base["map"][0] == out["map"][0] and base["map"][2] < out["map"][2]


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def test_validation_names_the_argument():
    s = torch.randn(3, 15)
    with pytest.raises(TypeError, match="sims"):
        M.retrieval_metrics(s.tolist(), 5)
    with pytest.raises(ValueError, match="sims"):
        M.retrieval_metrics(torch.randn(15), 5)
    with pytest.raises(ValueError, match="captions_per_image"):
        M.retrieval_metrics(s, 4)
    with pytest.raises(TypeError, match="captions_per_image"):
        M.retrieval_metrics(s, 5.0)
    bad = s.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="sims"):
        M.retrieval_metrics(bad, 5)
    with pytest.raises(TypeError, match="sims"):
        M.retrieval_metrics(torch.ones(3, 15, dtype=torch.bool), 5)
    with pytest.raises(ValueError, match="ties"):
        M.retrieval_metrics(s, 5, ties="random")
    with pytest.raises(ValueError, match="chunk_size"):
        M.retrieval_metrics(s, 5, chunk_size=0)
    ql, gl = torch.arange(3), torch.arange(15) // 5
    with pytest.raises(TypeError, match="query_labels"):
        M.map_at_all(s, ql.float(), gl)
    with pytest.raises(ValueError, match="gallery_labels"):
        M.map_at_all(s, ql, gl[:-1])
    with pytest.raises(ValueError, match="query_labels and gallery_labels"):
        M.map_at_all(s, ql, torch.nn.functional.one_hot(gl))
    with pytest.raises(ValueError, match="no_relevant"):
        M.map_at_all(s, ql, gl, no_relevant="nan")
    with pytest.raises(ValueError, match="uncertainty"):
        M.uncertainty_filtered_map(s, ql, gl, torch.rand(3, 14))
    with pytest.raises(ValueError, match="uncertainty"):
        M.uncertainty_filtered_map(s, ql, gl, torch.rand(4))
    with pytest.raises(ValueError, match="gallery_uncertainty"):
        M.uncertainty_filtered_map(s, ql, gl, torch.rand(3), gallery_uncertainty=torch.rand(3))
    with pytest.raises(ValueError, match="threshold"):
        M.uncertainty_filtered_map(s, ql, gl, torch.rand(3), float("nan"))
    with pytest.raises(ValueError, match="deletion_rates"):
        M.map_vs_deletion_rate(s, ql, gl, deletion_rates=[0.1, 1.0])
    with pytest.raises(ValueError, match="uncertainty"):
        M.uncertainty_filtered_map(s, ql, gl, None)


# ----------------------------------------------------------------------------------------------
# opinion helpers
# ----------------------------------------------------------------------------------------------
def _embeddings(n_q, n_g, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n_q, d, generator=g), dim=1)
    y = F.normalize(torch.randn(n_g, d, generator=g), dim=1)
    return x, y


@pytest.mark.parametrize("direction", ["rows", "cols"])
def test_topk_beliefs_against_direct_formula(direction):
    x, y = _embeddings(7, 19)
    tau = 0.1
    op = eo.opinion(x, y, evidence="exp", tau=tau)
    sims = x @ y.T
    top = M.topk_beliefs(sims, op, k=4, evidence="exp", tau=tau, direction=direction)
    s = sims.double() if direction == "rows" else sims.double().T
    e = torch.exp(s / tau)
    strength = (e + 1).sum(1)
    want = torch.topk(s, 4, dim=1)
    assert torch.equal(top.indices, want.indices)
    assert torch.allclose(top.beliefs.double(), e.gather(1, want.indices) / strength[:, None], rtol=1e-5)
    assert torch.allclose(top.uncertainty.double(), s.shape[1] / strength, rtol=1e-5)
    assert torch.equal(M.query_uncertainty(op, direction), top.uncertainty)
    # With k = all candidates, the opinion sums to one: Σ b + u = 1 (SPEC §1).
    full = M.topk_beliefs(sims, op, k=s.shape[1], evidence="exp", tau=tau, direction=direction, chunk_size=2)
    assert torch.allclose(full.beliefs.sum(1) + full.uncertainty, torch.ones(s.shape[0]), atol=1e-5)


@pytest.mark.parametrize("direction", ["rows", "cols"])
def test_evidential_topk_matches_topk_beliefs(direction):
    x, y = _embeddings(9, 23, seed=1)
    op = eo.opinion(x, y, evidence="relu", tau=0.5)
    a = M.evidential_topk(x, y, k=5, evidence="relu", tau=0.5, direction=direction, chunk_size=4)
    b = M.topk_beliefs(x @ y.T, op, k=5, evidence="relu", tau=0.5, direction=direction)
    assert torch.equal(a.indices, b.indices)
    assert torch.allclose(a.beliefs, b.beliefs, rtol=1e-6) and torch.equal(a.uncertainty, b.uncertainty)
    # normalize=True is the same as normalising first.
    c = M.evidential_topk(3 * x, 2 * y, k=5, evidence="relu", tau=0.5, direction=direction, normalize=True)
    assert torch.equal(c.indices, a.indices) and torch.allclose(c.beliefs, a.beliefs, rtol=1e-5)


def test_opinion_helpers_validation():
    x, y = _embeddings(4, 6)
    op = eo.opinion(x, y)
    with pytest.raises(TypeError, match="opinion"):
        M.query_uncertainty(op.row_uncertainty)
    with pytest.raises(ValueError, match="direction"):
        M.query_uncertainty(op, "both")
    with pytest.raises(ValueError, match="k"):
        M.topk_beliefs(x @ y.T, op, k=7)
    with pytest.raises(ValueError, match="opinion"):
        M.topk_beliefs((x @ y.T)[:3], op, k=2)
    with pytest.raises(ValueError, match="k"):
        M.evidential_topk(x, y, k=5, direction="cols")
