"""Tests of the binomial intervals (Clopper-Pearson, Jeffreys) and error-rate epsilons."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from audit_callbacks.estimators import (
    clopper_pearson_interval,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_from_error_rates,
    epsilon_from_error_rates_array,
    jeffreys_interval,
    jeffreys_lower,
    jeffreys_upper,
)


@pytest.mark.parametrize("n", [1, 10, 100, 1000])
@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_clopper_pearson_known_values(n: int, alpha: float) -> None:
    lo, hi = clopper_pearson_interval(0, n, alpha)
    assert lo == 0.0
    assert hi == pytest.approx(1 - (alpha / 2) ** (1 / n), rel=1e-10)
    lo, hi = clopper_pearson_interval(n, n, alpha)
    assert hi == 1.0
    assert lo == pytest.approx((alpha / 2) ** (1 / n), rel=1e-10)
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-10)
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-10)


def test_clopper_pearson_defining_tail_equations() -> None:
    n, k, alpha = 50, 17, 0.05
    lo, hi = clopper_pearson_interval(k, n, alpha)
    assert binom.sf(k - 1, n, lo) == pytest.approx(alpha / 2, rel=1e-8)  # P(X >= k | lo)
    assert binom.cdf(k, n, hi) == pytest.approx(alpha / 2, rel=1e-8)  # P(X <= k | hi)


def test_jeffreys_known_values_and_conventions() -> None:
    lo, hi = jeffreys_interval(0, 20, 0.05)
    assert lo == 0.0 and 0 < hi < 1
    lo, hi = jeffreys_interval(20, 20, 0.05)
    assert hi == 1.0 and 0 < lo < 1
    # one-sided upper bound: Beta(k+1/2, n-k+1/2) quantile, no boundary modification (A6)
    assert 0 < jeffreys_upper(20, 20, 0.05) < 1
    # Brown-Cai-DasGupta 2001, Table: n = 10, k = 3 -> Jeffreys 95% about (0.093, 0.606)
    lo, hi = jeffreys_interval(3, 10, 0.05)
    assert lo == pytest.approx(0.093, abs=2e-3) and hi == pytest.approx(0.606, abs=2e-3)
    # Jeffreys is narrower than Clopper-Pearson
    cp = clopper_pearson_interval(3, 10, 0.05)
    assert cp[0] < lo and hi < cp[1]
    # vectorised one-sided bounds agree with the scalar ones
    ks = np.arange(11)
    up = jeffreys_upper(ks, 10, 0.05)
    assert up.shape == (11,) and np.all(np.diff(up) > 0)
    assert up[4] == pytest.approx(jeffreys_upper(4, 10, 0.05))
    assert np.all(jeffreys_lower(ks, 10, 0.05) < up)


@pytest.mark.parametrize("n, p", [(30, 0.1), (100, 0.5), (200, 0.03), (500, 0.8)])
def test_coverage_by_simulation(n: int, p: float) -> None:
    rng = np.random.default_rng(n)
    ks = rng.binomial(n, p, size=20_000)
    table_cp = np.array([clopper_pearson_interval(k, n, 0.05) for k in range(n + 1)])
    table_j = np.array([jeffreys_interval(k, n, 0.05) for k in range(n + 1)])
    cov_cp = np.mean((table_cp[ks, 0] <= p) & (p <= table_cp[ks, 1]))
    cov_j = np.mean((table_j[ks, 0] <= p) & (p <= table_j[ks, 1]))
    # exact coverage of the same intervals, for the record
    exact_cp = sum(
        binom.pmf(k, n, p) for k in range(n + 1) if table_cp[k, 0] <= p <= table_cp[k, 1]
    )
    assert exact_cp >= 0.95 - 1e-12  # Clopper-Pearson is conservative
    assert cov_cp >= 0.95 - 0.006  # 0.006 ~ 4 binomial sds at 20k draws
    assert 0.925 <= cov_j <= 0.975  # Jeffreys: close to nominal, either side
    # one-sided Jeffreys upper bound (as eps_lo uses it)
    up = jeffreys_upper(np.arange(n + 1), n, 0.05)
    assert np.mean(up[ks] >= p) >= 0.92


@pytest.mark.parametrize(
    "call",
    [
        lambda: clopper_pearson_interval(-1, 10, 0.05),
        lambda: clopper_pearson_interval(11, 10, 0.05),
        lambda: clopper_pearson_interval(1, 0, 0.05),
        lambda: clopper_pearson_interval(1.5, 10, 0.05),
        lambda: clopper_pearson_interval(1, 10, 0.0),
        lambda: clopper_pearson_interval(1, 10, 1.0),
        lambda: jeffreys_interval(1, 10, float("nan")),
        lambda: jeffreys_upper(np.array([1, 20]), 10, 0.05),
        lambda: jeffreys_upper(np.array([1.0, np.nan]), 10, 0.05),
        lambda: clopper_pearson_upper(3, 10, 1.5),
    ],
)
def test_interval_bad_input_raises(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_epsilon_from_error_rates() -> None:
    assert epsilon_from_error_rates(0.5, 0.5) == 0.0
    # max(log(0.9/0.2), log(0.8/0.1)) = log 8
    assert epsilon_from_error_rates(0.1, 0.2) == pytest.approx(math.log(8.0))
    assert epsilon_from_error_rates(0.2, 0.1) == pytest.approx(math.log(8.0))
    assert epsilon_from_error_rates(0.1, 0.2, delta=0.05) == pytest.approx(math.log(7.5))
    assert epsilon_from_error_rates(0.3, 0.6) == pytest.approx(math.log(0.4 / 0.3))
    assert epsilon_from_error_rates(0.0, 0.3) == math.inf
    assert epsilon_from_error_rates(0.9, 0.9) == 0.0  # worse than chance: floored
    assert epsilon_from_error_rates(1.0, 1.0) == 0.0  # no NaN
    assert epsilon_from_error_rates(0.0, 0.0) == math.inf
    # the ceiling of METHODS C2: 1000 trials all right, CP upper bounds at alpha = 0.05
    ub = clopper_pearson_upper(0, 500, 0.05)
    assert epsilon_from_error_rates(ub, ub) == pytest.approx(math.log((1 - ub) / ub))
    arr = epsilon_from_error_rates_array([0.1, 0.0, 0.5], [0.2, 0.3, 0.5], 0.0)
    np.testing.assert_allclose(arr, [math.log(8.0), math.inf, 0.0])
    assert not np.any(np.isnan(epsilon_from_error_rates_array([0, 1, 1], [0, 1, 0])))


@pytest.mark.parametrize(
    "call",
    [
        lambda: epsilon_from_error_rates(-0.1, 0.2),
        lambda: epsilon_from_error_rates(0.1, 1.2),
        lambda: epsilon_from_error_rates(float("nan"), 0.2),
        lambda: epsilon_from_error_rates(0.1, 0.2, delta=1.0),
        lambda: epsilon_from_error_rates(0.1, 0.2, delta=-1e-3),
        lambda: epsilon_from_error_rates_array([0.1, np.inf], [0.1, 0.1]),
    ],
)
def test_error_rates_bad_input_raises(call) -> None:
    with pytest.raises(ValueError):
        call()
