"""A canary audit's report at one point of training, and the summary JSON built from it.

The estimates themselves come from :func:`audit_callbacks.estimators.canary_report.canary_report`
(numpy and scipy only); this module holds what is not numerics: the report's fields, their
TensorBoard tags (:mod:`audit_callbacks.names`, family ``audit``) and the summary's layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audit_callbacks import names
from audit_callbacks.estimators.canary_report import SOURCE, THREAT_MODELS, estimate_names
from audit_callbacks.estimators.result import AuditResult

__all__ = ["CanaryReport", "summary_estimates", "summary_json"]

#: The report's fields that are logged beside the estimates (names of family ``audit``).
_FIELDS = ("epsilon_analytic", "epsilon_analytic_rdp", "epsilon_analytic_prv",
           "epsilon_last_iterate_heuristic", "num_canaries_participated")

#: Each threat model's headline estimate and the reference it is compared with.
REFERENCES = {"final_model": ("epsilon_final_model", "epsilon_last_iterate_heuristic"),
              "all_iterates": ("epsilon_all_iterates", "epsilon_analytic")}


@dataclass(frozen=True)
class CanaryReport:
    """One canary audit's numbers at one point of training.

    Attributes:
        estimates: name -> result (names of :func:`~audit_callbacks.estimators.canary_report.
            estimate_names`: ``epsilon_<tm>``, ``epsilon_<tm>_unequal_fit``,
            ``epsilon_lower_bound_<tm>``, ``epsilon_gdp_lower_bound_<tm>``).
        skipped: name -> why that estimate is missing (too few canaries, degenerate scores).
        epsilon_analytic: the analytic epsilon of a canary at ``delta`` (``inf`` without DP
            noise, None when unknown); ``epsilon_analytic_rdp``, ``epsilon_analytic_prv``:
            Opacus' RDP and PRV accountants on the same history (DP-SGD only).
        epsilon_last_iterate_heuristic: the final-model reference: the epsilon of the last
            iterate alone (Steinke et al., "The Last Iterate Advantage", ICLR 2025), a
            heuristic, not a bound; None when unknown.
        max_participations: the most rounds (steps) any canary took part in.
        num_canaries_participated: observed canaries that took part at least once.
        statistics: the cosines: ``final_observed`` / ``all_observed`` ``[participated]``,
            ``final_unobserved`` / ``all_unobserved`` ``[k']`` (float64).
        progress: rounds (DP-FedAvg, Flower) or logical steps (DP-SGD) when it was computed.
        step: the training's step when it was computed (Lightning's global step, Flower's
            round).
        index: the logged point it is (its valid bounds at the level spent for that point),
            or None (plain alpha: the summary's).
    """

    estimates: dict[str, AuditResult]
    skipped: dict[str, str]
    epsilon_analytic: float | None = None
    epsilon_analytic_rdp: float | None = None
    epsilon_analytic_prv: float | None = None
    epsilon_last_iterate_heuristic: float | None = None
    max_participations: int = 0
    num_canaries_participated: int = 0
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    progress: int = 0
    step: int = 0
    index: int | None = None

    def value(self, name: str) -> float | None:
        """The value of estimate ``name``, or None when it was skipped."""
        est = self.estimates.get(name)
        return None if est is None else est.value

    def scalars(self) -> dict[str, float | None]:
        """``{tag: value}`` of every quantity of family ``audit`` (None where skipped or
        unknown); the tags are :mod:`audit_callbacks.names`'."""
        out: dict[str, float | None] = {}
        ratios = self.ratios()
        for q in names.family("audit"):
            if q.name in _FIELDS:
                value = getattr(self, q.name)
            elif q.name in ratios:
                value = ratios[q.name]
            else:
                value = self.value(q.name)
            out[q.tag] = None if value is None else float(value)
        return out

    def ratios(self) -> dict[str, float | None]:
        """``epsilon_ratio_<tm>``: each threat model's headline estimate over its reference
        (None where either is missing, the reference is 0 or infinite)."""
        out: dict[str, float | None] = {}
        for tm, (estimate, reference) in REFERENCES.items():
            est, ref = self.value(estimate), getattr(self, reference)
            ok = est is not None and ref is not None and 0 < ref < math.inf
            out[f"epsilon_ratio_{tm}"] = est / ref if ok else None
        return out


def summary_json(
    report: CanaryReport | None, *, stale: bool, skip_reason: str | None, inputs: dict[str, Any],
    gradients: bool, callback: str,
) -> dict[str, Any]:
    """The canary audit's ``audit_summary.json`` content: the inputs, every estimate with its
    ``status`` (:func:`summary_estimates`), the analytic epsilon with its status, the tag of
    every name. ``report`` is the end's, or with ``stale`` the last earlier one."""
    sign = "theta_0 - theta_T" if gradients else "theta_T - theta_0"
    summary: dict[str, Any] = {
        "callback": callback,
        "source": SOURCE,
        "threat_models": {
            "final_model": f"the adversary sees only the final model; statistic cos(c_j, {sign}); "
                           "reference: the last-iterate heuristic (Steinke et al., ICLR 2025), "
                           "a heuristic, not a bound",
            "all_iterates": "the adversary sees every round's (step's) release; statistic: the "
                            "one matched to the analytic epsilon's adversary (known rounds for "
                            "DP-FedAvg and Flower, steps unknown for DP-SGD), or the final-model "
                            "one where larger; reference: the analytic epsilon",
        },
        "inputs": inputs,
        "tags": {q.name: q.tag for q in names.family("audit")},
        "estimates": summary_estimates(report, report.step if stale and report else None, skip_reason),
    }
    if report is not None:
        eps = report.epsilon_analytic
        summary.update(
            epsilon_analytic=eps, epsilon_analytic_rdp=report.epsilon_analytic_rdp,
            epsilon_analytic_prv=report.epsilon_analytic_prv,
            epsilon_last_iterate_heuristic=report.epsilon_last_iterate_heuristic,
            **report.ratios(),
            epsilon_analytic_status="infinite: no DP noise (noise_multiplier = 0)"
            if eps == math.inf else ("ok" if eps is not None else "unknown"),
            max_participations=report.max_participations,
            num_canaries_participated=report.num_canaries_participated,
        )
    return summary


def summary_estimates(
    report: CanaryReport | None, stale_from: int | None = None, reason: str | None = None,
) -> dict[str, Any]:
    """The summary JSON's ``estimates``: every name with its ``status`` (``ok``, the result's
    own status such as ``too few canaries (k = 10)``, ``skipped: <reason>``, or ``stale: from
    step N`` when ``report`` is an earlier one)."""
    all_names = [n for tm in THREAT_MODELS for n in estimate_names(tm).values()]
    if report is None:
        return {n: {"status": f"skipped: {reason or 'no estimate'}"} for n in all_names}
    out: dict[str, Any] = {}
    for n in all_names:
        if n in report.estimates:
            est = report.estimates[n]
            status = f"stale: from step {stale_from}" if stale_from is not None else est.status
            out[n] = {**est.to_dict(), "status": status}
        else:
            out[n] = {"status": f"skipped: {report.skipped.get(n, reason or 'not computed')}"}
    return out
