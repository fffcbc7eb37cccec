"""The library's LightningModule on the standalone ``pytorch_lightning`` namespace.

Scripts that build their ``Trainer`` from ``pytorch_lightning`` (Opacus' and Flower's Lightning
examples do) fit a ``pytorch_lightning.LightningModule``; import :class:`DPFedAvg` from here
for them. The callbacks (:mod:`audit_callbacks.callbacks`) work with a Trainer of either
namespace as they are. Needs ``pip install pytorch-lightning``.
"""

from __future__ import annotations

import pytorch_lightning as pl

from audit_callbacks.federated.dp_fedavg import DPFedAvgMixin

__all__ = ["DPFedAvg"]


class DPFedAvg(DPFedAvgMixin, pl.LightningModule):
    __doc__ = DPFedAvgMixin.__doc__
