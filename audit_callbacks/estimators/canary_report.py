"""Every canary estimate of one audit, from the cosine statistics (numpy and scipy only).

Each threat model's observed (in) and unobserved (out) cosines go through one
:class:`~audit_callbacks.estimators.score_auditor.CanaryScoreAuditor`. The names below are the
keys of :attr:`CanaryReport.estimates`, of ``audit_summary.json``'s ``estimates`` and, after
``audit/``, the TensorBoard tags (one name per quantity). ``<tm>`` is ``final_model`` or
``all_iterates``:

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

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from .score_auditor import CanaryScoreAuditor, ScoreAuditResult

__all__ = [
    "SOURCE", "TAGS", "THREAT_MODELS", "CanaryReport", "canary_report", "chart_layout",
    "cosine_null_pdf", "estimate_names", "summary_estimates", "summary_json",
]

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


#: Every logged number: its name (a report's estimate or field, the summary JSON's key) ->
#: its TensorBoard tag, always ``"audit/" + name``.
TAGS: dict[str, str] = {
    name: f"audit/{name}"
    for name in [*(n for tm in THREAT_MODELS for n in estimate_names(tm).values()),
                 "epsilon_analytic", "epsilon_analytic_rdp", "epsilon_analytic_prv",
                 "num_canaries_participated"]
}


def chart_layout(analytic_tags: list[str]) -> dict[str, dict[str, list[Any]]]:
    """TensorBoard's Custom Scalars layout: one chart per threat model (estimate, valid lower
    bound, parametric lower bound, the analytic epsilons), and the accuracy beside them (any
    ``val*acc*`` tag: custom-scalars tags are regular expressions)."""
    charts: dict[str, list[Any]] = {
        f"epsilon ({tm.replace('_', ' ')})": ["Multiline", [TAGS[estimate_names(tm)[kind]] for kind in (
            "estimate", "lower_bound", "gdp_lower_bound")] + list(analytic_tags)]
        for tm in THREAT_MODELS
    }
    charts["accuracy"] = ["Multiline", [r"val.*acc.*"]]
    return {"privacy audit": charts}


@dataclass(frozen=True)
class CanaryReport:
    """One canary audit's numbers at one point of training.

    Attributes:
        estimates: name -> :class:`ScoreAuditResult` (see the module docstring for the names).
        skipped: name -> why that estimate is missing (too few canaries, degenerate scores).
        epsilon_analytic: the analytic epsilon of a canary at ``delta`` (``inf`` without DP
            noise, None when unknown); ``epsilon_analytic_rdp``, ``epsilon_analytic_prv``:
            Opacus' RDP and PRV accountants on the same history (DP-SGD only).
        max_participations: the most rounds (steps) any canary took part in.
        num_canaries_participated: observed canaries that took part at least once.
        statistics: the cosines: ``final_observed`` / ``all_observed`` ``[participated]``,
            ``final_unobserved`` / ``all_unobserved`` ``[k']`` (float64).
        progress: rounds (DP-FedAvg) or logical steps (DP-SGD) when it was computed.
        step: the trainer's global step when it was computed.
    """

    estimates: dict[str, ScoreAuditResult]
    skipped: dict[str, str]
    epsilon_analytic: float | None = None
    epsilon_analytic_rdp: float | None = None
    epsilon_analytic_prv: float | None = None
    max_participations: int = 0
    num_canaries_participated: int = 0
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    progress: int = 0
    step: int = 0

    def value(self, name: str) -> float | None:
        """The value of estimate ``name``, or None when it was skipped."""
        est = self.estimates.get(name)
        return None if est is None else est.value

    def scalars(self) -> dict[str, float | None]:
        """``{tag: value}`` of every name in :data:`TAGS` (None where skipped)."""
        out: dict[str, float | None] = {}
        for name, tag in TAGS.items():
            value = getattr(self, name) if name not in self.estimates and hasattr(self, name) \
                else self.value(name)
            out[tag] = None if value is None else float(value)
        return out


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
) -> tuple[dict[str, ScoreAuditResult], dict[str, str]]:
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
    estimates: dict[str, ScoreAuditResult] = {}
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
        calls: dict[str, Callable[[], ScoreAuditResult]] = {
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


def summary_json(
    report: CanaryReport | None, *, stale: bool, skip_reason: str | None, inputs: dict[str, Any],
    gradients: bool, callback: str = "CanaryAudit",
) -> dict[str, Any]:
    """The canary audit's ``audit_summary.json`` content: the inputs, every estimate with its
    ``status`` (:func:`summary_estimates`), the analytic epsilon with its status, the tag of
    every name. ``report`` is the fit end's, or with ``stale`` the last earlier one."""
    sign = "theta_0 - theta_T" if gradients else "theta_T - theta_0"
    summary: dict[str, Any] = {
        "callback": callback,
        "source": SOURCE,
        "threat_models": {
            "final_model": f"the adversary sees only the final model; statistic cos(c_j, {sign})",
            "all_iterates": "the adversary sees every round's (step's) model; statistic "
                            "max_t cos(c_j, model delta of round t)",
        },
        "inputs": inputs,
        "tags": TAGS,
        "estimates": summary_estimates(report, report.step if stale and report else None, skip_reason),
    }
    if report is not None:
        eps = report.epsilon_analytic
        summary.update(
            epsilon_analytic=eps, epsilon_analytic_rdp=report.epsilon_analytic_rdp,
            epsilon_analytic_prv=report.epsilon_analytic_prv,
            epsilon_analytic_status="infinite: no DP noise (noise_multiplier = 0)"
            if eps == math.inf else ("ok" if eps is not None else "unknown"),
            max_participations=report.max_participations,
            num_canaries_participated=report.num_canaries_participated,
        )
    return summary


def summary_estimates(
    report: CanaryReport | None, stale_from: int | None = None, reason: str | None = None,
) -> dict[str, Any]:
    """The summary JSON's ``estimates``: every name with its ``status`` (``ok``,
    ``skipped: <reason>``, or ``stale: from step N`` when ``report`` is an earlier one)."""
    names = [n for tm in THREAT_MODELS for n in estimate_names(tm).values()]
    if report is None:
        return {n: {"status": f"skipped: {reason or 'no estimate'}"} for n in names}
    status = "ok" if stale_from is None else f"stale: from step {stale_from}"
    out: dict[str, Any] = {}
    for n in names:
        if n in report.estimates:
            out[n] = {"status": status, **vars(report.estimates[n])}
        else:
            out[n] = {"status": f"skipped: {report.skipped.get(n, reason or 'not computed')}"}
    return out
