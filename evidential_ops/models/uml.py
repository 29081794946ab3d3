"""UML: uncertainty-aware mutual learning for cross-lingual cross-modal retrieval under noisy
(machine-translated) correspondence (SPEC §3 "UML"; UML paper §3, Algorithm 1).

Three views per triplet i: visual v_i, English caption s_i (clean annotation), non-English
caption t_i (machine translation, possibly another sample's: noisy correspondence). One batch:

- s_vt, s_vs, s_st = cosine similarities (`reference.methods.uml_similarities` layout), never
  formed as K×K matrices in a training step: every term below reads the embeddings;
- clean/noisy labels l^{vt}, l^{vs} from the current evidence (eq. 4, no gradient,
  `methods.uml_clean_labels_from_embeddings`, in row strips); the split D_c / D_n of eq. 12 is l^{vt};
- L_u = σ(t)·L_u^{vs} + (1 − σ(t))·L_u^{vt} (eq. 11), each view's L_u,i = L^e(row i) + L^e(col i)
  with L^e = fmse − φ·logdet and target l_i·one-hot(i), computed by the fused `evidential_loss`
  from the embeddings (weights {fmse: 1, logdet: −φ}, target_scale = labels);
- L_aml (eq. 19, `methods.uml_aml_loss_from_embeddings`, in row strips); L_total =
  mean_i(L_u,i + β·L_aml,i) (eq. 20).

Retrieval at test time is vision ↔ non-English (the paper's protocol); vision ↔ English is
reported too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import checks
from ..config import EVIDENCE_KINDS
from ..backends import check_name
from ..data.types import CrossModalSplit
from ..losses import evidential_loss
from ..metrics import retrieval_metrics
from ..opinion import opinion, opinion_from_similarity
from ..methods import uml_aml_loss_from_embeddings, uml_clean_labels_from_embeddings, uml_sigma
from ..methods.uml import (
    DEFAULT_AML_TAU,
    DEFAULT_BETA,
    DEFAULT_EVIDENCE,
    DEFAULT_GAMMA,
    DEFAULT_LAMBDA_S,
    DEFAULT_PHI,
    DEFAULT_TAU,
)
from ._steps import apply_update, check_grad_clip, check_optimizer, full_precision, module_device, move_batch
from .chunking import ChunkedEncoding
from .dual_encoder import batch_tensor, embed_split
from .encoders import AttentionPoolEncoder, GRUTextEncoder, l2_normalize

__all__ = ["UML", "UMLStep"]


@dataclass(frozen=True)
class UMLStep:
    """One UML batch (SPEC §3 "UML").

    loss: scalar L_total (differentiable). uncertainty_loss, aml_loss: (K,) per-triplet L_u and
    L_aml. labels_vt, labels_vs: (K,) bool clean labels of eq. 4 (during warm-up the losses
    use all-clean labels instead, these are still eq. 4's). uncertainty_vt: (K,) per-pair
    uncertainty ½(u^{v2t}_i + u^{t2v}_i) of the vision-non-English view, u = K/S (eq. 2), no
    gradient. sigma: σ(t). similarity_vt: (K,) each pair's own cosine s^{vt}_ii, no gradient
    (the free baseline a noisy-pair detector must beat).
    """

    loss: Tensor
    uncertainty_loss: Tensor
    aml_loss: Tensor
    labels_vt: Tensor
    labels_vs: Tensor
    uncertainty_vt: Tensor
    sigma: float
    similarity_vt: Tensor | None = None


class UML(ChunkedEncoding, nn.Module):
    """UML around three encoders (SPEC §3 "UML"; UML paper).

    Args:
        visual_encoder: images -> (B, D). english_encoder, other_encoder: (tokens, lengths) ->
            (B, D) for the English ("captions") and non-English ("captions_alt") captions.
        total_epochs: E of σ(t) = max(γ, 1 − λ_s·t/E).
        evidence, tau: exp_tanh, 0.1 (eq. 1). With exp_tanh every evidence lies in [1/e, e], so
            α ∈ [1.37, 3.72] and the uncertainty u = N/S is confined to [0.27, 0.73] whatever τ and
            the training do: it can neither say "sure" nor "no idea", and noisy and clean pairs
            differ by hundredths in mean u. evidence="exp" (any τ) frees it; the pipelines offer
            it as `--evidence exp --tau T` (docs/uncertainty_quality.md has its measured effect).
        phi: φ (0.01). gamma, lambda_s: σ schedule (0.2, 4).
        beta: β of eq. 20 (0.6 image-text, 0.4 video). aml_tau: AML softmax temperature (0.1).
        warmup_epochs: [choice] epochs (0-based t < warmup_epochs) in which every pair is
            treated as clean in the losses (l = 1); eq. 4's labels are still computed and
            reported. Eq. 4 needs evidence that already ranks the true pair first: the paper
            starts from pretrained CLIP/mBERT, while encoders trained from scratch judge ~95 % of
            pairs noisy at initialisation, get all-zero targets and never learn (the standard
            warm-up of noisy-correspondence learning, e.g. NCR). 0 = the paper as written.
        grad_clip: max gradient norm or None. backend: fused-op backend ("auto").
        chunk_size: None, or encode batches in checkpointed chunks of this many samples while
            training (`models.chunking`; encoders of the form norm(features(...))).
    """

    _CHUNKED_ENCODERS = ("visual_encoder", "english_encoder", "other_encoder")
    EVIDENCE_KINDS = EVIDENCE_KINDS  # any map of SPEC §1 (eq. 1 uses exp_tanh)

    def __init__(self, visual_encoder: nn.Module, english_encoder: nn.Module, other_encoder: nn.Module, *,
                 total_epochs: int, evidence: str = DEFAULT_EVIDENCE, tau: float = DEFAULT_TAU,
                 phi: float = DEFAULT_PHI, gamma: float = DEFAULT_GAMMA, lambda_s: float = DEFAULT_LAMBDA_S,
                 beta: float = DEFAULT_BETA, aml_tau: float = DEFAULT_AML_TAU, warmup_epochs: int = 0,
                 grad_clip: float | None = 2.0, backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        for name, m in (("visual_encoder", visual_encoder), ("english_encoder", english_encoder),
                        ("other_encoder", other_encoder)):
            if not isinstance(m, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(m).__name__}")
        self.visual_encoder = visual_encoder
        self.english_encoder = english_encoder
        self.other_encoder = other_encoder
        self.total_epochs = checks.integer(total_epochs, "total_epochs", minimum=1)
        self.evidence = checks.evidence_kind(evidence)
        self.tau = checks.tau_value(tau)
        self.phi = checks.real_number(phi, "phi", minimum=0.0)
        self.gamma = checks.real_number(gamma, "gamma", minimum=0.0, maximum=1.0)
        self.lambda_s = checks.real_number(lambda_s, "lambda_s", minimum=0.0)
        self.beta = checks.real_number(beta, "beta", minimum=0.0)
        self.aml_tau = checks.positive_number(aml_tau, "aml_tau")
        self.warmup_epochs = checks.integer(warmup_epochs, "warmup_epochs", minimum=0)
        self.grad_clip = check_grad_clip(grad_clip)
        self.backend = check_name(backend)
        self.chunk_size = chunk_size

    @classmethod
    def default(cls, feat_dim: int, vocab_size: int, alt_vocab_size: int, *, total_epochs: int,
                embed_dim: int = 128, bidirectional: bool = True, **kwargs) -> UML:
        """UML with attention pooling over regions and one (Bi-)GRU per language."""
        return cls(
            AttentionPoolEncoder(feat_dim, embed_dim, hidden_dim=embed_dim),
            GRUTextEncoder(vocab_size, embed_dim, word_dim=64, bidirectional=bidirectional),
            GRUTextEncoder(alt_vocab_size, embed_dim, word_dim=64, bidirectional=bidirectional),
            total_epochs=total_epochs, **kwargs,
        )

    # -- embeddings -----------------------------------------------------------------------------
    def embed(self, batch) -> tuple[Tensor, Tensor, Tensor]:
        """Unit-norm (K, D) embeddings (v, s, t) of a batch with captions and captions_alt."""
        images = batch_tensor(batch, "images")
        v = l2_normalize(self._encode(self.visual_encoder, images))
        s = l2_normalize(self._encode(self.english_encoder, batch_tensor(batch, "captions"),
                                      batch_tensor(batch, "lengths")))
        t = l2_normalize(self._encode(self.other_encoder, batch_tensor(batch, "captions_alt"),
                                      batch_tensor(batch, "lengths_alt")))
        return v, s, t

    def view_loss(self, x: Tensor, y: Tensor, labels: Tensor) -> Tensor:
        """(K,) L_u^{view}_i = L^e(row i) + L^e(column i) of s = x·yᵀ, L^e = fmse − φ·logdet (UML
        eq. 6-10), target l_i·one-hot(i): the fused `evidential_loss` from the embeddings (no K×K)."""
        rows, cols = evidential_loss(
            x, y, evidence=self.evidence, tau=self.tau, weights={"fmse": 1.0, "logdet": -self.phi},
            target_scale=labels.to(x.dtype), reduction="none", backend=self.backend,
        )
        return rows + cols

    def step(self, batch, epoch: int) -> UMLStep:
        """Forward one batch and build L_total (eq. 20) with its parts; see `UMLStep`."""
        epoch = checks.real_number(epoch, "epoch", minimum=0.0)
        batch = move_batch(batch, module_device(self))
        v, s, t = self.embed(batch)
        with full_precision(self):
            return self._terms(v, s, t, epoch)

    def _terms(self, v: Tensor, s: Tensor, t: Tensor, epoch: float) -> UMLStep:
        # Every term from the embeddings: no K×K similarity matrix is formed (s_vt = v·tᵀ,
        # s_vs = v·sᵀ in the notation of `reference.methods.uml_similarities`).
        v_fixed, s_fixed, t_fixed = v.detach(), s.detach(), t.detach()
        labels_vt = uml_clean_labels_from_embeddings(v_fixed, t_fixed, evidence=self.evidence, tau=self.tau)
        labels_vs = uml_clean_labels_from_embeddings(v_fixed, s_fixed, evidence=self.evidence, tau=self.tau)
        sigma = uml_sigma(epoch, self.total_epochs, gamma=self.gamma, lambda_s=self.lambda_s)
        if epoch < self.warmup_epochs:
            train_vt = train_vs = torch.ones_like(labels_vt)
        else:
            train_vt, train_vs = labels_vt, labels_vs
        uncertainty = sigma * self.view_loss(v, s, train_vs) + (1.0 - sigma) * self.view_loss(v, t, train_vt)
        aml = uml_aml_loss_from_embeddings(v, s, t, train_vt, aml_tau=self.aml_tau)
        op = opinion(v_fixed, t_fixed, evidence=self.evidence, tau=self.tau, backend=self.backend, top_k=None)
        return UMLStep(
            loss=(uncertainty + self.beta * aml).mean(), uncertainty_loss=uncertainty, aml_loss=aml,
            labels_vt=labels_vt, labels_vs=labels_vs,
            uncertainty_vt=0.5 * (op.row_uncertainty + op.col_uncertainty), sigma=sigma,
            similarity_vt=(v_fixed * t_fixed).sum(dim=1),
        )

    def losses(self, batch, epoch: int) -> dict[str, Tensor]:
        """L_total (eq. 20) of one batch and what a log shows, without stepping (docs/training.md).

        Returns 0-D tensors: "loss" = L_total (differentiable, `step`), and detached sigma (σ(t),
        float64), clean_fraction (share of l^{vt} = 1) and, when the batch carries the ground
        truth "noisy" (synthetic data), split_accuracy, uncertainty_clean and uncertainty_noisy
        (`split_statistics`, float64; NaN for an empty group). epoch may be fractional (σ(t)).
        Call it with the model in train mode.
        """
        out = self.step(batch, epoch)
        parts = {"loss": out.loss, "sigma": torch.tensor(out.sigma, dtype=torch.float64),
                 "clean_fraction": out.labels_vt.float().mean()}
        if isinstance(batch, dict) and isinstance(batch.get("noisy"), Tensor):
            statistics = split_statistics(out.labels_vt.cpu(), batch["noisy"].cpu(), out.uncertainty_vt.cpu())
            parts.update({name: torch.tensor(value, dtype=torch.float64) for name, value in statistics.items()})
        return parts

    def training_step(self, batch, epoch: int, optimizer: torch.optim.Optimizer) -> dict:
        """One optimiser update on L_total (UML Algorithm 1, steps 3-15): `losses` stepped with
        `optimizer` (norm clipping at grad_clip). Usable in any loop.

        Returns floats: loss, sigma, clean_fraction (share of l^{vt} = 1) and, when the batch
        carries the ground truth "noisy" (synthetic data), split_accuracy (l^{vt} = not noisy),
        uncertainty_clean and uncertainty_noisy (mean pair uncertainty of each true group; NaN
        for an empty group).
        """
        check_optimizer(optimizer)
        self.train()
        return apply_update(self.losses(batch, epoch), optimizer, self.parameters(), self.grad_clip)

    # -- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def audit(self, batches) -> dict:
        """The clean/noisy judgement of eq. 4 and the pair uncertainty of every training pair,
        batch by batch as in training (UML Fig. 5), in eval mode and without gradient.

        batches: an iterable of training batches (e.g. the training DataLoader), each with
        captions_alt and, for synthetic data, the ground truth "noisy".
        Returns concatenated CPU tensors: labels_vt (N,) bool (True = judged clean),
        uncertainty_vt (N,) float, similarity_vt (N,) the pairs' own cosines, and noisy (N,) bool
        when every batch carries it.
        """
        was_training = self.training
        self.eval()
        labels, uncertainty, similarity, noisy = [], [], [], []
        try:
            for batch in batches:
                out = self.step(batch, self.total_epochs)
                labels.append(out.labels_vt.cpu())
                uncertainty.append(out.uncertainty_vt.cpu())
                similarity.append(out.similarity_vt.cpu())
                truth = batch.get("noisy") if isinstance(batch, dict) else None
                noisy.append(truth.cpu().bool() if isinstance(truth, Tensor) else None)
        finally:
            self.train(was_training)
        if not labels:
            raise ValueError("batches is empty")
        result = {"labels_vt": torch.cat(labels), "uncertainty_vt": torch.cat(uncertainty),
                  "similarity_vt": torch.cat(similarity)}
        if all(t is not None for t in noisy):
            result["noisy"] = torch.cat(noisy)
        return result

    @torch.no_grad()
    def evaluate(self, split: CrossModalSplit, *, batch_size: int = 512) -> dict:
        """Retrieval metrics (SPEC §4) of vision ↔ non-English (top level, the paper's protocol)
        and of vision ↔ English ("english" sub-dict), with the median query uncertainties
        u = N/S of the non-English view over the gallery."""
        if not split.has_alt:
            raise ValueError(f"split {split.name!r} has no second-language captions; UML needs them")
        was_training = self.training
        self.eval()
        device = module_device(self)
        try:
            v, t = embed_split(self._images, self._other, split, language="alt", batch_size=batch_size, device=device)
            _, s = embed_split(self._images, self._english, split, language="en", batch_size=batch_size,
                               device=device)
        finally:
            self.train(was_training)
        c = split.captions_per_image
        metrics = retrieval_metrics(v @ t.T, c)
        metrics["english"] = retrieval_metrics(v @ s.T, c)
        op = opinion_from_similarity(v @ t.T, evidence=self.evidence, tau=self.tau, backend=self.backend)
        metrics["uncertainty_v2t_median"] = float(op.row_uncertainty.double().quantile(0.5))
        metrics["uncertainty_t2v_median"] = float(op.col_uncertainty.double().quantile(0.5))
        return metrics

    @torch.no_grad()
    def similarity(self, split: CrossModalSplit, *, language: str = "alt", batch_size: int = 512) -> Tensor:
        """(N, N·c) cosine similarities of a split's images × captions in `language` ("alt": the
        non-English view of the paper's protocol, "en": English), in eval mode."""
        if language not in ("en", "alt"):
            raise ValueError(f"language must be 'en' or 'alt', got {language!r}")
        if language == "alt" and not split.has_alt:
            raise ValueError(f"split {split.name!r} has no second-language captions; UML needs them")
        was_training = self.training
        self.eval()
        try:
            text_fn = self._other if language == "alt" else self._english
            v, t = embed_split(self._images, text_fn, split, language=language, batch_size=batch_size,
                               device=module_device(self))
        finally:
            self.train(was_training)
        return v @ t.T

    def _images(self, images: Tensor) -> Tensor:
        return l2_normalize(self._encode(self.visual_encoder, images))

    def _english(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        return l2_normalize(self._encode(self.english_encoder, tokens, lengths))

    def _other(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        return l2_normalize(self._encode(self.other_encoder, tokens, lengths))


def split_statistics(labels_vt: Tensor, noisy: Tensor, uncertainty: Tensor) -> dict:
    """Accuracy of the clean/noisy split against the ground truth and the mean uncertainty of
    truly clean and truly noisy pairs (UML Fig. 5). labels_vt (K,) bool (True = judged clean),
    noisy (K,) bool ground truth, uncertainty (K,). NaN for an empty group."""
    if labels_vt.shape != noisy.shape or uncertainty.shape != noisy.shape:
        raise ValueError(f"labels_vt {tuple(labels_vt.shape)}, noisy {tuple(noisy.shape)} and uncertainty "
                         f"{tuple(uncertainty.shape)} must have the same shape")
    noisy = noisy.bool()
    u = uncertainty.double()
    mean = lambda m: float(u[m].mean()) if bool(m.any()) else float("nan")
    return {
        "split_accuracy": float((labels_vt.bool() == ~noisy).double().mean()),
        "uncertainty_clean": mean(~noisy),
        "uncertainty_noisy": mean(noisy),
    }
