"""How canaries enter a given kind of training, and what is observed of it.

A backend inserts the canaries of a :class:`~audit_callbacks.auditing.CanaryAuditor` into one
kind of DP training and feeds it the model's releases; front ends only forward their hooks to
it (:class:`~audit_callbacks.callbacks.CanaryAudit`, ``audit_callbacks.flower.CanaryStrategy``).

* :class:`~audit_callbacks.backends.fedavg.FedAvgBackend` - :class:`~audit_callbacks.federated.
  DPFedAvg`: canary clients join the population and are sampled like real clients.
* :class:`~audit_callbacks.backends.opacus.backend.OpacusBackend` - Opacus' ``DPOptimizer``: gradient
  canaries join every logical step with a real example's sampling rate, before the noise.
* ``audit_callbacks.flower.backend.FlowerBackend`` - canary clients inside a Flower strategy.

The submodules are imported where they are used, so that importing this package (or
``audit_callbacks.flower``) loads neither Lightning nor Opacus.
"""

from audit_callbacks.backends.base import BackendBase, CanaryBackend, LightningHooks

__all__ = ["BackendBase", "CanaryBackend", "LightningHooks"]
