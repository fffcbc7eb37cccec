"""eps_lo (Andrew et al. 2024 §5.1, METHODS A6): exactness, coverage by repetition, non-vacuity.

The mechanism is simulated exactly (see test_estimators_canary_epsilon.py): one canary per
release of the Gaussian mechanism with noise multiplier sigma, whose true epsilon at delta is
gaussian_epsilon(sigma, delta). A 95% lower bound must exceed it in at most ~5% of runs.

Measured with 1000 seeded runs each (dim = 1e4, delta = 1e-5, alpha = 0.05; rate of
bound > true eps), "max" = the paper's max over thresholds, "heldout" = tau on one half:

    true eps  k     max/final  heldout/final  max/all-iterates  heldout/all-iterates
    0.1       500   0.330      0.022          0.193             0.004
    0.25      500   0.222      0.013          0.131             0.003
    0.5       500   0.133      0.010          0.075             0.001
    0.5       2000  0.196      0.012          0.142             0.000
    1         500   0.072      0.011          0.031             0.002
    1         2000  0.102      0.004          0.080             0.002
    2         500   0.032      0.007          0.007             0.000
    4         1000  0.023      0.002          0.000             0.000
    8         500   0.007      0.000          0.000             0.000

So the max-over-thresholds bound is NOT a 95% bound when the true epsilon is small (choosing
the best of ~k thresholds on the same data); the held-out variant keeps its level everywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from audit_callbacks.estimators import (
    cosine_null_sample,
    cosine_null_sf,
    epsilon_from_error_rates,
    estimate_epsilon_lower_bound_from_cosines,
    gaussian_epsilon,
    jeffreys_upper,
)

DIM = 10**4
DELTA = 1e-5


def simulate_canary_cosines(rng: np.random.Generator, sigma: float, dim: int, k: int) -> np.ndarray:
    z1 = rng.standard_normal(k)
    s = rng.chisquare(dim - 1, k)
    num = 1.0 + sigma * z1
    return num / np.sqrt(num * num + sigma * sigma * s)


def sigma_for(eps: float, delta: float = DELTA) -> float:
    return brentq(lambda z: gaussian_epsilon(z, delta) - eps, 0.01, 100.0, xtol=1e-12)


def _violation_rates(eps_true: float, k: int, runs: int, seed: int) -> dict[str, float]:
    sigma = sigma_for(eps_true)
    assert gaussian_epsilon(sigma, DELTA) == pytest.approx(eps_true, rel=1e-9)
    rng = np.random.default_rng(seed)
    bounds: dict[str, list[float]] = {
        "max_final": [],
        "held_final": [],
        "max_all": [],
        "held_all": [],
    }
    for i in range(runs):
        x = simulate_canary_cosines(rng, sigma, DIM, k)
        u = cosine_null_sample(rng, DIM, k)
        bounds["max_final"].append(estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM).value)
        bounds["held_final"].append(
            estimate_epsilon_lower_bound_from_cosines(
                x, DELTA, dim=DIM, threshold="heldout", seed=i
            ).value
        )
        bounds["max_all"].append(estimate_epsilon_lower_bound_from_cosines(x, DELTA, unobserved=u).value)
        bounds["held_all"].append(
            estimate_epsilon_lower_bound_from_cosines(
                x, DELTA, unobserved=u, threshold="heldout", seed=i
            ).value
        )
    return {key: float(np.mean(np.array(v) > eps_true)) for key, v in bounds.items()}


RUNS = 300
SLACK = 3 * math.sqrt(0.05 * 0.95 / RUNS)  # 3 binomial sds at the nominal 5%


def test_coverage_at_eps_2() -> None:
    """True eps = 2, k = 500: all four variants keep 95% (measured 3.2%, 0.7%, 0.7%, 0%)."""
    rates = _violation_rates(2.0, 500, RUNS, seed=1)
    for key, rate in rates.items():
        assert rate <= 0.05 + SLACK, (key, rate)


def test_max_over_thresholds_undercovers_at_small_eps_heldout_does_not() -> None:
    """True eps = 0.25, k = 500: measured 22.2% (final) and 13.1% (all iterates) violations
    for the paper's max-over-thresholds bound; held-out 1.3% and 0.3%."""
    rates = _violation_rates(0.25, 500, RUNS, seed=2)
    assert 0.12 <= rates["max_final"] <= 0.35, rates
    assert 0.05 <= rates["max_all"] <= 0.25, rates
    assert rates["held_final"] <= 0.05 + SLACK, rates
    assert rates["held_all"] <= 0.05 + SLACK, rates


def test_not_vacuous_at_eps_4() -> None:
    """True eps = 4, k = 1000: measured means 2.66 (max) and 1.75 (heldout), final model."""
    sigma = sigma_for(4.0)
    rng = np.random.default_rng(3)
    mx, held, mx_all = [], [], []
    for i in range(40):
        x = simulate_canary_cosines(rng, sigma, DIM, 1000)
        u = cosine_null_sample(rng, DIM, 1000)
        mx.append(estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM).value)
        held.append(
            estimate_epsilon_lower_bound_from_cosines(
                x, DELTA, dim=DIM, threshold="heldout", seed=i
            ).value
        )
        mx_all.append(estimate_epsilon_lower_bound_from_cosines(x, DELTA, unobserved=u).value)
    assert np.mean(mx) > 1.5
    assert np.mean(held) > 0.8
    assert np.mean(mx_all) > 1.0
    assert min(mx) > 0.0


def _brute_force(obs, delta, alpha, dim=None, unobs=None) -> float:
    """Loop over thresholds with the public scalar building blocks (METHODS A6 verbatim)."""
    taus = sorted(set(obs) | (set(unobs) if unobs is not None else set()))
    k = len(obs)
    best = 0.0
    for tau in taus:
        fn = sum(1 for v in obs if v <= tau)
        fnr_hi = float(jeffreys_upper(fn, k, alpha))
        if unobs is None:
            fpr_hi = float(cosine_null_sf(tau, dim))
        else:
            fp = sum(1 for v in unobs if v > tau)
            fpr_hi = float(jeffreys_upper(fp, len(unobs), alpha))
        best = max(best, epsilon_from_error_rates(fpr_hi, fnr_hi, delta))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_bound_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = simulate_canary_cosines(rng, 1.0, 1000, 40)
    u = cosine_null_sample(rng, 1000, 30)
    got = estimate_epsilon_lower_bound_from_cosines(x, 1e-4, dim=1000, alpha=0.1).value
    assert got == pytest.approx(_brute_force(list(x), 1e-4, 0.1, dim=1000), rel=1e-10)
    got = estimate_epsilon_lower_bound_from_cosines(x, 1e-4, unobserved=u, alpha=0.1).value
    assert got == pytest.approx(_brute_force(list(x), 1e-4, 0.1, unobs=list(u)), rel=1e-10)


def test_estimate_fields() -> None:
    rng = np.random.default_rng(4)
    x = simulate_canary_cosines(rng, sigma_for(3.0), DIM, 400)
    e = estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM)
    assert e.method == "eps_lo_max" and e.details["threat_model"] == "final_model"
    assert e.lower == e.value and e.upper is None and e.confidence == pytest.approx(0.95)
    assert e.counts["n"] == 400 and e.details["n_thresholds"] == 400
    assert {"tau", "fpr_hi", "fnr_hi", "fn", "direction"} <= set(e.details)
    assert e.details["fpr_hi"] == pytest.approx(float(cosine_null_sf(e.details["tau"], DIM)))
    h = estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM, threshold="heldout", seed=5)
    assert h.method == "eps_lo_heldout"
    assert h.details["k_select"] + h.details["k_evaluate"] == 400
    h2 = estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM, threshold="heldout", seed=5)
    assert h2 == h
    u = cosine_null_sample(rng, DIM, 300)
    a = estimate_epsilon_lower_bound_from_cosines(x, DELTA, unobserved=u, threshold="heldout")
    assert a.details["threat_model"] == "all_iterates" and a.details["fp"] is not None
    assert a.details["k_unobserved_select"] + a.details["k_unobserved_evaluate"] == 300
    e.to_dict()


def test_finite_for_perfect_separation() -> None:
    rng = np.random.default_rng(6)
    x = 0.5 + 0.01 * rng.random(200)  # 50 null sds out at d = 1e4: sf underflows
    v = estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM).value
    assert math.isfinite(v) and v > 1000  # exact null: no log(k) cap on this side
    assert math.isfinite(estimate_epsilon_lower_bound_from_cosines(np.ones(10), DELTA, dim=DIM).value)
    u = cosine_null_sample(rng, DIM, 200)
    v_all = estimate_epsilon_lower_bound_from_cosines(x, DELTA, unobserved=u).value
    # empirical null: capped by about log k
    assert 0 < v_all < math.log(200) + 1


def test_no_signal_gives_small_bounds() -> None:
    rng = np.random.default_rng(7)
    x = cosine_null_sample(rng, DIM, 500)
    assert estimate_epsilon_lower_bound_from_cosines(x, DELTA, dim=DIM).value < 1.0
    below = -np.abs(x)  # observed below the null: a "t > tau" test finds nothing
    assert estimate_epsilon_lower_bound_from_cosines(below, DELTA, dim=DIM).value == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"observed": [0.1, 0.2], "delta": 1e-5},
        {"observed": [0.1, 0.2], "delta": 1e-5, "dim": 10, "unobserved": [0.1]},
        {"observed": [], "delta": 1e-5, "dim": 10},
        {"observed": [0.1, np.nan], "delta": 1e-5, "dim": 10},
        {"observed": [0.1, -2.0], "delta": 1e-5, "dim": 10},
        {"observed": [0.1, 0.2], "delta": 0.0, "dim": 10},
        {"observed": [0.1, 0.2], "delta": 1e-5, "dim": 1},
        {"observed": [0.1, 0.2], "delta": 1e-5, "dim": 10, "alpha": 0.0},
        {"observed": [0.1, 0.2], "delta": 1e-5, "dim": 10, "alpha": 1.0},
        {"observed": [0.1, 0.2], "delta": 1e-5, "unobserved": []},
        {"observed": [0.1, 0.2], "delta": 1e-5, "unobserved": [np.inf]},
    ],
)
def test_bad_input_raises(kwargs) -> None:
    with pytest.raises(ValueError):
        estimate_epsilon_lower_bound_from_cosines(**kwargs)


def test_bad_threshold_and_too_few_to_split() -> None:
    with pytest.raises(ValueError):
        estimate_epsilon_lower_bound_from_cosines([0.1, 0.2], 1e-5, dim=10, threshold="best")
    with pytest.raises(ValueError):
        estimate_epsilon_lower_bound_from_cosines([0.1], 1e-5, dim=10, threshold="heldout")
    with pytest.raises(ValueError):
        estimate_epsilon_lower_bound_from_cosines(
            [0.1, 0.2], 1e-5, unobserved=[0.0], threshold="heldout"
        )


@pytest.mark.parametrize("threat", ["final_model", "all_iterates"])
def test_pruned_maximum_is_the_full_evaluation(threat: str) -> None:
    # the Jeffreys quantiles (and the null's tail) are evaluated only at a grid of
    # thresholds and where their bound can reach the grid's best; same index and value as the
    # evaluation over every threshold
    from audit_callbacks.estimators.lower_bound import _Side

    rng = np.random.default_rng(11)
    for shift in (0.0, 1.0, 4.0):
        x = (shift + rng.standard_normal(30_000)) / 100.0
        u = rng.standard_normal(25_000) / 100.0 if threat == "all_iterates" else None
        side = _Side(x, 10**4 if u is None else None, u, 0.05)
        taus = side.candidates()
        full = side.bound(taus, 1e-5)
        i, res = side.best(taus, 1e-5)
        assert i == int(np.argmax(full["eps"]))
        assert res["eps"][0] == full["eps"][i] and res["fn"][0] == full["fn"][i]
