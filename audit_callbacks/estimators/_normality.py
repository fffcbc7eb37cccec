"""The two goodness-of-fit p-values of the parametric (GDP) bound, without scipy's test wrappers.

:meth:`~audit_callbacks.estimators.score_auditor.CanaryScoreAuditor.epsilon_gdp_lower_bound`
gates its bound on D'Agostino-Pearson's omnibus test of the pooled residuals (above 5000 of
them) and reports the Brown-Forsythe test of equal variances. ``scipy.stats.normaltest`` and
``scipy.stats.levene`` spend most of their time (~2.8 ms and ~1.4 ms on 65,536 scores) in the
array-API and NaN-policy machinery around the numbers and in computing the mean and the second
moment twice; here the same numpy operations on the same types, in the same order, are done
once each, so each p-value is bit for bit scipy's (checked against scipy in
``tests/estimators/test_normality.py``) at about a sixth (normaltest) and three quarters (levene)
of the time. Pure numpy/scipy.special.

Sources: D'Agostino (1970), Biometrika 57 (the skewness z); Anscombe & Glynn (1983),
Biometrika 70 (the kurtosis z); D'Agostino & Pearson (1973), Biometrika 60 (the omnibus K^2 ~
chi^2(2)); Brown & Forsythe (1974), JASA 69 (Levene's W about the medians, ~ F(k - 1, N - k)).
"""

from __future__ import annotations

import numpy as np
from scipy import special

__all__ = ["brown_forsythe_pvalue", "dagostino_pearson_pvalue", "sorted_median", "union_median"]


def dagostino_pearson_pvalue(a: np.ndarray) -> float:
    """P-value of D'Agostino and Pearson's omnibus normality test, as
    ``scipy.stats.normaltest(a).pvalue``: K^2 = Z_skew^2 + Z_kurt^2 against chi^2 with 2
    degrees of freedom.

    Args:
        a: ``[n]`` float64 scores, finite, n >= 8 (scipy's minimum for the skewness test).

    Returns:
        The p-value (NaN where scipy's is NaN, e.g. all scores equal).

    Raises:
        ValueError: ``a`` not a 1-D array of at least 8 scores.

    Source: D'Agostino & Pearson (1973), Biometrika 60, 613-622; the z-scores of D'Agostino
    (1970) and Anscombe & Glynn (1983), as ``scipy.stats.skewtest`` / ``kurtosistest`` write them.
    """
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] < 8:
        raise ValueError(f"a must be 1-D with at least 8 scores, got shape {a.shape}")
    with np.errstate(all="ignore"):
        mean = np.mean(a, axis=0, keepdims=True)
        mean_reduced = np.squeeze(mean, axis=0)
        azm = a - mean
        sq = azm**2
        m2 = np.mean(sq, axis=0)
        m3 = np.mean(sq * azm, axis=0)
        m4 = np.mean(sq**2, axis=0)
        zero = m2 <= (np.finfo(m2.dtype).eps * mean_reduced) ** 2
        skew = np.where(zero, np.nan, m3 / m2**1.5)[()]
        kurt = np.where(zero, np.nan, m4 / m2**2.0)[()]
        n = np.asarray(a.shape[0], dtype=np.float64)
        s = _skew_z(skew, n)
        k = _kurtosis_z(kurt, n)
        statistic = s * s + k * k
        return float(special.chdtrc(np.asarray(2.0), statistic))


def _skew_z(b2: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``scipy.stats.skewtest``'s z of the sample skewness ``b2`` of ``n`` scores (n >= 8)."""
    y = b2 * np.sqrt(((n + 1) * (n + 3)) / (6.0 * (n - 2)))
    beta2 = (3.0 * (n**2 + 27 * n - 70) * (n + 1) * (n + 3)
             / ((n - 2.0) * (n + 5) * (n + 7) * (n + 9)))
    w2 = -1 + np.sqrt(2 * (beta2 - 1))
    delta = 1 / np.sqrt(0.5 * np.log(w2))
    alpha = np.sqrt(2.0 / (w2 - 1))
    y = np.where(y == 0, 1.0, y)
    return delta * np.log(y / alpha + np.sqrt((y / alpha) ** 2 + 1))


def _kurtosis_z(b2: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``scipy.stats.kurtosistest``'s z of the sample (Pearson) kurtosis ``b2`` of ``n`` scores."""
    e = 3.0 * (n - 1) / (n + 1)
    varb2 = 24.0 * n * (n - 2) * (n - 3) / ((n + 1) * (n + 1.0) * (n + 3) * (n + 5))
    x = (b2 - e) / varb2**0.5
    sqrtbeta1 = 6.0 * (n * n - 5 * n + 2) / ((n + 7) * (n + 9)) * (
        (6.0 * (n + 3) * (n + 5)) / (n * (n - 2) * (n - 3))) ** 0.5
    big_a = 6.0 + 8.0 / sqrtbeta1 * (2.0 / sqrtbeta1 + (1 + 4.0 / (sqrtbeta1**2)) ** 0.5)
    term1 = 1 - 2 / (9.0 * big_a)
    denom = 1 + x * (2 / (big_a - 4.0)) ** 0.5
    term2 = np.sign(denom) * np.where(denom == 0.0, np.nan,
                                      ((1 - 2.0 / big_a) / np.abs(denom)) ** (1 / 3))
    return (term1 - term2) / (2 / (9.0 * big_a)) ** 0.5


def sorted_median(s: np.ndarray) -> np.float64:
    """``numpy.median`` of an ascending 1-D array, bit for bit, without its partition: the
    middle value, or the mean (``ndarray.mean``, as numpy.median takes it) of the two middle
    ones."""
    n = s.shape[0]
    half = n // 2
    return s[half: half + 1].mean(axis=0) if n % 2 else s[half - 1: half + 1].mean(axis=0)


def _kth_of_two(a: np.ndarray, b: np.ndarray, k: int) -> np.float64:
    """The k-th smallest (0-based) value of two ascending arrays together, by a binary search
    on how many of the k + 1 smallest come from ``a`` (O(log n))."""
    lo, hi = max(0, k + 1 - b.shape[0]), min(k + 1, a.shape[0])
    while lo < hi:
        i = (lo + hi) // 2
        j = k + 1 - i
        if j > 0 and i < a.shape[0] and b[j - 1] > a[i]:
            lo = i + 1  # more of the smallest come from a
        else:
            hi = i
    j = k + 1 - lo
    if lo == 0:
        return b[j - 1]
    return a[lo - 1] if j == 0 else max(a[lo - 1], b[j - 1])


def union_median(a: np.ndarray, b: np.ndarray) -> np.float64:
    """``numpy.median(numpy.concatenate([a, b]))`` of two ascending 1-D arrays (not both
    empty), bit for bit: the middle order statistic of the two together, or the mean of the
    two middle ones, found without concatenating or partitioning."""
    n = a.shape[0] + b.shape[0]
    half = n // 2
    if n % 2:
        return np.asarray([_kth_of_two(a, b, half)]).mean(axis=0)
    return np.asarray([_kth_of_two(a, b, half - 1), _kth_of_two(a, b, half)]).mean(axis=0)


def brown_forsythe_pvalue(x: np.ndarray, y: np.ndarray,
                          medians: tuple[float, float] | None = None) -> float:
    """P-value of the Brown-Forsythe test of equal variances of two samples, as
    ``scipy.stats.levene(x, y, center="median").pvalue``: Levene's W of the absolute
    deviations from each sample's median, against F(1, N - 2).

    Args:
        x, y: ``[k]`` and ``[k']`` float64 scores, finite, 2 or more each.
        medians: their medians when known (``numpy.median``'s values, e.g. from
            :func:`sorted_median` of sorted copies); None: computed here.

    Returns:
        The p-value (NaN where scipy's is NaN, e.g. no spread in either sample).

    Raises:
        ValueError: ``x`` or ``y`` not a 1-D array of at least 2 scores.

    Source: Brown & Forsythe (1974), JASA 69, 364-367; Levene (1960).
    """
    samples = [np.asarray(v, dtype=np.float64) for v in (x, y)]
    for name, v in zip(("x", "y"), samples, strict=True):
        if v.ndim != 1 or v.shape[0] < 2:
            raise ValueError(f"{name} must be 1-D with at least 2 scores, got shape {v.shape}")
    with np.errstate(all="ignore"):
        k = len(samples)
        nis = [v.shape[-1] for v in samples]
        ycis = ([np.median(v, axis=-1, keepdims=True) for v in samples] if medians is None
                else [np.asarray([c], dtype=np.float64) for c in medians])
        ntot = sum(nis)
        zijs = [np.abs(v - yc) for v, yc in zip(samples, ycis, strict=True)]
        zbaris = [np.mean(z, axis=-1, keepdims=True) for z in zijs]
        zbar = sum(ni * zb for ni, zb in zip(nis, zbaris, strict=True)) / ntot
        dfd = ntot - k
        numer = dfd * sum(ni * (zb - zbar) ** 2 for ni, zb in zip(nis, zbaris, strict=True))
        dfn = k - 1.0
        denom = dfn * sum(np.sum((z - zb) ** 2, axis=-1, keepdims=True)
                          for z, zb in zip(zijs, zbaris, strict=True))
        w = np.squeeze(numer / denom, axis=-1)
        p = special.fdtrc(np.asarray(dfn, dtype=w.dtype), np.asarray(dfd, dtype=w.dtype), w)
        return float(p[()])
