"""Which backend audits a Lightning run: DP-FedAvg's canary clients or Opacus' gradient
canaries (imported here, so that ``audit_callbacks.backends`` itself loads neither)."""

from __future__ import annotations

from typing import Any

from audit_callbacks.auditing.config import CanaryAuditConfig
from audit_callbacks.backends.base import CanaryBackend

__all__ = ["lightning_backend"]


def lightning_backend(config: CanaryAuditConfig, trainer: Any, pl_module: Any, warn: Any,
                      name: str) -> CanaryBackend | None:
    """The backend of a Lightning run: :class:`~audit_callbacks.backends.fedavg.FedAvgBackend`
    for a module with virtual clients (``DPFedAvg``), else :class:`~audit_callbacks.backends.
    opacus.OpacusBackend` once the trainer has optimizers (None before ``configure_optimizers``).

    Raises:
        ValueError: ``repeats`` with DP-SGD (its canaries are sampled).
        TypeError: optimizers without an Opacus ``DPOptimizer``.
    """
    if callable(getattr(pl_module, "register_virtual_clients", None)):
        from audit_callbacks.backends.fedavg import FedAvgBackend

        return FedAvgBackend(pl_module, trainer, warn, name=name, repeats=config.repeats, seed=config.seed)
    if not trainer.optimizers:
        return None
    if config.repeats is not None:
        raise ValueError("CanaryAudit(repeats=...) is for DP-FedAvg; DP-SGD canaries are sampled")
    from audit_callbacks.backends.opacus.lightning import LightningOpacusBackend

    return LightningOpacusBackend.of(trainer, warn, sample_rate=config.sample_rate, seed=config.seed,
                                     module=pl_module)
