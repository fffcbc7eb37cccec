"""Epsilon implied by the error rates of one membership test, and by the counts of a game.

Any test of an (eps, delta)-DP mechanism satisfies FPR + e^eps FNR >= 1 - delta and
FNR + e^eps FPR >= 1 - delta, so
    eps >= max(log((1 - delta - FPR)/FNR), log((1 - delta - FNR)/FPR)), floored at 0.
Source: Kairouz, Oh & Viswanath (2015); docs/methods/canaries.md, A6 and C2 (Matsumoto et al. Alg. 2, Andrew et al. 2024 §5.1).

Error-count epsilon (docs/methods/ldp.md, C2, Matsumoto et al. Alg. 2 and eq. 3)
-------------------------------------------------------------
A game of K trials draws b in {1, 2} uniformly, releases M(input_b) and guesses. With the
counts of Alg. 2 (b = 1 plays the null, b = 2 the alternative)

    TN: b = 1 guessed 1,  FP: b = 1 guessed 2,  TP: b = 2 guessed 2,  FN: b = 2 guessed 1,
    FPR = FP / (FP + TN),  FNR = FN / (FN + TP),

the point estimate is eq. 3, eps_hat = max(log((1 - FPR)/FNR), log((1 - FNR)/FPR)) (floored at
0, via :func:`epsilon_from_error_rates`). Its confident version
(:func:`epsilon_from_counts`):

* lower bound: eq. 3 evaluated at one-sided Clopper-Pearson UPPER bounds FPR_hi, FNR_hi, each at
  level alpha/2. eq. 3 is decreasing in both rates, so on the event {FPR <= FPR_hi and
  FNR <= FNR_hi} the bound is below the test's true eq.-3 value, which is below the mechanism's
  epsilon (Kairouz et al. 2015). The union bound gives that event probability >= 1 - alpha:
  **alpha is split, alpha/2 per rate**, so the lower bound is a valid one-sided (1 - alpha)
  statement. (Using alpha for each rate, as a literal reading of docs/methods/ldp.md, C2 suggests, would give
  only 1 - 2 alpha.)
* upper bound (of the test's own eq.-3 value, not of the mechanism's epsilon): eq. 3 at the
  one-sided Clopper-Pearson LOWER bounds at alpha/2 each; infinite when FP = 0 or FN = 0.
* ceiling: the lower bound the game could show with zero errors, i.e. the value above with
  FP = FN = 0 and the realised group sizes n1 = FP + TN, n2 = FN + TP:
  u_i = 1 - (alpha/2)^(1/n_i), ceiling = max(log((1 - u1)/u2), log((1 - u2)/u1)).
  :func:`measurable_ceiling` evaluates it for the nominal split n1 = K//2, n2 = K - K//2:
  4.91 for K = 1000 and 11.82 for K = 10^6 at alpha = 0.05.
* When a rate is 0 the point estimate is infinite; it is then reported as the ceiling with
  ``epsilon_capped = True`` (never inf, never NaN).

Matsumoto et al. (§4.1) quote a different ceiling, 5.6 for 1000 trials and 12.5 for 10^6
(docs/methods/ldp.md, C2): it pools all K trials into one success count, takes the lower end of the
TWO-sided 95% Clopper-Pearson interval at K successes out of K, p_lo = (alpha/2)^(1/K)
(0.99632 for K = 1000), and reads epsilon off p = e^eps/(1 + e^eps):
ceiling = log(p_lo / (1 - p_lo)). :func:`paper_measurable_ceiling` reproduces it. It is the
zero-error value of an accuracy-based bound (accuracy <= e^eps/(1 + e^eps) for a balanced
game), not of the per-rate bound above, which splits the trials into two halves and alpha into
two halves and therefore tops out lower.


The distinguishing games of the package (the empirical eps0 test of
:mod:`audit_callbacks.attacks.ldp_test`, the shuffle test of
:mod:`audit_callbacks.estimators.shuffle`) count their outcomes with :func:`confusion_counts`,
turn the counts into statistics with :func:`epsilon_from_counts`, and report them in result
types that extend :class:`GameStatistics`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betaincinv

from ..names import EPSILON_LOWER_BOUND
from ..validation import as_float_array, check_alpha, check_count, check_real_finite
from .result import AuditResult

__all__ = [
    "CountEpsilon",
    "GameStatistics",
    "confusion_counts",
    "epsilon_from_counts",
    "epsilon_from_error_rates",
    "epsilon_from_error_rates_array",
    "measurable_ceiling",
    "paper_measurable_ceiling",
]


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

    Source: docs/methods/canaries.md, A6 / C2; Matsumoto et al. Alg. 2; Kairouz et al. (2015) Thm 2.1.
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
        ValueError: NaN/inf, booleans, complex numbers or values outside [0, 1] in fpr or fnr
            (tensors of any float dtype are converted); shapes that do not broadcast; delta
            outside [0, 1).
    """
    f = as_float_array(fpr, "fpr", allow_int=True)
    n = as_float_array(fnr, "fnr", allow_int=True)
    for name, arr in (("fpr", f), ("fnr", n)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
        if np.any(arr < 0.0) or np.any(arr > 1.0):
            raise ValueError(f"{name} must be in [0, 1]")
    d = _check_delta0(delta)
    try:
        f, n = np.broadcast_arrays(f, n)
    except ValueError:
        raise ValueError(
            f"fpr and fnr must broadcast together, got shapes {f.shape} and {n.shape}"
        ) from None
    return np.asarray(_eps_from_rates(f, n, d), dtype=float)


# --------------------------------------------------------------------------------------------
# Error-count epsilon of a distinguishing game (docs/methods/ldp.md, C2; Matsumoto et al. Alg. 2, eq. 3)
# --------------------------------------------------------------------------------------------


def confusion_counts(b_is_2: ArrayLike, guess_is_2: ArrayLike) -> tuple[int, int, int, int]:
    """(TP, FN, FP, TN) of a game's trials with the conventions of docs/methods/ldp.md, C2.

    TP: b = 2 guessed 2, FN: b = 2 guessed 1, FP: b = 1 guessed 2, TN: b = 1 guessed 1
    (b = 1 plays the null).

    Args:
        b_is_2: bool array [K], True where the trial released input 2.
        guess_is_2: bool array [K] (same shape), True where the test guessed input 2.

    Returns:
        (tp, fn, fp, tn) as Python ints summing to K.

    Raises:
        ValueError: the arrays are not boolean or their shapes differ.

    Source: Matsumoto et al. Alg. 2; docs/methods/ldp.md, C2.
    """
    b2, g2 = np.asarray(b_is_2), np.asarray(guess_is_2)
    if b2.dtype != np.bool_ or g2.dtype != np.bool_:
        raise ValueError(f"b_is_2 and guess_is_2 must be boolean, got {b2.dtype} and {g2.dtype}")
    if b2.shape != g2.shape:
        raise ValueError(f"b_is_2 and guess_is_2 differ in shape: {b2.shape} vs {g2.shape}")
    tp = int(np.count_nonzero(b2 & g2))
    fn = int(np.count_nonzero(b2 & ~g2))
    fp = int(np.count_nonzero(~b2 & g2))
    return tp, fn, fp, int(b2.size) - tp - fn - fp


def _log_cp_upper(k: int, n: int, q: float) -> tuple[float, float]:
    """(log U, log(1 - U)) for the one-sided CP upper bound U = Beta(k+1, n-k).ppf(1 - q).

    U = 1 at k = n (log(1 - U) = -inf); an empty group (n = 0) carries no information: U = 1.
    1 - U is computed as Beta(n-k, k+1).ppf(q) without cancellation.
    """
    if n == 0 or k >= n:
        return 0.0, -math.inf
    u = float(betaincinv(k + 1.0, float(n - k), 1.0 - q))
    one_m_u = float(betaincinv(float(n - k), k + 1.0, q))
    return math.log(u), math.log(one_m_u)


def _log_cp_lower(k: int, n: int, q: float) -> tuple[float, float]:
    """(log l, log(1 - l)) for the one-sided CP lower bound l = Beta(k, n-k+1).ppf(q).

    l = 0 at k = 0 or n = 0 (log l = -inf).
    """
    if n == 0 or k <= 0:
        return -math.inf, 0.0
    lo = float(betaincinv(float(k), n - k + 1.0, q))
    one_m_lo = float(betaincinv(n - k + 1.0, float(k), 1.0 - q))
    return math.log(lo), math.log(one_m_lo)


def _eq3_log(log_fpr: float, log_1m_fpr: float, log_fnr: float, log_1m_fnr: float) -> float:
    """eq. 3 of Matsumoto et al. from log rates, floored at 0; inf when a rate is 0 and the other < 1."""
    terms = []
    for num, den in ((log_1m_fpr, log_fnr), (log_1m_fnr, log_fpr)):
        if num == -math.inf:
            continue  # numerator 0: the term is -inf (or 0/0), ignored as in error_rates.py
        terms.append(math.inf if den == -math.inf else num - den)
    return max([0.0, *terms])


def _zero_error_bound(n1: int, n2: int, alpha: float) -> float:
    q = alpha / 2.0
    lf, l1f = _log_cp_upper(0, n1, q)
    ln, l1n = _log_cp_upper(0, n2, q)
    return _eq3_log(lf, l1f, ln, l1n)


@dataclass(frozen=True)
class GameStatistics:
    """Counts, rates and eq.-3 statistics of a distinguishing game (Matsumoto et al. Alg. 2 / eq. 3).

    The fields every game result of the package shares (:class:`CountEpsilon`,
    ``audit_callbacks.attacks.LDPTestResult``, ``audit_callbacks.estimators.shuffle.
    ShuffleTestResult`` extend it with their own fields after these).

    Attributes:
        tp, fn, fp, tn: counts with the conventions of docs/methods/ldp.md, C2 (b = 2 guessed 2, b = 2
            guessed 1, b = 1 guessed 2, b = 1 guessed 1).
        fpr: FP / (FP + TN), or ``None`` when no trial had b = 1.
        fnr: FN / (FN + TP), or ``None`` when no trial had b = 2.
        epsilon: eq. 3 point estimate in nats, finite: capped at ``ceiling`` when a rate is 0
            (then ``epsilon_capped``), 0.0 when a group is empty.
        epsilon_capped: True when the uncapped point estimate was infinite.
        epsilon_lower_bound: one-sided (1 - alpha) lower bound (CP upper bounds at alpha/2 per
            rate, union bound), >= 0.
        epsilon_upper_bound: one-sided (1 - alpha) upper bound of the game's own eq.-3 value (CP
            lower bounds at alpha/2 per rate); ``math.inf`` when FP = 0 or FN = 0.
        ceiling: the lower bound the same group sizes would give with zero errors.
    """

    tp: int
    fn: int
    fp: int
    tn: int
    fpr: float | None
    fnr: float | None
    epsilon: float
    epsilon_capped: bool
    epsilon_lower_bound: float
    epsilon_upper_bound: float
    ceiling: float

    @property
    def counts(self) -> dict[str, int]:
        return {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn}

    def game_fields(self) -> dict[str, Any]:
        """The :class:`GameStatistics` fields only, as a dict (to build a subclass from)."""
        return {f.name: getattr(self, f.name) for f in fields(GameStatistics)}

    def _game_estimate(
        self, *, n: int, alpha: float, method: str, threat_model: str, source: str = "",
        **extras: Any
    ) -> AuditResult:
        """As an :class:`AuditResult` at delta 0: ``value`` = ``epsilon``, ``lower`` =
        ``epsilon_lower_bound``, ``upper`` = ``epsilon_upper_bound`` (``None`` when infinite).

        Each end is a one-sided (1 - alpha) bound, so the result's ``alpha`` is that of the
        two-sided interval, 2 alpha (alpha when ``upper`` is ``None``);
        ``details["lower_confidence"]`` = 1 - alpha. Every other field (``trials`` aside) goes to
        ``details`` with the threat model and ``extras``; ``counts["n"]`` = ``n``.
        """
        upper = self.epsilon_upper_bound if math.isfinite(self.epsilon_upper_bound) else None
        more = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("epsilon", EPSILON_LOWER_BOUND, "trials")
        }
        more["epsilon_upper_bound"] = upper
        more["lower_confidence"] = 1.0 - alpha
        more.update(extras)
        return AuditResult(
            value=self.epsilon,
            lower=self.epsilon_lower_bound,
            upper=upper,
            alpha=(2.0 if upper is not None else 1.0) * alpha,
            delta=0.0,
            method=method,
            source=source,
            counts={"n": int(n)},
            details={**more, "threat_model": threat_model},
        )


@dataclass(frozen=True)
class CountEpsilon(GameStatistics):
    """Epsilon of a distinguishing game from its four counts (Matsumoto et al. Alg. 2 / eq. 3).

    Attributes: those of :class:`GameStatistics`, and
        alpha: significance level.
    """

    alpha: float

    @property
    def trials(self) -> int:
        return self.tp + self.fn + self.fp + self.tn


def epsilon_from_counts(tp: int, fn: int, fp: int, tn: int, alpha: float = 0.05) -> CountEpsilon:
    """Point estimate, confidence bounds and ceiling of eq. 3 of Matsumoto et al. from game counts.

    Args:
        tp, fn, fp, tn: non-negative integer counts (conventions of docs/methods/ldp.md, C2, see module
            docstring); at least one must be positive.
        alpha: in (0, 1); alpha/2 goes to each rate's Clopper-Pearson bound.

    Returns:
        :class:`CountEpsilon` (all values in nats; never NaN).

    Raises:
        ValueError: a count is not a non-negative integer, all counts are 0, alpha not in (0, 1).

    Source: Matsumoto et al. Alg. 2 and eq. 3; docs/methods/ldp.md, C2; Clopper & Pearson (1934).
    """
    tp_, fn_, fp_, tn_ = (
        check_count(c, name) for c, name in ((tp, "tp"), (fn, "fn"), (fp, "fp"), (tn, "tn"))
    )
    a = check_alpha(alpha)
    n1, n2 = fp_ + tn_, fn_ + tp_
    if n1 + n2 == 0:
        raise ValueError("at least one trial is needed (all counts are 0)")
    fpr = fp_ / n1 if n1 else None
    fnr = fn_ / n2 if n2 else None
    ceiling = _zero_error_bound(n1, n2, a)

    if fpr is None or fnr is None:
        point, capped = 0.0, False
    else:
        point = epsilon_from_error_rates(fpr, fnr)
        capped = math.isinf(point)
        if capped:
            point = ceiling

    q = a / 2.0
    lo = _eq3_log(*_log_cp_upper(fp_, n1, q), *_log_cp_upper(fn_, n2, q))
    hi = _eq3_log(*_log_cp_lower(fp_, n1, q), *_log_cp_lower(fn_, n2, q))
    return CountEpsilon(
        tp=tp_,
        fn=fn_,
        fp=fp_,
        tn=tn_,
        fpr=fpr,
        fnr=fnr,
        epsilon=float(point),
        epsilon_capped=bool(capped),
        epsilon_lower_bound=float(lo),
        epsilon_upper_bound=float(hi),
        ceiling=float(ceiling),
        alpha=a,
    )


def measurable_ceiling(trials: int, alpha: float = 0.05) -> float:
    """Largest lower bound :func:`epsilon_from_counts` can return for ``trials`` trials split evenly.

    A game that splits its trials at random has the ceiling of its realised group sizes
    (:attr:`CountEpsilon.ceiling`), a little above this one when the split is uneven (5.630 against
    5.601 for 970 / 1030 of 2000 trials): this is a planning figure, not a bound on every result.
    Zero errors, nominal split n1 = trials // 2, n2 = trials - n1, CP upper bounds at alpha/2:
    u_i = 1 - (alpha/2)^(1/n_i), ceiling = max(log((1 - u1)/u2), log((1 - u2)/u1)).
    4.906 for 1000 trials and 11.817 for 10^6 at alpha = 0.05; 0 for one trial.

    Raises:
        ValueError: trials < 1, alpha not in (0, 1).

    Source: docs/methods/ldp.md, C2 (ceiling), module docstring for the difference with
    :func:`paper_measurable_ceiling`.
    """
    k = check_count(trials, "trials", minimum=1)
    return _zero_error_bound(k // 2, k - k // 2, check_alpha(alpha))


def paper_measurable_ceiling(trials: int, alpha: float = 0.05) -> float:
    """The ceiling of Matsumoto et al. §4.1: logit of the two-sided CP lower end at K successes of K.

    p_lo = (alpha/2)^(1/K) (the lower end of the two-sided (1 - alpha) Clopper-Pearson interval
    for K successes out of K; 0.99632 for K = 1000), ceiling = log(p_lo / (1 - p_lo)):
    5.6006 for K = 1000 and 12.510 for K = 10^6 at alpha = 0.05 (docs/methods/ldp.md, C2: 5.6 and 12.5).
    It pools both kinds of trial into one success count (an accuracy-based bound), so it is
    higher than :func:`measurable_ceiling`, the ceiling of the per-rate bound this package
    reports.

    Raises:
        ValueError: trials < 1, alpha not in (0, 1).
    """
    k = check_count(trials, "trials", minimum=1)
    a = check_alpha(alpha)
    log_p = math.log(a / 2.0) / k
    return log_p - math.log(-math.expm1(log_p))
