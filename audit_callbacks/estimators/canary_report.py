"""Every canary estimate of one audit, from the cosine statistics (numpy and scipy only).

Each threat model's observed (in) and unobserved (out) cosines go through one
:class:`~audit_callbacks.estimators.score_auditor.CanaryScoreAuditor`. The names below are the
keys of the report's ``estimates``, of ``audit_summary.json``'s ``estimates`` and, after
``audit/``, the TensorBoard tags (one name per quantity, :mod:`audit_callbacks.names`).
``<tm>`` is ``final_model`` or ``all_iterates``:

* ``epsilon_<tm>`` - the equal-variance two-Gaussian estimate (Andrew et al., ICLR 2024, §3.2,
  with the equal variances their Thm 3.3 justifies): the headline number;
* ``epsilon_<tm>_unequal_fit`` - Andrew et al.'s unequal-variance fit (biased upward at small
  epsilon: +58% at epsilon 1 in ``benchmarks/lower_bounds.py``);
* ``epsilon_lower_bound_<tm>`` - Clopper-Pearson on FPR and FNR with a Bonferroni correction
  over a fixed set of thresholds: a valid (1 - alpha) lower bound, no assumption on the scores;
* ``epsilon_gdp_lower_bound_<tm>`` - the parametric (1 - alpha) lower bound assuming Gaussian
  scores of equal variance (Gaussian differential privacy, Dong, Roth, Su 2022), with a
  goodness-of-fit p-value.

The formulas are in ``docs/methods/canaries.md`` and ``docs/methods/score_auditor.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from .result import AuditResult
from .score_auditor import CanaryScoreAuditor

__all__ = ["SOURCE", "THREAT_MODELS", "canary_report", "cosine_null_pdf", "estimate_names"]

THREAT_MODELS = ("final_model", "all_iterates")
SOURCE = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar: One-shot Empirical Privacy "
          "Estimation for Federated Learning (ICLR 2024), Alg. 2 (final model) and Alg. 3 "
          "(all iterates)")


def estimate_names(threat_model: str) -> dict[str, str]:
    """The estimate names of one threat model: ``{kind: name}`` with kinds ``estimate``,
    ``unequal_fit``, ``lower_bound``, ``gdp_lower_bound``."""
    return {
        "estimate": f"epsilon_{threat_model}",
        "unequal_fit": f"epsilon_{threat_model}_unequal_fit",
        "lower_bound": f"epsilon_lower_bound_{threat_model}",
        "gdp_lower_bound": f"epsilon_gdp_lower_bound_{threat_model}",
    }


def cosine_null_pdf(t: ArrayLike, dim: int) -> np.ndarray:
    """Density of the cosine of a uniform random unit vector with a fixed one in d dimensions:
    (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2) (Andrew et al., ICLR 2024, §3)."""
    a = (dim - 1) / 2
    return 0.5 * stats.beta.pdf((np.asarray(t, dtype=float) + 1.0) / 2.0, a, a)


def canary_report(
    observed: dict[str, np.ndarray],
    unobserved: dict[str, np.ndarray],
    delta: float,
    *,
    dim: int | None = None,
    alpha: float = 0.05,
    bootstrap: int = 0,
    seed: int = 0,
) -> tuple[dict[str, AuditResult], dict[str, str]]:
    """Every estimate of both threat models.

    Args:
        observed: ``{threat_model: [k] cosines}`` of the observed canaries that took part
            (final model: ``cos(c_j, release)``; all iterates: the max over rounds).
        unobserved: ``{threat_model: [k'] cosines}`` of canaries never inserted (the null).
        delta: the target delta in (0, 1).
        dim: the number of model parameters, given when the final-model null is the exact law
            of the cosine of a uniform random direction (Gaussian canaries); None: the null is
            the unobserved canaries alone (Hadamard canaries).
        alpha: the lower bounds hold with confidence 1 - alpha.
        bootstrap: resamples for the estimates' percentile intervals (0: none).
        seed: seed of the bootstrap.

    Returns:
        ``(estimates, skipped)``: name -> result, and name -> the reason it is missing. No
        value is NaN or infinite.
    """
    estimates: dict[str, AuditResult] = {}
    skipped: dict[str, str] = {}
    for tm in THREAT_MODELS:
        names = estimate_names(tm)
        obs, unobs = observed.get(tm), unobserved.get(tm)
        if obs is None or unobs is None or np.size(obs) < 2 or np.size(unobs) < 2:
            why = "fewer than 2 observed or unobserved canaries (or no round yet)"
            skipped.update({name: why for name in names.values()})
            continue
        try:
            auditor = CanaryScoreAuditor(obs, unobs, dim=dim if tm == "final_model" else None)
        except ValueError as err:  # e.g. all scores equal
            skipped.update({name: str(err) for name in names.values()})
            continue
        calls: dict[str, Callable[[], AuditResult]] = {
            "estimate": lambda a=auditor: a.epsilon_estimate(
                delta, fit="equal", bootstrap=bootstrap, confidence=1 - alpha, seed=seed),
            "unequal_fit": lambda a=auditor: a.epsilon_estimate(
                delta, fit="unequal", bootstrap=bootstrap, confidence=1 - alpha, seed=seed),
            "lower_bound": lambda a=auditor: a.epsilon_lower_bound(alpha, delta, threshold="bonferroni"),
            "gdp_lower_bound": lambda a=auditor: a.epsilon_gdp_lower_bound(alpha, delta),
        }
        for kind, call in calls.items():
            try:
                estimates[names[kind]] = call()
            except ValueError as err:  # degenerate scores: say why, never a NaN
                skipped[names[kind]] = str(err)
    return estimates, skipped
