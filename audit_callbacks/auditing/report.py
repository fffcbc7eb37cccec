"""A canary audit's report at one point of training, and the summary JSON built from it.

The estimates themselves come from :func:`audit_callbacks.estimators.canary_report.canary_report`
(numpy and scipy only); this module holds what is not numerics: the report's fields, their
TensorBoard tags (:mod:`audit_callbacks.names`, family ``audit``) and the summary's layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audit_callbacks import names
from audit_callbacks.auditing.output import SCHEMA
from audit_callbacks.estimators.canary_report import SOURCE, THREAT_MODELS, estimate_names
from audit_callbacks.estimators.result import AuditResult

__all__ = ["REFERENCE_TITLES", "THREAT_MODEL_TITLES", "VERDICT_CODES", "CanaryReport", "at_delta", "fmt", "mechanism_verdict",
           "summary_estimates", "summary_json", "value_names", "verdict"]

#: The watched series' name of each valid bound: a report at a logged point (``index`` set, its
#: bounds at the level spent for that point) logs its bounds under these, the fit-end report
#: (plain alpha, the summary's) under the plain names, so that a name has one number.
_WATCHED = {names.EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED: names.EPSILON_LOWER_BOUND_FINAL_MODEL,
            names.EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED: names.EPSILON_LOWER_BOUND_ALL_ITERATES,
            names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED: names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL,
            names.EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED: names.EPSILON_GDP_LOWER_BOUND_ALL_ITERATES}

#: Start of an estimate's status when fewer than the auditor's ``MIN_CANARIES`` canaries took
#: part: its interval says too little to judge the claim by (the valid bounds still judge it).
TOO_FEW_CANARIES = "too few canaries"

#: The report's fields that are logged beside the estimates (names of family ``audit``).
_FIELDS = (names.EPSILON_ANALYTIC, names.EPSILON_ANALYTIC_RDP, names.EPSILON_ANALYTIC_PRV,
           names.EPSILON_LAST_ITERATE_HEURISTIC, names.NUM_CANARIES_PARTICIPATED)

#: The names :meth:`CanaryReport.value` reads, by kind.
_ESTIMATE_NAMES = tuple(n for tm in THREAT_MODELS for n in estimate_names(tm).values())
_RATIO_NAMES = (names.EPSILON_RATIO_FINAL_MODEL, names.EPSILON_RATIO_ALL_ITERATES)
_CHECK_NAMES = (names.NOISE_SCALE_RATIO, names.FRESH_NOISE_RATIO, names.BATCH_SIZE_VARIANCE_RATIO)
_VERDICT_NAMES = (names.VERDICT_FINAL_MODEL, names.VERDICT_ALL_ITERATES, names.VERDICT_MECHANISM)


def value_names() -> list[str]:
    """Every name :meth:`CanaryReport.value` accepts, in the name table's order."""
    known = set(_ESTIMATE_NAMES) | set(_FIELDS) | set(_RATIO_NAMES) | set(_CHECK_NAMES) | set(_WATCHED)
    return [q.name for q in names.family(names.FAMILY_AUDIT) if q.name in known]


#: Each threat model's headline estimate and the reference it is compared with.
REFERENCES = {"final_model": (names.EPSILON_FINAL_MODEL, names.EPSILON_LAST_ITERATE_HEURISTIC),
              "all_iterates": (names.EPSILON_ALL_ITERATES, names.EPSILON_ANALYTIC)}
#: A threat model's and a reference's words in every view (the report, TensorBoard's table).
THREAT_MODEL_TITLES = {"final_model": "final model", "all_iterates": "all iterates"}
REFERENCE_TITLES = {names.EPSILON_LAST_ITERATE_HEURISTIC: "last-iterate heuristic (not a bound)",
                    names.EPSILON_ANALYTIC: "claim (analytic epsilon)"}

#: A verdict's scalar code in TensorBoard (``audit/verdict_<tm>``); ``unchecked`` is not logged.
VERDICT_CODES = {"consistent": 0, "suspicious": 1, "unproven": 1, "violation": 2}


def fmt(value: Any) -> str:
    """A number as reports show it (4 significant digits; ``-`` for None)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _number(value: Any) -> float | None:
    """A finite number, else None (a non-finite one is None in the summary JSON too)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def verdict(summary: Mapping[str, Any], threat_model: str) -> tuple[str, str]:
    """``(word, sentence)``: the verdict of ``threat_model`` (``final_model`` or
    ``all_iterates``) on a summary (:func:`summary_json`'s content; a report's own verdicts are
    :meth:`CanaryReport.verdicts`, the same :func:`judge` on its fields).

    The claim is the analytic epsilon (``epsilon_analytic``), for both threat models (the
    final-model adversary is weaker, so a claim for all iterates also covers the final model):

    * ``violation``: the valid (1 - alpha) lower bound ``epsilon_lower_bound_<tm>`` exceeds the
      claim. Its false-alarm rate on a correct run is at most alpha (the bound is valid), over
      the whole logged series (alpha is spent over the logged points).
    * ``suspicious`` (all iterates only): the estimate's (1 - alpha) interval lies above the
      claim (its lower end exceeds it). An estimate, not a bound: its false-alarm rate is that
      of the interval's lower end (about alpha / 2 where the fit holds), not guaranteed.
    * ``consistent``: neither.
    * ``unchecked``: no finite claim (no DP noise, or unknown), or no estimate.

    ``docs/methods/verdicts.md`` says what each kind of implementation bug does to these.
    """
    estimate_name, reference_name = REFERENCES[threat_model]
    estimates = summary.get("estimates") or {}
    estimate = estimates.get(estimate_name) or {}
    return judge(
        threat_model, claim=summary.get(names.EPSILON_ANALYTIC),
        claim_status=summary.get("epsilon_analytic_status", "unknown"),
        bound=(estimates.get(f"epsilon_lower_bound_{threat_model}") or {}).get("value"),
        estimate=estimate.get("value"), lower=estimate.get("lower"), upper=estimate.get("upper"),
        confidence=(estimate.get("details") or {}).get("confidence"),
        estimate_status=estimate.get("status", "not computed"),
        reference=summary.get(reference_name), ratio=summary.get(f"epsilon_ratio_{threat_model}"),
        alpha=(summary.get("inputs") or {}).get("alpha"),
        delta=(summary.get("inputs") or {}).get("delta"),
        mechanism=(summary[names.VERDICT_MECHANISM], summary[f"{names.VERDICT_MECHANISM}_sentence"])
        if names.VERDICT_MECHANISM in summary else None)


def judge(threat_model: str, *, claim: Any, claim_status: str, bound: Any, estimate: Any, lower: Any,
          upper: Any, confidence: Any, estimate_status: str, reference: Any, ratio: Any,
          alpha: Any, mechanism: tuple[str, str] | None = None,
          delta: Any = None) -> tuple[str, str]:
    """:func:`verdict` on its numbers: the claimed epsilon (and its status when it is not
    finite), the valid lower bound, the headline estimate with its interval, confidence and
    status, the reference, the ratio, the audit's alpha and the delta of every epsilon (each
    sentence says it: ``at delta = 1e-05``; omitted when None). A ``mechanism`` verdict
    (:func:`mechanism_verdict`) of ``violation`` is every threat model's verdict (the claim
    assumes the mechanism the checks found broken); one of ``unproven`` replaces
    ``consistent``."""
    word, sentence = _judge(threat_model, claim=claim, claim_status=claim_status, bound=bound,
                            estimate=estimate, lower=lower, upper=upper, confidence=confidence,
                            estimate_status=estimate_status, reference=reference, ratio=ratio,
                            alpha=alpha, delta=delta)
    if mechanism is not None:
        if mechanism[0] == "violation" and word != "violation":
            return mechanism
        if mechanism[0] == "unproven" and word == "consistent":
            return mechanism[0], f"{mechanism[1]}; the canaries: {sentence}"
    return word, sentence


#: How to give an Opacus DP-SGD run the Poisson sampling its accountant assumes, for each front
#: end: Lightning trains on the loader ``train_dataloader`` returns, not on the one
#: ``make_private`` returns, so ``poisson_sampling=True`` changes nothing there.
_POISSON_FIX = ("Fix: in a plain loop (OpacusCanaryAudit), train on the loader that "
               "make_private(..., poisson_sampling=True) returns; under Lightning (CanaryAudit), "
               "return DPDataLoader.from_data_loader(loader) from train_dataloader (Lightning "
               "trains on that loader, not on the one make_private returns)")

#: What each of the sampler check's tests (``details["rejected_by"]``) found when it rejected.
_SAMPLER_TESTS = ("total", "dispersion", "repeats")


def _sampler_evidence(result: Any, d: Mapping[str, Any]) -> str:
    """The tests of the sampler check that rejected, each with its numbers and p-value (before
    Bonferroni's factor 3): ``the repeats test: size 64 in 46 of 48 steps, ... (p = 1.031e-56)``.
    ``d`` is the result's details; the tests are ``d["rejected_by"]``, else (a summary written
    without it) those at or below ``alpha / 3``."""
    tests = d.get("rejected_by")
    if tests is None:
        alpha = _number(result.get("alpha") if isinstance(result, Mapping) else
                        getattr(result, "alpha", None)) or 0.05
        tests = [t for t in _SAMPLER_TESTS
                 if (p := _number(d.get(f"p_value_{t}"))) is not None and p <= alpha / 3]
    counts = (result.get("counts") if isinstance(result, Mapping) else getattr(result, "counts", None)) or {}
    steps = counts.get("batches")
    mean, expected_mean = fmt(_number(d.get("mean"))), fmt(_number(d.get("expected_mean")))
    variance, expected_variance = fmt(_number(d.get("variance"))), fmt(_number(d.get("expected_variance")))
    said = {
        "total": f"the total test: mean size {mean} a step against Binomial(N, q)'s {expected_mean}",
        "dispersion": f"the dispersion test: variance {variance} against Binomial(N, q)'s {expected_variance}",
        "repeats": (f"the repeats test: size {d.get('most_repeated_size')} in {d.get('repeats')} of "
                    f"{steps if steps is not None else '-'} steps, more often than any Binomial(N, q) "
                    "size recurs"),
    }
    parts = [f"{said[t]} (p = {fmt(_number(d.get(f'p_value_{t}')))})" for t in tests if t in said]
    if not parts:
        return "the sampler check"
    return parts[0] if len(parts) == 1 else ", by ".join(parts[:-1]) + " and by " + parts[-1]


def mechanism_verdict(checks: Mapping[str, Any], noise_source: str | None = None, *,
                      progress: int | None = None) -> tuple[str, str]:
    """``(word, sentence)`` of the checks of the mechanism (``docs/methods/mechanism_checks.md``).

    * ``violation``: the noise-scale or fresh-noise check failed on some parameter tensor (the
      noise is missing, short of the claim, or the same in consecutive releases); each check's
      false-alarm rate is at most its level, whatever the gradients do.
    * ``unproven``: the batch sizes are not those of the Poisson sampling the accountant assumes
      (the claim's amplification by sampling is not shown to hold); the sentence names the
      sampler check's tests that rejected (``details["rejected_by"]``), each with what it read,
      and the fix of each front end (the report does not know which one ran).
    * ``consistent``: every check passed. ``unchecked``: no check could run.

    ``checks`` maps a check's name to its result (an ``AuditResult`` or its summary dict).
    A noise replayable from a public seed (``noise_source``) is said in the sentence, not in the
    word: one run's releases cannot show it.
    """
    def details(res: Any) -> dict[str, Any]:
        return (res.get("details") if isinstance(res, Mapping) else getattr(res, "details", None)) or {}

    def value(res: Any) -> Any:
        return res.get("value") if isinstance(res, Mapping) else getattr(res, "value", None)

    over = f" over {progress} releases" if progress else ""
    fresh, scale = checks.get(names.FRESH_NOISE_RATIO), checks.get(names.NOISE_SCALE_RATIO)
    fresh_failed = fresh is not None and details(fresh).get("rejected")
    if scale is not None and details(scale).get("rejected"):
        d = details(scale)
        also = ""
        if fresh_failed:
            also = (f"; consecutive releases differ by less than fresh noise would (fresh-noise ratio "
                    f"{fmt(_number(value(fresh)))} on {details(fresh).get('group')}): it repeats or "
                    "is missing")
        return "violation", (f"violation: the noise on {d.get('group')} is missing or short of the "
                             f"claim (noise-scale ratio {fmt(_number(value(scale)))} of the claimed "
                             f"variance{over}, p = {fmt(_number(d.get('p_value')))}){also}")
    if fresh_failed:
        d = details(fresh)
        return "violation", (f"violation: the noise on {d.get('group')} repeats across releases "
                             f"(fresh-noise ratio {fmt(_number(value(fresh)))}, below the bound 1 of "
                             f"fresh noise{over}, p = {fmt(_number(d.get('p_value')))}), or is "
                             "missing where the gradients fill its energy")
    sampler = checks.get(names.BATCH_SIZE_VARIANCE_RATIO)
    if sampler is not None and details(sampler).get("rejected"):
        d = details(sampler)
        how = d.get("sampling", "variable")
        drawn = (f"the loader draws {how}" if how != "variable" else
                 "the batch sizes are not Binomial(N, q)'s")
        return "unproven", (f"unproven: the accountant assumes Poisson sampling, but {drawn}; "
                            f"rejected by {_sampler_evidence(sampler, d)}; the claimed epsilon "
                            f"does not hold for this loader. {_POISSON_FIX}")
    if not checks:
        return "unchecked", "unchecked: no check of the mechanism could run"
    passed = ", ".join(sorted(checks))
    note = f"; but {noise_source}" if noise_source else ""
    return "consistent", f"consistent: the checks of the mechanism passed ({passed}){note}"


def at_delta(delta: Any) -> str:
    """`` at delta = 1e-05``: the delta every epsilon of a sentence is at (empty when None)."""
    value = _number(delta)
    return "" if value is None else f" at delta = {fmt(value)}"


def _judge(threat_model: str, *, claim: Any, claim_status: str, bound: Any, estimate: Any, lower: Any,
           upper: Any, confidence: Any, estimate_status: str, reference: Any, ratio: Any,
           alpha: Any, delta: Any = None) -> tuple[str, str]:
    at = at_delta(delta)
    claim = _number(claim)
    if claim is None:
        return "unchecked", (f"unchecked: no finite claimed epsilon{at} (analytic epsilon: "
                             f"{claim_status})")
    reference_name = REFERENCES[threat_model][1]
    bound = _number(bound)
    alpha = _number(alpha)
    if bound is not None and bound > claim:
        level = f"{100 * (1 - alpha):g}%" if alpha is not None else "95%"
        return "violation", (f"violation: the valid {level} lower bound {fmt(bound)} "
                             f"exceeds the claimed epsilon {fmt(claim)}{at}")
    low = _number(lower)
    few = str(estimate_status).startswith(TOO_FEW_CANARIES)  # a bootstrap of a handful of scores
    if threat_model == "all_iterates" and low is not None and low > claim and not few:
        level = _number(confidence) or 0.95
        return "suspicious", (f"suspicious: the estimate's {100 * level:g}% interval lies above the claimed "
                              f"epsilon (interval [{fmt(low)}, {fmt(upper)}], "
                              f"claimed {fmt(claim)}{at})")
    if bound is None and _number(estimate) is None:
        return "unchecked", (f"unchecked: no estimate ({estimate_status}) to compare with the "
                             f"claimed epsilon {fmt(claim)}{at}")
    sentence = (f"consistent: the valid lower bound {fmt(bound)} and the estimate "
                f"{fmt(estimate)} do not contradict the claimed epsilon {fmt(claim)}{at}")
    if reference_name != names.EPSILON_ANALYTIC:
        sentence += (f"; last-iterate heuristic {fmt(_number(reference))}, estimate / heuristic "
                     f"{fmt(_number(ratio))}")
    if few:
        sentence += f"; the estimate's interval is not judged: {estimate_status}"
    return "consistent", sentence


@dataclass(frozen=True)
class CanaryReport:
    """One canary audit's numbers at one point of training.

    Attributes:
        estimates: name -> result (names of :func:`~audit_callbacks.estimators.canary_report.
            estimate_names`: ``epsilon_<tm>``, ``epsilon_<tm>_unequal_fit``,
            ``epsilon_lower_bound_<tm>``, ``epsilon_gdp_lower_bound_<tm>``).
        skipped: name -> why that estimate is missing (too few canaries, degenerate scores).
        epsilon_analytic: the analytic epsilon of a canary at ``delta`` (``inf`` without DP
            noise, None when unknown); ``epsilon_analytic_rdp``, ``epsilon_analytic_prv``:
            Opacus' RDP and PRV accountants on the same history (DP-SGD only).
        epsilon_last_iterate_heuristic: the final-model reference: the epsilon of the last
            iterate alone (Steinke et al., "The Last Iterate Advantage", ICLR 2025), a
            heuristic, not a bound; None when unknown.
        max_participations: the most rounds (steps) any canary took part in.
        num_canaries_participated: observed canaries that took part at least once.
        statistics: the cosines: ``final_observed`` / ``all_observed`` ``[participated]``,
            ``final_unobserved`` / ``all_unobserved`` ``[k']`` (float64).
        progress: rounds (DP-FedAvg, Flower) or logical steps (DP-SGD) when it was computed.
        step: the training's step when it was computed (Lightning's global step, Flower's
            round).
        index: the logged point it is (its valid bounds at the level spent for that point),
            or None (plain alpha: the summary's).
        alpha: the audit's 1 - confidence (the run-level level of the verdicts' bounds).
        checks: the checks of the mechanism, by name (``noise_scale_ratio``,
            ``fresh_noise_ratio``, ``batch_size_variance_ratio``): each an
            :class:`~audit_callbacks.estimators.AuditResult` whose ``details["rejected"]`` says
            whether it failed, at the level spent for ``index`` (``docs/methods/mechanism_checks.md``).
        noise_source: why the noise is replayable from a public seed, or None.
        delta: the delta of every epsilon in the report (the analytic ones and the estimates),
            which every verdict sentence states; None in a report built without one.

    Read a number by its name with :meth:`value` (any quantity of family ``audit`` but the
    verdicts, which are words: :meth:`verdicts`); an unknown name raises ``KeyError`` listing
    the names. :meth:`status` says why a value is None.
    """

    estimates: dict[str, AuditResult]
    skipped: dict[str, str]
    epsilon_analytic: float | None = None
    epsilon_analytic_rdp: float | None = None
    epsilon_analytic_prv: float | None = None
    epsilon_last_iterate_heuristic: float | None = None
    max_participations: int = 0
    num_canaries_participated: int = 0
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    progress: int = 0
    step: int = 0
    index: int | None = None
    alpha: float = 0.05
    checks: dict[str, AuditResult] = field(default_factory=dict)
    noise_source: str | None = None
    delta: float | None = None

    def value(self, name: str) -> float | None:
        """The number called ``name``: an estimate (``epsilon_all_iterates``...; None when it
        was skipped: :meth:`status` says why), an analytic epsilon or another field
        (``epsilon_analytic``, ``num_canaries_participated``...), a ratio
        (``epsilon_ratio_<tm>``) or a check of the mechanism (``noise_scale_ratio``...; None
        when it did not run). The names are :mod:`audit_callbacks.names`' of family ``audit``,
        as in every other view: at a logged point (``index`` set) the valid and parametric
        bounds, at the alpha spent for that point, are under ``..._watched`` and the plain
        names are None; the fit-end report's bounds (plain alpha) are under the plain names.

        Raises:
            KeyError: ``name`` is none of these (a misspelling, or a verdict: read those with
                :meth:`verdicts` and :meth:`mechanism_verdict`); the message lists the names.
        """
        if name in _WATCHED:  # a logged point's bound (at the alpha spent for it)
            bound = self.estimates.get(_WATCHED[name]) if self.index is not None else None
            return None if bound is None else bound.value
        if name in _WATCHED.values() and self.index is not None:
            return None  # the plain name is the fit-end bound's, at plain alpha
        if name in self.estimates:
            return self.estimates[name].value
        if name in _ESTIMATE_NAMES:
            return None  # skipped or not computed (the reason: status(name))
        if name in _FIELDS:
            return getattr(self, name)
        if name in _RATIO_NAMES:
            return self.ratios()[name]
        if name in _CHECK_NAMES:
            check = self.checks.get(name)
            return None if check is None else check.value
        hint = (" (a verdict is a word: read report.verdicts() or report.mechanism_verdict())"
                if name in _VERDICT_NAMES else "")
        raise KeyError(f"CanaryReport.value: no quantity {name!r}{hint}; the names are "
                       f"{', '.join(value_names())}")

    def status(self, name: str) -> str:
        """Why :meth:`value` of ``name`` is what it is: an estimate's own status (``ok``,
        ``too few canaries (k = 10)``, ``flagged: ...``) or ``skipped: <reason>``; ``ok`` or
        ``unknown`` for the other names. Raises ``KeyError`` as :meth:`value` does."""
        value = self.value(name)
        if name in _WATCHED and self.index is not None:
            bound = _WATCHED[name]
            return (self.estimates[bound].status if bound in self.estimates
                    else f"skipped: {self.skipped.get(bound, 'not computed')}")
        if name in _WATCHED or (name in _WATCHED.values() and self.index is not None):
            return ("not at this point: a logged point's bound is under the name with _watched, "
                    "the fit-end bound (plain alpha) under the plain name")
        if name in self.estimates:
            return self.estimates[name].status
        if name in _ESTIMATE_NAMES:
            return f"skipped: {self.skipped.get(name, 'not computed')}"
        return "unknown" if value is None else "ok"

    def scalars(self) -> dict[str, float | None]:
        """``{tag: value}`` of every quantity of family ``audit`` (None where skipped or
        unknown); the tags are :mod:`audit_callbacks.names`'."""
        out: dict[str, float | None] = {}
        ratios = self.ratios()
        codes = {f"verdict_{tm}": VERDICT_CODES.get(word) for tm, (word, _) in self.verdicts().items()}
        codes[names.VERDICT_MECHANISM] = VERDICT_CODES.get(self.mechanism_verdict()[0])
        for q in names.family(names.FAMILY_AUDIT):
            if q.name in codes:
                value = codes[q.name]
            elif q.name in self.checks:
                value = self.checks[q.name].value
            elif q.name in _FIELDS:
                value = getattr(self, q.name)
            elif q.name in ratios:
                value = ratios[q.name]
            else:  # a logged point's bounds (spent alpha) under the _watched names
                value = self.value(q.name)
            out[q.tag] = None if value is None else float(value)
        return out

    def verdicts(self) -> dict[str, tuple[str, str]]:
        """``{threat_model: (word, sentence)}``: :func:`verdict` of each threat model on this
        report (at an intermediate point, its valid bounds are those spent for that point, so
        a ``violation`` anywhere in the logged series holds at the run's 1 - alpha)."""
        ratios = self.ratios()
        status = ("infinite: no DP noise (noise_multiplier = 0)" if self.epsilon_analytic == math.inf
                  else "unknown")
        mechanism = self.mechanism_verdict()
        out: dict[str, tuple[str, str]] = {}
        for tm, (estimate_name, reference_name) in REFERENCES.items():
            est = self.estimates.get(estimate_name)
            bound = self.estimates.get(f"epsilon_lower_bound_{tm}")
            out[tm] = judge(
                tm, claim=self.epsilon_analytic, claim_status=status,
                bound=None if bound is None else bound.value,
                estimate=None if est is None else est.value,
                lower=None if est is None else est.lower, upper=None if est is None else est.upper,
                confidence=None if est is None else est.details.get("confidence"),
                estimate_status=est.status if est is not None else
                f"skipped: {self.skipped.get(estimate_name, 'not computed')}",
                reference=getattr(self, reference_name), ratio=ratios[f"epsilon_ratio_{tm}"],
                alpha=self.alpha, mechanism=mechanism, delta=self.delta)
        return out

    def mechanism_verdict(self) -> tuple[str, str]:
        """``(word, sentence)`` of the checks of the mechanism (:func:`mechanism_verdict`)."""
        return mechanism_verdict(self.checks, self.noise_source, progress=self.progress)

    def ratios(self) -> dict[str, float | None]:
        """``epsilon_ratio_<tm>``: each threat model's headline estimate over its reference
        (None where either is missing, the reference is 0 or infinite)."""
        out: dict[str, float | None] = {}
        for tm, (estimate, reference) in REFERENCES.items():
            est, ref = self.value(estimate), getattr(self, reference)
            ok = est is not None and ref is not None and 0 < ref < math.inf
            out[f"epsilon_ratio_{tm}"] = est / ref if ok else None
        return out


def summary_json(
    report: CanaryReport | None, *, stale: bool, skip_reason: str | None, inputs: dict[str, Any],
    gradients: bool, callback: str, status: str = "complete",
) -> dict[str, Any]:
    """The canary audit's ``audit_summary.json`` content in the one summary schema
    (:mod:`audit_callbacks.auditing.output`): the inputs, every estimate with its ``status``
    (:func:`summary_estimates`; under ``results``, and ``estimates`` as before), the analytic epsilon with its status, the tag of
    every name, each threat model's verdict (``verdict_<tm>``: the word, ``verdict_<tm>_sentence``)
    and the run's ``run_status`` (``complete``, or ``interrupted at step N``). ``report`` is the
    end's, or with ``stale`` the last earlier one."""
    sign = "theta_0 - theta_T" if gradients else "theta_T - theta_0"
    estimates = summary_estimates(report, report.step if stale and report else None, skip_reason)
    if report is None:
        overall = f"skipped: {skip_reason or 'no estimate'}"
    else:
        overall = f"stale: from step {report.step}" if stale else "ok"
    summary: dict[str, Any] = {
        "schema": SCHEMA, "audit": callback, "callback": callback, "run_status": status,
        "status": overall,
        "source": SOURCE,
        "threat_models": {
            "final_model": f"the adversary sees only the final model; statistic cos(c_j, {sign}); "
                           "reference: the last-iterate heuristic (Steinke et al., ICLR 2025), "
                           "a heuristic, not a bound",
            "all_iterates": "the adversary sees every round's (step's) release; statistic: the "
                            "one matched to the analytic epsilon's adversary (known rounds for "
                            "DP-FedAvg and Flower, steps unknown for DP-SGD; without one, Andrew "
                            "et al.'s max cosine over rounds), or the final-model one where "
                            "larger (results.epsilon_all_iterates.details.statistic names it); "
                            "reference: the analytic epsilon",
        },
        "inputs": inputs,
        "tags": {q.name: q.tag for q in names.family(names.FAMILY_AUDIT)},
        "results": dict(estimates),  # the estimates and (below) the checks of the mechanism
        "estimates": estimates,
    }
    if report is not None:
        eps = report.epsilon_analytic
        summary.update(
            epsilon_analytic=eps, epsilon_analytic_rdp=report.epsilon_analytic_rdp,
            epsilon_analytic_prv=report.epsilon_analytic_prv,
            epsilon_last_iterate_heuristic=report.epsilon_last_iterate_heuristic,
            **report.ratios(),
            epsilon_analytic_status="infinite: no DP noise (noise_multiplier = 0)"
            if eps == math.inf else ("ok" if eps is not None else "unknown"),
            max_participations=report.max_participations,
            num_canaries_participated=report.num_canaries_participated,
        )
    if report is not None:
        for name, res in report.checks.items():
            summary["results"][name] = {**res.to_dict(), "status": f"stale: from step {report.step}" if stale
                               else res.status}
        word, sentence = report.mechanism_verdict()
        summary[names.VERDICT_MECHANISM], summary[f"{names.VERDICT_MECHANISM}_sentence"] = word, sentence
    for tm in REFERENCES:  # the claim each threat model is checked against (verdict)
        word, sentence = verdict(summary, tm)
        summary[f"verdict_{tm}"], summary[f"verdict_{tm}_sentence"] = word, sentence
    return summary


def summary_estimates(
    report: CanaryReport | None, stale_from: int | None = None, reason: str | None = None,
) -> dict[str, Any]:
    """The summary JSON's ``estimates``: every name with its ``status`` (``ok``, the result's
    own status such as ``too few canaries (k = 10)``, ``skipped: <reason>``, or ``stale: from
    step N`` when ``report`` is an earlier one)."""
    all_names = [n for tm in THREAT_MODELS for n in estimate_names(tm).values()]
    if report is None:
        return {n: {"status": f"skipped: {reason or 'no estimate'}"} for n in all_names}
    out: dict[str, Any] = {}
    for n in all_names:
        if n in report.estimates:
            est = report.estimates[n]
            status = f"stale: from step {stale_from}" if stale_from is not None else est.status
            out[n] = {**est.to_dict(), "status": status}
        else:
            out[n] = {"status": f"skipped: {report.skipped.get(n, reason or 'not computed')}"}
    return out
