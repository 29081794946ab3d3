"""Retrieval evaluation (SPEC §4) and its uncertainty-aware variants (the FUME paper).

What is here:
- `retrieval_metrics`: R@1/5/10 in %, rSum, median and mean rank (1-based) for both directions,
  with the COCO/Flickr protocol of several captions per image (TCL/TcVSE tables, DUQ tables).
- `map_at_all`: mAP over the whole ranked gallery with label-based relevance (FUME Table 1,
  UML Table 2 "mAP"), `average_precision` per query.
- `uncertainty_filtered_map`: mAP@all after dropping the results whose uncertainty exceeds a
  threshold (FUME Table 1, "FUME_{u=0.5}").
- `map_vs_deletion_rate`: mAP@all as the most uncertain (or least similar) results or queries are
  deleted (FUME eq. 11 and Fig. 3), as numpy arrays ready to plot.
- `query_uncertainty`, `topk_beliefs`, `evidential_topk`: per-query uncertainty u = N/S and the
  belief b = e/S of each query's top-k results from an `Opinion` (SPEC §1, §3 TCL inference),
  computed with `evidential_ops.opinion` / `evidential_ops.belief`.
- `top1_correct`: whether each query's top-1 result is relevant (the per-query R@1 hit).
- The quality of an uncertainty score (SPEC §6), from `evidential_ops.uncertainty_quality`:
  `auroc`, `aupr` (detecting wrong top-1 results or shifted queries), `risk_coverage_curve`,
  `aurc`, `excess_aurc`, `accuracy_at_coverage` (selective retrieval),
  `expected_calibration_error`, `similarity_baselines` and `uncertainty_report`.

Conventions where the papers are silent (each is a **[choice]**, repeated in the docstrings):
- Ties: `ties="pessimistic"` (default) ranks a relevant item after every irrelevant item with the
  same score, `ties="optimistic"` before. Published code breaks ties by the order numpy's argsort
  happens to return, which is arbitrary; pessimistic ties mean a degenerate model (all scores
  equal) gets the worst rank instead of a lucky one. Ties are not only a degenerate-model issue:
  a row of 5K random float32 scores already holds one tied pair on average.
- Median rank is the exact median of the 1-based ranks (the mean of the two middle ranks for an
  even count), as CLIP4Clip-style code computes MdR (DUQ); VSE++-style code floors it.
- A query with no relevant item (in the gallery, or left after filtering) scores AP = 0 by
  default (`no_relevant="zero"`, as the released `fx_calc_map_label` of FUME/DSCMR does);
  `no_relevant="skip"` leaves it out of the mean, which is what FUME's released thresholded
  evaluation does. A query whose results were all removed abstains and is never counted.
- AP normalises by the number of relevant items among the (retained) ranked results, so for the
  unfiltered gallery it is the usual AP over the whole ranking (mAP@all).

Everything is vectorised torch and processes the queries in row chunks (`chunk_size` rows, default
about 2^22 matrix entries per chunk); Python loops run over chunks only. Measured on 2 CPU cores:
`retrieval_metrics` on COCO 5K (5000 × 25000) ~3-4 s; `map_at_all` on 1000 × 5000 ~1.6 s (one
sort per row dominates), a 10-point `map_vs_deletion_rate` curve there ~7 s (sorted once).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import choice, integer, output_dtype
from .opinion import belief as _belief
from .opinion import opinion as _opinion
from .config import NORMALIZE_EPS
from .methods.fume import fume_cross_modal_uncertainty
from .results import Opinion
from .uncertainty_quality import (
    accuracy_at_coverage,
    aupr,
    auroc,
    aurc,
    excess_aurc,
    expected_calibration_error,
    risk_coverage_curve,
    similarity_baselines,
    uncertainty_report,
)

__all__ = [
    "TopK",
    "accuracy_at_coverage",
    "aupr",
    "auroc",
    "aurc",
    "average_precision",
    "evidential_topk",
    "excess_aurc",
    "expected_calibration_error",
    "instance_labels",
    "map_at_all",
    "map_vs_deletion_rate",
    "query_uncertainty",
    "retrieval_metrics",
    "retrieval_ranks",
    "risk_coverage_curve",
    "similarity_baselines",
    "top1_correct",
    "topk_beliefs",
    "uncertainty_filtered_map",
    "uncertainty_report",
]

TIES = ("pessimistic", "optimistic")
NO_RELEVANT = ("zero", "skip")
DIRECTIONS = ("rows", "cols")
# Entries per chunk: large enough that the per-chunk torch ops amortise their overhead, small enough
# that the few (chunk × N_g) int64/float64 temporaries of a sort stay around 100 MB.
_CHUNK_ENTRIES = 1 << 22


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _as_tensor(a, name: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a))
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")


def _score_matrix(a, name: str) -> Tensor:
    """A 2-D, non-empty, finite real matrix (floating or integer; never bool or complex)."""
    t = _as_tensor(a, name).detach()
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (queries × gallery), got shape {tuple(t.shape)}")
    if t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(t.shape)}")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return t


def _score_vector(a, name: str, n: int, device: torch.device) -> Tensor:
    t = _as_tensor(a, name).detach()
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if t.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return t.to(device)


def _labels(a, name: str, n: int, device: torch.device) -> Tensor:
    """1-D integer class labels (N,) or 2-D multi-hot labels (N, C) (bool, integer or 0/1 float)."""
    t = _as_tensor(a, name).detach()
    if t.dim() == 1:
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} as a 1-D tensor must hold integer class ids, got dtype {t.dtype}")
    elif t.dim() == 2:
        if t.is_complex():
            raise TypeError(f"{name} must be real, got dtype {t.dtype}")
        if t.is_floating_point() and not bool(((t == 0) | (t == 1)).all()):
            raise ValueError(f"{name} as a 2-D multi-hot matrix must contain only 0 and 1")
        t = t != 0
    else:
        raise ValueError(
            f"{name} must be 1-D class ids (N,) or 2-D multi-hot (N, C), got shape {tuple(t.shape)}"
        )
    if t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} entries but the similarity matrix needs {n}")
    return t.to(device)


def _label_pair(query_labels, gallery_labels, n_q: int, n_g: int, device) -> tuple[Tensor, Tensor]:
    ql = _labels(query_labels, "query_labels", n_q, device)
    gl = _labels(gallery_labels, "gallery_labels", n_g, device)
    if ql.dim() != gl.dim():
        raise ValueError(
            f"query_labels and gallery_labels must both be class ids or both multi-hot, got shapes "
            f"{tuple(ql.shape)} and {tuple(gl.shape)}"
        )
    if ql.dim() == 2 and ql.shape[1] != gl.shape[1]:
        raise ValueError(
            "query_labels and gallery_labels must have the same number of classes, "
            f"got {ql.shape[1]} and {gl.shape[1]}"
        )
    return ql, gl


def _relevance(ql: Tensor, gl: Tensor) -> Tensor:
    """rel[i, j] = query i and gallery item j share a label: (B, N_g) bool."""
    if ql.dim() == 1:
        return ql.unsqueeze(1) == gl.unsqueeze(0)
    # Multi-hot: share at least one class (the NUS-WIDE / MIRFlickr convention).
    return (ql.to(torch.float32) @ gl.to(torch.float32).T) > 0


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def _rows_per_chunk(n_rows: int, n_cols: int, chunk_size) -> int:
    if chunk_size is None:
        return max(1, min(n_rows, _CHUNK_ENTRIES // max(n_cols, 1)))
    return integer(chunk_size, "chunk_size", minimum=1)


# ----------------------------------------------------------------------------------------------
# R@K, rSum, MdR, MnR (SPEC §4)
# ----------------------------------------------------------------------------------------------
def retrieval_ranks(sims, captions_per_image: int = 1, *, ties: str = "pessimistic", chunk_size=None):
    """1-based ranks of the ground truth for every image query and every caption query (SPEC §4).

    sims: (N_img, N_img · captions_per_image) tensor or ndarray, rows = images, columns = captions;
    caption j belongs to image j // captions_per_image (COCO/Flickr layout: 5 consecutive captions
    per image). Returns (i2t_ranks (N_img,), t2i_ranks (N_cap,)), int64 tensors on sims' device.

    - image query i: rank of its best-ranked own caption (VSE++/SCAN/TCL protocol);
    - caption query j: rank of its one image among the N_img images (the same matrix by columns).

    **[choice]** ties="pessimistic" (default): an irrelevant item scoring exactly as the best
    relevant one is ranked before it, so rank = 1 + #{score > best} + #{irrelevant, score == best};
    "optimistic" counts only #{score > best}.
    """
    s = _score_matrix(sims, "sims")
    cpi = integer(captions_per_image, "captions_per_image", minimum=1)
    ties = choice(ties, "ties", TIES)
    n_img, n_cap = s.shape
    if n_cap != n_img * cpi:
        raise ValueError(
            f"sims has {n_img} image rows and {n_cap} caption columns, but captions_per_image={cpi} "
            f"needs {n_img * cpi} columns"
        )
    pessimistic = ties == "pessimistic"
    dev = s.device
    cap_owner = torch.arange(n_cap, device=dev) // cpi
    # The ground-truth score of every caption query: s[j // cpi, j].
    target = s[cap_owner, torch.arange(n_cap, device=dev)].unsqueeze(0)  # (1, N_cap)
    i2t = torch.empty(n_img, dtype=torch.int64, device=dev)
    t2i = torch.zeros(n_cap, dtype=torch.int64, device=dev)
    # Pessimistic rank = #{score >= best relevant} − #{relevant ties of it} + 1: one comparison
    # per entry instead of two (">" and "=="). Optimistic rank = #{score > best} + 1.
    # One pass over contiguous row blocks serves both directions: image queries are the rows,
    # caption queries accumulate their counts over the rows (the same matrix read by columns).
    # Counts sum in int32 (exact below 2^31 per chunk), which is ~1.6x faster than int64 here.
    above = torch.ge if pessimistic else torch.gt
    rows = _rows_per_chunk(n_img, n_cap, chunk_size)
    for r0 in range(0, n_img, rows):
        block = s[r0 : r0 + rows]
        b = block.shape[0]
        own = block.reshape(b, n_img, cpi)[torch.arange(b, device=dev), torch.arange(r0, r0 + b, device=dev)]
        best = own.max(dim=1, keepdim=True).values  # (b, 1): the best-ranked own caption
        rank = above(block, best).sum(1, dtype=torch.int32).to(torch.int64)
        i2t[r0 : r0 + b] = rank - (own == best).sum(1) + 1 if pessimistic else rank + 1
        t2i += above(block, target).sum(0, dtype=torch.int32)
    # Pessimistic: the caption's own image is among the ">=" and counts as rank 1 by itself.
    t2i = t2i if pessimistic else t2i + 1
    return i2t, t2i


def _median(ranks: Tensor) -> float:
    r = torch.sort(ranks.to(torch.float64)).values
    n = r.numel()
    return float(r[n // 2]) if n % 2 else float((r[n // 2 - 1] + r[n // 2]) / 2)


def retrieval_metrics(
    sims, captions_per_image: int = 1, *, ties: str = "pessimistic", chunk_size=None
) -> dict:
    """Bidirectional recall metrics of a similarity matrix (SPEC §4; TCL/TcVSE/DUQ tables).

    sims: (N_img, N_img · captions_per_image), tensor or ndarray; caption j belongs to image
    j // captions_per_image. Returns floats: i2t_r1, i2t_r5, i2t_r10, t2i_r1, t2i_r5, t2i_r10
    (R@K in %), rsum (their sum), i2t_medr, i2t_meanr, t2i_medr, t2i_meanr (1-based ranks).

    An image query's rank is its best-ranked own caption's rank (COCO/Flickr protocol); a caption
    query has one relevant image. **[choice]** Median rank is the exact median (mean of the two
    middle ranks for an even count, CLIP4Clip/DUQ convention; VSE++ floors it); ties are
    pessimistic by default (see `retrieval_ranks`).
    """
    i2t, t2i = retrieval_ranks(sims, captions_per_image, ties=ties, chunk_size=chunk_size)
    out = {}
    for name, ranks in (("i2t", i2t), ("t2i", t2i)):
        for k in (1, 5, 10):
            out[f"{name}_r{k}"] = 100.0 * float((ranks <= k).to(torch.float64).mean())
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    out["i2t_medr"] = _median(i2t)
    out["i2t_meanr"] = float(i2t.to(torch.float64).mean())
    out["t2i_medr"] = _median(t2i)
    out["t2i_meanr"] = float(t2i.to(torch.float64).mean())
    return out


def instance_labels(n_images: int, captions_per_image: int = 1) -> tuple[Tensor, Tensor]:
    """Labels that make instance retrieval a label-based one: (image_ids (N,), caption_ids (N·c,)).

    With them `map_at_all(sims, *instance_labels(N, 5))` is the i2t mAP of the 5-caption protocol
    (UML Table 2 reports this mAP for video-text), and `map_at_all(sims.T, *reversed(...))` t2i.
    """
    n = integer(n_images, "n_images", minimum=1)
    c = integer(captions_per_image, "captions_per_image", minimum=1)
    ids = torch.arange(n)
    return ids, ids.repeat_interleave(c)


def top1_correct(sims, query_labels, gallery_labels, *, ties: str = "pessimistic", chunk_size=None) -> Tensor:
    """(N_q,) bool: whether each query's top-1 result is relevant, the per-query R@1 hit (SPEC §4, §6).

    sims: (N_q, N_g); labels as in `map_at_all` (with `instance_labels(N, c)` this is the
    instance protocol: an image is right when its best caption ranks first, a caption when its
    image does, exactly the hits of `retrieval_metrics`' R@1). A query is right when its best
    relevant score beats every irrelevant one; **[choice]** ties="pessimistic" (default) counts
    a tie with an irrelevant item as wrong, "optimistic" as right. No relevant item: wrong.
    """
    s = _score_matrix(sims, "sims")
    ties = choice(ties, "ties", TIES)
    ql, gl = _label_pair(query_labels, gallery_labels, *s.shape, s.device)
    work = output_dtype(s.dtype) if s.is_floating_point() else torch.float64
    lowest = torch.tensor(-math.inf, dtype=work, device=s.device)
    out = torch.empty(s.shape[0], dtype=torch.bool, device=s.device)
    rows = _rows_per_chunk(*s.shape, chunk_size)
    for r0 in range(0, s.shape[0], rows):
        block = s[r0 : r0 + rows].to(work)
        rel = _relevance(ql[r0 : r0 + rows], gl)
        best_relevant = torch.where(rel, block, lowest).amax(dim=1)
        best_other = torch.where(rel, lowest, block).amax(dim=1)
        beats = best_relevant > best_other if ties == "pessimistic" else best_relevant >= best_other
        out[r0 : r0 + rows] = beats & rel.any(dim=1)
    return out


# ----------------------------------------------------------------------------------------------
# mAP@all and its filtered variants
# ----------------------------------------------------------------------------------------------
def _sorted_order(s: Tensor, rel: Tensor, ties: str) -> Tensor:
    """Per-row permutation sorting scores descending, ties resolved by relevance (see module doc).

    Scores of 32 bits or fewer: one sort of a float64 key in which each relevant score is moved
    halfway to its adjacent float32 (down for pessimistic, up for optimistic). No float32 lies in
    between, so distinct scores keep their order and only exact ties split by relevance. (Ties
    are common: 5K random float32 scores per row already hold one on average.) Other dtypes: one
    sort, plus two stable sorts (relevance, then score) only where a chunk has ties.
    """
    if s.dtype in (torch.float32, torch.float16, torch.bfloat16):
        base = s.to(torch.float32)
        toward = torch.full((), -math.inf if ties == "pessimistic" else math.inf, device=s.device)
        neighbour = torch.nextafter(base, toward.expand_as(base))
        key = base.to(torch.float64)
        # Adjacent float32 values sum exactly in float64, so the midpoint is exact.
        key = torch.where(rel, (key + neighbour.to(torch.float64)) * 0.5, key)
        if bool(torch.isfinite(key).all()):  # only fails next to the float32 range limit
            return torch.sort(key, dim=1, descending=True).indices
    values, order = torch.sort(s, dim=1, descending=True)
    if not bool((values[:, 1:] == values[:, :-1]).any()):
        return order  # no ties: the order is unambiguous and one sort suffices
    first = torch.sort(rel.to(torch.uint8), dim=1, descending=(ties == "optimistic"), stable=True).indices
    second = torch.sort(s.gather(1, first), dim=1, descending=True, stable=True).indices
    return first.gather(1, second)


def _ap_from_sorted(rel_sorted: Tensor, keep_sorted: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """AP over the retained results of each row, given relevance/retention in ranked order.

    Returns (ap_sum (B,) float64 = Σ_hits precision@hit, n_hits (B,), n_retained (B,)).
    """
    if keep_sorted is None:
        hits = rel_sorted
        position = torch.arange(1, rel_sorted.shape[1] + 1, device=rel_sorted.device, dtype=torch.float64)
        n_retained = torch.full(
            (rel_sorted.shape[0],), rel_sorted.shape[1], dtype=torch.int64, device=rel_sorted.device
        )
    else:
        hits = rel_sorted & keep_sorted
        # Removed results leave the list, so a retained result's rank counts retained results only.
        position = keep_sorted.cumsum(1, dtype=torch.float64).clamp(min=1.0)
        n_retained = keep_sorted.sum(1)
    cum_hits = hits.cumsum(1, dtype=torch.float64)
    ap_sum = torch.where(
        hits, cum_hits / position, torch.zeros((), dtype=torch.float64, device=hits.device)
    ).sum(1)
    return ap_sum, hits.sum(1), n_retained


def _ranked_ap(s: Tensor, ql: Tensor, gl: Tensor, ties: str, chunk_size) -> tuple[Tensor, Tensor]:
    """Unfiltered AP numerators and relevant counts of every query, chunk by chunk."""
    n_q, n_g = s.shape
    ap_sum = torch.empty(n_q, dtype=torch.float64, device=s.device)
    hits = torch.empty(n_q, dtype=torch.int64, device=s.device)
    rows = _rows_per_chunk(n_q, n_g, chunk_size)
    for r0 in range(0, n_q, rows):
        sl = slice(r0, r0 + rows)
        rel = _relevance(ql[sl], gl)
        order = _sorted_order(s[sl], rel, ties)
        ap_sum[sl], hits[sl], _ = _ap_from_sorted(rel.gather(1, order), None)
    return ap_sum, hits


def average_precision(
    sims, query_labels, gallery_labels, *, ties: str = "pessimistic", chunk_size=None
) -> tuple[Tensor, Tensor]:
    """Per-query average precision over the whole ranked gallery (SPEC §4 mAP@all; FUME §4.1).

    sims: (N_q, N_g); query_labels: (N_q,) int class ids or (N_q, C) multi-hot; gallery_labels:
    (N_g,) or (N_g, C) likewise. Gallery item j is relevant to query i when the labels are equal
    (class ids) or share a class (multi-hot). AP_i = (1/R_i) Σ_{relevant ranks p} (#relevant ≤ p)/p.
    Returns (ap (N_q,) float64, n_relevant (N_q,) int64); ap is NaN where n_relevant = 0.
    Ties: see `retrieval_ranks`.
    """
    s = _score_matrix(sims, "sims")
    ties = choice(ties, "ties", TIES)
    ql, gl = _label_pair(query_labels, gallery_labels, *s.shape, s.device)
    ap_sum, hits = _ranked_ap(s, ql, gl, ties, chunk_size)
    return ap_sum / hits.to(torch.float64), hits  # 0/0 = NaN marks "no relevant item"


def _mean_ap(ap_sum: Tensor, hits: Tensor, retained: Tensor, no_relevant: str) -> tuple[float, int]:
    """Mean AP over counted queries; returns (mAP, number of queries counted)."""
    answered = retained > 0  # a query with every result removed abstains
    counted = answered & (hits > 0) if no_relevant == "skip" else answered
    n = int(counted.sum())
    if n == 0:
        return float("nan"), 0
    ap = ap_sum[counted] / hits[counted].clamp(min=1).to(torch.float64)  # AP 0 where no hit
    return float(ap.mean()), n


def map_at_all(
    sims,
    query_labels,
    gallery_labels,
    *,
    no_relevant: str = "zero",
    ties: str = "pessimistic",
    chunk_size=None,
) -> float:
    """mAP over the whole ranked gallery with label-based relevance (SPEC §4; FUME Table 1).

    sims: (N_q, N_g) tensor or ndarray; query_labels (N_q,) int / (N_q, C) multi-hot;
    gallery_labels (N_g,) / (N_g, C). Returns a float in [0, 1].

    **[choice]** A query with no relevant item in the gallery scores AP = 0 (`no_relevant="zero"`,
    as FUME's/DSCMR's released `fx_calc_map_label`); `no_relevant="skip"` leaves it out of the mean.
    If no query is counted the result is NaN. Unlike the released code (which ranks only the first
    N_q gallery items), the whole gallery is ranked for any N_q, N_g. Ties: see `retrieval_ranks`.
    """
    s = _score_matrix(sims, "sims")
    no_relevant = choice(no_relevant, "no_relevant", NO_RELEVANT)
    ties = choice(ties, "ties", TIES)
    ql, gl = _label_pair(query_labels, gallery_labels, *s.shape, s.device)
    ap_sum, hits = _ranked_ap(s, ql, gl, ties, chunk_size)
    return _mean_ap(ap_sum, hits, torch.ones_like(hits), no_relevant)[0]


def _deletion_scores(s: Tensor, uncertainty, gallery_uncertainty, *, similarity_allowed: bool):
    """Normalise the uncertainty arguments into ("query", (N_q,)) or ("result", (N_q, N_g) | pair)."""
    n_q, n_g = s.shape
    if uncertainty is None:
        if not similarity_allowed:
            raise ValueError("uncertainty must be given")
        if gallery_uncertainty is not None:
            raise ValueError("gallery_uncertainty needs a per-query uncertainty (N_q,) to combine with")
        # Negate in a wide enough type: integer scores would wrap, half precision is upcast.
        work = output_dtype(s.dtype) if s.is_floating_point() else torch.float64
        return "result", -s.to(work)
    u = _as_tensor(uncertainty, "uncertainty").detach()
    if u.dim() == 2:
        if gallery_uncertainty is not None:
            raise ValueError("gallery_uncertainty is only used with a per-query uncertainty of shape (N_q,)")
        if u.shape != (n_q, n_g):
            raise ValueError(f"uncertainty must have shape {(n_q, n_g)} like sims, got {tuple(u.shape)}")
        return "result", _score_matrix(u, "uncertainty").to(s.device)
    u = _score_vector(u, "uncertainty", n_q, s.device)
    if gallery_uncertainty is None:
        return "query", u
    ug = _score_vector(gallery_uncertainty, "gallery_uncertainty", n_g, s.device)
    # FUME eq. 10 per (query, gallery) pair, from the method reference (the executable SPEC).
    return "result", fume_cross_modal_uncertainty(u.to(torch.float64), ug.to(torch.float64), pairwise=True)


def uncertainty_filtered_map(
    sims,
    query_labels,
    gallery_labels,
    uncertainty,
    threshold: float = 0.5,
    *,
    gallery_uncertainty=None,
    no_relevant: str = "zero",
    ties: str = "pessimistic",
    chunk_size=None,
) -> dict:
    """mAP@all over the results whose uncertainty does not exceed `threshold` (FUME Table 1).

    sims: (N_q, N_g); labels as in `map_at_all`. uncertainty is one of
    - (N_q, N_g): a per-result uncertainty; results with u_ij > threshold are removed;
    - (N_q,) with gallery_uncertainty (N_g,): combined per pair with FUME eq. 10,
      u_ij = 1 − (1 − u_i)(1 − u_j) (each sample's decision uncertainty, SPEC §3 FUME);
    - (N_q,) alone: a per-query uncertainty (TCL/UML u = N/S); a query with u_i > threshold
      abstains entirely.
    Retained results keep their order; a retained result's rank counts retained results only.
    Results equal to the threshold are kept (as FUME's released code: u <= threshold).

    **[choice]** A query that still returns results but none relevant scores AP = 0
    (`no_relevant="zero"`); a query left with no result at all abstains and is not counted.
    `no_relevant="skip"` counts only queries with a retained relevant item, as FUME's released
    `fx_calc_map_label_withUncertainty` (which is how the FUME_{u=0.5} row was computed).

    Returns {"map": float (NaN if no query counted), "deletion_rate": fraction of the N_q·N_g
    results removed, "n_counted": queries in the mean, "n_abstained": queries with nothing left}.
    """
    s = _score_matrix(sims, "sims")
    no_relevant = choice(no_relevant, "no_relevant", NO_RELEVANT)
    ties = choice(ties, "ties", TIES)
    threshold = _real(threshold, "threshold")
    ql, gl = _label_pair(query_labels, gallery_labels, *s.shape, s.device)
    level, score = _deletion_scores(s, uncertainty, gallery_uncertainty, similarity_allowed=False)
    n_q, n_g = s.shape
    ap_sum = torch.empty(n_q, dtype=torch.float64, device=s.device)
    hits = torch.empty(n_q, dtype=torch.int64, device=s.device)
    retained = torch.empty(n_q, dtype=torch.int64, device=s.device)
    rows = _rows_per_chunk(n_q, n_g, chunk_size)
    for r0 in range(0, n_q, rows):
        sl = slice(r0, r0 + rows)
        block = s[sl]
        rel = _relevance(ql[sl], gl)
        order = _sorted_order(block, rel, ties)
        if level == "query":
            keep = (score[sl] <= threshold).unsqueeze(1).expand_as(block)
        else:
            keep = score[sl] <= threshold
        ap_sum[sl], hits[sl], retained[sl] = _ap_from_sorted(rel.gather(1, order), keep.gather(1, order))
    m, n = _mean_ap(ap_sum, hits, retained, no_relevant)
    return {
        "map": m,
        "deletion_rate": 1.0 - float(retained.sum()) / (n_q * n_g),
        "n_counted": n,
        "n_abstained": int((retained == 0).sum()),
    }


def map_vs_deletion_rate(
    sims,
    query_labels,
    gallery_labels,
    uncertainty=None,
    *,
    deletion_rates: Sequence[float] | np.ndarray | None = None,
    gallery_uncertainty=None,
    no_relevant: str = "zero",
    ties: str = "pessimistic",
    chunk_size=None,
) -> dict:
    """mAP@all as a function of the deletion rate (FUME eq. 11, Fig. 3), as arrays to plot.

    sims: (N_q, N_g); labels as in `map_at_all`. The deletion score D is
    - uncertainty (N_q, N_g), or (N_q,) with gallery_uncertainty (N_g,) combined by FUME eq. 10:
      results are deleted, DR = #deleted / (N_q · N_g) (the 'u' curves of Fig. 3);
    - uncertainty (N_q,) alone: whole queries are deleted, most uncertain first, DR = fraction of
      queries deleted (TCL/UML per-query u = N/S);
    - None: D = −sims, the least similar results are deleted first (the 's' curves of Fig. 3).
    For a target rate r the threshold t is the ⌈r·M⌋-th largest D (M entries) and D ≥ t is
    deleted (eq. 11: I_ij = 1 iff D_ij ≥ t), so ties at t can delete a little more than r: the
    achieved rate is returned. Mean AP over the remaining results as in `uncertainty_filtered_map`
    (no_relevant, abstention). deletion_rates default: 0, 0.1, …, 0.9; each must lie in [0, 1).

    Returns numpy arrays of equal length: "target_rate", "deletion_rate" (achieved), "threshold"
    (on D; +inf for rate 0), "map", "n_counted". The ranking is sorted once per chunk and reused
    for every rate.
    """
    s = _score_matrix(sims, "sims")
    no_relevant = choice(no_relevant, "no_relevant", NO_RELEVANT)
    ties = choice(ties, "ties", TIES)
    if deletion_rates is None:
        rates = np.round(np.arange(10) * 0.1, 10)
    else:
        rates = np.asarray(deletion_rates, dtype=np.float64)
        if rates.ndim != 1 or rates.size == 0:
            raise ValueError(f"deletion_rates must be a non-empty 1-D sequence, got shape {rates.shape}")
        if not np.all(np.isfinite(rates)) or np.any(rates < 0) or np.any(rates >= 1):
            raise ValueError(f"deletion_rates must lie in [0, 1), got {rates.tolist()}")
    ql, gl = _label_pair(query_labels, gallery_labels, *s.shape, s.device)
    level, score = _deletion_scores(s, uncertainty, gallery_uncertainty, similarity_allowed=True)
    n_q, n_g = s.shape

    flat = score.reshape(-1)
    total = flat.numel()
    thresholds = []
    for r in rates:
        m = int(round(r * total))
        # kthvalue(k) is the k-th smallest, so the m-th largest is the (total − m + 1)-th smallest.
        thresholds.append(math.inf if m == 0 else float(torch.kthvalue(flat, total - m + 1).values))

    n_rates = len(rates)
    ap_sum = torch.empty(n_rates, n_q, dtype=torch.float64, device=s.device)
    hits = torch.empty(n_rates, n_q, dtype=torch.int64, device=s.device)
    retained = torch.empty(n_rates, n_q, dtype=torch.int64, device=s.device)
    rows = _rows_per_chunk(n_q, n_g, chunk_size)
    for r0 in range(0, n_q, rows):
        sl = slice(r0, r0 + rows)
        block = s[sl]
        rel = _relevance(ql[sl], gl)
        order = _sorted_order(block, rel, ties)
        rel_sorted = rel.gather(1, order)
        score_sorted = (
            score[sl].unsqueeze(1).expand_as(block) if level == "query" else score[sl].gather(1, order)
        )
        for k, t in enumerate(thresholds):
            keep = score_sorted < t
            ap_sum[k, sl], hits[k, sl], retained[k, sl] = _ap_from_sorted(rel_sorted, keep)

    maps, counted, achieved = [], [], []
    for k in range(n_rates):
        m, n = _mean_ap(ap_sum[k], hits[k], retained[k], no_relevant)
        maps.append(m)
        counted.append(n)
        achieved.append(1.0 - float(retained[k].sum()) / (n_q * n_g))
    return {
        "target_rate": rates.copy(),
        "deletion_rate": np.asarray(achieved),
        "threshold": np.asarray(thresholds),
        "map": np.asarray(maps),
        "n_counted": np.asarray(counted, dtype=np.int64),
    }


# ----------------------------------------------------------------------------------------------
# Opinions at inference: per-query uncertainty, per-result belief of the top-k (SPEC §1, §3)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopK:
    """Top-k results of every query with their subjective opinion (SPEC §1).

    indices, similarities, beliefs: (N, k), best first; uncertainty: (N,) u = N_candidates / S of
    each query. beliefs[i, r] = e(s_i,indices[i,r]) / S_i, so Σ over all candidates of b + u = 1.
    """

    indices: Tensor
    similarities: Tensor
    beliefs: Tensor
    uncertainty: Tensor


def _check_opinion(op) -> Opinion:
    if not isinstance(op, Opinion):
        raise TypeError(f"opinion must be an evidential_ops.Opinion, got {type(op).__name__}")
    return op


def query_uncertainty(opinion: Opinion, direction: str = "rows") -> Tensor:
    """Per-query uncertainty u = N / S over the gallery (SPEC §1; TCL/TcVSE/UML inference).

    direction="rows": the N_q queries x over the N_g gallery items y (i2t / v2t), shape (N_q,);
    "cols": the gallery items y as queries over x (t2i / t2v), shape (N_g,).
    """
    op = _check_opinion(opinion)
    direction = choice(direction, "direction", DIRECTIONS)
    return op.row_uncertainty if direction == "rows" else op.col_uncertainty


def _check_k(k, n_candidates: int) -> int:
    k = integer(k, "k", minimum=1)
    if k > n_candidates:
        raise ValueError(f"k must be <= the number of candidates ({n_candidates}), got {k}")
    return k


def _chunked_topk(score_rows, shape, k: int, log_strength: Tensor, uncertainty: Tensor, *, evidence: str,
                  tau: float, chunk_size) -> TopK:
    """Top-k of each query row over row chunks of the scores (`score_rows(r0, r1)` gives rows
    r0..r1 of the (N_q, N_g) matrix), with beliefs from the queries' log-strengths."""
    idx_parts, sim_parts, bel_parts = [], [], []
    rows = _rows_per_chunk(shape[0], shape[1], chunk_size)
    for r0 in range(0, shape[0], rows):
        top = torch.topk(score_rows(r0, r0 + rows), k, dim=1)
        idx_parts.append(top.indices)
        sim_parts.append(top.values)
        bel_parts.append(_belief(top.values, log_strength[r0 : r0 + rows], evidence=evidence, tau=tau, dim=1))
    return TopK(torch.cat(idx_parts), torch.cat(sim_parts), torch.cat(bel_parts), uncertainty)


def topk_beliefs(
    sims,
    opinion: Opinion,
    k: int = 10,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    direction: str = "rows",
    chunk_size=None,
) -> TopK:
    """Each query's top-k results with belief b = e/S and the query's uncertainty (SPEC §1).

    sims: (N_q, N_g) the similarity matrix the `opinion` was computed from (same evidence, tau),
    e.g. `opinion_from_similarity(sims, ...)`. direction="rows": queries are the N_q rows (i2t),
    result shapes (N_q, k); "cols": queries are the N_g columns (t2i), shapes (N_g, k).
    Beliefs come from `evidential_ops.belief` with the opinion's log-strengths, so they stay
    finite where e itself would overflow float32.
    """
    op = _check_opinion(opinion)
    s = _score_matrix(sims, "sims")
    if not s.is_floating_point():
        raise TypeError(f"sims must be floating point for beliefs, got {s.dtype}")
    direction = choice(direction, "direction", DIRECTIONS)
    n_q, n_g = s.shape
    if op.row_log_strength.shape != (n_q,) or op.col_log_strength.shape != (n_g,):
        raise ValueError(
            f"opinion is over {op.row_log_strength.shape[0]} × {op.col_log_strength.shape[0]} but sims "
            f"has shape {(n_q, n_g)}"
        )
    if direction == "cols":
        s = s.T
        log_strength, unc = op.col_log_strength, op.col_uncertainty
    else:
        log_strength, unc = op.row_log_strength, op.row_uncertainty
    k = _check_k(k, s.shape[1])
    return _chunked_topk(lambda r0, r1: s[r0:r1], s.shape, k, log_strength.to(s.device), unc,
                         evidence=evidence, tau=tau, chunk_size=chunk_size)


def evidential_topk(
    x: Tensor,
    y: Tensor,
    k: int = 10,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    direction: str = "rows",
    normalize: bool = False,
    backend: str = "auto",
    chunk_size=None,
) -> TopK:
    """Top-k retrieval with opinions straight from embeddings, never storing N_q × N_g (SPEC §1).

    x: (N_q, D) query-side embeddings, y: (N_g, D) gallery embeddings (L2-normalised unless
    normalize=True). The strengths come from `evidential_ops.opinion` (a fused backend never
    materialises the matrix); the top-k are found over row chunks of x·yᵀ (or y·xᵀ for
    direction="cols") and their beliefs from `evidential_ops.belief`. Shapes as in `topk_beliefs`.
    """
    direction = choice(direction, "direction", DIRECTIONS)
    op = _opinion(x, y, evidence=evidence, tau=tau, normalize=normalize, backend=backend, top_k=None)
    work = output_dtype(x.dtype)
    with torch.no_grad():
        xq, yg = x.detach().to(work), y.detach().to(work)
        if normalize:
            xq = F.normalize(xq, dim=1, eps=NORMALIZE_EPS)
            yg = F.normalize(yg, dim=1, eps=NORMALIZE_EPS)
        if direction == "cols":
            xq, yg = yg, xq
            log_strength, unc = op.col_log_strength, op.col_uncertainty
        else:
            log_strength, unc = op.row_log_strength, op.row_uncertainty
        k = _check_k(k, yg.shape[0])
        return _chunked_topk(lambda r0, r1: xq[r0:r1] @ yg.T, (xq.shape[0], yg.shape[0]), k, log_strength, unc,
                             evidence=evidence, tau=tau, chunk_size=chunk_size)
