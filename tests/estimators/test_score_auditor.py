"""CanaryScoreAuditor: closed forms, hand-computed counts, Monte Carlo coverage, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.optimize import brentq

from audit_callbacks.estimators import (
    AuditResult,
    CanaryScoreAuditor,
    cosine_null_sample,
    gaussian_epsilon,
)
from audit_callbacks.estimators.one_run import (
    fdp_mu,
    guess_counts,
    log_binom_coef,
    one_run_epsilon,
    one_run_pvalue,
    pure_dp_epsilon,
)

DELTA = 1e-5


def _mu_for(eps: float, delta: float = DELTA) -> float:
    return brentq(lambda m: gaussian_epsilon(1.0 / m, delta) - eps, 1e-3, 30.0)


def _gauss(mu: float, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1.0, k), rng.normal(0.0, 1.0, k)


# ------------------------------------------------------------------ closed forms


def test_gdp_bound_approaches_true_mu_with_huge_k() -> None:
    mu = _mu_for(4.0)
    x, y = _gauss(mu, 200_000, 0)
    r = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA)
    assert r.details["mu_lower"] < mu  # a lower bound, on this seed
    assert r.details["mu_lower"] == pytest.approx(mu, abs=0.02)
    assert r.value == pytest.approx(4.0, rel=0.03)
    assert r.details["gof_pvalue"] is not None and r.details["gof_pvalue"] > 0.001
    assert "Dong, Roth, Su (2022)" in r.source


def test_gdp_bound_is_zero_without_signal_never_abs_mu() -> None:
    x, y = _gauss(-0.5, 500, 1)  # in-scores lower: mu_hat < 0
    r = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA)
    assert r.details["mu_lower"] < 0 and r.value == 0.0


def test_gdp_bound_normal_approx_agrees_with_noncentral_t() -> None:
    x, y = _gauss(1.0, 2000, 2)
    r = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA)
    mh = r.details["mu_hat"]
    se = math.sqrt(2 / 2000 + mh * mh / (2 * 4000))
    assert r.details["mu_lower"] == pytest.approx(mh - 1.6449 * se, abs=2e-3)


def test_gof_pvalue_flags_non_gaussian_scores() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.exponential(1.0, 1000) + 0.5, rng.exponential(1.0, 1000)
    r = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA)
    p = r.details["gof_pvalue"]
    assert p < 1e-6
    assert r.status == f"rejected: goodness-of-fit p = {p:.2g} < 0.01"
    assert r.value > 0 and r.details["gof_level"] == 0.01  # the value is kept


def test_gdp_gate_level() -> None:
    x, y = _gauss(1.0, 1000, 12)
    a = CanaryScoreAuditor(x, y)
    r = a.epsilon_gdp_lower_bound(0.05, DELTA)
    p = r.details["gof_pvalue"]
    assert r.status == "ok" and p >= 0.01
    assert a.epsilon_gdp_lower_bound(0.05, DELTA, gof_level=0.0).status == "ok"
    tight = a.epsilon_gdp_lower_bound(0.05, DELTA, gof_level=min(1.0, p * 1.01) if p < 0.99 else 0.999)
    assert tight.status.startswith("rejected: goodness-of-fit p = ")
    assert tight.value == r.value


def test_an_estimate_leaves_other_warnings_shown_once() -> None:
    """The goodness-of-fit and equal-variance tests run at every estimate without touching the
    warning filters: a warnings.catch_warnings there reset Python's once-per-location record, so
    another library's warning (torch's backward-hook warning under Opacus) was shown again at
    every estimate."""
    import warnings

    def other_library():
        warnings.warn("another library's warning", UserWarning, stacklevel=1)

    x, y = _gauss(1.0, 200, 5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            other_library()
            CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA)
    assert [str(w.message) for w in seen] == ["another library's warning"]


def test_clopper_pearson_fixed_threshold_hand_computed() -> None:
    x, y = [1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 1.5, 2.5]
    r = CanaryScoreAuditor(x, y).epsilon_lower_bound(alpha=0.1, delta=0.0, threshold=2.0)
    assert r.counts["fn"] == 1 and r.counts["fp"] == 1  # x=1 < 2; y=2.5 >= 2
    u = stats.beta.ppf(1 - 0.05, 2, 3)  # CP upper for 1 of 4 at 1 - alpha/2
    assert r.value == pytest.approx(max(math.log((1 - u) / u), 0.0), abs=1e-12)
    assert r.details["threshold"] == 2.0 and r.alpha == 0.1


def test_clopper_pearson_perfect_separation_and_delta() -> None:
    x, y = np.arange(100.0) + 200.0, np.arange(100.0)
    a = CanaryScoreAuditor(x, y)
    r0 = a.epsilon_lower_bound(0.05, 0.0)
    r1 = a.epsilon_lower_bound(0.05, 1e-2)
    t = r0.counts["candidates"]
    u = stats.beta.ppf(1 - 0.05 / t / 2, 1, 100)  # fn = fp = 0 at the best threshold
    assert r0.value == pytest.approx(math.log((1 - u) / u), rel=1e-9)
    assert 0 < r1.value < r0.value


def test_split_threshold_is_evaluated_on_the_other_half() -> None:
    x, y = _gauss(3.0, 400, 4)
    r = CanaryScoreAuditor(x, y).epsilon_lower_bound(0.05, DELTA, threshold="split", seed=1)
    assert r.counts["k_in_test"] == 200 and r.method == "clopper_pearson_split"
    assert r.value > 0 and r.details["threshold"] is not None


def test_auroc_matches_mann_whitney_with_ties() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 6, 50).astype(float), rng.integers(0, 5, 40).astype(float)
    u = stats.mannwhitneyu(x, y).statistic
    assert CanaryScoreAuditor(x, y).auroc().value == pytest.approx(u / 2000, abs=1e-12)


def test_tpr_at_fpr_uses_the_roc_hull() -> None:
    a = CanaryScoreAuditor([1.0, 3.0], [0.0, 2.0])
    assert a.tpr_at_fpr(0.0).value == pytest.approx(0.5)
    assert a.tpr_at_fpr(0.25).value == pytest.approx(0.75)  # mix of tau = 3 and tau = 1
    assert a.tpr_at_fpr(1.0).value == pytest.approx(1.0)


def test_one_run_pvalue_matches_direct_sum() -> None:
    n, v, m, eps, delta = 30, 24, 200, 0.7, 1e-3
    lc, j = log_binom_coef(np.array([n]), n + 1)
    p = one_run_pvalue(np.array([eps]), np.array([n]), np.array([v]), np.array([m]), delta, lc, j)
    q = 1 / (1 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, n, q)
    extra = max(sum(stats.binom.pmf(v - i2, n, q) for i2 in range(1, i + 1)) / i
                for i in range(1, v + 1))
    assert p[0] == pytest.approx(tail + 2 * m * delta * extra, rel=1e-10)


def test_one_run_all_correct_closed_form_delta0() -> None:
    # v = n: p = q^n, so eps = logit(alpha^(1/n))
    n = np.array([20])
    e = one_run_epsilon(n, n, np.array([100.0]), np.array([0.05]), 0.0)
    q = 0.05 ** (1 / 20)
    assert e[0] == pytest.approx(math.log(q / (1 - q)), abs=1e-9)


def test_one_run_epsilon_is_the_root_of_the_pvalue() -> None:
    rng = np.random.default_rng(13)
    n = rng.integers(1, 600, 400)
    v = np.clip((n * rng.uniform(0.4, 1.02, 400)).astype(int), 0, n)
    m = np.full(400, 1500.0)
    for delta, level in ((0.0, 0.05), (1e-5, 1e-3), (1e-3, 0.05)):
        lv = np.full(400, level)
        e = one_run_epsilon(n, v, m, lv, delta)
        lc, j = log_binom_coef(n, int(n.max()) + 1)
        pos = e > 0
        assert pos.sum() > 50
        # rejected (up to the summation order: the solver sums the pmf in narrower blocks)
        assert np.all(one_run_pvalue(e, n, v, m, delta, lc, j)[pos] <= lv[pos] * (1 + 1e-9))
        above = one_run_pvalue(e + 1e-8, n, v, m, delta, lc, j)
        assert np.all(above[pos] > lv[pos])  # and no larger eps is
        assert np.all(one_run_pvalue(np.zeros(400), n, v, m, delta, lc, j)[~pos] > lv[~pos])
        e0 = pure_dp_epsilon(n, v, lv)
        assert np.all(e <= e0 + 1e-9)
        if delta == 0.0:  # closed form of the pure-DP tail
            assert np.allclose(e, e0, atol=1e-9)


def test_fdp_mu_groups_keep_each_group_maximum() -> None:
    x, y = _gauss(2.0, 300, 14)
    lanes = [guess_counts(x[:150], y[:150], 0)[:2], guess_counts(x, y, 1)[:2]]
    n = np.concatenate([a[0] for a in lanes])
    v = np.concatenate([a[1] for a in lanes])
    g = np.repeat([0, 1], [lanes[0][0].size, lanes[1][0].size])
    m = np.where(g == 0, 300.0, 600.0)
    full, pruned = fdp_mu(n, v, m, 0.01), fdp_mu(n, v, m, 0.01, groups=g)
    for k in (0, 1):
        assert pruned[g == k].max() == full[g == k].max()
        assert np.argmax(pruned[g == k]) == np.argmax(full[g == k])
    assert np.all(pruned <= full)


def test_guess_counts_use_top_and_bottom_scores() -> None:
    x, y = np.array([5.0, 4.0, 0.5]), np.array([3.0, 0.0, -1.0])
    n, v, nt, nb = guess_counts(x, y, 0)
    i = int(np.flatnonzero((nt == 2) & (nb == 2))[0])  # top {5, 4}, bottom {-1, 0}
    assert n[i] == 4 and v[i] == 4
    i = int(np.flatnonzero((nt == 3) & (nb == 0))[0])  # top {5, 4, 3}: 2 in
    assert v[i] == 2


def test_fdp_bound_beats_or_matches_binomial_bound_on_strong_signal() -> None:
    x, y = _gauss(_mu_for(6.0), 500, 6)
    a = CanaryScoreAuditor(x, y)
    r1, r2 = a.epsilon_one_run(0.05, DELTA), a.epsilon_one_run_fdp(0.05, DELTA)
    assert 0 < r1.value <= r2.value < 6.0
    assert r2.details["mu_lower"] > 0 and r2.counts["correct"] <= r2.counts["guesses"]


def test_equal_fit_estimate_near_truth_and_affine_invariant() -> None:
    mu = _mu_for(4.0)
    x, y = _gauss(mu, 50_000, 7)
    r = CanaryScoreAuditor(x, y).epsilon_estimate(DELTA, fit="equal")
    assert r.value == pytest.approx(4.0, rel=0.03)
    r2 = CanaryScoreAuditor(3 * x + 10, 3 * y + 10).epsilon_estimate(DELTA, fit="equal")
    assert r2.value == pytest.approx(r.value, rel=1e-9)
    ru = CanaryScoreAuditor(x, y).epsilon_estimate(DELTA, fit="unequal", bootstrap=50)
    assert ru.lower is not None and ru.lower <= ru.upper
    # an interval states its level (1 - confidence); a point estimate has none
    assert ru.alpha == pytest.approx(0.05) and r.alpha is None
    assert CanaryScoreAuditor(x, y).epsilon_estimate(DELTA, bootstrap=50, confidence=0.9).alpha == pytest.approx(0.1)


def test_exact_cosine_null_with_dim() -> None:
    d = 500
    rng = np.random.default_rng(8)
    out = cosine_null_sample(rng, d, 400)
    inn = np.clip(cosine_null_sample(rng, d, 400) + 2.0 / math.sqrt(d), -1, 1)
    a = CanaryScoreAuditor.from_cosines(inn, out, dim=d)
    r = a.epsilon_estimate(DELTA)
    assert r.details["sd_null"] == pytest.approx(1 / math.sqrt(d))
    assert r.details["null"] == "exact_cosine"
    lb = a.epsilon_lower_bound(0.05, DELTA)
    assert lb.details["fpr"] == "exact_cosine" and lb.value >= 0


def test_accepts_lists_and_torch_tensors() -> None:
    x, y = _gauss(1.0, 50, 9)
    ref = CanaryScoreAuditor(x, y).auroc().value
    assert CanaryScoreAuditor(list(x), list(y)).auroc().value == pytest.approx(ref)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    got = CanaryScoreAuditor(tx, torch.tensor(y)).auroc().value
    assert got == pytest.approx(ref, abs=1e-6)  # float32 conversion
    assert isinstance(CanaryScoreAuditor(x, y).auroc(), AuditResult)


# ------------------------------------------------------------------ bad input

GOOD = [0.1, 0.5, 0.9]
BAD_CASES = [
    ("in_scores", dict(in_scores=[1.0], out_scores=GOOD)),
    ("out_scores", dict(in_scores=GOOD, out_scores=[])),
    ("NaN", dict(in_scores=[0.1, float("nan"), 0.3], out_scores=GOOD)),
    ("NaN or inf", dict(in_scores=GOOD, out_scores=[0.1, float("inf")])),
    ("all equal", dict(in_scores=[2.0, 2.0, 2.0], out_scores=GOOD)),
    ("real numbers", dict(in_scores=np.array([True, False, True]), out_scores=GOOD)),
    ("bool tensor", dict(in_scores=torch.tensor([True, False]), out_scores=GOOD)),
    ("real numbers", dict(in_scores=["a", "b"], out_scores=GOOD)),
    ("1-D", dict(in_scores=np.ones((2, 2)), out_scores=GOOD)),
    ("cosines", dict(in_scores=[0.5, 1.5], out_scores=GOOD, dim=10)),
    ("dim", dict(in_scores=GOOD, out_scores=GOOD, dim=1)),
]


@pytest.mark.parametrize(("msg", "kwargs"), BAD_CASES)
def test_bad_constructor_input(msg: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=msg):
        CanaryScoreAuditor(**kwargs)


@pytest.mark.parametrize(
    ("method", "kwargs", "msg"),
    [
        ("epsilon_lower_bound", dict(alpha=0.0), "alpha"),
        ("epsilon_lower_bound", dict(alpha=1.0), "alpha"),
        ("epsilon_lower_bound", dict(delta=1.0), "delta"),
        ("epsilon_lower_bound", dict(delta=-0.1), "delta"),
        ("epsilon_lower_bound", dict(threshold="max"), "threshold"),
        ("epsilon_lower_bound", dict(threshold=float("nan")), "threshold"),
        ("epsilon_one_run", dict(alpha=1.5), "alpha"),
        ("epsilon_one_run", dict(delta=float("nan")), "delta"),
        ("epsilon_one_run_fdp", dict(delta=0.0), "delta"),
        ("epsilon_gdp_lower_bound", dict(delta=0.0), "delta"),
        ("epsilon_gdp_lower_bound", dict(alpha=-1), "alpha"),
        ("epsilon_gdp_lower_bound", dict(gof_level=1.0), "gof_level"),
        ("epsilon_gdp_lower_bound", dict(gof_level=-0.01), "gof_level"),
        ("epsilon_gdp_lower_bound", dict(gof_level=float("nan")), "gof_level"),
        ("epsilon_estimate", dict(delta=0.0), "delta"),
        ("epsilon_estimate", dict(delta=1e-5, fit="both"), "fit"),
        ("epsilon_estimate", dict(delta=1e-5, confidence=1.0), "confidence"),
        ("tpr_at_fpr", dict(fpr=1.5), "fpr"),
    ],
)
def test_bad_method_arguments(method: str, kwargs: dict, msg: str) -> None:
    a = CanaryScoreAuditor([0.3, 1.2, 2.0, 2.5], [0.0, 0.4, 1.0, -0.2])
    with pytest.raises(ValueError, match=msg):
        getattr(a, method)(**kwargs)


def test_delta_zero_supported_where_documented() -> None:
    a = CanaryScoreAuditor(np.arange(20.0) + 30, np.arange(20.0))
    assert a.epsilon_lower_bound(0.05, 0.0).value > 0
    assert a.epsilon_one_run(0.05, 0.0).value > 0


# ------------------------------------------------------------------ Monte Carlo coverage

N_SETS, K = 120, 500


def _allowed(n: int) -> int:
    return int(stats.binom.ppf(0.999, n, 0.05))  # 5% + binomial slack (fails w.p. <= 0.1%)


@pytest.fixture(scope="module", params=[1.0, 4.0])
def mc(request: pytest.FixtureRequest) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
    eps = request.param
    mu = _mu_for(eps)
    return eps, [_gauss(mu, K, 1000 * int(eps) + s) for s in range(N_SETS)]


@pytest.mark.parametrize("rule", ["bonferroni", "split"])
def test_coverage_clopper_pearson(mc: tuple, rule: str) -> None:
    eps, sets = mc
    vals = [CanaryScoreAuditor(x, y).epsilon_lower_bound(0.05, DELTA, rule, seed=s).value
            for s, (x, y) in enumerate(sets)]
    assert sum(v > eps for v in vals) <= _allowed(len(vals))
    assert max(vals) > 0  # not vacuous


def test_coverage_gdp(mc: tuple) -> None:
    eps, sets = mc
    vals = [CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05, DELTA).value for x, y in sets]
    assert sum(v > eps for v in vals) <= _allowed(len(vals))
    assert np.mean(vals) > 0.5 * eps


def _batched_one_run(sets: list, fdp: bool) -> np.ndarray:
    """The methods' computation for many data sets at once (same candidates and levels)."""
    lanes = [guess_counts(x, y, 0)[:2] for x, y in sets]
    c = lanes[0][0].size
    n = np.concatenate([lane[0] for lane in lanes])
    v = np.concatenate([lane[1] for lane in lanes])
    m = np.full(n.size, 2.0 * K)
    lv = np.full(n.size, 0.05 / c)
    if fdp:
        mu = fdp_mu(n, v, m, lv).reshape(len(sets), c).max(axis=1)
        return np.array([gaussian_epsilon(1 / u, DELTA) if u > 0 else 0.0 for u in mu])
    return one_run_epsilon(n, v, m, lv, DELTA).reshape(len(sets), c).max(axis=1)


@pytest.mark.parametrize("fdp", [False, True])
def test_coverage_one_run(mc: tuple, fdp: bool) -> None:
    eps, sets = mc
    vals = _batched_one_run(sets, fdp)
    x, y = sets[0]
    a = CanaryScoreAuditor(x, y)
    single = a.epsilon_one_run_fdp(0.05, DELTA) if fdp else a.epsilon_one_run(0.05, DELTA)
    assert single.value == pytest.approx(vals[0], rel=1e-6, abs=1e-9)
    assert sum(v > eps for v in vals) <= _allowed(len(vals))
    assert max(vals) > 0


def test_tiny_inputs_give_finite_results_never_nan() -> None:
    a = CanaryScoreAuditor([0.0, 1.0], [0.0, 2.0])
    r = a.epsilon_gdp_lower_bound(0.05, DELTA)
    ev = r.details["equal_variance_pvalue"]
    assert ev is None or math.isfinite(ev)
    for res in (a.epsilon_estimate(DELTA), a.epsilon_lower_bound(), a.epsilon_one_run(),
                a.epsilon_one_run_fdp(), a.tpr_at_fpr(0.5), a.auroc()):
        assert math.isfinite(res.value) and res.value >= 0
