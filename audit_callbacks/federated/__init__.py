"""DP-FedAvg in Lightning, its typed round record and the protocol through which audits take part."""

from audit_callbacks.federated.dp_fedavg import DPFedAvg
from audit_callbacks.federated.protocol import (
    FederatedAuditHooks,
    VirtualClientOwner,
    VirtualClientSumOwner,
)
from audit_callbacks.federated.round import REAL_CLIENT, Cohort, FederatedRound
from audit_callbacks.federated.sampling import SAMPLING_RULES, CohortSampler

__all__ = [
    "DPFedAvg", "FederatedRound", "Cohort", "REAL_CLIENT", "FederatedAuditHooks",
    "VirtualClientOwner", "VirtualClientSumOwner", "CohortSampler", "SAMPLING_RULES",
]
