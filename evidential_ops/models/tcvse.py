"""TcVSE: TCL's two-step training on max-pooling visual semantic embeddings (SPEC §3 "TCL";
TcVSE paper §2.1-2.3).

The training procedure and inference are TCL's (`models.tcl.TCL`); what differs is the encoder of
each branch: local features (regions; word tokens from a Bi-GRU) aggregated by max pooling into
the joint space, v = MaxPooling({x_i}), t = MaxPooling({r_j}), cosine similarity (eq. 1), the
evidence map: exp (default) or ReLU (eq. 2), and the training augmentation x' = Augment(x) of
Algorithm 1 (dropped regions; masked, swapped and discarded words: `data.augment`), on by default.
`losses`, `training_updates` and `training_step` (docs/training.md) draw x' once per call.
"""

from __future__ import annotations

from .. import checks
from ..data.augment import DEFAULT_REGION_DROP, DEFAULT_WORD_RATE, augment_batch
from .dual_encoder import DualEncoder
from .encoders import GRUTextEncoder, MaxPoolEncoder
from .tcl import TCL

__all__ = ["TcVSE", "default_vse_encoder"]


def default_vse_encoder(feat_dim: int, vocab_size: int, embed_dim: int = 128, *,
                        bidirectional: bool = True, word_dim: int = 64, batch_norm: bool = False) -> DualEncoder:
    """One TcVSE branch: per-region MLP + max pooling; (Bi-)GRU token features + max pooling.

    batch_norm defaults to False here (VSE∞ has none after its pooling): a max over fewer
    regions or words is smaller in every coordinate, and centring by the training-set statistics
    turns that into one direction shared by every corrupted image and caption, so corrupted
    samples match each other with high evidence (measured: median uncertainty at corruption 0.6
    below that at 0.0 with batch_norm=True, above it without).
    """
    return DualEncoder(
        MaxPoolEncoder(feat_dim, embed_dim, hidden_dim=embed_dim, batch_norm=batch_norm),
        GRUTextEncoder(vocab_size, embed_dim, word_dim=word_dim, pooling="max", bidirectional=bidirectional,
                       batch_norm=batch_norm),
    )


class TcVSE(TCL):
    """TCL with max-pooling VSE branches (TcVSE paper). Branch A is the i2t branch, branch B the
    t2i branch.

    Arguments of `TCL`, evidence "exp" or "relu" (TcVSE eq. 2), plus the augmentation of
    Algorithm 1, applied to every training batch before both steps (**[choice]** step 2's
    "recompute" re-encodes the same augmented x'):
        augment: on (default) or off.
        region_drop: probability of discarding each region (0.2, VSE∞'s loader).
        word_rate: probability of picking each word for mask / swap / discard (0.2).
        vocab_size: size of the caption vocabulary the swapped words are drawn from; default
            the `vocab_size` of branch A's text encoder (required with augment if it has none).
    """

    EVIDENCE_KINDS = ("exp", "relu")  # TcVSE eq. 2

    def __init__(self, model_a: DualEncoder, model_b: DualEncoder, *, evidence: str = "exp", augment: bool = True,
                 region_drop: float = DEFAULT_REGION_DROP, word_rate: float = DEFAULT_WORD_RATE,
                 vocab_size: int | None = None, **kwargs):
        super().__init__(model_a, model_b, evidence=evidence, **kwargs)
        self.augment = checks.flag(augment, "augment")
        self.region_drop = checks.real_number(region_drop, "region_drop", minimum=0.0, maximum=0.99)
        self.word_rate = checks.real_number(word_rate, "word_rate", minimum=0.0, maximum=0.99)
        if vocab_size is None:
            vocab_size = getattr(model_a.text_encoder, "vocab_size", None)
        if self.augment and vocab_size is None:
            raise ValueError("vocab_size is required for augment=True when the text encoder has no vocab_size")
        self.vocab_size = None if vocab_size is None else checks.integer(vocab_size, "vocab_size", minimum=5)

    def _training_batch(self, batch):
        """x' = Augment(x) when `augment` is on (drawn from the global torch RNG, which the
        pipelines seed), the batch itself otherwise: what `losses`, `training_updates` and
        `training_step` train on."""
        if not self.augment:
            return batch
        return augment_batch(batch, vocab_size=self.vocab_size, region_drop=self.region_drop,
                             word_rate=self.word_rate)

    @classmethod
    def default(cls, feat_dim: int, vocab_size: int, *, embed_dim: int = 128, bidirectional: bool = True,
                batch_norm: bool = False, **kwargs) -> TcVSE:
        """TcVSE with two `default_vse_encoder` branches (independent initialisations)."""
        encoders = [default_vse_encoder(feat_dim, vocab_size, embed_dim, bidirectional=bidirectional,
                                        batch_norm=batch_norm) for _ in range(2)]
        return cls(*encoders, **kwargs)
