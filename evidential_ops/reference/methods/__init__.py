"""Method-level references of SPEC §3 (TCL/TcVSE, UML, FUME, DUQ) in plain PyTorch.

Float64-capable, computed in the input dtype (float32 or float64). The K×K evidential term
family they build on is `evidential_ops.reference.loss_terms` / `row_terms`.
"""

from .duq import (
    DUQRerank,
    duq_distance_loss,
    duq_distance_matrix,
    duq_distance_uncertainty_loss,
    duq_gaussian_kl,
    duq_isum_loss,
    duq_probabilistic_embeddings,
    duq_rerank,
    duq_similarity_loss,
    duq_total_loss,
)
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
    TCLInference,
    evidential_beliefs,
    tcl_consistency_loss,
    tcl_ensemble_similarity,
    tcl_inference,
    tcl_kl_weight,
    tcl_uncertainty_loss,
)
from .uml import (
    uml_aml_loss,
    uml_clean_labels,
    uml_dual_view_loss,
    uml_evidential_loss,
    uml_sigma,
    uml_similarities,
    uml_total_loss,
)

__all__ = [
    "DUQRerank",
    "TCLInference",
    "duq_distance_loss",
    "duq_distance_matrix",
    "duq_distance_uncertainty_loss",
    "duq_gaussian_kl",
    "duq_isum_loss",
    "duq_probabilistic_embeddings",
    "duq_rerank",
    "duq_similarity_loss",
    "duq_total_loss",
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
    "tcl_ensemble_similarity",
    "tcl_inference",
    "tcl_kl_weight",
    "tcl_uncertainty_loss",
    "uml_aml_loss",
    "uml_clean_labels",
    "uml_dual_view_loss",
    "uml_evidential_loss",
    "uml_sigma",
    "uml_similarities",
    "uml_total_loss",
]
