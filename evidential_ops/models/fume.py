"""FUME: fuzzy multimodal learning for trusted label-based cross-modal retrieval (SPEC §3 "FUME";
FUME paper §3, Algorithm 1).

Each modality's encoder maps into R^C (L = C, the number of classes); z is L2-normalised and the
memberships m = ReLU(z W) use a fixed (never trained) orthogonal W (`reference.methods.
fume_membership_matrix`, a buffer here). Training minimises L = L_fml + α·L_cl
(`reference.methods.fume_loss`). At inference each sample gets a decision uncertainty from its
category credibilities (eq. 2, 9), each retrieved result the cross-modal uncertainty
1 − (1 − u_query)(1 − u_result) (eq. 10), and threshold retrieval drops results above it
(paper Table 1, u = 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import checks
from ..data.types import CrossModalSplit
from ..metrics import map_at_all, map_vs_deletion_rate, retrieval_metrics, uncertainty_filtered_map
from ..methods import (
    fume_credibility,
    fume_cross_modal_uncertainty,
    fume_decision_uncertainty,
    fume_loss,
    fume_membership,
    fume_membership_matrix,
)
from ..methods.fume import DEFAULT_TAU
from ._steps import (
    apply_update,
    check_epoch,
    check_grad_clip,
    check_optimizer,
    full_precision,
    module_device,
    move_batch,
)
from .dual_encoder import DualEncoder, batch_tensor, embed_split
from .encoders import BagOfWordsEncoder, MLPEncoder

__all__ = ["FUME", "FUMEOutput"]


@dataclass(frozen=True)
class FUMEOutput:
    """FUME at test time over a split (SPEC §3 "FUME", inference).

    image_features: (N, C) unit rows z^1; text_features: (N·c, C) z^2.
    image_uncertainty: (N,), text_uncertainty: (N·c,) decision uncertainties (eq. 9).
    image_labels: (N,), text_labels: (N·c,) class labels.
    """

    image_features: Tensor
    text_features: Tensor
    image_uncertainty: Tensor
    text_uncertainty: Tensor
    image_labels: Tensor
    text_labels: Tensor

    @property
    def similarity(self) -> Tensor:
        """(N, N·c) cosine similarities, images × captions."""
        return self.image_features @ self.text_features.T

    def pair_uncertainty(self, captions_per_image: int) -> Tensor:
        """(N·c,) cross-modal uncertainty (eq. 10) of every annotated pair (image j // c, caption j)."""
        images = self.image_uncertainty.repeat_interleave(captions_per_image)
        return fume_cross_modal_uncertainty(images, self.text_uncertainty)


class FUME(nn.Module):
    """FUME around an image and a text encoder with C outputs each (SPEC §3 "FUME").

    Args:
        model: `DualEncoder` whose encoders output (B, C).
        num_classes: C >= 2 (the embedding size, L = C).
        alpha: α of L = L_fml + α·L_cl (paper: 10, 0.05, 0.5, 0.05, 1 per dataset).
        tau: τ of L_cl (1). exclude_self: released-code variant of L_cl (False = paper).
        weight_seed: seed of the fixed orthogonal W. grad_clip: max gradient norm or None.
    """

    def __init__(self, model: DualEncoder, num_classes: int, *, alpha: float = 1.0, tau: float = DEFAULT_TAU,
                 exclude_self: bool = False, weight_seed: int = 0, grad_clip: float | None = None):
        super().__init__()
        if not isinstance(model, DualEncoder):
            raise TypeError(f"model must be a DualEncoder, got {type(model).__name__}")
        self.model = model
        self.num_classes = checks.integer(num_classes, "num_classes", minimum=2)
        self.alpha = checks.real_number(alpha, "alpha", minimum=0.0)
        self.tau = checks.tau_value(tau)
        self.exclude_self = checks.flag(exclude_self, "exclude_self")
        # A buffer, not a parameter: W is fixed (FUME §3.2) but must follow .to(device) and the checkpoint.
        self.register_buffer("weight", fume_membership_matrix(self.num_classes, seed=weight_seed,
                                                              dtype=torch.float32))
        self.grad_clip = check_grad_clip(grad_clip)

    @classmethod
    def default(cls, feat_dim: int, vocab_size: int, num_classes: int, *, hidden_dim: int = 256,
                **kwargs) -> FUME:
        """FUME with fully connected subnets (paper §4.1.2): an MLP over mean-pooled region
        features and an MLP over the mean word embedding (a word2vec-style text feature)."""
        model = DualEncoder(MLPEncoder(feat_dim, num_classes, hidden_dim=hidden_dim, num_layers=3),
                            BagOfWordsEncoder(vocab_size, num_classes, hidden_dim=hidden_dim, num_layers=3))
        return cls(model, num_classes, **kwargs)

    def _check_features(self, z: Tensor, who: str) -> Tensor:
        if z.shape[1] != self.num_classes:
            raise ValueError(f"the {who} encoder must output C = {self.num_classes} features (L = C), "
                             f"got shape {tuple(z.shape)}")
        return z

    def loss(self, batch) -> Tensor:
        """L = L_fml + α·L_cl (eq. 8) of one batch with "labels" (scalar)."""
        batch = move_batch(batch, module_device(self))
        x, y = self.model(batch)
        labels = batch_tensor(batch, "labels")
        features = [self._check_features(x, "image"), self._check_features(y, "text")]
        with full_precision(self):
            return fume_loss(features, labels, self.weight, alpha=self.alpha, tau=self.tau,
                             exclude_self=self.exclude_self)

    def losses(self, batch, epoch: int) -> dict[str, Tensor]:
        """{"loss": L} (eq. 8, `loss`) of one batch, without stepping (docs/training.md). `epoch`
        is unused (FUME has no schedule) and accepted for a uniform loop."""
        check_epoch(epoch)
        return {"loss": self.loss(batch)}

    def training_step(self, batch, epoch: int, optimizer: torch.optim.Optimizer) -> dict:
        """One optimiser update on L (FUME Algorithm 1): `losses` stepped with `optimizer`.
        `epoch` is unused (FUME has no schedule) and accepted for a uniform loop. Returns
        {"loss": float}."""
        check_epoch(epoch)
        check_optimizer(optimizer)
        self.train()
        return apply_update(self.losses(batch, epoch), optimizer, self.parameters(), self.grad_clip)

    def decision_uncertainty(self, z: Tensor) -> Tensor:
        """(N,) decision uncertainty (eq. 9) of unit-norm features z (N, C): memberships (eq. 3),
        credibility (eq. 2), binary-entropy average."""
        m = fume_membership(self._check_features(z, "given"), self.weight.to(z.dtype))
        return fume_decision_uncertainty(fume_credibility(m))

    @torch.no_grad()
    def infer(self, split: CrossModalSplit, *, batch_size: int = 512) -> FUMEOutput:
        """Features and decision uncertainties of every image and caption of a labelled split."""
        if split.labels is None:
            raise ValueError(f"split {split.name!r} has no class labels; FUME needs them")
        was_training = self.training
        self.eval()
        try:
            x, y = embed_split(self.model.encode_images, self.model.encode_texts, split, batch_size=batch_size,
                               device=module_device(self))
        finally:
            self.train(was_training)
        return FUMEOutput(
            image_features=x, text_features=y,
            image_uncertainty=self.decision_uncertainty(x), text_uncertainty=self.decision_uncertainty(y),
            image_labels=split.labels, text_labels=split.labels.repeat_interleave(split.captions_per_image),
        )

    def evaluate(self, split: CrossModalSplit, *, threshold: float = 0.5, batch_size: int = 512) -> dict:
        """mAP@all both directions, unfiltered and filtered at the cross-modal uncertainty
        threshold (paper Table 1), plus the instance retrieval metrics (SPEC §4).

        Filtered mAP is reported with both conventions of `metrics.uncertainty_filtered_map`:
        "map_filtered" counts only queries left with a relevant result (no_relevant="skip", how
        FUME's released code computed Table 1) and "map_filtered_zero" scores such queries 0.
        """
        threshold = checks.real_number(threshold, "threshold", minimum=0.0, maximum=1.0)
        out = self.infer(split, batch_size=batch_size)
        s = out.similarity
        metrics = retrieval_metrics(s, split.captions_per_image)
        directions = {
            "i2t": (s, out.image_labels, out.text_labels, out.image_uncertainty, out.text_uncertainty),
            "t2i": (s.T, out.text_labels, out.image_labels, out.text_uncertainty, out.image_uncertainty),
        }
        for name, (sims, ql, gl, uq, ug) in directions.items():
            metrics[f"map_{name}"] = map_at_all(sims, ql, gl)
            for key, mode in (("map_filtered", "skip"), ("map_filtered_zero", "zero")):
                f = uncertainty_filtered_map(sims, ql, gl, uq, threshold, gallery_uncertainty=ug, no_relevant=mode)
                metrics[f"{key}_{name}"] = f["map"]
                metrics[f"deletion_rate_{name}"] = f["deletion_rate"]
        for key in ("map", "map_filtered", "map_filtered_zero"):
            metrics[key] = 0.5 * (metrics[f"{key}_i2t"] + metrics[f"{key}_t2i"])
        metrics["threshold"] = threshold
        pair_u = out.pair_uncertainty(split.captions_per_image).double()
        metrics["cross_modal_uncertainty_median"] = float(pair_u.quantile(0.5))
        metrics["cross_modal_uncertainty_mean"] = float(pair_u.mean())
        return metrics

    def deletion_curves(self, split: CrossModalSplit, *, batch_size: int = 512, rates=None) -> dict:
        """mAP@all (i2t) against the deletion rate, deleting the most uncertain results ("u",
        eq. 10) or the least similar ("s"): FUME Fig. 3 / eq. 11. numpy arrays per curve."""
        out = self.infer(split, batch_size=batch_size)
        sims = out.similarity
        return {
            "u": map_vs_deletion_rate(sims, out.image_labels, out.text_labels, out.image_uncertainty,
                                      gallery_uncertainty=out.text_uncertainty, deletion_rates=rates),
            "s": map_vs_deletion_rate(sims, out.image_labels, out.text_labels, deletion_rates=rates),
        }
