"""valid_bounds: the tightest valid lower bound, alpha spending over a logged series, the
emulated fair-coin pool, the GDP bound's gate; coverage by repetition on the Gaussian mechanism.

Coverage setting (the issue's): in ~ N(mu, 1), out ~ N(0, 1), k = k' = 500, mu in {1, 2, 4},
true epsilon = eps_GDP(mu, delta), 300 data sets, alpha = 0.05. "allowed" is the upper 99.9%
binomial quantile of the exceed count at 5% (a test fails by chance with probability <= 0.1%).
The full version (k = 500 and 1000, more data sets) is ``benchmarks/lower_bounds.py --valid``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

import audit_callbacks.estimators.valid_bounds as vb
from audit_callbacks.estimators import CanaryScoreAuditor, gaussian_epsilon_array
from audit_callbacks.estimators.valid_bounds import (
    METHODS,
    one_run_pool_size,
    spent_alpha,
    tightest_valid_lower_bound,
    valid_bound_values,
    watched_lower_bound,
)

ALPHA, DELTA = 0.05, 1e-5
N_SETS, K, J = 300, 500, 10
MUS = (1.0, 2.0, 4.0)
CHECKPOINTS = [K * (i + 1) // J for i in range(J)]  # first 50, 100, ..., 500 scores


def _allowed(n: int, rate: float = ALPHA) -> int:
    return int(stats.binom.ppf(0.999, n, rate))


def _truth(mu: float) -> float:
    return float(gaussian_epsilon_array(np.array([mu]), DELTA)[0])


def _gauss_sets(mu: float, n_sets: int = N_SETS, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([24, int(mu * 100), k])
    return rng.normal(mu, 1.0, (n_sets, k)), rng.normal(0.0, 1.0, (n_sets, k))


def _series(x: np.ndarray, y: np.ndarray, alpha_of: object) -> np.ndarray:
    """[N, J] tightest bounds on the first n_i scores of every data set, level alpha_of(i)."""
    cols = []
    for i, n_i in enumerate(CHECKPOINTS, start=1):
        sets = list(zip(x[:, :n_i], y[:, :n_i], strict=True))
        cols.append(valid_bound_values(sets, alpha=alpha_of(i), delta=DELTA,
                                       methods=METHODS).max(axis=1))
    return np.stack(cols, axis=1)


# ------------------------------------------------------------------ spending rule


def test_spent_alpha_is_a_convergent_series_summing_to_alpha() -> None:
    assert spent_alpha(0.05, 1) == pytest.approx(0.025)
    assert spent_alpha(0.05, 10) == pytest.approx(0.05 / 110)
    total = sum(spent_alpha(0.05, i) for i in range(1, 100_001))
    assert total == pytest.approx(0.05 * (1 - 1 / 100_001), rel=1e-9)  # telescoping
    assert total < 0.05
    # more than 6 alpha / (pi^2 i^2) at every point but the first
    assert all(spent_alpha(0.05, i) > 6 * 0.05 / (math.pi**2 * i * i) for i in range(2, 200))
    assert spent_alpha(0.05, 3, horizon=10) == pytest.approx(0.005)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        (dict(alpha=0.0, index=1), "alpha"),
        (dict(alpha=1.0, index=1), "alpha"),
        (dict(alpha=0.05, index=0), "index"),
        (dict(alpha=0.05, index=1.5), "index"),
        (dict(alpha=0.05, index=True), "index"),
        (dict(alpha=0.05, index=11, horizon=10), "index"),
        (dict(alpha=0.05, index=1, horizon=0), "horizon"),
    ],
)
def test_spent_alpha_bad_arguments(kwargs: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        spent_alpha(**kwargs)


# ------------------------------------------------------------------ the tightest bound


def test_tightest_is_the_largest_method_at_alpha_over_m() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(2.0, 1.0, 400), rng.normal(0.0, 1.0, 300)
    r = tightest_valid_lower_bound(x, y, alpha=ALPHA, delta=DELTA, inclusion="coins", seed=3,
                                   methods=METHODS)
    a = CanaryScoreAuditor(x, y)
    each = ALPHA / 3
    want = {
        "clopper_pearson": a.epsilon_lower_bound(each, DELTA).value,
        "one_run": a.epsilon_one_run(each, DELTA, seed=3).value,
        "one_run_fdp": a.epsilon_one_run_fdp(each, DELTA, seed=3).value,
    }
    for name, v in want.items():
        assert r.details["values"][name] == pytest.approx(v, rel=1e-8, abs=1e-10)
        assert r.details["alphas"][name] == pytest.approx(each)
    assert r.value == pytest.approx(max(want.values()), rel=1e-8)
    assert r.details["winner"] == max(want, key=want.__getitem__)
    assert r.alpha == ALPHA and r.delta == DELTA and r.method == "tightest_valid"
    assert r.counts == {"k_in": 400, "k_out": 300}
    assert r.details["pool"]["m"] == 700 and r.status == "ok"
    assert "Steinke" in r.source and "Mahloujifar" in r.source and "Clopper" in r.source
    json.dumps(r.to_dict())  # details are JSON-serialisable


def test_methods_subset_and_batch_agree_with_single_calls() -> None:
    x, y = _gauss_sets(2.0, n_sets=4, k=200)
    sets = list(zip(x, y, strict=True))
    m = ("one_run_fdp", "clopper_pearson")
    vals = valid_bound_values(sets, alpha=ALPHA, delta=DELTA, methods=m, seed=5)
    assert vals.shape == (4, 2)
    for row, (xi, yi) in zip(vals, sets, strict=True):
        r = tightest_valid_lower_bound(xi, yi, alpha=ALPHA, delta=DELTA, methods=m, seed=5)
        assert r.details["alphas"] == {"one_run_fdp": ALPHA / 2, "clopper_pearson": ALPHA / 2}
        assert r.details["values"]["one_run_fdp"] == pytest.approx(row[0], rel=1e-12)
        assert r.value == pytest.approx(row.max(), rel=1e-12)


def test_fixed_inclusion_pool_labels_are_fair_coins() -> None:
    m = one_run_pool_size(500, 500)
    assert m == 902 and one_run_pool_size(1000, 1000) == 1859
    assert one_run_pool_size(3, 3) == 3 and one_run_pool_size(500, 20) >= 20
    fail = stats.binom.sf(500, m, 0.5) * 2
    assert fail <= vb.POOL_FAILURE < stats.binom.sf(500, m + 1, 0.5) * 2
    x, y = np.arange(500.0) + 1000.0, np.arange(500.0)
    ks, infeasible = [], 0
    for seed in range(400):
        xi, yo, info = vb._pool(x, y, seed, "fixed")
        assert info["m"] == m
        ks.append(info["k_in"])
        if not info["feasible"]:  # K > 500 or m - K > 500: probability <= 1e-3
            infeasible += 1
            assert xi.size == yo.size == 0 and (ks[-1] > 500 or m - ks[-1] > 500)
            continue
        assert xi.size == ks[-1] and yo.size == m - ks[-1]
        assert np.unique(xi).size == xi.size and np.all(np.isin(xi, x))  # without replacement
        assert np.unique(yo).size == yo.size and np.all(np.isin(yo, y))
    assert infeasible <= 3
    # K ~ Binomial(m, 1/2): mean m/2, variance m/4
    assert abs(np.mean(ks) - m / 2) < 4 * math.sqrt(m / 4 / 400)
    assert np.var(ks) == pytest.approx(m / 4, rel=0.25)


def test_infeasible_pool_gives_zero_one_run_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vb, "POOL_FAILURE", 0.6)
    vb._pool_size.cache_clear()
    x, y = _gauss_sets(4.0, n_sets=1, k=40)
    seen = False
    for seed in range(50):
        r = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA, seed=seed,
                                       methods=METHODS)
        if not r.details["pool"]["feasible"]:
            seen = True
            assert r.details["values"]["one_run"] == 0.0
            assert r.details["values"]["one_run_fdp"] == 0.0
            assert r.value == r.details["values"]["clopper_pearson"] > 0
            break
    vb._pool_size.cache_clear()
    assert seen


def test_watched_is_tightest_at_the_spent_level() -> None:
    x, y = _gauss_sets(2.0, n_sets=1, k=300)
    w = watched_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA, index=4, seed=2)
    t = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA / 20, delta=DELTA, seed=2)
    assert w.value == pytest.approx(t.value, rel=1e-12)
    assert w.alpha == pytest.approx(ALPHA / 20) and w.details["alpha_spent"] == w.alpha
    assert w.details["index"] == 4 and w.details["series_alpha"] == ALPHA
    assert w.method == "watched_tightest_valid" and "i (i + 1)" in w.source
    plain = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA, seed=2)
    assert 0 < w.value <= plain.value  # spending costs tightness, never validity
    h = watched_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA, index=4, seed=2, horizon=10)
    assert h.alpha == pytest.approx(ALPHA / 10) and h.value >= w.value


def test_tiny_and_null_inputs_are_finite_never_nan() -> None:
    r = tightest_valid_lower_bound([0.0, 1.0], [0.0, 2.0], alpha=ALPHA, delta=DELTA)
    assert math.isfinite(r.value) and r.value == 0.0
    x, y = _gauss_sets(0.0, n_sets=1, k=200)
    r = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA)
    assert r.value == 0.0 and all(math.isfinite(v) for v in r.details["values"].values())
    r = tightest_valid_lower_bound([3.0, 4.0, 5.0], [0.0, 1.0, 2.0], alpha=0.5, delta=0.0,
                                   methods=("clopper_pearson", "one_run"))
    assert math.isfinite(r.value)


GOOD = [0.1, 0.5, 0.9, 1.3]
BAD = [
    (dict(in_scores=[1.0]), "in_scores"),
    (dict(out_scores=[]), "out_scores"),
    (dict(in_scores=[2.0, 2.0, 2.0]), "in_scores are all equal"),
    (dict(out_scores=[0.0, float("nan")]), "out_scores contains NaN"),
    (dict(in_scores=np.ones((2, 2))), "in_scores must be 1-D"),
    (dict(alpha=0.0), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(delta=1.0), "delta"),
    (dict(delta=-1e-3), "delta"),
    (dict(delta=0.0, methods=METHODS), "delta must be in \\(0, 1\\) when methods include 'one_run_fdp'"),
    (dict(methods=()), "methods"),
    (dict(methods="one_run"), "methods"),
    (dict(methods=("one_run", "gdp")), "methods"),
    (dict(methods=("one_run", "one_run")), "methods"),
    (dict(seed=-1), "seed"),
    (dict(inclusion="half"), "inclusion"),
]


@pytest.mark.parametrize(("kwargs", "msg"), BAD)
def test_bad_arguments_name_the_argument(kwargs: dict, msg: str) -> None:
    args = dict(in_scores=GOOD, out_scores=[0.0, 0.2, 0.4, -0.3], alpha=ALPHA, delta=DELTA)
    args.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        tightest_valid_lower_bound(args.pop("in_scores"), args.pop("out_scores"), **args)
    with pytest.raises(ValueError, match=msg):
        watched_lower_bound(
            kwargs.get("in_scores", GOOD), kwargs.get("out_scores", [0.0, 0.2, 0.4, -0.3]),
            index=2, **{k: v for k, v in args.items()},
        )


def test_batch_rejects_empty_data_sets() -> None:
    with pytest.raises(ValueError, match="data_sets"):
        valid_bound_values([], alpha=ALPHA, delta=DELTA)


# ------------------------------------------------------------------ coverage by repetition


@pytest.fixture(scope="module", params=MUS, ids=lambda m: f"mu={m:g}")
def gauss(request: pytest.FixtureRequest) -> tuple[float, float, np.ndarray, np.ndarray]:
    mu = request.param
    return mu, _truth(mu), *_gauss_sets(mu)


def test_coverage_tightest_valid(gauss: tuple) -> None:
    """(a) the tightest valid 95% bound exceeds the truth in <= 5% + slack of 300 data sets."""
    mu, truth, x, y = gauss
    vals = valid_bound_values(list(zip(x, y, strict=True)), alpha=ALPHA, delta=DELTA,
                              methods=METHODS)  # the f-DP bound too: these scores are GDP
    best = vals.max(axis=1)
    exceed = int(np.sum(best > truth))
    print(f"\n(a) mu={mu:g} eps={truth:.2f}: exceed {exceed}/{N_SETS}, mean bound "
          f"{best.mean():.3f}, wins {dict(zip(METHODS, np.bincount(vals.argmax(1), minlength=3), strict=True))}")
    assert exceed <= _allowed(N_SETS)
    assert best.mean() > 0.1 * truth  # not vacuous
    r = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA, delta=DELTA, methods=METHODS)
    assert r.value == pytest.approx(best[0], rel=1e-12)


def test_coverage_watched_series_maximum(gauss: tuple) -> None:
    """(b) the maximum over J = 10 growing checkpoints of the watched bound covers."""
    mu, truth, x, y = gauss
    series = _series(x, y, lambda i: spent_alpha(ALPHA, i))
    top = series.max(axis=1)
    exceed = int(np.sum(top > truth))
    print(f"\n(b) mu={mu:g}: series max exceed {exceed}/{N_SETS}, mean max {top.mean():.3f}")
    assert exceed <= _allowed(N_SETS)
    assert top.mean() > 0.1 * truth
    n3 = CHECKPOINTS[2]
    w = watched_lower_bound(x[7, :n3], y[7, :n3], alpha=ALPHA, delta=DELTA, index=3, seed=0,
                            methods=METHODS)
    assert w.value == pytest.approx(series[7, 2], rel=1e-12)


def test_naive_maximum_of_pointwise_bounds_exceeds_and_spending_fixes_it() -> None:
    """(c) the highest point of a pointwise 95% series is not a 95% bound: shown with the
    parametric GDP bound (exact 5% per point under its model) at mu = 2; with the spent
    levels the maximum covers again."""
    mu = 2.0
    truth = _truth(mu)
    x, y = _gauss_sets(mu)
    naive, spent = np.zeros((N_SETS, J)), np.zeros((N_SETS, J))
    for s in range(N_SETS):
        for i, n_i in enumerate(CHECKPOINTS):
            a = CanaryScoreAuditor(x[s, :n_i], y[s, :n_i])
            naive[s, i] = a.epsilon_gdp_lower_bound(ALPHA, DELTA, gof_level=0.0).value
            spent[s, i] = a.epsilon_gdp_lower_bound(spent_alpha(ALPHA, i + 1), DELTA,
                                                     gof_level=0.0).value
    point = float(np.mean(naive[:, -1] > truth))
    naive_rate = float(np.mean(naive.max(axis=1) > truth))
    spent_rate = float(np.mean(spent.max(axis=1) > truth))
    print(f"\n(c) GDP mu=2: last point {point:.3f}, naive max {naive_rate:.3f}, "
          f"spent max {spent_rate:.3f}")
    # significantly above 5%: more exceedances than 5% + slack allows
    assert np.sum(naive.max(axis=1) > truth) > _allowed(N_SETS)
    assert np.sum(spent.max(axis=1) > truth) <= _allowed(N_SETS)


def test_one_run_emulated_pool_covers_where_the_bound_is_tight() -> None:
    """The fixed-inclusion pool on randomized response (eps-DP, where the one-run bound is
    nearly tight): exceed <= 5% + slack while the bound reaches 0.7 of the truth."""
    rng = np.random.default_rng(7)
    for eps in (1.0, 2.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        x = (rng.random((N_SETS, K)) < p).astype(float)
        y = (rng.random((N_SETS, K)) >= p).astype(float)
        v = valid_bound_values(list(zip(x, y, strict=True)), alpha=ALPHA, delta=0.0,
                               methods=("one_run",))[:, 0]
        print(f"\nrandomized response eps={eps}: exceed {np.sum(v > eps)}/{N_SETS}, "
              f"mean {v.mean():.3f}")
        assert np.sum(v > eps) <= _allowed(N_SETS)
        assert v.mean() > 0.7 * eps


def test_default_methods_hold_for_randomized_response_where_the_fdp_bound_does_not() -> None:
    """The default methods hold for any mechanism; the f-DP bound (mu-GDP rejected, converted
    to epsilon) only for Gaussian-shaped ones. Randomized response at eps = 4 (a pure eps-DP
    pair of scores, k = k' = 1000, delta = 1e-5, 100 data sets): the default tightest bound
    exceeds the truth in <= 5% + slack, the f-DP bound in most data sets."""
    rng = np.random.default_rng(13)
    eps, n_sets, k = 4.0, 100, 1000
    p = math.exp(eps) / (1 + math.exp(eps))
    x = (rng.random((n_sets, k)) < p).astype(float)
    y = (rng.random((n_sets, k)) >= p).astype(float)
    sets = list(zip(x, y, strict=True))
    default = valid_bound_values(sets, alpha=ALPHA, delta=1e-5).max(axis=1)
    fdp = valid_bound_values(sets, alpha=ALPHA, delta=1e-5, methods=("one_run_fdp",))[:, 0]
    print(f"\nrandomized response eps=4: default exceeds {np.sum(default > eps)}/{n_sets} "
          f"(mean {default.mean():.3f}), one_run_fdp exceeds {np.sum(fdp > eps)}/{n_sets}")
    assert vb.DEFAULT_METHODS == ("clopper_pearson", "one_run")
    assert np.sum(default > eps) <= _allowed(n_sets)
    assert default.mean() > 0.5 * eps  # not vacuous
    assert np.sum(fdp > eps) > n_sets // 2
    r = tightest_valid_lower_bound(x[0], y[0], alpha=ALPHA, delta=1e-5)
    assert tuple(r.details["methods"]) == vb.DEFAULT_METHODS


# ------------------------------------------------------------------ GDP gating


def test_gdp_gate_passes_gaussian_scores() -> None:
    """(d) Gaussian scores pass the fit test at the default 1% level in >= 95% of data sets."""
    x, y = _gauss_sets(2.0)
    rs = [CanaryScoreAuditor(a, b).epsilon_gdp_lower_bound(ALPHA, DELTA)
          for a, b in zip(x, y, strict=True)]
    ok = np.mean([r.status == "ok" for r in rs])
    print(f"\n(d) Gaussian scores pass rate {ok:.3f}")
    assert ok >= 0.95
    assert all(r.details["gof_level"] == 0.01 for r in rs)


def test_gdp_gate_rejects_a_mixture_but_keeps_the_value() -> None:
    """(d) In-scores from a mixture (30% of the canaries leak strongly) are rejected."""
    rng = np.random.default_rng(11)
    rejected = 0
    for _ in range(100):
        leak = rng.random(K) < 0.3
        x = rng.normal(np.where(leak, 4.0, 0.5), 1.0)
        r = CanaryScoreAuditor(x, rng.normal(0.0, 1.0, K)).epsilon_gdp_lower_bound(ALPHA, DELTA)
        if r.status.startswith("rejected"):
            rejected += 1
            p = r.details["gof_pvalue"]
            assert r.status == f"rejected: goodness-of-fit p = {p:.2g} < 0.01"
            assert r.value > 0 and math.isfinite(r.value)
    print(f"\n(d) mixture rejected in {rejected}/100")
    assert rejected >= 95


def test_gdp_bound_ignores_the_scores_scale_and_any_alpha_returns() -> None:
    """The GDP bound is scale-free (scores at 1e-300 or 1e300 give the bound of scale 1, not a
    ZeroDivisionError or 0 from overflowing squares) and returns for every alpha in (0, 1)
    (its bracket walked away from the root for alpha > 0.84)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, 1000), rng.normal(0.0, 1.0, 1000)
    base = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(ALPHA, DELTA)
    for scale in (2.0**-1000, 2.0**-60, 2.0**60, 2.0**1000):
        r = CanaryScoreAuditor(x * scale, y * scale).epsilon_gdp_lower_bound(ALPHA, DELTA)
        assert r.value == base.value and r.details["mu_hat"] == base.details["mu_hat"]
    values = [CanaryScoreAuditor(x[:100], y[:100]).epsilon_gdp_lower_bound(a, DELTA).value
              for a in (0.05, 0.5, 0.85, 0.9, 0.99)]
    assert all(math.isfinite(v) for v in values)
    assert values == sorted(values)  # a larger alpha, a less conservative bound
