"""audit-callbacks: PyTorch Lightning callbacks that audit privacy while a model trains.

Submodules:
    estimators  numpy/scipy estimators (epsilon from cosines, lower bounds, intervals)
    canaries    seeded canaries regenerated chunk by chunk (memory O(d))
    federated   DP-FedAvg as a LightningModule and the audit protocol it calls
    callbacks   the Lightning callbacks (``CanaryAudit``)
"""

__version__ = "0.1.0"
