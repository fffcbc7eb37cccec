"""One auditor for any canary scores: estimates and valid lower bounds on epsilon (nats).

``CanaryScoreAuditor(in_scores, out_scores)`` takes attack scores of inserted ("in", shape (k,))
and held-out ("out", shape (k',)) canaries, higher meaning "inserted", and offers the two-Gaussian
estimate of Andrew et al. (ICLR 2024), Clopper-Pearson bounds with a valid threshold choice, the
one-run bounds of Steinke, Nasr & Jagielski (NeurIPS 2023) and of Mahloujifar, Melis & Chaudhuri
(2024, f-DP with the Gaussian trade-off family), a parametric GDP bound, TPR at FPR and AUROC.
Each method returns a frozen :class:`ScoreAuditResult`; ``docs/methods/score_auditor.md`` writes
out every formula. Pure numpy/scipy; torch tensors are accepted without importing torch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats
from scipy.optimize import brentq
from scipy.special import gammaln, ndtr, ndtri

from ._validation import check_alpha, check_count, check_dim, check_real_finite
from .canary_epsilon import estimate_epsilon_from_cosines
from .cosine_null import _logsf_raw
from .gaussian import _log_sub, gaussian_epsilon_array
from .intervals import _cp_upper

__all__ = ["CanaryScoreAuditor", "ScoreAuditResult"]

SRC_ANDREW = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical "
              "Privacy Estimation for Federated Learning, ICLR 2024, §3.2, Alg. 1-3, Thm 3.3")
SRC_CP = ("Jagielski, Ullman, Oprea (2020), Auditing Differentially Private Machine Learning, "
          "NeurIPS 2020 (Clopper-Pearson bounds on FPR/FNR); Kairouz, Oh, Viswanath (2015), "
          "Thm 2.1 (FPR + e^eps FNR >= 1 - delta)")
SRC_STEINKE = ("Steinke, Nasr, Jagielski (2023), Privacy Auditing with One (1) Training Run, "
               "NeurIPS 2023, Thm 3.1 (binomial tail), Thm 5.2 / Alg. 2 (delta term)")
SRC_MAHLOUJIFAR = ("Mahloujifar, Melis, Chaudhuri (2024), Auditing f-Differential Privacy in One "
                   "Run, arXiv:2410.22235, §4 (tail of correct guesses under f-DP, recursion); "
                   "Gaussian trade-off f(x) = Phi(Phi^-1(1-x) - mu), Dong, Roth, Su (2022)")
SRC_GDP = "Dong, Roth, Su (2022), Gaussian Differential Privacy, JRSS-B, Def. 2.6, Cor. 2.13"
SRC_ROC = ("Carlini, Chien, Nasr, Song, Terzis, Tramer (2022), Membership Inference Attacks From "
           "First Principles, IEEE S&P, §4; ROC convex hull (Provost & Fawcett 2001)")
SRC_AUC = "Hanley & McNeil (1982), The meaning and use of the area under a ROC curve, eq. (1)"

Threshold = Literal["bonferroni", "split"]
_EPS_MAX = 60.0  # largest epsilon the one-run searches consider (p-values saturate long before)
_MU_MAX = 40.0


@dataclass(frozen=True)
class ScoreAuditResult:
    """What one :class:`CanaryScoreAuditor` method reports.

    Attributes:
        value: the estimate, bound, TPR or AUROC (epsilon in nats), finite.
        method: short name, e.g. ``"clopper_pearson_bonferroni"``; source: authors, year,
            title and section/equation of the formula.
        alpha: 1 - confidence of a lower bound; delta: the delta of epsilon (else ``None``).
        threshold: the score threshold behind the value, when one was chosen.
        counts: integer counts (``k_in``, ``k_out``, ``fn``, ``fp``, ``guesses``, ...).
        lower, upper: a bootstrap interval (estimate only), else ``None``.
        gof_pvalue: goodness-of-fit p-value of the Gaussian model (GDP bound only).
        details: further JSON-serialisable numbers (fitted means, mu bounds, ...).
    """

    value: float
    method: str
    source: str
    alpha: float | None = None
    delta: float | None = None
    threshold: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    lower: float | None = None
    upper: float | None = None
    gof_pvalue: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"ScoreAuditResult.value must be finite, got {self.value!r}")



def _as_scores(x: object, name: str) -> np.ndarray:
    """1-D float64 scores: torch tensors via .detach().cpu().float(); bool/non-numeric refused."""
    if hasattr(x, "detach"):
        t = x.detach().cpu()  # type: ignore[attr-defined]
        if "bool" in str(getattr(t, "dtype", "")):
            raise ValueError(f"{name} must be real-valued scores, got a bool tensor")
        x = np.asarray(t.float())
    arr = np.asarray(x)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise ValueError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    arr = arr.astype(float)
    for bad, msg in (
        (arr.ndim != 1, f"must be 1-D, got shape {arr.shape}"),
        (arr.size < 2, f"needs at least 2 scores, got {arr.size}"),
        (not np.all(np.isfinite(arr)), "contains NaN or inf"),
        (arr.size > 0 and np.ptp(arr) == 0, "are all equal: no spread to audit"),
    ):
        if bad:
            raise ValueError(f"{name} {msg}")
    return arr


def _check_delta(delta: object, allow_zero: bool) -> float:
    v = check_real_finite(delta, "delta")
    if not ((0.0 <= v < 1.0) if allow_zero else (0.0 < v < 1.0)):
        rng = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"delta must be in {rng} for this method, got {delta!r}")
    return v



def _cp_eps(
    fn: np.ndarray, k: int, log_fpr_u: np.ndarray, log_1m_fpr_u: np.ndarray, q_fnr: float,
    delta: float,
) -> tuple[np.ndarray, np.ndarray]:
    """eps(tau) = max(log((1-delta-FPR_u)/FNR_u), log((1-delta-FNR_u)/FPR_u)), floored at 0.

    FNR_u = Beta(fn+1, k-fn).ppf(q_fnr) (1 at fn = k); returns (eps, FNR_u)."""
    fnr_u = _cp_upper(fn.astype(float), k, q_fnr)
    with np.errstate(divide="ignore"):
        log_fnr_u, log_1m_fnr_u = np.log(fnr_u), np.log1p(-fnr_u)
    if delta > 0.0:
        ld = math.log(delta)
        num1 = _log_sub(log_1m_fpr_u, np.full_like(log_fnr_u, ld))
        num2 = _log_sub(log_1m_fnr_u, np.full_like(log_fnr_u, ld))
    else:
        num1, num2 = log_1m_fpr_u, log_1m_fnr_u
    with np.errstate(invalid="ignore"):
        e1 = np.where(np.isfinite(num1), num1 - log_fnr_u, -np.inf)
        e2 = np.where(np.isfinite(num2), num2 - log_fpr_u, -np.inf)
    eps = np.maximum(np.maximum(e1, e2), 0.0)
    return np.where(np.isfinite(eps), eps, 0.0), fnr_u


def _fpr_logs(
    out_sorted: np.ndarray, taus: np.ndarray, dim: int | None, q_fpr: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fp counts, log FPR_u, log(1 - FPR_u)) at each tau: CP bound, or exact with ``dim``."""
    fp = out_sorted.size - np.searchsorted(out_sorted, taus, side="left")
    if dim is not None:
        t = np.clip(taus, -1.0, float(np.nextafter(1.0, 0.0)))
        return fp, _logsf_raw(t, dim), _logsf_raw(-t, dim)
    fpr_u = _cp_upper(fp.astype(float), out_sorted.size, q_fpr)
    with np.errstate(divide="ignore"):
        return fp, np.log(fpr_u), np.log1p(-fpr_u)



def _count_grid(n: int) -> np.ndarray:
    """{0, 1, 2, 4, 8, ...} below n: the error counts the threshold scan tries."""
    g = 2 ** np.arange(int(math.log2(max(n, 2))) + 1, dtype=np.int64)
    return np.concatenate([[0], g[g < n]])


def _guess_grid(m: int) -> np.ndarray:
    """Numbers of guesses per side, fixed by m alone: round(m/2 * 2^(-j/2)), j = 0, 1, ..."""
    g = np.round(m / 2.0 * 2.0 ** (-np.arange(2.0 * math.log2(m) + 2.0) / 2.0)).astype(np.int64)
    return np.unique(g[g >= 1])


def _guess_counts(
    in_scores: np.ndarray, out_scores: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate guess rules and their counts: (guesses, correct, n_top, n_bottom).

    Rule (t, b): guess "in" for the t highest scores and "out" for the b lowest, abstain on the
    rest. Candidates: one-sided (t, 0) and symmetric (t, t) for t in :func:`_guess_grid`
    (2t <= m). Ties are ordered by a seeded random key, never by membership.
    """
    m = in_scores.size + out_scores.size
    s = np.concatenate([in_scores, out_scores])
    member = np.concatenate([np.ones(in_scores.size, bool), np.zeros(out_scores.size, bool)])
    key = np.random.default_rng(seed).random(m)
    order = np.lexsort((key, -s))  # descending score, random among ties
    ins = member[order]
    top = np.concatenate([[0], np.cumsum(ins)])  # in-members among the t highest
    outs_bottom = np.concatenate([[0], np.cumsum(~ins[::-1])])  # out-members among b lowest
    grid = _guess_grid(m)
    sym = grid[2 * grid <= m]
    n_top = np.concatenate([grid, sym])
    n_bot = np.concatenate([np.zeros_like(grid), sym])
    correct = top[n_top] + outs_bottom[n_bot]
    return n_top + n_bot, correct, n_top, n_bot


def _log_binom_coef(n: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """log C(n_c, j) for j = 0..width-1 (-inf where j > n_c), and the j grid."""
    j = np.arange(width, dtype=float)[None, :]
    nn = n.astype(float)[:, None]
    with np.errstate(invalid="ignore"):
        lc = gammaln(nn + 1.0) - gammaln(j + 1.0) - gammaln(np.maximum(nn - j, 0.0) + 1.0)
    return np.where(j <= nn, lc, -np.inf), j


def _one_run_pvalue(
    eps: np.ndarray, n: np.ndarray, v: np.ndarray, m: np.ndarray, delta: float, lc: np.ndarray,
    j: np.ndarray,
) -> np.ndarray:
    """P-value of v correct out of n guesses under (eps, delta)-DP, one per lane:
    P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i, B ~ Binomial(n, e^eps/(1+e^eps))."""
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
    n = np.asarray(n, np.int64)
    return n, np.asarray(v, np.int64), np.asarray(m, float), np.broadcast_to(level, n.shape)


def _one_run_eps(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, delta: float, iters: int = 42
) -> np.ndarray:
    """Largest eps whose (eps, delta)-DP claim the count v/n rejects at ``level``, per lane."""
    n, v, m, level = _lanes(n, v, m, level)
    lc, j = _log_binom_coef(n, int(n.max()) + 1)
    out = np.zeros(n.size)
    idx = np.flatnonzero((v > 0) & (_one_run_pvalue(out, n, v, m, delta, lc, j) <= level))
    n, v, m, level, lc = n[idx], v[idx], m[idx], level[idx], lc[idx]
    lo, hi = np.zeros(idx.size), np.full(idx.size, _EPS_MAX)
    for _ in range(iters if idx.size else 0):
        mid = 0.5 * (lo + hi)
        rej = _one_run_pvalue(mid, n, v, m, delta, lc, j) <= level
        lo, hi = np.where(rej, mid, lo), np.where(rej, hi, mid)
    out[idx] = lo
    return out


def _fdp_rejects(
    mu: np.ndarray, n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray
) -> np.ndarray:
    """Whether v correct out of n guesses rejects mu-GDP at ``level``, per lane.

    The recursion of Mahloujifar et al. (2024): r = level v/m, h = level (n - v)/m; for
    i = v-1, ..., 0: h' = max(h, g(r)) with g(x) = Phi(Phi^-1(x) - mu) = f(1 - x),
    r <- min(r + i/(n - i) (h' - h), 1), h <- h'; stop early once h' = h. Rejects iff
    r + h > n/m. Lanes advance together; finished lanes are dropped every 16 steps.
    """
    r, h, i = level * v / m, level * (n - v) / m, (v - 1).astype(float)
    live = np.flatnonzero(v > 0)
    rr, hh, ii, mm, nn = r[live], h[live], i[live], mu[live], n[live].astype(float)
    step = 0
    while live.size:
        g = ndtr(ndtri(rr) - mm)
        act = ii >= 0
        h_new = np.where(act, np.maximum(hh, g), hh)
        moved = act & (h_new > hh)
        rr = np.where(moved, np.minimum(rr + ii / np.maximum(nn - ii, 1.0) * (h_new - hh), 1.0), rr)
        hh = h_new
        ii = np.where(moved, ii - 1.0, -1.0)
        step += 1
        if step % 16 == 0 or not moved.any():
            r[live], h[live] = rr, hh
            live, rr, hh, ii, mm, nn = (a[moved] for a in (live, rr, hh, ii, mm, nn))
    return r + h > n / m


def _fdp_mu(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, iters: int = 36
) -> np.ndarray:
    """Largest mu whose mu-GDP claim is rejected (0 when even mu = 0 is not), per lane."""
    n, v, m, level = _lanes(n, v, m, level)
    ok0 = _fdp_rejects(np.zeros(n.size), n, v, m, level)
    lo, hi, idx = np.zeros(n.size), np.full(n.size, _MU_MAX), np.flatnonzero(ok0)
    for _ in range(iters if idx.size else 0):
        mid = 0.5 * (lo[idx] + hi[idx])
        rej = _fdp_rejects(mid, n[idx], v[idx], m[idx], level[idx])
        lo[idx] = np.where(rej, mid, lo[idx])
        hi[idx] = np.where(rej, hi[idx], mid)
    return np.where(ok0, lo, 0.0)



class CanaryScoreAuditor:
    """Audit differential privacy from the scores of inserted and held-out canaries.

    Higher scores mean "inserted" (negate scores that work the other way). The in-scores
    x_1..x_k belong to canaries that were inserted into the audited run, the out-scores
    y_1..y_k' to canaries that were not. For :meth:`epsilon_one_run` and
    :meth:`epsilon_one_run_fdp` the m = k + k' canaries must have been a single pool in which
    each canary was inserted independently with probability 1/2 (in = inserted, out = not);
    see those methods.

    Args:
        in_scores: shape (k,), k >= 2, real finite scores of inserted canaries (array, list or
            torch tensor), not all equal.
        out_scores: shape (k',), k' >= 2, scores of not-inserted canaries, not all equal.
        dim: optional dimension d >= 2 for cosine scores (random unit canaries against the
            release): the null is then the exact law (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2) (mean
            0, sd 1/sqrt(d)): :meth:`epsilon_estimate` fits with sd 1/sqrt(d) and
            :meth:`epsilon_lower_bound` takes FPR from its exact survival function (any d).

    Raises:
        ValueError: fewer than 2 scores in a group, NaN/inf, all scores of a group equal,
            bool or non-numeric arrays, not 1-D; dim < 2; cosines outside [-1, 1] with dim.
    """

    def __init__(self, in_scores: object, out_scores: object, *, dim: int | None = None) -> None:
        self.in_scores = _as_scores(in_scores, "in_scores")
        self.out_scores = _as_scores(out_scores, "out_scores")
        self.dim = None if dim is None else check_dim(dim)
        if self.dim is not None:
            for name, arr in (("in_scores", self.in_scores), ("out_scores", self.out_scores)):
                if np.any(np.abs(arr) > 1.0 + 1e-9):
                    raise ValueError(f"{name} must be cosines in [-1, 1] when dim is given")
        self._in_sorted, self._out_sorted = np.sort(self.in_scores), np.sort(self.out_scores)
        self.k_in, self.k_out = int(self.in_scores.size), int(self.out_scores.size)

    @classmethod
    def from_cosines(cls, in_cosines: object, out_cosines: object, dim: int) -> CanaryScoreAuditor:
        """Auditor of cosine scores with the exact null of dimension ``dim`` (see the class)."""
        return cls(in_cosines, out_cosines, dim=dim)

    def _counts(self) -> dict[str, int]:
        return {"k_in": self.k_in, "k_out": self.k_out}


    def epsilon_estimate(
        self, delta: float, fit: Literal["equal", "unequal"] = "equal", bootstrap: int = 0,
        confidence: float = 0.95, seed: int = 0,
    ) -> ScoreAuditResult:
        """Two-Gaussian epsilon estimate (not a bound): eps(N(m1, s1^2) || N(m0, s0^2); delta).

        m1 is the mean of the in-scores; the null N(m0, s0^2) is fitted to the out-scores
        (sample mean and sd, ddof=1), or with ``dim`` is the exact cosine law's N(0, 1/d)
        moments. fit="equal": s1 = s0 (only the shift (m1 - m0)/s0 is estimated: the pair is
        mu-GDP with that mu); fit="unequal": s1 = sample sd of the in-scores. The estimate is
        invariant to any common increasing affine map of the scores (applied internally so
        arbitrary scores reuse the cosine estimator).

        Args:
            delta: in (0, 1). fit: "equal" or "unequal". bootstrap: B >= 0 percentile-bootstrap
                resamples (0: none). confidence: interval level in (0, 1). seed: numpy seed.

        Returns:
            ScoreAuditResult: value = eps (nats, >= 0), lower/upper = bootstrap percentiles,
            details: shift, sd_ratio, mu_in, sd_in, mu_null, sd_null (score units).

        Raises:
            ValueError: delta not in (0, 1), unknown fit, bootstrap < 0, confidence not in (0, 1).

        Source: Andrew et al. (2024), ICLR 2024, §3.2 (two Gaussians), Alg. 1-3, Thm 3.3.
        """
        d = _check_delta(delta, allow_zero=False)
        if fit not in ("equal", "unequal"):
            raise ValueError(f"fit must be 'equal' or 'unequal', got {fit!r}")
        if self.dim is not None:
            est = estimate_epsilon_from_cosines(
                self.in_scores, d, dim=self.dim, fit=fit, bootstrap=bootstrap,
                confidence=confidence, seed=seed,
            )
            shift, scale = 0.0, 1.0
        else:
            both = np.concatenate([self.in_scores, self.out_scores])
            shift = float(np.median(both))
            scale = 2.0 * float(np.max(np.abs(both - shift)))
            est = estimate_epsilon_from_cosines(
                (self.in_scores - shift) / scale, d, unobserved=(self.out_scores - shift) / scale,
                fit=fit, bootstrap=bootstrap, confidence=confidence, seed=seed,
            )
        ex = est.extras
        return ScoreAuditResult(
            value=est.value, method=f"two_gaussians_{fit}", source=SRC_ANDREW, delta=d,
            counts=self._counts(), lower=est.lower, upper=est.upper,
            details={
                "shift": ex["shift"], "sd_ratio": ex["sd_ratio"],
                "mu_in": ex["mu_observed"] * scale + shift, "sd_in": ex["sigma_observed"] * scale,
                "mu_null": ex["mu_null"] * scale + shift, "sd_null": ex["sigma_null"] * scale,
                "null": "exact_cosine" if self.dim is not None else "out_scores",
                "dim": self.dim, "bootstrap": ex["bootstrap"],
                "bootstrap_dropped": ex["bootstrap_dropped"], "confidence": est.confidence,
            },
        )


    def _cp_at(
        self, in_sorted: np.ndarray, out_sorted: np.ndarray, taus: np.ndarray, a: float,
        delta: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """eps(tau) with both rates bounded at 1 - a/2 (FNR alone at 1 - a with the exact
        null), and the fn, fp counts."""
        fn = np.searchsorted(in_sorted, taus, side="left")
        q = 1.0 - (a if self.dim is not None else a / 2.0)
        fp, lfpr, l1mfpr = _fpr_logs(out_sorted, taus, self.dim, q)
        eps, _ = _cp_eps(fn, in_sorted.size, lfpr, l1mfpr, q, delta)
        return eps, fn, fp

    @staticmethod
    def _taus(in_sorted: np.ndarray, out_sorted: np.ndarray) -> np.ndarray:
        """Candidate thresholds, their number fixed by (k, k'): just above the (j+1)-th largest
        out-score (fp = j) and at the (i+1)-th smallest in-score (fn = i), j, i in
        :func:`_count_grid`."""
        above = np.nextafter(out_sorted[out_sorted.size - 1 - _count_grid(out_sorted.size)], np.inf)
        return np.concatenate([above, in_sorted[_count_grid(in_sorted.size)]])

    def epsilon_lower_bound(
        self, alpha: float = 0.05, delta: float = 0.0,
        threshold: Threshold | float = "bonferroni", seed: int = 0,
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound on epsilon from Clopper-Pearson bounds on FNR and FPR.

        Rule "in iff score >= tau": FNR = #{x < tau}/k, FPR = #{y >= tau}/k'. With upper
        Clopper-Pearson bounds FNR_u, FPR_u at 1 - a/2 each, eps(tau) = max(log((1 - delta -
        FPR_u)/FNR_u), log((1 - delta - FNR_u)/FPR_u)), floored at 0 (an (eps, delta)-DP
        mechanism has FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta).
        Thresholds: "bonferroni" scans T candidates whose number depends only on (k, k') --
        just above the (j+1)-th largest out-score (fp = j) and at the (i+1)-th smallest
        in-score (fn = i), j, i in {0, 1, 2, 4, 8, ...} (powers of 2 below k', k) -- at
        a = alpha/T, so all hold at once with 1 - alpha; "split" picks tau on a random half
        (``seed``, a = alpha) and evaluates it on the other half; a float is a fixed tau
        (a = alpha). With ``dim``, FPR is the exact null survival and FNR_u is at 1 - a.

        Args:
            alpha: in (0, 1). delta: in [0, 1). threshold: "bonferroni", "split" or a float.
            seed: seed of the split.

        Returns:
            ScoreAuditResult: value = eps_lo (nats, >= 0), alpha, delta, threshold, counts
            (k_in, k_out, fn, fp, candidates; k_in_test, k_out_test for "split").

        Raises:
            ValueError: alpha not in (0, 1), delta not in [0, 1), unknown or non-finite
                threshold, fewer than 4 scores per group with "split".

        Source: Jagielski, Ullman, Oprea (2020), NeurIPS, §3 (Clopper-Pearson); Kairouz, Oh,
        Viswanath (2015), Thm 2.1 (the two inequalities).
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=True)
        counts = self._counts()
        details: dict[str, Any] = {}
        if isinstance(threshold, str):
            if threshold not in ("bonferroni", "split"):
                raise ValueError(f"threshold must be 'bonferroni', 'split' or a float: {threshold!r}")
            if threshold == "bonferroni":
                taus = self._taus(self._in_sorted, self._out_sorted)
                eps, fn, fp = self._cp_at(self._in_sorted, self._out_sorted, taus, a / taus.size, d)
                i = int(np.argmax(eps))
                counts["candidates"] = int(taus.size)
            else:
                if self.k_in < 4 or self.k_out < 4:
                    raise ValueError("threshold='split' needs at least 4 in- and 4 out-scores")
                rng = np.random.default_rng(seed)
                pi, po = rng.permutation(self.k_in), rng.permutation(self.k_out)
                hi_, ho = self.k_in // 2, self.k_out // 2
                ia, ib = np.sort(self.in_scores[pi[:hi_]]), np.sort(self.in_scores[pi[hi_:]])
                oa, ob = np.sort(self.out_scores[po[:ho]]), np.sort(self.out_scores[po[ho:]])
                cand = self._taus(ia, oa)
                eps_a, _, _ = self._cp_at(ia, oa, cand, a, d)
                j = int(np.argmax(eps_a))
                taus = cand[j : j + 1]
                eps, fn, fp = self._cp_at(ib, ob, taus, a, d)
                i = 0
                counts.update(candidates=int(cand.size), k_in_test=int(ib.size),
                              k_out_test=int(ob.size))
                details.update(selection_bound=float(eps_a[j]), seed=int(seed))
        else:
            taus = np.array([check_real_finite(threshold, "threshold")])
            eps, fn, fp = self._cp_at(self._in_sorted, self._out_sorted, taus, a, d)
            i = 0
            counts["candidates"] = 1
        counts.update(fn=int(fn[i]), fp=int(fp[i]))
        rule = threshold if isinstance(threshold, str) else "fixed"
        tau_i = float(taus[i])
        return ScoreAuditResult(
            value=float(eps[i]), method=f"clopper_pearson_{rule}", source=SRC_CP, alpha=a,
            delta=d, threshold=tau_i if math.isfinite(tau_i) else None, counts=counts,
            details={**details, "fpr": "exact_cosine" if self.dim else "clopper_pearson"},
        )


    def _one_run(self, fdp: bool, alpha: float, delta: float, seed: int) -> ScoreAuditResult:
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=not fdp)
        n, v, nt, nb = _guess_counts(self.in_scores, self.out_scores, check_count(seed, "seed"))
        m = np.full(n.size, float(self.k_in + self.k_out))
        level = np.full(n.size, a / n.size)
        val = _fdp_mu(n, v, m, level) if fdp else _one_run_eps(n, v, m, level, d)
        b = int(np.argmax(val))
        details: dict[str, Any] = {"level_per_candidate": a / n.size, "seed": int(seed)}
        eps = float(val[b])
        if fdp:
            details["mu_lower"] = eps
            eps = float(gaussian_epsilon_array(np.array([eps]), d)[0])
        counts = {**self._counts(), "m": self.k_in + self.k_out, "guesses": int(n[b]),
                  "correct": int(v[b]), "guess_in": int(nt[b]), "guess_out": int(nb[b]),
                  "candidates": int(n.size)}
        return ScoreAuditResult(
            value=eps, method="one_run_fdp" if fdp else "one_run",
            source=SRC_MAHLOUJIFAR if fdp else SRC_STEINKE, alpha=a, delta=d, counts=counts,
            details=details,
        )

    def epsilon_one_run(
        self, alpha: float = 0.05, delta: float = 0.0, seed: int = 0
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound on epsilon from one run (Steinke, Nasr, Jagielski 2023).

        Setting: the m = k + k' canaries form one pool and each was inserted independently
        with probability 1/2 before the run; ``in_scores`` are the scores of those inserted,
        ``out_scores`` of the others (so k and k' are random; a fixed random half is the usual
        approximation). The auditor guesses "in" for the t highest scores and "out" for the b
        lowest and abstains on the rest (n = t + b guesses, v correct). Under (eps, delta)-DP,
        P[V >= v] <= P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i with
        B ~ Binomial(n, e^eps / (1 + e^eps)); the bound is the largest eps this p-value
        rejects. The rule is one of C candidates fixed by m (one-sided (t, 0) and symmetric
        (t, t), t = round(m/2 * 2^(-j/2))), each tested at alpha/C (Bonferroni), so the best
        keeps 1 - alpha.

        Args:
            alpha: in (0, 1). delta: in [0, 1). seed: seed of the random order among ties.

        Returns:
            ScoreAuditResult: value = eps_lo (nats, >= 0), counts: m, guesses, correct,
            guess_in, guess_out, candidates.

        Raises:
            ValueError: alpha not in (0, 1), delta not in [0, 1).

        Source: Steinke, Nasr, Jagielski (2023), NeurIPS, Thm 3.1 and Thm 5.2 / Alg. 2.
        """
        return self._one_run(False, alpha, delta, seed)

    def epsilon_one_run_fdp(
        self, alpha: float = 0.05, delta: float = 1e-5, seed: int = 0
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound from one run under f-DP (Mahloujifar, Melis, Chaudhuri 2024).

        Same setting, guesses and Bonferroni level a = alpha/C as :meth:`epsilon_one_run`; the
        null hypothesis is mu-GDP, trade-off f(x) = Phi(Phi^-1(1 - x) - mu). Their recursion
        bounds the tail of the correct guesses: r = a v/m, h = a (n - v)/m; for i = v-1 down
        to 0: h' = max(h, f(1 - r)), r <- min(r + i/(n - i) (h' - h), 1), h <- h'; mu-GDP is
        rejected iff r + h > n/m. The largest rejected mu (bisection) is converted to epsilon
        at delta: delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu).

        Args:
            alpha: in (0, 1). delta: in (0, 1). seed: seed of the random order among ties.

        Returns:
            ScoreAuditResult: value = eps_lo (nats), details["mu_lower"], counts as
            :meth:`epsilon_one_run`.

        Raises:
            ValueError: alpha not in (0, 1), delta not in (0, 1).

        Source: Mahloujifar, Melis, Chaudhuri (2024), arXiv:2410.22235, §4; Dong, Roth, Su
        (2022), Cor. 2.13 (mu to (eps, delta)).
        """
        return self._one_run(True, alpha, delta, seed)


    def epsilon_gdp_lower_bound(self, alpha: float = 0.05, delta: float = 1e-5) -> ScoreAuditResult:
        """(1 - alpha) lower bound assuming x ~ N(m1, s^2), y ~ N(m0, s^2) (equal variance).

        mu_hat = (mean(x) - mean(y)) / s_pooled. T = mu_hat / sqrt(1/k + 1/k') is noncentral
        t with k + k' - 2 degrees of freedom and noncentrality lambda = mu / sqrt(1/k + 1/k');
        lambda_lo solves P[T <= t_obs; lambda_lo] = 1 - alpha (exact one-sided bound), and
        mu_lo = lambda_lo sqrt(1/k + 1/k'). eps_lo = eps_GDP(mu_lo, delta) if mu_lo > 0, else
        0 (never |mu|). Valid only as far as the Gaussian equal-variance model holds: check
        ``gof_pvalue`` (Shapiro-Wilk, or D'Agostino-Pearson above 5000 scores, on the pooled
        residuals x - mean(x), y - mean(y)) and ``details["equal_variance_pvalue"]``
        (Brown-Forsythe); small values mean the bound may not hold (None: undefined).

        Args:
            alpha: in (0, 1). delta: in (0, 1).

        Returns:
            ScoreAuditResult: value = eps_lo (nats, >= 0), gof_pvalue, details: mu_hat,
            mu_lower, t_statistic, df, gof_test, equal_variance_pvalue.

        Raises:
            ValueError: alpha or delta not in (0, 1).

        Source: Dong, Roth, Su (2022), JRSS-B, Def. 2.6, Cor. 2.13; noncentral-t bound on
        the standardized mean difference (e.g. Hedges & Olkin 1985, §5).
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=False)
        x, y = self.in_scores, self.out_scores
        df = x.size + y.size - 2
        sp = math.sqrt((np.sum((x - x.mean()) ** 2) + np.sum((y - y.mean()) ** 2)) / df)
        mu_hat = (float(x.mean()) - float(y.mean())) / sp
        se0 = math.sqrt(1.0 / x.size + 1.0 / y.size)
        t_obs = mu_hat / se0
        mu_lo = _nct_lower(t_obs, df, a) * se0
        eps = float(gaussian_epsilon_array(np.array([mu_lo]), d)[0]) if mu_lo > 0 else 0.0
        resid = np.concatenate([x - x.mean(), y - y.mean()]) / sp
        small = resid.size <= 5000
        gof = _pvalue(stats.shapiro if small else stats.normaltest, resid)
        gof_name = "shapiro_wilk" if small else "dagostino_pearson"
        ev = _pvalue(stats.levene, x, y, center="median")
        return ScoreAuditResult(
            value=eps, method="gdp_noncentral_t", source=SRC_GDP, alpha=a, delta=d,
            counts=self._counts(), gof_pvalue=gof,
            details={"mu_hat": mu_hat, "mu_lower": mu_lo if math.isfinite(mu_lo) else None,
                     "t_statistic": t_obs, "df": df, "gof_test": gof_name,
                     "equal_variance_pvalue": ev},
        )


    def _roc(self) -> tuple[np.ndarray, np.ndarray]:
        taus = np.append(np.union1d(self._in_sorted, self._out_sorted), np.inf)
        tpr = 1.0 - np.searchsorted(self._in_sorted, taus, side="left") / self.k_in
        fpr = 1.0 - np.searchsorted(self._out_sorted, taus, side="left") / self.k_out
        return fpr[::-1], tpr[::-1]  # increasing fpr, from (0, .) to (1, 1)

    def tpr_at_fpr(self, fpr: float) -> ScoreAuditResult:
        """Largest TPR at false-positive rate ``fpr`` over threshold rules "in iff score >= tau"
        and their randomized mixtures (the upper concave hull of the empirical ROC).

        Args:
            fpr: in [0, 1]. Returns: ScoreAuditResult, value = TPR in [0, 1].

        Raises:
            ValueError: fpr not in [0, 1].

        Source: Carlini et al. (2022), Membership Inference Attacks From First Principles,
        IEEE S&P, §4 (TPR at low FPR); Provost & Fawcett (2001) (ROC convex hull).
        """
        f = check_real_finite(fpr, "fpr")
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"fpr must be in [0, 1], got {fpr!r}")
        hx, hy = _upper_hull(*self._roc())
        return ScoreAuditResult(value=float(np.interp(f, hx, hy)), method="tpr_at_fpr",
                                source=SRC_ROC, counts=self._counts(), details={"fpr": f})

    def auroc(self) -> ScoreAuditResult:
        """Area under the empirical ROC: P(x > y) + P(x = y)/2 over all in/out pairs (the
        Mann-Whitney U statistic divided by k k').

        Returns:
            ScoreAuditResult: value in [0, 1], method "auroc".

        Source: Hanley & McNeil (1982), Radiology 143, eq. (1) (AUC = U / (k k')).
        """
        lo = np.searchsorted(self._out_sorted, self.in_scores, side="left")
        hi = np.searchsorted(self._out_sorted, self.in_scores, side="right")
        u = float(np.sum(lo) + 0.5 * np.sum(hi - lo))
        return ScoreAuditResult(value=u / (self.k_in * self.k_out), method="auroc",
                                source=SRC_AUC, counts=self._counts())


def _upper_hull(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper concave hull of points sorted by x (monotone chain)."""
    h: list[tuple[float, float]] = []
    for p in zip(x.tolist(), y.tolist(), strict=True):
        while h and p[0] == h[-1][0] and p[1] >= h[-1][1]:
            h.pop()
        if h and p[0] == h[-1][0]:
            continue
        while len(h) >= 2 and ((h[-1][0] - h[-2][0]) * (p[1] - h[-2][1])
                               - (h[-1][1] - h[-2][1]) * (p[0] - h[-2][0])) >= 0:
            h.pop()
        h.append(p)
    return np.array([q[0] for q in h]), np.array([q[1] for q in h])


def _pvalue(test: Any, *args: Any, **kwargs: Any) -> float | None:
    """A scipy test's p-value; None where it is undefined (e.g. no spread within a group)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        p = float(test(*args, **kwargs).pvalue)
    return p if math.isfinite(p) else None


def _nct_lower(t_obs: float, df: int, alpha: float) -> float:
    """lambda_lo: P[T <= t_obs; df, lambda_lo] = 1 - alpha; -inf (valid) if 1 - alpha rounds to 1."""
    if not math.isfinite(float(ndtri(1.0 - alpha))):
        return -math.inf

    def f(lam: float) -> float:
        return float(stats.nct.cdf(t_obs, df, lam)) - (1.0 - alpha)

    z = float(ndtri(1.0 - alpha))
    spread = z * math.sqrt(1.0 + t_obs * t_obs / (2.0 * df)) + 1.0
    lo, hi = t_obs - 2.0 * spread - 1.0, t_obs + 1.0
    while f(lo) <= 0.0:  # cdf decreases in lambda: f(lo) > 0 > f(hi) brackets the root
        lo -= 2.0 * spread + 1.0
    while f(hi) >= 0.0:
        hi += spread
    return float(brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))

