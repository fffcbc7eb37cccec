"""The tightest valid lower bound on epsilon, and lower-bound series that stay valid when watched.

Three valid (1 - a) lower bounds on epsilon are computed from the same canary scores
(:class:`~audit_callbacks.estimators.score_auditor.CanaryScoreAuditor`):

* ``"clopper_pearson"``: Clopper-Pearson bounds on FNR and FPR at T thresholds fixed by
  (k, k'), Bonferroni over them (Jagielski, Ullman, Oprea 2020; Kairouz, Oh, Viswanath 2015);
* ``"one_run"``: the binomial tail of Steinke, Nasr, Jagielski (2023), NeurIPS 2023, Thm 3.1 /
  Thm 5.2;
* ``"one_run_fdp"``: the f-DP recursion of Mahloujifar, Melis, Chaudhuri (2024),
  arXiv:2410.22235, §4, with the Gaussian trade-off family.

:func:`tightest_valid_lower_bound` runs each of the M methods at a / M; by the union bound all M
bounds hold together with probability >= 1 - a, so their maximum is a valid (1 - a) bound.

**Which mechanisms.** "clopper_pearson" and "one_run" hold for any (eps, delta)-DP mechanism;
they are the default (:data:`DEFAULT_METHODS`). "one_run_fdp" rejects "the mechanism is mu-GDP"
and reports the epsilon of the largest rejected mu at delta; that is a bound on the mechanism's
epsilon only when its trade-off curve is Gaussian-shaped (at least Phi(Phi^-1(1 - x) - mu) for
the mu whose epsilon at delta is the mechanism's): the Gaussian mechanism and its compositions
(DP-FedAvg's canaries with the rounds known), and, close to it, DP-SGD's subsampled Gaussian
over many steps (Dong, Roth, Su 2022, §3: the central limit theorem of composition; §5:
noisy SGD). For randomized response at true epsilon 4 (k = k' = 1000, delta = 1e-5) it
exceeds the truth in nearly every data set (``tests/estimators/test_valid_bounds.py``).
The canary audits of the Gaussian mechanisms opt in to it.
:func:`tightest_valid_lower_bounds` gives several such bounds (each the number it has alone)
with one f-DP search for all of them, as a canary report needs for its two threat models.

**Where the one-run bounds are valid.** Steinke et al. assume a pool of m canaries each
included independently with probability 1/2. With ``inclusion="coins"`` the caller states that
the in/out split was drawn that way, and the one-run bounds use all k + k' scores. With
``inclusion="fixed"`` (the default: k and k' were fixed in advance) the fair coins are emulated:
m is fixed by (k, k') (:func:`one_run_pool_size`), K ~ Binomial(m, 1/2) is drawn from ``seed``,
and the pool is K in-scores and m - K out-scores picked uniformly at random without replacement.
The pool's labels are then exactly independent fair coins (a binomial count placed uniformly),
and for exchangeable canaries whose scores are independent given their labels the pool is
distributed as Steinke et al.'s experiment. When K > k or m - K > k' (probability <=
:data:`POOL_FAILURE`) the pool cannot be formed and both one-run bounds are 0, which never
exceeds the truth, so this costs power with that probability but no level.

:func:`spent_alpha` and :func:`watched_lower_bound` make the *maximum over a logged series* of
bounds valid: the i-th logged point (1-based) is a (1 - alpha / (i (i + 1))) bound; since
sum_{i >= 1} 1 / (i (i + 1)) = 1 (telescoping), the union bound gives
P[some point exceeds the truth] <= alpha for any number of points and any dependence between
them (nested data, the same seed), so the series maximum is a (1 - alpha) bound.

Formulas, sources and measured coverage: ``docs/methods/score_auditor.md`` §9-10. Pure
numpy/scipy.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from ..validation import check_alpha, check_choice, check_count, check_real, check_seed
from .gaussian import gaussian_epsilon_array
from .one_run import (
    SRC_MAHLOUJIFAR,
    SRC_STEINKE,
    fdp_mu,
    guess_counts,
    one_run_epsilon,
    pure_dp_epsilon,
)
from .result import AuditResult
from .score_auditor import SRC_CP, CanaryScoreAuditor

__all__ = [
    "DEFAULT_METHODS",
    "METHODS",
    "POOL_FAILURE",
    "one_run_pool_size",
    "check_bound_arguments",
    "spent_alpha",
    "tightest_valid_lower_bound",
    "tightest_valid_lower_bounds",
    "valid_bound_values",
    "watched_lower_bound",
]

#: The valid lower bounds :func:`tightest_valid_lower_bound` can combine.
METHODS = ("clopper_pearson", "one_run", "one_run_fdp")
#: The default: the bounds valid whatever the mechanism ("one_run_fdp" assumes a Gaussian-shaped
#: trade-off curve; see the module docstring).
DEFAULT_METHODS = ("clopper_pearson", "one_run")
#: Probability that the emulated fair-coin pool (``inclusion="fixed"``) cannot be formed.
POOL_FAILURE = 1e-3

SRC_TIGHTEST = (
    "Bonferroni (union bound) over valid lower bounds, each at alpha / M: " + SRC_CP + "; "
    + SRC_STEINKE + "; " + SRC_MAHLOUJIFAR
)
SRC_SPENDING = (
    "union bound (Boole's inequality) over the logged points with alpha_i = alpha / (i (i + 1)), "
    "sum_i alpha_i = alpha; alpha spending as in Lan & DeMets (1983), Discrete sequential "
    "boundaries for clinical trials, Biometrika 70(3)"
)

_INCLUSION = ("fixed", "coins")


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------


def _check_methods(methods: object) -> tuple[str, ...]:
    """A non-empty sequence of distinct names from :data:`METHODS` (a lone string refused)."""
    if isinstance(methods, str) or not isinstance(methods, Sequence) or len(methods) == 0:
        raise ValueError(
            f"methods must be a non-empty tuple of names from {METHODS}, got {methods!r}"
        )
    out = tuple(check_choice(m, "methods", METHODS) for m in methods)
    if len(set(out)) != len(out):
        raise ValueError(f"methods must not repeat a name, got {methods!r}")
    return out


def _check_delta(delta: object, methods: tuple[str, ...]) -> float:
    """delta in [0, 1), or (0, 1) when the f-DP bound (mu-GDP to (eps, delta)) is asked for."""
    d = check_real(delta, "delta")
    if not 0.0 <= d < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if d == 0.0 and "one_run_fdp" in methods:
        raise ValueError(
            "delta must be in (0, 1) when methods include 'one_run_fdp' (a mu-GDP bound has "
            "no finite epsilon at delta = 0); got delta=0"
        )
    return d


# --------------------------------------------------------------------------------------------
# the emulated fair-coin pool
# --------------------------------------------------------------------------------------------


def _pool_failure(m: int, k_in: int, k_out: int) -> float:
    """P[K > k_in] + P[m - K > k_out], K ~ Binomial(m, 1/2)."""
    return float(stats.binom.sf(k_in, m, 0.5) + stats.binom.sf(k_out, m, 0.5))


def one_run_pool_size(k_in: int, k_out: int, failure: float = POOL_FAILURE) -> int:
    """Size m of the emulated fair-coin pool of ``inclusion="fixed"``.

    The largest m <= k_in + k_out with P[K > k_in] + P[m - K > k_out] <= ``failure`` for
    K ~ Binomial(m, 1/2) (both terms grow with m; integer bisection). Every m <= min(k_in,
    k_out) qualifies, so m >= min(k_in, k_out). For k = k' = 500 (1000) and failure 1e-3,
    m = 902 (1859).

    Args:
        k_in, k_out: numbers of in- and out-scores (integers >= 0).
        failure: allowed probability that the pool cannot be formed, in (0, 1).

    Returns:
        m (int >= 0).

    Raises:
        ValueError: k_in or k_out not a non-negative integer; failure not in (0, 1).
    """
    return _pool_size(check_count(k_in, "k_in"), check_count(k_out, "k_out"),
                      check_alpha(failure, "failure"))


@functools.lru_cache(maxsize=4096)
def _pool_size(ki: int, ko: int, f: float) -> int:
    """:func:`one_run_pool_size` of checked arguments (cached: a series repeats sizes)."""
    lo, hi = min(ki, ko), ki + ko  # lo qualifies (failure 0)
    if _pool_failure(hi, ki, ko) <= f:
        return hi
    while hi - lo > 1:  # invariant: lo qualifies, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _pool_failure(mid, ki, ko) <= f else (lo, mid)
    return lo


def _pool(
    x: np.ndarray, y: np.ndarray, seed: int, inclusion: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(in-pool, out-pool, info): all scores for "coins"; the emulated pool for "fixed"."""
    if inclusion == "coins":
        return x, y, {"m": x.size + y.size, "k_in": x.size, "k_out": y.size, "feasible": True}
    m = one_run_pool_size(x.size, y.size, POOL_FAILURE)
    rng = np.random.default_rng([seed, 1])  # a stream apart from the tie-breaking key's
    k = int(rng.binomial(m, 0.5))
    info: dict[str, Any] = {"m": m, "k_in": k, "k_out": m - k,
                            "feasible": k <= x.size and m - k <= y.size,
                            "failure_probability": float(POOL_FAILURE)}
    if not info["feasible"]:
        return x[:0], y[:0], info
    xi = x[rng.choice(x.size, size=k, replace=False)]
    yo = y[rng.choice(y.size, size=m - k, replace=False)]
    return xi, yo, info


def _one_run_best(
    pools: list[tuple[np.ndarray, np.ndarray]], levels: Sequence[float], delta: float, fdp: bool,
    seeds: Sequence[int],
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Best one-run bound of each pool (the methods' computation, lanes of all pools at once):
    candidate rules of :func:`guess_counts` (ties ordered by the pool's seed), each at the
    pool's level / C; 0 for pools under 2 canaries. Every pool's value is the one it has alone
    (the lanes are independent; :func:`fdp_mu` keeps each group's maximum and argmax)."""
    n_l, v_l, m_l, lv_l, owner, rules = [], [], [], [], [], []
    for i, (xi, yo) in enumerate(pools):
        m = xi.size + yo.size
        if m < 2:
            rules.append(None)
            continue
        n, v, nt, nb = guess_counts(xi, yo, seeds[i])
        n_l.append(n)
        v_l.append(v)
        m_l.append(np.full(n.size, float(m)))
        lv_l.append(np.full(n.size, levels[i] / n.size))
        owner.append(np.full(n.size, i))
        rules.append((n, v, nt, nb))
    best = np.zeros(len(pools))
    info: list[dict[str, Any]] = [{} for _ in pools]
    if not n_l:
        return best, info
    n, v, m, lv = (np.concatenate(a) for a in (n_l, v_l, m_l, lv_l))
    own = np.concatenate(owner)
    val = fdp_mu(n, v, m, lv, groups=own) if fdp else _one_run_pruned(n, v, m, lv, delta, own)
    starts = np.flatnonzero(np.r_[True, own[1:] != own[:-1]])
    for s, e in zip(starts, np.r_[starts[1:], own.size], strict=True):
        i = int(own[s])
        j = int(np.argmax(val[s:e]))
        nn, vv, nt, nb = rules[i]
        best[i] = val[s + j]
        info[i] = {"guesses": int(nn[j]), "correct": int(vv[j]), "guess_in": int(nt[j]),
                   "guess_out": int(nb[j]), "candidates": int(nn.size)}
        if fdp:
            info[i]["mu_lower"] = float(val[s + j])
    if fdp:
        best = np.where(best > 0, gaussian_epsilon_array(best, delta), 0.0)
    return best, info


def _one_run_pruned(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, delta: float,
    owner: np.ndarray,
) -> np.ndarray:
    """:func:`one_run_epsilon` per lane where a lane can be its group's maximum, 0 elsewhere:
    the maximum of each group (``owner``) and its argmax are those of :func:`one_run_epsilon`.

    The delta = 0 bound eps0 = logit(q0), I_{q0}(v, n - v + 1) = level (P[B >= v] under
    Binomial(n, q0) equals the level), bounds each lane's eps from above (the delta term only
    raises the p-value). Round 1 computes, per group, the lane of largest eps0; round 2 the
    lanes whose eps0 still exceeds their group's best; the others (eps <= eps0 <= best, best
    > 0 since eps0 > 0 with its margin) are set to 0."""
    eps0 = pure_dp_epsilon(n, v, level)
    eps0 = eps0 + 1e-7 * (1.0 + eps0)  # margin over the rounding of betaincinv
    out = np.full(n.size, -1.0)
    order = np.lexsort((-eps0, owner))  # by group, largest eps0 first
    first = order[np.r_[True, owner[order][1:] != owner[order][:-1]]]
    out[first] = one_run_epsilon(n[first], v[first], m[first], level[first], delta)
    groups, inv = np.unique(owner, return_inverse=True)
    best = np.full(groups.size, -1.0)
    np.maximum.at(best, inv, out)
    todo = np.flatnonzero((out < 0) & (eps0 > best[inv]))
    if todo.size:
        out[todo] = one_run_epsilon(n[todo], v[todo], m[todo], level[todo], delta)
        np.maximum.at(best, inv, out)
    out[out < 0] = 0.0  # pruned: eps <= eps0 <= the group's best > 0, never its argmax
    return out


def _evaluate(
    auditors: list[CanaryScoreAuditor], levels: Sequence[float], delta: float,
    methods: tuple[str, ...], seeds: Sequence[int], inclusion: str,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """[N, M] values of every method, data set i at ``levels[i]`` (a / M) with ``seeds[i]``,
    and per data set the details of each."""
    vals = np.zeros((len(auditors), len(methods)))
    info: list[dict[str, Any]] = [{} for _ in auditors]
    if "clopper_pearson" in methods:
        c = methods.index("clopper_pearson")
        for i, aud in enumerate(auditors):
            r = aud.epsilon_lower_bound(levels[i], delta, "bonferroni")
            vals[i, c] = r.value
            info[i]["clopper_pearson"] = {**r.counts, "threshold": r.details["threshold"]}
    one_run = [name for name in ("one_run", "one_run_fdp") if name in methods]
    if one_run:
        pools = [_pool(a.in_scores, a.out_scores, s, inclusion)
                 for a, s in zip(auditors, seeds, strict=True)]
        for i, p in enumerate(pools):
            info[i]["pool"] = p[2]
        for name in one_run:
            best, extra = _one_run_best([p[:2] for p in pools], levels, delta,
                                        name == "one_run_fdp", seeds)
            vals[:, methods.index(name)] = best
            for i, e in enumerate(extra):
                info[i][name] = e
    return vals, info


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------


def valid_bound_values(
    data_sets: Sequence[tuple[object, object]],
    *,
    alpha: float,
    delta: float,
    methods: Sequence[str] = DEFAULT_METHODS,
    seed: int = 0,
    inclusion: str = "fixed",
) -> np.ndarray:
    """Every method's bound at alpha / M for many data sets at once (simulations, benchmarks).

    The same computation as :func:`tightest_valid_lower_bound`, with the one-run lanes of all
    data sets evaluated together (much faster than one call per data set).

    Args:
        data_sets: N pairs (in_scores, out_scores), each as in :func:`tightest_valid_lower_bound`.
        alpha, delta, methods, seed, inclusion: as in :func:`tightest_valid_lower_bound`.

    Returns:
        [N, M] float array: column j is methods[j]'s (1 - alpha/M) bound; the row maximum is
        :func:`tightest_valid_lower_bound`'s value.

    Raises:
        ValueError: as :func:`tightest_valid_lower_bound`; data_sets empty.
    """
    meths = _check_methods(methods)
    a = check_alpha(alpha)
    d = _check_delta(delta, meths)
    s = check_seed(seed)
    inc = check_choice(inclusion, "inclusion", _INCLUSION)
    try:
        data_sets = list(data_sets)
    except TypeError:
        raise ValueError(f"data_sets must be a sequence of (in_scores, out_scores) pairs, got "
                         f"{type(data_sets).__name__}") from None
    if len(data_sets) == 0:
        raise ValueError("data_sets must hold at least one (in_scores, out_scores) pair")
    auditors = [CanaryScoreAuditor(x, y) for x, y in data_sets]
    n = len(auditors)
    return _evaluate(auditors, [a / len(meths)] * n, d, meths, [s] * n, inc)[0]


def tightest_valid_lower_bound(
    in_scores: object,
    out_scores: object,
    *,
    alpha: float,
    delta: float,
    methods: Sequence[str] = DEFAULT_METHODS,
    seed: int = 0,
    inclusion: str = "fixed",
) -> AuditResult:
    """The largest of M valid lower bounds, each at alpha / M: a valid (1 - alpha) bound.

    Every method in ``methods`` is run at a = alpha / M; by the union bound all M hold together
    with probability >= 1 - alpha, so the maximum does too. "clopper_pearson" uses all scores
    (``CanaryScoreAuditor.epsilon_lower_bound``, Bonferroni over its fixed thresholds);
    "one_run" and "one_run_fdp" use the fair-coin pool described in the module docstring:
    all scores with ``inclusion="coins"`` (the split was drawn by independent fair coins),
    an emulated pool of :func:`one_run_pool_size` (k, k') canaries with ``inclusion="fixed"``.

    Args:
        in_scores: shape (k,), k >= 2, scores of inserted canaries (higher = "inserted"),
            finite, not all equal (array, list or torch tensor).
        out_scores: shape (k',), k' >= 2, scores of canaries never inserted, not all equal.
        alpha: 1 - confidence of the maximum, in (0, 1).
        delta: in [0, 1) ((0, 1) when "one_run_fdp" is among ``methods``).
        methods: non-empty tuple of distinct names from :data:`METHODS`; the default,
            :data:`DEFAULT_METHODS`, holds for any mechanism; add "one_run_fdp" only for a
            Gaussian-shaped mechanism (module docstring, "Which mechanisms").
        seed: non-negative integer; the emulated pool and the order among tied scores. Fix it
            before seeing the scores (any fixed value is valid).
        inclusion: "fixed" (k, k' fixed in advance; default) or "coins" (each canary of the
            pool included by an independent fair coin).

    Returns:
        AuditResult: value = the largest bound (nats, >= 0), alpha, delta, method
        "tightest_valid", counts k_in, k_out; details: winner (the method of the largest
        value, the first in ``methods`` on a tie), values {method: bound}, alphas
        {method: alpha / M}, methods, inclusion, seed, pool (m, k_in, k_out, feasible) when a
        one-run method is used, and per method its counts (threshold, fn, fp; guesses,
        correct, mu_lower).

    Raises:
        ValueError: fewer than 2 scores in a group, all scores of a group equal, NaN/inf,
            non-numeric or not 1-D scores (naming in_scores / out_scores); alpha not in
            (0, 1); delta out of range; unknown, repeated or no methods; bad seed or inclusion.

    Source: Bonferroni over the bounds of ``CanaryScoreAuditor`` (Jagielski et al. 2020;
    Steinke, Nasr, Jagielski 2023; Mahloujifar, Melis, Chaudhuri 2024);
    docs/methods/score_auditor.md §9.
    """
    meths = _check_methods(methods)
    a = check_alpha(alpha)
    d = _check_delta(delta, meths)
    s = check_seed(seed)
    inc = check_choice(inclusion, "inclusion", _INCLUSION)
    aud = CanaryScoreAuditor(in_scores, out_scores)
    a_each = a / len(meths)
    vals, info = _evaluate([aud], [a_each], d, meths, [s], inc)
    return _tightest_result(aud, vals[0], info[0], meths, a, d, s, inc)


def _tightest_result(
    aud: CanaryScoreAuditor, row: np.ndarray, info: dict[str, Any], meths: tuple[str, ...],
    a: float, d: float, s: int, inc: str,
) -> AuditResult:
    """:func:`tightest_valid_lower_bound`'s result from its row of :func:`_evaluate`."""
    a_each = a / len(meths)
    win = int(np.argmax(row))
    details: dict[str, Any] = {
        "winner": meths[win],
        "values": {m: float(v) for m, v in zip(meths, row, strict=True)},
        "alphas": dict.fromkeys(meths, a_each),
        "methods": list(meths),
        "inclusion": inc,
        "seed": s,
        **info,
    }
    return AuditResult(
        value=float(row[win]), alpha=a, delta=d, method="tightest_valid", source=SRC_TIGHTEST,
        counts={"k_in": aud.k_in, "k_out": aud.k_out}, details=details,
    )


def check_bound_arguments(
    alpha: float, delta: float, seed: int, index: int | None, methods: Sequence[str],
    inclusion: str,
) -> tuple[float, float, int, tuple[str, ...], str]:
    """The arguments of one :func:`tightest_valid_lower_bound` (``index`` None) or
    :func:`watched_lower_bound` call, checked in the order those calls check them:
    ``(level, delta, seed, methods, inclusion)``, level the bound's own alpha (the spent one
    with ``index``).

    Raises:
        ValueError: as those functions, naming the argument.
    """
    a = check_alpha(alpha) if index is None else spent_alpha(alpha, index)
    meths = _check_methods(methods)
    a = check_alpha(a)
    d = _check_delta(delta, meths)
    return a, d, check_seed(seed), meths, check_choice(inclusion, "inclusion", _INCLUSION)


def tightest_valid_lower_bounds(
    data_sets: Sequence[tuple[object, object] | CanaryScoreAuditor],
    *,
    alphas: Sequence[float],
    delta: float,
    seeds: Sequence[int],
    index: int | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    inclusion: str = "fixed",
) -> list[AuditResult]:
    """Several :func:`tightest_valid_lower_bound` results (with ``index``:
    :func:`watched_lower_bound` results) computed together.

    Result i equals ``tightest_valid_lower_bound(*data_sets[i], alpha=alphas[i], delta=delta,
    seed=seeds[i], methods=methods, inclusion=inclusion)`` (with ``index``: ``watched_lower_bound``
    of the same arguments and that index), value and details alike; the one-run lanes of all
    data sets share one search (:func:`~audit_callbacks.estimators.one_run.fdp_mu` with a
    group per data set, whose maxima are each group's own), which makes N bounds cost about
    one. A canary report asks for its two threat models' bounds this way.

    Args:
        data_sets: N pairs ``(in_scores, out_scores)`` as in :func:`tightest_valid_lower_bound`,
            or :class:`CanaryScoreAuditor` instances without ``dim`` (their scores are used;
            not sorted again). N = 0 returns ``[]`` after the other arguments are checked.
        alphas: N levels in (0, 1) (1 - confidence of each bound; with ``index``, of each
            series' maximum).
        delta, methods, inclusion: as in :func:`tightest_valid_lower_bound`, for all.
        seeds: N non-negative integer seeds.
        index: None, or the 1-based position of these points in their series (alpha spent
            as in :func:`spent_alpha`).

    Returns:
        N :class:`AuditResult`, in the order of ``data_sets``.

    Raises:
        ValueError: as :func:`tightest_valid_lower_bound` (and :func:`spent_alpha` with
            ``index``); alphas or seeds not of length N; a data set given as an auditor with
            ``dim``.
    """
    try:
        data_sets = list(data_sets)
        alphas, seeds = list(alphas), list(seeds)
    except TypeError:
        raise ValueError("data_sets, alphas and seeds must be sequences") from None
    if len(alphas) != len(data_sets) or len(seeds) != len(data_sets):
        raise ValueError(f"alphas and seeds must have one entry per data set ({len(data_sets)}), "
                         f"got {len(alphas)} and {len(seeds)}")
    if not data_sets:
        meths = _check_methods(methods)
        _check_delta(delta, meths)
        check_choice(inclusion, "inclusion", _INCLUSION)
        return []
    levels, ss, auditors = [], [], []
    for x, a, s in zip(data_sets, alphas, seeds, strict=True):  # in the order of the single calls
        level, d, seed, meths, inc = check_bound_arguments(a, delta, s, index, methods, inclusion)
        levels.append(level)
        ss.append(seed)
        if isinstance(x, CanaryScoreAuditor):
            if x.dim is not None:
                raise ValueError("data_sets: an auditor with dim uses the exact cosine null; "
                                 "the valid bounds use the out-scores, pass the scores instead")
            auditors.append(x)
        else:
            auditors.append(CanaryScoreAuditor(*x))
    vals, info = _evaluate(auditors, [lv / len(meths) for lv in levels], d, meths, ss, inc)
    out = [_tightest_result(aud, vals[i], info[i], meths, levels[i], d, ss[i], inc)
           for i, aud in enumerate(auditors)]
    if index is not None:
        out = [_watched_result(r, lv, float(a), index, None)
               for r, lv, a in zip(out, levels, alphas, strict=True)]
    return out


def spent_alpha(alpha: float, index: int, *, horizon: int | None = None) -> float:
    """The level of the index-th logged point of a lower-bound series (alpha spending).

    alpha_i = alpha / (i (i + 1)) for i = 1, 2, ... . Since sum_{i >= 1} 1 / (i (i + 1)) =
    sum_i (1/i - 1/(i + 1)) = 1, the union bound gives P[any logged point exceeds the truth]
    <= sum_i alpha_i = alpha, whatever the number of points, the dependence between them or
    when logging stops, so the maximum over the series is a (1 - alpha) lower bound. Chosen
    over 6 alpha / (pi^2 i^2) (also summing to alpha) because it spends more on every point
    after the first (1/(i (i + 1)) >= 0.61/i^2 for i >= 2), where the data are larger; the
    first point gets alpha/2. With a known number of points ``horizon`` = J, alpha_i =
    alpha / J (Bonferroni; J = 10: alpha/10 against alpha/110 at the 10th point). The fit-end
    value of a summary is a separate statement at plain alpha, not a point of the series.

    Args:
        alpha: 1 - confidence of the series maximum, in (0, 1).
        index: the point's 1-based position in the series (integer >= 1).
        horizon: optional integer J >= index, the number of points fixed in advance.

    Returns:
        alpha_i in (0, alpha].

    Raises:
        ValueError: alpha not in (0, 1); index not an integer >= 1; horizon not an integer
            >= 1 or index > horizon.

    Source: the union bound with a convergent series (alpha spending, Lan & DeMets 1983,
    Biometrika 70(3)); docs/methods/score_auditor.md §10.
    """
    a = check_alpha(alpha)
    i = check_count(index, "index", minimum=1)
    if horizon is not None:
        j = check_count(horizon, "horizon", minimum=1)
        if i > j:
            raise ValueError(f"index must be <= horizon ({j}), got {index!r}")
        return a / j
    return a / (i * (i + 1.0))


def watched_lower_bound(
    in_scores: object,
    out_scores: object,
    *,
    alpha: float,
    delta: float,
    index: int,
    seed: int = 0,
    methods: Sequence[str] = DEFAULT_METHODS,
    inclusion: str = "fixed",
    horizon: int | None = None,
) -> AuditResult:
    """The index-th point of a lower-bound series whose maximum is a (1 - alpha) bound.

    :func:`tightest_valid_lower_bound` at :func:`spent_alpha` (alpha, index, horizon=horizon).
    Log the points of one series with indices 1, 2, 3, ... (each index at most once); the
    maximum of all logged values is then a valid (1 - alpha) lower bound on epsilon.

    Args:
        in_scores, out_scores, delta, seed, methods, inclusion: as in
            :func:`tightest_valid_lower_bound`.
        alpha: 1 - confidence of the series maximum, in (0, 1).
        index: 1-based position of this point in the series.
        horizon: optional number of points fixed in advance (see :func:`spent_alpha`).

    Returns:
        AuditResult as :func:`tightest_valid_lower_bound` with alpha = the spent level, method
        "watched_tightest_valid"; details add index, alpha_spent, series_alpha, horizon.

    Raises:
        ValueError: as :func:`tightest_valid_lower_bound` and :func:`spent_alpha`.

    Source: docs/methods/score_auditor.md §9-10.
    """
    spent = spent_alpha(alpha, index, horizon=horizon)
    r = tightest_valid_lower_bound(in_scores, out_scores, alpha=spent, delta=delta,
                                   methods=methods, seed=seed, inclusion=inclusion)
    return _watched_result(r, spent, float(alpha), index, horizon)


def _watched_result(r: AuditResult, spent: float, alpha: float, index: int,
                    horizon: int | None) -> AuditResult:
    """:func:`watched_lower_bound`'s result from the bound ``r`` at the spent level."""
    details = {**r.details, "index": int(index), "alpha_spent": spent,
               "series_alpha": float(alpha), "horizon": horizon}
    return AuditResult(
        value=r.value, alpha=spent, delta=r.delta, method="watched_tightest_valid",
        source=r.source + "; " + SRC_SPENDING, counts=r.counts, details=details,
    )
