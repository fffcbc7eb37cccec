"""How canaries enter a given kind of training, and what is observed of it.

A backend inserts canaries into one kind of DP training and feeds the model's deltas to
:class:`~audit_callbacks.canary_stats.CanaryStatistics`; the callbacks only forward their hooks
to it (see :class:`~audit_callbacks.callbacks.CanaryAudit`).

* :class:`FedAvgBackend` - :class:`~audit_callbacks.federated.DPFedAvg`: canary clients join the
  population and are sampled like real clients.
* :class:`OpacusBackend` - Opacus' ``DPOptimizer``: gradient canaries join every logical step
  with a real example's sampling rate, before the noise.
"""

from audit_callbacks.backends.base import CanaryBackend, CanaryConfig
from audit_callbacks.backends.fedavg import FedAvgBackend
from audit_callbacks.backends.opacus import OpacusBackend

__all__ = ["CanaryBackend", "CanaryConfig", "FedAvgBackend", "OpacusBackend"]
