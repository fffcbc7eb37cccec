"""Multi-class label-DP lower bound of one DP-SGD step (softmax last layer, K classes).

Extends the binary bound of Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong
DP-SGD Lower Bounds for Label Privacy", §3 eq. (1)-(3) and Alg. 2, to K classes; the derivation
is in docs/methods/label_dp_multiclass.md. Private helpers of
:mod:`audit_callbacks.estimators.label_dp`; the public entry point is
:func:`audit_callbacks.estimators.label_dp.label_dp_lower_bound` with ``probs`` of shape [N, K].

Model (docs/methods/label_dp_multiclass.md, eq. (1)-(4)). The attack statistic of example r is
the K-vector a_r = N_e [(Cm^T Cm)^{-1} Cm^T G~^T]_r; under D0 it is Gaussian with mean
m_r = c_r kappa (p_r - e_{y_r}) and covariance tau_r^2 I_K, tau_r = sigma C sqrt(v_r),
v_r = [(Cm^T Cm)^{-1}]_rr. The attack outputs argmin_k a_r[k]. With ``d_k = (m_k - m_y) / tau``,

    P(argmin = y) = integral phi(z) prod_{k != y} Phi(d_k + z) dz,                        (3)

computed here by the trapezoid rule in the log domain around the mode of the (log-concave)
integrand; the rule converges geometrically for this entire integrand and the tests check it
against :func:`scipy.integrate.quad` to 1e-8 (relative).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.special import log_ndtr, logsumexp

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_TAIL = 8.0  # the integrand is below exp(-TAIL^2 / 2) of its mode beyond +-TAIL (curvature >= 1)
_STEP = 0.7  # trapezoid step in units of the mode's width 1 / sqrt(-h''(z*))
CLIP_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 40)])  # c' grid without flipped norms


def _mills(u: np.ndarray) -> np.ndarray:
    """phi(u) / Phi(u), stable for very negative u."""
    return np.exp(-0.5 * u * u - _LOG_SQRT_2PI - log_ndtr(u))


def log_prob_argmin(d: np.ndarray) -> np.ndarray:
    """log P(argmin = y) = log integral phi(z) prod_k Phi(d_k + z) dz for rows d [M, K - 1].

    d_k = (m_k - m_y) / tau (standardised gaps of the competitors to the target class). Finite
    for any finite d (log-domain trapezoid around the mode z* of the log-integrand
    h(z) = log phi(z) + sum_k log Phi(d_k + z), which is concave with h'' <= -1).
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 2:
        raise ValueError(f"d must be 2-D [M, K - 1], got shape {d.shape}")
    if d.shape[1] == 0:
        return np.zeros(d.shape[0])
    z = np.zeros(d.shape[0])
    for _ in range(100):  # Newton on the concave h, from z = 0
        u = d + z[:, None]
        lam = _mills(u)
        grad = -z + lam.sum(axis=1)
        curv = 1.0 + (lam * (u + lam)).sum(axis=1)
        step = grad / curv
        z = z + step
        if float(np.max(np.abs(step))) < 1e-12 * max(1.0, float(np.max(np.abs(z)))):
            break
    u = d + z[:, None]
    lam = _mills(u)
    width = 1.0 / np.sqrt(1.0 + (lam * (u + lam)).sum(axis=1))  # [M], <= 1
    # Left of the mode the curvature only grows (-lambda' decreases in u), so TAIL widths hold
    # all but exp(-TAIL^2 / 2) of the mass on the left; on the right the curvature may fall to 1
    # (h'' <= -1 always), so the grid runs to z* + TAIL. One grid of step STEP * width per row.
    h = _STEP * width
    j = np.arange(-int(math.ceil(_TAIL / _STEP)), int(math.ceil(_TAIL / float(h.min()))) + 1, dtype=float)
    grid = z[:, None] + h[:, None] * j[None, :]
    inside = (j[None, :] * h[:, None]) <= _TAIL
    return _trapezoid(d, grid, h, inside)[1]


def _trapezoid(
    d: np.ndarray, grid: np.ndarray, h: np.ndarray, inside: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """log-integrand on ``grid`` [M, G] and log of its trapezoid sum with steps ``h`` [M]."""
    logf = -0.5 * grid * grid - _LOG_SQRT_2PI
    for k in range(d.shape[1]):
        logf = logf + log_ndtr(d[:, k : k + 1] + grid)
    if inside is not None:
        logf = np.where(inside, logf, -np.inf)
    return logf, logsumexp(logf, axis=1) + np.log(h)


def gaps(means: np.ndarray, target: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """[M, K - 1] standardised gaps (m_k - m_target) / sd over k != target."""
    m, k = means.shape
    keep = np.ones((m, k), dtype=bool)
    keep[np.arange(m), target] = False
    diff = (means - means[np.arange(m), target][:, None]) / sd[:, None]
    return diff[keep].reshape(m, k - 1)


def attack_success_log_prob(means: np.ndarray, target: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """log P(argmin_k (means[r] + sd_r * noise)[k] = target[r]) for each row r (eq. (3))."""
    return log_prob_argmin(gaps(means, target, sd))


def check_multiclass(probs: np.ndarray, labels: object, n: int) -> np.ndarray:
    """Validate [N, K] softmax probabilities and integer labels in 0..K-1; return labels int64."""
    k = probs.shape[1]
    if k < 2:
        raise ValueError(f"probs must have K >= 2 columns (softmax), got shape {probs.shape}")
    if (probs < 0.0).any() or (probs > 1.0).any():
        raise ValueError("probs must lie in [0, 1] (softmax probabilities)")
    if (np.abs(probs.sum(axis=1) - 1.0) > 1e-4).any():
        raise ValueError("probs rows must sum to 1 (softmax probabilities), up to 1e-4")
    y = np.asarray(labels)
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number):
        raise ValueError(f"labels must be integers in 0..{k - 1}, got dtype {y.dtype}")
    y = y.reshape(-1)
    if y.shape[0] != n:
        raise ValueError(f"labels must have shape [{n}], got {np.asarray(labels).shape}")
    if not np.isfinite(y).all() or (y != np.round(y)).any() or (y < 0).any() or (y >= k).any():
        raise ValueError(f"labels must be integers in 0..{k - 1} (K = {k} columns of probs)")
    return y.astype(np.int64)


def multiclass_bounds(
    *, coef: np.ndarray, y: np.ndarray, clip: np.ndarray, flip_clip: np.ndarray | None,
    scale: float, sd: np.ndarray, n_e: float, delta: float, max_pairs: int | None = None,
    p0_for_all: bool = True, exact_clip: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """P0, P1 (worst replaced label), LB per example (docs/methods/label_dp_multiclass.md (4)-(5)).

    Args:
        coef: [N, K] the softmax probabilities p_r (p_r - e_k is formed per label k below).
        y: [N] observed labels.
        clip: [N] observed clip factors c_r.
        flip_clip: [N, K] clip factors c'_r(y') of the whole gradient at label y', or None (the
            clip factor is unknown: P1 is maximised over c' in ``CLIP_GRID``, conservative).
        scale: kappa. sd: [N] tau_r / N_e. n_e: N_e. delta: delta.
        max_pairs: None: evaluate every (r, y') pair. An integer: only the ``max_pairs`` pairs
            with the largest closed-form upper bound on LB (below); the others get LB = -inf
            and P1 = NaN. Every value is still a valid lower bound (any
            replacement is a neighbour) and at most the exhaustive one.
        p0_for_all: with ``max_pairs``: P0 of every row (else only of the evaluated rows, NaN
            elsewhere).
        exact_clip: ``(rows, labels) -> clip factors`` of the evaluated pairs, when
            ``flip_clip`` holds estimates (used only to rank the pairs).

    Upper bound used for the ranking: argmin = y implies a_y < a_k for each k, so
    P0 <= min_k Phi((m_k - m_y) / (tau sqrt 2)); and by Harris' inequality (the events
    {a_k > a_y} are all increasing in (a_k, -a_y)), P1 >= prod_k Phi((m'_k - m'_y) / (tau sqrt 2)).
    """
    p = coef
    n, k = p.shape
    rows = np.arange(n)
    onehot = np.eye(k)
    m0 = clip[:, None] * scale * (p - onehot[y]) / n_e  # [N, K]
    # every (r, y') with y' != y_r
    alt = (np.arange(k - 1)[None, :] + (np.arange(k - 1)[None, :] >= y[:, None])).astype(np.int64)  # [N, K-1]
    rr = np.repeat(rows, k - 1)
    yy = alt.reshape(-1)
    base = scale * (p[rr] - onehot[yy]) / n_e  # [N(K-1), K] before the clip factor
    ranked = max_pairs is not None
    grid = CLIP_GRID if flip_clip is None else None
    if grid is None:
        cf = flip_clip[rr, yy]
    if ranked:
        p0_up = np.exp(log_ndtr(gaps(m0, y, sd * math.sqrt(2.0))).min(axis=1))
        if grid is None:
            lo = log_ndtr(gaps(cf[:, None] * base, y[rr], sd[rr] * math.sqrt(2.0))).sum(axis=1)
        else:  # P1 is maximised over c': rank by the largest Harris bound over the grid
            g = grid.shape[0]
            means = (grid[None, :, None] * base[:, None, :]).reshape(-1, k)
            lo_g = log_ndtr(gaps(means, np.repeat(y[rr], g), np.repeat(sd[rr], g) * math.sqrt(2.0)))
            lo_g = lo_g.sum(axis=1).reshape(-1, g)
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
            lo_pre = log_ndtr(gaps(cf[pre, None] * base[pre], y[rr[pre]], sd[rr[pre]] * math.sqrt(2.0))).sum(1)
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
    return {
        "log_p0": log_p0,
        "log_p1": log_p1[rows, worst],
        "lower_bound": lb_all[rows, worst],
        "worst_labels": alt[rows, worst],
        "statistic_mean0": m0,
        "statistic_mean1": m1_all[rows, worst],
        "flipped_clip": cf.reshape(n, k - 1)[rows, worst],
        "optimal_test_mu": mu.reshape(n, k - 1).max(axis=1),
        "coef_shift_norm_max": (shift * n_e).max(axis=1),
    }


def multiclass_lower_bound(
    x: np.ndarray, eps: float, probs: np.ndarray, labels: object, grad_norms: object,
    flipped_grad_norms: object, *, c_max: float, sigma: float, n_e: float, delta: float,
    bias: bool, gram_inv_diag: object, scale: float, max_pairs: int | None = None,
    p0_for_all: bool = True,
) -> object:
    """The K-class branch of ``label_dp_lower_bound`` (inputs already checked for type/finite)."""
    from . import label_dp as ld  # the binary module holds the shared helpers and the result type

    n = x.shape[0]
    if probs.shape[0] != n:
        raise ValueError(f"probs must have shape [{n}, K] (one row per row of features), got {probs.shape}")
    if not np.isfinite(probs).all():
        raise ValueError("probs contains NaN or inf")
    y = check_multiclass(probs, labels, n)
    k = probs.shape[1]
    g = ld._as_1d(grad_norms, "grad_norms", n)
    if (g < 0).any():
        raise ValueError("grad_norms must be >= 0")
    xt = ld._design(x, bias)
    xnorm = np.linalg.norm(xt, axis=1)
    onehot = np.eye(k)
    layer_part = scale * np.linalg.norm(probs[:, None, :] - onehot[None], axis=2) * xnorm[:, None]  # [N, K]
    ld._check_grad_norms(g, layer_part[np.arange(n), y], "kappa ||p - e_y|| ||[x, 1]||")
    flip_clip = gf = exact_clip = None
    if callable(flipped_grad_norms):
        # estimate (the whole gradient scaled like its last-layer part) to rank the pairs; the
        # callable gives the exact norms of the pairs evaluated
        size = np.linalg.norm(probs[:, None, :] - onehot[None], axis=2)  # [N, K]
        own = size[np.arange(n), y]
        gf = np.maximum(g[:, None] * size / np.where(own > 0, own, np.inf)[:, None], layer_part)
        gf[np.arange(n), y] = g
        fn = flipped_grad_norms

        def exact_clip(rows: np.ndarray, labs: np.ndarray) -> np.ndarray:
            norms = np.asarray(fn(rows, labs), dtype=float).reshape(-1)
            if norms.shape != rows.shape or not np.isfinite(norms).all() or (
                    norms < layer_part[rows, labs] * (1.0 - ld._GRAD_NORM_RTOL)).any():
                raise ValueError("flipped_grad_norms(rows, labels) must return finite norms, one per pair, >= the "
                                 "last-layer part kappa ||p - e_k|| ||[x, 1]||")
            gf[rows, labs] = norms
            return ld._clip(norms, c_max)

        flip_clip = ld._clip(gf, c_max)
    elif flipped_grad_norms is not None:
        gf = np.asarray(flipped_grad_norms, dtype=float)
        if gf.shape != (n, k):
            raise ValueError(f"flipped_grad_norms must have shape [{n}, {k}], got {gf.shape}")
        if not np.isfinite(gf).all() or (gf < layer_part * (1.0 - ld._GRAD_NORM_RTOL)).any():
            raise ValueError(
                "flipped_grad_norms must be finite and >= the last-layer part kappa ||p - e_k|| "
                "||[x, 1]|| of the gradient at each label k (whole per-example gradient norms)"
            )
        flip_clip = ld._clip(gf, c_max)
    if gram_inv_diag is None:
        v = ld._gram_inv_diag(xt, eps)
    else:
        v = ld._as_1d(gram_inv_diag, "gram_inv_diag", n)
        if xt.shape[1] < n:
            ld._gram_inv_diag(xt, eps)  # raises the N > d error
        if (v <= 0).any():
            raise ValueError("gram_inv_diag must be > 0 (diagonal of the inverse of a positive definite matrix)")
    clip = ld._clip(g, c_max)
    s = sigma * c_max / n_e
    sd = s * np.sqrt(v)
    out = multiclass_bounds(coef=probs, y=y, clip=clip, flip_clip=flip_clip, scale=scale, sd=sd,
                            n_e=n_e, delta=delta, max_pairs=max_pairs, p0_for_all=p0_for_all,
                            exact_clip=exact_clip)
    lb = out["lower_bound"]
    ok = np.isfinite(lb)
    if ok.any():
        best = int(np.argmax(np.where(ok, lb, -np.inf)))
        batch = float(max(0.0, lb[best]))
    else:
        best, batch = -1, 0.0
    rows = np.arange(n)
    worst = out["worst_labels"]
    if gf is not None:
        g_flip = gf[rows, worst]
        g_flip_max = gf.max(axis=1)
    else:  # unknown: the all-parameter pair takes the largest possible clipped norm, C
        g_flip = np.full(n, np.inf)
        g_flip_max = g_flip
    mu_opt = out["optimal_test_mu"]
    mu_layer = out["coef_shift_norm_max"] * xnorm / (sigma * c_max)
    mu_all = (np.minimum(g, c_max) + np.minimum(g_flip_max, c_max)) / (sigma * c_max)
    eps_max = [ld._epsilon_of_mu(float(m.max()), delta) for m in (mu_opt, mu_layer, mu_all)]
    ro = ld._readonly
    return ld.LabelDPBounds(
        p0=ro(np.exp(out["log_p0"])), p1=ro(np.exp(out["log_p1"])), log_p0=ro(out["log_p0"]),
        log_p1=ro(out["log_p1"]), lower_bound=ro(lb), epsilon_lower_bound=batch, best_index=best,
        optimal_test_mu=ro(mu_opt), optimal_test_epsilon_max=float(eps_max[0]),
        layer_pair_mu=ro(mu_layer), layer_pair_epsilon_max=float(eps_max[1]),
        all_params_pair_mu=ro(mu_all), all_params_pair_epsilon_max=float(eps_max[2]),
        single_step_epsilon=float(ld._single_step_epsilon(sigma, delta)),
        statistic_mean0=ro(out["statistic_mean0"]), statistic_mean1=ro(out["statistic_mean1"]),
        statistic_std=ro(sd), gram_inv_diag=ro(v), clip_factors=ro(clip),
        flipped_grad_norms=ro(g_flip), flipped_clip_factors=ro(out["flipped_clip"]), noise_std=float(s),
        delta=delta, noise_multiplier=sigma, max_grad_norm=c_max, expected_batch_size=n_e, n=n,
        num_classes=k, worst_labels=ro(worst),
    )
