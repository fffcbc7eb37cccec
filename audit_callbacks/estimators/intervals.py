"""Binomial confidence intervals (Clopper-Pearson, Jeffreys) via scipy.stats.beta quantiles.

For k successes out of n trials at level alpha:

* Clopper-Pearson (exact, conservative): two-sided
  [Beta(k, n-k+1).ppf(alpha/2), Beta(k+1, n-k).ppf(1-alpha/2)], lower = 0 at k = 0 and
  upper = 1 at k = n; one-sided bounds use alpha instead of alpha/2.
  Source: Clopper & Pearson (1934); docs/methods/ldp.md, C2 (the confident eps0 test).
* Jeffreys (Bayesian with the Beta(1/2, 1/2) prior, close to nominal coverage):
  two-sided [Beta(k+1/2, n-k+1/2).ppf(alpha/2), .ppf(1-alpha/2)] with the boundary
  convention of Brown, Cai & DasGupta (2001): lower = 0 at k = 0, upper = 1 at k = n.
  The one-sided upper bound is Beta(k+1/2, n-k+1/2).ppf(1-alpha) exactly as docs/methods/canaries.md, A6 and
  Andrew et al. 2024 §5.1 (following Zanella-Beguelin et al. 2022) use it for FNR_hi, with no boundary
  modification (at k = n it is < 1).

The ``*_upper`` functions accept array-like k (vectorised over k) and return a float for a
scalar k.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import beta as beta_dist

from ..validation import check_alpha, check_count, to_numpy

__all__ = [
    "clopper_pearson_interval",
    "clopper_pearson_upper",
    "clopper_pearson_lower",
    "jeffreys_interval",
    "jeffreys_upper",
    "jeffreys_lower",
]


def _check_kn(k: ArrayLike, n: int) -> tuple[np.ndarray, int]:
    nn = check_count(n, "n", minimum=1)
    karr = to_numpy(k, "k")
    if karr.dtype == bool or not (
        np.issubdtype(karr.dtype, np.integer) or np.issubdtype(karr.dtype, np.floating)
    ):
        raise ValueError(f"k must be an integer count, got {k!r}")
    kf = karr.astype(float)
    if not np.all(np.isfinite(kf)) or np.any(kf != np.round(kf)):
        raise ValueError(f"k must be integer counts, got {k!r}")
    if np.any(kf < 0) or np.any(kf > nn):
        raise ValueError(f"k must satisfy 0 <= k <= n = {nn}, got {k!r}")
    return kf, nn


def _out(x: np.ndarray) -> float | np.ndarray:
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


def beta_upper_quantile(k: np.ndarray, n: int, q: float) -> np.ndarray:
    """Beta(k+1, n-k).ppf(q), 1 at k = n: the Clopper-Pearson upper end at level q, without
    input checks (``k`` an array of counts in 0..n)."""
    full = k >= n
    b = np.where(full, 1.0, n - k)
    return np.where(full, 1.0, beta_dist.ppf(q, k + 1.0, b))


def beta_lower_quantile(k: np.ndarray, n: int, q: float) -> np.ndarray:
    """Beta(k, n-k+1).ppf(q), 0 at k = 0: the Clopper-Pearson lower end at level q, without
    input checks."""
    empty = k <= 0
    a = np.where(empty, 1.0, k)
    return np.where(empty, 0.0, beta_dist.ppf(q, a, n - k + 1.0))


def clopper_pearson_interval(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval for a binomial proportion.

    Args:
        k: number of successes, integer in [0, n].
        n: number of trials, integer >= 1.
        alpha: 1 - confidence level, in (0, 1) (0.05 for a 95% interval).

    Returns:
        (lower, upper) in [0, 1]; lower = 0 at k = 0, upper = 1 at k = n.
        At k = 0 the upper end is 1 - (alpha/2)^(1/n).

    Raises:
        ValueError: k, n not integer counts with 0 <= k <= n, n >= 1; alpha not in (0, 1).

    Source: Clopper & Pearson (1934), via scipy.stats.beta.ppf.
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    if kf.ndim != 0:
        raise ValueError("k must be a scalar count")
    return float(beta_lower_quantile(kf, nn, a / 2)), float(beta_upper_quantile(kf, nn, 1.0 - a / 2))


def clopper_pearson_upper(k: ArrayLike, n: int, alpha: float) -> float | np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson upper bound: Beta(k+1, n-k).ppf(1-alpha), 1 at k=n.

    Args:
        k: successes, integer(s) in [0, n] (scalar or array).
        n: trials, integer >= 1.
        alpha: in (0, 1).

    Returns:
        float (scalar k) or array of k's shape, in (0, 1].

    Raises:
        ValueError: invalid k, n or alpha.

    Source: Clopper & Pearson (1934); Jagielski et al. (2020) use it for FPR/FNR bounds.
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    return _out(beta_upper_quantile(kf, nn, 1.0 - a))


def clopper_pearson_lower(k: ArrayLike, n: int, alpha: float) -> float | np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson lower bound: Beta(k, n-k+1).ppf(alpha), 0 at k=0.

    Raises:
        ValueError: invalid k, n or alpha.
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    return _out(beta_lower_quantile(kf, nn, a))


def jeffreys_interval(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Jeffreys interval for a binomial proportion.

    [Beta(k+1/2, n-k+1/2).ppf(alpha/2), Beta(k+1/2, n-k+1/2).ppf(1-alpha/2)], with lower = 0 at
    k = 0 and upper = 1 at k = n (Brown, Cai & DasGupta 2001, §4.1.2).

    Args:
        k: successes, integer in [0, n].
        n: trials, integer >= 1.
        alpha: in (0, 1).

    Returns:
        (lower, upper) in [0, 1].

    Raises:
        ValueError: invalid k, n or alpha.

    Source: Brown, Cai & DasGupta (2001); Andrew et al. 2024 §5.1 (after Zanella-Beguelin et al. 2022).
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    if kf.ndim != 0:
        raise ValueError("k must be a scalar count")
    lo = 0.0 if kf == 0 else float(beta_dist.ppf(a / 2, kf + 0.5, nn - kf + 0.5))
    hi = 1.0 if kf == nn else float(beta_dist.ppf(1.0 - a / 2, kf + 0.5, nn - kf + 0.5))
    return lo, hi


def jeffreys_upper(k: ArrayLike, n: int, alpha: float) -> float | np.ndarray:
    """One-sided (1 - alpha) Jeffreys upper bound: Beta(k + 1/2, n - k + 1/2).ppf(1 - alpha).

    No boundary modification (at k = n the bound is < 1), exactly as docs/methods/canaries.md, A6 / Andrew et al. 2024 use
    it for FNR_hi.

    Args:
        k: successes, integer(s) in [0, n] (scalar or array).
        n: trials, integer >= 1.
        alpha: in (0, 1).

    Returns:
        float (scalar k) or array of k's shape, in (0, 1).

    Raises:
        ValueError: invalid k, n or alpha.

    Source: docs/methods/canaries.md, A6; Andrew et al. 2024 §5.1.
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    return _out(beta_dist.ppf(1.0 - a, kf + 0.5, nn - kf + 0.5))


def jeffreys_lower(k: ArrayLike, n: int, alpha: float) -> float | np.ndarray:
    """One-sided (1 - alpha) Jeffreys lower bound: Beta(k + 1/2, n - k + 1/2).ppf(alpha).

    Raises:
        ValueError: invalid k, n or alpha.
    """
    kf, nn = _check_kn(k, n)
    a = check_alpha(alpha)
    return _out(beta_dist.ppf(a, kf + 0.5, nn - kf + 0.5))
