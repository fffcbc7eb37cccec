"""Shuffle-model references and the empirical shuffle test (numpy/scipy).

Matsumoto, Takahashi, Liew & Oguchi, "Measuring Local and Shuffled Privacy of Gradient Randomized
Response" (§2.3 eq. 1, §5 eqs. 5-6, Table 3), and docs/methods/ldp.md, C2 / C4.

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

Reproduced at delta = 1e-6 (tests/estimators/test_shuffle.py): bound (1, 432) 0.674, (1, 1000) 0.488,
(2, 974) 0.950, (2, 1000) 0.942, (4, 6454) 1.101, (4, 10000) 0.958 (Matsumoto et al.: 0.67, 0.48,
0.95, 0.94, 1.1, 0.96 -- 0.488 rounds to 0.49, the paper prints 0.48); exact epsilon of the dummy
pair 0.203, 0.127, 0.329, 0.323, 0.411, 0.315; population eq.-3 value of the tau test 0.041,
0.027, 0.061, 0.060, 0.073, 0.060 (Matsumoto et al. Table 3 measured 0.07, 0.06, 0.12, 0.11, 0.16,
0.10 with 10 x 1000 trials, where eq. 3's upward small-sample bias dominates).
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from ..validation import (
    check_alpha,
    check_count,
    check_delta,
    check_positive_finite,
    check_real,
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
from .result import AuditResult

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


def _log_8_ln_2_over_delta(d: float) -> float:
    """log(8 ln(2/delta)), without forming 2/delta (which overflows for delta < 1e-308)."""
    return math.log(8.0 * (math.log(2.0) - math.log(d)))


def _log_min_clients(e: float, d: float) -> float:
    """log(8 ln(2/delta) (e^eps0 + 1)), finite for every finite eps0 and delta in (0, 1)."""
    return _log_8_ln_2_over_delta(d) + e + math.log1p(math.exp(-e))


# Above this eps0 the client count has more than 3,900 decimal digits; Python refuses to print
# integers beyond 4,300 digits, and no population is that large.
_MAX_EPS0_CLIENT_COUNT = 9000.0


def _min_clients(e: float, d: float) -> int:
    """ceil(8 ln(2/delta) (e^eps0 + 1)) for validated arguments (see min_clients_for_shuffling)."""
    if e <= 700.0:
        x = 8.0 * (math.log(2.0) - math.log(d)) * (math.exp(e) + 1.0)
        if math.isfinite(x):
            return int(math.ceil(x - 1e-9))
    if e > _MAX_EPS0_CLIENT_COUNT:
        raise ValueError(
            f"epsilon0 = {e!r} needs about e^{_log_min_clients(e, d):.6g} clients for the shuffle "
            f"bound, a count with more than 3,900 digits; min_clients_for_shuffling answers for "
            f"epsilon0 <= {_MAX_EPS0_CLIENT_COUNT:g}"
        )
    # e^eps0 overflows a float: the same formula in 40-digit decimal arithmetic, rounded up
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        ctx.Emax = decimal.MAX_EMAX
        x = decimal.Decimal(8.0 * (math.log(2.0) - math.log(d))) * (decimal.Decimal(e).exp() + 1)
        return int(x.to_integral_value(rounding=decimal.ROUND_CEILING))


def _show_int(x: int) -> str:
    """An integer for a message: in full below 1e30, else as 10^(its log10)."""
    return f"{x}" if x < 10**30 else f"10^{math.log10(x):.6f}"


def min_clients_for_shuffling(epsilon0: float, delta: float) -> int:
    """Smallest n for which the Feldman-McMillan-Talwar (2023) bound is valid.

    n_min = ceil(8 ln(2/delta) (e^eps0 + 1)), equivalently eps0 <= ln(n/(8 ln(2/delta)) - 1)
    (Matsumoto et al. §6.2). 432, 974, 6454 for eps0 = 1, 2, 4 at delta = 1e-6.

    Large epsilon0 and tiny delta are valid: when e^eps0 overflows a float (eps0 above about
    709.78), n_min (above 1e308) is computed in 40-digit decimal arithmetic and rounded up, so
    the integer returned is never below the exact threshold; delta down to 5e-324 is resolved
    (ln(2/delta) is formed as ln 2 - ln delta).

    Args:
        epsilon0: local epsilon, > 0, finite (nats); at most 9000 (beyond, n_min has more than
            3,900 digits).
        delta: in (0, 1).

    Raises:
        ValueError: epsilon0 <= 0, not finite or above 9000; delta not in (0, 1).

    Source: docs/methods/ldp.md, C4; Matsumoto et al. §6.2 and Table 3.
    """
    return _min_clients(_check_eps0(epsilon0), check_delta(delta))


def shuffle_amplification_bound(epsilon0: float, n: int, delta: float) -> float:
    """Central epsilon after shuffling n eps0-LDP reports (Feldman, McMillan & Talwar 2023).

    eps = ln(1 + (e^eps0 - 1) (4 sqrt(2 ln(4/delta)) / sqrt((e^eps0 + 1) n) + 4/n)),
    as restated in docs/methods/ldp.md, C4 (Matsumoto et al. eq. 1).

    Every finite epsilon0 > 0, any integer n and delta down to 5e-324 give a finite answer:
    beyond eps0 = 300 or n = 1e15 the same formula is evaluated in the log domain (e^eps0 and n
    are never formed as floats). Such an epsilon0 needs n above e^eps0 clients to be valid.

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
    log_n_min = _log_min_clients(e, d)
    if e <= _MAX_EPS0_CLIENT_COUNT:
        n_min = _min_clients(e, d)
        too_few, shown = nn < n_min, _show_int(n_min)
    else:
        too_few, shown = math.log(nn) < log_n_min, f"e^{log_n_min:.6g}"
    if too_few:
        raise ValueError(
            f"the shuffle bound needs n >= 8 ln(2/delta)(e^eps0 + 1) = {shown} clients at "
            f"eps0 = {e}, delta = {d}; got n = {_show_int(nn)}"
        )
    log_4_over_d = math.log(4.0) - math.log(d)
    if e <= 300.0 and nn <= 10**15:
        inner = 4.0 * math.sqrt(2.0 * log_4_over_d) / math.sqrt((math.exp(e) + 1.0) * nn)
        return math.log1p(math.expm1(e) * (inner + 4.0 / nn))
    # log domain: log(e^eps0 - 1), log(e^eps0 + 1) and log n stay finite
    log_em1 = e + math.log1p(-math.exp(-e)) if e > 1.0 else math.log(math.expm1(e))
    log_ep1 = e + math.log1p(math.exp(-e))
    log_n = math.log(nn)
    t1 = math.log(4.0 * math.sqrt(2.0 * log_4_over_d)) + log_em1 - 0.5 * (log_ep1 + log_n)
    t2 = math.log(4.0) + log_em1 - log_n
    lg = float(np.logaddexp(t1, t2))
    return lg + math.log1p(math.exp(-lg)) if lg > 0 else math.log1p(math.exp(lg))


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
    # log p and log(1 - p), finite for every finite eps0 (1 - p is never formed from p)
    log_p, log_q = -math.log1p(math.exp(-e)), -(e + math.log1p(math.exp(-e)))
    k = np.arange(nn + 1)
    log_d = _log_binom_pmf(k, nn, log_p, log_q)
    log_dp = np.logaddexp(
        _log_binom_pmf(k, nn - 1, log_p, log_q) + log_p,
        _log_binom_pmf(k - 1, nn - 1, log_p, log_q) + log_q,
    )
    return log_d, log_dp


def _log_binom_pmf(k: np.ndarray, n: int, log_p: float, log_q: float) -> np.ndarray:
    """log Binomial(n, p) pmf at k from log p and log(1 - p) (-inf outside 0..n)."""
    out = np.full(k.shape, -math.inf)
    ok = (k >= 0) & (k <= n)
    kk = k[ok].astype(np.float64)
    out[ok] = (
        gammaln(n + 1.0) - gammaln(kk + 1.0) - gammaln(n - kk + 1.0)
        + kk * log_p + (n - kk) * log_q
    )
    return out


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
    eps = check_real(epsilon, "epsilon", low=0.0)
    return math.exp(
        max(_log_hockey_stick(log_d, log_dp, eps), _log_hockey_stick(log_dp, log_d, eps))
    )


def shuffle_dummy_exact_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Exact epsilon at ``delta`` of shuffling n LDP-SGD reports of the dummy pair (docs/methods/ldp.md, C4).

    The smallest eps >= 0 with :func:`shuffle_dummy_delta` (eps) <= delta, found by bisection
    on [0, eps0] to 1e-12 (relative to eps0 above eps0 = 1; delta(eps) is non-increasing and
    delta(eps0) = 0: the pair differs in one eps0-LDP report). Every finite eps0 > 0 is
    answered (the count pmfs are built from log p and log(1 - p), never from e^eps0), and delta
    down to 5e-324. This is the true epsilon of this pair of datasets, so it lower-bounds
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
    while hi - lo > 1e-12 * max(1.0, hi):  # relative beyond eps0 = 1: any finite eps0 ends
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

    def to_estimate(self) -> AuditResult:
        """As an :class:`~audit_callbacks.estimators.AuditResult` (threat model ``"shuffle"``).

        ``lower``/``upper`` are each one-sided (1 - alpha) bounds, so the result's ``alpha`` is
        2 alpha (alpha when the upper bound is infinite and dropped).
        """
        return self._game_estimate(
            n=self.trials, alpha=self.alpha, method="shuffle_dummy_test", threat_model="shuffle",
            source="docs/methods/ldp.md, C4: the shuffle model's dummy-pair test (Feldman, "
                   "McMillan, Talwar 2021 amplification bound)",
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
