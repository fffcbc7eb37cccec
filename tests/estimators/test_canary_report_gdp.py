"""The parametric (GDP) bound is shown as a bound only where it lies below its own statistic's
estimate interval; above it, it is skipped with a status that says why."""

from dataclasses import replace

import numpy as np

from audit_callbacks import names
from audit_callbacks.estimators.canary_report import canary_estimates, gdp_above_estimate
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.estimators.score_auditor import CanaryScoreAuditor

RNG = np.random.default_rng(0)
IN, OUT = 2.0 + RNG.standard_normal(300), RNG.standard_normal(3000)


def test_gdp_above_the_estimate_interval_is_not_a_bound() -> None:
    est = AuditResult(value=605.4, lower=590.0, upper=615.0)
    reason = gdp_above_estimate(AuditResult(value=620.6), est)
    assert reason is not None and reason.startswith("not shown as a bound") and "615" in reason
    assert gdp_above_estimate(AuditResult(value=610.0), est) is None  # inside the interval
    assert gdp_above_estimate(AuditResult(value=600.0), AuditResult(value=599.0)) is not None
    assert gdp_above_estimate(None, est) is None and gdp_above_estimate(AuditResult(value=1.0), None) is None


def test_canary_estimates_skip_a_gdp_bound_above_its_estimate(monkeypatch) -> None:
    est, skipped = canary_estimates((IN, OUT), 1e-5, bootstrap=50)
    gdp = est.get(names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL)
    assert gdp is not None and gdp.value <= est[names.EPSILON_FINAL_MODEL].upper  # shown

    real = CanaryScoreAuditor.epsilon_gdp_lower_bound

    def above(self, *args, **kwargs):  # a parametric bound above the estimate's interval
        res = real(self, *args, **kwargs)
        return replace(res, value=res.value + 100.0)

    monkeypatch.setattr(CanaryScoreAuditor, "epsilon_gdp_lower_bound", above)
    est, skipped = canary_estimates((IN, OUT), 1e-5, bootstrap=50)
    assert names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL not in est
    assert skipped[names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL].startswith("not shown as a bound")
