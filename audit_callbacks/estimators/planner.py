"""The audit planner: what a canary audit can show, before training.

:func:`plan_audit` takes a run's settings (k observed and k' unobserved canaries, the model
dimension d, the canary kind, T steps or rounds at sampling rate q, the noise multiplier
sigma, delta, alpha, the threat model and the training kind) and predicts:

1. **the ceiling**: the largest valid (1 - alpha) lower bound on epsilon these canaries can
   reach, i.e. :func:`~audit_callbacks.estimators.valid_bounds.tightest_valid_lower_bound` of
   perfectly separated scores (every in-score above every out-score) with these k, k', delta,
   alpha, methods and seed. It is that function's value, computed by it. The old rule "about
   log(number of canaries)" is not it: the Clopper-Pearson bound of k separated in-scores is
   log((1 - delta - FPR_u) / FNR_u) with FNR_u = 1 - (alpha/2T)^(1/k), roughly
   log(k / log(2T/alpha)), below log k by log log(2T/alpha) (about 1.7 nats at alpha = 0.05), and
   the one-run bounds depend on k' as well (``docs/methods/planner.md`` has a table);
2. **the ratio**: the estimate/reference ratio a correct run is expected to show, as the
   central ``coverage`` range (and median) of ``replicates`` simulated runs: canary scores are
   drawn from the law of the audit's statistic for a correct run (below) and the real estimator
   is run on them;
3. **the smallest bug flagged with ``power``**: the clip factor c (each canary contribution
   multiplied by c) and the noise factor f (sigma -> sigma / f) at which the valid bound of the
   simulated scores exceeds the claim (``reference_epsilon``) with probability >= ``power``
   (bisection on log c with common random numbers), or None when no factor up to
   ``max_factor`` suffices (in particular when the claim is at or above the ceiling).

**The laws** (units of one clipped contribution; ``docs/methods/planner.md``):

* DP-SGD, all iterates (``training="dpsgd"``, the steps-unknown statistic of
  :mod:`audit_callbacks.canary.steps_unknown`): per step y ~ N(b, sigma^2 + v_x) with b = 1 in
  the steps an observed canary is drawn (Poisson, rate q) and 0 otherwise, v_x = q k / d the
  cross terms of the other inserted Gaussian canaries (0 for Hadamard canaries, exactly
  orthogonal); the score is sum_t log(1 - q + q exp((2 y_t - 1) / (2 sigma^2))). Simulated as:
  n ~ Binomial(T, q) participations per observed canary, the n participation terms drawn
  exactly (their normal limit when there are too many to draw), the T - n others and the
  unobserved canaries' T terms from their normal limit with the exact per-step moments
  (Gauss-Hermite quadrature). Estimator: ``CanaryScoreAuditor(observed,
  unobserved).epsilon_estimate(delta, fit="equal")``; for k' above :data:`SURROGATE_SIZE` the
  unobserved scores enter through a sample of that size with the simulated k'-sample's mean
  and sd (the equal fit reads nothing else of them).
* DP-FedAvg, all iterates (``training="dpfedavg"``, the known-rounds statistic of
  :mod:`audit_callbacks.canary.known_rounds`): per (canary, round) y ~ N(1/sigma, 1) in a
  round the canary took part in (r_j ~ Binomial(T, q)) and N(0, 1) otherwise; the estimate is
  eps_GDP(sqrt(r_max) mu_1, delta) with mu_1 = (mean y over participations - mean y over
  the unobserved rounds) / their sd, the formula of ``KnownRoundScores.estimate`` (through
  :func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon_array`); the scores the valid
  bound reads are t_j = sum y / sqrt(r_j) ~ N(sqrt(r_j) / sigma, 1) (observed canaries that
  took part) and N(0, 1). Without ``reference_epsilon`` each simulated run's ratio is taken
  against the analytic epsilon at its own r_max (the Gaussian mechanism composed over the
  most-sampled canary's rounds), and the claim the bugs are measured against is the analytic
  epsilon at the median simulated r_max.
* Final model (either training kind, no server momentum): the canary's score is its
  projection on theta_T - theta_0 in noise sds, N(n_j / (sigma sqrt(T)), 1) with n_j ~
  Binomial(T, q), the unobserved N(0, 1); the estimator is the equal fit against the exact
  cosine null (``CanaryScoreAuditor(..., dim=d)``), the reference ``reference_epsilon`` (the
  last-iterate heuristic).

Assumptions: the real examples' (clients') contributions have directions independent of the
canaries (``real_per_step`` R of them a step add R / n to the per-step variance, n = d or the
Hadamard length; R = 0, the default, neglects them), the run's noise is the claimed Gaussian,
and sampling is Poisson (rate q per step or round) or a fixed schedule. Pure numpy/scipy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from ..validation import (
    check_alpha,
    check_choice,
    check_count,
    check_delta,
    check_flag,
    check_positive,
    check_probability,
    check_real,
    check_seed,
)
from .canary_report import BOUND_METHODS
from .gaussian import gaussian_epsilon, gaussian_epsilon_array
from .score_auditor import CanaryScoreAuditor
from .valid_bounds import METHODS, tightest_valid_lower_bound, valid_bound_values

__all__ = ["ALIGNED_SHARE_NOTE", "SOURCE", "SURROGATE_SIZE", "AuditPlan", "plan_audit"]

SOURCE = (
    "valid bounds: Jagielski, Ullman, Oprea (2020); Steinke, Nasr, Jagielski (2023); "
    "Mahloujifar, Melis, Chaudhuri (2024); estimate: Andrew, Kairouz, Oh, Oprea, McMahan, "
    "Suriyakumar (2024), ICLR, §3.2; statistics' laws: the Poisson-subsampled Gaussian's "
    "privacy loss (Koskela, Jalko, Honkela 2020; Zhu, Dong, Wang 2022) and the composed "
    "Gaussian mechanism (Dong, Roth, Su 2022, Cor. 3.3)"
)

#: Unobserved scores beyond this many enter the ratio simulation through a sample of this size
#: with the simulated mean and sd (the equal-variance estimate reads only those).
SURROGATE_SIZE = 2000
#: Participation terms drawn exactly per simulation (beyond: their normal limit).
_EXACT_DRAWS = 4_000_000
_TRAINING = ("dpsgd", "dpfedavg")
_THREAT_MODELS = ("all_iterates", "final_model")
_CANARIES = ("hadamard", "gaussian")
_PARTICIPATION = ("poisson", "fixed")
_HERMITE = np.polynomial.hermite_e.hermegauss(96)


#: :attr:`AuditPlan.aligned_real_share` from which the plan's summary says that aligned real
#: contributions can put a correct run's ratio below the range (measured on correct Opacus runs
#: of MLPs on breast_cancer, R = 64, sigma = 1: at a share of 4, d = 1,025, 40 of 40 fell below
#: it; at 1, d = 6,401, 14 of 15 were within it).
ALIGNED_SHARE_NOTE = 2.0


@dataclasses.dataclass(frozen=True)
class AuditPlan:
    """What an audit with these settings can show (:func:`plan_audit`).

    Attributes:
        ceiling: the largest valid (1 - alpha) lower bound on epsilon (nats) these canaries can
            reach: the tightest valid bound of perfectly separated scores.
        ceiling_method: the valid method that reaches it.
        log_rule: log(k), the old "about log(number of canaries)" rule, for comparison.
        reference_epsilon: the claim the ratios and bugs are measured against (nats).
        ratio_low, ratio_median, ratio_high: the central ``coverage`` range and median of
            estimate / reference over simulated correct runs.
        coverage: the probability the ratio range is meant to hold (e.g. 0.9).
        clip_factor: the smallest canary clip factor c > 1 whose bug the valid bound flags
            (exceeds the claim) with probability >= ``power``; None if none up to max_factor.
        noise_factor: the same for the noise factor f (sigma -> sigma / f).
        power: the power asked for (e.g. 0.95).
        max_factor: the largest factor searched.
        num_canaries, num_unobserved: k and k'.
        training, threat_model, delta, alpha: as given.
        replicates: simulated runs behind the ratio range.
        bugs_searched: False when the bug search was skipped (``search_bugs=False``).
        steps: T, the DP-SGD steps or DP-FedAvg rounds planned for (the plan holds for a run
            of this length only).
        aligned_real_share: R^2 / (n sigma^2), the variance the ``real_per_step`` R real
            contributions would add on a canary, relative to the noise's, were they all
            aligned (norm R C instead of sqrt(R) C): the range assumes independent
            directions (R / (n sigma^2)); at a share of :data:`ALIGNED_SHARE_NOTE` or more
            the summary says that a correct run's ratio can fall below the range.
        source: the papers behind the numbers.
    """

    ceiling: float
    ceiling_method: str
    log_rule: float
    reference_epsilon: float
    ratio_low: float
    ratio_median: float
    ratio_high: float
    coverage: float
    clip_factor: float | None
    noise_factor: float | None
    power: float
    max_factor: float
    num_canaries: int
    num_unobserved: int
    training: str
    threat_model: str
    delta: float
    alpha: float
    replicates: int
    bugs_searched: bool = True
    steps: int | None = None
    aligned_real_share: float = 0.0
    source: str = SOURCE

    @property
    def above_ceiling(self) -> bool:
        """Whether the claim is at or above the ceiling: no valid bound of these canaries can
        exceed it, whatever the bug."""
        return self.reference_epsilon is not None and self.reference_epsilon >= self.ceiling

    def summary(self) -> str:
        """One line for the fit-start log."""
        head = (f"plan: k = {self.num_canaries} canaries can show a valid epsilon of at most "
                f"{self.ceiling:.2f} (delta = {self.delta:g}); a correct run's estimate/claim "
                f"ratio is expected in [{self.ratio_low:.2f}, {self.ratio_high:.2f}] "
                f"({100 * self.coverage:.0f}% of correct runs)")
        if self.aligned_real_share >= ALIGNED_SHARE_NOTE:
            who = "examples' clipped gradients" if self.training == "dpsgd" else "clients' clipped updates"
            head += (f" if the real {who} point in independent directions; aligned, they add up to "
                     f"{self.aligned_real_share:.2g}x the noise's variance on each canary at this "
                     "model size, and a correct run's ratio can fall below that range")
        if self.above_ceiling:
            return (head + f"; the claim {self.reference_epsilon:.2f} is at or above that "
                    "ceiling, so no valid bound can flag a bug (more canaries raise it; the "
                    "estimate's interval still can)")
        if not self.bugs_searched:
            return head
        bugs = []
        if self.clip_factor is not None:
            bugs.append(f"a {self.clip_factor:.2g}x clipping bug")
        if self.noise_factor is not None:
            bugs.append(f"noise {self.noise_factor:.2g}x too small")
        pw = f"{100 * self.power:.0f}%"
        bug = (" or ".join(bugs) + f" would be flagged with {pw} power" if bugs else
               f"no clipping or noise bug up to {self.max_factor:g}x would be flagged with {pw} "
               "power")
        return f"{head}; {bug}"

    def read_ratio(self, ratio: float) -> str:
        """A measured estimate/claim ratio read against the expected range.

        Raises:
            ValueError: ratio not a finite real >= 0.
        """
        r = check_real(ratio, "ratio", low=0.0)
        # 2 decimals, more where the ratio would print as the end it lies outside (up to 6)
        end = self.ratio_low if r < self.ratio_low else self.ratio_high if r > self.ratio_high else None
        digits = 2
        while end is not None and digits < 6 and f"{r:.{digits}f}" == f"{end:.{digits}f}":
            digits += 1
        rng = f"[{self.ratio_low:.{digits}f}, {self.ratio_high:.{digits}f}]"
        if r < self.ratio_low:
            masked = (f"; at this model size aligned real contributions can mask the canaries "
                      f"(aligned_real_share {self.aligned_real_share:.2g})"
                      if self.aligned_real_share >= ALIGNED_SHARE_NOTE else "")
            return (f"{r:.{digits}f}: below the range expected for a correct run at these settings "
                    f"{rng}: the audit is weaker than planned (the canaries' contribution or "
                    f"the statistic lost power, or the run is more private than claimed){masked}")
        if r > self.ratio_high:
            return (f"{r:.{digits}f}: above the range expected for a correct run at these settings "
                    f"{rng}: the run may leak more than claimed")
        return f"{r:.2f}: within the range expected for a correct run at these settings {rng}"


# --------------------------------------------------------------------------------------------
# the laws
# --------------------------------------------------------------------------------------------


def _llr(y: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """The steps-unknown statistic's per-step term (``steps_unknown_increment`` in numpy)."""
    a = (y * 2.0 - 1.0) / (2.0 * sigma * sigma)
    if q >= 1.0:
        return a
    return np.logaddexp(a + math.log(q), math.log1p(-q))


def _moments(mean: float, sd: float, q: float, sigma: float) -> tuple[float, float]:
    """Mean and variance of ``_llr(Y)`` for Y ~ N(mean, sd^2) (Gauss-Hermite quadrature)."""
    x, w = _HERMITE
    v = _llr(mean + sd * x, q, sigma)
    w = w / w.sum()
    m = float(np.dot(w, v))
    return m, float(max(np.dot(w, (v - m) ** 2), 0.0))


@dataclasses.dataclass
class _Draws:
    """Common random numbers of ``R`` simulated runs (reused for every bug factor)."""

    n: np.ndarray  # [R, k] participations of the observed canaries
    z_rest: np.ndarray  # [R, k] standard normals: the non-participation sum (or the score)
    z_part: np.ndarray | None  # [sum n] standard normals: the exact participation terms
    z_limit: np.ndarray | None  # [R, k] standard normals: their normal limit instead
    z_out: np.ndarray  # [R, k'] (or [R, S]) standard normals of the unobserved scores
    out_stats: tuple[np.ndarray, np.ndarray] | None  # k'-sample mean, sd draws (surrogate)
    z_mu: np.ndarray | None  # [R, 3] standard normals of the known-rounds means and sd


def _draws(rng: np.random.Generator, s: dict[str, Any], reps: int, full_out: bool) -> _Draws:
    k, ku, t, q = s["k"], s["ku"], s["steps"], s["q"]
    if s["participation"] == "poisson":
        n = rng.binomial(t, q, size=(reps, k))
    else:  # a shuffled schedule: floor(T q) or ceil(T q) participations, T q on average
        whole = math.floor(t * q)
        n = whole + (rng.random((reps, k)) < t * q - whole)
    z_rest = rng.standard_normal((reps, k))
    steps_unknown = s["training"] == "dpsgd" and s["threat_model"] == "all_iterates"
    exact = steps_unknown and int(n.sum()) <= _EXACT_DRAWS
    z_part = rng.standard_normal(int(n.sum())) if exact else None
    z_limit = rng.standard_normal((reps, k)) if steps_unknown and not exact else None
    size = ku if full_out or ku <= SURROGATE_SIZE else SURROGATE_SIZE
    z_out = rng.standard_normal((reps, size))
    out_stats = None
    if size < ku:
        # the k'-sample's mean and sd of N(0, 1) scores, and a surrogate rescaled to them
        out_stats = (rng.standard_normal(reps) / math.sqrt(ku),
                     np.sqrt(rng.chisquare(ku - 1, size=reps) / (ku - 1)))
    z_mu = rng.standard_normal((reps, 3)) if s["training"] == "dpfedavg" else None
    return _Draws(n, z_rest, z_part, z_limit, z_out, out_stats, z_mu)


def _scores(s: dict[str, Any], dr: _Draws, clip: float, noise: float
            ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Per run (observed, unobserved) scores and the run's r_max, with the canaries'
    contribution multiplied by ``clip`` and sigma divided by ``noise`` (1, 1: a correct run)."""
    t, q, sigma = s["steps"], s["q"], s["sigma"]
    sd = math.sqrt((sigma / noise) ** 2 + s["cross"])
    if s["threat_model"] == "final_model":
        # projection on theta_T - theta_0 in units of the claimed noise sd sigma sqrt(T)
        obs = (clip * dr.n + sd * math.sqrt(t) * dr.z_rest) / (sigma * math.sqrt(t))
        out = dr.z_out * (sd / sigma)
        return list(obs), list(out), dr.n.max(axis=1)
    if s["training"] == "dpfedavg":
        r = dr.n
        scale = sd / sigma  # y in claimed noise sds
        took = r > 0
        safe = np.maximum(r, 1)
        obs = (clip * np.sqrt(safe) / sigma + scale * dr.z_rest)
        out = dr.z_out * scale
        return [o[m] for o, m in zip(obs, took, strict=True)], list(out), r.max(axis=1)
    m0, v0 = _moments(0.0, sd, q, sigma)
    m1, v1 = _moments(clip, sd, q, sigma)
    n = dr.n
    rest = (t - n) * m0 + np.sqrt((t - n) * v0) * dr.z_rest
    if dr.z_part is not None:
        terms = _llr(clip + sd * dr.z_part, q, sigma)
        owner = np.repeat(np.arange(n.size), n.ravel())
        part = np.bincount(owner, weights=terms, minlength=n.size).reshape(n.shape)
    else:  # too many to draw: the normal limit of the n participation terms
        assert dr.z_limit is not None
        part = n * m1 + np.sqrt(n * v1) * dr.z_limit
    obs = part + rest
    mu_out, sd_out = t * m0, math.sqrt(t * v0)
    if dr.out_stats is None:
        out = mu_out + sd_out * dr.z_out
    else:
        z = dr.z_out - dr.z_out.mean(axis=1, keepdims=True)
        z = z / z.std(axis=1, ddof=1, keepdims=True)
        mean, spread = dr.out_stats
        out = mu_out + sd_out * (mean[:, None] + spread[:, None] * z)
    return list(obs), list(out), n.max(axis=1)


def _estimates(s: dict[str, Any], dr: _Draws) -> tuple[np.ndarray, np.ndarray]:
    """Estimate of every simulated correct run, and its r_max."""
    obs, out, rmax = _scores(s, dr, 1.0, 1.0)
    reps = len(obs)
    est = np.zeros(reps)
    delta = s["delta"]
    if s["threat_model"] == "all_iterates" and s["training"] == "dpfedavg":
        # KnownRoundScores.estimate: eps_GDP(sqrt(r_max) mu_1), mu_1 from every participation
        r_in = dr.n.sum(axis=1).astype(float)
        r_out = float(s["ku"] * s["steps"])
        assert dr.z_mu is not None
        scale = math.sqrt(s["sigma"] ** 2 + s["cross"]) / s["sigma"]  # y's sd in noise sds
        mean_in = 1.0 / s["sigma"] + scale * dr.z_mu[:, 0] / np.sqrt(np.maximum(r_in, 1.0))
        mean_out = scale * dr.z_mu[:, 1] / math.sqrt(r_out)
        sd_out = scale * np.sqrt(stats.chi2.ppf(stats.norm.cdf(dr.z_mu[:, 2]), r_out - 1) / (r_out - 1))
        mu = np.sqrt(rmax) * (mean_in - mean_out) / sd_out
        return gaussian_epsilon_array(np.maximum(mu, 0.0), delta), rmax
    for i in range(reps):
        if obs[i].size < 2:
            continue
        try:
            if s["threat_model"] == "final_model":
                root = math.sqrt(s["dim"])
                aud = CanaryScoreAuditor(np.clip(obs[i] / root, -1.0, 1.0),
                                         np.clip(out[i] / root, -1.0, 1.0), dim=s["dim"])
            else:
                aud = CanaryScoreAuditor(obs[i], out[i])
        except ValueError as err:  # scores without spread: the statistic's law is degenerate
            raise ValueError(
                f"noise_multiplier = {s['sigma']:g} is too small to plan: a correct run's "
                f"simulated canary scores have no spread in floating point ({err})") from None
        est[i] = aud.epsilon_estimate(delta, fit="equal").value
    return est, rmax


def _power(s: dict[str, Any], dr: _Draws, claim: float, clip: float, noise: float) -> float:
    """P[valid bound > claim] over the simulated runs with this bug."""
    obs, out, _ = _scores(s, dr, clip, noise)
    sets = [(o, u) for o, u in zip(obs, out, strict=True) if o.size >= 2]
    if not sets:
        return 0.0
    vals = valid_bound_values(sets, alpha=s["alpha"], delta=s["delta"], methods=s["methods"],
                              seed=s["seed"]).max(axis=1)
    return float(np.sum(vals > claim)) / len(obs)


def _smallest_factor(s: dict[str, Any], dr: _Draws, claim: float, which: str, power: float,
                     max_factor: float, steps: int) -> float | None:
    """The smallest factor in (1, max_factor] with power >= ``power`` (bisection on log)."""

    def ok(f: float) -> bool:
        clip, noise = (f, 1.0) if which == "clip" else (1.0, f)
        return _power(s, dr, claim, clip, noise) >= power

    if not ok(max_factor):
        return None
    lo, hi = 0.0, math.log(max_factor)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(math.exp(mid)) else (mid, hi)
    return float(math.exp(hi))


# --------------------------------------------------------------------------------------------
# the public function
# --------------------------------------------------------------------------------------------


def _ceiling(k: int, ku: int, alpha: float, delta: float, methods: tuple[str, ...], seed: int
             ) -> tuple[float, str]:
    """The tightest valid bound of perfectly separated scores (every in-score above every
    out-score, no ties)."""
    r = tightest_valid_lower_bound(1.0 + np.arange(k, dtype=float), -1.0 - np.arange(ku, dtype=float),
                                   alpha=alpha, delta=delta, methods=methods, seed=seed)
    return r.value, str(r.details["winner"])


def plan_audit(
    num_canaries: int,
    num_unobserved: int,
    *,
    dim: int,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    delta: float,
    reference_epsilon: float | None = None,
    canaries: str = "hadamard",
    training: str = "dpsgd",
    threat_model: str = "all_iterates",
    alpha: float = 0.05,
    methods: Sequence[str] = BOUND_METHODS,
    coverage: float = 0.9,
    power: float = 0.95,
    max_factor: float = 10.0,
    replicates: int = 400,
    power_replicates: int = 100,
    bisection_steps: int = 6,
    search_bugs: bool = True,
    participation: str = "poisson",
    real_per_step: float = 0.0,
    seed: int = 0,
) -> AuditPlan:
    """Plan a canary audit before training: its ceiling, expected ratio and power.

    Args:
        num_canaries: k >= 2 observed (inserted) canaries.
        num_unobserved: k' >= 2 unobserved canaries.
        dim: d >= 2, the model dimension (Hadamard: k + k' <= 2^floor(log2 d); Gaussian
            canaries add q k / d to the per-step noise variance).
        steps: T >= 1, DP-SGD steps or DP-FedAvg rounds.
        sample_rate: q in (0, 1], the per-step (per-round) Poisson sampling rate.
        noise_multiplier: sigma > 0.
        delta: in (0, 1), the claim's delta.
        reference_epsilon: the claim (nats, > 0): the accountant's epsilon at ``delta`` for
            DP-SGD (e.g. ``backends.opacus.accounting.analytic_epsilons``' PRV value), the
            last-iterate heuristic for the final model; required except for DP-FedAvg's all
            iterates, where it defaults to the analytic epsilon at the median simulated most
            participations (:func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon`).
        canaries: "hadamard" (default) or "gaussian".
        training: "dpsgd" (steps-unknown statistic) or "dpfedavg" (known-rounds statistic).
        threat_model: "all_iterates" (default) or "final_model".
        alpha: in (0, 1), 1 - confidence of the valid bounds.
        methods: the valid methods combined (default: the canary report's).
        coverage: in (0, 1), the probability of the ratio range.
        power: in (0, 1), the power asked of the bug factors.
        max_factor: > 1, the largest factor searched.
        replicates: >= 10 simulated correct runs for the ratio range.
        power_replicates: >= 10 simulated runs per factor tried; bisection_steps >= 1.
        search_bugs: False skips the bug search, the slow part (2 valid bounds of
            ``power_replicates`` runs per factor tried: about 2 s for k = k' = 200, 4.5 s for
            k = k' = 1000, 30 s for k = 1000, k' = 100,000 on one core); the factors are then
            None. The rest takes under a second.
        participation: "poisson" (default: each canary drawn independently at rate q every
            step or round, what the accountants assume) or "fixed" (a shuffled schedule: every
            canary takes part in floor(T q) or ceil(T q) steps, T q on average).
        real_per_step: R >= 0, the expected real contributions (clipped examples for DP-SGD,
            clients for DP-FedAvg) summed with the canaries in a step or round. Each is a
            clipped vector of norm at most C in a direction independent of the canary, so the
            real sum's projection on a canary adds R / n to the per-step variance (units of
            C^2; n = d for Gaussian canaries, 2^floor(log2 d) for Hadamard ones): to the
            unobserved canaries' scores as well, which the estimators normalise by, so it
            lowers the estimate. 0 (default): the real data is orthogonal to the canaries.
        seed: seed of the simulation (and of the valid bounds' emulated pool).

    Returns:
        AuditPlan.

    Raises:
        ValueError: an argument out of range, named; Hadamard canaries above their cap (the
            fix named); Gaussian canaries with DP-FedAvg's all iterates (no known-rounds
            statistic for them).
    """
    k = check_count(num_canaries, "num_canaries", minimum=2)
    ku = check_count(num_unobserved, "num_unobserved", minimum=2)
    d = check_count(dim, "dim", minimum=2)
    t = check_count(steps, "steps", minimum=1)
    q = check_probability(sample_rate, "sample_rate", high_inclusive=True)
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    dl = check_delta(delta)
    kind = check_choice(canaries, "canaries", _CANARIES)
    tr = check_choice(training, "training", _TRAINING)
    tm = check_choice(threat_model, "threat_model", _THREAT_MODELS)
    a = check_alpha(alpha)
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise ValueError(f"methods must be a non-empty tuple of names from {METHODS}, "
                         f"got {methods!r}")
    meths = tuple(check_choice(m, "methods", METHODS) for m in methods)
    cov = check_probability(coverage, "coverage")
    pw = check_probability(power, "power")
    mf = check_real(max_factor, "max_factor", low=1.0, low_inclusive=False)
    reps = check_count(replicates, "replicates", minimum=10)
    preps = check_count(power_replicates, "power_replicates", minimum=10)
    bis = check_count(bisection_steps, "bisection_steps", minimum=1)
    search = check_flag(search_bugs, "search_bugs")
    part = check_choice(participation, "participation", _PARTICIPATION)
    sd = check_seed(seed)
    real = check_real(real_per_step, "real_per_step", low=0.0)
    ref = None if reference_epsilon is None else check_positive(reference_epsilon,
                                                                "reference_epsilon")
    if ref is None and not (tr == "dpfedavg" and tm == "all_iterates"):
        raise ValueError("reference_epsilon is required for this training / threat model (the "
                         "accountant's epsilon at delta for DP-SGD, the last-iterate heuristic "
                         "for the final model)")
    if kind == "hadamard":
        cap = 1 << int(math.floor(math.log2(d)))
        if k + ku > cap:
            raise ValueError(f"num_canaries: at most {cap} Hadamard canaries (observed + "
                             f"unobserved) exist for dim {d}, got {k} + {ku}; use fewer "
                             "canaries or canaries=\"gaussian\"")
    elif tr == "dpfedavg" and tm == "all_iterates":
        raise ValueError("canaries: the known-rounds statistic of DP-FedAvg needs "
                         "canaries=\"hadamard\"")
    s = {"k": k, "ku": ku, "dim": d, "steps": t, "q": q, "sigma": sigma, "delta": dl,
         "alpha": a, "training": tr, "threat_model": tm, "methods": meths, "seed": sd,
         "participation": part,
         "cross": (q * k / d if kind == "gaussian" and tr == "dpsgd" else 0.0)
         + real / (d if kind == "gaussian" else 1 << int(math.floor(math.log2(d))))}

    ceiling, winner = _ceiling(k, ku, a, dl, meths, sd)

    rng = np.random.default_rng([sd, 36])
    est, rmax = _estimates(s, _draws(rng, s, reps, full_out=False))
    if ref is None:  # each run against the analytic epsilon at its own most participations
        ref = gaussian_epsilon(sigma, dl, compositions=max(int(np.median(rmax)), 1))
        # the same numbers as one call per run: one call per distinct r_max (a few values)
        distinct, where = np.unique(rmax, return_inverse=True)
        refs = np.array([gaussian_epsilon(sigma, dl, compositions=int(r)) if r > 0 else math.inf
                         for r in distinct])[where.reshape(-1)]
        ratio = est / refs
    else:
        ratio = est / ref
    lo, med, hi = np.quantile(ratio, [(1.0 - cov) / 2.0, 0.5, (1.0 + cov) / 2.0])

    clip = noise = None
    if search and ref < ceiling:
        dr = _draws(np.random.default_rng([sd, 37]), s, preps, full_out=True)
        clip = _smallest_factor(s, dr, ref, "clip", pw, mf, bis)
        noise = _smallest_factor(s, dr, ref, "noise", pw, mf, bis)
    return AuditPlan(
        ceiling=float(ceiling), ceiling_method=winner, log_rule=math.log(k),
        reference_epsilon=float(ref), ratio_low=float(lo), ratio_median=float(med),
        ratio_high=float(hi), coverage=cov, clip_factor=clip, noise_factor=noise, power=pw,
        max_factor=mf, num_canaries=k, num_unobserved=ku, training=tr, threat_model=tm,
        delta=dl, alpha=a, replicates=reps, bugs_searched=search, steps=t,
        aligned_real_share=real * real / (sigma * sigma * (d if kind == "gaussian" else 1 << int(math.log2(d)))),
    )
