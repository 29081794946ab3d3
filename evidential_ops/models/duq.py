"""DUQ: dual uncertainty quantification for text-video retrieval (SPEC §3 "DUQ"; DUQ paper
§3, eq. 1-16).

Layout as in the paper and `reference.methods.duq`: rows are texts, columns videos,
s[i, j] = cos(text_i, video_j), positives on the diagonal.

- Feature extraction: a text encoder and a video encoder (attention pooling over frames fused
  with the global mean, the paper's local feature aggregation) give z_t, z_v; s = cos(z_t, z_v).
- ISUM (eq. 4-7): L_S^U = (1/B)(Σ_i mse_i(rows) + Σ_j mse_j(cols)), relu evidence, τ = 1,
  computed by the fused `evidential_loss` from z_t, z_v (weights {mse: 1}); L_S by the fused
  InfoNCE: s itself is never formed in training.
- IDUM (eq. 8-13): linear heads give (μ, σ) per modality, K_p probabilistic embeddings
  z^k = μ + e^σ·ε_k, the distance matrix D with the max (i ≠ j) / min (i = j) rule from strips of
  the sample cosines (`methods.duq_distance_matrix_strips`), L_D and L_D^U in row strips of D
  (`methods.duq_distance_losses`; L_D^U's dense target 1 − I is outside the fused op's c·one-hot
  targets): D and its gradient are the training step's only (B, B) tensors.
- L_total = L_S + L_S^U + α(L_D + L_D^U) + β·L_KL (eq. 15), λ a learned logit scale (CLIP-style,
  clamped at 100).
- Inference: s, D over the whole gallery (max rule: positives unknown), and the re-ranking of
  eq. 16 (`methods.duq_rerank`) per query direction under the model's `rerank_reading`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import checks
from ..backends import check_name
from ..config import NORMALIZE_EPS
from ..data.types import CrossModalSplit
from ..losses import evidential_loss_from_similarity
from ..metrics import retrieval_metrics
from ..methods import (
    duq_distance_losses_strips,
    duq_distance_matrix,
    duq_distance_matrix_strips,
    duq_gaussian_kl,
    duq_probabilistic_embeddings,
    duq_rerank,
    duq_similarity_loss_from_embeddings,
)
from ..methods.duq import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_RERANK_READING,
    RERANK_READINGS,
)
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

__all__ = ["DUQ", "DUQForward", "DUQOutput"]

MAX_LOGIT_SCALE = 100.0  # CLIP clamps its learned scale here
INITIAL_LOGIT_SCALE = 1.0 / 0.07  # CLIP's initial temperature


@dataclass(frozen=True)
class DUQForward:
    """One batch through DUQ. d: (B, B) text × video distances; mu_text, log_sigma_text,
    mu_video, log_sigma_video: (B, D_p) Gaussian parameters; logit_scale: 0-D λ; z_text,
    z_video: (B, D) the unit embeddings. The similarities s = z_text·z_videoᵀ are not stored: the
    training terms on s (L_S, L_S^U) run fused from the embeddings, and `s` forms the matrix on
    request."""

    d: Tensor
    mu_text: Tensor
    log_sigma_text: Tensor
    mu_video: Tensor
    log_sigma_video: Tensor
    logit_scale: Tensor
    z_text: Tensor
    z_video: Tensor

    @property
    def s(self) -> Tensor:
        """(B, B) s = z_text·z_videoᵀ, formed at each access (differentiable)."""
        return self.z_text @ self.z_video.T


@dataclass(frozen=True)
class DUQOutput:
    """DUQ at test time (SPEC §3 "DUQ", eq. 16), in the images × captions layout of
    `metrics.retrieval_metrics` (videos × texts).

    similarity: (N_v, N_t) plain s. distance: (N_v, N_t) D (max rule).
    reranked_v2t: (N_v, N_t) s' of eq. 16 for the video queries (rows);
    reranked_t2v: (N_v, N_t) s' for the text queries (columns), both under `rerank_reading`.
    uncertainty_*: (N,) u_s = N/S over the ISUM evidence relu(s) + 1 and u_d over relu(D) + 1
    of the queries of each direction (v2t: the videos, t2v: the texts).
    """

    similarity: Tensor
    distance: Tensor
    reranked_v2t: Tensor
    reranked_t2v: Tensor
    similarity_uncertainty_v2t: Tensor
    distance_uncertainty_v2t: Tensor
    similarity_uncertainty_t2v: Tensor
    distance_uncertainty_t2v: Tensor
    rerank_reading: str = DEFAULT_RERANK_READING


class DUQ(nn.Module):
    """DUQ around a video and a text encoder (SPEC §3 "DUQ"; DUQ paper).

    Args:
        model: `DualEncoder` (image_encoder = video encoder over frames) with output size D.
        embed_dim: D. prob_dim: D_p of the probabilistic embeddings (default D).
        num_samples: K_p (7). alpha, beta: loss weights (0.1, 1e-4). gamma1, gamma2: re-ranking (0.1).
        rerank_reading: the reading of eq. 16 (`methods.duq_rerank`, [choice]): "nonnegative"
            (default, chosen by measurement), "candidate" (re-ranks by each candidate's own
            uncertainty) or "printed" (eq. 16 as printed).
        logit_scale: initial λ (1/0.07); learn_logit_scale: train λ (clamped at 100).
        initial_log_sigma: [choice] initial log-std of the probabilistic embeddings. The μ heads
            start as the identity (μ = z, when D_p = D) and the log-σ heads as this constant:
            with the default PyTorch init (σ ≈ 1) the K_p samples of a unit-norm z in R^128 are
            almost pure noise, D ≈ 1.3 for every pair and the max/min rule carries no signal.
        grad_clip: max gradient norm or None. backend: fused-op backend ("auto").
    """

    def __init__(self, model: DualEncoder, embed_dim: int, *, prob_dim: int | None = None,
                 num_samples: int = DEFAULT_NUM_SAMPLES, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA,
                 gamma1: float = DEFAULT_GAMMA, gamma2: float = DEFAULT_GAMMA,
                 rerank_reading: str = DEFAULT_RERANK_READING,
                 logit_scale: float = INITIAL_LOGIT_SCALE, learn_logit_scale: bool = True,
                 initial_log_sigma: float = -4.0, grad_clip: float | None = 2.0, backend: str = "auto"):
        super().__init__()
        if not isinstance(model, DualEncoder):
            raise TypeError(f"model must be a DualEncoder, got {type(model).__name__}")
        self.model = model
        embed_dim = checks.integer(embed_dim, "embed_dim", minimum=1)
        prob_dim = embed_dim if prob_dim is None else checks.integer(prob_dim, "prob_dim", minimum=1)
        self.text_mu, self.text_log_sigma = nn.Linear(embed_dim, prob_dim), nn.Linear(embed_dim, prob_dim)
        self.video_mu, self.video_log_sigma = nn.Linear(embed_dim, prob_dim), nn.Linear(embed_dim, prob_dim)
        initial_log_sigma = checks.real_number(initial_log_sigma, "initial_log_sigma")
        with torch.no_grad():
            for mu, log_sigma in ((self.text_mu, self.text_log_sigma), (self.video_mu, self.video_log_sigma)):
                if prob_dim == embed_dim:
                    mu.weight.copy_(torch.eye(embed_dim))
                    mu.bias.zero_()
                log_sigma.weight.zero_()
                log_sigma.bias.fill_(initial_log_sigma)
        self.num_samples = checks.integer(num_samples, "num_samples", minimum=1)
        self.alpha = checks.real_number(alpha, "alpha", minimum=0.0)
        self.beta = checks.real_number(beta, "beta", minimum=0.0)
        self.gamma1 = checks.real_number(gamma1, "gamma1", minimum=0.0)
        self.gamma2 = checks.real_number(gamma2, "gamma2", minimum=0.0)
        self.rerank_reading = checks.choice(rerank_reading, "rerank_reading", RERANK_READINGS)
        scale = checks.real_number(logit_scale, "logit_scale", minimum=1.0, maximum=MAX_LOGIT_SCALE)
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(scale)),
                                            requires_grad=checks.flag(learn_logit_scale, "learn_logit_scale"))
        self.grad_clip = check_grad_clip(grad_clip)
        self.backend = check_name(backend)

    @classmethod
    def default(cls, feat_dim: int, vocab_size: int, *, embed_dim: int = 128, bidirectional: bool = True,
                **kwargs) -> DUQ:
        """DUQ with attention pooling over frames + global fusion and a (Bi-)GRU text encoder."""
        model = DualEncoder(AttentionPoolEncoder(feat_dim, embed_dim, hidden_dim=embed_dim),
                            GRUTextEncoder(vocab_size, embed_dim, word_dim=64, bidirectional=bidirectional))
        return cls(model, embed_dim, **kwargs)

    @property
    def logit_scale(self) -> Tensor:
        """λ = exp(log λ) clamped to [1, 100] (0-D)."""
        return self.log_logit_scale.exp().clamp(1.0, MAX_LOGIT_SCALE)

    def _gaussians(self, z_text: Tensor, z_video: Tensor):
        return (self.text_mu(z_text), self.text_log_sigma(z_text),
                self.video_mu(z_video), self.video_log_sigma(z_video))

    def forward(self, batch, *, generator: torch.Generator | None = None) -> DUQForward:
        """s, D and the Gaussians of one batch (B >= 2 pairs); `generator` seeds the ε draws."""
        batch = move_batch(batch, module_device(self))
        z_video, z_text = self.model(batch)
        with full_precision(self):  # the heads too: D_p-sized, and their μ, σ feed the method terms
            return self._probabilistic(z_text, z_video, generator)

    def _probabilistic(self, z_text: Tensor, z_video: Tensor, generator: torch.Generator | None) -> DUQForward:
        mu_t, ls_t, mu_v, ls_v = self._gaussians(z_text, z_video)
        samples_t = duq_probabilistic_embeddings(mu_t, ls_t, num_samples=self.num_samples, generator=generator)
        samples_v = duq_probabilistic_embeddings(mu_v, ls_v, num_samples=self.num_samples, generator=generator)
        # D from row strips of the sample cosines: never the (B, B, K_p, K_p) tensor.
        return DUQForward(d=duq_distance_matrix_strips(samples_t, samples_v),
                          mu_text=mu_t, log_sigma_text=ls_t, mu_video=mu_v, log_sigma_video=ls_v,
                          logit_scale=self.logit_scale, z_text=z_text, z_video=z_video)

    def isum_loss(self, s: Tensor) -> Tensor:
        """L_S^U (eq. 7) of a (B, B) similarity matrix by the fused op: mse of relu evidence
        (τ = 1), rows + columns, summed / B (`isum_loss_from_embeddings` never forms s)."""
        total = evidential_loss_from_similarity(s, evidence="relu", tau=1.0, weights={"mse": 1.0},
                                                reduction="sum", backend=self.backend)
        return total / s.shape[0]

    def isum_loss_from_embeddings(self, z_text: Tensor, z_video: Tensor) -> Tensor:
        """L_S^U (eq. 7) of s = z_text·z_videoᵀ, (B, D) each, without forming s: the fused op from
        the embeddings, (1/B)(Σ rows + Σ columns) = mean(rows) + mean(cols). After
        `models.enable_global_batch`, that of the global batch of every rank (B = K_global)."""
        return loss_function(self)(z_text, z_video, evidence="relu", tau=1.0, weights={"mse": 1.0}, backend=self.backend)

    def loss_terms(self, out: DUQForward) -> dict:
        """Every term of eq. 15 (differentiable scalars) of a forward and their weighted sum
        under "loss": L_total = L_S + L_S^U + α(L_D + L_D^U) + β·L_KL. Autocast is off here
        (`_steps.full_precision`)."""
        with full_precision(self):
            return self._loss_terms(out)

    def _loss_terms(self, out: DUQForward) -> dict:
        loss_d, loss_d_u = duq_distance_losses_strips(out.d, logit_scale=out.logit_scale)
        parts = {
            "loss_s": duq_similarity_loss_from_embeddings(out.z_text, out.z_video, logit_scale=out.logit_scale,
                                                          backend=self.backend),
            "loss_s_u": self.isum_loss_from_embeddings(out.z_text, out.z_video),
            "loss_d": loss_d,
            "loss_d_u": loss_d_u,
            "loss_kl": duq_gaussian_kl(out.mu_text, out.log_sigma_text) + duq_gaussian_kl(out.mu_video, out.log_sigma_video),
        }
        parts["loss"] = (parts["loss_s"] + parts["loss_s_u"] + self.alpha * (parts["loss_d"] + parts["loss_d_u"])
                         + self.beta * parts["loss_kl"])
        return parts

    def losses(self, batch, epoch: int, *, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """L_total (eq. 15) of one batch and its terms, without stepping (docs/training.md).

        Returns 0-D tensors: the detached terms loss_s, loss_s_u, loss_d, loss_d_u, loss_kl
        (`loss_terms`), "loss" = L_total (differentiable) and logit_scale (the λ of this forward,
        detached). `epoch` is unused (DUQ has no schedule); `generator` seeds the ε draws (None:
        the global torch RNG). Call it with the model in train mode.
        """
        check_epoch(epoch)
        out = run_synced(self, self, batch, generator=generator)
        terms = self.loss_terms(out)
        parts = {name: value.detach() for name, value in terms.items() if name != "loss"}
        parts["loss"] = terms["loss"]
        parts["logit_scale"] = out.logit_scale.detach()
        return parts

    def training_step(self, batch, epoch: int, optimizer: torch.optim.Optimizer, *,
                      generator: torch.Generator | None = None) -> dict:
        """One optimiser update on L_total (eq. 15): `losses` stepped with `optimizer` (norm
        clipping at grad_clip). Usable in any loop; `epoch` is unused (DUQ has no schedule).
        Returns every term as a float, and logit_scale: λ after the update."""
        check_epoch(epoch)
        check_optimizer(optimizer)
        self.train()
        info = apply_update(self.losses(batch, epoch, generator=generator), optimizer, self.parameters(),
                            self.grad_clip)
        info["logit_scale"] = float(self.logit_scale.detach())
        return info

    # -- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def infer(self, split: CrossModalSplit, *, batch_size: int = 512, seed: int = 0,
              chunk_size: int = 256) -> DUQOutput:
        """s, D and the re-ranked scores of eq. 16 over a whole split (videos × captions).

        D uses the max rule for every pair (the positives of a gallery are unknown at test time)
        with ε drawn from a generator seeded with `seed`, so evaluation is reproducible; the
        (chunk, N_v, K_p, K_p) cosines are formed `chunk_size` texts at a time.
        """
        chunk_size = checks.integer(chunk_size, "chunk_size", minimum=1)
        z_text, z_video, samples_t, samples_v = self._samples(split, batch_size, seed)
        d_tv = torch.cat([duq_distance_matrix(samples_t[i:i + chunk_size], samples_v, diagonal_min=False)
                          for i in range(0, samples_t.shape[0], chunk_size)])
        s_tv = z_text @ z_video.T
        t2v, v2t = self.rerank(s_tv.T, d_tv.T)
        return DUQOutput(
            similarity=s_tv.T, distance=d_tv.T, reranked_v2t=v2t.similarity, reranked_t2v=t2v.similarity.T,
            similarity_uncertainty_v2t=v2t.similarity_uncertainty, distance_uncertainty_v2t=v2t.distance_uncertainty,
            similarity_uncertainty_t2v=t2v.similarity_uncertainty, distance_uncertainty_t2v=t2v.distance_uncertainty,
            rerank_reading=self.rerank_reading,
        )

    @torch.no_grad()
    def _samples(self, split: CrossModalSplit, batch_size: int, seed: int):
        """(z_text, z_video, samples_t (N_t, K_p, D_p), samples_v (N_v, K_p, D_p)) of a split, ε
        drawn from a generator seeded with `seed` (videos first), all on the CPU."""
        seed = checks.integer(seed, "seed", minimum=0)
        was_training = self.training
        self.eval()
        try:
            z_video, z_text = embed_split(self.model.encode_images, self.model.encode_texts, split,
                                          batch_size=batch_size, device=module_device(self))
            mu_t, ls_t, mu_v, ls_v = (t.cpu() for t in self._gaussians(z_text.to(module_device(self)),
                                                                      z_video.to(module_device(self))))
        finally:
            self.train(was_training)
        generator = torch.Generator().manual_seed(seed)
        samples_v = duq_probabilistic_embeddings(mu_v, ls_v, num_samples=self.num_samples, generator=generator)
        samples_t = duq_probabilistic_embeddings(mu_t, ls_t, num_samples=self.num_samples, generator=generator)
        return z_text, z_video, samples_t, samples_v

    @torch.no_grad()
    def nearest_distance(self, split: CrossModalSplit, *, batch_size: int = 512, seed: int = 0,
                         chunk_size: int = 256) -> Tensor:
        """(N_v, N_t) D under the *min* rule for every pair, min_{m,n} d: the rule training applies
        to positives (eq. 11), for comparison with `infer`'s max rule ([choice], SPEC §3 "DUQ").
        Same ε as `infer` with the same seed."""
        chunk_size = checks.integer(chunk_size, "chunk_size", minimum=1)
        _, _, samples_t, samples_v = self._samples(split, batch_size, seed)
        video = torch.nn.functional.normalize(samples_v, dim=2, eps=NORMALIZE_EPS)
        parts = []
        for i in range(0, samples_t.shape[0], chunk_size):
            text = torch.nn.functional.normalize(samples_t[i:i + chunk_size], dim=2, eps=NORMALIZE_EPS)
            parts.append(1.0 - torch.einsum("imd,jnd->ijmn", text, video).amax(dim=(2, 3)))
        return torch.cat(parts).T

    def rerank(self, similarity: Tensor, distance: Tensor, reading: str | None = None):
        """(t2v, v2t) `DUQRerank`s of eq. 16 for (N_v, N_t) videos × texts s and D: the text queries
        re-rank the videos (t2v, rows = texts) and the video queries the texts (v2t, rows = videos).
        reading: one of RERANK_READINGS (default: the model's `rerank_reading`)."""
        reading = self.rerank_reading if reading is None else reading
        keywords = dict(gamma1=self.gamma1, gamma2=self.gamma2, reading=reading)
        t2v = duq_rerank(similarity.T.contiguous(), distance.T.contiguous(), **keywords)
        v2t = duq_rerank(similarity.contiguous(), distance.contiguous(), **keywords)
        return t2v, v2t

    def evaluate(self, split: CrossModalSplit, *, batch_size: int = 512, seed: int = 0) -> dict:
        """Retrieval metrics (SPEC §4) with plain s (top level) and with the re-ranking of eq. 16
        ("reranked" sub-dict under the model's reading: i2t keys from the video-query
        re-ranking, t2i keys from the text-query one; "rerank_readings": the same for every
        reading of `methods.duq_rerank`), by 1 − D alone ("distance_only"; "distance_only_min"
        with the min rule for every pair, `nearest_distance`), plus the median
        uncertainties u_s, u_d of each direction."""
        out = self.infer(split, batch_size=batch_size, seed=seed)
        c = split.captions_per_image
        metrics = retrieval_metrics(out.similarity, c)
        metrics["reranked"] = _direction_metrics(out.reranked_v2t, out.reranked_t2v, c)
        metrics["rerank_reading"] = self.rerank_reading
        readings = {}
        for reading in RERANK_READINGS:
            t2v, v2t = self.rerank(out.similarity, out.distance, reading)
            readings[reading] = _direction_metrics(v2t.similarity, t2v.similarity.T, c)
        metrics["rerank_readings"] = readings
        # Ranking by the probabilistic distance alone shows what D contributes to eq. 16; under the
        # min rule too, the one training applies to positives (inference uses the max rule).
        metrics["distance_only"] = retrieval_metrics(1.0 - out.distance, c)
        metrics["distance_only_min"] = retrieval_metrics(
            1.0 - self.nearest_distance(split, batch_size=batch_size, seed=seed), c)
        for name in ("similarity_uncertainty_v2t", "distance_uncertainty_v2t",
                     "similarity_uncertainty_t2v", "distance_uncertainty_t2v"):
            metrics[f"{name}_median"] = float(getattr(out, name).double().quantile(0.5))
        return metrics


def _direction_metrics(v2t: Tensor, t2v: Tensor, captions_per_image: int) -> dict:
    """R@K of the i2t (video-query) ranking from `v2t` and of the t2i (text-query) ranking from
    `t2v`, both (N_v, N_t), with their rSum: a re-ranking differs per query direction."""
    i2t, t2i = retrieval_metrics(v2t, captions_per_image), retrieval_metrics(t2v, captions_per_image)
    out = {k: v for k, v in i2t.items() if k.startswith("i2t")}
    out.update({k: v for k, v in t2i.items() if k.startswith("t2i")})
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    return out
