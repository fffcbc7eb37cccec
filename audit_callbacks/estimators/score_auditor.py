"""One auditor for any canary scores: estimates and valid lower bounds on epsilon.

``CanaryScoreAuditor(in_scores, out_scores)`` takes the attack scores of inserted ("in", shape
(k,)) and not-inserted ("out", shape (k',)) canaries, higher meaning "inserted", and offers:

* :meth:`~CanaryScoreAuditor.epsilon_estimate` -- the two-Gaussian point estimate of Andrew et
  al. (2024), "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024, §3-4.
* :meth:`~CanaryScoreAuditor.epsilon_lower_bound` -- Clopper-Pearson bounds on FNR and FPR at a
  validly chosen threshold (Bonferroni over a fixed set of candidates, a held-out split, or a
  fixed one).
* :meth:`~CanaryScoreAuditor.epsilon_one_run` -- Steinke, Nasr & Jagielski (2023), "Privacy
  Auditing with One (1) Training Run", NeurIPS 2023, the binomial tail with the delta term.
* :meth:`~CanaryScoreAuditor.epsilon_one_run_fdp` -- Mahloujifar, Melis & Chaudhuri (2024),
  "Auditing f-Differential Privacy in One Run", with the Gaussian (mu-GDP) trade-off family.
* :meth:`~CanaryScoreAuditor.epsilon_gdp_lower_bound` -- a parametric bound assuming
  equal-variance Gaussian scores (exact noncentral-t confidence bound on the shift mu), its
  ``status`` "rejected: goodness-of-fit p = ..." when the fit test rejects at ``gof_level``.
* :meth:`~CanaryScoreAuditor.tpr_at_fpr` and :meth:`~CanaryScoreAuditor.auroc`.

Every epsilon is in nats. Every method returns a frozen :class:`AuditResult`. The formulas
are written out in ``docs/methods/score_auditor.md``; the one-run machinery (guesses, binomial
p-value, f-DP recursion) lives in :mod:`audit_callbacks.estimators.one_run`. Pure numpy/scipy;
torch tensors are accepted (converted with ``.detach().cpu().float()``) without importing torch.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Literal

import numpy as np
from scipy import stats
from scipy.optimize import brentq
from scipy.special import nctdtr, ndtri

from ..validation import check_alpha, check_dim, check_real, check_seed
from .canary_epsilon import estimate_epsilon_from_cosines, share_resamples
from .cosine_null import logsf_unchecked
from .gaussian import gaussian_epsilon_array, log_sub
from .intervals import beta_upper_quantile
from .one_run import SRC_MAHLOUJIFAR, SRC_STEINKE, fdp_mu, guess_counts, one_run_epsilon
from .result import AuditResult

__all__ = ["GOF_LEVEL", "CanaryScoreAuditor", "share_bootstrap"]

SRC_ANDREW = (
    "Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical Privacy "
    "Estimation for Federated Learning, ICLR 2024, §3.2 (epsilon between two Gaussians), "
    "Alg. 1-3, Thm 3.3"
)
SRC_CP = (
    "Jagielski, Ullman, Oprea (2020), Auditing Differentially Private Machine Learning, "
    "NeurIPS 2020 (Clopper-Pearson bounds on FPR/FNR); Kairouz, Oh, Viswanath (2015), "
    "Thm 2.1 (FPR + e^eps FNR >= 1 - delta)"
)
SRC_GDP = (
    "Dong, Roth, Su (2022), Gaussian Differential Privacy, JRSS-B, Def. 2.6 and Cor. 2.13 "
    "(mu-GDP to (eps, delta)); noncentral-t confidence bound on the standardized shift"
)
SRC_ROC = (
    "Carlini, Chien, Nasr, Song, Terzis, Tramer (2022), Membership Inference Attacks From First "
    "Principles, IEEE S&P, §4; ROC convex hull (Provost & Fawcett 2001)"
)
SRC_AUC = "Hanley & McNeil (1982), The meaning and use of the area under a ROC curve, eq. (1)"

Threshold = Literal["bonferroni", "split"]

#: Default level of the GDP bound's goodness-of-fit gate (``epsilon_gdp_lower_bound``).
GOF_LEVEL = 0.01


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
    if np.ptp(arr) == 0:
        raise ValueError(f"{name} are all equal: no spread to audit")
    return arr


def _check_delta(delta: object, allow_zero: bool) -> float:
    """delta in [0, 1) (``allow_zero``) or (0, 1); ValueError naming ``delta`` otherwise."""
    v = check_real(delta, "delta")
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
    fnr_u = beta_upper_quantile(fn.astype(float), k, q_fnr)
    with np.errstate(divide="ignore"):
        log_fnr_u = np.log(fnr_u)
        log_1m_fnr_u = np.log1p(-fnr_u)
    if delta > 0.0:
        ld = math.log(delta)
        num1 = log_sub(log_1m_fpr_u, np.full_like(log_fnr_u, ld))
        num2 = log_sub(log_1m_fnr_u, np.full_like(log_fnr_u, ld))
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
        return fp, logsf_unchecked(t, dim), logsf_unchecked(-t, dim)
    fpr_u = beta_upper_quantile(fp.astype(float), out_sorted.size, q_fpr)
    with np.errstate(divide="ignore"):
        return fp, np.log(fpr_u), np.log1p(-fpr_u)


def _count_grid(n: int) -> np.ndarray:
    """{0, 1, 2, 4, 8, ...} below n: the error counts the threshold scan tries."""
    g = 2 ** np.arange(int(math.log2(max(n, 2))) + 1, dtype=np.int64)
    return np.concatenate([[0], g[g < n]])


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
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self.k_in = int(self.in_scores.size)
        self.k_out = int(self.out_scores.size)
        self._std: tuple[np.ndarray, np.ndarray | None, float, float] | None = None

    @property
    def _in_sorted(self) -> np.ndarray:
        """The in-scores, ascending (sorted at the first use: the estimates and the GDP
        bound never need them, and a report builds auditors only for those)."""
        return self._sorted_scores()[0]

    @property
    def _out_sorted(self) -> np.ndarray:
        """The out-scores, ascending (sorted at the first use, with the in-scores)."""
        return self._sorted_scores()[1]

    def _sorted_scores(self) -> tuple[np.ndarray, np.ndarray]:
        done = getattr(self, "_sorted", None)  # an auditor unpickled from before has none
        if done is None:
            done = self._sorted = (np.sort(self.in_scores), np.sort(self.out_scores))
        return done

    @classmethod
    def from_cosines(
        cls, in_cosines: object, out_cosines: object, dim: int
    ) -> CanaryScoreAuditor:
        """Auditor of cosine scores with the exact null of dimension ``dim`` (see the class)."""
        return cls(in_cosines, out_cosines, dim=dim)

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
    ) -> AuditResult:
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
            AuditResult: value = eps (nats, >= 0), lower/upper = bootstrap percentiles,
            delta, method "two_gaussians_equal"/"two_gaussians_unequal", details: shift,
            sd_ratio, mu_in, sd_in, mu_null, sd_null (score units), null, dim, bootstrap,
            bootstrap_dropped, confidence.

        Raises:
            ValueError: delta not in (0, 1); fit unknown; bootstrap < 0; confidence not in
                (0, 1).

        Source: Andrew et al. (2024), ICLR 2024, §3.2 (two Gaussians), Alg. 1-3, Thm 3.3.
        """
        d = _check_delta(delta, allow_zero=False)
        if fit not in ("equal", "unequal"):
            raise ValueError(f"fit must be 'equal' or 'unequal', got {fit!r}")
        obs, unobs, shift, scale = self._estimate_inputs()
        if self.dim is not None:
            est = estimate_epsilon_from_cosines(
                obs, d, dim=self.dim, fit=fit, bootstrap=bootstrap,
                confidence=confidence, seed=seed,
            )
        else:
            est = estimate_epsilon_from_cosines(
                obs, d, unobserved=unobs, fit=fit, bootstrap=bootstrap, confidence=confidence,
                seed=seed,
            )
        ex = est.details
        return AuditResult(
            value=est.value,
            method=f"two_gaussians_{fit}",
            source=SRC_ANDREW,
            delta=d,
            counts=self._counts(),
            lower=est.lower,
            upper=est.upper,
            alpha=est.alpha,  # 1 - confidence with a bootstrap interval, else None
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
                "confidence": None if est.alpha is None else 1.0 - est.alpha,
            },
        )

    def _estimate_inputs(self) -> tuple[np.ndarray, np.ndarray | None, float, float]:
        """``(observed, unobserved, shift, scale)`` for :func:`estimate_epsilon_from_cosines`:
        with ``dim`` the in-scores (cosines) and None, 0, 1; else both groups mapped by
        ``(s - shift) / scale`` (shift: the median of all scores, scale: twice the largest
        distance from it) into [-1/2, 1/2]. Computed once per auditor (a report asks for
        several estimates of the same scores)."""
        if self._std is None:
            if self.dim is not None:
                self._std = (self.in_scores, None, 0.0, 1.0)
            else:
                both = np.concatenate([self.in_scores, self.out_scores])
                shift = float(np.median(both))
                scale = 2.0 * float(np.max(np.abs(both - shift)))
                self._std = ((self.in_scores - shift) / scale, (self.out_scores - shift) / scale,
                             shift, scale)
        return self._std

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
        out-score (fp = j) and at the (i+1)-th smallest in-score (fn = i), j, i in
        :func:`_count_grid`."""
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
    ) -> AuditResult:
        """(1 - alpha) lower bound on epsilon from Clopper-Pearson bounds on FNR and FPR.

        Rule "in iff score >= tau": FNR = #{x < tau}/k, FPR = #{y >= tau}/k'. With upper
        Clopper-Pearson bounds FNR_u, FPR_u (each at 1 - a/2, so both hold with 1 - a),
        eps(tau) = max(log((1 - delta - FPR_u)/FNR_u), log((1 - delta - FNR_u)/FPR_u)),
        floored at 0 (any (eps, delta)-DP mechanism has FPR + e^eps FNR >= 1 - delta and
        FNR + e^eps FPR >= 1 - delta). The threshold is chosen validly:

        * "bonferroni": max over T candidate thresholds whose number depends only on (k, k')
          -- just above the (j+1)-th largest out-score (fp = j) and at the (i+1)-th smallest
          in-score (fn = i), j, i in {0, 1, 2, 4, 8, ...} (powers of 2 below k', k) -- with
          a = alpha / T, so all T bounds hold at once with 1 - alpha;
        * "split": in- and out-scores are split at random in halves (``seed``); tau maximises
          eps(tau) (a = alpha) over the candidates of the first half; the bound is eps(tau)
          on the second half;
        * a float: that fixed threshold, a = alpha.

        With ``dim`` (cosines), FPR is the exact null survival, not a bound, and FNR_u is at
        1 - a.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in [0, 1).
            threshold: "bonferroni", "split" or a finite float.
            seed: seed of the split.

        Returns:
            AuditResult: value = eps_lo (nats, >= 0), alpha, delta, threshold, counts
            (k_in, k_out, fn, fp, candidates; k_in_test, k_out_test for "split"), method
            "clopper_pearson_<rule>", details: fpr ("clopper_pearson" or "exact_cosine");
            selection_bound, seed for "split".

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
            tau = check_real(threshold, "threshold")
            taus = np.array([tau])
            eps, fn, fp = self._cp_at(self._in_sorted, self._out_sorted, taus, a, d)
            i = 0
            counts["candidates"] = 1
        counts.update(fn=int(fn[i]), fp=int(fp[i]))
        rule = threshold if isinstance(threshold, str) else "fixed"
        tau_i = float(taus[i])
        return AuditResult(
            value=float(eps[i]),
            method=f"clopper_pearson_{rule}",
            source=SRC_CP,
            alpha=a,
            delta=d,
            counts=counts,
            details={**details, "threshold": tau_i if math.isfinite(tau_i) else None,
                     "fpr": "exact_cosine" if self.dim else "clopper_pearson"},
        )

    # ---------------------------------------------------------------- one run

    def _one_run(self, fdp: bool, alpha: float, delta: float, seed: int) -> AuditResult:
        """The shared path of :meth:`epsilon_one_run` (``fdp=False``) and
        :meth:`epsilon_one_run_fdp`: the candidate guess rules of
        :func:`~audit_callbacks.estimators.one_run.guess_counts`, each tested at alpha / C
        (Bonferroni over the C candidates), and the best one reported."""
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=not fdp)
        n, v, nt, nb = guess_counts(self.in_scores, self.out_scores, check_seed(seed))
        m = np.full(n.size, float(self.k_in + self.k_out))
        level = np.full(n.size, a / n.size)
        val = fdp_mu(n, v, m, level) if fdp else one_run_epsilon(n, v, m, level, d)
        best = int(np.argmax(val))
        details: dict[str, Any] = {"level_per_candidate": a / n.size, "seed": int(seed)}
        eps = float(val[best])
        if fdp:  # the largest rejected mu, converted to epsilon at delta (Dong, Roth, Su 2022)
            details["mu_lower"] = eps
            eps = float(gaussian_epsilon_array(np.array([eps]), d)[0])
        counts = {
            **self._counts(), "m": self.k_in + self.k_out, "guesses": int(n[best]),
            "correct": int(v[best]), "guess_in": int(nt[best]), "guess_out": int(nb[best]),
            "candidates": int(n.size),
        }
        return AuditResult(
            value=eps, method="one_run_fdp" if fdp else "one_run",
            source=SRC_MAHLOUJIFAR if fdp else SRC_STEINKE, alpha=a, delta=d, counts=counts,
            details=details,
        )

    def epsilon_one_run(
        self, alpha: float = 0.05, delta: float = 0.0, seed: int = 0
    ) -> AuditResult:
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
            AuditResult: value = eps_lo (nats, >= 0), counts: m, guesses, correct,
            guess_in, guess_out, candidates; details: level_per_candidate, seed.

        Raises:
            ValueError: alpha not in (0, 1), delta not in [0, 1), seed not a non-negative
                integer.

        Source: Steinke, Nasr, Jagielski (2023), NeurIPS, Thm 3.1 and Thm 5.2 / Alg. 2
        (:mod:`audit_callbacks.estimators.one_run`).
        """
        return self._one_run(False, alpha, delta, seed)

    def epsilon_one_run_fdp(
        self, alpha: float = 0.05, delta: float = 1e-5, seed: int = 0
    ) -> AuditResult:
        """(1 - alpha) lower bound from one run under f-DP (Mahloujifar, Melis, Chaudhuri 2024).

        Same setting and guesses as :meth:`epsilon_one_run`, but the null hypothesis is
        mu-GDP (trade-off f(x) = Phi(Phi^-1(1 - x) - mu)). The recursion of Mahloujifar et
        al. bounds the tail of the number of correct guesses under f-DP: with
        r = a v/m and h = a (n - v)/m, for i = v-1 down to 0, h' = max(h, f(1 - r)),
        r <- min(r + i/(n - i) (h' - h), 1), h <- h'; mu-GDP is rejected at level a iff
        r + h > n/m. The bound is the largest rejected mu (a = alpha / C, Bonferroni over
        the same C candidate rules), converted to epsilon at delta by the mu-GDP formula
        delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu).

        The epsilon is a lower bound on the mechanism's only when its trade-off curve is
        Gaussian-shaped (the Gaussian mechanism and its compositions; DP-SGD's subsampled
        Gaussian over many steps, close to it): for other mechanisms, randomized response for
        one, it can exceed the true epsilon with any confidence. :meth:`epsilon_lower_bound` and
        :meth:`epsilon_one_run` hold for any mechanism.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in (0, 1).
            seed: seed of the random order among tied scores.

        Returns:
            AuditResult: value = eps_lo (nats), details["mu_lower"], counts as
            :meth:`epsilon_one_run`.

        Raises:
            ValueError: alpha not in (0, 1), delta not in (0, 1), seed not a non-negative
                integer.

        Source: Mahloujifar, Melis, Chaudhuri (2024), arXiv:2410.22235, §4; Dong, Roth, Su
        (2022), Cor. 2.13 (mu to (eps, delta)) (:mod:`audit_callbacks.estimators.one_run`).
        """
        return self._one_run(True, alpha, delta, seed)

    # ---------------------------------------------------------------- parametric GDP

    def epsilon_gdp_lower_bound(
        self, alpha: float = 0.05, delta: float = 1e-5, *, gof_level: float = GOF_LEVEL
    ) -> AuditResult:
        """(1 - alpha) lower bound assuming x ~ N(m1, s^2), y ~ N(m0, s^2) (equal variance).

        mu_hat = (mean(x) - mean(y)) / s_pooled. T = mu_hat / sqrt(1/k + 1/k') is noncentral
        t with k + k' - 2 degrees of freedom and noncentrality lambda = mu / sqrt(1/k + 1/k');
        lambda_lo solves P[T <= t_obs; lambda_lo] = 1 - alpha (exact one-sided bound), and
        mu_lo = lambda_lo sqrt(1/k + 1/k'). eps_lo = eps_GDP(mu_lo, delta) if mu_lo > 0, else
        0 (never |mu|). Valid only as far as the Gaussian equal-variance model holds, so the
        bound is gated by its goodness-of-fit test: ``gof_pvalue`` (Shapiro-Wilk, or
        D'Agostino-Pearson above 5000 scores, on the pooled residuals x - mean(x),
        y - mean(y)). When gof_pvalue < ``gof_level`` (or is undefined) the value is still
        computed but ``status`` is ``"rejected: goodness-of-fit p = {p:.2g} < {gof_level}"``
        and callers must not log or print it as a bound; otherwise ``status`` is "ok".
        ``details["equal_variance_pvalue"]`` (Brown-Forsythe) is reported, not gated on.

        Args:
            alpha: 1 - confidence, in (0, 1).
            delta: in (0, 1).
            gof_level: level of the fit test, in [0, 1) (default :data:`GOF_LEVEL` = 0.01:
                Gaussian scores are rejected in 1% of data sets; 0 never rejects).

        Returns:
            AuditResult: value = eps_lo (nats, >= 0), status "ok" or "rejected: ...",
            details: gof_pvalue, gof_level, gof_test, mu_hat, mu_lower (None when 1 - alpha
            rounds to 1), t_statistic, df, equal_variance_pvalue.

        Raises:
            ValueError: alpha or delta not in (0, 1); gof_level not in [0, 1).

        Source: Dong, Roth, Su (2022), JRSS-B, Def. 2.6, Cor. 2.13; noncentral-t bound on
        the standardized mean difference (e.g. Hedges & Olkin 1985, §5).
        """
        a = check_alpha(alpha)
        d = _check_delta(delta, allow_zero=False)
        level = check_real(gof_level, "gof_level")
        if not 0.0 <= level < 1.0:
            raise ValueError(f"gof_level must be in [0, 1), got {gof_level!r}")
        # the bound does not depend on the scores' scale: scaled by a power of two (exact, so
        # the same bits at ordinary scales), squares neither overflow nor underflow
        exponent = int(np.frexp(max(np.abs(self.in_scores).max(), np.abs(self.out_scores).max()))[1])
        x, y = np.ldexp(self.in_scores, -exponent), np.ldexp(self.out_scores, -exponent)
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
            gof, gof_name = _pvalue(stats.shapiro, resid), "shapiro_wilk"
        else:
            gof, gof_name = _pvalue(stats.normaltest, resid), "dagostino_pearson"
        ev = _pvalue(stats.levene, x, y, center="median")
        if gof is None:
            status = f"rejected: goodness-of-fit p undefined ({gof_name})"
        elif gof < level:
            status = f"rejected: goodness-of-fit p = {gof:.2g} < {level:g}"
        else:
            status = "ok"
        return AuditResult(
            value=eps, method="gdp_noncentral_t", source=SRC_GDP, alpha=a, delta=d,
            counts=self._counts(), status=status,
            details={"gof_pvalue": gof, "gof_level": level, "gof_test": gof_name,
                     "mu_hat": mu_hat, "mu_lower": mu_lo if math.isfinite(mu_lo) else None,
                     "t_statistic": t_obs, "df": df, "equal_variance_pvalue": ev},
        )

    # ---------------------------------------------------------------- rates

    def _roc(self) -> tuple[np.ndarray, np.ndarray]:
        taus = np.append(np.union1d(self._in_sorted, self._out_sorted), np.inf)
        tpr = 1.0 - np.searchsorted(self._in_sorted, taus, side="left") / self.k_in
        fpr = 1.0 - np.searchsorted(self._out_sorted, taus, side="left") / self.k_out
        return fpr[::-1], tpr[::-1]  # increasing fpr, from (0, .) to (1, 1)

    def tpr_at_fpr(self, fpr: float) -> AuditResult:
        """Largest TPR at false-positive rate ``fpr`` over threshold rules "in iff score >= tau"
        and their randomized mixtures (the upper concave hull of the empirical ROC).

        Args:
            fpr: in [0, 1].

        Returns:
            AuditResult: value = TPR in [0, 1], method "tpr_at_fpr", details["fpr"].

        Raises:
            ValueError: fpr not in [0, 1].

        Source: Carlini et al. (2022), Membership Inference Attacks From First Principles,
        IEEE S&P, §4 (TPR at low FPR); Provost & Fawcett (2001) (ROC convex hull).
        """
        f = check_real(fpr, "fpr")
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"fpr must be in [0, 1], got {fpr!r}")
        hx, hy = _upper_hull(*self._roc())
        return AuditResult(value=float(np.interp(f, hx, hy)), method="tpr_at_fpr",
                                source=SRC_ROC, counts=self._counts(), details={"fpr": f})

    def auroc(self) -> AuditResult:
        """Area under the empirical ROC: P(x > y) + P(x = y)/2 over all in/out pairs (the
        Mann-Whitney U statistic divided by k k').

        Returns:
            AuditResult: value in [0, 1], method "auroc".

        Source: Hanley & McNeil (1982), Radiology 143, eq. (1) (AUC = U / (k k')).
        """
        lo = np.searchsorted(self._out_sorted, self.in_scores, side="left")
        hi = np.searchsorted(self._out_sorted, self.in_scores, side="right")
        u = float(np.sum(lo) + 0.5 * np.sum(hi - lo))
        return AuditResult(value=u / (self.k_in * self.k_out), method="auroc",
                                source=SRC_AUC, counts=self._counts())


def share_bootstrap(auditors: list[CanaryScoreAuditor], bootstrap: int, seed: int) -> None:
    """Draw the bootstrap resamples of the auditors' :meth:`~CanaryScoreAuditor.epsilon_estimate`
    (with this ``bootstrap`` and ``seed``) together: auditors with equal (k, k') share one
    draw of the indices (:func:`~audit_callbacks.estimators.canary_epsilon.share_resamples`).
    Their estimates are the same numbers as without it, at about half the resampling cost for
    two auditors. Does nothing when ``bootstrap`` or ``seed`` is not valid (the estimates
    then say why).

    Args:
        auditors: the auditors whose estimates follow. bootstrap: B. seed: their seed.
    """
    samples = [aud._estimate_inputs()[:2] for aud in auditors]
    with contextlib.suppress(ValueError):  # the estimates themselves report a bad B or seed
        share_resamples(samples, bootstrap, seed)


# --------------------------------------------------------------------------------------------
# helpers: ROC hull, p-values, the noncentral-t bound
# --------------------------------------------------------------------------------------------


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
    """A scipy test's p-value; None where it is undefined: a sample without spread is refused
    before the test runs (where scipy would warn and answer NaN, or 1 for Shapiro-Wilk). No
    ``warnings.catch_warnings`` here: it runs at every estimate, and changing the warning
    filters resets Python's once-per-location record, so other libraries' warnings (torch's
    backward-hook warning under Opacus) were shown again at every estimate."""
    if any(not np.ptp(np.asarray(sample, dtype=float)) > 0 for sample in args):
        return None
    with np.errstate(all="ignore"):
        p = float(test(*args, **kwargs).pvalue)
    return p if math.isfinite(p) else None


#: scipy's noncentral-t cdf (``nctdtr``) is NaN in parts of its far tails: measured over df in
#: [10, 1e6] and |t_obs| <= 300, only where the cdf is within ~1.2e-11 of 1 or below ~1.1e-7
#: (a normal approximation). :func:`_nct_lower` takes the cdf there as 1 or 0 only while
#: 1 - alpha stays this far from both: alpha in [1e-9, 1 - 1e-6].
_NAN_TAIL_ALPHA = (1e-9, 1.0 - 1e-6)
#: The (df, |t_obs|) range that measurement covered: outside it a NaN gives the vacuous -inf.
_NAN_TAIL_DF_MIN, _NAN_TAIL_T_MAX = 10, 300.0


class _RootInNanTail(Exception):
    """The noncentral-t root may lie where scipy's cdf is NaN."""


def _nct_lower(t_obs: float, df: int, alpha: float) -> float:
    """lambda_lo with P[T <= t_obs; df, lambda_lo] = 1 - alpha (may be negative); -inf (a
    valid, vacuous bound) when 1 - alpha rounds to 1 in floating point.

    scipy's cdf is NaN in parts of its far tails (e.g. df = 8190, t_obs = 3.5, lambda <
    -4.7), which stopped brentq ("function value is NaN") and lost the bound at a small alpha
    (a logged point's spent level). There the cdf is taken as its limit, 1 (lambda < t_obs) or
    0 (lambda > t_obs): it differs from it by less than alpha and 1 - alpha for alpha in
    :data:`_NAN_TAIL_ALPHA`, so the sign of cdf - (1 - alpha), and the root, are right; for an
    alpha outside it, or df and t_obs outside the measured range (df >= 10, |t_obs| <= 300), a
    NaN gives -inf (vacuous, valid). Where the cdf is a number every
    evaluation, and so the root, is exactly as before."""
    if not math.isfinite(float(ndtri(1.0 - alpha))):
        return -math.inf

    def f(lam: float) -> float:
        # scipy.special.nctdtr is what stats.nct.cdf evaluates for df > 0 and a finite
        # lambda (the same numbers) without the distribution machinery around it (~50 us a call)
        cdf = float(nctdtr(df, lam, t_obs))
        if math.isnan(cdf):  # the far tails (see above)
            if not (_NAN_TAIL_ALPHA[0] <= alpha <= _NAN_TAIL_ALPHA[1] and df >= _NAN_TAIL_DF_MIN
                    and abs(t_obs) <= _NAN_TAIL_T_MAX):
                raise _RootInNanTail
            cdf = 1.0 if lam < t_obs else 0.0
        return cdf - (1.0 - alpha)

    z = float(ndtri(1.0 - alpha))
    spread = abs(z) * math.sqrt(1.0 + t_obs * t_obs / (2.0 * df)) + 1.0  # z < 0 for alpha > 1/2
    lo, hi = t_obs - 2.0 * spread - 1.0, t_obs + 1.0
    try:
        while f(lo) <= 0.0:  # cdf decreases in lambda: f(lo) > 0 > f(hi) brackets the root
            lo -= 2.0 * spread + 1.0
        while f(hi) >= 0.0:
            hi += spread
        return float(brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))
    except _RootInNanTail:
        return -math.inf
