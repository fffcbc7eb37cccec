"""Lower bounds on epsilon from one training run: the guesses, the binomial p-value, the f-DP recursion.

The m canaries of one run form a single pool in which each canary was inserted independently
with probability 1/2 (in = inserted, out = not). An auditor ranks the canaries by their scores,
guesses "in" for the t highest and "out" for the b lowest and abstains on the rest: n = t + b
guesses, v of them correct. Two bounds turn (n, v) into a lower bound on the privacy of the run:

* Steinke, Nasr & Jagielski (2023), "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
  Thm 3.1 and Thm 5.2 / Alg. 2: under (eps, delta)-DP the number of correct guesses V satisfies
  P[V >= v] <= P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i with
  B ~ Binomial(n, e^eps / (1 + e^eps)); the bound is the largest eps this p-value rejects
  (:func:`one_run_pvalue`, :func:`one_run_epsilon`).
* Mahloujifar, Melis & Chaudhuri (2024), "Auditing f-Differential Privacy in One Run",
  arXiv:2410.22235, §4: a recursion bounds the tail of V under f-DP; with the Gaussian trade-off
  f(x) = Phi(Phi^-1(1 - x) - mu) (Dong, Roth & Su 2022) the bound is the largest rejected mu
  (:func:`fdp_rejects`, :func:`fdp_mu`), converted to epsilon at delta by the caller.

The guess rules (:func:`guess_grid`, :func:`guess_counts`) are fixed by m alone, so a Bonferroni
correction over them keeps the level. Every function works on "lanes": one lane per candidate
rule (and, in the tests and benchmarks, per simulated run), evaluated together in numpy.
:class:`~audit_callbacks.estimators.score_auditor.CanaryScoreAuditor` (``epsilon_one_run``,
``epsilon_one_run_fdp``) is the user-facing entry point; the formulas are written out in
``docs/methods/score_auditor.md`` §3-4. Pure numpy/scipy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import betaincinv, gammaln, ndtr, ndtri

__all__ = [
    "EPS_MAX",
    "MU_MAX",
    "SRC_MAHLOUJIFAR",
    "SRC_STEINKE",
    "fdp_mu",
    "fdp_rejects",
    "guess_counts",
    "guess_grid",
    "log_binom_coef",
    "one_run_epsilon",
    "one_run_pvalue",
    "pure_dp_epsilon",
]

SRC_STEINKE = (
    "Steinke, Nasr, Jagielski (2023), Privacy Auditing with One (1) Training Run, NeurIPS 2023, "
    "Thm 3.1 (binomial tail) and Thm 5.2 / Alg. 2 (delta term)"
)
SRC_MAHLOUJIFAR = (
    "Mahloujifar, Melis, Chaudhuri (2024), Auditing f-Differential Privacy in One Run, "
    "arXiv:2410.22235, §4 (tail bound on correct guesses under f-DP, numerical recursion); "
    "Gaussian trade-off f(x) = Phi(Phi^-1(1-x) - mu) of Dong, Roth, Su (2022)"
)

#: Largest epsilon the one-run search considers (the p-values saturate long before).
EPS_MAX = 60.0
#: Largest mu the f-DP search considers.
MU_MAX = 40.0


# --------------------------------------------------------------------------------------------
# The guesses
# --------------------------------------------------------------------------------------------


def guess_grid(m: int) -> np.ndarray:
    """Numbers of guesses per side, fixed by m alone: round(m/2 * 2^(-j/2)), j = 0, 1, ...

    Args:
        m: the number of canaries in the pool (>= 1).

    Returns:
        int64, the distinct values >= 1, ascending (about 2 log2(m) of them).
    """
    g = np.round(m / 2.0 * 2.0 ** (-np.arange(2.0 * math.log2(m) + 2.0) / 2.0)).astype(np.int64)
    return np.unique(g[g >= 1])


def guess_counts(
    in_scores: np.ndarray, out_scores: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate guess rules and their counts: (guesses, correct, n_top, n_bottom).

    Rule (t, b): guess "in" for the t highest scores and "out" for the b lowest, abstain on the
    rest. Candidates: one-sided (t, 0) and symmetric (t, t) for t in :func:`guess_grid`
    (2t <= m). Ties are ordered by a seeded random key, never by membership.

    Args:
        in_scores: [k] scores of the inserted canaries. out_scores: [k'] of the others.
        seed: seed of the random order among tied scores.

    Returns:
        Four int64 arrays of one entry per candidate rule: n = t + b guesses, v correct
        guesses, t ("in" guesses) and b ("out" guesses).
    """
    m = in_scores.size + out_scores.size
    s = np.concatenate([in_scores, out_scores])
    member = np.concatenate([np.ones(in_scores.size, bool), np.zeros(out_scores.size, bool)])
    key = np.random.default_rng(seed).random(m)
    order = np.lexsort((key, -s))  # descending score, random among ties
    ins = member[order]
    top = np.concatenate([[0], np.cumsum(ins)])  # in-members among the t highest
    outs_bottom = np.concatenate([[0], np.cumsum(~ins[::-1])])  # out-members among b lowest
    grid = guess_grid(m)
    sym = grid[2 * grid <= m]
    n_top = np.concatenate([grid, sym])
    n_bot = np.concatenate([np.zeros_like(grid), sym])
    correct = top[n_top] + outs_bottom[n_bot]
    return n_top + n_bot, correct, n_top, n_bot


# --------------------------------------------------------------------------------------------
# Steinke, Nasr & Jagielski (2023): the binomial p-value with the delta term
# --------------------------------------------------------------------------------------------


def log_binom_coef(n: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """log C(n_c, j) for j = 0..width-1 (-inf where j > n_c), and the j grid.

    Args:
        n: [L] numbers of guesses, one per lane. width: the grid's length (max n + 1).

    Returns:
        ``(log_coef [L, width], j [1, width])``.
    """
    j = np.arange(width, dtype=float)[None, :]
    nn = n.astype(float)[:, None]
    with np.errstate(invalid="ignore"):
        lc = gammaln(nn + 1.0) - gammaln(j + 1.0) - gammaln(np.maximum(nn - j, 0.0) + 1.0)
    return np.where(j <= nn, lc, -np.inf), j


def one_run_pvalue(
    eps: np.ndarray,
    n: np.ndarray,
    v: np.ndarray,
    m: np.ndarray,
    delta: float,
    lc: np.ndarray,
    j: np.ndarray,
) -> np.ndarray:
    """P-value of v correct out of n guesses under (eps, delta)-DP, one per lane:
    P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i, B ~ Binomial(n, e^eps/(1+e^eps)).

    Args:
        eps: [L] the epsilon of the null hypothesis (nats). n, v, m: [L] guesses, correct
            guesses and pool sizes. delta: in [0, 1) (0: the pure-DP tail alone).
        lc, j: :func:`log_binom_coef` of ``n``.

    Returns:
        [L] p-values in [0, 1].

    Source: Steinke, Nasr, Jagielski (2023), NeurIPS, Thm 3.1 (delta = 0) and Thm 5.2 / Alg. 2.
    """
    soft = np.log1p(np.exp(-eps))[:, None]  # log q = -soft, log(1 - q) = -eps - soft
    pmf = np.exp(lc - j * soft + (n[:, None] - j) * (-eps[:, None] - soft))
    below = j < v[:, None]
    tail = np.sum(np.where(below, 0.0, pmf), axis=1)
    if delta == 0.0:
        return np.minimum(tail, 1.0)
    pb = np.where(below, pmf, 0.0)
    csum = np.cumsum(pb, axis=1) - pb  # sum over j' < j0
    total = np.sum(pb, axis=1, keepdims=True)
    i = v[:, None] - j
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(below, (total - csum) / np.maximum(i, 1.0), 0.0)
    a = np.max(ratio, axis=1)
    return np.minimum(tail + 2.0 * m * delta * a, 1.0)


def _lanes(n: Any, v: Any, m: Any, level: Any) -> tuple[np.ndarray, ...]:
    """(n, v, m, level) as int64, int64, float64 arrays and ``level`` broadcast to n's shape."""
    n = np.asarray(n, np.int64)
    return n, np.asarray(v, np.int64), np.asarray(m, float), np.broadcast_to(level, n.shape)


def one_run_epsilon(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, delta: float,
    xtol: float = 1e-10,
) -> np.ndarray:
    """Largest eps whose (eps, delta)-DP claim the count v/n rejects at ``level``, per lane.

    The root of :func:`one_run_pvalue` = level in eps (the p-value increases with eps),
    bracketed by [0, eps0], eps0 the delta = 0 bound (the level's quantile of the binomial
    tail, :func:`scipy.special.betaincinv`; the delta term only raises the p-value), and
    found by regula falsi on log p with the Illinois modification and a bisection step every
    fourth step, until the bracket is narrower than ``xtol``. The lower end, whose p-value is
    <= level, is returned; 0 where even eps = 0 is not rejected (or v = 0); at most
    :data:`EPS_MAX`.

    Args:
        n, v, m: [L] guesses, correct guesses and pool sizes. level: [L] (or scalar) test
            level of each lane, e.g. alpha / C for C candidate rules (Bonferroni).
        delta: in [0, 1). xtol: width of the final bracket (nats).

    Returns:
        [L] lower bounds on epsilon (nats, >= 0).

    Source: Steinke, Nasr, Jagielski (2023), NeurIPS, Thm 3.1 and Thm 5.2 / Alg. 2.
    """
    n, v, m, level = _lanes(n, v, m, level)
    out = np.zeros(n.size)
    if n.size == 0:
        return out
    # Lanes are independent: evaluate them in blocks of similar width (the next power of two
    # of n + 1) and at most _BLOCK_CELLS matrix cells, so that a lane with few guesses does not
    # pay for the widest lane and memory stays bounded.
    width = 2 ** np.ceil(np.log2(n + 1.0)).astype(np.int64)
    for w in np.unique(width):
        lanes = np.flatnonzero(width == w)
        rows = max(1, _BLOCK_CELLS // int(w))
        for start in range(0, lanes.size, rows):
            sel = lanes[start : start + rows]
            out[sel] = _one_run_block(n[sel], v[sel], m[sel], level[sel], delta, xtol)
    return out


#: Largest number of pmf cells (lanes x width) one block holds (16 MiB of float64).
_BLOCK_CELLS = 1 << 21


def pure_dp_epsilon(n: np.ndarray, v: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The delta = 0 bound in closed form: logit(q0) with P[Binomial(n, q0) >= v] = level,
    i.e. q0 = I^-1_level(v, n - v + 1) (regularized incomplete beta); 0 where v = 0 or
    q0 <= 1/2; capped at :data:`EPS_MAX`. An upper bound of :func:`one_run_epsilon` at any
    delta >= 0 (up to the rounding of betaincinv)."""
    n, v, _, level = _lanes(n, v, np.zeros(np.shape(n)), level)
    with np.errstate(divide="ignore", invalid="ignore"):
        q0 = betaincinv(np.maximum(v, 1).astype(float), (n - v + 1).astype(float), level)
        e = np.log(q0) - np.log1p(-q0)
    e = np.nan_to_num(e, nan=EPS_MAX, posinf=EPS_MAX, neginf=0.0)
    return np.where(v > 0, np.clip(e, 0.0, EPS_MAX), 0.0)


def _one_run_block(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, delta: float, xtol: float
) -> np.ndarray:
    """:func:`one_run_epsilon` on one block of lanes."""
    lc, j = log_binom_coef(n, int(n.max()) + 1)
    out = np.zeros(n.size)
    idx = np.flatnonzero((v > 0) & (one_run_pvalue(out, n, v, m, delta, lc, j) <= level))
    if idx.size == 0:
        return out
    n, v, m, level, lc = n[idx], v[idx], m[idx], level[idx], lc[idx]
    log_level = np.log(level)

    def f(eps: np.ndarray, rows: np.ndarray) -> np.ndarray:  # <= 0 iff rejected
        p = one_run_pvalue(eps, n[rows], v[rows], m[rows], delta, lc[rows], j)
        return np.log(np.maximum(p, 1e-300)) - log_level[rows]

    every = np.arange(idx.size)
    lo = np.zeros(idx.size)
    flo = f(lo, every)
    e0 = pure_dp_epsilon(n, v, level)
    hi = np.minimum(e0 + 1e-6 * (1.0 + e0), EPS_MAX)
    fhi = f(hi, every)
    bad = fhi <= 0.0  # rounding of betaincinv: widen to EPS_MAX
    if bad.any():
        hi[bad] = EPS_MAX
        fhi[bad] = f(hi[bad], np.flatnonzero(bad))
    top = fhi <= 0.0  # rejected even at EPS_MAX
    lo[top] = EPS_MAX
    side = np.zeros(idx.size, np.int8)  # last end moved: -1 lo, +1 hi
    for step in range(200):
        live = np.flatnonzero(~top & (hi - lo > xtol))
        if live.size == 0:
            break
        a, b, fa, fb = lo[live], hi[live], flo[live], fhi[live]
        x = a - fa * (b - a) / (fb - fa)
        bisect = (step % 4 == 3) | ~np.isfinite(x) | (x <= a) | (x >= b)
        x = np.where(bisect, 0.5 * (a + b), x)
        fx = f(x, live)
        rej = fx <= 0.0
        s = side[live]
        # Illinois: halve the far end's value when the same end moves twice in a row
        fhi[live] = np.where(rej & (s == -1), fb * 0.5, np.where(rej, fb, fx))
        flo[live] = np.where(~rej & (s == 1), fa * 0.5, np.where(rej, fx, fa))
        lo[live] = np.where(rej, x, a)
        hi[live] = np.where(rej, b, x)
        side[live] = np.where(rej, -1, 1)
    out[idx] = lo
    return out


# --------------------------------------------------------------------------------------------
# Mahloujifar, Melis & Chaudhuri (2024): the f-DP recursion with the Gaussian trade-off
# --------------------------------------------------------------------------------------------


def fdp_rejects(
    mu: np.ndarray, n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray
) -> np.ndarray:
    """Whether v correct out of n guesses rejects mu-GDP at ``level``, per lane.

    The recursion of Mahloujifar et al. (2024): r = level v/m, h = level (n - v)/m; for
    i = v-1, ..., 0: h' = max(h, g(r)) with g(x) = Phi(Phi^-1(x) - mu) = f(1 - x),
    r <- min(r + i/(n - i) (h' - h), 1), h <- h'; stop early once h' = h. Rejects iff
    r + h > n/m.

    Lanes advance together, ordered by v (a lane whose i went below 0 leaves the prefix that
    is stepped); each step is the update above written without a mask, in 8 ufunc calls:
    h' = max(h, g(r)), d = h' - h, r <- min(r + i/(n - i) d, 1), h <- h', which leaves a
    lane that does not move (d = 0; also where g(r) is NaN, from a NaN mu) exactly as it is.
    Such a lane never moves again (r and h stay, so g stays), so every :data:`_STEP_CHUNK`
    steps the lanes that did not move in the last step are dropped (the loop ends when none
    is left); the i/(n - i) factors of a chunk are computed at once. The final r and h, and
    so the answers, are bit for bit those of the masked step-by-step recursion (kept in
    ``tests/estimators/test_estimator_speed_equivalence.py``). A lane with r outside [0, 1] or a
    non-finite h (impossible for levels in (0, 1) and 0 <= v <= n <= m) does not move.

    Args:
        mu: [L] the mu of the null hypothesis (mu-GDP). n, v, m: [L] guesses, correct guesses
            and pool sizes. level: [L] test levels.

    Returns:
        [L] bool.

    Source: Mahloujifar, Melis, Chaudhuri (2024), arXiv:2410.22235, §4.
    """
    r, h = _fdp_recursion(mu, n, v, m, level)
    return r + h > n / m


def _fdp_recursion(
    mu: np.ndarray, n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The final (r, h) of :func:`fdp_rejects`' recursion, per lane ([L] each)."""
    r, h = level * v / m, level * (n - v) / m
    live = np.flatnonzero((v > 0) & (r >= 0.0) & (r <= 1.0) & np.isfinite(h))
    live = live[np.argsort(-v[live], kind="stable")]  # most steps first
    rr = r[live]
    hb = [h[live], np.empty(live.size)]  # h and h' alternate between two buffers
    mm = np.asarray(mu, dtype=float)[live]
    nn, vv = n[live].astype(float), v[live].astype(np.int64)
    g, d = np.empty(live.size), np.empty(live.size)
    one = np.ones(live.size)  # an array: a Python float costs ~0.3 us a call
    step = 0
    while live.size:
        span = min(_STEP_CHUNK, int(vv[0]) - step)
        # i of every lane at each step of the chunk (lanes with i < 0 are past the prefix)
        i = (vv - 1 - step).astype(float)[None, :] - np.arange(span, dtype=float)[:, None]
        coef = i / np.maximum(nn - i, 1.0)
        stepped = np.searchsorted(-vv, -(step + np.arange(span)), side="left").tolist()
        width = -1
        for s, c in enumerate(stepped):
            if c != width:  # fewer lanes still have steps: views of the prefix
                if c < width:  # the lanes that stop hold their h in both buffers
                    hb[1][c:width] = hb[0][c:width]
                width = c
                r_, m_, g_, d_, o_ = (a[:c] for a in (rr, mm, g, d, one))
                h_, t_ = hb[0][:c], hb[1][:c]
                cf = coef[:, :c]
            ndtri(r_, out=g_)
            np.subtract(g_, m_, out=g_)
            ndtr(g_, out=g_)
            np.fmax(h_, g_, out=t_)  # h' = max(h, g(r)) (h where g is NaN)
            np.subtract(t_, h_, out=d_)  # h' - h: 0 where the lane does not move
            h_, t_ = t_, h_
            hb.reverse()
            np.multiply(d_, cf[s], out=g_)
            np.add(g_, r_, out=g_)
            np.minimum(g_, o_, out=r_)
        step += span
        r[live], h[live] = rr, hb[0]
        keep = np.zeros(live.size, bool)
        keep[:width] = d_ > 0.0  # moved in the last step (and has steps left: checked next)
        keep &= vv > step
        live, rr, mm, nn, vv = (a[keep] for a in (live, rr, mm, nn, vv))
        hb = [hb[0][keep], hb[1][: live.size]]
        g, d, one = (a[: live.size] for a in (g, d, one))
    return r, h


#: Steps of :func:`fdp_rejects` between two drops of the lanes that stopped moving.
_STEP_CHUNK = 16


def fdp_mu(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, iters: int = 36,
    groups: np.ndarray | None = None,
) -> np.ndarray:
    """Largest mu whose mu-GDP claim is rejected (0 when even mu = 0 is not), per lane.

    Bisection on [0, :data:`MU_MAX`] of :func:`fdp_rejects`, ``iters`` steps. With ``groups``
    (one label per lane, e.g. the data set a candidate rule belongs to) only each group's
    maximum is wanted: after :data:`_PRUNE_AFTER` steps, and again after every later round,
    lanes whose bracket's upper end lies below the largest lower end of their group stop
    (their value stays that lower end, a lower bound of their own, below the group maximum);
    the maximum and argmax of every group are those of the full bisection, the other lanes'
    values at most theirs.

    The bisection is run in rounds of b steps (:func:`_bisect_round`): each round evaluates
    :func:`fdp_rejects` once, at all 2^b - 1 midpoints the next b steps could visit, and then
    replays the b steps on those answers. The midpoints are computed by the bisection's own
    formula ``0.5 (lo + hi)``, so every visited mu, every answer and the returned values are
    exactly those of the step-by-step bisection (with ``groups``: each group's maximum and
    argmax), with about b times fewer passes of the recursion (the cost of one pass is
    mostly its sequential steps, not its width). b is
    chosen so that a round evaluates at most :data:`_ROUND_CELLS` (lane, mu) pairs (b = 1, the
    plain bisection, for very many lanes).

    Args:
        n, v, m: [L] guesses, correct guesses and pool sizes. level: [L] (or scalar) test
            levels. iters: bisection steps (36: MU_MAX / 2^36 ~ 6e-10).
        groups: optional [L] integer labels.

    Returns:
        [L] lower bounds on mu (>= 0); convert to epsilon at delta with
        :func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon_array` (Dong, Roth, Su
        2022, Cor. 2.13).

    Source: Mahloujifar, Melis, Chaudhuri (2024), arXiv:2410.22235, §4.
    """
    n, v, m, level = _lanes(n, v, m, level)
    ok0 = fdp_rejects(np.zeros(n.size), n, v, m, level)
    lo, hi, idx = np.zeros(n.size), np.full(n.size, MU_MAX), np.flatnonzero(ok0)
    iters = int(iters)
    inv = None if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    done = 0
    while done < iters and idx.size:
        if inv is not None and done >= _PRUNE_AFTER:
            # drop the lanes that cannot be their group's maximum (hi < the group's best lo)
            best = np.zeros(inv.max() + 1)
            np.maximum.at(best, inv, lo)
            idx = idx[hi[idx] >= best[inv[idx]]]
        stop = _PRUNE_AFTER if inv is not None and done < _PRUNE_AFTER else iters
        bits = _round_bits(idx.size, min(stop, iters) - done)
        lo[idx], hi[idx] = _bisect_round(lo[idx], hi[idx], bits, n[idx], v[idx], m[idx],
                                         level[idx])
        done += bits
    return np.where(ok0, lo, 0.0)


#: Largest number of bisection steps one round of :func:`fdp_mu` takes (2^b - 1 mu a lane).
_ROUND_BITS = 5
#: Largest number of (lane, mu) pairs one round of :func:`fdp_mu` evaluates: a pass of the
#: recursion costs its steps while this narrow, its width beyond (measured on 2 CPU cores).
_ROUND_CELLS = 1 << 11


def _round_bits(lanes: int, steps: int) -> int:
    """Steps of the next bisection round: at most :data:`_ROUND_BITS` and ``steps``, the
    ``steps`` spread evenly over the rounds, and lanes (2^b - 1) <= :data:`_ROUND_CELLS`
    (at least 1)."""
    cap = max(1, min(_ROUND_BITS, int(math.log2(_ROUND_CELLS / lanes + 1.0))))
    rounds = -(-steps // cap)
    return -(-steps // rounds)


def _bisect_round(
    lo: np.ndarray, hi: np.ndarray, bits: int, n: np.ndarray, v: np.ndarray, m: np.ndarray,
    level: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``bits`` bisection steps of :func:`fdp_mu` on [lo, hi], per lane, with one call of
    :func:`fdp_rejects`: the new (lo, hi), exactly those of ``bits`` sequential steps.

    ``grid[:, j]`` (j = 0..2^b) holds the bracket ends and every midpoint the steps can visit,
    each computed as ``0.5 (grid[:, j - w] + grid[:, j + w])`` from the two ends the bisection
    would hold then (so bit for bit its ``0.5 (lo + hi)``); the steps are then replayed on the
    answers at the 2^b - 1 interior points.
    """
    size, cells = lo.size, 1 << bits
    grid = np.empty((size, cells + 1))
    grid[:, 0], grid[:, cells] = lo, hi
    w = cells
    while w > 1:
        w //= 2
        centre = np.arange(w, cells, 2 * w)
        grid[:, centre] = 0.5 * (grid[:, centre - w] + grid[:, centre + w])
    inner = cells - 1
    rej = fdp_rejects(grid[:, 1:cells].ravel(), *(np.repeat(a, inner) for a in (n, v, m, level)))
    rej = rej.reshape(size, inner)
    rows, left, w = np.arange(size), np.zeros(size, np.int64), cells
    for _ in range(bits):
        w //= 2
        mid = left + w
        left = np.where(rej[rows, mid - 1], mid, left)
    return grid[rows, left], grid[rows, left + 1]


#: Bisection steps of :func:`fdp_mu` before lanes that cannot be their group's maximum stop:
#: after 3 (a bracket of MU_MAX / 8) most lanes of a canary report's pools already lie below
#: their group's best and the wide first rounds end early (~10% of the search's time saved on
#: the benchmark's DP-FedAvg reports against 10 steps; any value gives the same maxima).
_PRUNE_AFTER = 3
