"""The K-class label-DP bound of one release, example by example (binary is K = 2).

docs/methods/label_dp_multiclass.md eq. (4)-(5), extending Yuan, Xue, Wang & Shen (2022), "Deep
Gradient Attacks with Strong DP-SGD Lower Bounds for Label Privacy", §3 eq. (2)-(3) and Alg. 2.
The attack statistic of example r is a_r ~ N(m_r, tau_r^2 I_K) with m_r = c_r kappa
(p_r - e_{y_r}) / N_e (:mod:`.attack`); under D1[r, y'] (r's label replaced by y') its mean is
m'_r = c'_r(y') kappa (p_r - e_{y'}) / N_e with the replaced gradient's own clip factor. With
the event O = {the attack outputs y_r},

    P0[r] = P(argmin a_r = y_r | m_r),   P1[r, y'] = P(argmin a_r = y_r | m'_r),              (4)
    LB[r] = max_{y' != y_r} log((P0[r] - delta) / P1[r, y']),                                  (5)

LB[r] = -inf where P0[r] <= delta (the event bound is vacuous). :func:`pair_bounds` computes
them for every example, for the DP-SGD step bound (:mod:`.step`, the clip factor of each row)
and for a FedSGD client's update (:mod:`.client`, one clip factor shared by every row).

A sigmoid logit is the case K = 2 (:func:`sigmoid_as_two_classes`): its scalar statistic t_r
(mean c_r kappa (p_r - y_r) / N_e, the attack outputs 1 iff t_r < 0) embeds as
a_r = t_r (-1, 1) / sqrt 2 plus independent noise along (1, 1), which the argmin ignores. Since
p - e_y = (p - y) (-1, 1) for the probabilities (1 - p, p), the K-class formulas with those
probabilities and the scale kappa / sqrt 2 give exactly the binary P0, P1, LB, optimal-test
mu and layer shift (||Delta a_r|| = |Delta t_r|).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr

from .attack import attack_success_log_prob, standardized_gaps

__all__ = [
    "CLIP_GRID",
    "SIGMOID_SCALE",
    "PairBounds",
    "batch_bound",
    "pair_bounds",
    "sigmoid_as_two_classes",
]

#: The clip factors c' over which P1 is maximised when the replaced label's gradient norm is
#: unknown (conservative, up to the grid): {0} U 40 points geometric in [1e-3, 1].
CLIP_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 40)])

#: The factor on kappa that makes a sigmoid logit the two-class case (module docstring).
SIGMOID_SCALE = 1.0 / math.sqrt(2.0)

ExactClip = Callable[[np.ndarray, np.ndarray], np.ndarray]


def sigmoid_as_two_classes(p: np.ndarray) -> np.ndarray:
    """[N] sigmoid outputs -> [N, 2] probabilities (1 - p, p); use with ``scale`` multiplied by
    :data:`SIGMOID_SCALE` (module docstring)."""
    return np.stack([1.0 - p, p], axis=1)


def batch_bound(lb: np.ndarray) -> tuple[float, int]:
    """(max(0, max_r LB[r]), argmax_r LB[r]) over the finite LB[r]; (0.0, -1) when none is."""
    ok = np.isfinite(lb)
    if not ok.any():
        return 0.0, -1
    best = int(np.argmax(np.where(ok, lb, -np.inf)))
    return float(max(0.0, lb[best])), best


@dataclass(frozen=True, eq=False)
class PairBounds:
    """Per-example output of :func:`pair_bounds` (float64 arrays, N rows).

    Attributes:
        log_p0: [N] log P0[r] (NaN where not evaluated: ``p0_for_all=False``).
        log_p1: [N] log P1[r, y'] at the worst replacement y' (NaN: not evaluated).
        epsilon_lower_bound: [N] LB[r] in nats (-inf: vacuous or not evaluated).
        worst_labels: [N] int64, the replacement label y' != y_r behind LB[r].
        statistic_mean0: [N, K] m_r. statistic_mean1: [N, K] m'_r at the worst y'.
        flipped_clip_factors: [N] c'_r at the worst y' (the grid's maximiser when unknown).
        mu_pair_optimal_test: [N] max_{y'} ||m'_r(y') - m_r|| / sd_r (the Gaussian pair of the
            statistic).
        mean_shift_max: [N] max_{y'} N_e ||m'_r(y') - m_r|| (the change of row r's clipped
            coefficient vector; times ||x~_r|| it is the change of the layer's gradient).
    """

    log_p0: np.ndarray
    log_p1: np.ndarray
    epsilon_lower_bound: np.ndarray
    worst_labels: np.ndarray
    statistic_mean0: np.ndarray
    statistic_mean1: np.ndarray
    flipped_clip_factors: np.ndarray
    mu_pair_optimal_test: np.ndarray
    mean_shift_max: np.ndarray

    @property
    def p0(self) -> np.ndarray:
        """[N] P0[r]."""
        return np.exp(self.log_p0)

    @property
    def p1(self) -> np.ndarray:
        """[N] P1[r] at the worst replacement (may underflow to 0; ``log_p1`` stays finite)."""
        return np.exp(self.log_p1)


def _harris_log_lower(means: np.ndarray, target: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """log prod_k Phi((m_k - m_y) / (sd sqrt 2)) <= log P(argmin = y) (Harris' inequality)."""
    return log_ndtr(standardized_gaps(means, target, sd * math.sqrt(2.0))).sum(axis=1)


def pair_bounds(
    *, probs: np.ndarray, y: np.ndarray, clip: np.ndarray, flip_clip: np.ndarray | None,
    scale: float, sd: np.ndarray, n_e: float, delta: float, max_pairs: int | None = None,
    p0_for_all: bool = True, exact_clip: ExactClip | None = None,
) -> PairBounds:
    """P0, P1 (worst replaced label) and LB per example (docs/methods/label_dp_multiclass.md (4)-(5)).

    Args:
        probs: [N, K] probabilities p_r (p_r - e_k is formed per label k).
        y: [N] observed labels (int64).
        clip: [N] observed clip factors c_r.
        flip_clip: [N, K] clip factors c'_r(y') of the whole gradient at label y', or None (the
            clip factor is unknown: P1 is maximised over c' in :data:`CLIP_GRID`, conservative).
        scale: kappa (times :data:`SIGMOID_SCALE` for a sigmoid logit). sd: [N] tau_r / N_e.
        n_e: N_e. delta: delta in (0, 1).
        max_pairs: None: evaluate every (r, y') pair. An integer: only the ``max_pairs`` pairs
            with the largest closed-form upper bound on LB (below); the others get LB = -inf
            and P1 = NaN. Every value is still a valid lower bound (any replacement is a
            neighbour) and at most the exhaustive one.
        p0_for_all: with ``max_pairs``: P0 of every row (else only of the evaluated rows, NaN
            elsewhere).
        exact_clip: ``(rows, labels) -> clip factors`` of the evaluated pairs, when
            ``flip_clip`` holds estimates (used only to rank the pairs).

    Upper bound used for the ranking: argmin = y implies a_y < a_k for each k, so
    P0 <= min_k Phi((m_k - m_y) / (tau sqrt 2)); and by Harris' inequality (the events
    {a_k > a_y} are all increasing in (a_k, -a_y)), P1 >= prod_k Phi((m'_k - m'_y) / (tau sqrt 2)).

    Returns:
        :class:`PairBounds`.
    """
    n, k = probs.shape
    rows = np.arange(n)
    onehot = np.eye(k)
    m0 = clip[:, None] * scale * (probs - onehot[y]) / n_e  # [N, K]
    # every (r, y') with y' != y_r
    alt = (np.arange(k - 1)[None, :] + (np.arange(k - 1)[None, :] >= y[:, None])).astype(np.int64)  # [N, K-1]
    rr = np.repeat(rows, k - 1)
    yy = alt.reshape(-1)
    base = scale * (probs[rr] - onehot[yy]) / n_e  # [N(K-1), K] before the clip factor
    ranked = max_pairs is not None
    grid = CLIP_GRID if flip_clip is None else None
    if grid is None:
        cf = flip_clip[rr, yy]
    if ranked:
        p0_up = np.exp(log_ndtr(standardized_gaps(m0, y, sd * math.sqrt(2.0))).min(axis=1))
        if grid is None:
            lo = _harris_log_lower(cf[:, None] * base, y[rr], sd[rr])
        else:  # P1 is maximised over c': rank by the largest Harris bound over the grid
            g = grid.shape[0]
            means = (grid[None, :, None] * base[:, None, :]).reshape(-1, k)
            lo_g = _harris_log_lower(means, np.repeat(y[rr], g), np.repeat(sd[rr], g)).reshape(-1, g)
            cf = grid[np.argmax(lo_g, axis=1)]
            lo = lo_g.max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ub = np.where(p0_up[rr] > delta, np.log(p0_up[rr] - delta) - lo, -np.inf)
        if grid is None and exact_clip is not None:  # estimated clip factors: re-rank the
            pre = np.argsort(-ub, kind="stable")[: 4 * int(max_pairs)]  # leading pairs exactly
            pre = pre[np.isfinite(ub[pre])]
            cf = cf.copy()
            cf[pre] = exact_clip(rr[pre], yy[pre])
            exact_clip = None
            lo_pre = _harris_log_lower(cf[pre, None] * base[pre], y[rr[pre]], sd[rr[pre]])
            ub = np.full(ub.shape, -np.inf)
            with np.errstate(divide="ignore", invalid="ignore"):
                ub[pre] = np.where(p0_up[rr[pre]] > delta, np.log(p0_up[rr[pre]] - delta) - lo_pre, -np.inf)
        todo = np.argsort(-ub, kind="stable")[: int(max_pairs)]
        todo = todo[np.isfinite(ub[todo])]
        eval_rows = rows if p0_for_all else np.unique(rr[todo])
    else:
        todo = np.arange(n * (k - 1))
        eval_rows = rows
    log_p0 = np.full(n, np.nan)
    log_p1 = np.full(n * (k - 1), np.nan)
    if grid is None and exact_clip is not None and todo.size:
        cf = cf.copy()
        cf[todo] = exact_clip(rr[todo], yy[todo])
    if grid is None:  # P0 and P1 in one call (the quadrature's cost is mostly per call)
        both = attack_success_log_prob(
            np.concatenate([m0[eval_rows], cf[todo, None] * base[todo]]),
            np.concatenate([y[eval_rows], y[rr[todo]]]), np.concatenate([sd[eval_rows], sd[rr[todo]]]))
        log_p0[eval_rows], log_p1[todo] = both[: eval_rows.size], both[eval_rows.size:]
    else:
        log_p0[eval_rows] = attack_success_log_prob(m0[eval_rows], y[eval_rows], sd[eval_rows])
        cf = np.asarray(cf if ranked else np.zeros(n * (k - 1)), dtype=float).copy()
        g = grid.shape[0]
        means = (grid[None, :, None] * base[todo][:, None, :]).reshape(-1, k)
        lp = attack_success_log_prob(means, np.repeat(y[rr[todo]], g), np.repeat(sd[rr[todo]], g))
        lp = lp.reshape(-1, g)
        best_c = np.argmax(lp, axis=1)
        log_p1[todo] = lp[np.arange(lp.shape[0]), best_c]
        cf[todo] = grid[best_c]
    with np.errstate(invalid="ignore"):
        ok = np.exp(log_p0) > delta
    with np.errstate(divide="ignore", invalid="ignore"):
        log_num = np.where(ok, log_p0 + np.log1p(-delta * np.exp(-np.where(ok, log_p0, 0.0))), -np.inf)
    m1 = cf[:, None] * base
    mu = np.linalg.norm(m1 - m0[rr], axis=1) / sd[rr]
    log_p1 = log_p1.reshape(n, k - 1)
    with np.errstate(invalid="ignore"):
        lb_all = np.where(ok[:, None] & np.isfinite(log_p1), log_num[:, None] - log_p1, -np.inf)  # [N, K-1]
    order = ub.reshape(n, k - 1) if ranked else -log_p1
    worst = np.where(np.isfinite(lb_all).any(axis=1), np.argmax(lb_all, axis=1), np.argmax(order, axis=1))
    m1_all = m1.reshape(n, k - 1, k)
    shift = np.linalg.norm(m1_all - m0[:, None, :], axis=2)  # [N, K-1]
    return PairBounds(
        log_p0=log_p0,
        log_p1=log_p1[rows, worst],
        epsilon_lower_bound=lb_all[rows, worst],
        worst_labels=alt[rows, worst],
        statistic_mean0=m0,
        statistic_mean1=m1_all[rows, worst],
        flipped_clip_factors=cf.reshape(n, k - 1)[rows, worst],
        mu_pair_optimal_test=mu.reshape(n, k - 1).max(axis=1),
        mean_shift_max=(shift * n_e).max(axis=1),
    )
