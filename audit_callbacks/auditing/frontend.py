"""What the canary audit's front ends share (``CanaryAudit``, ``OpacusCanaryAudit``,
``CanaryStrategy``): the auditor, the output path (:class:`~audit_callbacks.auditing.output.
AuditOutput`: once-only warnings, the summary, the report section), and a checkpoint's state
kept until the auditor can take it."""

from __future__ import annotations

from typing import Any

from audit_callbacks.auditing.auditor import CanaryAuditor, NoEstimateYet
from audit_callbacks.auditing.config import CanaryAuditConfig
from audit_callbacks.auditing.output import AuditOutput, ReportSection, default_info
from audit_callbacks.auditing.plan import announce_plan
from audit_callbacks.auditing.report import CanaryReport
from audit_callbacks.validation import check_count, check_summary_filename

__all__ = ["AuditFrontEnd"]


class AuditFrontEnd:
    """Mixin of a front end: ``config`` and ``name`` are set by the subclass, which also
    implements :meth:`_emit` (its framework's warning)."""

    config: CanaryAuditConfig
    name = "CanaryAudit"
    #: where ``config.delta`` came from when the subclass put a default of its own there
    #: (``"default"``); None: the auditor tells it from the config and the backend
    _delta_source: str | None = None
    output_type: type[AuditOutput] = AuditOutput  #: a Lightning callback's: ``LightningOutput``

    def __init__(self) -> None:
        super().__init__()  # cooperative: the framework's base class comes next
        self.auditor: CanaryAuditor | None = None
        self._state: dict[str, Any] | None = None
        #: the audit's output path (the subclass sets ``summary_filename`` and binds it)
        self.output = self.output_type(self.name, emit=self._emit, section=self._report_section,
                                       info=self._info)
        self.output.one_per_run = True  # its tags and report section are the run's canary audit's
        self.summary_path: str | None = None  #: the summary JSON written at the end

    @property
    def summary_filename(self) -> str | None:
        """The summary's file name in the run's folder (the output path's)."""
        return self.output.summary_filename

    @summary_filename.setter
    def summary_filename(self, value: str | None) -> None:
        """Raises ``ValueError`` naming ``summary_filename`` for anything but a path inside the
        run's folder (a canary audit always writes its summary)."""
        self.output.summary_filename = check_summary_filename(value, optional=False)

    def _emit(self, message: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _info(self, message: str) -> None:
        """A line of information (the plan at fit start, the report's path at the end), not a
        warning; a front end gives it through its framework's logger."""
        default_info(message)

    def _plan(self, steps: float | None, *, replan: bool = True) -> None:
        """Plan the audit from the run's settings and its planned ``steps`` (rounds), again
        when a later call's steps differ (``replan``): the plan's line is given as information
        and kept for the summary and the report."""
        if self.auditor is not None and announce_plan(self.auditor, steps, replan=replan):
            self._info(f"{self.name}: {self.auditor.plan_line}")

    def _warn(self, key: str, message: str) -> None:
        """Warn once per ``key`` (through the output path)."""
        self.output.warn(key, message)

    def _report_section(self) -> ReportSection | None:
        return None if self.auditor is None else self.auditor.report_section()

    def _open(self, backend: Any) -> None:
        """Make the auditor over ``backend`` (once), and apply a checkpoint's state."""
        if self.auditor is None and backend is not None:
            self.auditor = CanaryAuditor(self.config, backend, self._warn, name=self.name,
                                         delta_source=self._delta_source)
        if self._state is not None and self.auditor is not None:
            state, self._state = self._state, None
            self.auditor.load_state_dict(state)

    @property
    def report_path(self) -> str | None:
        """The run's ``audit_report.html`` once written (printed then as ``audit report:
        <path>``), else None."""
        paths = self.output.report_paths
        return None if paths is None else paths[0]

    @property
    def backend(self) -> Any:
        """The backend inserting the canaries (None before the training started)."""
        return None if self.auditor is None else self.auditor.backend

    @property
    def last_report(self) -> CanaryReport | None:
        return None if self.auditor is None else self.auditor.last_report

    def report(self, *, bootstrap: int = 0) -> CanaryReport:
        """Every estimate from the canaries so far (``report.value("epsilon_all_iterates")``,
        the claim ``report.epsilon_analytic`` at ``report.delta``), with ``bootstrap``
        percentile resamples. Logs and writes nothing. The same on every front end.

        Raises:
            NoEstimateYet: no estimate yet; its ``reason`` says why (the training has not
                started, fewer than 2 canaries took part, a model with NaN or inf parameters,
                or the estimators failed). :meth:`compute` returns None instead.
            ValueError: ``bootstrap`` is not a count >= 0.
        """
        check_count(bootstrap, "bootstrap")
        if self.auditor is None:
            raise NoEstimateYet(f"{self.name}: the training has not started, no canary was "
                                "inserted yet")
        try:
            return self.auditor.report(bootstrap=bootstrap, step=self.auditor.backend.progress())
        except NoEstimateYet as err:
            raise NoEstimateYet(f"{self.name}: {err.reason}") from None
        except (ValueError, RuntimeError, FloatingPointError) as err:  # as compute() catches
            raise NoEstimateYet(f"{self.name}: the estimators failed ({type(err).__name__}: "
                                f"{err})") from err

    def compute(self, *, bootstrap: int = 0, step: int | None = None) -> CanaryReport | None:
        """Every estimate from the canaries so far, or None until there is one (the reason is
        warned once; :meth:`report` raises it instead). Logs nothing."""
        if self.auditor is None:
            return None
        step = self.auditor.backend.progress() if step is None else step
        return self.auditor.try_report(bootstrap=bootstrap, step=step)

    def state_dict(self) -> dict[str, Any]:
        """The audit's state: statistics, participations, the backend's, the identity."""
        return {} if self.auditor is None else self.auditor.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a checkpoint's state; it is checked and applied when the training (re)starts
        (raising ``ValueError`` naming what differs)."""
        self._state = dict(state_dict) or None
