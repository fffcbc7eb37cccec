"""Shuffle-model references and the error-count epsilon of a distinguishing game (numpy/scipy).

Paper 000 (§2.3 eq. 1, §5 eqs. 5-6, Table 3) and METHODS C2 / C4.

Error-count epsilon (METHODS C2, paper 000 Alg. 2 and eq. 3)
-------------------------------------------------------------
A game of K trials draws b in {1, 2} uniformly, releases M(input_b) and guesses. With the
counts of Alg. 2 (b = 1 plays the null, b = 2 the alternative)

    TN: b = 1 guessed 1,  FP: b = 1 guessed 2,  TP: b = 2 guessed 2,  FN: b = 2 guessed 1,
    FPR = FP / (FP + TN),  FNR = FN / (FN + TP),

the point estimate is eq. 3, eps_hat = max(log((1 - FPR)/FNR), log((1 - FNR)/FPR)) (floored at
0, via :func:`~audit_callbacks.estimators.epsilon_from_error_rates`). Its confident version
(:func:`epsilon_from_counts`):

* lower bound: eq. 3 evaluated at one-sided Clopper-Pearson UPPER bounds FPR_hi, FNR_hi, each at
  level alpha/2. eq. 3 is decreasing in both rates, so on the event {FPR <= FPR_hi and
  FNR <= FNR_hi} the bound is below the test's true eq.-3 value, which is below the mechanism's
  epsilon (Kairouz et al. 2015). The union bound gives that event probability >= 1 - alpha:
  **alpha is split, alpha/2 per rate**, so the lower bound is a valid one-sided (1 - alpha)
  statement. (Using alpha for each rate, as a literal reading of METHODS C2 suggests, would give
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

Paper 000 §4.1 quotes a different ceiling, 5.6 for 1000 trials and 12.5 for 10^6
(METHODS C2): it pools all K trials into one success count, takes the lower end of the
TWO-sided 95% Clopper-Pearson interval at K successes out of K, p_lo = (alpha/2)^(1/K)
(0.99632 for K = 1000), and reads epsilon off p = e^eps/(1 + e^eps):
ceiling = log(p_lo / (1 - p_lo)). :func:`paper_measurable_ceiling` reproduces it. It is the
zero-error value of an accuracy-based bound (accuracy <= e^eps/(1 + e^eps) for a balanced
game), not of the per-rate bound above, which splits the trials into two halves and alpha into
two halves and therefore tops out lower.

Shuffle model (METHODS C4, paper 000 §5)
----------------------------------------
* :func:`shuffle_amplification_bound`: Feldman, McMillan & Talwar (2023) as restated in
  METHODS C4 (paper 000 eq. 1; its plain-text copy lost the square root over (e^eps0 + 1) n):
  eps <= ln(1 + (e^eps0 - 1) (4 sqrt(2 ln(4/delta)) / sqrt((e^eps0 + 1) n) + 4/n)), valid for
  n >= 8 ln(2/delta) (e^eps0 + 1). Below that n it raises ValueError (no silent fallback).
* :func:`min_clients_for_shuffling`: ceil(8 ln(2/delta) (e^eps0 + 1)) (432, 974, 6454 for
  eps0 = 1, 2, 4 at delta = 1e-6).
* Dummy inputs: D = n copies of g1, D' = n - 1 copies and one g2 = -g1. Each LDP-SGD output has a
  positive cosine with g1 w.p. p = e^eps0/(1 + e^eps0) under g1 and 1 - p under g2, and given
  that sign the output direction is uniform on the half-sphere, so the count K of positive
  cosines is sufficient for the shuffled multiset:
  K ~ Binomial(n, p) under D and Binomial(n - 1, p) + Bernoulli(1 - p) under D'.
  :func:`shuffle_dummy_exact_epsilon` is the smallest eps whose hockey-stick divergence in both
  directions, a finite sum over the n + 1 outcomes in the log domain, is <= delta.
* :func:`shuffle_test`: the empirical test of eqs. 5-6, simulated on the sufficient statistic
  (guess D iff K >= tau = n e^eps0/(1 + e^eps0)); :func:`shuffle_dummy_test_rates` gives its
  exact population FPR/FNR.

Reproduced at delta = 1e-6 (tests/test_shuffle.py): bound (1, 432) 0.674, (1, 1000) 0.488,
(2, 974) 0.950, (2, 1000) 0.942, (4, 6454) 1.101, (4, 10000) 0.958 (paper/METHODS: 0.67, 0.48,
0.95, 0.94, 1.1, 0.96 -- 0.488 rounds to 0.49, the paper prints 0.48); exact epsilon of the dummy
pair 0.203, 0.127, 0.329, 0.323, 0.411, 0.315; population eq.-3 value of the tau test 0.041,
0.027, 0.061, 0.060, 0.073, 0.060 (paper 000 Table 3 measured 0.07, 0.06, 0.12, 0.11, 0.16,
0.10 with 10 x 1000 trials, where eq. 3's upward small-sample bias dominates).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import betaincinv, logsumexp
from scipy.stats import binom

from ._validation import check_alpha, check_count, check_delta, check_positive_finite
from .error_rates import epsilon_from_error_rates
from .estimate import Estimate

__all__ = [
    "CountEpsilon",
    "ShuffleTestResult",
    "epsilon_from_counts",
    "measurable_ceiling",
    "paper_measurable_ceiling",
    "min_clients_for_shuffling",
    "shuffle_amplification_bound",
    "shuffle_dummy_count_logpmfs",
    "shuffle_dummy_delta",
    "shuffle_dummy_exact_epsilon",
    "shuffle_dummy_test_rates",
    "shuffle_test",
    "shuffle_threshold",
]


# --------------------------------------------------------------------------------------------
# Error-count epsilon (METHODS C2), shared with audit_callbacks.attacks.ldp_test
# --------------------------------------------------------------------------------------------


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
    """eq. 3 of paper 000 from log rates, floored at 0; inf when a rate is 0 and the other < 1."""
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
class CountEpsilon:
    """Epsilon of a distinguishing game from its four counts (paper 000 Alg. 2 / eq. 3).

    Attributes:
        tp, fn, fp, tn: counts with the conventions of METHODS C2 (b = 2 guessed 2, b = 2
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
        alpha: significance level.
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
    alpha: float

    @property
    def trials(self) -> int:
        return self.tp + self.fn + self.fp + self.tn

    @property
    def counts(self) -> dict[str, int]:
        return {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn}


def epsilon_from_counts(tp: int, fn: int, fp: int, tn: int, alpha: float = 0.05) -> CountEpsilon:
    """Point estimate, confidence bounds and ceiling of eq. 3 of paper 000 from game counts.

    Args:
        tp, fn, fp, tn: non-negative integer counts (conventions of METHODS C2, see module
            docstring); at least one must be positive.
        alpha: in (0, 1); alpha/2 goes to each rate's Clopper-Pearson bound.

    Returns:
        :class:`CountEpsilon` (all values in nats; never NaN).

    Raises:
        ValueError: a count is not a non-negative integer, all counts are 0, alpha not in (0, 1).

    Source: paper 000 Alg. 2 and eq. 3; METHODS C2; Clopper & Pearson (1934).
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
    """Largest lower bound :func:`epsilon_from_counts` can return for ``trials`` trials.

    Zero errors, nominal split n1 = trials // 2, n2 = trials - n1, CP upper bounds at alpha/2:
    u_i = 1 - (alpha/2)^(1/n_i), ceiling = max(log((1 - u1)/u2), log((1 - u2)/u1)).
    4.906 for 1000 trials and 11.817 for 10^6 at alpha = 0.05; 0 for one trial.

    Raises:
        ValueError: trials < 1, alpha not in (0, 1).

    Source: METHODS C2 (ceiling), module docstring for the difference with
    :func:`paper_measurable_ceiling`.
    """
    k = check_count(trials, "trials", minimum=1)
    return _zero_error_bound(k // 2, k - k // 2, check_alpha(alpha))


def paper_measurable_ceiling(trials: int, alpha: float = 0.05) -> float:
    """The ceiling of paper 000 §4.1: logit of the two-sided CP lower end at K successes of K.

    p_lo = (alpha/2)^(1/K) (the lower end of the two-sided (1 - alpha) Clopper-Pearson interval
    for K successes out of K; 0.99632 for K = 1000), ceiling = log(p_lo / (1 - p_lo)):
    5.6006 for K = 1000 and 12.510 for K = 10^6 at alpha = 0.05 (METHODS C2: 5.6 and 12.5).
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


# --------------------------------------------------------------------------------------------
# Shuffle model (METHODS C4)
# --------------------------------------------------------------------------------------------


def _check_eps0(epsilon0: object) -> float:
    return check_positive_finite(epsilon0, "epsilon0")


def min_clients_for_shuffling(epsilon0: float, delta: float) -> int:
    """Smallest n for which the Feldman-McMillan-Talwar (2023) bound is valid.

    n_min = ceil(8 ln(2/delta) (e^eps0 + 1)), equivalently eps0 <= ln(n/(8 ln(2/delta)) - 1)
    (paper 000 §6.2). 432, 974, 6454 for eps0 = 1, 2, 4 at delta = 1e-6.

    Args:
        epsilon0: local epsilon, > 0, finite (nats).
        delta: in (0, 1).

    Raises:
        ValueError: epsilon0 <= 0 or not finite, delta not in (0, 1).

    Source: METHODS C4; paper 000 §6.2 and Table 3.
    """
    e = _check_eps0(epsilon0)
    d = check_delta(delta)
    return int(math.ceil(8.0 * math.log(2.0 / d) * (math.exp(e) + 1.0) - 1e-9))


def shuffle_amplification_bound(epsilon0: float, n: int, delta: float) -> float:
    """Central epsilon after shuffling n eps0-LDP reports (Feldman, McMillan & Talwar 2023).

    eps = ln(1 + (e^eps0 - 1) (4 sqrt(2 ln(4/delta)) / sqrt((e^eps0 + 1) n) + 4/n)),
    as restated in METHODS C4 (paper 000 eq. 1).

    Args:
        epsilon0: local epsilon of each report, > 0, finite (nats).
        n: number of clients (reports shuffled together), integer.
        delta: in (0, 1).

    Returns:
        eps (nats) at ``delta``.

    Raises:
        ValueError: n below the validity condition n >= 8 ln(2/delta)(e^eps0 + 1) (see
            :func:`min_clients_for_shuffling`); the formula is not a guarantee there, so no
            number is returned. Also for invalid epsilon0, n or delta.

    Source: METHODS C4; paper 000 §2.3 eq. 1 and Table 3.
    """
    e = _check_eps0(epsilon0)
    d = check_delta(delta)
    nn = check_count(n, "n", minimum=1)
    n_min = min_clients_for_shuffling(e, d)
    if nn < n_min:
        raise ValueError(
            f"the shuffle bound needs n >= 8 ln(2/delta)(e^eps0 + 1) = {n_min} clients at "
            f"eps0 = {e}, delta = {d}; got n = {nn}"
        )
    inner = 4.0 * math.sqrt(2.0 * math.log(4.0 / d)) / math.sqrt((math.exp(e) + 1.0) * nn)
    return math.log1p(math.expm1(e) * (inner + 4.0 / nn))


def _p_keep(e: float) -> float:
    """p = e^eps0 / (1 + e^eps0), computed stably."""
    return 1.0 / (1.0 + math.exp(-e))


def shuffle_dummy_count_logpmfs(epsilon0: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Log pmfs over k = 0..n of the positive-cosine count under D and D' (METHODS C4).

    D: Binomial(n, p); D': Binomial(n - 1, p) + Bernoulli(1 - p); p = e^eps0/(1 + e^eps0).

    Returns:
        (log_p_d, log_p_dprime), float64 arrays of shape [n + 1] (-inf where the pmf is 0).

    Raises:
        ValueError: epsilon0 not > 0 finite, n < 1.
    """
    e = _check_eps0(epsilon0)
    nn = check_count(n, "n", minimum=1)
    p = _p_keep(e)
    log_p, log_q = -math.log1p(math.exp(-e)), -math.log1p(math.exp(e))  # log p, log(1 - p)
    k = np.arange(nn + 1)
    log_d = binom.logpmf(k, nn, p)
    with np.errstate(divide="ignore"):
        log_dp = np.logaddexp(
            binom.logpmf(k, nn - 1, p) + log_p, binom.logpmf(k - 1, nn - 1, p) + log_q
        )
    return log_d, log_dp


def _log_hockey_stick(log_a: np.ndarray, log_b: np.ndarray, eps: float) -> float:
    """log sum_k max(0, a_k - e^eps b_k), in the log domain (-inf when the sum is 0)."""
    mask = log_a > eps + log_b
    if not np.any(mask):
        return -math.inf
    la, lb = log_a[mask], log_b[mask]
    with np.errstate(divide="ignore"):
        terms = la + np.log(-np.expm1(eps + lb - la))
    return float(logsumexp(terms))


def shuffle_dummy_delta(epsilon0: float, n: int, epsilon: float) -> float:
    """delta(eps) of the dummy pair: the larger hockey-stick divergence of (D, D') and (D', D).

    delta(eps) = max(sum_k max(0, P_D(k) - e^eps P_D'(k)), sum_k max(0, P_D'(k) - e^eps P_D(k)))
    over the n + 1 count outcomes (the count is sufficient; METHODS C4).

    Raises:
        ValueError: invalid epsilon0 or n; epsilon < 0 or not finite.
    """
    log_d, log_dp = shuffle_dummy_count_logpmfs(epsilon0, n)
    eps = float(epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return math.exp(
        max(_log_hockey_stick(log_d, log_dp, eps), _log_hockey_stick(log_dp, log_d, eps))
    )


def shuffle_dummy_exact_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Exact epsilon at ``delta`` of shuffling n LDP-SGD reports of the dummy pair (METHODS C4).

    The smallest eps >= 0 with :func:`shuffle_dummy_delta` (eps) <= delta, found by bisection
    on [0, eps0] to 1e-12 (delta(eps) is non-increasing and delta(eps0) = 0: the pair differs in
    one eps0-LDP report). This is the true epsilon of this pair of datasets, so it lower-bounds
    the shuffle model's worst-case epsilon and sits below :func:`shuffle_amplification_bound`.

    Args:
        epsilon0: local epsilon, > 0 (nats).
        n: clients, integer >= 1.
        delta: in (0, 1).

    Returns:
        eps in [0, eps0] (nats).

    Raises:
        ValueError: invalid arguments.

    Source: METHODS C4; paper 000 §5 eq. 5.
    """
    e = _check_eps0(epsilon0)
    d = check_delta(delta)
    log_d, log_dp = shuffle_dummy_count_logpmfs(e, n)
    log_delta = math.log(d)

    def ok(eps: float) -> bool:
        return (
            max(_log_hockey_stick(log_d, log_dp, eps), _log_hockey_stick(log_dp, log_d, eps))
            <= log_delta
        )

    if ok(0.0):
        return 0.0
    lo, hi = 0.0, e
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def shuffle_threshold(epsilon0: float, n: int) -> float:
    """tau = n e^eps0 / (1 + e^eps0) of paper 000 eq. 6 (expected count under D)."""
    return check_count(n, "n", minimum=1) * _p_keep(_check_eps0(epsilon0))


def shuffle_dummy_test_rates(epsilon0: float, n: int) -> tuple[float, float]:
    """Exact population (FPR, FNR) of the test "guess D iff count >= tau" (paper 000 eq. 6).

    FPR = P_D(count < tau) (D guessed D'), FNR = P_D'(count >= tau) (D' guessed D), with D in
    the role of b = 1 of METHODS C2. Their eq.-3 value is what :func:`shuffle_test` estimates.

    Raises:
        ValueError: invalid epsilon0 or n.
    """
    log_d, log_dp = shuffle_dummy_count_logpmfs(epsilon0, n)
    tau = shuffle_threshold(epsilon0, n)
    guess_d = np.arange(log_d.size) >= tau
    fpr = math.exp(logsumexp(log_d[~guess_d])) if np.any(~guess_d) else 0.0
    fnr = math.exp(logsumexp(log_dp[guess_d])) if np.any(guess_d) else 0.0
    return min(fpr, 1.0), min(fnr, 1.0)


@dataclass(frozen=True)
class ShuffleTestResult:
    """Outcome of :func:`shuffle_test` (paper 000 §5, METHODS C4).

    Count conventions as METHODS C2 with D as b = 1 and D' as b = 2: TN = D guessed D,
    FP = D guessed D', TP = D' guessed D', FN = D' guessed D. ``epsilon`` etc. as in
    :class:`CountEpsilon`; ``tau`` is the threshold of eq. 6, ``n`` the number of clients.
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
    alpha: float
    trials: int
    epsilon0: float
    n: int
    tau: float
    seed: int

    @property
    def counts(self) -> dict[str, int]:
        return {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn}

    def to_estimate(self) -> Estimate:
        """As :class:`~audit_callbacks.estimators.Estimate` (threat model ``"shuffle"``).

        ``lower``/``upper`` are each one-sided (1 - alpha) bounds, so ``confidence`` is the
        two-sided level 1 - 2 alpha (1 - alpha when the upper bound is infinite and dropped).
        """
        upper = self.epsilon_upper_bound if math.isfinite(self.epsilon_upper_bound) else None
        extras: dict[str, Any] = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("epsilon", "epsilon_lower_bound", "trials")
        }
        extras["epsilon_upper_bound"] = upper
        extras["lower_confidence"] = 1.0 - self.alpha
        return Estimate(
            value=self.epsilon,
            lower=self.epsilon_lower_bound,
            upper=upper,
            n=self.trials,
            method="shuffle_dummy_test",
            threat_model="shuffle",
            delta=0.0,
            confidence=1.0 - (2.0 if upper is not None else 1.0) * self.alpha,
            extras=extras,
        )


def shuffle_test(
    epsilon0: float,
    n: int,
    trials: int,
    alpha: float = 0.05,
    seed: int = 0,
    chunk_size: int = 1 << 20,
) -> ShuffleTestResult:
    """Empirical epsilon of the shuffle model for dummy inputs (paper 000 §5, METHODS C4).

    Each trial draws D or D' uniformly, simulates the sufficient count directly
    (Binomial(n, p) under D, Binomial(n - 1, p) + Bernoulli(1 - p) under D',
    p = e^eps0/(1 + e^eps0)), and guesses D iff count >= tau = n p (eq. 6). Counts, rates and
    bounds as :func:`epsilon_from_counts`. O(1) per trial, vectorised over chunks of trials.

    Args:
        epsilon0: local epsilon of LDP-SGD, > 0 (nats).
        n: clients shuffled together, integer >= 1.
        trials: number of games, integer >= 1.
        alpha: in (0, 1) (alpha/2 per rate).
        seed: seed of ``numpy.random.default_rng``.
        chunk_size: trials simulated per vectorised chunk.

    Returns:
        :class:`ShuffleTestResult`.

    Raises:
        ValueError: invalid arguments.
    """
    e = _check_eps0(epsilon0)
    nn = check_count(n, "n", minimum=1)
    k = check_count(trials, "trials", minimum=1)
    a = check_alpha(alpha)
    chunk = check_count(chunk_size, "chunk_size", minimum=1)
    p = _p_keep(e)
    tau = nn * p
    rng = np.random.default_rng(seed)
    tp = fn = fp = tn = 0
    done = 0
    while done < k:
        m = min(chunk, k - done)
        is_dprime = rng.random(m) < 0.5
        count = rng.binomial(nn - 1, p, size=m)
        last = rng.random(m) < np.where(is_dprime, 1.0 - p, p)  # the n-th client's sign
        count = count + last
        guess_d = count >= tau
        fp += int(np.count_nonzero(~is_dprime & ~guess_d))
        tn += int(np.count_nonzero(~is_dprime & guess_d))
        fn += int(np.count_nonzero(is_dprime & guess_d))
        tp += int(np.count_nonzero(is_dprime & ~guess_d))
        done += m
    ce = epsilon_from_counts(tp, fn, fp, tn, a)
    fields = {
        f: getattr(ce, f)
        for f in (
            "tp",
            "fn",
            "fp",
            "tn",
            "fpr",
            "fnr",
            "epsilon",
            "epsilon_capped",
            "epsilon_lower_bound",
            "epsilon_upper_bound",
            "ceiling",
            "alpha",
        )
    }
    return ShuffleTestResult(**fields, trials=k, epsilon0=e, n=nn, tau=tau, seed=int(seed))
