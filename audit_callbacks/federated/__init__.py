"""DP-FedAvg in Lightning and the protocol through which audit callbacks reach into rounds."""

from audit_callbacks.federated.dp_fedavg import DPFedAvg
from audit_callbacks.federated.protocol import Cohort, FederatedAuditHooks
from audit_callbacks.federated.sampling import SAMPLING_RULES, CohortSampler

__all__ = ["DPFedAvg", "Cohort", "FederatedAuditHooks", "CohortSampler", "SAMPLING_RULES"]
