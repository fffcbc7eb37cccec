"""The per-report estimates outside ``canary_estimates`` made cheap with
the same values.

* ``fedavg_last_iterate_epsilon`` (and every mixture with shifts >= 0): one root finding per
  direction instead of the nested one; compared with the nested version, kept verbatim below
  (``_old_epsilon``), within 1e-9 relative (measured: 3e-13).
* ``KnownRoundScores.estimate``: the point estimate and, up to ``exact_bootstrap_draws``, the
  bootstrap interval bit for bit against the loop of before (kept verbatim below:
  ``_old_per_round_shift``, ``_old_estimate``); above it the unobserved canaries' resampled mean
  comes from its normal limit: its interval is compared with the index-by-index bootstrap's
  (endpoints, width, coverage by Monte Carlo), and a planted fault (that term dropped) fails.
* ``StepsUnknownScores.estimate``: the device counts read once; the same result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from audit_callbacks.canary.known_rounds import KnownRoundScores
from audit_callbacks.canary.steps_unknown import StepsUnknownScores
from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.estimators import gaussian_epsilon_array
from audit_callbacks.estimators import last_iterate as li

# ---------------------------------------------------------------------------------------------
# the code before round 2, verbatim (audit_callbacks/estimators/last_iterate.py, _epsilon)


def _old_epsilon(mix, delta: float) -> float:
    log_target = math.log(delta)
    floor = log_target - 700.0

    def f(eps: float) -> float:
        return max(mix.log_hockey(eps), floor) - log_target

    if f(0.0) <= 0.0:
        return 0.0
    hi = max(1.0, 0.5 * max(mix.s_max, -mix.s_min) ** 2 + 2.0 * max(mix.s_max, -mix.s_min) * math.sqrt(-2.0 * log_target))
    for _ in range(200):
        if f(hi) <= 0.0:
            break
        hi = 2.0 * hi + 1.0
    else:  # pragma: no cover - H_eps decreases to 0 as eps grows
        raise ValueError("mixture epsilon could not be bracketed: the inputs are out of range")
    try:
        eps = float(brentq(f, 0.0, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500))
    except RuntimeError as exc:  # pragma: no cover - f is monotone and the bracket valid
        raise ValueError(f"mixture epsilon did not converge ({exc}); out of range") from None
    return eps


# (audit_callbacks/canary/known_rounds.py, KnownRoundScores.per_round_shift and .estimate's bootstrap)


def _old_per_round_shift(self, obs_idx=None, un_idx=None) -> float:
    k = self.k
    o = np.arange(k) if obs_idx is None else obs_idx
    u = np.arange(len(self.sums) - k) if un_idx is None else un_idx
    r_in = self.counts[o].sum()
    r_out = self.counts[k + u].sum()
    if r_in < 1 or r_out < 2:
        raise ValueError("too few participations for the known-rounds estimate")
    mean_in = self.sums[o].sum() / r_in
    mean_out = self.sums[k + u].sum() / r_out
    if un_idx is None:
        var_out = self.un_squares / r_out - mean_out ** 2
    else:  # a resample: the pooled variance of the unobserved rounds is kept
        var_out = self.un_squares / self.counts[k:].sum() - (self.sums[k:].sum() / self.counts[k:].sum()) ** 2
    sd = math.sqrt(max(var_out, 1e-300))
    return (mean_in - mean_out) / sd


def _old_estimate(self, delta, *, alpha=0.05, bootstrap=0, seed=0):
    """(value, lower, upper) of the estimate before round 2."""
    k = self.k
    r_max = int(self.counts[:k].max(initial=0))
    mu1 = _old_per_round_shift(self)
    root = math.sqrt(r_max)
    value = float(gaussian_epsilon_array(np.array([max(root * mu1, 0.0)]), delta)[0])
    lower = upper = None
    if bootstrap > 0:
        rng = np.random.default_rng([int(seed), 0xB007])
        took = np.flatnonzero(self.counts[:k] > 0)
        n_un = len(self.sums) - k
        mus = np.array([_old_per_round_shift(self, rng.choice(took, size=took.size),
                                             rng.integers(0, n_un, size=n_un))
                        for _ in range(int(bootstrap))])
        eps = gaussian_epsilon_array(np.maximum(root * mus, 0.0), delta)
        lower, upper = (float(v) for v in np.quantile(eps, [alpha / 2, 1 - alpha / 2]))
    return value, lower, upper


# ---------------------------------------------------------------------------------------------
# last iterate


def _random_shifts(rng: np.random.Generator, trial: int) -> np.ndarray:
    k = int(rng.integers(1, 300))
    kind = trial % 4
    if kind == 0:  # DP-FedAvg without momentum: few distinct participation counts
        return rng.integers(0, 11, size=k) / (rng.uniform(0.05, 3) * math.sqrt(rng.integers(1, 300)))
    if kind == 1:
        return rng.exponential(rng.uniform(0.01, 20), size=k)
    if kind == 2:  # with a zero shift of large weight
        s = np.abs(rng.normal(rng.uniform(0, 5), rng.uniform(0, 3), size=k))
        s[rng.random(k) < 0.3] = 0.0
        return s
    return rng.uniform(0, 10 ** rng.uniform(-3, 3), size=k)


def test_nonnegative_mixture_epsilon_matches_the_nested_root_finding():
    rng = np.random.default_rng(20261126)
    worst = 0.0
    for trial in range(120):
        s = _random_shifts(rng, trial)
        d = float(10 ** rng.uniform(-12, -1))
        mix = li._mixture(s, None, d)
        old, new = _old_epsilon(mix, d), li._epsilon(mix, d)
        assert math.isfinite(new) and new >= 0.0
        worst = max(worst, abs(new - old) / max(1.0, old))
        assert li.fedavg_last_iterate_epsilon(s, d) == new
    assert worst <= 1e-9


@pytest.mark.parametrize("shifts, weights", [
    ([0.0], None), ([0.0, 0.0], None), ([1e6], None), ([1e-9], None), ([1e-300], None), ([3.0, 1e5], None),
    (list(np.linspace(0, 5, 10000)), None),
    ([0.0, 5.0], [0.999, 0.001]), ([0.0, 50.0], [1 - 1e-9, 1e-9]),
])
@pytest.mark.parametrize("delta", [1e-300, 1e-12, 1e-6, 0.3, 0.999])
def test_nonnegative_mixture_extremes_match(shifts, weights, delta):
    mix = li._mixture(shifts, weights, delta)
    old = _old_epsilon(mix, delta)
    new = li.mixture_gaussian_epsilon(shifts, weights, delta)
    assert math.isfinite(new)
    assert new == pytest.approx(old, rel=1e-9, abs=1e-10)


def test_dpsgd_heuristic_matches_the_nested_root_finding():
    for steps, q, sigma in [(200, 0.05, 1.0), (1000, 0.01, 0.8), (50, 1.0, 2.0), (10, 0.5, 0.3)]:
        m = np.arange(steps + 1, dtype=float)
        from scipy.stats import binom
        log_w = binom.logpmf(m, steps, q)
        keep = np.isfinite(log_w)
        mix = li._trimmed(m[keep] / (sigma * math.sqrt(steps)), log_w[keep], 1e-5)
        assert li.dpsgd_last_iterate_epsilon(steps, q, sigma, 1e-5) == pytest.approx(
            _old_epsilon(mix, 1e-5), rel=1e-9)


def test_negative_shifts_keep_the_nested_root_finding():
    shifts, weights = [-2.0, 0.5, 3.0], [0.2, 0.5, 0.3]
    mix = li._mixture(shifts, weights, 1e-6)
    assert li.mixture_gaussian_epsilon(shifts, weights, 1e-6) == _old_epsilon(mix, 1e-6)


def test_last_iterate_bad_input_still_raises():
    with pytest.raises(ValueError, match="shifts"):
        li.fedavg_last_iterate_epsilon([1.0, -0.5], 1e-6)
    with pytest.raises(ValueError, match="shifts"):
        li.fedavg_last_iterate_epsilon([1.0, float("nan")], 1e-6)
    with pytest.raises(ValueError, match="delta"):
        li.fedavg_last_iterate_epsilon([1.0], 0.0)


# ---------------------------------------------------------------------------------------------
# known rounds


def _state(k, k_un, rounds, q=0.2, z=1.0, seed=0, unequal=False):
    """A known-rounds state drawn from its model (y per participation 1 + N(0, z^2), per
    unobserved round N(0, z^2)), without a training run."""
    rng = np.random.default_rng(seed)
    counts_in = rng.binomial(rounds, q, size=k)
    sums_in = counts_in + z * np.sqrt(counts_in) * rng.standard_normal(k)
    counts_un = np.full(k_un, rounds, dtype=np.int64)
    if unequal:
        counts_un -= rng.integers(0, 3, size=k_un)
    sums_un = z * np.sqrt(counts_un) * rng.standard_normal(k_un)
    return {"sums": torch.from_numpy(np.concatenate([sums_in, sums_un])),
            "counts": torch.from_numpy(np.concatenate([counts_in, counts_un]).astype(np.int64)),
            "un_squares": float(z * z * rng.chisquare(int(counts_un.sum()))),
            "momentum_sums": torch.zeros(k, dtype=torch.float64), "decay": 0.0, "decay_squares": 0.0,
            "rounds": int(rounds), "skipped": 0, "previous": None}


def _scores(k, k_un, rounds, z=1.0, **kw) -> KnownRoundScores:
    n = k + k_un
    dim = 1 << max(6, (n - 1).bit_length())
    cs = CanarySet(0, dim, n, kind="hadamard")
    stats = KnownRoundScores(cs, k, clip_norm=1.0, divisor=10, noise_multiplier=z)
    stats.load_state_dict(_state(k, k_un, rounds, z=z, **kw))
    return stats


@pytest.mark.parametrize("unequal", [False, True])
def test_known_rounds_estimate_is_bit_identical_up_to_the_exact_draws(unequal):
    stats = _scores(150, 900, 40, unequal=unequal, seed=3)
    assert stats.exact_bootstrap_draws >= 200 * 900
    for bootstrap, seed, alpha in [(0, 0, 0.05), (200, 0, 0.05), (57, 11, 0.1)]:
        res = stats.estimate(1e-6, alpha=alpha, bootstrap=bootstrap, seed=seed)
        assert (res.value, res.lower, res.upper) == _old_estimate(
            stats, 1e-6, alpha=alpha, bootstrap=bootstrap, seed=seed)
    assert stats.per_round_shift() == _old_per_round_shift(stats)
    rng = np.random.default_rng(1)
    o, u = rng.integers(0, 150, size=150), rng.integers(0, 900, size=900)
    assert stats.per_round_shift(o, u) == _old_per_round_shift(stats, o, u)


def _interval(stats: KnownRoundScores, exact: bool, bootstrap: int, seed: int) -> tuple[float, float]:
    stats.exact_bootstrap_draws = 1 << 40 if exact else 0  # an instance attribute
    res = stats.estimate(1e-5, bootstrap=bootstrap, seed=seed)
    assert res.lower is not None and res.upper is not None
    return res.lower, res.upper


def test_normal_limit_interval_matches_the_exact_bootstrap():
    """Where the unobserved canaries carry half the bootstrap variance (k' T = P_in): the
    normal limit's interval has the exact bootstrap's endpoints and width. Power: the same
    state with the unobserved canaries' spread removed (what dropping their term from the
    resampling gives) is about sqrt(1/2) as wide, and the width check sees it."""
    stats = _scores(200, 40, 50, seed=5)  # P_in ~ 200 * 10 = 2000 against k' T = 2000
    lo_e, hi_e = _interval(stats, True, 4000, 0)
    lo_n, hi_n = _interval(stats, False, 4000, 1)
    width = hi_e - lo_e
    # measured over seeds 5-10: endpoints within 0.03 of the width, widths within 5%
    assert abs(lo_n - lo_e) <= 0.06 * width and abs(hi_n - hi_e) <= 0.06 * width
    assert (hi_n - lo_n) == pytest.approx(width, rel=0.08)
    k = stats.k
    fault = _scores(200, 40, 50, seed=5)
    fault.load_state_dict({**_state(200, 40, 50, seed=5),
                           "sums": torch.cat([stats._dev["sums"][:k].cpu(),
                                              torch.full((40,), float(stats.sums[k:].mean()),
                                                         dtype=torch.float64)])})
    lo_f, hi_f = _interval(fault, False, 4000, 1)
    assert (hi_f - lo_f) < 0.82 * width  # measured 0.65-0.75 over seeds 5-10


def test_normal_limit_interval_coverage_is_unchanged():
    """Monte Carlo over 60 states drawn from the model: the 90% percentile intervals of both
    resamplings cover the true epsilon (of sqrt(r_max) / z) about as often."""
    z = 1.0
    cover = {True: 0, False: 0}
    for seed in range(60):
        stats = _scores(120, 400, 30, z=z, seed=100 + seed)
        r_max = int(stats.counts[: stats.k].max())
        truth = float(gaussian_epsilon_array(np.array([math.sqrt(r_max) / z]), 1e-5)[0])
        for exact in (True, False):
            stats.exact_bootstrap_draws = 1 << 40 if exact else 0
            res = stats.estimate(1e-5, alpha=0.1, bootstrap=150, seed=seed)
            cover[exact] += res.lower <= truth <= res.upper
    assert abs(cover[True] - cover[False]) <= 5
    assert min(cover.values()) >= 44  # nominal 54 of 60; the heterogeneity of r_j is not in the model


def test_known_rounds_normal_limit_is_finite_and_seeded():
    stats = _scores(300, 5000, 20, seed=2)
    stats.exact_bootstrap_draws = 0
    a = stats.estimate(1e-6, bootstrap=64, seed=4)
    b = stats.estimate(1e-6, bootstrap=64, seed=4)
    assert (a.lower, a.upper) == (b.lower, b.upper)
    assert all(math.isfinite(v) for v in (a.value, a.lower, a.upper))
    assert a.lower <= a.value <= a.upper


@pytest.mark.parametrize("kwargs, name", [
    ({"delta": 0.0}, "delta"), ({"delta": 1.5}, "delta"), ({"delta": 1e-6, "alpha": 0.0}, "alpha"),
    ({"delta": 1e-6, "alpha": 1.0}, "alpha"), ({"delta": 1e-6, "bootstrap": -1}, "bootstrap"),
    ({"delta": 1e-6, "bootstrap": 2.5}, "bootstrap"), ({"delta": 1e-6, "seed": -1}, "seed"),
])
def test_known_rounds_estimate_rejects_bad_arguments(kwargs, name):
    stats = _scores(20, 30, 5, seed=1)
    with pytest.raises(ValueError, match=name):
        stats.estimate(**kwargs)


# ---------------------------------------------------------------------------------------------
# steps unknown


def test_steps_unknown_estimate_unchanged():
    cs = CanarySet(0, 256, 200, kind="hadamard")
    su = StepsUnknownScores(cs, 50, 150, max_grad_norm=1.0, noise_multiplier=1.0)
    gen = torch.Generator().manual_seed(0)
    for t in range(30):
        g = torch.randn(256, generator=gen) + cs.sum(list(range(0, 50, 1 + t % 3)))
        su.update(g, 0.05 if t < 20 else 0.1)
    su.update(torch.full((256,), float("nan")), 0.1)
    res = su.estimate(1e-5, bootstrap=20)
    assert res.counts["steps"] == 30 and res.counts["steps_skipped"] == 1
    assert res.details["history"] == [[1.0, 0.05, 20], [1.0, 0.1, 10]]
    assert res.details["sample_rate"] == 0.1
    from audit_callbacks.estimators import CanaryScoreAuditor
    o, u = su.scores()
    ref = CanaryScoreAuditor(o, u).epsilon_estimate(1e-5, fit="equal", bootstrap=20, confidence=0.95)
    assert (res.value, res.lower, res.upper) == (ref.value, ref.lower, ref.upper)
