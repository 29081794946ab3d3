"""A same-encoder InfoNCE baseline: what the evidential methods must beat to be worth their cost.

The evidential losses of TCL, TcVSE, UML and DUQ replace (or add to) a plain contrastive loss.
Whether they help is only known against that plain loss trained on the same encoders, data,
batches, optimiser and epochs, so the demo trains one beside every method and compares them.

The loss is the symmetric InfoNCE of CLIP (DUQ eq. 1, `methods.duq_similarity_loss`) at a fixed
temperature τ: L = −½(mean_i log softmax_row(s/τ)_ii + mean_i log softmax_col(s/τ)_ii), summed
over the members of an ensemble (one per TCL/TcVSE query model, whose scores are added at test
time as TCL adds s_A + s_B) and, for UML, over both caption languages. Computed by the fused
InfoNCE op (`evidential_ops.infonce_loss`, SPEC §2 "InfoNCE"), which never stores s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import checks
from ..data.augment import DEFAULT_REGION_DROP, DEFAULT_WORD_RATE, augment_batch
from ..data.types import CrossModalSplit
from ..infonce import infonce_loss
from ..metrics import map_at_all, retrieval_metrics
from ._steps import apply_update, check_epoch, check_grad_clip, check_optimizer, module_device, move_batch
from .dual_encoder import DualEncoder, batch_tensor, embed_split
from .encoders import l2_normalize

__all__ = ["DEFAULT_TEMPERATURE", "InfoNCEBaseline", "InfoNCEOutput"]

DEFAULT_TEMPERATURE = 0.05  # TCL's τ: the same sharpness of the softmax as the evidential methods'


@dataclass(frozen=True)
class InfoNCEOutput:
    """The baseline at test time over a split (images × captions of `eval_language`).

    similarity: (N, N·c) the ranking score, Σ_m s_m over the members.
    mean_similarity: (N, N·c) the members' mean cosine, whose softmax at `temperature` is the
        model's own probability of each result (the maximum softmax probability confidence).
    """

    similarity: Tensor
    mean_similarity: Tensor
    temperature: float

    def top_probability(self, direction: str = "rows") -> Tensor:
        """(N_q,) max_j softmax(mean_similarity / τ) of each image ("rows") or caption ("cols")
        query over the whole gallery: the InfoNCE model's confidence in its top result."""
        if direction not in ("rows", "cols"):
            raise ValueError(f"direction must be 'rows' or 'cols', got {direction!r}")
        logits = (self.mean_similarity if direction == "rows" else self.mean_similarity.T).double() / self.temperature
        return torch.softmax(logits, dim=1).amax(dim=1)


class InfoNCEBaseline(nn.Module):
    """Symmetric InfoNCE on the encoders of a method (module docstring).

    Args:
        members: one or more `DualEncoder`s, trained side by side, scores added at test time.
        alt_text_encoders: optional, one text encoder per member for the second-language captions
            ("captions_alt"); each member then also learns image ↔ second language with its
            image encoder (UML's non-English view).
        eval_language: "en" or "alt", the captions of test-time retrieval.
        temperature: τ of the softmax (0.05). grad_clip: max gradient norm per update or None.
        augment_vocab_size: when set, every training batch goes through TcVSE's augmentation
            (`data.augment_batch`) first, so a TcVSE baseline sees the same data as TcVSE.
        augment_region_drop, augment_word_rate: that augmentation's rates (TcVSE's defaults,
            0.2 and 0.2); pass the TcVSE model's own so both see the same augmentation.
    """

    def __init__(self, members: list[DualEncoder], *, alt_text_encoders: list[nn.Module] | None = None,
                 eval_language: str = "en", temperature: float = DEFAULT_TEMPERATURE,
                 grad_clip: float | None = 2.0, augment_vocab_size: int | None = None,
                 augment_region_drop: float = DEFAULT_REGION_DROP, augment_word_rate: float = DEFAULT_WORD_RATE):
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, DualEncoder) for m in members):
            raise TypeError("members must be a non-empty list of DualEncoder")
        self.members = nn.ModuleList(members)
        if alt_text_encoders is not None:
            alt_text_encoders = list(alt_text_encoders)
            if len(alt_text_encoders) != len(members) or not all(isinstance(e, nn.Module) for e in alt_text_encoders):
                raise ValueError(f"alt_text_encoders must hold one nn.Module per member ({len(members)})")
            self.alt_text_encoders = nn.ModuleList(alt_text_encoders)
        else:
            self.alt_text_encoders = None
        self.eval_language = checks.choice(eval_language, "eval_language", ("en", "alt"))
        if self.eval_language == "alt" and self.alt_text_encoders is None:
            raise ValueError("eval_language='alt' needs alt_text_encoders")
        self.temperature = checks.positive_number(temperature, "temperature")
        self.grad_clip = check_grad_clip(grad_clip)
        self.augment_vocab_size = (None if augment_vocab_size is None
                                   else checks.integer(augment_vocab_size, "augment_vocab_size", minimum=5))
        self.augment_region_drop = checks.real_number(augment_region_drop, "augment_region_drop", minimum=0.0,
                                                      maximum=0.99)
        self.augment_word_rate = checks.real_number(augment_word_rate, "augment_word_rate", minimum=0.0, maximum=0.99)

    def loss(self, batch) -> Tensor:
        """Σ over members (and languages) of the symmetric InfoNCE of one batch (scalar)."""
        batch = move_batch(batch, module_device(self))
        total = None
        for k, member in enumerate(self.members):
            x, y = member(batch)
            terms = [infonce_loss(x, y, tau=self.temperature, reduction="mean_of_directions")]
            if self.alt_text_encoders is not None:
                y_alt = l2_normalize(self.alt_text_encoders[k](batch_tensor(batch, "captions_alt"),
                                                               batch_tensor(batch, "lengths_alt")))
                terms.append(infonce_loss(x, y_alt, tau=self.temperature, reduction="mean_of_directions"))
            for term in terms:
                total = term if total is None else total + term
        return total

    def losses(self, batch, epoch: int) -> dict[str, Tensor]:
        """{"loss": the InfoNCE loss (`loss`)} of one batch, after the augmentation when
        augment_vocab_size is set, without stepping. `epoch` is unused (no schedule)."""
        check_epoch(epoch)
        if self.augment_vocab_size is not None:
            batch = augment_batch(batch, vocab_size=self.augment_vocab_size, region_drop=self.augment_region_drop,
                                  word_rate=self.augment_word_rate)
        return {"loss": self.loss(batch)}

    def training_step(self, batch, epoch: int, optimizer: torch.optim.Optimizer) -> dict:
        """One optimiser update on the InfoNCE loss (`losses`; `epoch` unused: no schedule).
        {"loss": float}."""
        check_epoch(epoch)
        check_optimizer(optimizer)
        self.train()
        return apply_update(self.losses(batch, epoch), optimizer, self.parameters(), self.grad_clip)

    @torch.no_grad()
    def infer(self, split: CrossModalSplit, *, batch_size: int = 512) -> InfoNCEOutput:
        """Ensemble similarity of a split's images × captions in `eval_language`."""
        was_training = self.training
        self.eval()
        device = module_device(self)
        try:
            sims = []
            for k, member in enumerate(self.members):
                if self.eval_language == "en":
                    text_fn = member.encode_texts
                else:
                    encoder = self.alt_text_encoders[k]
                    text_fn = lambda tokens, lengths, encoder=encoder: l2_normalize(encoder(tokens, lengths))
                x, y = embed_split(member.encode_images, text_fn, split, language=self.eval_language,
                                   batch_size=batch_size, device=device)
                sims.append(x @ y.T)
        finally:
            self.train(was_training)
        total = torch.stack(sims).sum(0)
        return InfoNCEOutput(similarity=total, mean_similarity=total / len(sims), temperature=self.temperature)

    def evaluate(self, split: CrossModalSplit, *, batch_size: int = 512) -> dict:
        """Retrieval metrics (SPEC §4) of the ensemble ranking, plus mAP@all (both directions,
        their mean under "map") when the split has class labels."""
        out = self.infer(split, batch_size=batch_size)
        c = split.captions_per_image
        metrics = retrieval_metrics(out.similarity, c)
        if split.labels is not None:
            image_labels, text_labels = split.labels, split.labels.repeat_interleave(c)
            metrics["map_i2t"] = map_at_all(out.similarity, image_labels, text_labels)
            metrics["map_t2i"] = map_at_all(out.similarity.T, text_labels, image_labels)
            metrics["map"] = 0.5 * (metrics["map_i2t"] + metrics["map_t2i"])
        return metrics
