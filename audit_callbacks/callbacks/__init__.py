"""Lightning callbacks: the glue between training and the estimators."""

from audit_callbacks.callbacks.canary_audit import CanaryAudit
from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
from audit_callbacks.callbacks.label_dp import LabelDPLowerBound
from audit_callbacks.callbacks.label_reconstruction import LabelReconstructionAttack
from audit_callbacks.callbacks.label_step import LabelStepObserver
from audit_callbacks.callbacks.ldp_audit import BrokenRandomizerWarning, LDPAudit
from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit

__all__ = [
    "BrokenRandomizerWarning",
    "CanaryAudit",
    "FederatedLabelAttack",
    "LDPAudit",
    "LDPInferenceAudit",
    "LabelDPLowerBound",
    "LabelReconstructionAttack",
    "LabelStepObserver",
]
