"""Exact null distribution of the cosine between a random unit canary and an independent vector.

For c uniform on the unit sphere of R^d and any vector v independent of c (v != 0),
t = cos(c, v) has density proportional to (1 - t^2)^((d-3)/2) on [-1, 1]; equivalently
(1 + t)/2 ~ Beta((d-1)/2, (d-1)/2). Mean 0, variance 1/d.

Source: Andrew et al. 2024 Theorem 3.1 and Lemma A.1; docs/methods/canaries.md, A1.

CDF and survival function use the regularized incomplete beta function
(:func:`scipy.special.betainc`) on the side of the tail being asked for, with the symmetry
I_x(a, a) = 1 - I_{1-x}(a, a): sf(t) = I_{(1-t)/2}(a, a), cdf(t) = I_{(1+t)/2}(a, a). Both are
therefore accurate to relative precision far into their tails, for d up to
:data:`T_IDENTITY_DIM`; beyond, where betainc's large-parameter evaluation degrades, the sf
is the Student-t cdf of T sqrt(d - 1) / sqrt(1 - T^2), which is exactly t-distributed with
d - 1 degrees of freedom (:func:`scipy.special.stdtr`). Log versions switch, below
1e-280 where betainc would underflow, to an asymptotic expansion (integration by parts, three
terms), so log-tail probabilities stay finite and accurate (relative error < 1e-7 at the
switch, smaller beyond) for thresholds hundreds of null sds out.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betainc, betaln, stdtr

from ..validation import as_float_array, check_dim, check_size, make_rng

__all__ = [
    "cosine_null_cdf",
    "cosine_null_sf",
    "cosine_null_logsf",
    "cosine_null_logcdf",
    "cosine_null_sample",
]

_SWITCH = 1e-280


def _check_t(t: ArrayLike) -> np.ndarray:
    arr = as_float_array(t, "t", allow_int=True)
    if not np.all(np.isfinite(arr)):
        raise ValueError("t contains NaN or inf")
    return arr


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if x.ndim == 0 else x


#: Above this dimension scipy's ``betainc(a, a, x)`` loses accuracy (relative error ~1e-4 at
#: d = 1e12, ~1e-2 at 1e14, order 1 at 1e16, measured against the normal limit); the sf is then
#: taken from the exact Student-t identity T sqrt(d - 1) / sqrt(1 - T^2) ~ t_(d-1)
#: (:func:`scipy.special.stdtr`; within 1e-9 of the normal limit's own O(1/d) there).
T_IDENTITY_DIM = 10**11


def _sf_raw(t: np.ndarray, d: int) -> np.ndarray:
    if d > T_IDENTITY_DIM:
        tt = np.clip(t, -1.0, 1.0)
        with np.errstate(divide="ignore"):  # t = +-1: w = +-inf, sf 0 or 1
            w = tt * np.sqrt(d - 1.0) / np.sqrt((1.0 - tt) * (1.0 + tt))
        return stdtr(d - 1.0, -w)
    a = 0.5 * (d - 1)
    x = np.clip(0.5 * (1.0 - t), 0.0, 1.0)  # (1-t)/2 is exact for t near 1
    return betainc(a, a, x)


def cosine_null_sf(t: ArrayLike, dim: int) -> float | np.ndarray:
    """P(T > t) under the cosine null in dimension dim.

    Args:
        t: threshold(s), any shape; values outside [-1, 1] give 1 (t < -1) or 0 (t > 1).
            Arrays or tensors of any real dtype (float16/bfloat16, requires_grad, any device).
        dim: dimension d >= 2 of the sphere (number of model parameters).

    Returns:
        float for a scalar t, else an array of t's shape, in [0, 1].

    Raises:
        ValueError: t contains NaN/inf, booleans or complex numbers, or dim is not an
            integer >= 2.

    Source: Andrew et al. 2024 Thm 3.1; docs/methods/canaries.md, A1. Uses sf(t) = I_{(1-t)/2}((d-1)/2, (d-1)/2).
    """
    d = check_dim(dim)
    return _out(_sf_raw(_check_t(t), d))


def cosine_null_cdf(t: ArrayLike, dim: int) -> float | np.ndarray:
    """P(T <= t) under the cosine null in dimension dim (= sf(-t) by symmetry).

    Args:
        t: threshold(s), any shape.
        dim: dimension d >= 2.

    Returns:
        float for a scalar t, else an array of t's shape, in [0, 1].

    Raises:
        ValueError: t contains NaN/inf, booleans or complex numbers, or dim is not an
            integer >= 2.

    Source: Andrew et al. 2024 Thm 3.1; docs/methods/canaries.md, A1. Uses cdf(t) = I_{(1+t)/2}((d-1)/2, (d-1)/2).
    """
    d = check_dim(dim)
    return _out(_sf_raw(-_check_t(t), d))


def logsf_unchecked(t: np.ndarray, d: int) -> np.ndarray:
    """:func:`cosine_null_logsf` without its input checks, for the estimators' inner loops
    (``t`` any shape of floats in [-1, 1], ``d >= 2``; same shape out)."""
    shape = np.shape(t)
    t = np.atleast_1d(np.asarray(t, dtype=float))
    sf = _sf_raw(t, d)
    with np.errstate(divide="ignore"):
        out = np.log(sf)
    tail = (sf < _SWITCH) & (t > 0.0) & (t < 1.0)
    if np.any(tail):
        tt = t[tail]
        a = 0.5 * (d - 1)
        m1 = a  # m + 1 with m = (d - 3)/2
        # density of t: (1 - t^2)^m / (2^(d-2) B(a, a));
        # with u = (1 - t^2)/t^2, integrating by parts three times:
        # integral_t^1 (1-s^2)^m ds = (1-t^2)^(m+1) / (2 (m+1) t)
        #     * [1 - u/(2 (m+2)) + 3 u^2/(4 (m+2)(m+3)) - O((u/m)^3)]  (alternating series)
        log_c = -(d - 2) * np.log(2.0) - betaln(a, a)
        log1m_t2 = np.log1p(-tt) + np.log1p(tt)
        one_m_t2 = (1.0 - tt) * (1.0 + tt)
        u = one_m_t2 / (tt * tt)
        corr = np.log1p(-u / (2.0 * (m1 + 1.0)) + 3.0 * u * u / (4.0 * (m1 + 1.0) * (m1 + 2.0)))
        out[tail] = log_c + m1 * log1m_t2 - np.log(2.0 * m1 * tt) + corr
    out = np.where(t >= 1.0, -np.inf, out)
    return out.reshape(shape)


def cosine_null_logsf(t: ArrayLike, dim: int) -> float | np.ndarray:
    """log P(T > t) under the cosine null, finite for every t < 1 (no underflow to -inf).

    Args:
        t: threshold(s), any shape.
        dim: dimension d >= 2.

    Returns:
        float or array of t's shape, in [-inf, 0]; -inf only for t >= 1.

    Raises:
        ValueError: t contains NaN/inf, booleans or complex numbers, or dim is not an
            integer >= 2.

    Source: docs/methods/canaries.md, A1. log(betainc) where sf >= 1e-280; below, the two-term asymptotic
    expansion of the upper tail (integration by parts of (1 - s^2)^((d-3)/2)), whose relative
    error is O((u/d)^3), u = (1 - t^2)/t^2 (< 1e-7 wherever it is used).
    """
    d = check_dim(dim)
    return _out(logsf_unchecked(_check_t(t), d))


def cosine_null_logcdf(t: ArrayLike, dim: int) -> float | np.ndarray:
    """log P(T <= t) under the cosine null (= logsf(-t) by symmetry); see :func:`cosine_null_logsf`.

    Raises:
        ValueError: t contains NaN/inf, booleans or complex numbers, or dim is not an
            integer >= 2.
    """
    d = check_dim(dim)
    return _out(logsf_unchecked(-_check_t(t), d))


def cosine_null_sample(
    rng: np.random.Generator | int | None, dim: int, size: int | tuple[int, ...]
) -> np.ndarray:
    """Exact draws of the cosine null: 2 B - 1 with B ~ Beta((d-1)/2, (d-1)/2).

    Args:
        rng: a numpy Generator (seeded by the caller), a non-negative integer seed for
            :func:`numpy.random.default_rng`, or None for a fresh unseeded generator (draws
            that differ from call to call: pass a Generator or a seed for reproducible ones).
        dim: dimension d >= 2.
        size: output shape (a non-negative integer or a tuple of them).

    Returns:
        array of the given shape with values in [-1, 1].

    Raises:
        ValueError: dim is not an integer >= 2; rng is not a Generator, a seed or None; size
            is not a shape.

    Source: docs/methods/canaries.md, A1.
    """
    d = check_dim(dim)
    gen = make_rng(rng)
    shape = check_size(size)
    a = 0.5 * (d - 1)
    return 2.0 * gen.beta(a, a, size=shape if isinstance(size, (tuple, list)) else shape[0]) - 1.0
