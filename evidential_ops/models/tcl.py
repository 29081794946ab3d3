"""TCL: trust-consistent learning with two query models (SPEC §3 "TCL"; TCL paper §III,
Algorithm 1).

Model A is the visual-query model (owns the row direction, i2t), model B the textual-query model
(owns the column direction, t2i); each is a `DualEncoder` with its own image and text encoders.

- Step 1: L_u = mean_i[risk_i + λ·kl_i](rows of α_A) + mean_j[risk_j + λ·kl_j](columns of α_B),
  λ = `reference.methods.tcl_kl_weight(epoch)`, computed by the fused `evidential_loss` straight
  from the embeddings (never a K×K matrix on a fused backend).
- Step 2 (epoch >= consistency_start_epoch): T_max rounds, each with a fresh forward of both
  models, of the belief consistency loss L_c (`reference.methods.tcl_consistency_loss`: the owner
  side of each direction detached), one optimiser update per round.
- Inference: ensemble similarity s_A + s_B; per-query uncertainty u = N/S over the gallery from
  the fused `evidential_ops.opinion`; per-result belief b = e/S (`TCLOutput.topk`).

Training from any loop (docs/training.md). One batch of Algorithm 1 is 1 + R optimiser updates,
R = `consistency_rounds(epoch)` (T_max from `consistency_start_epoch` on, else 0), each after a
fresh forward that must see the previous update's weights:

- `losses(batch, epoch)`: step 1 alone, a dict of tensors, "loss" = L_u to backpropagate plus
  the detached parts loss_u, loss_kl, loss_risk and kl_weight. The loss of a trainer that makes
  one update per batch (accelerate, Lightning's automatic optimisation): TCL without step 2.
- `training_updates(batch, epoch)`: the whole of Algorithm 1 for a manual-optimisation trainer,
  a list of 1 + R callables, one per update, each running that update's forward when called
  and returning its loss dict: step 1's first, then one {"loss": L_c, "loss_c"} per round. Call
  them in order, backpropagating each "loss" and stepping the optimiser before the next call
  (inside the autocast context, if any, the forward should run under). All of them encode the
  same batch (TcVSE: the same x').
- `training_step(batch, epoch, optimizer)`: those updates with the plain optimiser, as the CLI
  trains; returns floats.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import checks
from ..backends import check_name
from ..data.types import CrossModalSplit
from ..metrics import TopK, retrieval_metrics
from ..opinion import belief, opinion
from ..methods import tcl_consistency_loss_from_embeddings, tcl_ensemble_similarity, tcl_kl_weight
from ..methods.tcl import DEFAULT_TAU
from ..results import Opinion
from ._steps import (
    apply_update,
    check_epoch,
    check_grad_clip,
    check_optimizer,
    full_precision,
    module_device,
    move_batch,
)
from .data_parallel import loss_function, run_synced
from .dual_encoder import DualEncoder, embed_split
from .encoders import AttentionPoolEncoder, GRUTextEncoder

__all__ = ["TCL", "TCLOutput", "default_tcl_encoder"]

DEFAULT_T_MAX = 3  # TCL §IV-D / released code dis_k


def default_tcl_encoder(feat_dim: int, vocab_size: int, embed_dim: int = 128, *,
                        bidirectional: bool = True, word_dim: int = 64, batch_norm: bool = True) -> DualEncoder:
    """One TCL query model: attention pooling over region features + (Bi-)GRU, mean pooled."""
    return DualEncoder(
        AttentionPoolEncoder(feat_dim, embed_dim, hidden_dim=embed_dim, batch_norm=batch_norm),
        GRUTextEncoder(vocab_size, embed_dim, word_dim=word_dim, pooling="mean", bidirectional=bidirectional,
                       batch_norm=batch_norm),
    )


@dataclass(frozen=True)
class TCLOutput:
    """TCL at test time over a gallery (SPEC §3 "TCL", inference).

    similarity: (N_q, N_g) ensemble s_A + s_B (images × captions), the ranking score.
    similarity_a, similarity_b: (N_q, N_g) each model's cosine similarities.
    opinion_a, opinion_b: each model's opinions (rows: image queries over the N_g captions,
        columns: caption queries over the N_q images), from the fused `opinion`.
    evidence, tau: the evidence map the opinions use.
    """

    similarity: Tensor
    similarity_a: Tensor
    similarity_b: Tensor
    opinion_a: Opinion
    opinion_b: Opinion
    evidence: str
    tau: float

    @property
    def image_query_uncertainty(self) -> Tensor:
        """(N_q,) u = N_g/S of each image query under model A, the owner of i2t."""
        return self.opinion_a.row_uncertainty

    @property
    def text_query_uncertainty(self) -> Tensor:
        """(N_g,) u = N_q/S of each caption query under model B, the owner of t2i."""
        return self.opinion_b.col_uncertainty

    def topk(self, k: int = 10, direction: str = "rows") -> TopK:
        """Top-k of the ensemble ranking, each result with its belief b = e/S under the model that
        owns the direction (A for "rows" = i2t, B for "cols" = t2i) and the query's uncertainty.
        Shapes (N, k) and (N,)."""
        if direction not in ("rows", "cols"):
            raise ValueError(f"direction must be 'rows' or 'cols', got {direction!r}")
        if direction == "rows":
            scores, owner, log_strength = self.similarity, self.similarity_a, self.opinion_a.row_log_strength
            uncertainty = self.opinion_a.row_uncertainty
        else:
            scores, owner, log_strength = self.similarity.T, self.similarity_b.T, self.opinion_b.col_log_strength
            uncertainty = self.opinion_b.col_uncertainty
        k = checks.integer(k, "k", minimum=1)
        if k > scores.shape[1]:
            raise ValueError(f"k must be <= the number of candidates ({scores.shape[1]}), got {k}")
        top = torch.topk(scores, k, dim=1)
        chosen = owner.gather(1, top.indices)
        beliefs = belief(chosen, log_strength, evidence=self.evidence, tau=self.tau, dim=1)
        return TopK(top.indices, top.values, beliefs, uncertainty)


class TCL(nn.Module):
    """Two query models trained with TCL (SPEC §3 "TCL"; TCL paper Algorithm 1).

    Args:
        model_a: visual-query model (`DualEncoder`), owns i2t (rows).
        model_b: textual-query model, owns t2i (columns); same embedding size.
        evidence: "exp" (default), "relu" or "softplus" (TCL eq. 3). tau: τ (0.05).
        t_max: consistency rounds T_max per batch (3). bert: λ rate 0.001 instead of 0.005.
        consistency_start_epoch: first (0-based) epoch with step 2 (SPEC: 1).
        grad_clip: max gradient norm per update, or None (VSE-style training clips at 2).
        backend: backend of the fused evidential ops ("auto": the C++ kernel on CPU).
    """

    EVIDENCE_KINDS = ("exp", "relu", "softplus")  # TCL eq. 3

    def __init__(self, model_a: DualEncoder, model_b: DualEncoder, *, evidence: str = "exp",
                 tau: float = DEFAULT_TAU, t_max: int = DEFAULT_T_MAX, bert: bool = False,
                 consistency_start_epoch: int = 1, grad_clip: float | None = 2.0, backend: str = "auto"):
        super().__init__()
        for name, m in (("model_a", model_a), ("model_b", model_b)):
            if not isinstance(m, DualEncoder):
                raise TypeError(f"{name} must be a DualEncoder, got {type(m).__name__}")
        self.model_a = model_a
        self.model_b = model_b
        self.evidence = checks.evidence_kind(evidence)
        if self.evidence not in self.EVIDENCE_KINDS:
            raise ValueError(f"evidence must be one of {self.EVIDENCE_KINDS} for {type(self).__name__}, "
                             f"got {self.evidence!r}")
        self.tau = checks.tau_value(tau)
        self.t_max = checks.integer(t_max, "t_max", minimum=0)
        self.bert = checks.flag(bert, "bert")
        self.consistency_start_epoch = checks.integer(consistency_start_epoch, "consistency_start_epoch", minimum=0)
        self.grad_clip = check_grad_clip(grad_clip)
        self.backend = check_name(backend)

    @classmethod
    def default(cls, feat_dim: int, vocab_size: int, *, embed_dim: int = 128, bidirectional: bool = True,
                batch_norm: bool = True, **kwargs) -> TCL:
        """TCL with two `default_tcl_encoder` query models (independent initialisations)."""
        encoders = [default_tcl_encoder(feat_dim, vocab_size, embed_dim, bidirectional=bidirectional,
                                        batch_norm=batch_norm) for _ in range(2)]
        return cls(*encoders, **kwargs)

    # -- training -------------------------------------------------------------------------------
    def kl_weight(self, epoch: int) -> float:
        """λ = min(1, 0.005·epoch) (0.001 with bert=True), TCL eq. 10, 0-based epoch."""
        return tcl_kl_weight(epoch, bert=self.bert)

    def _weights(self, epoch: int) -> dict:
        lam = self.kl_weight(epoch)
        # The fused op refuses an all-zero weight set but accepts zeros; dropping kl at λ = 0
        # skips its lgamma/digamma work in the first epoch.
        return {"risk": 1.0, "kl": lam} if lam > 0 else {"risk": 1.0}

    def uncertainty_loss(self, batch, epoch: int, *, parts: dict | None = None) -> Tensor:
        """Step-1 L_u of SPEC §3 "TCL" on one batch (scalar, differentiable in both models).

        Fused `evidential_loss` from the (K, D) embeddings: rows of model A (direction="rows")
        plus columns of model B (direction="cols"), weights {risk: 1, kl: λ(epoch)}. After
        `models.enable_global_batch`, both are the loss of the global batch of all ranks.

        parts: a dict that, when given, receives the floats "loss_kl" (the KL term of both
        directions at weight 1, also while λ = 0) and "loss_risk" (L_u − λ·KL), so that a log
        can tell a loss that rises because λ grows from one that diverges. They cost one more
        forward of the fused op (no gradient, no encoder pass); L_u itself is unchanged.
        """
        terms = self._uncertainty_terms(batch, epoch, with_parts=parts is not None)
        if parts is not None:
            parts["loss_kl"] = float(terms["loss_kl"])
            parts["loss_risk"] = float(terms["loss_risk"])
        return terms["loss"]

    def _uncertainty_terms(self, batch, epoch: int, *, with_parts: bool = True) -> dict:
        """{"loss": L_u} and, with_parts, the detached loss_u, loss_kl (KL at weight 1) and
        loss_risk = L_u − λ·KL (float64, the difference of the exact float64 values)."""
        batch = move_batch(batch, module_device(self))
        x_a, y_a = self.model_a(batch)
        x_b, y_b = self.model_b(batch)
        keywords = dict(evidence=self.evidence, tau=self.tau, weights=self._weights(epoch), backend=self.backend)
        loss = loss_function(self)  # the global batch's loss after models.enable_global_batch
        total = loss(x_a, y_a, direction="rows", **keywords) + loss(x_b, y_b, direction="cols", **keywords)
        terms = {"loss": total}
        if with_parts:
            kl_only = dict(keywords, weights={"kl": 1.0})
            with torch.no_grad():
                kl = (loss(x_a.detach(), y_a.detach(), direction="rows", **kl_only)
                      + loss(x_b.detach(), y_b.detach(), direction="cols", **kl_only))
            terms["loss_u"] = total.detach()
            terms["loss_kl"] = kl
            terms["loss_risk"] = total.detach().double() - self.kl_weight(epoch) * kl.double()
        return terms

    def consistency_loss(self, batch) -> Tensor:
        """Step-2 L_c of SPEC §3 "TCL" with a fresh forward of both models (scalar).

        `reference.methods.tcl_consistency_loss` on s_A = x_A·y_Aᵀ and s_B = x_B·y_Bᵀ: row beliefs
        with A detached (A owns i2t and pulls B), column beliefs with B detached; computed from the
        embeddings in row strips, never a K×K matrix (`methods.tcl_consistency_loss_from_embeddings`).
        """
        batch = move_batch(batch, module_device(self))
        x_a, y_a = self.model_a(batch)
        x_b, y_b = self.model_b(batch)
        with full_precision(self):
            return tcl_consistency_loss_from_embeddings(x_a, y_a, x_b, y_b, evidence=self.evidence, tau=self.tau)

    def consistency_rounds(self, epoch: int) -> int:
        """R, the step-2 updates of one batch at this 0-based epoch: T_max once epoch >=
        consistency_start_epoch, else 0 (SPEC §3 "TCL")."""
        return self.t_max if check_epoch(epoch) >= self.consistency_start_epoch else 0

    def _training_batch(self, batch):
        """The batch every update of a training step encodes (TcVSE: x' = Augment(x))."""
        return batch

    def _step_one(self, batch, epoch: int) -> dict:
        terms = run_synced(self, self._uncertainty_terms, batch, epoch)
        return {"loss": terms["loss"], "loss_u": terms["loss_u"], "loss_kl": terms["loss_kl"],
                "loss_risk": terms["loss_risk"],
                "kl_weight": torch.tensor(self.kl_weight(epoch), dtype=torch.float64)}

    def _consistency_round(self, batch) -> dict:
        loss = run_synced(self, self.consistency_loss, batch)
        return {"loss": loss, "loss_c": loss.detach()}

    def losses(self, batch, epoch: int) -> dict[str, Tensor]:
        """Step 1 of TCL Algorithm 1 on one batch, without stepping (module docstring).

        Returns 0-D tensors: "loss" = L_u (differentiable, `uncertainty_loss`), and detached
        loss_u (= L_u), loss_kl (KL of both directions at weight 1), loss_risk (= L_u − λ·KL,
        float64) and kl_weight (λ = `kl_weight(epoch)`, float64). Step 2 is in
        `training_updates`. Call it with the model in train mode.
        """
        epoch = check_epoch(epoch)
        return self._step_one(self._training_batch(batch), epoch)

    def training_updates(self, batch, epoch: int) -> list[Callable[[], dict[str, Tensor]]]:
        """TCL Algorithm 1 on one batch as its 1 + `consistency_rounds(epoch)` optimiser updates:
        one callable per update, which runs that update's forward when called and returns its
        loss dict: step 1's is `losses(batch, epoch)`, each round's {"loss": L_c (a fresh
        forward, `consistency_loss`), "loss_c": detached L_c}.

        Call them in order, and backpropagate each "loss" and step the optimiser before calling
        the next, or every round sees the same weights. A call runs in the caller's context, so
        an autocast around the call is the autocast of that forward. All updates encode the
        same batch (for TcVSE the augmentation x' is drawn once, at this call).
        """
        epoch = check_epoch(epoch)
        batch = self._training_batch(batch)
        rounds = [functools.partial(self._consistency_round, batch) for _ in range(self.consistency_rounds(epoch))]
        return [functools.partial(self._step_one, batch, epoch), *rounds]

    def training_step(self, batch, epoch: int, optimizer: torch.optim.Optimizer) -> dict:
        """One batch of TCL Algorithm 1: an update on L_u, then T_max updates on L_c (each after a
        fresh forward) once epoch >= consistency_start_epoch; the updates of `training_updates`
        with `optimizer` (norm clipping at grad_clip).

        Returns floats: loss_u, its parts loss_risk and loss_kl (loss_u = loss_risk +
        kl_weight·loss_kl, `uncertainty_loss`), loss_c (mean over the rounds; NaN when step 2 did
        not run), kl_weight (λ), loss (= loss_u + loss_c, or loss_u alone). With λ annealed upward
        (TCL eq. 10) the loss can rise from epoch to epoch while the risk falls.
        """
        epoch = check_epoch(epoch)
        check_optimizer(optimizer)
        self.train()
        first_update, *round_updates = self.training_updates(batch, epoch)
        first = apply_update(first_update(), optimizer, self.parameters(), self.grad_clip)
        rounds = [apply_update(update(), optimizer, self.parameters(), self.grad_clip)["loss"]
                  for update in round_updates]
        loss_c = sum(rounds) / len(rounds) if rounds else math.nan
        return {"loss": first["loss"] + (loss_c if rounds else 0.0), "loss_u": first["loss"],
                "loss_kl": first["loss_kl"], "loss_risk": first["loss_risk"], "loss_c": loss_c,
                "kl_weight": first["kl_weight"]}

    # -- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def infer(self, split: CrossModalSplit, *, batch_size: int = 512) -> TCLOutput:
        """Encode a split with both models and form the ensemble and the opinions (SPEC §3)."""
        was_training = self.training
        self.eval()
        try:
            device = module_device(self)
            xa, ya = embed_split(self.model_a.encode_images, self.model_a.encode_texts, split,
                                 batch_size=batch_size, device=device)
            xb, yb = embed_split(self.model_b.encode_images, self.model_b.encode_texts, split,
                                 batch_size=batch_size, device=device)
        finally:
            self.train(was_training)
        s_a, s_b = xa @ ya.T, xb @ yb.T
        keywords = dict(evidence=self.evidence, tau=self.tau, backend=self.backend)
        return TCLOutput(
            similarity=tcl_ensemble_similarity(s_a, s_b), similarity_a=s_a, similarity_b=s_b,
            opinion_a=opinion(xa, ya, **keywords), opinion_b=opinion(xb, yb, **keywords),
            evidence=self.evidence, tau=self.tau,
        )

    def evaluate(self, split: CrossModalSplit, *, batch_size: int = 512) -> dict:
        """Retrieval metrics (SPEC §4) of the ensemble (top-level keys), of each model
        ("model_a"/"model_b" sub-dicts), and the query uncertainties' medians and means."""
        out = self.infer(split, batch_size=batch_size)
        c = split.captions_per_image
        metrics = retrieval_metrics(out.similarity, c)
        metrics["model_a"] = retrieval_metrics(out.similarity_a, c)
        metrics["model_b"] = retrieval_metrics(out.similarity_b, c)
        metrics.update(uncertainty_summary(out))
        return metrics


def uncertainty_summary(out: TCLOutput) -> dict:
    """Median and mean query uncertainty per direction, from the owning model (floats)."""
    u_i, u_t = out.image_query_uncertainty.double(), out.text_query_uncertainty.double()
    median = lambda u: float(u.quantile(0.5))
    return {
        "uncertainty_i2t_median": median(u_i), "uncertainty_i2t_mean": float(u_i.mean()),
        "uncertainty_t2i_median": median(u_t), "uncertainty_t2i_mean": float(u_t.mean()),
    }
