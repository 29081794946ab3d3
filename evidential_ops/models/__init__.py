"""Method pipelines around user-replaceable encoders (SPEC §3; docs/api.md "Pipelines").

One file per method, each with `losses(batch, epoch)` (a dict of tensors: "loss" to
backpropagate and its named parts, no optimiser step, for any trainer: docs/training.md), the
CLI's `training_step(batch, epoch, optimizer)` built on it, and an inference/evaluation function
over a `data.CrossModalSplit`. TCL and TcVSE also expose their several updates per batch as
`training_updates(batch, epoch)`:

- `TCL` (TCL paper) and `TcVSE` (TcVSE paper): two query models, step-1 L_u with λ annealing,
  T_max consistency rounds with the owner side detached, ensemble inference with opinions;
- `UML` (UML paper): three views, clean/noisy split, dual-view L_u with σ(t), AML;
- `FUME` (FUME paper): fixed orthogonal W, L_fml + α·L_cl, decision and cross-modal uncertainty,
  threshold retrieval;
- `DUQ` (DUQ paper): ISUM, IDUM with K_p probabilistic embeddings, L_D, L_D^U, KL, re-ranking;
- `InfoNCEBaseline`: the same encoders trained with plain symmetric InfoNCE, the reference a
  method must beat (the demo trains one beside every method).

Every K×K evidential term (TCL's L_u, UML's L^e, DUQ's ISUM) goes through the fused public op
(`evidential_loss` / `evidential_loss_from_similarity`); the method-level pieces come from
`evidential_ops.reference.methods`. Default small encoders are in `models.encoders`.
"""

from .chunking import set_chunk_size
from .data_parallel import enable_global_batch
from .dual_encoder import DualEncoder, embed_split
from .duq import DUQ, DUQForward, DUQOutput
from .encoders import AttentionPoolEncoder, BagOfWordsEncoder, GRUTextEncoder, MaxPoolEncoder, MLPEncoder
from .fume import FUME, FUMEOutput
from .infonce import InfoNCEBaseline, InfoNCEOutput
from .tcl import TCL, TCLOutput, default_tcl_encoder
from .tcvse import TcVSE, default_vse_encoder
from .uml import UML, UMLStep

__all__ = [
    "DUQ",
    "FUME",
    "TCL",
    "UML",
    "AttentionPoolEncoder",
    "BagOfWordsEncoder",
    "DUQForward",
    "DUQOutput",
    "DualEncoder",
    "FUMEOutput",
    "GRUTextEncoder",
    "InfoNCEBaseline",
    "InfoNCEOutput",
    "MLPEncoder",
    "MaxPoolEncoder",
    "TCLOutput",
    "TcVSE",
    "UMLStep",
    "default_tcl_encoder",
    "default_vse_encoder",
    "enable_global_batch",
    "embed_split",
    "set_chunk_size",
]
