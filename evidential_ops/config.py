"""The validated, immutable description of one evidential loss call (shared by every backend)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

EVIDENCE_KINDS = ("exp", "relu", "softplus", "exp_tanh")  # SPEC §1
TERMS = ("risk", "kl", "mse", "fmse", "logdet")  # SPEC §2, in this order everywhere
DIRECTIONS = ("rows", "cols", "both")
REDUCTIONS = ("mean", "mean_of_directions", "sum", "none")
MATMUL_PRECISIONS = ("ieee", "tf32")
DEFAULT_WEIGHTS = {"risk": 1.0, "kl": 0.1}
NORMALIZE_EPS = 1e-12  # F.normalize eps of normalize=True (SPEC notation)

__all__ = [
    "DEFAULT_WEIGHTS",
    "DIRECTIONS",
    "EVIDENCE_KINDS",
    "LossConfig",
    "MATMUL_PRECISIONS",
    "NORMALIZE_EPS",
    "REDUCTIONS",
    "TERMS",
]


@dataclass(frozen=True)
class LossConfig:
    """Keyword arguments of `evidential_loss`, checked (see `checks.loss_config`).

    weights: one weight per entry of TERMS (risk, kl, mse, fmse, logdet), zero when disabled: a
        float, or a 0-d float CPU tensor (see `checks.weight_tuple`).
    enabled: which TERMS the kernels compute: those named in the weights dict (with a non-zero
        weight in eager mode; under torch.compile the weights are symbolic, so every named term).
    """

    evidence: str
    tau: float
    weights: tuple
    enabled: tuple[bool, bool, bool, bool, bool]
    direction: str
    reduction: str
    check_finite: bool
    matmul_precision: str

    @property
    def weight_dict(self) -> dict[str, float]:
        """{term: weight} of the enabled terms."""
        return {term: w for term, w, on in zip(TERMS, self.weights, self.enabled) if on}

    @property
    def rows(self) -> bool:
        return self.direction in ("rows", "both")

    @property
    def cols(self) -> bool:
        return self.direction in ("cols", "both")

    def reduce(self, rows: Tensor, cols: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Apply `reduction` to per-row and per-column losses (either may be empty).

        "mean": mean(rows) + mean(cols) (the TCL/UML/DUQ papers' sum of the two directions);
        "mean_of_directions": (mean(rows) + mean(cols)) / 2, open_clip ClipLoss's averaging (half
        of "mean", so swapping ClipLoss for this loss keeps the effective learning rate); "sum":
        sum of both; "none": (rows, cols) unchanged. One direction alone: its mean or sum.
        """
        if self.reduction == "none":
            return rows, cols
        parts = [part for part, present in ((rows, self.rows), (cols, self.cols)) if present]
        values = [part.sum() if self.reduction == "sum" else part.mean() for part in parts]
        total = values[0] if len(values) == 1 else values[0] + values[1]
        return total / len(values) if self.reduction == "mean_of_directions" else total
