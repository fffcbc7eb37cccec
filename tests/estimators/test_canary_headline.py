"""The all-iterates headline ``epsilon_all_iterates`` of
:func:`~audit_callbacks.estimators.canary_report.canary_estimates`: which statistics it is the
larger of (named in ``details["candidates"]`` and ``details["statistic"]``), and the level
(``alpha``) every estimate with a bootstrap interval states."""

from __future__ import annotations

import numpy as np
import pytest

from audit_callbacks import names
from audit_callbacks.estimators.canary_report import canary_estimates
from audit_callbacks.estimators.result import AuditResult


def _scores(k: int = 200, kk: int = 2000, final_shift: float = 1.0, cos_shift: float = 3.0,
            seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Final-model and max-cosine ``(observed [k], unobserved [kk])`` scores, each Gaussian of
    unit variance with the observed ones shifted (the max cosine far more than the final)."""
    rng = np.random.default_rng(seed)
    final = (rng.normal(final_shift, 1.0, k), rng.normal(0.0, 1.0, kk))
    cos = (rng.normal(cos_shift, 1.0, k), rng.normal(0.0, 1.0, kk))
    return final, cos


def test_without_a_matched_statistic_the_headline_is_the_larger_of_max_cosine_and_final_named():
    """No matched statistic (no DP noise, local DP, an unknown server optimizer): the headline
    is the larger of the max-cosine and the final-model estimates, and ``candidates`` lists
    both (before, the max cosine won silently while ``candidates`` listed only the matched
    statistic, None, and the final model)."""
    final, cos = _scores()
    est, skipped = canary_estimates(final, 1e-5, max_cosine=cos)
    head = est[names.EPSILON_ALL_ITERATES]
    mc, fm = est[names.EPSILON_ALL_ITERATES_MAX_COSINE].value, est[names.EPSILON_FINAL_MODEL].value
    assert names.EPSILON_ALL_ITERATES_MATCHED in skipped
    assert head.details["candidates"] == {"max_cosine": mc, "final_model": fm}
    assert mc > fm and head.value == mc and head.details["statistic"] == "max_cosine"
    # the final-model scores far stronger: the final model wins, the max cosine still listed
    final, cos = _scores(final_shift=3.0, cos_shift=0.5, seed=1)
    est, _ = canary_estimates(final, 1e-5, max_cosine=cos)
    head = est[names.EPSILON_ALL_ITERATES]
    assert head.details["statistic"] == "final_model"
    assert head.value == est[names.EPSILON_FINAL_MODEL].value
    assert head.details["candidates"]["max_cosine"] == est[names.EPSILON_ALL_ITERATES_MAX_COSINE].value


def test_with_a_matched_statistic_the_max_cosine_is_never_the_headline():
    """Where a matched statistic exists the max cosine is a comparison only, however large."""
    final, cos = _scores(cos_shift=6.0)
    rng = np.random.default_rng(2)
    matched_scores = (rng.normal(2.0, 1.0, 200), rng.normal(0.0, 1.0, 2000))
    matched = AuditResult(value=2.5, method="matched", delta=1e-5)
    est, _ = canary_estimates(final, 1e-5, max_cosine=cos, matched=(matched_scores, matched))
    head = est[names.EPSILON_ALL_ITERATES]
    assert est[names.EPSILON_ALL_ITERATES_MAX_COSINE].value > head.value
    assert set(head.details["candidates"]) == {"matched", "final_model"}
    assert head.value == max(2.5, est[names.EPSILON_FINAL_MODEL].value)


@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_every_estimate_with_an_interval_states_its_alpha(alpha):
    """An estimate with a bootstrap interval carries ``alpha`` = 1 - the interval's confidence
    (before, the two-Gaussian fits had ``alpha`` None beside a 95% interval); without an
    interval it has none."""
    final, cos = _scores()
    est, _ = canary_estimates(final, 1e-5, max_cosine=cos, alpha=alpha, bootstrap=20, seed=0)
    with_interval = [n for n, r in est.items() if r.lower is not None]
    assert {names.EPSILON_FINAL_MODEL, names.EPSILON_FINAL_MODEL_UNEQUAL_FIT,
            names.EPSILON_ALL_ITERATES_MAX_COSINE, names.EPSILON_ALL_ITERATES} <= set(with_interval)
    for name in with_interval:
        assert est[name].alpha == alpha, name
        assert est[name].details["confidence"] == pytest.approx(1 - alpha)
    plain, _ = canary_estimates(final, 1e-5, max_cosine=cos, alpha=alpha)
    assert plain[names.EPSILON_FINAL_MODEL].lower is None and plain[names.EPSILON_FINAL_MODEL].alpha is None
