"""Tests of the exact cosine null (Andrew et al. 2024 Thm 3.1; METHODS A1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import betaln, log_ndtr
from scipy.stats import kstest, norm

from audit_callbacks.estimators import (
    cosine_null_cdf,
    cosine_null_logcdf,
    cosine_null_logsf,
    cosine_null_sample,
    cosine_null_sf,
)


@pytest.mark.parametrize("dim", [2, 3, 5, 20])
def test_cdf_matches_monte_carlo_of_normalised_gaussians(dim: int) -> None:
    rng = np.random.default_rng(dim)
    g = rng.standard_normal((200_000, dim))
    cos = g[:, 0] / np.linalg.norm(g, axis=1)  # cos(uniform direction, e_1)
    res = kstest(cos, lambda t: cosine_null_cdf(t, dim))
    assert res.pvalue > 1e-3
    # binned comparison as well
    edges = np.linspace(-1, 1, 21)
    counts, _ = np.histogram(cos, edges)
    expected = np.diff(cosine_null_cdf(edges, dim)) * cos.size
    z = (counts - expected) / np.sqrt(expected + 1e-12)
    assert np.max(np.abs(z)) < 5


def test_sampler_matches_cdf() -> None:
    rng = np.random.default_rng(7)
    x = cosine_null_sample(rng, 1000, 100_000)
    assert kstest(x, lambda t: cosine_null_cdf(t, 1000)).pvalue > 1e-3
    assert np.var(x) == pytest.approx(1 / 1000, rel=0.02)


@pytest.mark.parametrize("dim", [2, 3, 10, 1000, 10**6])
def test_sf_plus_cdf_and_symmetry(dim: int) -> None:
    t = np.linspace(-1, 1, 401)
    sf = cosine_null_sf(t, dim)
    cdf = cosine_null_cdf(t, dim)
    np.testing.assert_allclose(sf + cdf, 1.0, atol=1e-14)
    np.testing.assert_allclose(cosine_null_sf(-t, dim), cdf, rtol=1e-12, atol=1e-300)
    assert cosine_null_cdf(0.0, dim) == pytest.approx(0.5, abs=1e-14)
    assert cosine_null_sf(1.0, dim) == 0.0 and cosine_null_cdf(-1.0, dim) == 0.0
    assert cosine_null_cdf(1.5, dim) == 1.0 and cosine_null_sf(-2.0, dim) == 1.0
    assert np.all(np.diff(cdf) >= 0)


def test_closed_forms_in_small_dimension() -> None:
    t = np.linspace(-0.99, 0.99, 23)
    # d = 3: uniform on [-1, 1]; d = 2: arcsine law
    np.testing.assert_allclose(cosine_null_cdf(t, 3), (1 + t) / 2, rtol=1e-12)
    np.testing.assert_allclose(cosine_null_cdf(t, 2), 0.5 + np.arcsin(t) / math.pi, rtol=1e-12)


@pytest.mark.parametrize("dim", [10**4, 10**6])
def test_close_to_normal_approximation_for_large_dim(dim: int) -> None:
    z = np.array([0.5, 1.0, 2.0, 3.0, 4.0, 5.0])
    sf = cosine_null_sf(z / math.sqrt(dim), dim)
    # relative discrepancy of N(0, 1/d) is O(z^4 / d)
    np.testing.assert_allclose(sf, norm.sf(z), rtol=200 * z.max() ** 4 / dim + 1e-12)


def _log_sf_by_quadrature(t: float, dim: int) -> float:
    """Independent log sf: integrate the density scaled by its value at t."""
    m = (dim - 3) / 2

    def log_f(s: float) -> float:
        return m * math.log1p(-s * s)

    rate = 2 * m * t / (1 - t * t)  # -d/ds log f at t: the integrand decays like e^(-rate u)
    upper = min(1.0, t + 400.0 / rate)
    val = quad(
        lambda s: math.exp(log_f(s) - log_f(t)), t, upper, epsabs=0, epsrel=1e-12, limit=200
    )[0]
    log_c = -(dim - 2) * math.log(2.0) - betaln((dim - 1) / 2, (dim - 1) / 2)
    return log_c + log_f(t) + math.log(val)


@pytest.mark.parametrize(
    "t, dim",
    [
        (0.005, 10**6),  # 5 sds
        (0.02, 10**6),  # 20 sds, ~1e-89
        (0.05, 10**6),  # 50 sds, below the underflow switch
        (0.2, 10**6),  # 200 sds, log sf ~ -2e4
        (0.5, 10**4),
        (0.9, 1000),  # near t = 1, underflow side
        (0.6, 50),
    ],
)
def test_log_tail_far_out(t: float, dim: int) -> None:
    expected = _log_sf_by_quadrature(t, dim)
    got = cosine_null_logsf(t, dim)
    assert math.isfinite(got)
    assert got == pytest.approx(expected, rel=1e-8)
    assert cosine_null_logcdf(-t, dim) == pytest.approx(got, rel=1e-12)
    sf = cosine_null_sf(t, dim)
    if sf > 1e-280:
        assert math.log(sf) == pytest.approx(expected, rel=1e-9)


def test_logsf_continuous_across_switch_and_beyond_normal() -> None:
    dim = 10**6
    t = np.linspace(0.001, 0.3, 3000)
    ls = cosine_null_logsf(t, dim)
    assert np.all(np.isfinite(ls))
    assert np.all(np.diff(ls) < 0)
    # the exact tail is lighter than the normal approximation far out
    assert np.all(ls[t > 0.02] < log_ndtr(-t[t > 0.02] * math.sqrt(dim)))
    assert cosine_null_logsf(1.0, dim) == -math.inf


def test_vectorised_shapes() -> None:
    t = np.zeros((3, 4))
    assert cosine_null_sf(t, 10).shape == (3, 4)
    assert isinstance(cosine_null_cdf(0.1, 10), float)


@pytest.mark.parametrize(
    "call",
    [
        lambda: cosine_null_sf(0.1, 1),
        lambda: cosine_null_sf(0.1, 0),
        lambda: cosine_null_sf(0.1, 2.5),
        lambda: cosine_null_cdf(0.1, True),
        lambda: cosine_null_cdf(np.array([0.1, np.nan]), 10),
        lambda: cosine_null_logsf(np.inf, 10),
        lambda: cosine_null_sample(np.random.default_rng(0), 1, 3),
    ],
)
def test_bad_input_raises(call) -> None:
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("dim", [10**12, 10**15, 10**18, 2**62])
def test_sf_at_huge_dim_is_the_normal_limit(dim: int) -> None:
    """Far beyond any model (betainc is off by 1e-4 at d = 1e12 and by order 1 at 1e16), the
    null is N(0, 1/d) to O(1/d): sf(z / sqrt(d)) = Phi(-z)."""
    z = np.array([0.5, 1.0, 3.0, 5.0])
    got = cosine_null_sf(z / np.sqrt(dim), dim)
    assert np.allclose(got, norm.sf(z), rtol=1e-8, atol=0)
    assert np.allclose(cosine_null_logsf(z / np.sqrt(dim), dim), norm.logsf(z), rtol=1e-8, atol=0)
    assert cosine_null_sf(1.0, dim) == 0.0 and cosine_null_sf(-1.0, dim) == 1.0


def test_sf_continuous_where_the_student_t_identity_takes_over() -> None:
    from audit_callbacks.estimators.cosine_null import T_IDENTITY_DIM

    d = T_IDENTITY_DIM
    z = np.array([0.5, 1.0, 3.0, 6.0])
    below, above = cosine_null_sf(z / np.sqrt(d), d), cosine_null_sf(z / np.sqrt(d + 1), d + 1)
    assert np.allclose(below, above, rtol=1e-7, atol=0)
