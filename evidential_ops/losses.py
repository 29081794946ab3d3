"""Public evidential loss API (README "API", SPEC §2-3, §5)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from . import backends, checks
from .autocast import autocast_inputs
from .evidence import unit_rows

LossOutput = Tensor | tuple[Tensor, Tensor]


def _run_scaled(run, inv_tau: Tensor | None):
    """run(), whose kernels saw s·(1/τ) at τ = 1 when τ is a tensor: their overflow message then
    names tau=1, so it is re-raised with the tensor's value (eager mode only: under torch.compile
    reading it would break the graph)."""
    try:
        return run()
    except ValueError as error:
        if inv_tau is None or torch.compiler.is_compiling() or not str(error).startswith("tau=1"):
            raise
        raise ValueError(f"tau (a tensor) = {1.0 / float(inv_tau.detach()):.6g}: the kernels ran at tau = 1 on "
                         f"x/tau, and report: {error}") from error


def scaled(t: Tensor, inv_tau: Tensor, check_finite: bool = True) -> Tensor:
    """t·(1/τ) rounded once to t's dtype: the product in float32 at least (a bf16 1/τ would be
    off by up to 2^-9 before it multiplies anything). float16 ends at 65504, where a small τ
    takes x/τ: with check_finite a ValueError naming τ, not the NaN of inf·0 in the products."""
    out = scaled_similarity(t, inv_tau).to(t.dtype)
    if check_finite and t.dtype == torch.float16:
        checks.require(torch.isfinite(out).all(),
                       "tau (a tensor, or logit_scale): x/tau overflows float16 (largest 65504); max|x|/tau must "
                       "stay below it: a larger tau, normalize=True for raw features, or bfloat16/float32 inputs")
    return out


def scaled_similarity(s: Tensor, inv_tau: Tensor) -> Tensor:
    """s·(1/τ) for the kernels at τ = 1, kept in float32 at least: rounding it back to a 16-bit s's
    dtype would round every logit a second time (with bf16, gradients 1.0-2.6e-2 off the
    reference at τ = 0.01-0.02 on random pairs, 0.12 in the hard regime, against SPEC §5's 1e-2),
    and float16 would overflow at a small τ.
    The K×K s exists already; this is one float32 copy of it (SPEC §1 "Learnable temperature")."""
    wide = torch.promote_types(s.dtype, torch.float32)
    return s.to(wide) * inv_tau.to(wide)


def evidential_loss(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float | Tensor | None = None,
    weights: Mapping[str, float | Tensor] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    normalize: bool = False,
    reduction: str = "mean",
    backend: str = "auto",
    check_finite: bool = True,
    matmul_precision: str = "ieee",
    logit_scale: float | Tensor | None = None,
) -> LossOutput:
    """Evidential retrieval loss of the similarity matrix s = x·yᵀ, differentiable in x and y.

    Row i is query x_i over the K candidates y (i2t), column j is query y_j over x (t2i); the
    positive of each is the diagonal. Evidence e = g(s/τ) (SPEC §1), α = e + 1, and every row or
    column contributes Σ_term weights[term]·term (SPEC §2):
    risk (TCL eq. 7), kl (TCL eq. 9), mse (DUQ eq. 6), fmse (UML eq. 7), logdet (UML eq. 8).

    Args:
        x, y: (K, D) float32/float16/bfloat16/float64, same dtype and device, K >= 2.
            L2-normalised by the caller unless normalize=True (then eps 1e-12, differentiated).
        evidence: "exp" | "relu" | "softplus" | "exp_tanh".
        tau: temperature τ > 0 (default 0.05): a float, or a 0-d tensor on the inputs' device,
            learnable: ∂L/∂τ flows through s/τ = (x/τ)·yᵀ (SPEC §2 "Learnable temperature").
        logit_scale: instead of tau, CLIP's learnable scale: τ = exp(−logit_scale), a float or a
            0-d tensor (s/τ = exp(logit_scale)·x·yᵀ, open_clip's logits).
        weights: {term: weight}; default {"risk": 1.0, "kl": 0.1} (TCL with λ = 0.1).
            TCL = {risk: 1, kl: λ}; UML = {fmse: 1, logdet: −φ}; DUQ ISUM = {mse: 1}. A weight is
            a float or a 0-d float CPU tensor (a constant; a tensor annealed in place never
            recompiles a torch.compile'd step).
        direction: "rows", "cols" or "both".
        target_scale: optional (K,) c in [0, 1]: target of row i and column i is c_i·one-hot(i)
            (UML's clean/noisy label). A constant: no gradient flows into it.
        reduction: "mean" → mean(rows) + mean(cols) (the papers' sum of both directions);
            "mean_of_directions" → half that, open_clip ClipLoss's averaging; "sum";
            "none" → (rows (K,), cols (K,)), an empty tensor for a direction not computed.
        backend: "auto" (fastest available for the device), "reference", "cpu", ...
        check_finite: reject NaN/Inf inputs (costs a read of x and y).
        matmul_precision: "ieee" (default) or "tf32" (CUDA only; ~3e-4 relative error in e).

    Returns:
        A float32 scalar (float64 for float64 inputs), or the (rows, cols) pair for "none".
    """
    x, y = autocast_inputs(x, y)
    x, y = checks.embedding_pair(x, y, check_finite)
    kernel_tau, inv_tau = checks.temperature(tau, logit_scale, x)
    config = checks.loss_config(
        evidence=evidence, tau=kernel_tau, weights=weights, direction=direction, reduction=reduction,
        check_finite=check_finite, matmul_precision=matmul_precision,
    )
    checks.flag(normalize, "normalize")
    c = checks.target_scale_vector(target_scale, x.shape[0], x, check_finite)
    impl = backends.resolve(backend, x.device)
    if normalize:
        x, y = unit_rows(x, y)
    if inv_tau is not None:
        x = scaled(x, inv_tau, check_finite)
    rows, cols = _run_scaled(lambda: impl.losses(x, y, c, config), inv_tau)
    return config.reduce(rows, cols)


def evidential_loss_from_similarity(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float | Tensor | None = None,
    weights: Mapping[str, float | Tensor] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    reduction: str = "mean",
    backend: str = "auto",
    check_finite: bool = True,
    logit_scale: float | Tensor | None = None,
) -> LossOutput:
    """`evidential_loss` for a given (K, K) similarity matrix s (positives on the diagonal),
    differentiable in s (and in a tensor tau or logit_scale). Same keywords and return values
    (SPEC §2)."""
    s = checks.similarity_matrix(s, check_finite)
    kernel_tau, inv_tau = checks.temperature(tau, logit_scale, s)
    config = checks.loss_config(
        evidence=evidence, tau=kernel_tau, weights=weights, direction=direction, reduction=reduction,
        check_finite=check_finite,
    )
    c = checks.target_scale_vector(target_scale, s.shape[0], s, check_finite)
    impl = backends.resolve(backend, s.device)
    if inv_tau is not None:
        s = scaled_similarity(s, inv_tau)
    rows, cols = _run_scaled(lambda: impl.losses_from_similarity(s, c, config), inv_tau)
    return config.reduce(rows, cols)


class EvidentialLoss(nn.Module):
    """Drop-in criterion: `EvidentialLoss(**keywords)(x, y)` == `evidential_loss(x, y, **keywords)`.

    With from_similarity=True it is called as `loss_fn(s)` on a (K, K) similarity matrix.
    `weights` is a plain attribute: anneal it between steps (e.g. TCL's λ) with
    `loss_fn.weights = {"risk": 1.0, "kl": lam}`; under torch.compile hold λ in a 0-d tensor and
    update it in place (`lam.fill_(value)`), which never recompiles. A learnable temperature: pass
    `tau=nn.Parameter(torch.tensor(0.05))` or `logit_scale=nn.Parameter(torch.tensor(ln(1/0.05)))`,
    which then belongs to this module's parameters. Keywords are validated at construction.
    """

    def __init__(
        self,
        *,
        evidence: str = "exp",
        tau: float | Tensor | None = None,
        weights: Mapping[str, float | Tensor] | None = None,
        direction: str = "both",
        normalize: bool = False,
        reduction: str = "mean",
        backend: str = "auto",
        check_finite: bool = True,
        matmul_precision: str = "ieee",
        from_similarity: bool = False,
        logit_scale: float | Tensor | None = None,
    ):
        super().__init__()
        checks.temperature_now(tau, logit_scale)
        checks.loss_config(
            evidence=evidence, weights=weights, direction=direction, reduction=reduction,
            check_finite=check_finite, matmul_precision=matmul_precision,
        )
        checks.flag(normalize, "normalize")
        checks.flag(from_similarity, "from_similarity")
        if from_similarity and (normalize or matmul_precision != "ieee"):
            raise ValueError("normalize and matmul_precision act on embeddings: with from_similarity=True the loss "
                             "takes a given s, so leave them at their defaults (normalize=False, "
                             "matmul_precision='ieee')")
        backends.check_name(backend)
        self.evidence = evidence
        self.tau = checks.DEFAULT_TAU if tau is None and logit_scale is None else tau
        self.logit_scale = logit_scale
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
            evidence=self.evidence, tau=self.tau, logit_scale=self.logit_scale, weights=self.weights,
            direction=self.direction, target_scale=target_scale, reduction=self.reduction, backend=self.backend,
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
        temperature = f"logit_scale={self.logit_scale}" if self.logit_scale is not None else f"tau={self.tau}"
        return (
            f"evidence={self.evidence!r}, {temperature}, weights={self.weights}, "
            f"direction={self.direction!r}, reduction={self.reduction!r}, backend={self.backend!r}"
        )


class EvidentialClipLoss(nn.Module):
    """open_clip-compatible criterion: `loss_fn(image_features, text_features, logit_scale)`.

    The signature and reduction of open_clip's ClipLoss: features (K, D) of the two towers,
    logit_scale the model's learnable log-scale (a 0-d tensor, τ = exp(−logit_scale); ∂L/∂
    logit_scale flows), and the two directions averaged ("mean_of_directions": image→text rows
    and text→image columns). The loss is the evidential one (SPEC §2-3), TCL's by default; the
    other keywords are `evidential_loss`'s. With output_dict=True it returns
    {"contrastive_loss": loss}, as ClipLoss does for open_clip's training loop.
    """

    def __init__(
        self,
        *,
        evidence: str = "exp",
        weights: Mapping[str, float | Tensor] | None = None,
        normalize: bool = False,
        backend: str = "auto",
        check_finite: bool = True,
        matmul_precision: str = "ieee",
    ):
        super().__init__()
        self.loss = EvidentialLoss(
            evidence=evidence, weights=weights, normalize=normalize, reduction="mean_of_directions",
            backend=backend, check_finite=check_finite, matmul_precision=matmul_precision,
        )

    @property
    def weights(self):
        """The term weights (assignable, e.g. TCL's annealed λ)."""
        return self.loss.weights

    @weights.setter
    def weights(self, value) -> None:
        self.loss.weights = dict(value) if value is not None else None

    def forward(self, image_features: Tensor, text_features: Tensor, logit_scale: Tensor | float,
                output_dict: bool = False):
        checks.flag(output_dict, "output_dict")
        if logit_scale is None:  # evidential_loss would take its default τ: never the model's
            raise ValueError("logit_scale is required: the model's learnable log-scale (τ = exp(−logit_scale)), as "
                             "open_clip's ClipLoss takes it")
        loss = evidential_loss(
            image_features, text_features, logit_scale=logit_scale, evidence=self.loss.evidence,
            weights=self.loss.weights, normalize=self.loss.normalize, reduction="mean_of_directions",
            backend=self.loss.backend, check_finite=self.loss.check_finite,
            matmul_precision=self.loss.matmul_precision,
        )
        return {"contrastive_loss": loss} if output_dict else loss
