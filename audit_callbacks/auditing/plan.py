"""The audit plan of a run: its settings read from the auditor's backend, handed to
:func:`~audit_callbacks.estimators.planner.plan_audit`, and the plan's summary entries.

Every front end plans at fit start where the run's length is known (Lightning: the steps of
earlier fits plus the trainer's ``estimated_stepping_batches``; Flower: ``num_rounds``; the
plain Opacus loop: a ``steps`` given by the user, else at the first :meth:`write`, from the
steps taken so far), again at a later fit whose length differs, logs the plan's one line
(:meth:`AuditPlan.summary`) as information, not a warning, and the auditor keeps it for the
summary (``plan_*`` keys, :func:`summary_plan_entries`) and the report, which reads the measured
ratio against it (:meth:`AuditPlan.read_ratio`): against a plan made again at the steps taken
and the run's claim where they differ from the plan's (:func:`plan_read`; a run stopped early).

What is read (the numbers that matter to the statistic's law, ``docs/methods/planner.md``):

* k, k', d, the canary kind, delta and alpha: the auditor's;
* DP-SGD (a :class:`~audit_callbacks.canary.base.NoisySum` release): the noise multiplier, the
  canaries' rate q (the statistic's law: what the canaries see), and the claim, computed as the
  run's own (:func:`planned_claim`: the accountant's history carried to T steps at the
  accountant's rate, through ``run_claim``); the expected real batch q N;
* DP-FedAvg (:class:`~audit_callbacks.canary.base.NoisyAverageDelta`, a module with
  ``clients_per_round``, or the Flower backend's ``inputs``): z, q = m / (N + k) (``repeats``:
  a fixed schedule of ``repeats`` rounds a canary), participation ``fixed`` for a shuffled
  schedule; the claim is the planner's (the Gaussian mechanism over the most-sampled canary's
  rounds);
* the range read is the 95% one (:data:`PLAN_COVERAGE`): at 90% a correct run falls outside
  one time in ten by design, and the law leaves out the real gradients' feedback on the
  canary directions (``docs/methods/planner.md``, §3).

The bug search (the slow part) runs only where it is cheap (k + k' at most
:data:`BUG_SEARCH_MAX_CANARIES`); otherwise the plan's line says how to get it.
"""

from __future__ import annotations

import math
from typing import Any

from audit_callbacks import names
from audit_callbacks.auditing.report import TOO_FEW_CANARIES
from audit_callbacks.canary.base import NoisyAverageDelta, NoisySum
from audit_callbacks.estimators.planner import AuditPlan, plan_audit

__all__ = ["BUG_SEARCH_MAX_CANARIES", "EPSILON_SCALE", "EPSILON_SCALE_SOURCE", "epsilon_tier", "PLAN_COVERAGE", "announce_plan", "plan_entries", "plan_for",
           "plan_line", "plan_read", "plan_settings", "planned_claim", "summary_plan_entries"]

#: The coverage of the ratio range a run is read against.
PLAN_COVERAGE = 0.95
#: The bug search runs at fit start only up to this many canaries, k + k' (about 2 s on one core at
#: k = k' = 200, 4.5 s at k = k' = 1,000, 30 s at k' = 100,000); beyond, the plan's line says how
#: to run it before training.
BUG_SEARCH_MAX_CANARIES = 400
_UNKNOWN_LENGTH = "the run's length is unknown"

#: The scale epsilon is read on: Ponomareva, Hazimeh, Kurakin, Xu, Denison, McMahan,
#: Vassilvitskii, Chien, Thakurta, "How to DP-fy ML: A Practical Guide to Machine Learning with
#: Differential Privacy", JAIR 77 (2023), its tiers of epsilon (the upper end of each tier, and
#: its words).
EPSILON_SCALE = ((1.0, "strong formal privacy guarantee (epsilon <= 1)"),
                 (10.0, "reasonable formal privacy guarantee (epsilon <= 10)"),
                 (math.inf, "weak to no formal privacy guarantee (epsilon > 10)"))
EPSILON_SCALE_SOURCE = ("Ponomareva et al., \"How to DP-fy ML: A Practical Guide to Machine Learning "
                        "with Differential Privacy\", JAIR 77 (2023): tiers at epsilon 1 and 10")


def epsilon_tier(epsilon: Any) -> str | None:
    """Where ``epsilon`` lies on :data:`EPSILON_SCALE` (None: not a number >= 0)."""
    if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool):
        return None
    eps = float(epsilon)
    if eps < 0 or math.isnan(eps):
        return None
    return next(words for top, words in EPSILON_SCALE if eps <= top)


def plan_settings(auditor: Any, steps: float | None) -> tuple[dict[str, Any] | None, str]:
    """``plan_audit``'s keyword arguments for this run, or ``(None, reason)``.

    Args:
        auditor: the :class:`~audit_callbacks.auditing.CanaryAuditor`.
        steps: T, the planned DP-SGD steps or DP-FedAvg rounds (None, inf or < 1: unknown).
    """
    if steps is None or not math.isfinite(steps) or steps < 1:
        return None, _UNKNOWN_LENGTH
    backend = auditor.backend
    model = backend.release_model(auditor.config.canaries)
    k, ku = int(auditor.num_canaries), int(auditor.num_unobserved)
    if k < 2 or ku < 2:
        return None, "fewer than 2 observed or unobserved canaries"
    base: dict[str, Any] = {
        "num_canaries": k, "num_unobserved": ku, "dim": int(auditor.stats.dim),
        "steps": int(steps), "delta": float(auditor.delta), "alpha": float(auditor.config.alpha),
        "canaries": auditor.config.canaries, "coverage": PLAN_COVERAGE, "seed": int(auditor.config.seed),
    }
    if isinstance(model, NoisySum):
        return _dpsgd(backend, model, base)
    if isinstance(model, NoisyAverageDelta):
        return _fedavg(backend, model, base, k)
    return None, getattr(model, "reason", "no statistic matched to the claim")


def _dpsgd(backend: Any, model: NoisySum, base: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """DP-SGD's settings: the statistic's law at the canaries' rate (what the canaries see: the
    injector's ``sample_rate``, the one the user gave where given, times the batches a step
    accumulates), the claim at the
    accountant's (what the run claims: its accountant's history, carried to T steps at the
    rate its step hook reports), computed by the run's own claim function."""
    injector = getattr(backend, "injector", None)
    rate = getattr(injector, "sample_rate", None)
    rate = None if rate is None else min(1.0, float(rate) * _batches_per_step(backend))
    sigma = float(model.noise_multiplier)
    if rate is None or sigma <= 0:
        return None, "no sampling rate or no noise"
    claim = planned_claim(backend, sigma, int(base["steps"]), base["delta"])
    if claim is None or not math.isfinite(claim) or claim <= 0:
        return None, "the accountant gives no epsilon for these settings"
    population = getattr(backend, "population", None) or 0
    return {**base, "training": "dpsgd", "sample_rate": float(rate), "noise_multiplier": sigma,
            "reference_epsilon": float(claim), "real_per_step": float(rate) * population}, ""


def planned_claim(backend: Any, noise_multiplier: float, steps: int, delta: float) -> float | None:
    """The claim of a DP-SGD run of ``steps`` logical steps, computed as the run's own
    (:func:`~audit_callbacks.backends.opacus.accounting.run_claim`, the function behind
    ``OpacusBackend.analytic``): the accountant's history so far, followed by the steps left
    at (``noise_multiplier``, the accountant's rate); at the steps taken it is the run's claim.
    The accountant's rate is its step hook's times the batches a step accumulates (as Opacus'
    hook charges ``sample_rate * accumulated_iterations``); without one (or without a rate), the canaries'
    rate, as the run's claim falls back to. None: no epsilon."""
    from audit_callbacks.backends.opacus.accounting import run_claim
    from audit_callbacks.backends.opacus.optimizer import find_accountant

    injector = getattr(backend, "injector", None)
    accountant = getattr(backend, "accountant", None)
    rate = None
    optimizer = getattr(injector, "optimizer", None)
    if accountant is not None and optimizer is not None:
        found, rate = find_accountant(optimizer)
        rate = rate if found is accountant else None
    rate = getattr(injector, "sample_rate", None) if rate is None else rate
    if rate is not None:  # Opacus charges a step q * accumulated_iterations
        rate = min(1.0, float(rate) * _batches_per_step(backend))
    history = [tuple(h) for h in (getattr(accountant, "history", None) or [])]
    left = int(steps) - sum(int(h[2]) for h in history)
    if left > 0 and rate is not None:
        history.append((float(noise_multiplier), float(rate), left))
    if not history:
        return None
    return run_claim(accountant, history, delta)[1]


def _batches_per_step(backend: Any) -> float:
    """The physical batches of one logical step (gradient accumulation): their mean over the
    steps taken (Opacus' ``accumulated_iterations``, counted by the injector; an epoch's last
    step may take fewer) once a step was taken, else what the front end knows before the first
    step (Lightning's ``accumulate_grad_batches``), else 1. Both the canaries' rate and the
    accountant's charge are the per-batch rate times it."""
    injector = getattr(backend, "injector", None)
    steps = int(getattr(injector, "steps", 0) or 0)
    if steps > 0 and getattr(injector, "batches_total", 0):
        return max(1.0, float(injector.batches_total) / steps)
    return float(max(1, int(getattr(backend, "batches_per_step", 1) or 1)))


def _fedavg(backend: Any, model: NoisyAverageDelta, base: dict[str, Any], k: int
            ) -> tuple[dict[str, Any] | None, str]:
    if base["canaries"] != "hadamard":
        return None, "the known-rounds statistic needs Hadamard canaries"
    module = getattr(backend, "module", None)
    inputs = getattr(backend, "inputs", None) or {}
    m = getattr(module, "clients_per_round", None) or inputs.get("clients_per_round")
    real = getattr(module, "num_real_clients", None) or getattr(backend, "population", None)
    if not m or not real:
        return None, "the cohort size or the number of real clients is unknown"
    steps = int(base["steps"])
    repeats = getattr(backend, "repeats", None)
    if repeats:
        rate, participation = min(1.0, int(repeats) / steps), "fixed"
    else:
        rate = inputs.get("sample_rate") or min(1.0, float(m) / (float(real) + k))
        participation = "fixed" if getattr(module, "sampling", None) == "shuffle" else "poisson"
    return {**base, "training": "dpfedavg", "sample_rate": float(rate),
            "noise_multiplier": float(model.noise_multiplier), "participation": participation,
            "real_per_step": float(m) * float(real) / (float(real) + k)}, ""


def plan_for(auditor: Any, steps: float | None) -> tuple[AuditPlan | None, str]:
    """The run's plan (the bug search only where k + k' <= :data:`BUG_SEARCH_MAX_CANARIES`), or
    ``(None, reason)``: unknown settings, or the planner refused them (its ValueError's
    message)."""
    kwargs, reason = plan_settings(auditor, steps)
    if kwargs is None:
        return None, reason
    try:
        small = kwargs["num_canaries"] + kwargs["num_unobserved"] <= BUG_SEARCH_MAX_CANARIES
        plan = plan_audit(**kwargs, search_bugs=small)
    except ValueError as err:
        return None, str(err)
    return plan, ""


def announce_plan(auditor: Any, steps: float | None, *, replan: bool = True) -> bool:
    """Plan ``auditor``'s run (kept as ``auditor.plan``, ``plan_reason`` and ``plan_line``);
    True when a plan was made now (its line is for the front end to give).

    A run whose length is unknown is planned at a later call that knows it; a planned run is
    planned again when a later call's T differs from the plan's (a repeated fit), unless
    ``replan`` is False (the plain loop's :meth:`write`, which plans only a run not yet
    planned). A plan refused for another reason is not tried again."""
    planned = auditor.plan
    if planned is not None:
        known = steps is not None and math.isfinite(steps) and steps >= 1
        if not replan or not known or int(steps) == planned.steps:
            return False
    elif auditor.plan_reason not in ("not planned", _UNKNOWN_LENGTH):
        return False  # refused for a reason another call would not change
    plan, reason = plan_for(auditor, steps)
    auditor.plan, auditor.plan_reason = plan, reason
    if plan is None:
        return False
    auditor.plan_line = plan_line(plan)
    return True


def _unit(plan: AuditPlan) -> str:
    return "rounds" if plan.training == "dpfedavg" else "steps"


def plan_read(auditor: Any, claim: Any = None) -> tuple[AuditPlan | None, str]:
    """The plan the run's ratio is read against, and what the reading says about it.

    The plan made at fit start holds for its T and its claim. Where the steps (rounds) taken,
    ``backend.progress()``, differ from its T (a run stopped early, a repeated fit), or, for
    DP-SGD, its claim differs from the run's ``claim`` (the summary's ``epsilon_analytic``),
    the run is planned again at the steps taken, without the bug search (under a second), the
    ratio read against that plan and the note says so; the fit-start plan's line stays as
    logged. Kept on the auditor (``plan_reread``) for the next summary at the same steps."""
    plan = auditor.plan
    if plan is None:
        return None, ""
    taken = int(auditor.backend.progress())
    claim = float(claim) if isinstance(claim, (int, float)) and math.isfinite(claim) else None
    claim_differs = (plan.training == "dpsgd" and claim is not None
                     and not math.isclose(plan.reference_epsilon, claim, rel_tol=1e-9))
    if taken < 1 or (taken == plan.steps and not claim_differs):
        return plan, ""
    unit = _unit(plan)
    note = (f"planned for {plan.steps} {unit}; read against a plan at the {taken} taken"
            if taken != plan.steps else
            f"read against a plan at the run's claim {claim:.4g} (planned at {plan.reference_epsilon:.4g})")
    cached = getattr(auditor, "plan_reread", None)
    if cached is not None and cached[0] == (taken, claim):
        return cached[1], note if cached[1] is not None else cached[2]
    kwargs, reason = plan_settings(auditor, taken)
    again: AuditPlan | None = None
    if kwargs is not None:
        if kwargs["training"] == "dpsgd" and claim is not None and claim > 0:
            kwargs["reference_epsilon"] = claim  # the run's claim, as the ratio's
        try:
            again = plan_audit(**kwargs, search_bugs=False)
        except ValueError as err:
            reason = str(err)
    if again is None:
        note = f"planned for {plan.steps} {unit}, {taken} taken; no plan at those: {reason}"
    auditor.plan_reread = ((taken, claim), again, note)
    return again, note


def plan_line(plan: AuditPlan) -> str:
    """The one line logged at fit start: the plan, and how to get the bug search where it was
    skipped."""
    line = plan.summary()
    tier = epsilon_tier(plan.reference_epsilon)
    if tier is not None:  # the claim is named once in the line
        claim = "it" if plan.above_ceiling else f"the claim {plan.reference_epsilon:.3g}"
        line += f"; {claim} is a {tier} on the scale of Ponomareva et al. (JAIR 2023)"
    if not plan.bugs_searched and not plan.above_ceiling:
        line += ("; for the smallest bug it would flag, run audit_callbacks.estimators.plan_audit "
                 "with these settings before training (seconds to a minute)")
    return line


def plan_entries(plan: AuditPlan | None, reason: str = "",
                 summary: dict[str, Any] | None = None, *, note: str = "",
                 line: str | None = None) -> dict[str, Any]:
    """The summary's ``plan_*`` keys (``plan_status``: ``ok`` or why there is no plan), with
    ``plan_ratio_reading``, the all-iterates ratio of ``summary`` read against ``plan`` (the
    plan read against, :func:`plan_read`; ``note`` says why it is not the fit-start one),
    ``plan_steps`` its T and ``plan_sentence`` ``line`` (the line logged at fit start; default
    ``plan``'s)."""
    if plan is None:
        why = note or f"skipped: {reason or 'not planned'}"
        return {names.PLAN_STATUS: why if why.startswith("skipped") else f"skipped: {why}"}
    ratio = (summary or {}).get(names.EPSILON_RATIO_ALL_ITERATES)
    ok = isinstance(ratio, (int, float)) and math.isfinite(ratio)
    status = str((((summary or {}).get("estimates") or {}).get(names.EPSILON_ALL_ITERATES) or {}).get("status", ""))
    reading = plan.read_ratio(max(float(ratio), 0.0)) if ok else None
    if reading is not None and status.startswith(TOO_FEW_CANARIES):  # its interval is not judged either
        reading = f"{float(ratio):.2f}: not read against the range expected for a correct run: {status}"
    if reading is not None and note:
        reading = f"{reading} ({note})"
    return {
        names.PLAN_RATIO_READING: reading,
        names.PLAN_STATUS: "ok", names.PLAN_CEILING: plan.ceiling,
        names.PLAN_RATIO_LOW: plan.ratio_low, names.PLAN_RATIO_MEDIAN: plan.ratio_median,
        names.PLAN_RATIO_HIGH: plan.ratio_high, names.PLAN_COVERAGE: plan.coverage,
        names.PLAN_REFERENCE: plan.reference_epsilon,
        names.PLAN_CLIP_FACTOR: plan.clip_factor, names.PLAN_NOISE_FACTOR: plan.noise_factor,
        names.PLAN_SENTENCE: plan_line(plan) if line is None else line,
        names.PLAN_STEPS: plan.steps,
    }


def summary_plan_entries(auditor: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """``auditor``'s ``plan_*`` summary keys: the ratio of ``summary`` read against the plan
    for the steps taken and the run's claim (:func:`plan_read`), the fit-start line kept."""
    if auditor.plan is None:
        return plan_entries(None, auditor.plan_reason)
    claim = summary.get(names.EPSILON_ANALYTIC)
    plan, note = plan_read(auditor, claim)
    line = auditor.plan_line or None
    if (line is not None and plan is not None and isinstance(claim, (int, float)) and math.isfinite(claim)
            and not math.isclose(claim, plan.reference_epsilon, rel_tol=1e-3)):
        # the fit-start line names the claim planned for (DP-FedAvg: at the median simulated
        # most-sampled canary); the run's own claim may lie on the other side of the ceiling
        side = ("below the ceiling: a valid bound can flag a bug" if claim < plan.ceiling else
                "at or above the ceiling: no valid bound can flag a bug")
        line = (f"{line} (at fit start; the run's claim is {claim:.3g}, {side} "
                f"{plan.ceiling:.3g})")
    return plan_entries(plan, "", summary, note=note, line=line)
