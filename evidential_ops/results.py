"""Result types shared by every backend."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Opinion:
    """Subjective opinions of every query in both directions (SPEC §1).

    Row i is query x_i over the N_g candidates y; column j is query y_j over the N_q candidates x.
    Strengths are kept as logarithms because exp evidence at small τ exceeds float32 (e^100 at
    τ = 0.01); `uncertainty = N / S` is formed from them without overflow.

    Shapes: row_log_strength, row_uncertainty: (N_q,); col_log_strength, col_uncertainty: (N_g,).

    Filled by `evidential_ops.opinion` on top of any backend (None when top_k=None, and in what
    a backend itself returns): row_dissonance, row_top_belief (N_q,) and col_dissonance,
    col_top_belief (N_g,), the dissonance of each query's opinion among its `top_k` most
    believed candidates and the belief of its top result (SPEC §1); top_k: the k asked for
    (each direction uses min(top_k, its number of candidates)).
    """

    row_log_strength: Tensor
    row_uncertainty: Tensor
    col_log_strength: Tensor
    col_uncertainty: Tensor
    row_dissonance: Tensor | None = None
    row_top_belief: Tensor | None = None
    col_dissonance: Tensor | None = None
    col_top_belief: Tensor | None = None
    top_k: int | None = None

    @property
    def row_strength(self) -> Tensor:
        """S_i = Σ_j α_ij (inf only where S exceeds the dtype's range; prefer the log)."""
        return self.row_log_strength.exp()

    @property
    def col_strength(self) -> Tensor:
        return self.col_log_strength.exp()

    @staticmethod
    def from_log_strengths(row_log_strength: Tensor, col_log_strength: Tensor) -> "Opinion":
        """The opinion of ln S of every query row (M,) and candidate column (N,) (SPEC §4): the
        uncertainty of a row is u = N/S over its N candidates, of a column M/S, formed from ln S so
        that it stays finite where S overflows."""
        n_candidates_of_row = col_log_strength.shape[0]
        n_candidates_of_col = row_log_strength.shape[0]
        return Opinion(
            row_log_strength=row_log_strength,
            row_uncertainty=torch.exp(math.log(n_candidates_of_row) - row_log_strength),
            col_log_strength=col_log_strength,
            col_uncertainty=torch.exp(math.log(n_candidates_of_col) - col_log_strength),
        )
