"""The one canary auditor: canaries -> statistics -> report -> summary, for every front end.

Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for
Federated Learning" (ICLR 2024), Alg. 2 (final model) and Alg. 3 (all iterates). The auditor
knows neither Lightning nor Flower nor Opacus. A backend (:mod:`audit_callbacks.backends`,
:mod:`audit_callbacks.flower.backend`) inserts its canaries into one kind of training and
speaks one event interface to it:

* :meth:`CanaryAuditor.start` - the model before training, ``theta_0``;
* :meth:`CanaryAuditor.release` - each release: the model delta ``theta_t - theta_{t-1}`` and
  the observed canaries that took part in it (DP-SGD: also the noisy sum and its rate);
* ``backend.release_model(kind)`` - what one release is (a
  :class:`~audit_callbacks.canary.base.NoisyAverageDelta`, a
  :class:`~audit_callbacks.canary.base.NoisySum`, or
  :class:`~audit_callbacks.canary.base.NoMatchedStatistic` with the reason), from which the
  auditor builds its statistics: the backend builds none;
* ``backend.analytic(delta)`` - the analytic epsilon the estimates are compared with.

The auditor owns every statistic (:mod:`audit_callbacks.canary`): it projects each released
vector onto the canaries once (:class:`~audit_callbacks.canary.projection.Projection`) and folds
the same release into each statistic that reads that vector.

Front ends (``CanaryAudit`` for Lightning, ``CanaryStrategy`` for Flower) forward their
framework's events to the backend and ask the auditor for :meth:`report`, :meth:`log` and
:meth:`summary`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch

from audit_callbacks import names
from audit_callbacks.auditing.checksum import CHECKSUM_KEY, field_digests, verify
from audit_callbacks.auditing.config import CanaryAuditConfig
from audit_callbacks.auditing.html_report import number_to_read
from audit_callbacks.auditing.output import AuditOutput, ReportSection
from audit_callbacks.auditing.plan import summary_plan_entries
from audit_callbacks.auditing.report import REFERENCES, TOO_FEW_CANARIES, CanaryReport, summary_json
from audit_callbacks.auditing.sinks import FIT_END_TAG, fit_end_table
from audit_callbacks.canary.base import (
    CanaryStatistic,
    NoMatchedStatistic,
    Release,
    further_statistics,
    matched_statistic,
)
from audit_callbacks.canary.projection import Projection
from audit_callbacks.canary.statistics import CanaryStatistics
from audit_callbacks.canary.vectors import CanarySet, hadamard_length
from audit_callbacks.estimators.canary_report import BOUND_METHODS, canary_estimates
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.estimators.valid_bounds import DEFAULT_METHODS, spent_alpha

__all__ = ["CanaryAuditor", "NoEstimateYet", "ReportSink", "Warn"]

DEFAULT_CANARIES = 1000
#: Below this many participating canaries every estimate gets the status "too few canaries".
MIN_CANARIES = 20
DEFAULT_HADAMARD_UNOBSERVED = 100_000
#: How each kind of canary is built, checked on resume (a checkpoint of another construction
#: holds statistics of other canary vectors).
CANARY_CONSTRUCTIONS = {"hadamard": "hadamard rows of H_n on n = 2^floor(log2 d) coordinates",
                        "gaussian": "gaussian"}
#: What a checkpoint without ``canary_construction`` (an older version) had built.
_BEFORE = {"hadamard": "hadamard rows of H_n cut to d of n = 2^ceil(log2 d) coordinates",
           "gaussian": "gaussian", None: None}
#: Gaussian canaries: warn when a release regenerates more floats than this ((k + k') * d)
_COST_WARN_FLOATS = 10**10
_BUFFER_BYTES = 16 << 20  # Gaussian canaries: model deltas buffered between passes
#: releases whose labels are kept for the non-finite warning before a check reads the device
_UNCHECKED_RELEASES = 4096
#: each check of the mechanism runs at this share of the audit's alpha (its power hardly needs
#: more: a reused noise or a fixed batch size falls far below any level)
MECHANISM_ALPHA_SHARE = 0.1

#: :attr:`CanaryAuditor.delta_source`: the audit's ``delta`` argument, the training's own
#: ``delta`` attribute, or the backend's default.
DELTA_ARGUMENT, DELTA_MODULE, DELTA_DEFAULT = "argument", "module", "default"

#: ``warn(key, message)``: a front end's warning, once per key.
Warn = Callable[[str, str], None]


class NoEstimateYet(RuntimeError):
    """:meth:`CanaryAuditor.report` has nothing to report yet; ``reason`` says why (fewer than
    2 canaries took part, no release yet, a model with NaN or inf parameters)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ReportSink(Protocol):
    """Where a report is written (TensorBoard through Lightning's loggers, or a
    ``SummaryWriter``); every method is a no-op where the sink has no such output."""

    def scalars(self, values: dict[str, float | None], step: int) -> None: ...

    def histograms(self, values: dict[str, np.ndarray], step: int) -> None: ...

    def figures(self, figures: dict[str, Any], step: int) -> None: ...

    def layout(self, layout: dict[str, dict[str, list[Any]]]) -> None: ...

    # optional: ``text(values: dict[str, str], step)``, TensorBoard text (the verdicts);
    # ``writes_images`` (bool), False where ``figures`` writes nothing (no figure is built for
    # it then; a sink without the attribute is given them)


class CanaryAuditor:
    """The canaries of one audit, their statistics and participations, and the estimates.

    Args:
        config: the audit's settings.
        backend: how the canaries enter the training (see the module docstring). It gives
            ``dim`` (the model's trainable parameters), ``population`` (real clients or
            training examples, which cap the default k; None when unknown), ``sign`` (+1 when
            canaries are updates the model moves along, -1 for gradients), ``training`` (its
            name), ``default_delta``, ``release_model(kind)``, ``flat_parameters()``,
            ``progress()``, ``analytic(delta)``, ``summary_inputs()`` and ``attach(auditor)``
            (:class:`~audit_callbacks.backends.base.CanaryBackend`).
        warn: ``warn(key, message)``, once per key.
        name: the front end's name in warnings and the summary (``"CanaryAudit"``...).
        delta_source: where ``config.delta`` came from when the front end knows better than
            the config (``"default"`` for a default it put in the config itself); None: from
            the config and the backend (:attr:`delta_source`).

    Raises:
        ValueError: a model with fewer than 2 parameters, more Hadamard canaries (k + k')
            than the transform length, a default k that resolves below 2 (a population of
            one); each names the argument to change.
    """

    def __init__(self, config: CanaryAuditConfig, backend: Any, warn: Warn, *,
                 name: str = "CanaryAudit", delta_source: str | None = None) -> None:
        self.config = config
        self._delta_source = delta_source
        self.backend = backend
        self.warn = warn
        self.name = name
        dim = int(backend.dim)
        if dim < 2:
            raise ValueError(f"the model has {dim} trainable parameter(s); canaries need d >= 2")
        k, k_un = self._resolve_counts(config, dim, backend.population)
        canaries = CanarySet(config.seed, dim, k + k_un, kind=config.canaries)
        buffered = config.max_buffered_rounds or max(1, _BUFFER_BYTES // (4 * dim))
        self.stats = CanaryStatistics(canaries, k, k_un, sign=float(backend.sign), max_buffered=buffered)
        #: the statistic matched to the analytic epsilon's adversary (None: ``matched_reason``)
        self.matched: CanaryStatistic | None
        model = backend.release_model(config.canaries)
        self.matched, self.matched_reason = matched_statistic(model, canaries, k, k_un,
                                                              max_buffered=buffered)
        #: the valid bounds' methods: with the f-DP bound only where a release is a Gaussian
        #: noisy sum (it assumes a Gaussian-shaped mechanism; docs/methods/score_auditor.md §8)
        self.bound_methods = DEFAULT_METHODS if isinstance(model, NoMatchedStatistic) else BOUND_METHODS
        #: every statistic, in the order each release is folded into them
        self.statistics: list[CanaryStatistic] = [self.stats]
        if self.matched is not None:
            self.statistics.append(self.matched)
        self.statistics += further_statistics(model, canaries, k, k_un, max_buffered=buffered)
        self.participations = np.zeros(k, dtype=np.int64)
        self.last_report: CanaryReport | None = None
        self.skip_reason: str | None = None
        self._last_logged = -1
        self._last_scalars: dict[str, float | None] = {}  # the last logged point's, by tag
        self._last_text: dict[str, str] = {}  # the last logged point's verdict sentences, by tag
        self.logged_points = 0  # points of the logged series so far (the valid bounds' index)
        self._output: AuditOutput | None = None  # the output path of the last finish
        self._section: ReportSection | None = None
        self.last_summary: dict[str, Any] | None = None  # the summary the last finish wrote
        #: (step, epsilon_all_iterates, epsilon_analytic, epsilon_final_model) per logged report
        self.history: list[tuple[int, float | None, float | None, float | None]] = []
        #: the releases since the last check: ``what`` and whether it was folded (a 0-dim bool
        #: tensor on the delta's device, read back at the check)
        self._unchecked: list[tuple[str, torch.Tensor]] = []
        self._nan_warned = False
        #: the audit's plan (:mod:`audit_callbacks.auditing.plan`; None: ``plan_reason``)
        self.plan: Any = None
        self.plan_reason, self.plan_line = "not planned", ""
        #: the plan at the steps taken where they differ from the plan's (``plan_read``)
        self.plan_reread: Any = None
        backend.attach(self)

    def _resolve_counts(self, config: CanaryAuditConfig, dim: int,
                        population: int | None) -> tuple[int, int]:
        """k and k' from the config, the model's dimension and the real population.

        Raises:
            ValueError: the default k resolves below 2 (naming ``num_canaries``); more
                Hadamard canaries (k + k') than rows of the transform (naming both counts).
        """
        k = config.num_canaries if config.num_canaries is not None else (
            min(DEFAULT_CANARIES, population) if population else DEFAULT_CANARIES)
        n = hadamard_length(dim)
        if config.num_canaries is None and config.canaries == "hadamard":
            k = min(k, n // 2)  # a small model: room for as many unobserved
        if k < 2:
            cap = f"min({DEFAULT_CANARIES}, the real population {population})"
            if config.canaries == "hadamard" and n // 2 < 2:
                cap += f" and n / 2 = {n // 2} Hadamard rows for d = {dim}"
            raise ValueError(
                f"{self.name}: num_canaries=None resolves to {k} ({cap}); canaries need "
                f"num_canaries >= 2. Pass num_canaries=2 or more explicitly"
                + (", or canaries='gaussian'" if config.canaries == "hadamard" and n // 2 < 2 else "")
            )
        if config.num_unobserved is not None:
            k_un = config.num_unobserved
        elif config.canaries == "hadamard":
            k_un = max(0, min(n - k, DEFAULT_HADAMARD_UNOBSERVED))
        else:
            k_un = k
        if config.canaries == "hadamard" and k + k_un > n:
            raise ValueError(
                f"{self.name}: num_canaries={config.num_canaries!r} (k = {k}) and "
                f"num_unobserved={config.num_unobserved!r} (k' = {k_un}) need k + k' = "
                f"{k + k_un} Hadamard canaries, but only n = {n} exist for d = {dim} "
                f"parameters. Use fewer canaries (num_canaries + num_unobserved <= {n}"
                + ("; num_unobserved=None fills the rest" if config.num_unobserved is not None
                   and k < n else "")
                + "), or canaries='gaussian', which has no such cap"
            )
        if config.canaries == "gaussian" and (k + k_un) * dim > _COST_WARN_FLOATS:
            self.warn("cost", (
                f"{self.name}: num_canaries={k} and num_unobserved={k_un} Gaussian canaries of "
                f"d = {dim}: every release regenerates {(k + k_un) * dim:.2g} floats; the audit "
                "may dominate the training's time. Give a smaller num_unobserved, or "
                "canaries='hadamard'"))
        return k, k_un

    # ------------------------------------------------------------------ what it holds
    @property
    def canaries(self) -> CanarySet:
        return self.stats.canaries

    @property
    def num_canaries(self) -> int:
        return self.stats.num_observed

    @property
    def num_unobserved(self) -> int:
        return self.stats.num_unobserved

    @property
    def delta(self) -> float:
        """The delta of every epsilon: the config's, else the backend's default."""
        return self.config.delta if self.config.delta is not None else float(self.backend.default_delta)

    @property
    def delta_source(self) -> str:
        """Where :attr:`delta` came from: ``"argument"`` (the audit's ``delta``), ``"module"``
        (the training's own ``delta`` attribute: a ``DPFedAvg`` or a LightningModule that has
        one) or ``"default"`` (the backend's default, e.g. 1e-5 for Opacus DP-SGD, which keeps
        no delta of its own: ``make_private_with_epsilon``'s ``target_delta`` is not stored)."""
        if self._delta_source is not None:
            return self._delta_source
        if self.config.delta is not None:
            return DELTA_ARGUMENT
        own = getattr(self.backend, "delta_source", None)
        if own is not None:
            return str(own)
        # a backend that took the training's own delta set it on itself, over its class default
        return DELTA_MODULE if "default_delta" in vars(self.backend) else DELTA_DEFAULT

    def _warn_default_delta(self) -> None:
        """Once, at the training's start: the claim is computed at a delta nobody chose."""
        if self.delta_source != DELTA_DEFAULT:
            return
        hint = getattr(self.backend, "delta_hint", "the delta your own accountant reports epsilon at")
        self.warn("delta", (
            f"{self.name}: no delta given, so the claimed epsilon (epsilon_analytic) and every "
            f"estimate are at the default delta = {self.delta:g}, which may not be yours: an "
            f"epsilon at another delta is another number. Pass {self.name}(..., delta=...) with "
            f"{hint}"))

    # ------------------------------------------------------------------ events
    def start(self, theta0: torch.Tensor | None = None) -> None:
        """The model before training (flat ``[d]``; default: the backend's current model),
        once: a repeated or resumed run keeps the first ``theta_0``."""
        if self.stats.theta0 is None:
            self.stats.set_initial(self.backend.flat_parameters() if theta0 is None else theta0)
        self._warn_default_delta()

    def release(self, model_delta: torch.Tensor | None, participants: np.ndarray | None = None, *,
                noisy_sum: torch.Tensor | None = None, rate: float | None = None,
                batch_size: int | None = None, batches: int = 1, batch_rate: float | None = None,
                extras: torch.Tensor | None = None, what: str = "a release") -> None:
        """One release: count the observed canaries that took part (local indices ``[m]`` in
        ``0..k-1``, repeats allowed), project each released vector onto the canaries once and
        fold it into every statistic that reads it, on its device with no host
        synchronisation.

        Args:
            model_delta: ``[d]`` ``theta_t - theta_{t-1}`` (None: the release has none yet, e.g.
                DP-SGD's noisy sum, whose model delta follows after the optimizer's update).
            participants: the observed canaries that took part, or None.
            noisy_sum: ``[d]`` DP-SGD's noisy sum of the step (before the division by the batch
                size), read by the steps-unknown statistic; kept only while it is folded.
            rate: the noisy sum's Poisson rate q in (0, 1].
            batch_size: the step's real batch size (DP-SGD), read by the sampler check; None
                when unknown. batches: the Poisson batches summed into the step. batch_rate: the
                real examples' Poisson rate of the step where it differs from ``rate`` (the
                canaries' rate was given), read by the sampler check; None: ``rate``.
            extras: the change of arrays released beside the model that carry no canary (a
                Flower model's integer buffers), read by the noise checks; or None.
            what: the release's name in warnings.

        A delta with NaN or inf entries is skipped (counted in the summary's
        ``rounds_skipped_non_finite``); the warning naming the first such release (``what``) is
        given when the counts are next read (:meth:`report`, :meth:`summary`, or after 4096
        unchecked releases: one read back from the device per 4096 releases), not per release."""
        if participants is not None and len(participants):
            np.add.at(self.participations, np.asarray(participants, dtype=np.int64), 1)
        if noisy_sum is not None:
            release = Release(Projection(self.canaries, noisy_sum), participants, rate,
                              batch_size=batch_size, batches=int(batches), batch_rate=batch_rate)
            for stat in self.statistics:
                if stat.reads == "noisy_sum":
                    stat.fold(release)
        if model_delta is None:
            return
        release = Release(Projection(self.canaries, model_delta), participants, rate, extras=extras)
        folded = self.stats.fold(release)  # first: its flag names a non-finite release
        for stat in self.statistics[1:]:
            if stat.reads == "model_delta":
                stat.fold(release)
        if self._nan_warned:
            return
        if len(self._unchecked) >= _UNCHECKED_RELEASES:  # one read per 4096 releases bounds the list
            self._check_non_finite()
            if self._nan_warned:
                return
        # kept as it is (no device operation per release): read back at the next check
        self._unchecked.append((what, folded))

    def _check_non_finite(self) -> None:
        """At estimate time: warn (once) about the first release whose delta had NaN or inf
        entries (the releases' flags read back from the device now, in one copy, never per
        release)."""
        if self._nan_warned or not self._unchecked:
            return
        device = self._unchecked[-1][1].device
        flags = torch.stack([folded.to(device) for _, folded in self._unchecked]).cpu().numpy()
        bad = np.flatnonzero(~flags)
        if bad.size:
            self._nan_warned = True
            self.warn("nan", f"{self.name}: {self._unchecked[int(bad[0])][0]} produced a model delta "
                      "with NaN or inf; it is skipped by the all-iterates statistic")
        self._unchecked = []

    def new_fit(self) -> None:
        """A new fit of the same training (the server optimizer is built anew, with an empty
        momentum buffer): the statistics that follow its state restart it."""
        for stat in self.statistics:
            restart = getattr(stat, "restart", None)
            if restart is not None:
                restart()

    def skip_release(self, what: str) -> None:
        """A release the audit cannot read (e.g. a model of another layout): counted as
        skipped, nothing folded."""
        self.stats.skip()
        self.warn(f"skip:{what}", f"{self.name}: {what} is skipped by the audit")

    # ------------------------------------------------------------------ estimates
    def report(self, *, bootstrap: int = 0, step: int = 0, index: int | None = None) -> CanaryReport:
        """Every estimate from the canaries so far.

        Args:
            bootstrap: resamples of the estimates' percentile intervals (seeded by the
                canaries' seed).
            step: the training's step, recorded in the report.
            index: the logged point this report will be (1-based): its valid lower bounds are
                at the level spent for that point, so that the maximum of a logged series is a
                valid bound; None (the summary's): at plain alpha.

        Raises:
            NoEstimateYet: fewer than 2 canaries took part, or the model has NaN or inf
                parameters (the reason is kept for the summary and warned once).
        """
        self._check_non_finite()
        try:
            report = self._report(bootstrap, step, index)
        except NoEstimateYet as err:
            self.skip_reason = err.reason
            self.warn(err.reason, f"{self.name}: {err.reason}; no estimate")
            raise
        if report.epsilon_analytic == math.inf:
            self.warn("nonoise", f"{self.name}: no DP noise (noise_multiplier = 0): the analytic "
                      "epsilon is infinite")
        reason = self.backend.estimate_flag()
        if reason:  # the training broke an assumption of the analysis: every estimate says so
            report = replace(report, estimates={
                n: replace(e, status=f"flagged: {reason}") if e.status == "ok" else e
                for n, e in report.estimates.items()})
        self.last_report = report
        return report

    def _report(self, bootstrap: int, step: int, index: int | None) -> CanaryReport:
        if self.stats.theta0 is None:
            raise NoEstimateYet("no model was released yet")
        with torch.inference_mode(False), torch.no_grad():  # Lightning validates in inference mode
            theta = self.backend.flat_parameters()
            if theta is None:
                raise NoEstimateYet("no model was released yet")
            if not bool(torch.isfinite(theta).all()):
                raise NoEstimateYet("the model has NaN or inf parameters")
            took = self.participations > 0
            if int(took.sum()) < 2:
                raise NoEstimateYet("fewer than 2 canaries have taken part")
            raw = {key: v.numpy() for key, v in self.stats.compute(theta).items()}
        stats = {
            "final_observed": raw["final_observed"][took],
            "final_unobserved": raw["final_unobserved"],
            "all_observed": raw["all_observed"][took] if raw["all_observed"].size else raw["all_observed"],
            "all_unobserved": raw["all_unobserved"],
        }
        exact_null = self.canaries.kind == "gaussian"
        delta, alpha, seed = self.delta, self.config.alpha, self.config.seed
        matched, matched_skip = self._matched(delta, bootstrap)
        max_cos = (stats["all_observed"], stats["all_unobserved"]) if stats["all_observed"].size else None
        estimates, skipped = canary_estimates(
            (stats["final_observed"], stats["final_unobserved"]), delta, max_cosine=max_cos,
            matched=matched, dim=self.stats.dim if exact_null else None, alpha=alpha,
            bootstrap=bootstrap, seed=seed, index=index, methods=self.bound_methods,
        )
        if matched_skip:
            skipped[names.EPSILON_ALL_ITERATES_MATCHED] = matched_skip
        took_part = int(took.sum())
        if took_part < MIN_CANARIES:  # an estimate from a handful of canaries means little
            status = f"{TOO_FEW_CANARIES} (k = {took_part})"
            if index is None or self.num_canaries < MIN_CANARIES:  # early points: status only
                self.warn("few", f"{self.name}: only {took_part} canaries took part: too few for "
                          f"an estimate to mean anything (at least {MIN_CANARIES}); pass a larger "
                          "num_canaries")
            estimates = {n: replace(e, status=status) for n, e in estimates.items()}
        return CanaryReport(
            checks=self.mechanism_checks(index), noise_source=self._noise_source(),
            estimates=estimates, skipped=skipped, **self.backend.analytic(delta),
            epsilon_last_iterate_heuristic=self._last_iterate(delta),
            max_participations=int(self.participations.max(initial=0)),
            num_canaries_participated=int(took.sum()), statistics=stats,
            progress=int(self.backend.progress()), step=int(step), index=index, alpha=alpha,
            delta=delta,
        )

    def mechanism_checks(self, index: int | None = None) -> dict[str, AuditResult]:
        """The checks of the mechanism over every release so far (noise scale and fresh noise
        per parameter tensor, the sampler), by name, at the level spent for the logged point
        ``index`` (None: plain alpha), as the valid bounds, times :data:`MECHANISM_ALPHA_SHARE`:
        the three checks together add at most ``0.3 alpha`` to a correct run's false-alarm rate
        (``docs/methods/mechanism_checks.md``)."""
        alpha = self.config.alpha * MECHANISM_ALPHA_SHARE
        level = alpha if index is None else spent_alpha(alpha, index)
        out: dict[str, AuditResult] = {}
        for stat in self.statistics:
            results = getattr(stat, "results", None)
            if results is not None:
                out.update(results(level))
        return out

    def _noise_source(self) -> str | None:
        found = getattr(self.backend, "noise_source", None)
        return found.message if found is not None and found.replayable else None

    def _matched(self, delta: float, bootstrap: int) -> tuple[Any, str | None]:
        """The matched all-iterates statistic's ``(scores, estimate)``, its scores as their
        one score auditor (as ``(observed, unobserved)`` where they cannot be audited: the
        estimators then say why), or None with the reason."""
        matched = self.matched
        if matched is None:
            return None, self.matched_reason
        try:
            est = matched.estimate(delta, alpha=self.config.alpha, bootstrap=bootstrap,
                                   seed=self.config.seed)
            try:
                scores: Any = matched.score_auditor()  # type: ignore[attr-defined]
            except ValueError:
                scores = matched.scores()
        except ValueError as err:
            return None, str(err)
        return (scores, est), None

    def _last_iterate(self, delta: float) -> float | None:
        """The final-model reference at ``delta``: the matched statistic's last-iterate
        heuristic where it gives one, else the backend's."""
        own = getattr(self.matched, "last_iterate", None)
        value = None if own is None else own(delta)
        return self.backend.last_iterate(delta) if value is None else value

    def try_report(self, *, bootstrap: int = 0, step: int = 0, index: int | None = None
                   ) -> CanaryReport | None:
        """:meth:`report`, or None when there is no estimate yet (the reason warned once) or
        the estimators failed (warned, never raised into the training)."""
        try:
            return self.report(bootstrap=bootstrap, step=step, index=index)
        except NoEstimateYet:
            return None
        except (ValueError, RuntimeError, FloatingPointError) as err:
            message = (f"{self.name}: no estimate after {self.backend.progress()} rounds (steps) "
                       f"({type(err).__name__}: {err})")
            self.warn(message, message)
            return None

    def update(self, sink: ReportSink, *, step: int, histograms: bool = True) -> CanaryReport | None:
        """A periodic estimate: report and log at ``step``, unless this round (step) was
        logged already."""
        if self.logged(int(self.backend.progress())):
            return self.last_report
        report = self.try_report(step=step, index=self.logged_points + 1)
        self.log(report, sink, step=step, histograms=histograms)
        return report

    def finish(self, sink: ReportSink | None = None, *, step: int, directory: str | None = None,
               filename: str = "audit_summary.json", histograms: bool = True, figures: bool = True,
               extra: dict[str, Any] | None = None, status: str = "complete",
               output: AuditOutput | None = None) -> str | None:
        """The final estimate (with the config's ``bootstrap`` intervals), the summary written
        through ``output`` (with ``extra`` keys), then the TensorBoard extras (the series' last
        point, density figures) and this audit's report section; the run's report
        (``audit_report.html`` and ``.md``, every audit's section) is written once every audit
        of the run has finished (:class:`~audit_callbacks.auditing.output.AuditRun`).

        The summary is written first: a logger or disk that fails later (a full disk, a
        broken TensorBoard writer) is warned about and never loses it. ``status`` is the
        summary's ``run_status`` (``complete``; ``interrupted at step N`` when the training
        was stopped by a signal: then no bootstrap, figures or report, to finish quickly).

        Args:
            sink: where the scalars, histograms and figures go (default: ``output``'s).
            directory, filename: without ``output``, the summary's folder (None: no file) and
                name; a one-audit output is made for them.
            output: the front end's output path (its folder and file name are used).

        Returns:
            The summary's path (None without a directory, or when it could not be written:
            warned). Another run's file is never replaced (then a fresh name, warned).
        """
        if output is None:
            output = AuditOutput(self.name, filename, emit=self._warn_message, section=self.report_section)
            output.bind_directory(directory, sink)
        sink = output.sink if sink is None else sink
        complete = status == "complete"
        last = None if self.logged(int(self.backend.progress())) else self.try_report(
            step=step, index=self.logged_points + 1)  # the series' last point
        report = self.try_report(bootstrap=self.config.bootstrap if complete else 0, step=step)
        summary = {**self.summary(report, status=status), **(extra or {})}
        self.last_summary = summary  # what a refresh at fit end writes again
        self._warn_verdict({tm: (summary[f"verdict_{tm}"], summary[f"verdict_{tm}_sentence"])
                            for tm in REFERENCES},
                           (summary[names.VERDICT_MECHANISM], summary[f"{names.VERDICT_MECHANISM}_sentence"])
                           if names.VERDICT_MECHANISM in summary else None)
        path = output.write_summary(summary)
        if complete and path is not None:  # rank zero, once: the number to read, in the terminal
            output.info(f"{self.name}: {number_to_read(summary)}")
        self.log(last, sink, step=step, histograms=histograms and complete)
        if report is not None:  # the fit-end numbers (the summary's) where they differ from the
            # series' last point (the bounds at plain alpha, under their own names), written last
            self._sink(sink.scalars, {tag: v for tag, v in report.scalars().items()
                                      if v is not None and self._last_scalars.get(tag) != v}, step)
        text = getattr(sink, "text", None)
        if text is not None:  # the summary's verdict sentences where they differ from the last
            # point's (its bounds at the level spent for it): TensorBoard's last text is theirs
            changed = {tag: sentence for tag, sentence in verdict_sentences(summary).items()
                       if self._last_text.get(tag) != sentence}
            if changed:
                self._last_text.update(changed)
                self._sink(text, changed, step)
        if complete and getattr(sink, "text", None) is not None:  # beside the report's text
            self._sink(sink.text, {FIT_END_TAG: fit_end_table(summary)}, step)
        drawn: dict[str, Any] = {}
        writes_images = bool(getattr(sink, "writes_images", True))
        if complete and figures and report is not None:
            self.log(report, sink, step=step, histograms=False)
            if writes_images or path is not None:  # built only for a reader: each drawn once
                from audit_callbacks.auditing.figures import canary_figures

                drawn = canary_figures(report.statistics, self.stats.dim,
                                       exact_null=self.canaries.kind == "gaussian")
            if writes_images:
                self._sink(sink.figures, drawn, step)
        self._section = ReportSection("canary audit", summary=summary, figures=drawn,
                                      history=list(self.history)) if path is not None and complete else None
        self._output = output
        output.done(status)
        return path

    @property
    def report_paths(self) -> tuple[str, str] | None:
        """The run's report ``(html, markdown)`` once written (after every audit of the run
        finished), else None."""
        return None if self._output is None else self._output.report_paths

    def _warn_message(self, message: str) -> None:
        self.warn(message, message)

    def report_section(self) -> ReportSection | None:
        """This audit's part of the run's report (its summary, figures and history), once it
        finished with a summary written; None before."""
        return self._section

    def _warn_verdict(self, verdicts: dict[str, tuple[str, str]],
                      mechanism: tuple[str, str] | None = None) -> None:
        """One warning a run (key ``verdict``) the first time a verdict is ``suspicious``,
        ``unproven`` or ``violation``: the mechanism's (``(word, sentence)``) where its checks
        failed, else each threat model's (``{threat_model: (word, sentence)}``); the training
        goes on."""
        if mechanism is not None and mechanism[0] in ("violation", "unproven"):
            flagged = {mechanism[1]: mechanism[0]}
        else:
            flagged = {f"{tm}: {sentence}": word for tm, (word, sentence) in verdicts.items()
                       if word in ("suspicious", "violation")}
        if not flagged:
            return
        what = "contradicts" if any(w != "unproven" for w in flagged.values()) else "cannot confirm"
        self.warn("verdict", f"{self.name}: the audit {what} the claimed privacy: "
                  f"{'; '.join(flagged)}. Training goes on; see docs/methods/verdicts.md and "
                  "docs/methods/mechanism_checks.md")

    def _sink(self, write: Callable[..., None], *args: Any) -> None:
        """Call a sink's ``write(*args)``; any failure (a full disk, a closed writer, a logger
        whose server is gone) is warned once and never stops the training or the audit."""
        try:
            write(*args)
        except Exception as err:  # noqa: BLE001 - a logger's failure never stops the fit
            self.warn("sink", f"{self.name}: a TensorBoard / logger write failed ({type(err).__name__}: "
                      f"{err}); the summary JSON still holds every number")

    # ------------------------------------------------------------------ output
    def log(self, report: CanaryReport | None, sink: ReportSink, *, step: int,
            histograms: bool = True, figures: bool = False) -> None:
        """Write ``report`` to ``sink`` at ``step``: its scalars (verdict codes included), the
        verdicts as text and (``histograms``) the cosine histograms once per report, and
        (``figures``) the density figures. A failing sink is warned about, never raised."""
        if report is None:
            return
        if report.progress != self._last_logged:
            self._last_logged = report.progress
            self.logged_points += 1
            self.history.append((step, report.value(names.EPSILON_ALL_ITERATES), report.epsilon_analytic,
                                 report.value(names.EPSILON_FINAL_MODEL)))
            self._warn_verdict(report.verdicts(), report.mechanism_verdict())
            self._last_scalars = report.scalars()
            self._sink(sink.scalars, self._last_scalars, step)
            text = getattr(sink, "text", None)
            if text is not None:
                sentences = verdict_sentences({
                    **{f"verdict_{tm}_sentence": sentence for tm, (_, sentence) in report.verdicts().items()},
                    f"{names.VERDICT_MECHANISM}_sentence": report.mechanism_verdict()[1]})
                self._last_text = dict(sentences)
                self._sink(text, sentences, step)
            if histograms:
                self._sink(sink.histograms, {f"{names.FAMILY_AUDIT}/cosine_{key}": value
                                             for key, value in report.statistics.items()}, step)
        if figures:
            from audit_callbacks.auditing.figures import canary_figures

            self._sink(sink.figures, canary_figures(report.statistics, self.stats.dim,
                                                    exact_null=self.canaries.kind == "gaussian"), step)

    def layout(self) -> dict[str, dict[str, list[Any]]]:
        """The Custom Scalars layout of the audit's charts (:func:`audit_callbacks.names.
        chart_layout`, family ``audit``, with only the analytic epsilons the backend gives),
        and the validation accuracy beside them."""
        analytic = set(self.backend.analytic_names)
        keep = [q.tag for q in names.family(names.FAMILY_AUDIT)
                if not q.name.startswith(names.EPSILON_ANALYTIC) or q.name in analytic]
        return names.chart_layout([names.FAMILY_AUDIT], only=keep, extra={
            names.SECTIONS[names.FAMILY_AUDIT]: {"accuracy": [r"^val.*acc.*$"]}})

    def logged(self, progress: int) -> bool:
        """Whether a report at ``progress`` was already logged."""
        return progress == self._last_logged

    def identity(self) -> dict[str, Any]:
        """What identifies the audit: its settings and the canaries they resolved to (checked
        against a checkpoint's on resume, and the start of the summary's ``inputs``)."""
        return {
            "canaries": self.config.canaries, "seed": self.config.seed,
            "requested_num_canaries": self.config.num_canaries,
            "num_canaries": self.num_canaries, "num_unobserved": self.num_unobserved,
            "training": self.backend.training, "delta": self.config.delta,
            "canary_construction": CANARY_CONSTRUCTIONS[self.config.canaries],
        }

    def summary(self, report: CanaryReport | None = None, *, status: str = "complete") -> dict[str, Any]:
        """The summary JSON's content: ``report``'s, else the last report marked stale (or
        every estimate skipped with the reason); ``status``: the run's (``complete``, or
        ``interrupted at step N``)."""
        stale = report is None and self.last_report is not None
        self._check_non_finite()
        claim = dict(self.backend.claim(self.delta))
        sampling = claim.pop("claim_sampling", None)
        inputs = {
            **self.identity(), "dim": self.stats.dim, "delta": self.delta,
            names.DELTA_SOURCE: self.delta_source,
            "alpha": self.config.alpha,
            "participations_histogram": np.bincount(self.participations).tolist(),
            "rounds_skipped_non_finite": self.stats.rounds_skipped,
            **self.backend.summary_inputs(),
            **({} if sampling is None else {"claim_sampling": sampling}),
        }
        out = {**summary_json(report or self.last_report, stale=stale, skip_reason=self.skip_reason,
                              inputs=inputs, gradients=self.backend.sign < 0, callback=self.name,
                              status=status),
               **claim, **self.backend.summary_status()}
        return {**out, **summary_plan_entries(self, out)}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The statistics, participations, the backend's state and the audit's identity, with
        a SHA-256 ``checksum`` of each field (:mod:`audit_callbacks.auditing.checksum`)."""
        state = {"stats": self.stats.state_dict(), "participations": self.participations.tolist(),
                 "backend": self.backend.state_dict(), "config": self.identity(),
                 "settings": audit_settings(self.config), "logged_points": self.logged_points}
        for stat in self.statistics[1:]:
            state[stat.state_key] = stat.state_dict()
        state[CHECKSUM_KEY] = {"sha256": field_digests(state)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. A state without a checksum (saved before checksums
        existed) is accepted with one warning.

        Raises:
            ValueError: the state does not match its checksum (naming every field that
                differs: a damaged checkpoint), the checkpoint's audit differs from this one
                (naming the setting), or its arrays do not match.
        """
        if not verify(state, name=self.name):
            self.warn("nochecksum", f"{self.name}: the checkpoint's audit state has no checksum "
                      "(saved by an older version): it is resumed unchecked")
        check_settings(state.get("settings") or {}, audit_settings(self.config), name=self.name)
        check_identity(state.get("config") or {}, self.identity(), name=self.name, strict=True)
        saved = np.asarray(state["participations"], dtype=np.int64)
        if saved.shape != self.participations.shape:
            raise ValueError(f"checkpointed participations cover {saved.size} canaries, this run "
                             f"has {self.participations.size}")
        self.stats.load_state_dict(state["stats"])
        self.participations[:] = saved
        # a checkpoint taken between two logged points does not know whether one more point was
        # logged after it (e.g. mid-epoch checkpoints, SIGUSR1 requeue): the resumed series goes
        # on from the next index, so no index is spent twice (skipping one only spends less)
        self.logged_points = int(state.get("logged_points", 0)) + 1
        backend = state.get("backend") or {}
        for stat in self.statistics[1:]:
            key = stat.state_key  # older checkpoints kept the matched one in the backend's state
            saved = state.get(key, backend.get(key))
            if saved is not None:
                stat.load_state_dict(saved)
        self.backend.load_state_dict(backend)


#: The settings an audit's numbers depend on: a resume must keep each of them
#: (``bootstrap`` only sets the final intervals' resamples and ``max_buffered_rounds`` a buffer).
AUDIT_SETTINGS = ("num_canaries", "num_unobserved", "canaries", "seed", "delta", "alpha",
                  "repeats", "sample_rate", "canary_norm_multiplier")


def verdict_sentences(summary: dict[str, Any]) -> dict[str, str]:
    """``{TensorBoard tag: sentence}`` of the verdict sentences a summary (or a report's
    ``{verdict_<tm>_sentence: ...}``) holds: ``audit/verdict_<tm>_sentence`` for each threat
    model and ``audit/verdict_mechanism_sentence``; a sentence it lacks is left out."""
    keys = [f"verdict_{tm}_sentence" for tm in REFERENCES] + [f"{names.VERDICT_MECHANISM}_sentence"]
    return {f"{names.FAMILY_AUDIT}/{key}": summary[key] for key in keys
            if isinstance(summary.get(key), str)}


def audit_settings(config: CanaryAuditConfig) -> dict[str, Any]:
    """The settings of :data:`AUDIT_SETTINGS` as given (None where left to the default)."""
    given = config.to_dict()
    return {key: given[key] for key in AUDIT_SETTINGS}


def check_settings(theirs: dict[str, Any], mine: dict[str, Any], *, name: str) -> None:
    """Raise ``ValueError`` naming the first setting of :data:`AUDIT_SETTINGS` given
    differently to the checkpoint's audit (None, the default, differs from any value).
    A checkpoint saved before its settings were kept has none: nothing to compare."""
    for key in AUDIT_SETTINGS:
        if key in theirs and key in mine and theirs[key] != mine[key]:
            raise ValueError(
                f"{name}: the checkpoint's audit has {key}={theirs[key]!r}, this one "
                f"{mine[key]!r}; resuming would mix two audits. Resume with "
                f"{key}={theirs[key]!r}, or start a new run"
            )


def check_identity(theirs: dict[str, Any], mine: dict[str, Any], *, name: str, strict: bool) -> None:
    """Raise ``ValueError`` naming the first audit setting in which a checkpoint differs
    (``strict``: also the resolved k and k'). A setting left to its default (None) differs
    from any value given; a default that resolves to another k or k' is named with both."""
    fields = ["canaries", "seed", "requested_num_canaries", "delta", "training"]
    if strict:
        fields += ["num_canaries", "num_unobserved"]
    for key in fields:
        if key in theirs and key in mine and theirs[key] != mine[key]:
            setting = "num_canaries" if key == "requested_num_canaries" else key
            if key in ("num_canaries", "num_unobserved"):  # the counts the settings resolved to
                raise ValueError(
                    f"{name}: the checkpoint's audit resolved {key} to {theirs[key]!r}, this one "
                    f"to {mine[key]!r} (a setting left to its default resolves from the real "
                    "population and the model's size, which changed); resuming would mix two "
                    f"audits. Resume with {key}={theirs[key]!r} given explicitly, or start a new run"
                )
            raise ValueError(
                f"{name}: the checkpoint's audit has {setting}={theirs[key]!r}, this one "
                f"{mine[key]!r}; resuming would mix two audits. Resume with the same "
                "settings, or start a new run"
            )
    built = mine.get("canary_construction")
    saved = theirs.get("canary_construction", _BEFORE.get(theirs.get("canaries")))
    if strict and built is not None and saved != built:
        raise ValueError(
            f"{name}: the checkpoint's canaries were built as {saved!r}, this version builds "
            f"{built!r}: the same seed gives other canary vectors, and resuming would fold new "
            "cosines into the old canaries' statistics. Start a new run"
        )
