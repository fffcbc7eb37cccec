"""The GDP bound's goodness-of-fit p-values are scipy's bit for bit (D'Agostino-Pearson and
Brown-Forsythe written without scipy's test wrappers), on Gaussian, heavy-tailed, skewed,
shifted, tiny-scale and tied scores, and NaN exactly where scipy's is; the medians taken from
sorted scores (one array, or two together) are numpy.median's bit for bit."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from audit_callbacks.estimators._normality import (
    brown_forsythe_pvalue,
    dagostino_pearson_pvalue,
    sorted_median,
    union_median,
)


def _samples(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 9000))
    return [rng.normal(0.0, 1.0, n), rng.standard_t(3, n) * 1e-3, rng.exponential(2.0, n) + 5.0,
            rng.normal(1e3, 1e-4, n), np.round(rng.normal(0.0, 1.0, n), 1),
            rng.uniform(-1.0, 1.0, n) * 1e-7]


def _scipy(test, *args, **kwargs) -> float:  # noqa: ANN001
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(test(*args, **kwargs).pvalue)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", range(12))
def test_dagostino_pearson_is_scipys(seed: int) -> None:
    for a in _samples(seed):
        assert _same(dagostino_pearson_pvalue(a), _scipy(stats.normaltest, a))


@pytest.mark.parametrize("seed", range(12))
def test_brown_forsythe_is_scipys(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    xs = _samples(seed)
    for x in xs:
        y = rng.choice(xs[0], size=int(rng.integers(2, 3 * x.size)))
        assert _same(brown_forsythe_pvalue(x, y), _scipy(stats.levene, x, y, center="median"))
        assert _same(brown_forsythe_pvalue(y[:2], x), _scipy(stats.levene, y[:2], x, center="median"))


def test_degenerate_scores_give_nan_as_scipy() -> None:
    const = np.full(50, 0.25)
    assert math.isnan(dagostino_pearson_pvalue(const))
    assert math.isnan(_scipy(stats.normaltest, const))
    assert math.isnan(brown_forsythe_pvalue(const, const))
    assert math.isnan(_scipy(stats.levene, const, const, center="median"))


def test_bad_shapes_name_the_argument() -> None:
    with pytest.raises(ValueError, match="a must be 1-D"):
        dagostino_pearson_pvalue(np.zeros(7))
    with pytest.raises(ValueError, match="y must be 1-D"):
        brown_forsythe_pvalue(np.zeros(5), np.zeros((2, 2)))


@pytest.mark.parametrize("seed", range(10))
def test_medians_of_sorted_scores_are_numpys(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    for _ in range(25):
        a = rng.normal(0.0, 10.0 ** rng.uniform(-6, 3), int(rng.integers(1, 60)))
        b = rng.standard_t(2, int(rng.integers(1, 3000))) * 10.0 ** rng.uniform(-6, 3)
        if rng.random() < 0.4:  # ties, across the two arrays too
            a, b = np.round(a, 1), np.round(b, 1)
        a, b = np.sort(a), np.sort(b)
        assert sorted_median(a) == np.median(a) and sorted_median(b) == np.median(b)
        both = np.concatenate([a, b])
        assert union_median(a, b) == np.median(both) == union_median(b, a)
        if min(a.size, b.size) >= 2:
            assert _same(brown_forsythe_pvalue(a, b, (sorted_median(a), sorted_median(b))),
                         brown_forsythe_pvalue(a, b))
    empty = np.zeros(0)
    assert union_median(empty, np.array([1.0, 2.0, 4.0])) == 2.0
    assert union_median(np.array([3.0]), empty) == 3.0
