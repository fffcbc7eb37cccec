"""Tests of the Gaussian-pair epsilons (METHODS A2, A3, D; Balle & Wang 2018; Andrew et al. 2024 §3.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import log_ndtr
from scipy.stats import norm

from audit_callbacks.estimators import (
    epsilon_two_gaussians,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    two_gaussians_delta,
)
from audit_callbacks.estimators.gaussian import (
    _eps_upper_bracket,
    _epsilon_standardized_scalar,
    _log_delta_standardized,
    _log_delta_standardized_scalar,
)


def _balle_wang_eps(big_delta: float, delta: float) -> float:
    """Independent solve of Phi(D/2 - e/D) - e^e Phi(-D/2 - e/D) = delta (log-safe product)."""

    def f(eps: float) -> float:
        a = norm.cdf(big_delta / 2 - eps / big_delta)
        b = math.exp(eps + log_ndtr(-big_delta / 2 - eps / big_delta))
        return (a - b) - delta

    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2
    return brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-13)


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
@pytest.mark.parametrize("big_delta", [0.05, 0.3, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0])
def test_equal_variances_match_balle_wang(big_delta: float, delta: float) -> None:
    expected = _balle_wang_eps(big_delta, delta)
    got = epsilon_two_gaussians(big_delta, 1.0, 0.0, 1.0, delta)
    assert got == pytest.approx(expected, rel=1e-7, abs=1e-9)
    # location/scale invariance and symmetry of the pair
    got2 = epsilon_two_gaussians(3.0 - 0.01 * big_delta, 0.01, 3.0, 0.01, delta)
    assert got2 == pytest.approx(expected, rel=1e-7, abs=1e-9)
    assert epsilon_two_gaussians(0.0, 1.0, big_delta, 1.0, delta) == pytest.approx(
        expected, rel=1e-7, abs=1e-9
    )
    # and the analytic Gaussian mechanism with noise multiplier 1/Delta
    assert gaussian_epsilon(1.0 / big_delta, delta) == pytest.approx(expected, rel=1e-7, abs=1e-9)


def _quad_delta(eps: float, m: float, r: float, delta: float) -> float:
    """max over both directions of int max(0, p - e^eps q), by adaptive quadrature."""
    p = norm(m, r).pdf
    q = norm(0.0, 1.0).pdf
    lim = max(abs(m) + 15 * r, 15.0)  # mass beyond is < 1e-50
    # kinks of the integrand: roots of L(x) = +-eps (computed independently with np.roots)
    a = 0.5 - 0.5 / r**2
    b = m / r**2
    c = -0.5 * m * m / r**2 - math.log(r)
    pts = []
    for s in (eps, -eps):
        for root in np.roots([a, b, c - s]) if a != 0 else [(s - c) / b]:
            if abs(np.imag(root)) < 1e-12 and abs(np.real(root)) < lim:
                pts.append(float(np.real(root)))
    pts = sorted(set(pts))
    kw = {"points": pts or None, "limit": 500, "epsabs": 1e-9 * delta, "epsrel": 1e-10}
    h1 = quad(lambda x: max(0.0, p(x) - math.exp(eps) * q(x)), -lim, lim, **kw)[0]
    h2 = quad(lambda x: max(0.0, q(x) - math.exp(eps) * p(x)), -lim, lim, **kw)[0]
    return max(h1, h2)


@pytest.mark.parametrize("delta", [1e-3, 1e-5])
@pytest.mark.parametrize(
    "m, r",
    [
        (1.0, 1.5),  # a > 0
        (2.0, 3.0),  # a > 0, wide
        (0.5, 0.7),  # a < 0
        (3.0, 0.4),  # a < 0, narrow
        (0.0, 2.0),  # no shift, a > 0
        (0.0, 0.5),  # no shift, a < 0
        (4.0, 1.0 + 1e-6),  # a tiny but nonzero
    ],
)
def test_unequal_variances_against_quadrature(m: float, r: float, delta: float) -> None:
    eps_hat = epsilon_two_gaussians(m, r, 0.0, 1.0, delta)
    assert eps_hat > 0
    assert _quad_delta(eps_hat, m, r, delta) == pytest.approx(delta, rel=1e-5)
    assert two_gaussians_delta(eps_hat, m, r, 0.0, 1.0) == pytest.approx(delta, rel=1e-8)
    # smallest such eps: a little less gives a larger delta
    assert _quad_delta(eps_hat * 0.99, m, r, delta) > delta


def test_swapping_roles_and_scaling_leave_epsilon_unchanged() -> None:
    for m1, s1 in [(0.7, 0.3), (2.5, 4.0), (-1.0, 1.2)]:
        e = epsilon_two_gaussians(m1, s1, 0.0, 1.0, 1e-6)
        assert epsilon_two_gaussians(0.0, 1.0, m1, s1, 1e-6) == pytest.approx(e, rel=1e-9)
        assert epsilon_two_gaussians(5 + 1e-3 * m1, 1e-3 * s1, 5.0, 1e-3, 1e-6) == pytest.approx(
            e, rel=1e-7
        )


def test_zero_when_delta_at_zero_is_small_enough() -> None:
    assert epsilon_two_gaussians(0.0, 1.0, 0.0, 1.0, 1e-6) == 0.0
    # delta(0) = total variation = 2 Phi(D/2) - 1 ~ D / sqrt(2 pi) for small D
    big_delta = 1e-4
    tv = 2 * norm.cdf(big_delta / 2) - 1
    assert epsilon_two_gaussians(big_delta, 1.0, 0.0, 1.0, 2 * tv) == 0.0
    assert epsilon_two_gaussians(big_delta, 1.0, 0.0, 1.0, tv / 2) > 0.0


def test_large_epsilons_and_extreme_sd_ratios_are_finite_and_self_consistent() -> None:
    cases = [(80.0, 1.0), (50.0, 0.05), (0.0, 1e-3), (0.0, 1e3), (30.0, 20.0), (1e3, 1.0)]
    for m, r in cases:
        eps = epsilon_two_gaussians(m, r, 0.0, 1.0, 1e-6)
        assert math.isfinite(eps) and eps > 0
        assert two_gaussians_delta(eps, m, r, 0.0, 1.0) == pytest.approx(1e-6, rel=1e-6)
    # several thousand: equal variances, Delta = 80 -> eps ~ Delta^2/2 + Delta * z
    eps = epsilon_two_gaussians(80.0, 1.0, 0.0, 1.0, 1e-6)
    assert 3200 < eps < 3200 + 80 * 5
    assert eps == pytest.approx(_balle_wang_eps(80.0, 1e-6), rel=1e-9)


def test_monotone_in_shift_and_delta() -> None:
    shifts = np.linspace(0.1, 8, 15)
    e = [epsilon_two_gaussians(s, 1.3, 0.0, 1.0, 1e-5) for s in shifts]
    assert np.all(np.diff(e) > 0)
    deltas = [1e-2, 1e-4, 1e-6, 1e-8]
    e = [epsilon_two_gaussians(1.0, 0.8, 0.0, 1.0, d) for d in deltas]
    assert np.all(np.diff(e) > 0)


@pytest.mark.parametrize("z, expected", [(0.0496, 298.0), (0.0986, 98.8), (0.2317, 29.2)])
def test_gaussian_epsilon_methods_d(z: float, expected: float) -> None:
    got = gaussian_epsilon(z, 1e-6)
    assert float(f"{got:.3g}") == expected


@pytest.mark.parametrize("z, expected", [(4.22, 1.0), (1.54, 3.0), (0.541, 10.0)])
def test_gaussian_epsilon_methods_a2(z: float, expected: float) -> None:
    assert abs(gaussian_epsilon(z, 1e-6) - expected) < 0.02


def test_gaussian_epsilon_composition_and_sensitivity() -> None:
    # r compositions of z-noise = one release at z / sqrt(r); sensitivity 2 = z / 2
    assert gaussian_epsilon(1.0, 1e-5, compositions=4) == pytest.approx(
        gaussian_epsilon(0.5, 1e-5), rel=1e-12
    )
    assert gaussian_epsilon(1.0, 1e-5, sensitivity=2.0) == pytest.approx(
        gaussian_epsilon(0.5, 1e-5), rel=1e-12
    )
    assert gaussian_mu(0.5, compositions=9) == pytest.approx(6.0)
    assert gaussian_epsilon(1.0, 1e-5, sensitivity=0.0) == 0.0
    eps = gaussian_epsilon(0.8, 1e-5)
    assert gaussian_delta(eps, 1 / 0.8) == pytest.approx(1e-5, rel=1e-9)


def test_gaussian_epsilon_decreasing_in_noise() -> None:
    zs = np.geomspace(0.01, 100, 30)
    e = np.array([gaussian_epsilon(z, 1e-6) for z in zs])
    assert np.all(np.diff(e) < 0)
    assert e[-1] < 0.05 and e[0] > 1000


@pytest.mark.parametrize(
    "call",
    [
        lambda: gaussian_epsilon(0.0, 1e-5),
        lambda: gaussian_epsilon(-1.0, 1e-5),
        lambda: gaussian_epsilon(float("nan"), 1e-5),
        lambda: gaussian_epsilon(float("inf"), 1e-5),
        lambda: gaussian_epsilon(1.0, 0.0),
        lambda: gaussian_epsilon(1.0, 1.0),
        lambda: gaussian_epsilon(1.0, float("nan")),
        lambda: gaussian_epsilon(1.0, 1e-5, compositions=0),
        lambda: gaussian_epsilon(1.0, 1e-5, compositions=1.5),
        lambda: gaussian_epsilon(1.0, 1e-5, sensitivity=-1.0),
        lambda: epsilon_two_gaussians(1.0, 0.0, 0.0, 1.0, 1e-5),
        lambda: epsilon_two_gaussians(1.0, 1.0, 0.0, -1.0, 1e-5),
        lambda: epsilon_two_gaussians(float("nan"), 1.0, 0.0, 1.0, 1e-5),
        lambda: epsilon_two_gaussians(1.0, float("inf"), 0.0, 1.0, 1e-5),
        lambda: epsilon_two_gaussians(1.0, 1.0, 0.0, 1.0, 0.0),
        lambda: epsilon_two_gaussians(1.0, 1.0, 0.0, 1.0, 1.5),
        lambda: two_gaussians_delta(-1.0, 1.0, 1.0, 0.0, 1.0),
        lambda: gaussian_delta(1.0, -2.0),
    ],
)
def test_bad_input_raises(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_gaussian_epsilon_array_matches_the_scalar_root():
    from audit_callbacks.estimators.gaussian import gaussian_epsilon_array

    mu = np.array([[0.0, 1e-4, 0.01, 0.3], [1.0, 2.5, 40.0, 400.0]])
    got = gaussian_epsilon_array(mu, 1e-5)
    want = np.array([[gaussian_epsilon(1.0, 1e-5, sensitivity=m) for m in row] for row in mu])
    assert got.shape == mu.shape
    assert np.allclose(got, want, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError):
        gaussian_epsilon_array([-1.0], 1e-5)


def test_scalar_log_ndtr_matches_scipy_on_every_branch():
    """The erfc fast path of the scalar root finder agrees with scipy's log_ndtr: upper tail
    (log1p branch, Phi ~ 1), centre, the switch at -5 and the lower tail (scipy)."""
    from audit_callbacks.estimators.gaussian import _log_ndtr_scalar

    xs = np.concatenate([np.linspace(-40.0, 30.0, 70001), [-5.0, -5.0 + 1e-12, -1e-300, 0.0, 1e-300, 8.3, 37.0]])
    got = np.array([_log_ndtr_scalar(float(x)) for x in xs])
    want = log_ndtr(xs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def _bits(x: float) -> bytes:
    return np.float64(x).tobytes()


def test_scalar_two_gaussian_delta_is_the_vectorised_one_bit_for_bit():
    rng = np.random.default_rng(0)
    cases = [(0.0, 0.0, 1.0), (1.0, 0.0, 1.0), (2.0, -4.0, 1.0), (0.5, 0.0, 2.0), (0.5, 0.0, 0.5),
             (1.0, 3.0, 1e170), (1.0, 1e-200, 1e-170), (1e3, 30.0, 0.01)]
    for _ in range(4000):
        scale_m, scale_r = rng.choice([0.1, 1.0, 5.0, 30.0]), rng.choice([0.0, 0.05, 0.3, 1.0, 3.0])
        eps = float(np.exp(rng.normal(0.0, 2.0)))
        cases.append((eps, float(rng.normal(0.0, scale_m)), float(np.exp(rng.normal(0.0, scale_r)))))
    for eps, m, r in cases:
        with np.errstate(all="ignore"):  # the extreme r overflow on purpose
            want = float(_log_delta_standardized(eps, m, r))
        got = _log_delta_standardized_scalar(eps, m, r)
        assert _bits(got) == _bits(want), (eps, m, r, got, want)


def _epsilon_vectorised(m: float, r: float, delta: float) -> float:
    """The root finding of _epsilon_standardized_scalar on the vectorised delta (the reference)."""
    log_target = math.log(delta)
    floor = log_target - 700.0

    def f(eps: float) -> float:
        return max(float(_log_delta_standardized(eps, m, r)), floor) - log_target

    if f(0.0) <= 0.0:
        return 0.0
    hi = float(_eps_upper_bracket(np.float64(m), np.float64(r), delta))
    while f(hi) > 0.0:
        hi *= 2.0
    return float(brentq(f, 0.0, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500))


def test_scalar_epsilon_root_is_unchanged():
    rng = np.random.default_rng(1)
    for i in range(60):
        m = float(rng.normal(0.0, [0.1, 1.0, 5.0][i % 3]))
        r = float(np.exp(rng.normal(0.0, [0.0, 0.1, 1.0][i % 3])))
        delta = float(10.0 ** -rng.uniform(1, 10))
        assert _epsilon_standardized_scalar(m, r, delta) == _epsilon_vectorised(m, r, delta), (m, r, delta)
