"""DPFedAvg's own metrics (families ``fl``, ``privacy``, ``val``, ``test``).

Logged by :class:`~audit_callbacks.federated.DPFedAvg` through ``self.log``: the round's
scalars at every round (the step), the evaluation metrics once per validation / test epoch
(``val`` and ``test``, when the wrapped model has no ``validation_step`` / ``test_step`` of its
own).
No ``train`` family: the round's mean local loss is an un-noised value of its real clients and
is not logged (docs/security.md).
"""

from __future__ import annotations

from ._keys import (
    ACCURACY,
    COHORT_SIZE,
    EPSILON_ANALYTIC,
    FAMILY_FL,
    FAMILY_PRIVACY,
    FAMILY_TEST,
    FAMILY_VAL,
    LOSS,
    ROUND,
)
from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS", "SOURCES"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {
    FAMILY_FL: "federated training",
    FAMILY_PRIVACY: "privacy (analytic)",
    FAMILY_VAL: "validation",
    FAMILY_TEST: "test",
}

_DPFEDAVG = "audit_callbacks.federated.DPFedAvg (McMahan, Ramage, Talwar & Zhang, ICLR 2018)"

#: family -> the work its quantities come from (the table in docs/tags.md cites it).
SOURCES: dict[str, str] = {
    FAMILY_FL: _DPFEDAVG,
    FAMILY_PRIVACY: "the Gaussian mechanism composed over rounds: Balle & Wang, ICML 2018 (analytic "
                    "Gaussian mechanism); Dong, Roth & Su, JRSS B 2022 (Gaussian DP composition)",
    FAMILY_VAL: _DPFEDAVG,
    FAMILY_TEST: _DPFEDAVG,
}

QUANTITIES: list[Quantity] = [
    Quantity(FAMILY_FL, ROUND, None, "the federated round just completed, 1-based"),
    Quantity(FAMILY_FL, COHORT_SIZE, None,
             "clients in the round, real and virtual (varies under Poisson sampling or scheduled "
             "canaries; the noisy sum is always divided by clients_per_round)"),
    Quantity(FAMILY_PRIVACY, EPSILON_ANALYTIC, None,
             "epsilon at delta of the Gaussian mechanism composed over the rounds of the "
             "most-sampled real client, if the adversary knows the rounds (inf without noise)"),
    Quantity(FAMILY_VAL, LOSS, None,
             "the loss (loss_fn, default cross-entropy) of the global model on the validation set"),
    Quantity(FAMILY_VAL, ACCURACY, None, "accuracy of the global model on the validation set"),
    Quantity(FAMILY_TEST, LOSS, None,
             "the loss (loss_fn, default cross-entropy) of the global model on the test set"),
    Quantity(FAMILY_TEST, ACCURACY, None, "accuracy of the global model on the test set"),
]
