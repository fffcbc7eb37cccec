"""One auditor for any canary scores: estimates and valid lower bounds on epsilon.

``CanaryScoreAuditor(in_scores, out_scores)`` takes the attack scores of inserted ("in", shape
(k,)) and not-inserted ("out", shape (k',)) canaries, higher meaning "inserted", and offers:

* :meth:`~CanaryScoreAuditor.epsilon_estimate` -- the two-Gaussian point estimate of Andrew et
  al. (2024), "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024, §3-4.
* :meth:`~CanaryScoreAuditor.epsilon_lower_bound` -- Clopper-Pearson bounds on FNR and FPR at a
  validly chosen threshold (Bonferroni over every candidate, a held-out split, or a fixed one).
* :meth:`~CanaryScoreAuditor.epsilon_one_run` -- Steinke, Nasr & Jagielski (2023), "Privacy
  Auditing with One (1) Training Run", NeurIPS 2023, the binomial tail with the delta term.
* :meth:`~CanaryScoreAuditor.epsilon_one_run_fdp` -- Mahloujifar, Melis & Chaudhuri (2024),
  "Auditing f-Differential Privacy in One Run", with the Gaussian (mu-GDP) trade-off family.
* :meth:`~CanaryScoreAuditor.epsilon_gdp_lower_bound` -- a parametric bound assuming
  equal-variance Gaussian scores (exact noncentral-t confidence bound on the shift mu).
* :meth:`~CanaryScoreAuditor.tpr_at_fpr` and :meth:`~CanaryScoreAuditor.auroc`.

Every epsilon is in nats. Every method returns a frozen :class:`ScoreAuditResult`. The formulas
are written out in ``docs/methods/score_auditor.md``. Pure numpy/scipy; torch tensors are
accepted (converted with ``.detach().cpu().float()``) without importing torch.
"""

from __future__ import annotations

import math
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

SRC_ANDREW = (
    "Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical Privacy "
    "Estimation for Federated Learning, ICLR 2024, §3.2 (epsilon between two Gaussians), "
    "Alg. 1-3, Thm 3.3"
)
SRC_CP = (
    "Jagielski, Ullman, Oprea (2020), Auditing Differentially Private Machine Learning, "
    "NeurIPS 2020 (Clopper-Pearson bounds on FPR/FNR); Kairouz, Oh, Viswanath (2015) "
    "hypothesis-testing characterization FPR + e^eps FNR >= 1 - delta"
)
SRC_STEINKE = (
    "Steinke, Nasr, Jagielski (2023), Privacy Auditing with One (1) Training Run, NeurIPS 2023, "
    "Thm 3.1 (binomial tail) and Thm 5.2 / Alg. 2 (delta term)"
)
SRC_MAHLOUJIFAR = (
    "Mahloujifar, Melis, Chaudhuri (2024), Auditing f-Differential Privacy in One Run, "
    "arXiv:2410.22235, §4 (tail bound on correct guesses under f-DP, numerical recursion); "
    "Gaussian trade-off f(x) = Phi(Phi^-1(1-x) - mu) of Dong, Roth, Su (2022)"
)
SRC_GDP = (
    "Dong, Roth, Su (2022), Gaussian Differential Privacy, JRSS-B, Def. 2.6 and Cor. 2.13 "
    "(mu-GDP to (eps, delta)); noncentral-t confidence bound on the standardized shift"
)

Threshold = Literal["bonferroni", "split"]
_EPS_MAX = 60.0  # largest epsilon the one-run searches consider (p-values saturate long before)
_MU_MAX = 40.0


@dataclass(frozen=True)
class ScoreAuditResult:
    """What one :class:`CanaryScoreAuditor` method reports.

    Attributes:
        value: the estimate, bound, TPR or AUROC (epsilon in nats), finite.
        method: short name, e.g. ``"clopper_pearson_bonferroni"``, ``"one_run"``.
        source: authors, year, title and section/equation of the formula.
        alpha: 1 - confidence of a lower bound (``None`` for estimates and rates).
        delta: the delta at which epsilon is stated (``None`` for rates).
        threshold: the score threshold behind the value, when one was chosen.
        counts: integer counts behind the value (``k_in``, ``k_out``, ``fn``, ``fp``,
            ``guesses``, ``correct``, ``candidates``, ...).
        lower: lower end of a bootstrap interval (estimate only), else ``None``.
        upper: upper end of a bootstrap interval, else ``None``.
        gof_pvalue: goodness-of-fit p-value of the parametric assumption (GDP bound only).
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


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------


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
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size < 2:
        raise ValueError(f"{name} needs at least 2 scores, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    if np.all(arr == arr[0]):
        raise ValueError(f"{name} are all equal ({arr[0]!r}): no spread to audit")
    return arr


def _check_delta(delta: object, allow_zero: bool) -> float:
    v = check_real_finite(delta, "delta")
    ok = (0.0 <= v < 1.0) if allow_zero else (0.0 < v < 1.0)
    if not ok:
        rng = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"delta must be in {rng} for this method, got {delta!r}")
    return v


# --------------------------------------------------------------------------------------------
# Clopper-Pearson at thresholds
# --------------------------------------------------------------------------------------------


def _cp_eps(
    fn: np.ndarray,
    k: int,
    log_fpr_u: np.ndarray,
    log_1m_fpr_u: np.ndarray,
    q_fnr: float,
    delta: float,
) -> tuple[np.ndarray, np.ndarray]:
    """eps(tau) = max(log((1-delta-FPR_u)/FNR_u), log((1-delta-FNR_u)/FPR_u)), floored at 0.

    FNR_u = Beta(fn+1, k-fn).ppf(q_fnr) (1 at fn = k); returns (eps, FNR_u)."""
    fnr_u = _cp_upper(fn.astype(float), k, q_fnr)
    with np.errstate(divide="ignore"):
        log_fnr_u = np.log(fnr_u)
        log_1m_fnr_u = np.log1p(-fnr_u)
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


# --------------------------------------------------------------------------------------------
# one-run bounds: guesses, the binomial p-value, the f-DP recursion
# --------------------------------------------------------------------------------------------


def _count_grid(n: int) -> np.ndarray:
    """{0} u {round(2^(l/2)) : l >= 0} below n: the error counts the threshold scan tries."""
    g = [0]
    lv = 0
    while (v := int(round(2.0 ** (lv / 2.0)))) < n:
        g.append(v)
        lv += 1
    return np.unique(np.array(g, dtype=np.int64))


def _guess_grid(m: int) -> np.ndarray:
    """Numbers of guesses per side, fixed by m alone: round(m/2 * 2^(-j/2)), j = 0, 1, ..."""
    g = []
    j = 0
    while True:
        v = int(round(m / 2.0 * 2.0 ** (-j / 2.0)))
        if v < 1:
            break
        g.append(v)
        j += 1
    return np.unique(np.array(g, dtype=np.int64))


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
    eps: np.ndarray,
    n: np.ndarray,
    v: np.ndarray,
    m: np.ndarray,
    delta: float,
    lc: np.ndarray,
    j: np.ndarray,
) -> np.ndarray:
    """P-value of v correct out of n guesses under (eps, delta)-DP, one per lane:
    P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i, B ~ Binomial(n, e^eps/(1+e^eps))."""
    soft = np.log1p(np.exp(-eps))
    logq = (-soft)[:, None]
    log1mq = (-eps - soft)[:, None]
    pmf = np.exp(lc + j * logq + (n[:, None] - j) * log1mq)
    pmf = np.where(np.isfinite(lc), pmf, 0.0)
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


def _one_run_eps(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, delta: float, iters: int = 42
) -> np.ndarray:
    """Largest eps whose (eps, delta)-DP claim the count v/n rejects at ``level``, per lane."""
    n = np.asarray(n, np.int64)
    v = np.asarray(v, np.int64)
    m = np.asarray(m, float)
    level = np.broadcast_to(np.asarray(level, float), n.shape)
    width = int(n.max()) + 1
    lc, j = _log_binom_coef(n, width)
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
    r = level * v / m
    h = level * (n - v) / m
    i = (v - 1).astype(float)
    live = np.flatnonzero(v > 0)
    rr, hh, ii, mm = r[live], h[live], i[live], mu[live]
    nn = n[live].astype(float)
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
            keep = moved
            live, rr, hh, ii, mm, nn = (a[keep] for a in (live, rr, hh, ii, mm, nn))
    return r + h > n / m


def _fdp_mu(
    n: np.ndarray, v: np.ndarray, m: np.ndarray, level: np.ndarray, iters: int = 36
) -> np.ndarray:
    """Largest mu whose mu-GDP claim is rejected (0 when even mu = 0 is not), per lane."""
    n = np.asarray(n, np.int64)
    v = np.asarray(v, np.int64)
    m = np.asarray(m, float)
    level = np.broadcast_to(np.asarray(level, float), n.shape)
    ok0 = _fdp_rejects(np.zeros(n.size), n, v, m, level)
    lo = np.zeros(n.size)
    hi = np.full(n.size, _MU_MAX)
    idx = np.flatnonzero(ok0)
    for _ in range(iters):
        if idx.size == 0:
            break
        mid = 0.5 * (lo[idx] + hi[idx])
        rej = _fdp_rejects(mid, n[idx], v[idx], m[idx], level[idx])
        lo[idx] = np.where(rej, mid, lo[idx])
        hi[idx] = np.where(rej, hi[idx], mid)
    return np.where(ok0, lo, 0.0)


# --------------------------------------------------------------------------------------------
# the auditor
# --------------------------------------------------------------------------------------------


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
        dim: optional model dimension d >= 2 when the scores are cosines between random unit
            canaries and the release: the out-scores then follow the exact law
            (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2) (mean 0, sd 1/sqrt(d)), which
            :meth:`epsilon_estimate` uses as its null (sd 1/sqrt(d)) and
            :meth:`epsilon_lower_bound` uses for an exact FPR (its survival function, so
            no confidence bound on FPR is needed, whatever d).

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
        self._in_sorted = np.sort(self.in_scores)
        self._out_sorted = np.sort(self.out_scores)

    @classmethod
    def from_cosines(
        cls, in_cosines: object, out_cosines: object, dim: int
    ) -> CanaryScoreAuditor:
        """Auditor of cosine scores with the exact null of dimension ``dim`` (see the class)."""
        return cls(in_cosines, out_cosines, dim=dim)

    @property
    def k_in(self) -> int:
        return int(self.in_scores.size)

    @property
    def k_out(self) -> int:
        return int(self.out_scores.size)

    def _counts(self) -> dict[str, int]:
        return {"k_in": self.k_in, "k_out": self.k_out}

    # ---------------------------------------------------------------- point estimate

    def epsilon_estimate(
        self,
        delta: float,
        fit: Literal["equal", "unequal"] = "equal",
        bootstrap: int = 0,
        confidence: float = 0.95,
        seed: int = 0,
    ) -> ScoreAuditResult:
        """Two-Gaussian epsilon estimate (not a bound): eps(N(m1, s1^2) || N(m0, s0^2); delta).

        m1 is the mean of the in-scores; the null N(m0, s0^2) is fitted to the out-scores
        (sample mean and sd, ddof=1), or with ``dim`` is the exact cosine law's N(0, 1/d)
        moments. fit="equal": s1 = s0 (only the shift (m1 - m0)/s0 is estimated: the pair is
        mu-GDP with that mu); fit="unequal": s1 = sample sd of the in-scores. The estimate is
        invariant to any common increasing affine map of the scores (applied internally so
        arbitrary scores reuse the cosine estimator).

        Args:
            delta: in (0, 1).
            fit: "equal" or "unequal".
            bootstrap: B >= 0 percentile-bootstrap resamples (0: no interval).
            confidence: level of the bootstrap interval, in (0, 1).
            seed: numpy seed of the resampling.

        Returns:
            ScoreAuditResult: value = eps (nats, >= 0), lower/upper = bootstrap percentiles,
            delta, method "two_gaussians_equal"/"two_gaussians_unequal", details: shift,
            sd_ratio, mu_in, sd_in, mu_null, sd_null (score units), bootstrap_dropped.

        Raises:
            ValueError: delta not in (0, 1); fit unknown; bootstrap < 0; confidence not in
                (0, 1).

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
            value=est.value,
            method=f"two_gaussians_{fit}",
            source=SRC_ANDREW,
            delta=d,
            counts=self._counts(),
            lower=est.lower,
            upper=est.upper,
            details={
                "shift": ex["shift"],
                "sd_ratio": ex["sd_ratio"],
                "mu_in": ex["mu_observed"] * scale + shift,
                "sd_in": ex["sigma_observed"] * scale,
                "mu_null": ex["mu_null"] * scale + shift,
                "sd_null": ex["sigma_null"] * scale,
                "null": "exact_cosine" if self.dim is not None else "out_scores",
                "dim": self.dim,
                "bootstrap": ex["bootstrap"],
                "bootstrap_dropped": ex["bootstrap_dropped"],
                "confidence": est.confidence,
            },
        )

    # ---------------------------------------------------------------- Clopper-Pearson

    def _cp_at(
        self, in_sorted: np.ndarray, out_sorted: np.ndarray, taus: np.ndarray, a: float,
        delta: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """eps(tau) with both rates bounded at 1 - a/2 (FNR alone at 1 - a with the exact
        null), and the fn, fp counts."""
        fn = np.searchsorted(in_sorted, taus, side="left")
        exact = self.dim is not None
        q = 1.0 - (a if exact else a / 2.0)
        fp, lfpr, l1mfpr = _fpr_logs(out_sorted, taus, self.dim, q)
        eps, _ = _cp_eps(fn, in_sorted.size, lfpr, l1mfpr, q, delta)
        return eps, fn, fp

    @staticmethod
    def _taus(in_sorted: np.ndarray, out_sorted: np.ndarray) -> np.ndarray:
        """Candidate thresholds, their number fixed by (k, k'): just above the (j+1)-th largest
        out-score (fp = j) and at the (i+1)-th smallest in-score (fn = i), for j, i in
        {0} u {round(2^(l/2))}."""
        jo = _count_grid(out_sorted.size)
        ji = _count_grid(in_sorted.size)
        above = np.nextafter(out_sorted[out_sorted.size - 1 - jo], np.inf)
        return np.concatenate([above, in_sorted[ji]])

    def epsilon_lower_bound(
        self,
        alpha: float = 0.05,
        delta: float = 0.0,
        threshold: Threshold | float = "bonferroni",
        seed: int = 0,
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound on epsilon from Clopper-Pearson bounds on FNR and FPR.

        Rule "in iff score >= tau": FNR = #{x < tau}/k, FPR = #{y >= tau}/k'. With upper
        Clopper-Pearson bounds FNR_u, FPR_u (each at 1 - a/2, so both hold with 1 - a),
        eps(tau) = max(log((1 - delta - FPR_u)/FNR_u), log((1 - delta - FNR_u)/FPR_u)),
        floored at 0 (any (eps, delta)-DP mechanism has FPR + e^eps FNR >= 1 - delta and
        FNR + e^eps FPR >= 1 - delta). The threshold is chosen validly:

        * "bonferroni": max over all T candidate thresholds (every distinct score and +inf)
          with a = alpha / T, so all T bounds hold at once with 1 - alpha;
        * "split": in- and out-scores are split at random in halves (``seed``); tau maximises
          eps(tau) (a = alpha) on the first half; the bound is eps(tau) on the second half;
        * a float: that fixed threshold, a = alpha.

        With ``dim`` (cosines), FPR is the exact null survival, not a bound, and FNR_u is at
        1 - a.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in [0, 1).
            threshold: "bonferroni", "split" or a finite float.
            seed: seed of the split.

        Returns:
            ScoreAuditResult: value = eps_lo (nats, >= 0), alpha, delta, threshold, counts
            (k_in, k_out, fn, fp, candidates), method "clopper_pearson_<rule>".

        Raises:
            ValueError: alpha not in (0, 1), delta not in [0, 1), unknown threshold, fewer than
                2 scores per half with "split".

        Source: Jagielski, Ullman, Oprea (2020), NeurIPS, §3 (Clopper-Pearson); Kairouz, Oh,
        Viswanath (2015), Thm 2.1 (the two inequalities).
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=True)
        counts = self._counts()
        details: dict[str, Any] = {}
        if isinstance(threshold, str):
            if threshold not in ("bonferroni", "split"):
                raise ValueError(
                    f"threshold must be 'bonferroni', 'split' or a float, got {threshold!r}"
                )
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
                details["selection_bound"] = float(eps_a[j])
                details["seed"] = int(seed)
        else:
            tau = check_real_finite(threshold, "threshold")
            taus = np.array([tau])
            eps, fn, fp = self._cp_at(self._in_sorted, self._out_sorted, taus, a, d)
            i = 0
            counts["candidates"] = 1
        counts.update(fn=int(fn[i]), fp=int(fp[i]))
        rule = threshold if isinstance(threshold, str) else "fixed"
        tau_i = float(taus[i])
        return ScoreAuditResult(
            value=float(eps[i]),
            method=f"clopper_pearson_{rule}",
            source=SRC_CP,
            alpha=a,
            delta=d,
            threshold=tau_i if math.isfinite(tau_i) else None,
            counts=counts,
            details={**details, "fpr": "exact_cosine" if self.dim else "clopper_pearson"},
        )

    # ---------------------------------------------------------------- one run

    def _one_run_setup(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return _guess_counts(self.in_scores, self.out_scores, seed)

    def _one_run_result(
        self, method: str, source: str, value: float, a: float, d: float, n: np.ndarray,
        v: np.ndarray, nt: np.ndarray, nb: np.ndarray, best: int, extra: dict[str, Any],
    ) -> ScoreAuditResult:
        counts = {
            **self._counts(), "m": self.k_in + self.k_out, "guesses": int(n[best]),
            "correct": int(v[best]), "guess_in": int(nt[best]), "guess_out": int(nb[best]),
            "candidates": int(n.size),
        }
        return ScoreAuditResult(value=value, method=method, source=source, alpha=a, delta=d,
                                counts=counts, details=extra)

    def epsilon_one_run(
        self, alpha: float = 0.05, delta: float = 0.0, seed: int = 0
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound on epsilon from one run (Steinke, Nasr, Jagielski 2023).

        Setting: the m = k + k' canaries form one pool and each was inserted independently
        with probability 1/2 before the run; ``in_scores`` are the scores of those inserted,
        ``out_scores`` of the others (k and k' are then random; a fixed split into halves is
        the usual approximation). The auditor guesses "in" for the t highest scores and "out"
        for the b lowest, abstains on the rest (n = t + b guesses, v correct). Under
        (eps, delta)-DP, P[V >= v] <= P[B >= v] + 2 m delta max_{1<=i<=v} P[v-i <= B < v] / i
        with B ~ Binomial(n, e^eps / (1 + e^eps)); the bound is the largest eps this p-value
        rejects. The rule (t, b) is chosen from C fixed candidates (one-sided (t, 0) and
        symmetric (t, t), t = round(m/2 * 2^(-j/2))), each tested at alpha / C (Bonferroni),
        so the best one keeps 1 - alpha.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in [0, 1).
            seed: seed of the random order among tied scores.

        Returns:
            ScoreAuditResult: value = eps_lo (nats, >= 0), counts: m, guesses, correct,
            guess_in, guess_out, candidates.

        Raises:
            ValueError: alpha not in (0, 1), delta not in [0, 1).

        Source: Steinke, Nasr, Jagielski (2023), NeurIPS, Thm 3.1 and Thm 5.2 / Alg. 2.
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=True)
        n, v, nt, nb = self._one_run_setup(check_count(seed, "seed"))
        m = np.full(n.size, float(self.k_in + self.k_out))
        eps = _one_run_eps(n, v, m, np.full(n.size, a / n.size), d)
        best = int(np.argmax(eps))
        return self._one_run_result("one_run", SRC_STEINKE, float(eps[best]), a, d, n, v, nt,
                                    nb, best, {"level_per_candidate": a / n.size})

    def epsilon_one_run_fdp(
        self, alpha: float = 0.05, delta: float = 1e-5, seed: int = 0
    ) -> ScoreAuditResult:
        """(1 - alpha) lower bound from one run under f-DP (Mahloujifar, Melis, Chaudhuri 2024).

        Same setting and guesses as :meth:`epsilon_one_run`, but the null hypothesis is
        mu-GDP (trade-off f(x) = Phi(Phi^-1(1 - x) - mu)). The recursion of Mahloujifar et
        al. bounds the tail of the number of correct guesses under f-DP: with
        r = a v/m and h = a (n - v)/m, for i = v-1 down to 0, h' = max(h, f(1 - r)),
        r <- min(r + i/(n - i) (h' - h), 1), h <- h'; mu-GDP is rejected at level a iff
        r + h > n/m. The bound is the largest rejected mu (a = alpha / C, Bonferroni over
        the same C candidate rules), converted to epsilon at delta by the mu-GDP formula
        delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu).

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in (0, 1).
            seed: seed of the random order among tied scores.

        Returns:
            ScoreAuditResult: value = eps_lo (nats), details["mu_lower"], counts as
            :meth:`epsilon_one_run`.

        Raises:
            ValueError: alpha not in (0, 1), delta not in (0, 1).

        Source: Mahloujifar, Melis, Chaudhuri (2024), arXiv:2410.22235, §4; Dong, Roth, Su
        (2022), Cor. 2.13 (mu to (eps, delta)).
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=False)
        n, v, nt, nb = self._one_run_setup(check_count(seed, "seed"))
        m = np.full(n.size, float(self.k_in + self.k_out))
        mu = _fdp_mu(n, v, m, np.full(n.size, a / n.size))
        best = int(np.argmax(mu))
        eps = float(gaussian_epsilon_array(np.array([mu[best]]), d)[0])
        return self._one_run_result("one_run_fdp", SRC_MAHLOUJIFAR, eps, a, d, n, v, nt, nb,
                                    best, {"mu_lower": float(mu[best]),
                                           "level_per_candidate": a / n.size})

    # ---------------------------------------------------------------- parametric GDP

    def epsilon_gdp_lower_bound(self, alpha: float = 0.05, delta: float = 1e-5) -> ScoreAuditResult:
        """(1 - alpha) lower bound assuming x ~ N(m1, s^2), y ~ N(m0, s^2) (equal variance).

        mu_hat = (mean(x) - mean(y)) / s_pooled. T = mu_hat / sqrt(1/k + 1/k') is noncentral
        t with k + k' - 2 degrees of freedom and noncentrality lambda = mu / sqrt(1/k + 1/k');
        lambda_lo solves P[T <= t_obs; lambda_lo] = 1 - alpha (exact one-sided bound), and
        mu_lo = lambda_lo sqrt(1/k + 1/k'). eps_lo = eps_GDP(mu_lo, delta) if mu_lo > 0, else
        0 (never |mu|). Valid only as far as the Gaussian equal-variance model holds: check
        ``gof_pvalue`` (Shapiro-Wilk, or D'Agostino-Pearson above 5000 scores, on the pooled
        residuals x - mean(x), y - mean(y)) and ``details["equal_variance_pvalue"]``
        (Brown-Forsythe); small values mean the bound may not hold.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in (0, 1).

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
        k, kk = x.size, y.size
        df = k + kk - 2
        ss = np.sum((x - x.mean()) ** 2) + np.sum((y - y.mean()) ** 2)
        sp = math.sqrt(ss / df)
        mu_hat = (float(x.mean()) - float(y.mean())) / sp
        se0 = math.sqrt(1.0 / k + 1.0 / kk)
        t_obs = mu_hat / se0
        mu_lo = _nct_lower(t_obs, df, a) * se0
        eps = float(gaussian_epsilon_array(np.array([mu_lo]), d)[0]) if mu_lo > 0 else 0.0
        resid = np.concatenate([x - x.mean(), y - y.mean()]) / sp
        if resid.size <= 5000:
            gof, gof_name = float(stats.shapiro(resid).pvalue), "shapiro_wilk"
        else:
            gof, gof_name = float(stats.normaltest(resid).pvalue), "dagostino_pearson"
        ev = float(stats.levene(x, y, center="median").pvalue)
        return ScoreAuditResult(
            value=eps, method="gdp_noncentral_t", source=SRC_GDP, alpha=a, delta=d,
            counts=self._counts(), gof_pvalue=gof,
            details={"mu_hat": mu_hat, "mu_lower": mu_lo, "t_statistic": t_obs, "df": df,
                     "gof_test": gof_name, "equal_variance_pvalue": ev},
        )

    # ---------------------------------------------------------------- rates

    def _roc(self) -> tuple[np.ndarray, np.ndarray]:
        taus = np.append(np.union1d(self._in_sorted, self._out_sorted), np.inf)
        tpr = 1.0 - np.searchsorted(self._in_sorted, taus, side="left") / self.k_in
        fpr = 1.0 - np.searchsorted(self._out_sorted, taus, side="left") / self.k_out
        return fpr[::-1], tpr[::-1]  # increasing fpr, from (0, .) to (1, 1)

    def tpr_at_fpr(self, fpr: float) -> ScoreAuditResult:
        """Largest TPR at false-positive rate ``fpr`` over threshold rules "in iff score >= tau"
        and their randomized mixtures (the upper concave hull of the empirical ROC).

        Args:
            fpr: in [0, 1].

        Returns:
            ScoreAuditResult: value = TPR in [0, 1], method "tpr_at_fpr", details["fpr"].

        Raises:
            ValueError: fpr not in [0, 1].

        Source: Carlini et al. (2022), Membership Inference Attacks From First Principles,
        IEEE S&P, §4 (TPR at low FPR); Provost & Fawcett (2001) (ROC convex hull).
        """
        f = check_real_finite(fpr, "fpr")
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"fpr must be in [0, 1], got {fpr!r}")
        xs, ys = self._roc()
        hx, hy = _upper_hull(np.concatenate([[0.0], xs]), np.concatenate([[0.0], ys]))
        val = float(np.interp(f, hx, hy))
        return ScoreAuditResult(value=val, method="tpr_at_fpr", source=SRC_ROC,
                                counts=self._counts(), details={"fpr": f})

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


SRC_ROC = (
    "Carlini, Chien, Nasr, Song, Terzis, Tramer (2022), Membership Inference Attacks From First "
    "Principles, IEEE S&P, §4; ROC convex hull (Provost & Fawcett 2001)"
)
SRC_AUC = "Hanley & McNeil (1982), The meaning and use of the area under a ROC curve, eq. (1)"


def _upper_hull(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper concave hull of points sorted by x (monotone chain)."""
    hx: list[float] = []
    hy: list[float] = []
    for px, py in zip(x.tolist(), y.tolist(), strict=True):
        if hx and px == hx[-1]:
            if py <= hy[-1]:
                continue
            hx.pop()
            hy.pop()
        while len(hx) >= 2 and (
            (hx[-1] - hx[-2]) * (py - hy[-2]) - (hy[-1] - hy[-2]) * (px - hx[-2]) >= 0
        ):
            hx.pop()
            hy.pop()
        hx.append(px)
        hy.append(py)
    return np.array(hx), np.array(hy)


def _nct_lower(t_obs: float, df: int, alpha: float) -> float:
    """lambda_lo with P[T <= t_obs; df, lambda_lo] = 1 - alpha (may be negative)."""

    def f(lam: float) -> float:
        return float(stats.nct.cdf(t_obs, df, lam)) - (1.0 - alpha)

    z = float(ndtri(1.0 - alpha))
    spread = z * math.sqrt(1.0 + t_obs * t_obs / (2.0 * df)) + 1.0
    lo, hi = t_obs - 2.0 * spread - 1.0, t_obs + 1.0
    for _ in range(60):
        if f(lo) > 0.0:
            break
        lo -= 2.0 * spread + 1.0
    for _ in range(60):
        if f(hi) < 0.0:
            break
        hi += spread
    return float(brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))

