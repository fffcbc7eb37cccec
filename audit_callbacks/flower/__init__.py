"""Canary audits of Flower federated learning (optional extra: ``pip install
"audit-callbacks[flower]"``, Flower ``flwr[simulation]==1.41.0``).

:class:`CanaryStrategy` wraps a Message API strategy (``flwr.serverapp.strategy``: FedAvg, and
Flower's central-DP wrappers around it) to insert canary clients and write the same estimates,
TensorBoard tags and ``audit_summary.json`` as :class:`~audit_callbacks.callbacks.CanaryAudit`.
:class:`LocalGrid` runs a strategy in-process (tests, benchmarks); :func:`local_sgd` is a torch
client's local training.

Importing this package without Flower raises an ``ImportError`` that says how to install it;
the rest of the library does not import it.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised where flwr is missing
    raise ImportError(
        'audit_callbacks.flower needs Flower: pip install "audit-callbacks[flower]" '
        '(flwr[simulation]==1.41.0)'
    ) from err

from audit_callbacks.flower.backend import BAD_REPLY_CODE, FlowerBackend
from audit_callbacks.flower.client import evaluate_accuracy, local_sgd
from audit_callbacks.flower.local_grid import LocalGrid
from audit_callbacks.flower.records import Layout, flower_versions
from audit_callbacks.flower.strategy import CanaryStrategy

__all__ = ["BAD_REPLY_CODE", "CanaryStrategy", "FlowerBackend", "Layout", "LocalGrid", "evaluate_accuracy",
           "local_sgd", "flower_versions"]
