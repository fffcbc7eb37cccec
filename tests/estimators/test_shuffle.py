"""Shuffle-model references (METHODS C4, Matsumoto et al. §5 / Table 3) and the error-count epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from audit_callbacks.estimators import AuditResult, clopper_pearson_upper
from audit_callbacks.estimators.shuffle import (
    ShuffleTestResult,
    epsilon_from_counts,
    measurable_ceiling,
    min_clients_for_shuffling,
    paper_measurable_ceiling,
    shuffle_amplification_bound,
    shuffle_dummy_count_logpmfs,
    shuffle_dummy_delta,
    shuffle_dummy_exact_epsilon,
    shuffle_dummy_test_rates,
    shuffle_test,
    shuffle_threshold,
)

DELTA = 1e-6
# (eps0, n) -> METHODS C4 / Matsumoto et al. Table 3 "Theoretical eps"
TABLE3 = {
    (1, 432): 0.67,
    (1, 1000): 0.48,
    (2, 974): 0.95,
    (2, 1000): 0.94,
    (4, 6454): 1.1,
    (4, 10000): 0.96,
}
# exact epsilon of the dummy pair at delta = 1e-6 (this module; regression values)
EXACT = {
    (1, 432): 0.2034,
    (1, 1000): 0.1266,
    (2, 974): 0.3287,
    (2, 1000): 0.3233,
    (4, 6454): 0.4110,
    (4, 10000): 0.3146,
}


def _two_sig(x: float) -> float:
    return float(f"{x:.2g}")


@pytest.mark.parametrize("eps0, n", list(TABLE3))
def test_feldman_bound_reproduces_table3(eps0, n):
    b = shuffle_amplification_bound(eps0, n, DELTA)
    if (eps0, n) == (1, 1000):
        # the formula gives 0.48759, which rounds to 0.49; Matsumoto et al. and METHODS print 0.48
        assert b == pytest.approx(0.48759, abs=1e-5)
        assert abs(b - TABLE3[(eps0, n)]) < 0.01
    else:
        assert _two_sig(b) == TABLE3[(eps0, n)]


def test_min_clients():
    assert [min_clients_for_shuffling(e, DELTA) for e in (1, 2, 4)] == [432, 974, 6454]
    for e in (0.5, 1, 2, 4, 6):
        n = min_clients_for_shuffling(e, DELTA)
        assert n >= 8 * math.log(2 / DELTA) * (math.exp(e) + 1) > n - 1
        shuffle_amplification_bound(e, n, DELTA)  # valid at the minimum
        with pytest.raises(ValueError, match="clients"):
            shuffle_amplification_bound(e, n - 1, DELTA)


@pytest.mark.parametrize("eps0, n", list(TABLE3))
def test_exact_epsilon_values_and_ordering(eps0, n):
    ex = shuffle_dummy_exact_epsilon(eps0, n, DELTA)
    assert ex == pytest.approx(EXACT[(eps0, n)], abs=1e-4)
    assert 0 < ex <= shuffle_amplification_bound(eps0, n, DELTA)
    assert ex < eps0
    # it is the smallest eps with delta(eps) <= delta
    assert shuffle_dummy_delta(eps0, n, ex) <= DELTA * (1 + 1e-9)
    assert shuffle_dummy_delta(eps0, n, ex - 1e-3) > DELTA


def test_exact_epsilon_matches_brute_force_small_n():
    eps0, n = 1.3, 12
    p = math.exp(eps0) / (1 + math.exp(eps0))
    k = np.arange(n + 1)
    pd = stats.binom.pmf(k, n, p)
    # D' by explicit convolution of Binomial(n - 1, p) with Bernoulli(1 - p)
    b = stats.binom.pmf(np.arange(n), n - 1, p)
    pdp = np.zeros(n + 1)
    pdp[:n] += b * p
    pdp[1:] += b * (1 - p)
    ld, ldp = shuffle_dummy_count_logpmfs(eps0, n)
    np.testing.assert_allclose(np.exp(ld), pd, rtol=1e-12)
    np.testing.assert_allclose(np.exp(ldp), pdp, rtol=1e-12)
    for eps in (0.0, 0.1, 0.4, 0.9):
        hs = max(
            np.maximum(pd - math.exp(eps) * pdp, 0).sum(),
            np.maximum(pdp - math.exp(eps) * pd, 0).sum(),
        )
        assert shuffle_dummy_delta(eps0, n, eps) == pytest.approx(hs, rel=1e-10, abs=1e-300)
    # with one client there is no amplification: delta = 0 needs eps = eps0
    assert shuffle_dummy_exact_epsilon(eps0, 1, 1e-12) == pytest.approx(eps0, abs=1e-9)
    assert shuffle_dummy_delta(eps0, n, eps0) == 0.0


def test_exact_epsilon_decreases_with_n():
    vals = [shuffle_dummy_exact_epsilon(2.0, n, DELTA) for n in (50, 200, 1000, 5000)]
    assert all(a > b for a, b in zip(vals, vals[1:], strict=False))


def test_threshold_and_population_rates():
    assert shuffle_threshold(1.0, 432) == pytest.approx(432 * math.e / (1 + math.e))
    fpr, fnr = shuffle_dummy_test_rates(1.0, 432)
    tau = shuffle_threshold(1.0, 432)
    p = math.e / (1 + math.e)
    assert fpr == pytest.approx(stats.binom.cdf(math.ceil(tau) - 1, 432, p), rel=1e-10)
    assert 0.4 < fpr < 0.6 and 0.4 < fnr < 0.6


@pytest.mark.parametrize("eps0, n", list(TABLE3))
def test_shuffle_test_matches_population_and_stays_below_exact(eps0, n):
    trials = 200_000
    r = shuffle_test(eps0, n, trials, seed=7)
    assert isinstance(r, ShuffleTestResult) and sum(r.counts.values()) == trials
    fpr, fnr = shuffle_dummy_test_rates(eps0, n)
    for obs, exp, m in ((r.fpr, fpr, r.fp + r.tn), (r.fnr, fnr, r.fn + r.tp)):
        assert abs(obs - exp) < 4.5 * math.sqrt(exp * (1 - exp) / m)
    pop = max(math.log((1 - fpr) / fnr), math.log((1 - fnr) / fpr))
    assert r.epsilon_lower_bound <= r.epsilon <= r.epsilon_upper_bound
    exact = shuffle_dummy_exact_epsilon(eps0, n, DELTA)
    assert pop < exact and r.epsilon_upper_bound < exact


def test_exact_epsilon_exceeds_empirical_on_average():
    # Matsumoto et al. Table 3 setting: 1000 trials per measurement, averaged over repetitions
    for eps0, n in [(1, 432), (2, 974), (4, 6454)]:
        pts = [shuffle_test(eps0, n, 1000, seed=s).epsilon for s in range(200)]
        mean = float(np.mean(pts))
        assert mean < shuffle_dummy_exact_epsilon(eps0, n, DELTA)
        assert mean < 0.12  # far below the exact 0.2-0.4 and the FMT bound 0.67-1.1


def test_shuffle_test_seeded_and_estimate():
    a = shuffle_test(2.0, 974, 5000, seed=3)
    b = shuffle_test(2.0, 974, 5000, seed=3, chunk_size=777)
    c = shuffle_test(2.0, 974, 5000, seed=4)
    assert a.counts == shuffle_test(2.0, 974, 5000, seed=3).counts
    assert sum(b.counts.values()) == 5000 and a.counts != c.counts
    est = a.to_estimate()
    assert isinstance(est, AuditResult) and est.details["threat_model"] == "shuffle" and est.counts["n"] == 5000
    assert est.lower == a.epsilon_lower_bound and est.value == a.epsilon


@pytest.mark.parametrize(
    "call",
    [
        lambda: shuffle_amplification_bound(0.0, 1000, DELTA),
        lambda: shuffle_amplification_bound(1.0, 1000, 0.0),
        lambda: shuffle_amplification_bound(1.0, 1000, 1.5),
        lambda: shuffle_amplification_bound(float("nan"), 1000, DELTA),
        lambda: min_clients_for_shuffling(-1.0, DELTA),
        lambda: shuffle_dummy_exact_epsilon(1.0, 0, DELTA),
        lambda: shuffle_dummy_exact_epsilon(1.0, 10, 0.0),
        lambda: shuffle_dummy_delta(1.0, 10, -0.1),
        lambda: shuffle_test(1.0, 10, 0),
        lambda: shuffle_test(1.0, 10, 10, alpha=1.0),
        lambda: epsilon_from_counts(0, 0, 0, 0),
        lambda: epsilon_from_counts(-1, 0, 0, 5),
        lambda: epsilon_from_counts(1.5, 0, 0, 5),
        lambda: measurable_ceiling(0),
        lambda: paper_measurable_ceiling(10, alpha=0.0),
    ],
)
def test_bad_inputs(call):
    with pytest.raises(ValueError):
        call()


# --------------------------------------------------------------------------------------------
# epsilon_from_counts (METHODS C2 statistics, shared with attacks.ldp_test)
# --------------------------------------------------------------------------------------------


def test_epsilon_from_counts_conventions_and_bounds():
    # FPR = FP/(FP + TN) = 0.1, FNR = FN/(FN + TP) = 0.2 -> Matsumoto et al. §4.1 example, ~2.0
    ce = epsilon_from_counts(tp=400, fn=100, fp=50, tn=450)
    assert ce.fpr == 0.1 and ce.fnr == 0.2
    assert ce.epsilon == pytest.approx(max(math.log(0.9 / 0.2), math.log(0.8 / 0.1)))
    assert round(ce.epsilon, 1) == 2.1  # the paper's "~2.0" rounds log(8) = 2.08
    # lower bound: CP upper bounds at alpha/2 each (union bound)
    fpr_hi = clopper_pearson_upper(50, 500, 0.025)
    fnr_hi = clopper_pearson_upper(100, 500, 0.025)
    lo = max(math.log((1 - fpr_hi) / fnr_hi), math.log((1 - fnr_hi) / fpr_hi))
    assert ce.epsilon_lower_bound == pytest.approx(lo, rel=1e-10)
    assert ce.epsilon_lower_bound < ce.epsilon < ce.epsilon_upper_bound
    assert ce.trials == 1000 and not ce.epsilon_capped


def test_epsilon_from_counts_degenerate_cases():
    # one rate zero -> infinite point estimate, capped at the ceiling and flagged
    ce = epsilon_from_counts(tp=300, fn=200, fp=0, tn=500)
    assert ce.epsilon_capped and ce.epsilon == ce.ceiling and math.isfinite(ce.epsilon)
    assert 0 < ce.epsilon_lower_bound < ce.ceiling and math.isinf(ce.epsilon_upper_bound)
    # always wrong one way, always right the other: eps = 0 (numerator 0 ignored)
    ce = epsilon_from_counts(tp=0, fn=500, fp=0, tn=500)
    assert ce.fpr == 0.0 and ce.fnr == 1.0 and ce.epsilon == 0.0 and not ce.epsilon_capped
    # coin flipping
    ce = epsilon_from_counts(tp=250, fn=250, fp=250, tn=250)
    assert ce.epsilon == 0.0 and ce.epsilon_lower_bound == 0.0
    # an empty group: rates undefined, nothing to report
    ce = epsilon_from_counts(tp=3, fn=1, fp=0, tn=0)
    assert ce.fpr is None and ce.epsilon == 0.0 and ce.epsilon_lower_bound == 0.0
    for v in (ce.epsilon, ce.epsilon_lower_bound, ce.ceiling):
        assert not math.isnan(v)


def test_lower_bound_precision_at_many_trials():
    # 10^6 perfect trials: bound = ceiling = 11.817, computed without cancellation
    ce = epsilon_from_counts(500_000, 0, 0, 500_000)
    assert ce.epsilon_lower_bound == pytest.approx(11.81704, abs=1e-5)
    assert ce.epsilon_lower_bound == pytest.approx(measurable_ceiling(10**6), rel=1e-12)


# --------------------------------------------------------------------------------------------
# the shared game statistics (estimators.error_rates): counting, fields, estimate
# --------------------------------------------------------------------------------------------


def test_confusion_counts_conventions():
    from audit_callbacks.estimators.error_rates import confusion_counts

    rng = np.random.default_rng(5)
    b2 = rng.random(1001) < 0.5
    g2 = rng.random(1001) < 0.3
    tp, fn, fp, tn = confusion_counts(b2, g2)
    assert tp == sum(b and g for b, g in zip(b2, g2, strict=True))  # b = 2 guessed 2
    assert fn == sum(b and not g for b, g in zip(b2, g2, strict=True))  # b = 2 guessed 1
    assert fp == sum(not b and g for b, g in zip(b2, g2, strict=True))  # b = 1 guessed 2
    assert tp + fn + fp + tn == 1001 and all(isinstance(c, int) for c in (tp, fn, fp, tn))
    assert confusion_counts(np.zeros(0, bool), np.zeros(0, bool)) == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="boolean"):
        confusion_counts(np.array([0, 1]), np.array([True, False]))
    with pytest.raises(ValueError, match="shape"):
        confusion_counts(np.array([True]), np.array([True, False]))


def test_game_results_share_the_count_statistics():
    from dataclasses import fields

    from audit_callbacks.attacks import LDPTestResult
    from audit_callbacks.estimators.error_rates import CountEpsilon, GameStatistics

    names = [f.name for f in fields(GameStatistics)]
    for cls in (CountEpsilon, ShuffleTestResult, LDPTestResult):
        assert issubclass(cls, GameStatistics)
        assert [f.name for f in fields(cls)][: len(names)] == names  # same order, first
    res = shuffle_test(1.0, 200, 3000, seed=4)
    ce = epsilon_from_counts(res.tp, res.fn, res.fp, res.tn, res.alpha)
    assert res.game_fields() == ce.game_fields()
    est = res.to_estimate()
    assert (est.value, est.lower, est.counts["n"]) == (res.epsilon, res.epsilon_lower_bound, 3000)
    assert est.details["tau"] == res.tau and "trials" not in est.details


# ------------------------------------------------------ overflowing epsilon0, delta = 5e-324
def test_min_clients_for_an_overflowing_epsilon0_is_the_rounded_up_integer():
    import decimal

    n = min_clients_for_shuffling(800.0, DELTA)  # e^800 overflows a float
    assert isinstance(n, int)
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.Emax = 80, decimal.MAX_EMAX
        exact = decimal.Decimal(8.0 * math.log(2 / DELTA)) * (decimal.Decimal(800).exp() + 1)
    assert exact <= n < exact * (1 + decimal.Decimal("1e-35"))
    shuffle_amplification_bound(800.0, n, DELTA)  # valid at the minimum
    with pytest.raises(ValueError, match="clients"):
        shuffle_amplification_bound(800.0, n - 1, DELTA)
    with pytest.raises(ValueError, match="epsilon0"):  # a count of ~43,000 digits
        min_clients_for_shuffling(1e5, DELTA)


def test_delta_down_to_the_smallest_float_is_resolved():
    d = 5e-324  # 2 / delta overflows a float
    n = min_clients_for_shuffling(1.0, d)
    assert n == math.ceil(8 * (math.log(2) - math.log(d)) * (math.e + 1))
    tiny = shuffle_amplification_bound(1.0, 10**5, d)
    assert math.isfinite(tiny) and tiny > shuffle_amplification_bound(1.0, 10**5, DELTA)
    ex = shuffle_dummy_exact_epsilon(1.0, 50, d)
    assert 0 < ex <= 1.0 and ex >= shuffle_dummy_exact_epsilon(1.0, 50, DELTA)


def test_the_bound_in_the_log_domain_matches_the_direct_formula():
    # n > 1e15 and eps0 > 300 take the log-domain path: it continues the direct one
    direct = shuffle_amplification_bound(5.0, 10**15, DELTA)
    logged = shuffle_amplification_bound(5.0, 10**15 + 1, DELTA)
    assert logged == pytest.approx(direct, rel=1e-12)
    assert shuffle_amplification_bound(1.0, 10**400, DELTA) > 0  # n beyond a float
    assert shuffle_amplification_bound(300.0, 10**140, DELTA) == pytest.approx(
        shuffle_amplification_bound(300.0 + 1e-9, 10**140, DELTA), rel=1e-6)
    big = [shuffle_amplification_bound(800.0, 10**k, DELTA) for k in (360, 380, 400)]
    assert all(math.isfinite(b) and b > 0 for b in big)
    assert big[0] > big[1] > big[2]  # more clients, more amplification
    assert math.isfinite(shuffle_amplification_bound(1e4, 10**5000, DELTA))


def test_exact_epsilon_of_an_overflowing_epsilon0():
    # the pair differs in one report: with e^-eps0 negligible, delta(eps) = 1 - e^(eps - eps0)
    assert shuffle_dummy_exact_epsilon(800.0, 50, DELTA) == pytest.approx(
        800.0 + math.log1p(-DELTA), abs=1e-9)
    assert shuffle_dummy_exact_epsilon(1e300, 50, DELTA) == pytest.approx(1e300, rel=1e-11)
    log_d, log_dp = shuffle_dummy_count_logpmfs(800.0, 50)
    assert np.all(np.isfinite(log_d) | (log_d == -np.inf)) and not np.any(np.isnan(log_dp))
    assert math.isfinite(shuffle_test(800.0, 50, trials=200).epsilon_lower_bound)
