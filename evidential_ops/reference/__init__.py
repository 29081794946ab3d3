"""The executable SPEC: every quantity of docs/SPEC.md in plain PyTorch, float64-capable.

Fused backends are tested against these functions evaluated in float64 on the same inputs.
"""

from ..evidence import belief, evidence, log_alpha
from . import methods
from .infonce import infonce_line_losses, infonce_loss, infonce_masks
from .losses import (
    check_no_overflow,
    evidential_loss,
    evidential_loss_from_similarity,
    loss_terms,
    opinion,
    opinion_from_similarity,
    similarity,
)
from .special import (
    digamma_difference,
    inverse_trigamma_remainder,
    kl_h,
    log_trigamma,
    trigamma,
)
from .terms import row_terms

__all__ = [
    "belief",
    "check_no_overflow",
    "digamma_difference",
    "evidence",
    "evidential_loss",
    "evidential_loss_from_similarity",
    "infonce_line_losses",
    "infonce_loss",
    "infonce_masks",
    "inverse_trigamma_remainder",
    "kl_h",
    "log_alpha",
    "log_trigamma",
    "methods",
    "loss_terms",
    "opinion",
    "opinion_from_similarity",
    "row_terms",
    "similarity",
    "trigamma",
]
