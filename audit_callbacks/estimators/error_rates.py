"""Epsilon implied by the error rates of one membership test.

Any test of an (eps, delta)-DP mechanism satisfies FPR + e^eps FNR >= 1 - delta and
FNR + e^eps FPR >= 1 - delta, so
    eps >= max(log((1 - delta - FPR)/FNR), log((1 - delta - FNR)/FPR)), floored at 0.
Source: Kairouz, Oh & Viswanath (2015); METHODS A6 and C2 (paper 000 Alg. 2, paper 003 §5.1).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ._validation import check_real_finite

__all__ = ["epsilon_from_error_rates", "epsilon_from_error_rates_array"]


def _check_delta0(delta: object) -> float:
    d = check_real_finite(delta, "delta")
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return d


def _eps_from_rates(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
    one = 1.0 - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        num1 = one - fpr
        num2 = one - fnr
        e1 = np.where(num1 > 0, np.log(np.where(num1 > 0, num1, 1.0)) - np.log(fnr), -np.inf)
        e2 = np.where(num2 > 0, np.log(np.where(num2 > 0, num2, 1.0)) - np.log(fpr), -np.inf)
    return np.maximum(np.maximum(e1, e2), 0.0)


def epsilon_from_error_rates(fpr: float, fnr: float, delta: float = 0.0) -> float:
    """Epsilon lower bound implied by a test's false-positive and false-negative rates.

    eps = max(log((1 - delta - fpr)/fnr), log((1 - delta - fnr)/fpr)), floored at 0; a term
    whose numerator is <= 0 is ignored.

    Args:
        fpr: false-positive rate in [0, 1] (null declared member).
        fnr: false-negative rate in [0, 1] (member declared null).
        delta: delta in [0, 1) (default 0: pure-DP reading).

    Returns:
        eps >= 0 in nats. Returns ``math.inf`` when a rate is exactly 0 while the other term's
        numerator is positive (the test is perfect on one side: no finite eps explains it).
        This is the only estimator in the package that can return inf; it never returns NaN.

    Raises:
        ValueError: a rate outside [0, 1] or not finite, delta outside [0, 1).

    Source: METHODS A6 / C2; paper 000 Alg. 2; Kairouz et al. (2015) Thm 2.1.
    """
    f = check_real_finite(fpr, "fpr")
    n = check_real_finite(fnr, "fnr")
    if not (0.0 <= f <= 1.0 and 0.0 <= n <= 1.0):
        raise ValueError(f"fpr and fnr must be in [0, 1], got fpr={fpr!r}, fnr={fnr!r}")
    d = _check_delta0(delta)
    v = float(_eps_from_rates(np.float64(f), np.float64(n), d))
    return math.inf if math.isinf(v) else v


def epsilon_from_error_rates_array(
    fpr: ArrayLike, fnr: ArrayLike, delta: float = 0.0
) -> np.ndarray:
    """Vectorised :func:`epsilon_from_error_rates` (fpr and fnr broadcast together).

    Returns:
        array of the broadcast shape, values in [0, inf] (inf as in the scalar version).

    Raises:
        ValueError: NaN/inf or values outside [0, 1] in fpr or fnr; delta outside [0, 1).
    """
    f = np.asarray(fpr, dtype=float)
    n = np.asarray(fnr, dtype=float)
    for name, arr in (("fpr", f), ("fnr", n)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
        if np.any(arr < 0.0) or np.any(arr > 1.0):
            raise ValueError(f"{name} must be in [0, 1]")
    d = _check_delta0(delta)
    f, n = np.broadcast_arrays(f, n)
    return np.asarray(_eps_from_rates(f, n, d), dtype=float)
