"""evidential_ops: fused evidential (uncertainty-aware) cross-modal retrieval losses.

    import evidential_ops as eo
    loss = eo.evidential_loss(x, y, evidence="exp", tau=0.05, weights={"risk": 1.0, "kl": 0.1})

See docs/SPEC.md for the mathematics and README.md for the backends and methods.
"""

from . import extension, ops, reference
from .backends import available_backends
from . import triton_backend  # noqa: F401  registers the "triton" backend where Triton can run (docs/backends.md)
from .config import EVIDENCE_KINDS, TERMS
from .extension import build_info, cpu_isa, cuda_workspace_bytes
from .infonce import InfoNCELoss, infonce_loss
from .losses import EvidentialClipLoss, EvidentialLoss, evidential_loss, evidential_loss_from_similarity
from .opinion import belief, opinion, opinion_from_similarity
from .results import Opinion

__version__ = "0.1.0"

__all__ = [
    "EVIDENCE_KINDS",
    "EvidentialClipLoss",
    "EvidentialLoss",
    "InfoNCELoss",
    "Opinion",
    "TERMS",
    "available_backends",
    "belief",
    "build_info",
    "cpu_isa",
    "cuda_workspace_bytes",
    "evidential_loss",
    "extension",
    "infonce_loss",
    "evidential_loss_from_similarity",
    "opinion",
    "opinion_from_similarity",
    "ops",
    "reference",
]
