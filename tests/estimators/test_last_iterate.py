"""Last-iterate heuristic references (audit_callbacks.estimators.last_iterate; Steinke et al.,
"The Last Iterate Advantage", ICLR 2025): closed forms, quadrature, Monte Carlo, monotonicity,
the accountant as a ceiling, DP-FedAvg's momentum weights, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant
from scipy import integrate, stats
from scipy.special import logsumexp

from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.estimators.last_iterate import (
    _mixture,
    dpsgd_last_iterate_epsilon,
    fedavg_last_iterate_epsilon,
    fedavg_last_iterate_shifts,
    fedavg_momentum_weights,
    mixture_gaussian_delta,
    mixture_gaussian_epsilon,
)


def _log_ratio(x: np.ndarray, shifts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """L(x) = log p(x) / q(x), written independently of the module."""
    x = np.asarray(x, dtype=float)[..., None]
    return logsumexp(np.log(weights) + shifts * x - 0.5 * shifts**2, axis=-1)


def _quad_delta(shifts, weights, eps: float) -> tuple[float, float]:
    """(H_eps(P||Q), H_eps(Q||P)) by adaptive quadrature of (p - e^eps q)_+ and (q - e^eps p)_+."""
    shifts, weights = np.asarray(shifts, float), np.asarray(weights, float)

    def p(x):
        return float(np.dot(weights, stats.norm.pdf(x - shifts)))

    lim = 12 + np.abs(shifts).max()
    pts = np.linspace(-lim, lim, 41)
    h_pq = integrate.quad(lambda x: max(p(x) - math.exp(eps) * stats.norm.pdf(x), 0.0), -lim, lim,
                          points=pts, limit=400, epsabs=1e-13)[0]
    h_qp = integrate.quad(lambda x: max(stats.norm.pdf(x) - math.exp(eps) * p(x), 0.0), -lim, lim,
                          points=pts, limit=400, epsabs=1e-13)[0]
    return h_pq, h_qp


def _prv(q: float, sigma: float, steps: int, delta: float) -> float:
    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    return float(acc.get_epsilon(delta=delta))


# ------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("mu", [0.01, 0.3, 1.0, 2.5, 10.0, 40.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_one_component_is_the_analytic_gaussian_mechanism(mu, delta):
    ref = gaussian_epsilon(1.0, delta, sensitivity=mu)  # Balle & Wang (2018)
    assert mixture_gaussian_epsilon([mu], None, delta) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert mixture_gaussian_epsilon(np.array([-mu]), np.array([1.0]), delta) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert fedavg_last_iterate_epsilon([mu, mu, mu], delta) == pytest.approx(ref, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_one_step_at_rate_one_is_the_gaussian_mechanism(sigma):
    assert dpsgd_last_iterate_epsilon(1, 1.0, sigma, 1e-5) == pytest.approx(
        gaussian_epsilon(sigma, 1e-5), rel=1e-9)
    # T steps at q = 1: Bin(T, 1) = T, N(T / (sigma sqrt T), 1): mu = sqrt(T) / sigma
    assert dpsgd_last_iterate_epsilon(16, 1.0, sigma, 1e-5) == pytest.approx(
        gaussian_epsilon(sigma, 1e-5, compositions=16), rel=1e-9)


def test_identical_distributions_have_epsilon_zero():
    assert mixture_gaussian_epsilon([0.0, 0.0], [0.5, 0.5], 1e-5) == 0.0
    assert mixture_gaussian_delta([0.0], None, 0.0) == 0.0
    # a tiny component: delta(0) = total variation < delta
    assert mixture_gaussian_epsilon([100.0, 0.0], [1e-20, 1 - 1e-20], 1e-10) == 0.0


# ------------------------------------------------------------------ quadrature and Monte Carlo


@pytest.mark.parametrize("shifts,weights,eps,qp_positive", [
    ([0.0, 1.0, 2.0, 3.0], [0.4, 0.3, 0.2, 0.1], 1.0, False),
    ([-1.0, 2.0, 0.5], [0.2, 0.3, 0.5], 0.5, True),
    ([-3.0, 0.0, 3.0], [0.25, 0.5, 0.25], 2.0, False),
    ([0.0, 1.0], [0.5, 0.5], 0.1, True),
])
def test_delta_matches_quadrature(shifts, weights, eps, qp_positive):
    got = mixture_gaussian_delta(shifts, weights, eps)
    h_pq, h_qp = _quad_delta(shifts, weights, eps)
    assert got == pytest.approx(max(h_pq, h_qp), rel=1e-6, abs=1e-12)
    # each direction on its own (H(Q||P) is the smaller one for these mixtures: check it too)
    mix = _mixture(shifts, weights, 1e-300)
    assert math.exp(mix._log_h_pq(eps)) == pytest.approx(h_pq, rel=1e-6, abs=1e-12)
    assert math.exp(mix._log_h_qp(eps)) == pytest.approx(h_qp, rel=1e-6, abs=1e-12)
    assert (h_qp > 1e-4) == qp_positive
    # epsilon is the inverse of delta(eps)
    e = mixture_gaussian_epsilon(shifts, weights, got)
    assert e == pytest.approx(eps, rel=1e-7)


def test_delta_matches_monte_carlo():
    """H_eps(P||Q) = E_P[(1 - e^(eps - L))_+], H_eps(Q||P) = E_Q[(1 - e^(eps + L))_+]."""
    shifts = np.array([0.0, 0.7, 1.4, 2.1, 2.8])
    weights = stats.binom.pmf(np.arange(5), 4, 0.3)
    eps = 0.8
    rng = np.random.default_rng(0)
    n = 2_000_000
    xp = rng.standard_normal(n) + rng.choice(shifts, size=n, p=weights)
    xq = rng.standard_normal(n)
    a = np.clip(1 - np.exp(eps - _log_ratio(xp, shifts, weights)), 0, None)
    b = np.clip(1 - np.exp(eps + _log_ratio(xq, shifts, weights)), 0, None)
    mc = max(a.mean(), b.mean())
    se = max(a.std(), b.std()) / math.sqrt(n)
    got = mixture_gaussian_delta(shifts, weights, eps)
    assert got > 1e-3 and abs(got - mc) < 4 * se, (got, mc, se)


# ------------------------------------------------------------------ DP-SGD


def test_dpsgd_heuristic_is_monotone():
    by_sigma = [dpsgd_last_iterate_epsilon(200, 0.05, s, 1e-5) for s in (0.7, 1.0, 1.5, 2.0, 4.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:], strict=False)), by_sigma
    by_steps = [dpsgd_last_iterate_epsilon(t, 0.05, 1.0, 1e-5) for t in (10, 50, 200, 1000)]
    assert all(a < b for a, b in zip(by_steps, by_steps[1:], strict=False)), by_steps
    by_rate = [dpsgd_last_iterate_epsilon(200, q, 1.0, 1e-5) for q in (0.01, 0.05, 0.2, 1.0)]
    assert all(a < b for a, b in zip(by_rate, by_rate[1:], strict=False)), by_rate


@pytest.mark.parametrize("q,sigma,steps", [
    (0.05, 1.0, 200), (0.05, 2.0, 1000), (0.125, 1.0, 240), (0.125, 2.0, 240), (0.01, 0.8, 2000), (0.5, 1.0, 20),
])
def test_dpsgd_heuristic_is_at_most_the_accountant(q, sigma, steps):
    """The last iterate is a post-processing of the iterates: never above Opacus' PRV epsilon.
    Measured at q = 0.125, T = 240: 11.0 vs 14.1 (sigma = 1), 4.49 vs 4.78 (sigma = 2)."""
    heuristic = dpsgd_last_iterate_epsilon(steps, q, sigma, 1e-5)
    prv = _prv(q, sigma, steps, 1e-5)
    assert 0 < heuristic <= prv, (heuristic, prv)


def test_dpsgd_heuristic_matches_a_direct_mixture():
    t, q, sigma = 30, 0.2, 1.5
    m = np.arange(t + 1)
    direct = mixture_gaussian_epsilon(m / (sigma * math.sqrt(t)), stats.binom.pmf(m, t, q), 1e-6)
    assert dpsgd_last_iterate_epsilon(t, q, sigma, 1e-6) == pytest.approx(direct, rel=1e-9)


# ------------------------------------------------------------------ DP-FedAvg


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_momentum_weights_are_torch_sgd_momentum(beta):
    """theta_T - theta_0 = eta sum_t w_t avg_t for torch SGD driven by the negated averages."""
    rounds, eta = 12, 0.3
    gen = torch.Generator().manual_seed(0)
    avgs = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(rounds)]
    theta = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=eta, momentum=beta)
    for a in avgs:
        opt.zero_grad()
        theta.grad = -a
        opt.step()
    w = fedavg_momentum_weights(rounds, beta)
    expected = eta * sum(float(wt) * a for wt, a in zip(w, avgs, strict=True))
    assert torch.allclose(theta.detach(), expected, rtol=1e-12, atol=1e-12)
    assert w[-1] == pytest.approx(1.0)


def test_fedavg_shifts_and_epsilon():
    # no momentum: mu_j = r_j / (z sqrt(T)); a canary in every round is sqrt(T) / z-GDP
    rounds, z = 100, 2.0
    w = fedavg_momentum_weights(rounds)
    participation = [range(rounds), range(0, rounds, 4), range(0, rounds, 10)]
    sums = np.array([w[list(r)].sum() for r in participation])
    mu = fedavg_last_iterate_shifts(sums, float(np.sum(w**2)), z)
    assert mu == pytest.approx([math.sqrt(rounds) / z, 25 / (z * 10), 10 / (z * 10)])
    assert fedavg_last_iterate_epsilon(mu[:1], 1e-5) == pytest.approx(
        gaussian_epsilon(z, 1e-5, compositions=rounds), rel=1e-9)
    mixed = fedavg_last_iterate_epsilon(mu, 1e-5)
    assert gaussian_epsilon(1.0, 1e-5, sensitivity=float(mu[-1])) < mixed < gaussian_epsilon(
        1.0, 1e-5, sensitivity=float(mu[0]))
    # momentum: late rounds weigh less than early ones (w_t grows towards 1 / (1 - beta))
    wm = fedavg_momentum_weights(rounds, 0.9)
    early, late = wm[:10].sum(), wm[-10:].sum()
    assert early > late
    mu_m = fedavg_last_iterate_shifts([early, late], float(np.sum(wm**2)), z)
    assert mu_m[0] > mu_m[1] > 0


# ------------------------------------------------------------------ bad input, never NaN


@pytest.mark.parametrize("call,name", [
    (lambda: mixture_gaussian_epsilon([], None, 1e-5), "shifts"),
    (lambda: mixture_gaussian_epsilon([float("nan")], None, 1e-5), "shifts"),
    (lambda: mixture_gaussian_epsilon([[1.0, 2.0]], None, 1e-5), "shifts"),
    (lambda: mixture_gaussian_epsilon([True], None, 1e-5), "shifts"),
    (lambda: mixture_gaussian_epsilon([1e7], None, 1e-5), "shifts"),
    (lambda: mixture_gaussian_epsilon([1.0, 2.0], [0.5], 1e-5), "weights"),
    (lambda: mixture_gaussian_epsilon([1.0, 2.0], [1.5, -0.5], 1e-5), "weights"),
    (lambda: mixture_gaussian_epsilon([1.0, 2.0], [0.5, 0.6], 1e-5), "weights"),
    (lambda: mixture_gaussian_epsilon([1.0], None, 0.0), "delta"),
    (lambda: mixture_gaussian_epsilon([1.0], None, 1.0), "delta"),
    (lambda: mixture_gaussian_delta([1.0], None, -1.0), "epsilon"),
    (lambda: dpsgd_last_iterate_epsilon(0, 0.1, 1.0, 1e-5), "steps"),
    (lambda: dpsgd_last_iterate_epsilon(10.0, 0.1, 1.0, 1e-5), "steps"),
    (lambda: dpsgd_last_iterate_epsilon(10, 0.0, 1.0, 1e-5), "sample_rate"),
    (lambda: dpsgd_last_iterate_epsilon(10, 1.5, 1.0, 1e-5), "sample_rate"),
    (lambda: dpsgd_last_iterate_epsilon(10, 0.1, 0.0, 1e-5), "noise_multiplier"),
    (lambda: dpsgd_last_iterate_epsilon(10, 0.1, 1.0, 2.0), "delta"),
    (lambda: fedavg_last_iterate_shifts([1.0, -1.0], 2.0, 1.0), "weight_sums"),
    (lambda: fedavg_last_iterate_shifts([1.0], 0.0, 1.0), "weight_square_sum"),
    (lambda: fedavg_last_iterate_shifts([1.0], 1.0, -2.0), "noise_multiplier"),
    (lambda: fedavg_last_iterate_epsilon([-0.5, 1.0], 1e-5), "shifts"),
    (lambda: fedavg_momentum_weights(0), "rounds"),
    (lambda: fedavg_momentum_weights(5, 1.0), "server_momentum"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("shifts,weights,delta", [
    ([1e-300], None, 1e-5), ([1e6], None, 1e-5), ([1e3], None, 1e-300), ([5.0], None, 0.999),
    (np.linspace(0, 5, 10000), None, 1e-6), ([2, 2, 2], [0.5, 0.5, 0.0], 1e-5), (np.array([1, 3]), None, 1e-5),
])
def test_extreme_inputs_give_finite_epsilons(shifts, weights, delta):
    eps = mixture_gaussian_epsilon(shifts, weights, delta)
    assert math.isfinite(eps) and eps >= 0.0
    for t, q, sigma in ((1, 1.0, 1e-3), (100_000, 0.001, 1.0), (10, 1e-9, 1.0), (50, 0.5, 100.0)):
        e = dpsgd_last_iterate_epsilon(t, q, sigma, 1e-5)
        assert math.isfinite(e) and e >= 0.0


def test_history_of_rates_is_the_sum_of_binomials():
    """A run whose steps differ in rate (gradient accumulation's short last step of an epoch):
    one entry is dpsgd_last_iterate_epsilon; an entry split in two gives the same epsilon; mixed
    rates lie between the all-low and all-high runs and match a direct mixture."""
    from audit_callbacks.estimators.last_iterate import dpsgd_last_iterate_epsilon_history

    one = dpsgd_last_iterate_epsilon(40, 0.1, 1.0, 1e-5)
    assert dpsgd_last_iterate_epsilon_history([(1.0, 0.1, 40)], 1e-5) == one
    assert dpsgd_last_iterate_epsilon_history([(1.0, 0.1, 15), (1.0, 0.1, 25)], 1e-5) == pytest.approx(one, rel=1e-6)
    history = [(1.0, 0.2, 14), (1.0, 0.1, 2)]
    mixed = dpsgd_last_iterate_epsilon_history(history, 1e-5)
    assert dpsgd_last_iterate_epsilon(16, 0.1, 1.0, 1e-5) < mixed < dpsgd_last_iterate_epsilon(16, 0.2, 1.0, 1e-5)
    pmf = np.convolve(stats.binom.pmf(np.arange(15), 14, 0.2), stats.binom.pmf(np.arange(3), 2, 0.1))
    direct = mixture_gaussian_epsilon(np.arange(17) / 4.0, pmf / pmf.sum(), 1e-5)
    assert mixed == pytest.approx(direct, rel=1e-6)
    with pytest.raises(ValueError):
        dpsgd_last_iterate_epsilon_history([], 1e-5)
    with pytest.raises(ValueError):
        dpsgd_last_iterate_epsilon_history([(1.0, 0.0, 3)], 1e-5)
