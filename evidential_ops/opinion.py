"""Public opinion API: per-query strength, uncertainty, dissonance and top belief over a whole
gallery (SPEC §1, §3).

A backend computes the strengths S (the part that needs every one of the N_q × N_g evidences,
fused and never stored). On top of any backend, device-neutral torch here adds what needs only
each query's best candidates: their similarities are found tile by tile (a bounded working set
of `tile_mib` MiB of scores, merged top-k), turned into beliefs b = exp(ln e − ln S) in float64
(exact where e overflows float32), and reduced to the belief of the top result and the
dissonance among the top k (`dissonance.belief_dissonance`).

Opinions are inference-time quantities: they are computed without gradient.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor

from . import backends, checks
from .dissonance import belief_dissonance
from .evidence import belief as _belief
from .evidence import log_evidence, unit_rows
from .results import Opinion

DEFAULT_TOP_K = 10  # candidates whose dissonance is measured (R@10's list)
DEFAULT_TILE_MIB = 4.0  # similarity scores held at a time by the top-k pass


def _top_k_value(top_k) -> int | None:
    return None if top_k is None else checks.integer(top_k, "top_k", minimum=1)


def _tile_mib_value(tile_mib) -> float:
    return checks.positive_number(tile_mib, "tile_mib")


def _tiled_topk(tile: Callable[[int, int, int, int], Tensor], n_rows: int, n_cols: int, k_row: int, k_col: int,
                budget: int) -> tuple[Tensor, Tensor]:
    """The k_row largest scores of every row and the k_col largest of every column of an
    (n_rows, n_cols) score matrix that is only ever seen as tiles `tile(r0, r1, c0, c1)` of at
    most `budget` entries. Returns (rows (n_rows, k_row), cols (n_cols, k_col)), descending."""
    tile_cols = min(n_cols, budget)
    tile_rows = max(1, budget // tile_cols)
    row_parts, col_best = [], [None] * math.ceil(n_cols / tile_cols)
    for r0 in range(0, n_rows, tile_rows):
        r1 = min(n_rows, r0 + tile_rows)
        row_best = None
        for block, c0 in enumerate(range(0, n_cols, tile_cols)):
            c1 = min(n_cols, c0 + tile_cols)
            scores = tile(r0, r1, c0, c1)
            # Merge with what earlier tiles kept: the running top-k is all a later tile needs.
            found = torch.topk(scores, min(k_row, c1 - c0), dim=1).values
            row_best = found if row_best is None else torch.cat([row_best, found], dim=1)
            row_best = torch.topk(row_best, min(k_row, row_best.shape[1]), dim=1).values
            found = torch.topk(scores.T, min(k_col, r1 - r0), dim=1).values
            kept = col_best[block]
            merged = found if kept is None else torch.cat([kept, found], dim=1)
            col_best[block] = torch.topk(merged, min(k_col, merged.shape[1]), dim=1).values
        row_parts.append(row_best)
    return torch.cat(row_parts), torch.cat(col_best)


def _with_extras(op: Opinion, tile, n_rows: int, n_cols: int, evidence: str, tau: float, top_k: int | None,
                 tile_mib: float, work: torch.dtype) -> Opinion:
    """`op` plus the dissonance among each query's top_k candidates and its top belief (SPEC §1)."""
    if top_k is None:
        return op
    budget = max(1, int(tile_mib * 2**20) // torch.tensor([], dtype=work).element_size())
    rows_top, cols_top = _tiled_topk(tile, n_rows, n_cols, min(top_k, n_cols), min(top_k, n_rows), budget)
    extras = {}
    for side, top, log_strength in (("row", rows_top, op.row_log_strength),
                                    ("col", cols_top, op.col_log_strength)):
        log_s = log_strength.to(torch.float64).unsqueeze(1)
        beliefs = torch.exp(log_evidence(top.to(torch.float64), evidence, tau) - log_s)
        extras[f"{side}_top_belief"] = beliefs[:, 0].to(log_strength.dtype)
        extras[f"{side}_dissonance"] = belief_dissonance(beliefs).to(log_strength.dtype)
    return dataclasses.replace(op, top_k=top_k, **extras)


def opinion(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    normalize: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
    top_k: int | None = DEFAULT_TOP_K,
    tile_mib: float = DEFAULT_TILE_MIB,
) -> Opinion:
    """Opinions of the N_q queries x over the gallery y (rows) and of y over x (columns).

    S_i = Σ_j α_ij with α = g(x_i·y_j/τ) + 1, uncertainty u_i = N_g / S_i (SPEC §1); columns
    likewise with N_q. x: (N_q, D), y: (N_g, D); N_q >= 1 and N_g >= 2 may differ. Never stores
    N_q × N_g on a fused backend.

    With top_k (default 10) each query also gets the belief of its top result b_(1) = e_(1)/S
    and the dissonance of its opinion among its top_k candidates (SPEC §1 "dissonance": Jøsang
    et al. 2018; k is capped at the number of candidates of the direction): `row_top_belief`,
    `row_dissonance` (N_q,), `col_top_belief`, `col_dissonance` (N_g,). They take one more pass
    over x·yᵀ in tiles of at most `tile_mib` MiB of scores (no N_q × N_g buffer on any backend;
    beyond the tile, only the running top-k values, (N_q + N_g)·k, are kept). top_k=None skips
    that pass and leaves them None.
    """
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    normalize = checks.flag(normalize, "normalize")
    check_finite = checks.flag(check_finite, "check_finite")
    top_k, tile_mib = _top_k_value(top_k), _tile_mib_value(tile_mib)
    x, y = checks.embedding_pair(x, y, check_finite, square=False)
    impl = backends.resolve(backend, x.device)
    with torch.no_grad():
        if normalize:
            x, y = unit_rows(x, y)
        op = impl.opinion(x, y, evidence, tau)
        if top_k is None:
            return op
        work = checks.output_dtype(x.dtype)
        xw, yw = x.detach().to(work), y.detach().to(work)
        # The same exact float32 products as the op's S ("ieee"), whatever torch's TF32 switch says.
        with backends.matmul_precision("ieee"):
            return _with_extras(op, lambda r0, r1, c0, c1: xw[r0:r1] @ yw[c0:c1].T, x.shape[0], y.shape[0],
                                evidence, tau, top_k, tile_mib, work)


def opinion_from_similarity(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    backend: str = "auto",
    check_finite: bool = True,
    top_k: int | None = DEFAULT_TOP_K,
    tile_mib: float = DEFAULT_TILE_MIB,
) -> Opinion:
    """`opinion` for a given (N_q, N_g) similarity matrix (N_q >= 1, N_g >= 2), with the same
    top belief and dissonance extras (top_k, tile_mib) read from s tile by tile."""
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    check_finite = checks.flag(check_finite, "check_finite")
    top_k, tile_mib = _top_k_value(top_k), _tile_mib_value(tile_mib)
    s = checks.similarity_matrix(s, check_finite, square=False)
    impl = backends.resolve(backend, s.device)
    with torch.no_grad():
        op = impl.opinion_from_similarity(s, evidence, tau)
        work = checks.output_dtype(s.dtype)
        sd = s.detach()
        return _with_extras(op, lambda r0, r1, c0, c1: sd[r0:r1, c0:c1].to(work), s.shape[0], s.shape[1],
                            evidence, tau, top_k, tile_mib, work)


def belief(s: Tensor, log_strength: Tensor, *, evidence: str = "exp", tau: float = 0.05, dim: int = 1) -> Tensor:
    """Belief b = e / S of selected results (e.g. each query's top-k), SPEC §1.

    s: (N_q, M) similarities of the results; log_strength: the queries' `row_log_strength`
    (N_q,) for dim=1, or the `col_log_strength` (M,) of column queries for dim=0.
    """
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    s = checks.float_matrix(s, "s", True, min_rows=1)
    if not isinstance(log_strength, Tensor) or not log_strength.is_floating_point():
        got = log_strength.dtype if isinstance(log_strength, Tensor) else type(log_strength).__name__
        raise TypeError(f"log_strength must be a floating torch.Tensor, got {got}")
    if log_strength.device != s.device:
        raise ValueError(f"log_strength is on {log_strength.device} but s is on {s.device}")
    if log_strength.dim() != 1 or log_strength.shape[0] != s.shape[1 - dim]:
        raise ValueError(
            f"log_strength must have shape ({s.shape[1 - dim]},) for s of shape {tuple(s.shape)} and "
            f"dim={dim}, got {tuple(log_strength.shape)}"
        )
    checks.require_finite(log_strength, "log_strength")
    return _belief(s, log_strength, evidence=evidence, tau=tau, dim=dim)
