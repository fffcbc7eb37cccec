"""The label callbacks' quantities (families ``label_attack``, ``label_dp``, ``fl_label_attack``).

Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong DP-SGD Lower Bounds for Label
Privacy"; K classes and FedSGD clients: docs/methods/label_dp_multiclass.md. Epsilons are in
nats at the callback's delta. A name here is also the field of the estimator's result
(:class:`~audit_callbacks.estimators.label_dp.LabelDPBounds`,
:class:`~audit_callbacks.estimators.label_dp.ClientLabelDPBound`) and the key of the callback's
records and summary JSON.
"""

from __future__ import annotations

from ._keys import (
    ACCURACY,
    ACCURACY_NOISED,
    ATTACKED_CLIENTS,
    ATTACKED_FRACTION,
    COUNT_ACCURACY,
    EPSILON_ACCOUNTANT,
    EPSILON_LOWER_BOUND,
    EPSILON_LOWER_BOUND_EXTRAPOLATED,
    EPSILON_LOWER_BOUND_MAX,
    EPSILON_LOWER_BOUND_SECOND_LAST,
    EPSILON_LOWER_BOUND_SECOND_LAST_MAX,
    EPSILON_PAIR_ALL_PARAMS,
    EPSILON_PAIR_LAYER,
    EPSILON_PAIR_OPTIMAL_TEST,
    EPSILON_SINGLE_ROUND,
    EPSILON_SINGLE_STEP,
    EXPECTED_ACCURACY_NOISED,
    EXPECTED_ATTACK_ACCURACY,
    FAMILY_FL_LABEL_ATTACK,
    FAMILY_LABEL_ATTACK,
    FAMILY_LABEL_DP,
    SKIP_REASON,
    WARNINGS,
)
from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS", "SOURCES"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {
    FAMILY_LABEL_ATTACK: "label attack (Yuan et al. 2022)",
    FAMILY_LABEL_DP: "label privacy (Yuan et al. 2022)",
    FAMILY_FL_LABEL_ATTACK: "label attack on FedSGD clients (Yuan et al. 2022)",
}

_YUAN = ("Yuan, Xue, Wang & Shen (2022), \"Deep Gradient Attacks with Strong DP-SGD Lower Bounds "
         "for Label Privacy\"")

#: family -> the work its quantities come from (the table in docs/tags.md cites it).
SOURCES: dict[str, str] = {
    FAMILY_LABEL_ATTACK: f"{_YUAN}, §3 eq. (1), Alg. 1 and 3",
    FAMILY_LABEL_DP: f"{_YUAN}, Alg. 2 and App. A.3.1; K classes: docs/methods/label_dp_multiclass.md",
    FAMILY_FL_LABEL_ATTACK: f"{_YUAN}, applied to FedSGD clients: docs/methods/label_dp_multiclass.md",
}

_ACCURACY = "reconstruction accuracy"
_COVERAGE = "coverage"
_BOUNDS = "label-DP epsilon: lower bounds vs upper bounds"
_PAIRS = "Gaussian-pair epsilons (one batch)"
_CLIENT = "label-DP epsilon of one client's update"


def _coverage(family: str) -> list[Quantity]:
    """The coverage quantities every step-auditing label callback logs
    (:mod:`audit_callbacks.callbacks.label_base`)."""
    return [
        Quantity(family, ATTACKED_FRACTION, _COVERAGE,
                 "steps attacked / steps considered so far (the rest were skipped with a reason)"),
        Quantity(family, SKIP_REASON, None,
                 "reason code of the latest considered step (0 = attacked; the summary JSON names "
                 "every code)"),
        Quantity(family, WARNINGS, None,
                 "text, written once per reason: why a step was skipped or the callback disabled"),
    ]


QUANTITIES: list[Quantity] = [
    # LabelReconstructionAttack (Yuan et al. 2022 §3 eq. (1), Alg. 1 and 3)
    # no per-step accuracy: with the batch size it is a label oracle; aggregates over
    # blocks of at least min_examples attacked examples only
    Quantity(FAMILY_LABEL_ATTACK, ACCURACY, _ACCURACY,
             "reconstruction accuracy over every attacked example up to the latest complete block of "
             "min_examples (default 100) attacked examples"),
    Quantity(FAMILY_LABEL_ATTACK, COUNT_ACCURACY, _ACCURACY,
             "batch wider than the layer: sum_k min(recovered n_k, true n_k) / sum N of the label "
             "counts recovered from the bias gradient (1 = every count right), over blocks of at "
             "least min_examples attacked examples"),
    *_coverage(FAMILY_LABEL_ATTACK),
    # LabelDPLowerBound (Yuan et al. 2022 Alg. 2, App. A.3.1; K classes: label_dp_multiclass.md)
    Quantity(FAMILY_LABEL_DP, EPSILON_LOWER_BOUND, _BOUNDS,
             "label-DP lower bound of the step's batch: the attack's event test, max(0, max_r LB[r]) "
             "(binary: Yuan et al. Alg. 2; K classes: docs/methods/label_dp_multiclass.md eq. (5))"),
    Quantity(FAMILY_LABEL_DP, EPSILON_LOWER_BOUND_MAX, _BOUNDS,
             "running maximum of epsilon_lower_bound over the attacked steps"),
    Quantity(FAMILY_LABEL_DP, EPSILON_LOWER_BOUND_EXTRAPOLATED, _BOUNDS,
             "mean batch bound times 1 + log M / log N (M attacked steps, N the expected batch "
             "size; Yuan et al. App. A.3.1): a prediction, not a bound"),
    Quantity(FAMILY_LABEL_DP, EPSILON_LOWER_BOUND_SECOND_LAST, _BOUNDS,
             "binary models with second_last=True: the bound from the second-last layer's attack "
             "(Yuan et al. Alg. 4)"),
    Quantity(FAMILY_LABEL_DP, EPSILON_LOWER_BOUND_SECOND_LAST_MAX, _BOUNDS,
             "running maximum of epsilon_lower_bound_second_last"),
    Quantity(FAMILY_LABEL_DP, EPSILON_PAIR_OPTIMAL_TEST, _PAIRS,
             "epsilon of the Gaussian pair of the attack's statistic under D0 and D1 (the best test "
             "on it, Balle & Wang 2018), max over the batch; >= epsilon_lower_bound"),
    Quantity(FAMILY_LABEL_DP, EPSILON_PAIR_LAYER, _PAIRS,
             "epsilon of the exact Gaussian pair of the attacked layer's released gradient, max over "
             "the batch; >= epsilon_pair_optimal_test"),
    Quantity(FAMILY_LABEL_DP, EPSILON_PAIR_ALL_PARAMS, _PAIRS,
             "epsilon of the Gaussian pair of the whole released gradient (exact for a sigmoid; K "
             "classes: its triangle-inequality upper bound), max over the batch"),
    Quantity(FAMILY_LABEL_DP, EPSILON_SINGLE_STEP, _BOUNDS,
             "upper bound of one step for replacing one label: the Gaussian mechanism with "
             "sensitivity 2C, mu = 2 / noise_multiplier (no amplification)"),
    Quantity(FAMILY_LABEL_DP, EPSILON_ACCOUNTANT, _BOUNDS,
             "the run's Opacus accountant (Poisson sampling, composed over the run), every epoch"),
    Quantity(FAMILY_LABEL_DP, EXPECTED_ATTACK_ACCURACY, None,
             "mean over the attacked examples of P0[r], the probability that the attack recovers "
             "label r at this noise (what label_attack/accuracy averages to), a running mean "
             "logged only when another min_examples examples were attacked (one batch's is a "
             "label oracle)"),
    *_coverage(FAMILY_LABEL_DP),
    # FederatedLabelAttack (FedSGD clients of DPFedAvg)
    Quantity(FAMILY_FL_LABEL_ATTACK, ACCURACY, _ACCURACY,
             "share of the attacked examples' labels recovered from their clients' clipped "
             "updates (the server's view), a running mean logged only when another "
             "min_examples examples were attacked (never one client's value)"),
    Quantity(FAMILY_FL_LABEL_ATTACK, ACCURACY_NOISED, _ACCURACY,
             "the same attack on the update plus the release's central noise N(0, (z C)^2 I), "
             "published as accuracy"),
    Quantity(FAMILY_FL_LABEL_ATTACK, EXPECTED_ACCURACY_NOISED, _ACCURACY,
             "mean over the attacked examples of P0[r], the noised attack's success "
             "probability, published as accuracy"),
    Quantity(FAMILY_FL_LABEL_ATTACK, ATTACKED_CLIENTS, None,
             "clients attacked in the round (the summary: over the run)"),
    Quantity(FAMILY_FL_LABEL_ATTACK, EPSILON_LOWER_BOUND, _CLIENT,
             "label-DP lower bound of one client's update in the release, max over the round's "
             "attacked clients (docs/methods/label_dp_multiclass.md eq. (5)-(7))"),
    Quantity(FAMILY_FL_LABEL_ATTACK, EPSILON_LOWER_BOUND_MAX, _CLIENT,
             "running maximum of epsilon_lower_bound over the rounds"),
    Quantity(FAMILY_FL_LABEL_ATTACK, EPSILON_SINGLE_ROUND, _CLIENT,
             "upper bound of one round for one label of one client: the Gaussian mechanism with "
             "sensitivity 2C, mu = 2 / z (no amplification)"),
    Quantity(FAMILY_FL_LABEL_ATTACK, WARNINGS, None,
             "text, written once per reason: why a client or round was skipped"),
]
