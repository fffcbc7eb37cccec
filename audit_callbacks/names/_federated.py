"""DPFedAvg's own metrics (families ``fl``, ``privacy``, ``train``, ``val``, ``test``).

Logged by :class:`~audit_callbacks.federated.DPFedAvg` through ``self.log``: the round's
scalars at every round (the step), the evaluation metrics once per validation / test epoch
(``val`` and ``test``, when the wrapped model has no ``validation_step`` / ``test_step`` of its
own).
``train/client_loss`` is logged with ``on_step`` and ``on_epoch``, so Lightning hands it to the
loggers as ``train/client_loss_step`` and ``train/client_loss_epoch``.
"""

from __future__ import annotations

from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {
    "fl": "federated training",
    "privacy": "privacy (analytic)",
    "train": "training",
    "val": "validation",
    "test": "test",
}

QUANTITIES: list[Quantity] = [
    Quantity("fl", "round", None, "the federated round just completed, 1-based"),
    Quantity("fl", "cohort_size", None,
             "clients in the round, real and virtual (varies under Poisson sampling or scheduled "
             "canaries; the noisy sum is always divided by clients_per_round)"),
    Quantity("train", "client_loss", None,
             "the real clients' mean local training loss in the round (over their local steps)"),
    Quantity("privacy", "epsilon_analytic", None,
             "epsilon at delta of the Gaussian mechanism composed over the rounds of the "
             "most-sampled real client, if the adversary knows the rounds (inf without noise)"),
    Quantity("val", "loss", None,
             "the loss (loss_fn, default cross-entropy) of the global model on the validation set"),
    Quantity("val", "accuracy", None, "accuracy of the global model on the validation set"),
    Quantity("test", "loss", None,
             "the loss (loss_fn, default cross-entropy) of the global model on the test set"),
    Quantity("test", "accuracy", None, "accuracy of the global model on the test set"),
]
