"""The method pieces of SPEC §3 the pipelines run: TCL/TcVSE, UML, FUME, DUQ, in plain PyTorch.

Everything here except the evidential terms themselves (those are the fused op,
`evidential_ops.evidential_loss`): TCL's KL schedule, beliefs and consistency loss, UML's clean
labels, schedule and AML, FUME's membership, credibility and losses, DUQ's InfoNCE, probabilistic
distances and re-ranking. Computed in the input dtype (float32 or float64). The float64 judges of
the whole method losses are in `evidential_ops.reference.methods`.
"""

from .duq import (
    DUQRerank,
    duq_distance_loss,
    duq_distance_matrix,
    duq_distance_uncertainty_loss,
    duq_gaussian_kl,
    duq_probabilistic_embeddings,
    duq_rerank,
    duq_similarity_loss,
    duq_similarity_loss_from_embeddings,
)
from .duq_distance_losses import (
    duq_distance_loss_strips,
    duq_distance_losses_strips,
    duq_distance_uncertainty_loss_strips,
)
from .duq_distance_strips import duq_distance_matrix_strips
from .fume import (
    fume_consistency_loss,
    fume_credibility,
    fume_cross_modal_uncertainty,
    fume_decision_uncertainty,
    fume_fml_loss,
    fume_loss,
    fume_membership,
    fume_membership_matrix,
    fume_training_credibility,
)
from .tcl import (
    evidential_beliefs,
    tcl_consistency_loss,
    tcl_ensemble_similarity,
    tcl_kl_weight,
)
from .tcl_consistency import tcl_consistency_loss_from_embeddings
from .uml_aml_strips import uml_aml_loss_from_embeddings
from .uml import (
    uml_aml_loss,
    uml_clean_labels,
    uml_clean_labels_from_embeddings,
    uml_sigma,
    uml_similarities,
)

__all__ = [
    "DUQRerank",
    "duq_distance_loss",
    "duq_distance_loss_strips",
    "duq_distance_losses_strips",
    "duq_distance_matrix",
    "duq_distance_matrix_strips",
    "duq_distance_uncertainty_loss",
    "duq_distance_uncertainty_loss_strips",
    "duq_gaussian_kl",
    "duq_probabilistic_embeddings",
    "duq_rerank",
    "duq_similarity_loss",
    "duq_similarity_loss_from_embeddings",
    "evidential_beliefs",
    "fume_consistency_loss",
    "fume_credibility",
    "fume_cross_modal_uncertainty",
    "fume_decision_uncertainty",
    "fume_fml_loss",
    "fume_loss",
    "fume_membership",
    "fume_membership_matrix",
    "fume_training_credibility",
    "tcl_consistency_loss",
    "tcl_consistency_loss_from_embeddings",
    "tcl_ensemble_similarity",
    "tcl_kl_weight",
    "uml_aml_loss",
    "uml_aml_loss_from_embeddings",
    "uml_clean_labels",
    "uml_clean_labels_from_embeddings",
    "uml_sigma",
    "uml_similarities",
]
