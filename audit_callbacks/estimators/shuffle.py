"""Shuffle-model references and the empirical shuffle test (numpy/scipy).

Paper 000 (§2.3 eq. 1, §5 eqs. 5-6, Table 3) and docs/methods/ldp.md, C2 / C4.

The error-count statistics of a distinguishing game (:class:`CountEpsilon`,
:func:`epsilon_from_counts`, :func:`measurable_ceiling`, :func:`paper_measurable_ceiling`) live
in :mod:`audit_callbacks.estimators.error_rates`; they are re-exported here.

Shuffle model (docs/methods/ldp.md, C4, Matsumoto et al. §5)
----------------------------------------
* :func:`shuffle_amplification_bound`: Feldman, McMillan & Talwar (2023) as restated in
  docs/methods/ldp.md, C4 (Matsumoto et al. eq. 1; its plain-text copy lost the square root over (e^eps0 + 1) n):
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
(2, 974) 0.950, (2, 1000) 0.942, (4, 6454) 1.101, (4, 10000) 0.958 (Matsumoto et al.: 0.67, 0.48,
0.95, 0.94, 1.1, 0.96 -- 0.488 rounds to 0.49, the paper prints 0.48); exact epsilon of the dummy
pair 0.203, 0.127, 0.329, 0.323, 0.411, 0.315; population eq.-3 value of the tau test 0.041,
0.027, 0.061, 0.060, 0.073, 0.060 (Matsumoto et al. Table 3 measured 0.07, 0.06, 0.12, 0.11, 0.16,
0.10 with 10 x 1000 trials, where eq. 3's upward small-sample bias dominates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import binom

from ._validation import (
    check_alpha,
    check_count,
    check_delta,
    check_positive_finite,
    check_seed,
)
from .error_rates import (
    CountEpsilon,
    GameStatistics,
    confusion_counts,
    epsilon_from_counts,
    measurable_ceiling,
    paper_measurable_ceiling,
)
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
# Shuffle model (docs/methods/ldp.md, C4)
# --------------------------------------------------------------------------------------------


def _check_eps0(epsilon0: object) -> float:
    return check_positive_finite(epsilon0, "epsilon0")


def min_clients_for_shuffling(epsilon0: float, delta: float) -> int:
    """Smallest n for which the Feldman-McMillan-Talwar (2023) bound is valid.

    n_min = ceil(8 ln(2/delta) (e^eps0 + 1)), equivalently eps0 <= ln(n/(8 ln(2/delta)) - 1)
    (Matsumoto et al. §6.2). 432, 974, 6454 for eps0 = 1, 2, 4 at delta = 1e-6.

    Args:
        epsilon0: local epsilon, > 0, finite (nats).
        delta: in (0, 1).

    Raises:
        ValueError: epsilon0 <= 0 or not finite, delta not in (0, 1).

    Source: docs/methods/ldp.md, C4; Matsumoto et al. §6.2 and Table 3.
    """
    e = _check_eps0(epsilon0)
    d = check_delta(delta)
    return int(math.ceil(8.0 * math.log(2.0 / d) * (math.exp(e) + 1.0) - 1e-9))


def shuffle_amplification_bound(epsilon0: float, n: int, delta: float) -> float:
    """Central epsilon after shuffling n eps0-LDP reports (Feldman, McMillan & Talwar 2023).

    eps = ln(1 + (e^eps0 - 1) (4 sqrt(2 ln(4/delta)) / sqrt((e^eps0 + 1) n) + 4/n)),
    as restated in docs/methods/ldp.md, C4 (Matsumoto et al. eq. 1).

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

    Source: docs/methods/ldp.md, C4; Matsumoto et al. §2.3 eq. 1 and Table 3.
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
    """Log pmfs over k = 0..n of the positive-cosine count under D and D' (docs/methods/ldp.md, C4).

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
    over the n + 1 count outcomes (the count is sufficient; docs/methods/ldp.md, C4).

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
    """Exact epsilon at ``delta`` of shuffling n LDP-SGD reports of the dummy pair (docs/methods/ldp.md, C4).

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

    Source: docs/methods/ldp.md, C4; Matsumoto et al. §5 eq. 5.
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
    """tau = n e^eps0 / (1 + e^eps0) of Matsumoto et al. eq. 6 (expected count under D)."""
    return check_count(n, "n", minimum=1) * _p_keep(_check_eps0(epsilon0))


def shuffle_dummy_test_rates(epsilon0: float, n: int) -> tuple[float, float]:
    """Exact population (FPR, FNR) of the test "guess D iff count >= tau" (Matsumoto et al. eq. 6).

    FPR = P_D(count < tau) (D guessed D'), FNR = P_D'(count >= tau) (D' guessed D), with D in
    the role of b = 1 of docs/methods/ldp.md, C2. Their eq.-3 value is what :func:`shuffle_test` estimates.

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
class ShuffleTestResult(GameStatistics):
    """Outcome of :func:`shuffle_test` (Matsumoto et al. §5, docs/methods/ldp.md, C4).

    Count conventions as docs/methods/ldp.md, C2 with D as b = 1 and D' as b = 2: TN = D guessed D,
    FP = D guessed D', TP = D' guessed D', FN = D' guessed D. The fields of
    :class:`~audit_callbacks.estimators.error_rates.GameStatistics` (``epsilon`` etc. as in
    :class:`CountEpsilon`), then ``alpha``, ``trials``, ``epsilon0``, ``tau`` (the threshold of
    eq. 6), ``n`` (the number of clients) and ``seed``.
    """

    alpha: float
    trials: int
    epsilon0: float
    n: int
    tau: float
    seed: int

    def to_estimate(self) -> Estimate:
        """As :class:`~audit_callbacks.estimators.Estimate` (threat model ``"shuffle"``).

        ``lower``/``upper`` are each one-sided (1 - alpha) bounds, so ``confidence`` is the
        two-sided level 1 - 2 alpha (1 - alpha when the upper bound is infinite and dropped).
        """
        return self._game_estimate(
            n=self.trials, alpha=self.alpha, method="shuffle_dummy_test", threat_model="shuffle"
        )


def shuffle_test(
    epsilon0: float,
    n: int,
    trials: int,
    alpha: float = 0.05,
    seed: int = 0,
    chunk_size: int = 1 << 20,
) -> ShuffleTestResult:
    """Empirical epsilon of the shuffle model for dummy inputs (Matsumoto et al. §5, docs/methods/ldp.md, C4).

    Each trial draws D or D' uniformly, simulates the sufficient count directly
    (Binomial(n, p) under D, Binomial(n - 1, p) + Bernoulli(1 - p) under D',
    p = e^eps0/(1 + e^eps0)), and guesses D iff count >= tau = n p (eq. 6). Counts, rates and
    bounds as :func:`epsilon_from_counts`. O(1) per trial, vectorised over chunks of trials.

    Args:
        epsilon0: local epsilon of LDP-SGD, > 0 (nats).
        n: clients shuffled together, integer >= 1.
        trials: number of games, integer >= 1.
        alpha: in (0, 1) (alpha/2 per rate).
        seed: seed of ``numpy.random.default_rng``, a non-negative integer.
        chunk_size: trials simulated per vectorised chunk.

    Returns:
        :class:`ShuffleTestResult`.

    Raises:
        ValueError: an argument outside its range or of the wrong type (named in the message):
            epsilon0 not finite > 0; n, trials, chunk_size not integers >= 1; alpha not in
            (0, 1); seed not a non-negative integer.
    """
    e = _check_eps0(epsilon0)
    nn = check_count(n, "n", minimum=1)
    k = check_count(trials, "trials", minimum=1)
    a = check_alpha(alpha)
    chunk = check_count(chunk_size, "chunk_size", minimum=1)
    sd = check_seed(seed)
    p = _p_keep(e)
    tau = nn * p
    rng = np.random.default_rng(sd)
    tally = np.zeros(4, dtype=np.int64)  # tp, fn, fp, tn
    done = 0
    while done < k:
        m = min(chunk, k - done)
        is_dprime = rng.random(m) < 0.5
        count = rng.binomial(nn - 1, p, size=m)
        last = rng.random(m) < np.where(is_dprime, 1.0 - p, p)  # the n-th client's sign
        count = count + last
        tally += confusion_counts(is_dprime, count < tau)  # guess D' iff count < tau
        done += m
    ce = epsilon_from_counts(*(int(c) for c in tally), a)
    return ShuffleTestResult(
        **ce.game_fields(), alpha=a, trials=k, epsilon0=e, n=nn, tau=tau, seed=sd
    )
