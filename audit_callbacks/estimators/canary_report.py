"""Every canary estimate of one audit, per threat model (numpy and scipy only).

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024). The
names below are the keys of the report's ``estimates``, of ``audit_summary.json``'s
``estimates`` and, after ``audit/``, the TensorBoard tags (:mod:`audit_callbacks.names`).

Final model (the adversary sees theta_T; reference: the last-iterate heuristic):

* ``epsilon_final_model`` - the equal-variance two-Gaussian fit of ``cos(c_j, theta_T -
  theta_0)`` (Andrew et al. §3.2, with the equal variances of their Thm 3.3); the headline;
* ``epsilon_final_model_unequal_fit`` - Andrew et al.'s unequal-variance fit (biased upward at
  small epsilon: +58% at epsilon 1 in ``benchmarks/lower_bounds.py``);

All iterates (the adversary sees every release; reference: the analytic epsilon):

* ``epsilon_all_iterates_matched`` - the statistic matched to the reference's adversary
  (DP-FedAvg and Flower: the aligned sum over the known rounds,
  :mod:`audit_callbacks.canary.known_rounds`; DP-SGD: the Neyman-Pearson statistic of the
  Poisson-subsampled Gaussian with the steps unknown, :mod:`audit_callbacks.canary.steps_unknown`);
* ``epsilon_all_iterates`` - the headline: the larger of the matched and the final-model
  estimates (that adversary can compute the final model too); where the training has no
  matched statistic (no DP noise, local DP, an unknown server optimizer), the larger of the
  max-cosine and the final-model estimates, the statistics its valid bound reads then. Its
  ``details["statistic"]`` names the winner (``matched``, ``max_cosine`` or ``final_model``)
  and ``details["candidates"]`` holds both candidates' values (``matched`` or
  ``max_cosine``, and ``final_model``);
* ``epsilon_all_iterates_max_cosine`` - Andrew et al.'s ``max_t cos(c_j, Delta_t)``
  (Alg. 3): a comparison where a matched statistic exists, a candidate of the headline where
  none does;

and for both:

* ``epsilon_lower_bound_<tm>`` - a valid (1 - alpha) lower bound
  (:mod:`audit_callbacks.estimators.valid_bounds`): the larger of Clopper-Pearson with
  Bonferroni thresholds and the f-DP one-run bound (Mahloujifar, Melis, Chaudhuri 2024), each
  at alpha / 2 (:data:`BOUND_METHODS`), for all iterates on the matched scores (without a
  matched statistic: on the max-cosine and the final-model scores, the level split between
  them); at a logged point at the level spent for that point, so the maximum of the logged
  series is still a valid bound;
* ``epsilon_gdp_lower_bound_<tm>`` - the parametric (1 - alpha) lower bound assuming Gaussian
  scores of equal variance (Dong, Roth, Su 2022), only where its goodness-of-fit test passes
  and it does not lie above its own statistic's estimate interval (:func:`gdp_above_estimate`:
  otherwise skipped with that status); at a logged point also at the level spent for that
  point.

The formulas are in ``docs/methods/canaries.md`` and ``docs/methods/score_auditor.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from audit_callbacks.names import (
    EPSILON_ALL_ITERATES,
    EPSILON_ALL_ITERATES_MATCHED,
    EPSILON_ALL_ITERATES_MAX_COSINE,
    EPSILON_FINAL_MODEL,
    EPSILON_FINAL_MODEL_UNEQUAL_FIT,
    EPSILON_GDP_LOWER_BOUND_ALL_ITERATES,
    EPSILON_GDP_LOWER_BOUND_FINAL_MODEL,
    EPSILON_LOWER_BOUND_ALL_ITERATES,
    EPSILON_LOWER_BOUND_FINAL_MODEL,
)

from .result import AuditResult
from .score_auditor import CanaryScoreAuditor, share_bootstrap
from .valid_bounds import check_bound_arguments, spent_alpha, tightest_valid_lower_bounds

__all__ = ["SOURCE", "THREAT_MODELS", "canary_estimates", "cosine_null_pdf", "estimate_names",
           "gdp_above_estimate"]

THREAT_MODELS = ("final_model", "all_iterates")
SOURCE = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar: One-shot Empirical Privacy "
          "Estimation for Federated Learning (ICLR 2024), Alg. 2 (final model) and Alg. 3 "
          "(all iterates)")


def estimate_names(threat_model: str) -> dict[str, str]:
    """The estimate names of one threat model: ``{kind: name}``."""
    if threat_model == "final_model":
        return {"estimate": EPSILON_FINAL_MODEL, "unequal_fit": EPSILON_FINAL_MODEL_UNEQUAL_FIT,
                "lower_bound": EPSILON_LOWER_BOUND_FINAL_MODEL,
                "gdp_lower_bound": EPSILON_GDP_LOWER_BOUND_FINAL_MODEL}
    return {"estimate": EPSILON_ALL_ITERATES, "matched": EPSILON_ALL_ITERATES_MATCHED,
            "max_cosine": EPSILON_ALL_ITERATES_MAX_COSINE,
            "lower_bound": EPSILON_LOWER_BOUND_ALL_ITERATES,
            "gdp_lower_bound": EPSILON_GDP_LOWER_BOUND_ALL_ITERATES}


def cosine_null_pdf(t: ArrayLike, dim: int) -> np.ndarray:
    """Density of the cosine of a uniform random unit vector with a fixed one in d dimensions:
    (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2) (Andrew et al., ICLR 2024, §3)."""
    a = (dim - 1) / 2
    return 0.5 * stats.beta.pdf((np.asarray(t, dtype=float) + 1.0) / 2.0, a, a)


Scores = tuple[np.ndarray, np.ndarray]

#: The valid bound's methods, chosen before any data, the level split between them:
#: Clopper-Pearson with Bonferroni thresholds (strongest with many more unobserved than observed
#: canaries, as Hadamard canaries give) and the f-DP one-run bound (Mahloujifar, Melis,
#: Chaudhuri 2024; the strongest with balanced counts, in 5999 of 6000 simulated data sets of
#: ``benchmarks/lower_bounds.py --valid``). On the benchmark's runs either wins: DP-FedAvg
#: z = 1: 4.89 against 4.26; z = 2: 2.55 against 1.75; DP-SGD sigma = 1: 5.13 against 4.34.
#: The f-DP bound holds for Gaussian-shaped mechanisms (the noisy sums of DP-SGD and DP-FedAvg);
#: a training whose release is not such a sum (local randomizers, an unmatched release) gets
#: :data:`~audit_callbacks.estimators.valid_bounds.DEFAULT_METHODS` (``docs/methods/
#: score_auditor.md`` §8).
BOUND_METHODS = ("clopper_pearson", "one_run_fdp")


def _valid_bounds(pools: list[list[Scores | CanaryScoreAuditor]], delta: float, alpha: float,
                  index: int | None, seed: int, methods: tuple[str, ...]
                  ) -> list[AuditResult | ValueError]:
    """The valid bound of each pool of score sets: the largest of the sets' valid lower bounds,
    each at ``alpha / len(pool)``, at the level spent for logged point ``index`` (None: the
    plain level). Computed together: one f-DP search for every set of every pool
    (:func:`~audit_callbacks.estimators.valid_bounds.tightest_valid_lower_bounds`), each
    result the one it has alone. A pool whose arguments or scores are bad gets the ValueError
    its own computation raised (checked in the same order) instead of a result. A set may be
    given as an auditor without ``dim`` (its scores, already sorted)."""
    checked: list[list[CanaryScoreAuditor] | ValueError] = []
    for scores in pools:
        share = alpha / len(scores)
        try:
            auds = []
            for i, x in enumerate(scores):
                check_bound_arguments(share, delta, seed + i, index, methods, "fixed")
                auds.append(x if isinstance(x, CanaryScoreAuditor) else CanaryScoreAuditor(*x))
            checked.append(auds)
        except ValueError as err:
            checked.append(err)
    sets: list[CanaryScoreAuditor] = []
    alphas: list[float] = []
    seeds: list[int] = []
    for scores, auds in zip(pools, checked, strict=True):
        if not isinstance(auds, ValueError):
            sets += auds
            alphas += [alpha / len(scores)] * len(auds)
            seeds += [seed + i for i in range(len(auds))]
    flat = tightest_valid_lower_bounds(sets, alphas=alphas, delta=delta, seeds=seeds,
                                       index=index, methods=methods) if sets else []
    out: list[AuditResult | ValueError] = []
    for scores, auds in zip(pools, checked, strict=True):
        if isinstance(auds, ValueError):
            out.append(auds)
            continue
        results, flat = flat[:len(auds)], flat[len(auds):]
        best = max(results, key=lambda r: r.value)  # the first of the largest, as one by one
        if len(scores) == 1:
            out.append(best)
            continue
        try:
            out.append(replace(best, alpha=alpha, details={
                **best.details, "statistic_values": [r.value for r in results],
                "alpha_per_statistic": alpha / len(scores)}))
        except ValueError as err:  # the pool's level itself is out of range
            out.append(err)
    return out


def _sizes(scores: Scores | CanaryScoreAuditor) -> tuple[int, int]:
    if isinstance(scores, CanaryScoreAuditor):
        return scores.k_in, scores.k_out
    return int(np.size(scores[0])), int(np.size(scores[1]))


def canary_estimates(
    final: Scores, delta: float, *, max_cosine: Scores | None = None,
    matched: tuple[Scores | CanaryScoreAuditor, AuditResult] | None = None, dim: int | None = None,
    alpha: float = 0.05, bootstrap: int = 0, seed: int = 0, index: int | None = None,
    gof_level: float = 0.01, methods: tuple[str, ...] = BOUND_METHODS,
) -> tuple[dict[str, AuditResult], dict[str, str]]:
    """Every estimate of both threat models.

    Args:
        final: ``(observed [k], unobserved [k'])`` final-model cosines (observed: the canaries
            that took part).
        delta: the target delta in (0, 1).
        max_cosine: Andrew et al.'s all-iterates max cosines, or None before any round.
        matched: the matched all-iterates statistic's ``(scores, estimate)``, or None where the
            training has none (no noise, local DP, an unknown server optimizer); the scores
            as ``(observed, unobserved)`` or as their one
            :class:`~audit_callbacks.estimators.CanaryScoreAuditor` (then read, not rebuilt).
        dim: the number of model parameters when the final-model null is the exact law of the
            cosine of a uniform random direction (Gaussian canaries); None: the null is the
            unobserved canaries alone (Hadamard canaries).
        alpha: the bounds hold with confidence 1 - alpha; the bootstrap intervals are 1 - alpha.
        bootstrap: resamples for the estimates' percentile intervals (0: none).
        seed: seed of the bootstrap and of the one-run bounds' subsample.
        index: the logged point this report is (1-based): the valid bounds are at the level
            spent for it (:func:`~audit_callbacks.estimators.valid_bounds.spent_alpha`); None:
            at plain alpha (the summary's).
        gof_level: the goodness-of-fit level below which the GDP bound is rejected.
        methods: the valid bounds' methods: :data:`BOUND_METHODS` (with the f-DP bound) where
            the release is a Gaussian noisy sum; ``valid_bounds.DEFAULT_METHODS`` (valid for
            any mechanism) otherwise.

    Returns:
        ``(estimates, skipped)``: name -> result, and name -> the reason it is missing. No
        value is NaN or infinite.
    """
    estimates: dict[str, AuditResult] = {}
    skipped: dict[str, str] = {}

    def attempt(name: str, call: Callable[[], AuditResult]) -> AuditResult | None:
        try:
            res = call()
        except ValueError as err:  # degenerate scores: say why, never a NaN
            skipped[name] = str(err)
            return None
        if res.status != "ok" and name.startswith("epsilon_gdp"):
            skipped[name] = res.status
            return None
        estimates[name] = res
        return res

    few = "fewer than 2 observed or unobserved canaries (or no round yet)"
    fin = estimate_names("final_model")
    allit = estimate_names("all_iterates")
    final_ok = np.size(final[0]) >= 2 and np.size(final[1]) >= 2
    if not final_ok:
        skipped.update({n: few for n in (*fin.values(), *allit.values())})
        return estimates, skipped
    fa = CanaryScoreAuditor(final[0], final[1], dim=dim)
    cos_ok = max_cosine is not None and np.size(max_cosine[0]) >= 2 and np.size(max_cosine[1]) >= 2
    ca = None
    if cos_ok:
        assert max_cosine is not None
        ca = CanaryScoreAuditor(max_cosine[0], max_cosine[1])
    # the valid bound's statistic is chosen before any data: the matched one where there is
    # one (the most powerful for that adversary), else the max cosine and the final-model
    # cosine with the level split between them
    final_set: Scores | CanaryScoreAuditor = fa if dim is None else final  # no re-sorting
    pool: list[Scores | CanaryScoreAuditor] = [final_set]
    if matched is None:
        gdp_scores = max_cosine if cos_ok else None
        if ca is not None:
            pool.insert(0, ca)
    else:
        pool = [matched[0]]
        gdp_scores = matched[0]
    # both threat models' valid bounds in one computation (each the value it has alone)
    bound_final, bound_all = _valid_bounds([[final_set], pool], delta, alpha, index, seed,
                                             tuple(methods))

    def bound(res: AuditResult | ValueError) -> AuditResult:
        if isinstance(res, ValueError):
            raise res
        return res

    est = dict(delta=delta, bootstrap=bootstrap, confidence=1 - alpha, seed=seed)

    def fitted(fit: str, auditor: CanaryScoreAuditor) -> AuditResult:
        """A two-Gaussian estimate; with a bootstrap interval its ``alpha`` stated as the
        caller's own (the estimator's ``1 - confidence`` is off in the last bit: 0.05 would read
        0.050000000000000044 in the summary)."""
        res = auditor.epsilon_estimate(fit=fit, **est)
        return replace(res, alpha=alpha) if res.alpha is not None else res

    if bootstrap:  # the final-model and max-cosine estimates resample with the same indices
        share_bootstrap([fa] if ca is None else [fa, ca], bootstrap, seed)
    final_est = attempt(fin["estimate"], lambda: fitted("equal", fa))
    attempt(fin["unequal_fit"], lambda: fitted("unequal", fa))
    attempt(fin["lower_bound"], lambda: bound(bound_final))
    gdp_alpha = alpha if index is None else spent_alpha(alpha, index)  # a logged series, too
    attempt(fin["gdp_lower_bound"], lambda: fa.epsilon_gdp_lower_bound(gdp_alpha, delta, gof_level=gof_level))

    if ca is not None:
        attempt(allit["max_cosine"], lambda: fitted("equal", ca))
    else:
        skipped[allit["max_cosine"]] = few
    matched_est = None
    if matched is None:
        skipped[allit["matched"]] = "no statistic matched to the analytic epsilon's adversary here"
    else:
        estimates[allit["matched"]] = matched_est = matched[1]
    # the headline: the larger of the all-iterates adversary's own statistic (the matched one;
    # without one Andrew et al.'s max cosine, whose scores the valid bound reads too) and the
    # final-model one (that adversary can compute the final model); the first where equal
    own = ("matched", matched_est) if matched is not None else (
        "max_cosine", estimates.get(allit["max_cosine"]))
    candidates = dict((own, ("final_model", final_est)))
    options = [(key, r) for key, r in candidates.items() if r is not None]
    if options:
        winner, best = max(options, key=lambda item: item[1].value)
        estimates[allit["estimate"]] = replace(best, details={
            **best.details, "statistic": winner,
            "candidates": {key: None if r is None else r.value for key, r in candidates.items()}})
    else:
        skipped[allit["estimate"]] = skipped.get(fin["estimate"], few)
    attempt(allit["lower_bound"], lambda: bound(bound_all))
    if gdp_scores is not None and min(_sizes(gdp_scores)) >= 2:
        if matched is None and ca is not None:
            ga = ca
        elif isinstance(gdp_scores, CanaryScoreAuditor):
            ga = gdp_scores
        else:
            ga = CanaryScoreAuditor(gdp_scores[0], gdp_scores[1])
        attempt(allit["gdp_lower_bound"], lambda: ga.epsilon_gdp_lower_bound(gdp_alpha, delta, gof_level=gof_level))
    else:
        skipped[allit["gdp_lower_bound"]] = few
    own = matched_est if matched is not None else estimates.get(allit["max_cosine"])
    for name, mine in ((fin["gdp_lower_bound"], final_est), (allit["gdp_lower_bound"], own)):
        reason = gdp_above_estimate(estimates.get(name), mine)
        if reason is not None:
            del estimates[name]
            skipped[name] = reason
    return estimates, skipped


def gdp_above_estimate(bound: AuditResult | None, estimate: AuditResult | None) -> str | None:
    """Why a parametric (GDP) bound is not shown as a bound, or None: it lies above the whole
    interval of its own statistic's estimate (above the estimate itself without an interval).
    A lower bound above every plausible value of what it bounds says that the equal-variance
    Gaussian model it assumes does not describe these scores (its goodness-of-fit test has
    little power against the tails that drive it), not that epsilon is that large."""
    if bound is None or estimate is None:
        return None
    top = estimate.upper if estimate.upper is not None else estimate.value
    if bound.value <= top:
        return None
    where = "interval's upper end" if estimate.upper is not None else "point estimate"
    return (f"not shown as a bound: the parametric bound {bound.value:.4g} lies above its own "
            f"statistic's estimate ({where} {top:.4g}), so the Gaussian model it assumes does "
            "not fit these scores; read the valid bound epsilon_lower_bound_<threat model>")
