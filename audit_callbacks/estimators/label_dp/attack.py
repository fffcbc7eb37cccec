"""The probability that the last-layer label attack outputs a given label (K classes).

The attack of Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong DP-SGD Lower
Bounds for Label Privacy", §3 eq. (1) and Alg. 3, generalised to K outputs
(docs/methods/label_dp_multiclass.md): the statistic of example r is a Gaussian K-vector
a_r ~ N(m_r, tau_r^2 I_K) and the attack outputs argmin_k a_r[k]. With the standardised gaps
d_k = (m_k - m_y) / tau of the competitors k != y to the target label y,

    P(argmin = y) = integral phi(z) prod_{k != y} Phi(d_k + z) dz,                        (3)

computed here by the trapezoid rule in the log domain around the mode of the (log-concave)
integrand; the rule converges geometrically for this entire integrand and the tests check it
against :func:`scipy.integrate.quad` to 1e-8 (relative). With one competitor (K = 2) the
integral is Phi(d / sqrt 2) exactly (the difference of two independent N(., 1) coordinates),
which is the binary closed form of Yuan et al. Alg. 2; it is evaluated in closed form.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import erfcx, log_ndtr, logsumexp

from audit_callbacks.validation import as_float_array, to_numpy

__all__ = [
    "argmin_attack_success_probability",
    "attack_success_log_prob",
    "log_prob_argmin",
    "standardized_gaps",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_D_MAX = 1e300  # |gaps| are clamped here: beyond, P is 0 or 1 to double precision (log_prob_argmin)
_TAIL = 8.0  # the integrand is below exp(-TAIL^2 / 2) of its mode beyond +-TAIL (curvature >= 1)
_STEP = 0.7  # trapezoid step in units of the mode's width 1 / sqrt(-h''(z*))


def _mills(u: np.ndarray) -> np.ndarray:
    """phi(u) / Phi(u) = sqrt(2 / pi) / erfcx(-u / sqrt 2), stable for every u (no cancellation
    of -u^2 / 2 against log Phi(u) for very negative u; 0 for very positive u)."""
    return _SQRT_2_OVER_PI / erfcx(-u / math.sqrt(2.0))


def _curvature_term(u: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """lambda (u + lambda) = -d lambda / du, in (0, 1) (one minus the variance of a normal
    truncated above at u); clipped there, since u + lambda cancels for very negative u."""
    return np.clip(lam * (u + lam), 0.0, 1.0)


def log_prob_argmin(d: np.ndarray) -> np.ndarray:
    """log P(argmin = y) = log integral phi(z) prod_k Phi(d_k + z) dz for rows d [M, K - 1].

    d_k = (m_k - m_y) / tau (standardised gaps of the competitors to the target class). K = 2
    (one competitor): log Phi(d / sqrt 2), exact. K > 2: the log-domain trapezoid rule around
    the mode z* of the log-integrand h(z) = log phi(z) + sum_k log Phi(d_k + z), which is
    concave with h'' <= -1 (accurate to 1e-8 relative); the grid has at most about 12 sqrt(K)
    points per row whatever the gaps.

    Infinite gaps are limits (a vanishing sd): a competitor at d_k = +inf never wins
    (Phi = 1), one at d_k = -inf always does (P = 0, log P = -inf). Finite gaps beyond
    +-1e300 are clamped there (P is then 0 or 1 to double precision). The result is finite
    except -inf where a gap is -inf or so negative (below about -1e154) that log P itself
    overflows; never NaN for d without NaN.

    Raises:
        ValueError: ``d`` is not 2-D.
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 2:
        raise ValueError(f"d must be 2-D [M, K - 1], got shape {d.shape}")
    if d.shape[1] == 0:
        return np.zeros(d.shape[0])
    lost = np.isneginf(d).any(axis=1)  # a competitor surely below the target: P = 0
    d = np.clip(np.where(lost[:, None], 0.0, d), -_D_MAX, _D_MAX)
    if d.shape[1] == 1:  # a_y < a_k iff N(0, 2) > -(m_k - m_y) / tau
        return np.where(lost, -np.inf, log_ndtr(d[:, 0] / math.sqrt(2.0)))
    with np.errstate(over="ignore"):  # squares of gaps beyond ~1e154: log P = -inf, exactly
        out = _log_prob_argmin_quadrature(d)
    return np.where(lost, -np.inf, out)


def _log_prob_argmin_quadrature(d: np.ndarray) -> np.ndarray:
    """The trapezoid rule of :func:`log_prob_argmin` for finite d [M, K - 1], K > 2."""
    z = np.zeros(d.shape[0])
    for _ in range(100):  # Newton on the concave h, from z = 0
        u = d + z[:, None]
        lam = _mills(u)
        grad = -z + lam.sum(axis=1)
        curv = 1.0 + _curvature_term(u, lam).sum(axis=1)
        step = grad / curv
        z = z + step
        if float(np.max(np.abs(step))) < 1e-12 * max(1.0, float(np.max(np.abs(z)))):
            break
    u = d + z[:, None]
    lam = _mills(u)
    width = 1.0 / np.sqrt(1.0 + _curvature_term(u, lam).sum(axis=1))  # [M], in [1 / sqrt K, 1]
    # Left of the mode the curvature only grows (-lambda' decreases in u), so TAIL widths hold
    # all but exp(-TAIL^2 / 2) of the mass on the left; on the right the curvature may fall to 1
    # (h'' <= -1 always), so the grid runs to z* + TAIL. One grid of step STEP * width per row.
    h = _STEP * width
    j = np.arange(-int(math.ceil(_TAIL / _STEP)), int(math.ceil(_TAIL / float(h.min()))) + 1, dtype=float)
    grid = z[:, None] + h[:, None] * j[None, :]
    inside = (j[None, :] * h[:, None]) <= _TAIL
    logf = -0.5 * grid * grid - _LOG_SQRT_2PI
    for k in range(d.shape[1]):
        logf = logf + log_ndtr(d[:, k : k + 1] + grid)
    logf = np.where(inside, logf, -np.inf)
    return logsumexp(logf, axis=1) + np.log(h)


def standardized_gaps(means: np.ndarray, target: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """[M, K - 1] standardised gaps (m_k - m_target) / sd over k != target.

    Args:
        means: [M, K] means of the statistic. target: [M] int labels. sd: [M] > 0.
    """
    m, k = means.shape
    keep = np.ones((m, k), dtype=bool)
    keep[np.arange(m), target] = False
    with np.errstate(over="ignore"):  # a vanishing sd: +-inf gaps, limits log_prob_argmin handles
        diff = (means - means[np.arange(m), target][:, None]) / sd[:, None]
    return diff[keep].reshape(m, k - 1)


def attack_success_log_prob(means: np.ndarray, target: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """log P(argmin_k (means[r] + sd_r * noise)[k] = target[r]) for each row r (eq. (3)); inputs
    already checked (see :func:`argmin_attack_success_probability` for the checked form)."""
    return log_prob_argmin(standardized_gaps(means, target, sd))


def argmin_attack_success_probability(means: ArrayLike, labels: ArrayLike, sd: ArrayLike) -> np.ndarray:
    """P(argmin_k a_r[k] = labels[r]) for a_r ~ N(means[r], sd_r^2 I_K), one per row.

    The success probability of the K-class last-layer label attack (docs/methods/
    label_dp_multiclass.md eq. (3)): the one-dimensional integral
    integral phi(z) prod_{k != y} Phi((m_k - m_y) / sd + z) dz, by quadrature (1e-8 relative;
    exact for K = 2).

    Args:
        means: [M, K] means of the attack statistic (K >= 2). labels: [M] integers in 0..K-1.
        sd: [M] (or scalar) standard deviations, finite and > 0. Any positive sd is valid, down
            to the smallest subnormal (5e-324): as sd -> 0 the attack is almost surely right,
            so the probability tends to 1 when ``labels[r]`` is the only smallest mean, to 0
            when another class has a strictly smaller mean, and to 1 / t among t tied smallest
            means; a tiny sd gives these limits (to double precision), never NaN.

    Returns:
        float64 [M] probabilities in [0, 1] (finite).

    Raises:
        ValueError: shapes inconsistent, labels out of range, sd <= 0, NaN/inf.
    """
    m = as_float_array(means, "means")
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 2 or not np.isfinite(m).all():
        raise ValueError(f"means must be a finite [M, K] array with K >= 2, got shape {m.shape}")
    y = to_numpy(labels, "labels").reshape(-1)
    if y.shape[0] != m.shape[0] or (y != np.round(y)).any() or (y < 0).any() or (y >= m.shape[1]).any():
        raise ValueError(f"labels must be [{m.shape[0]}] integers in 0..{m.shape[1] - 1}")
    s = np.broadcast_to(as_float_array(sd, "sd", allow_int=True), (m.shape[0],))
    if not np.isfinite(s).all() or (s <= 0).any():
        raise ValueError("sd must be finite and > 0")
    return np.exp(attack_success_log_prob(m, y.astype(np.int64), s))
