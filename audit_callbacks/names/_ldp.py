"""The local-DP callbacks' quantities (families ``ldp``, ``ldp_inference``).

``ldp``: :class:`~audit_callbacks.callbacks.LDPAudit`, the empirical epsilon0 test of a client
randomizer (Matsumoto et al., Alg. 2 and Table 2; docs/methods/ldp.md, C1-C3) and the exact
audit of discrete per-coordinate randomizers. ``ldp_inference``:
:class:`~audit_callbacks.callbacks.LDPInferenceAudit`, the LDP-FL inference attack (Varun et al.
2024, §3.1; docs/methods/ldp.md, C5). Epsilons are in nats.

A quantity measured once per crafting adversary (or attack mode) is registered once per
adversary (mode): its name is the key of the callback's record followed by ``_<adversary>``
(``_<mode>``): the record ``{"adversary": "dummy", "epsilon0_lower_bound": ...}`` is logged as
``ldp/epsilon0_lower_bound_dummy``. In ``LDPAudit``'s summary JSON a record's epsilon0 and
its bounds are one :class:`~audit_callbacks.estimators.result.AuditResult` under ``epsilon0``
(``lower`` is ``epsilon0_lower_bound``), and the exact audit one under
``epsilon_exact_per_coordinate``. The inference records and summary are keyed by the full name
(``error_debiased``). The adversaries and modes here are those of
:data:`~audit_callbacks.callbacks.ldp_audit.ADVERSARY_NAMES` and
:data:`~audit_callbacks.callbacks.ldp_inference.INFERENCE_MODES` (a test checks they agree; an
unregistered one fails at :func:`audit_callbacks.names.tag`).
"""

from __future__ import annotations

from ._keys import (
    CLIENT_UPDATES_AT_CLIP,
    CLIP_NORM,
    CONFIDENCE_STEM,
    EPSILON0_CEILING,
    EPSILON0_CLAIMED,
    EPSILON0_LOWER_BOUND_STEM,
    EPSILON0_STEM,
    EPSILON_CLAIMED_PER_COORDINATE,
    EPSILON_EXACT_PER_COORDINATE,
    ERROR_MAX_STEM,
    ERROR_MEDIAN_STEM,
    ERROR_STEM,
    FAMILY_LDP,
    FAMILY_LDP_INFERENCE,
    qualified,
)
from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS", "SOURCES"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {
    FAMILY_LDP: "LDP audit",
    FAMILY_LDP_INFERENCE: "LDP-FL inference attack",
}

#: family -> the work its quantities come from (the table in docs/tags.md cites it).
SOURCES: dict[str, str] = {
    FAMILY_LDP: "Matsumoto, Takahashi, Liew & Oguchi, \"Measuring Local and Shuffled Privacy of "
                "Gradient Randomized Response\", Alg. 2, eq. 3 and Table 2; docs/methods/ldp.md, C1-C3",
    FAMILY_LDP_INFERENCE: "Varun, Feng, Wang, Sural, Hong, \"Towards Accurate and Stronger LDP for FL "
                          "with Staircase Randomized Response\", CODASPY 2024, §3.1, eq. 2 and eq. 10; "
                          "docs/methods/ldp.md, C5",
}

# The crafting adversaries of Matsumoto et al. Table 2, weakest first. The crafted pairs' norms
# are not registered: the gradient adversaries' pairs are gradients of real examples, and no
# value of a real example is logged (docs/security.md).
_ADVERSARIES = ("benign", "label_flip", "gradient_flip", "collusion", "dummy")
_MODES = {
    "debiased": "the attacker averages the mechanism's debiased values (randomizer.debias)",
    "raw": "the attacker averages the released values as they are",
}

_EPSILON0 = "epsilon0 (estimates, lower bounds, claimed)"
_NORMS = "clip norm"
_ERROR = "prediction error / domain"
_CONFIDENCE = "confidence score"


def _ldp() -> list[Quantity]:
    out: list[Quantity] = []
    for adv in _ADVERSARIES:
        out.append(Quantity(FAMILY_LDP, qualified(EPSILON0_STEM, adv), _EPSILON0,
            f"empirical epsilon0 of the run's randomizer against the {adv} adversary: the eq.-3 "
            "point estimate of the distinguishing game (capped at the ceiling of its group sizes "
            "when an error rate is 0)"))
    for adv in _ADVERSARIES:
        out.append(Quantity(FAMILY_LDP, qualified(EPSILON0_LOWER_BOUND_STEM, adv), _EPSILON0,
            f"one-sided (1 - alpha) lower bound on epsilon0, {adv} adversary: Clopper-Pearson "
            "upper bounds on FPR and FNR at alpha/2 each (a per-test bound; the broken-randomizer "
            "flag uses a family-wise one)"))
    out += [
        Quantity(FAMILY_LDP, EPSILON0_CLAIMED, _EPSILON0,
                 "the epsilon the randomizer claims for one release of a whole d-dim row "
                 "(epsilon_for_dim(d): eps0 for LDP-SGD, d * eps for per-coordinate mechanisms)"),
        Quantity(FAMILY_LDP, EPSILON0_CEILING, _EPSILON0,
                 "the largest lower bound the audit's tests could show: the largest over its "
                 "adversaries of the zero-error bound at the test's realised split of the trials "
                 "(near measurable_ceiling(trials, alpha), the nominal split's); no lower bound "
                 "logged at that round is above it"),
    ]
    out += [
        Quantity(FAMILY_LDP, CLIP_NORM, _NORMS,
                 "L: the randomizer's clip norm (else DP-FedAvg's)"),
        Quantity(FAMILY_LDP, CLIENT_UPDATES_AT_CLIP, None,
                 "share of the real clients' updates so far that DP-FedAvg clipped to its clip "
                 "norm (raw norm >= the clip norm)"),
        Quantity(FAMILY_LDP, EPSILON_EXACT_PER_COORDINATE, None,
                 "discrete per-coordinate randomizers, once at fit start: the exact epsilon of "
                 "one coordinate, max over inputs x, x' and outputs y of log P(y|x) - "
                 "log P(y|x') by enumeration (+inf when an output is impossible under one input)"),
        Quantity(FAMILY_LDP, EPSILON_CLAIMED_PER_COORDINATE, None,
                 "the per-coordinate epsilon the discrete randomizer claims (beside the exact one)"),
    ]
    return out


def _ldp_inference() -> list[Quantity]:
    out: list[Quantity] = []
    for mode, how in _MODES.items():
        out += [
            Quantity(FAMILY_LDP_INFERENCE, qualified(ERROR_STEM, mode), _ERROR,
                     f"mean over the attacked coordinates of |w_hat - w_mean| / (2r) ({how}); "
                     "w_mean: the mean projected input over every released row so far"),
            Quantity(FAMILY_LDP_INFERENCE, qualified(ERROR_MEDIAN_STEM, mode), _ERROR,
                     f"median over the attacked coordinates of |w_hat - w_mean| / (2r) ({how})"),
            Quantity(FAMILY_LDP_INFERENCE, qualified(ERROR_MAX_STEM, mode), None,
                     f"largest |w_hat - w_mean| / (2r) over the attacked coordinates ({how})"),
            Quantity(FAMILY_LDP_INFERENCE, qualified(CONFIDENCE_STEM, mode), _CONFIDENCE,
                     f"mean over the coordinates of eq. 10's confidence score "
                     f"1 / (0.01 + |w_hat_2 - w_hat_1| / (2r)) of two random halves of the "
                     f"history, in (0, 100] ({how}; from the second round on)"),
        ]
    return out


QUANTITIES: list[Quantity] = _ldp() + _ldp_inference()
