"""Public evidential loss API (README "API", SPEC §2-3, §5)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from . import backends, checks
from .evidence import unit_rows

LossOutput = Tensor | tuple[Tensor, Tensor]


def evidential_loss(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    weights: Mapping[str, float] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    normalize: bool = False,
    reduction: str = "mean",
    backend: str = "auto",
    check_finite: bool = True,
    matmul_precision: str = "ieee",
) -> LossOutput:
    """Evidential retrieval loss of the similarity matrix s = x·yᵀ, differentiable in x and y.

    Row i is query x_i over the K candidates y (i2t), column j is query y_j over x (t2i); the
    positive of each is the diagonal. Evidence e = g(s/τ) (SPEC §1), α = e + 1, and every row or
    column contributes Σ_term weights[term]·term (SPEC §2):
    risk (TCL eq. 7), kl (TCL eq. 9), mse (DUQ eq. 6), fmse (UML eq. 7), logdet (UML eq. 8).

    Args:
        x, y: (K, D) float32/float16/bfloat16/float64, same dtype and device, K >= 2.
            L2-normalised by the caller unless normalize=True (then eps 1e-12, differentiated).
        evidence: "exp" | "relu" | "softplus" | "exp_tanh".   tau: temperature τ > 0.
        weights: {term: weight}; default {"risk": 1.0, "kl": 0.1} (TCL with λ = 0.1).
            TCL = {risk: 1, kl: λ}; UML = {fmse: 1, logdet: −φ}; DUQ ISUM = {mse: 1}.
        direction: "rows", "cols" or "both".
        target_scale: optional (K,) c in [0, 1]: target of row i and column i is c_i·one-hot(i)
            (UML's clean/noisy label). A constant: no gradient flows into it.
        reduction: "mean" → mean(rows) + mean(cols); "sum"; "none" → (rows (K,), cols (K,)),
            an empty tensor for a direction not computed.
        backend: "auto" (fastest available for the device), "reference", "cpu", ...
        check_finite: reject NaN/Inf inputs (costs a read of x and y).
        matmul_precision: "ieee" (default) or "tf32" (CUDA only; ~3e-4 relative error in e).

    Returns:
        A float32 scalar (float64 for float64 inputs), or the (rows, cols) pair for "none".
    """
    config = checks.loss_config(
        evidence=evidence, tau=tau, weights=weights, direction=direction, reduction=reduction,
        check_finite=check_finite, matmul_precision=matmul_precision,
    )
    x, y = checks.embedding_pair(x, y, check_finite)
    checks.flag(normalize, "normalize")
    c = checks.target_scale_vector(target_scale, x.shape[0], x, check_finite)
    impl = backends.resolve(backend, x.device)
    if normalize:
        x, y = unit_rows(x, y)
    rows, cols = impl.losses(x, y, c, config)
    return config.reduce(rows, cols)


def evidential_loss_from_similarity(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    weights: Mapping[str, float] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    reduction: str = "mean",
    backend: str = "auto",
    check_finite: bool = True,
) -> LossOutput:
    """`evidential_loss` for a given (K, K) similarity matrix s (positives on the diagonal),
    differentiable in s. Same keywords and return values (SPEC §2)."""
    config = checks.loss_config(
        evidence=evidence, tau=tau, weights=weights, direction=direction, reduction=reduction,
        check_finite=check_finite,
    )
    s = checks.similarity_matrix(s, check_finite)
    c = checks.target_scale_vector(target_scale, s.shape[0], s, check_finite)
    impl = backends.resolve(backend, s.device)
    rows, cols = impl.losses_from_similarity(s, c, config)
    return config.reduce(rows, cols)


class EvidentialLoss(nn.Module):
    """Drop-in criterion: `EvidentialLoss(**keywords)(x, y)` == `evidential_loss(x, y, **keywords)`.

    With from_similarity=True it is called as `loss_fn(s)` on a (K, K) similarity matrix.
    `weights` is a plain attribute: anneal it between steps (e.g. TCL's λ) with
    `loss_fn.weights = {"risk": 1.0, "kl": lam}`. Keywords are validated at construction.
    """

    def __init__(
        self,
        *,
        evidence: str = "exp",
        tau: float = 0.05,
        weights: Mapping[str, float] | None = None,
        direction: str = "both",
        normalize: bool = False,
        reduction: str = "mean",
        backend: str = "auto",
        check_finite: bool = True,
        matmul_precision: str = "ieee",
        from_similarity: bool = False,
    ):
        super().__init__()
        checks.loss_config(
            evidence=evidence, tau=tau, weights=weights, direction=direction, reduction=reduction,
            check_finite=check_finite, matmul_precision=matmul_precision,
        )
        checks.flag(normalize, "normalize")
        checks.flag(from_similarity, "from_similarity")
        backends.check_name(backend)
        self.evidence = evidence
        self.tau = tau
        self.weights = dict(weights) if weights is not None else None
        self.direction = direction
        self.normalize = normalize
        self.reduction = reduction
        self.backend = backend
        self.check_finite = check_finite
        self.matmul_precision = matmul_precision
        self.from_similarity = from_similarity

    def forward(self, x: Tensor, y: Tensor | None = None, target_scale: Tensor | None = None) -> LossOutput:
        keywords = dict(
            evidence=self.evidence, tau=self.tau, weights=self.weights, direction=self.direction,
            target_scale=target_scale, reduction=self.reduction, backend=self.backend,
            check_finite=self.check_finite,
        )
        if self.from_similarity:
            if y is not None:
                raise ValueError("y must be None when from_similarity=True (pass the (K, K) matrix only)")
            return evidential_loss_from_similarity(x, **keywords)
        if y is None:
            raise ValueError("y is required (or construct EvidentialLoss(from_similarity=True))")
        return evidential_loss(
            x, y, normalize=self.normalize, matmul_precision=self.matmul_precision, **keywords
        )

    def extra_repr(self) -> str:
        return (
            f"evidence={self.evidence!r}, tau={self.tau}, weights={self.weights}, "
            f"direction={self.direction!r}, reduction={self.reduction!r}, backend={self.backend!r}"
        )
