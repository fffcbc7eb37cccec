"""The one output path of every audit: warnings once, the run's folder, the summary JSON (at the
end and on SIGTERM / SIGINT), the sinks (TensorBoard and the other loggers) and the report.

Every front end composes one :class:`AuditOutput`: the six Lightning callbacks (canary, label
DP, label reconstruction, federated label attack, local-DP audit and inference), the plain
Opacus front end and the Flower strategy. The outputs of one run share one :class:`AuditRun`
(per folder; a Lightning run's, one per ``Trainer``, is :class:`~audit_callbacks.callbacks.
summary.LightningRun`, with :class:`~audit_callbacks.callbacks.summary.LightningOutput` for
its callbacks): its folder, and the report
(``audit_report.html`` and ``audit_report.md``) written when every registered audit has
finished, with a section for each audit that ran (found by registration: each output is given
its section's provider when it is made).

Every summary follows one schema (:data:`SCHEMA`, ``docs/summary_schema.md``)::

    {"schema": "audit_callbacks.summary/1", "audit": <front end>, "callback": <front end>,
     "run_status": "complete" | "interrupted at step N", "status": "ok" | <why not>,
     "source": <authors, year, equations>, "inputs": {...},
     "results": {<name from audit_callbacks.names>: {"status": ..., "value": ..., ...}},
     "versions": {...}, <the audit's own keys>}

A write that fails is warned about and never raises out of the training.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from audit_callbacks import names
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.validation import check_summary_filename

__all__ = ["SCHEMA", "AuditOutput", "AuditRun", "ReportSection", "default_info", "result_entry",
           "summary_document", "validate_summary"]

#: The summary schema's name and version (the ``schema`` key of every summary).
SCHEMA = "audit_callbacks.summary/1"

#: The keys every summary has, and their types.
REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema": str, "audit": str, "callback": str, "run_status": str, "status": str,
    "source": str, "inputs": dict, "results": dict,
}

#: The fields a result may have besides ``status`` (:class:`AuditResult`'s).
RESULT_FIELDS = ("value", "lower", "upper", "alpha", "delta", "method", "source", "counts", "details")

_KNOWN_NAMES = frozenset(q.name for q in names.QUANTITIES)


# ---------------------------------------------------------------------------- the schema
def result_entry(value: Any, *, reason: str = "not computed", status: str = "ok",
                 **fields: Any) -> dict[str, Any]:
    """One entry of a summary's ``results``: :class:`AuditResult`'s fields when ``value`` is a
    finite number (``fields``: its other fields), else ``{"status": "skipped: <reason>"}``
    (a missing number is never written as a 0 that reads as a measurement)."""
    if isinstance(value, AuditResult):
        return {**value.to_dict(), "status": value.status if status == "ok" else status}
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        return {"status": f"skipped: {reason}"}
    return {**AuditResult(value=float(value), status=status, **fields).to_dict()}


def summary_document(audit: str, *, run_status: str, status: str, source: str,
                     inputs: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]],
                     **extra: Any) -> dict[str, Any]:
    """A summary in the one schema (:data:`SCHEMA`): the schema's keys first, then ``extra``
    (the audit's own keys, kept where users read them)."""
    doc = {"schema": SCHEMA, "audit": audit, "callback": audit, "run_status": run_status,
           "status": status, "source": source, "inputs": dict(inputs), "results": dict(results)}
    for key, value in extra.items():
        if key in doc:
            raise ValueError(f"summary_document: {key!r} is a key of the schema")
        doc[key] = value
    return doc


def validate_summary(doc: Mapping[str, Any]) -> None:
    """Check ``doc`` against the one summary schema.

    Raises:
        ValueError: naming the first key missing or of the wrong type, another schema, a
            result not named in :mod:`audit_callbacks.names`, or a result without a ``status``
            or with a ``value`` that is not a finite number.
    """
    for key, kind in REQUIRED_KEYS.items():
        if key not in doc:
            raise ValueError(f"summary: the key {key!r} is missing")
        if not isinstance(doc[key], kind):
            raise ValueError(f"summary: {key!r} must be a {kind}, got {type(doc[key]).__name__}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"summary: schema {doc['schema']!r}, expected {SCHEMA!r}")
    for name, entry in doc["results"].items():
        if name not in _KNOWN_NAMES:
            raise ValueError(f"summary: result {name!r} is not a name of audit_callbacks.names")
        if not isinstance(entry, Mapping) or not isinstance(entry.get("status"), str):
            raise ValueError(f"summary: result {name!r} has no status")
        unknown = set(entry) - set(RESULT_FIELDS) - {"status"}
        if unknown:
            raise ValueError(f"summary: result {name!r} has unknown fields {sorted(unknown)}")
        if "value" in entry:
            v = entry["value"]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"summary: result {name!r} has value {v!r}, not a finite number")


# ---------------------------------------------------------------------------- report sections
@dataclass
class ReportSection:
    """One audit's part of the report.

    Attributes:
        title: the section's heading.
        values: ``{key: value}`` shown as a table.
        summary: the canary audit's summary (the verdicts, headline numbers and every estimate
            are rendered from it); None for the other audits.
        figures: ``{title: matplotlib Figure}`` (HTML only).
        history: the canary estimates over training (``(step, all_iterates, analytic,
            final_model)`` rows).
    """

    title: str
    values: dict[str, Any] = field(default_factory=dict)
    summary: Mapping[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    history: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------------------- the run
class AuditRun:
    """What the outputs of one run share: the folder, the registered audits and the report.

    A framework's run (Lightning's: :class:`audit_callbacks.callbacks.summary.LightningRun`)
    overrides :attr:`directory`, :attr:`writes` and :meth:`publish`.

    Args:
        directory: the run's folder (None: no file is written).
    """

    def __init__(self, directory: str | None = None) -> None:
        self._directory = directory
        self.outputs: list[AuditOutput] = []
        self.finished: set[int] = set()
        self.report_paths: tuple[str, str] | None = None

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (False off rank zero)."""
        return True

    @property
    def directory(self) -> str | None:
        return self._directory

    def publish(self, paths: tuple[str, str]) -> None:
        """Hand the written report to the run's loggers (none here)."""

    def register(self, output: AuditOutput) -> None:
        """Add ``output`` to the run's audits (once); it is not finished until it says so.

        Raises:
            ValueError: (at the audit's setup, nothing written yet) ``output`` would write the
                summary file another audit of the run writes (naming ``summary_filename``), or
                both are canary audits (:attr:`AuditOutput.one_per_run`: their TensorBoard tags
                and report section are the run's one canary audit's).
        """
        if all(o is not output for o in self.outputs):
            self._check_joins(output)
            self.outputs.append(output)
        self.finished.discard(id(output))

    def _check_joins(self, output: AuditOutput) -> None:
        """Refuse ``output`` where it would overwrite what an audit of the run writes."""
        mine = _same_file(output.summary_filename)
        for other in self.outputs:
            if mine is not None and mine == _same_file(other.summary_filename):
                raise ValueError(
                    f"summary_filename {output.summary_filename!r}: {output.audit} would write the summary "
                    f"file {other.audit} of the same run writes (one Trainer's callbacks share one run "
                    "folder); give each audit its own summary_filename")
            if output.one_per_run and other.one_per_run:
                raise ValueError(
                    f"{output.audit}: the run already has a canary audit ({other.audit}); one canary "
                    "audit per run (a second would write the same TensorBoard tags at the same steps, and "
                    "the report has one canary section): use one audit with more canaries, or another run")

    def sections(self) -> list[ReportSection]:
        """Every registered audit's section (the canary audits' first), in registration order."""
        got = [s for s in (o.section() for o in self.outputs) if s is not None]
        return sorted(got, key=lambda s: s.summary is None)

    def finish(self, output: AuditOutput) -> tuple[str, str] | None:
        """``output`` has written its summary; when it was the last registered audit to, write
        the report (and hand it to the loggers). Returns the report's paths, or None."""
        self.register(output)
        self.finished.add(id(output))
        if any(id(o) not in self.finished for o in self.outputs):
            return None
        return self.write_report(output.warn)

    def write_report(self, warn: Callable[[str, str], None]) -> tuple[str, str] | None:
        """``audit_report.html`` and ``.md`` in the run's folder, with every audit's section;
        None (nothing written) when no audit has a section or off rank zero; a failure is
        warned about (``warn(key, message)``)."""
        sections = self.sections()
        if not sections or not self.writes:
            return None
        from audit_callbacks.auditing.html_report import write_report

        canary = next((s for s in sections if s.summary is not None), None)
        try:
            if self.directory is None:  # resolving the run's folder claims it: may fail too
                return None
            self.report_paths = write_report(
                canary.summary if canary is not None else None, self.directory,
                figures=canary.figures if canary is not None else None,
                history=canary.history if canary is not None else None,
                extra={s.title: s.values for s in sections if s is not canary})
        except (OSError, ValueError) as err:
            warn("report", f"the audit report could not be written ({err})")
            return None
        self.publish(self.report_paths)
        return self.report_paths


def _same_file(name: str | None) -> str | None:
    """A summary name as a path in the run's folder, for comparing two (None: no file)."""
    return None if not name else os.path.normcase(os.path.normpath(name))


# ---------------------------------------------------------------------------- one audit's output
def _default_emit(message: str, category: type[Warning] = UserWarning) -> None:
    warnings.warn(message, category, stacklevel=3)


def default_info(message: str) -> None:
    """A line of information for the person running the training (the plan, the report's
    path): to standard error, where a terminal shows it whether or not logging is set up; in a
    ``torch.distributed`` job, from rank zero only (as Lightning's ``rank_zero_info``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    print(message, file=sys.stderr, flush=True)


class AuditOutput:
    """One audit's output path, composed by its front end.

    Args:
        audit: the front end's name (the summary's ``audit``, e.g. ``"LabelDPLowerBound"``).
        summary_filename: the summary's file in the run's folder (None: no summary).
        emit: how a warning is given, ``emit(message)`` (``rank_zero_warn`` for a Lightning
            callback; default ``warnings.warn``), or ``emit(message, category)`` where the
            front end warns with its own categories.
        section: the audit's report section now (None: nothing to report yet).
        text_tag: where a warning is also written as TensorBoard text (None: nowhere).
        info: how a line of information is given, ``info(message)`` (the report's path;
            Lightning's ``rank_zero_info``, Flower's logger; default :func:`default_info`).
    """

    def __init__(self, audit: str, summary_filename: str | None = None, *,
                 emit: Callable[[str], None] | None = None,
                 section: Callable[[], ReportSection | None] | None = None,
                 text_tag: str | None = None, info: Callable[[str], None] | None = None) -> None:
        self.audit = audit
        self.summary_filename = summary_filename  # checked (ValueError naming it)
        self._emit = emit or _default_emit
        self.info = info or default_info
        self._section = section
        self.text_tag = text_tag
        self.warned: set[str] = set()
        #: a canary audit's: a run has at most one (:meth:`AuditRun.register`)
        self.one_per_run = False
        self.run: AuditRun | None = None
        self._sink: Any = None
        self.summary_path: str | None = None

    @property
    def summary_filename(self) -> str | None:
        """The summary's file in the run's folder (None: no summary)."""
        return self._summary_filename

    @summary_filename.setter
    def summary_filename(self, value: str | None) -> None:
        """Raises ``ValueError`` naming ``summary_filename`` for anything but None or a path
        inside the run's folder (:func:`~audit_callbacks.validation.check_summary_filename`)."""
        self._summary_filename = check_summary_filename(value)

    # ------------------------------------------------------------------ binding
    def bind_directory(self, directory: str | None, sink: Any = None,
                       run: AuditRun | None = None) -> AuditOutput:
        """Write into ``directory`` (None: no file) through ``sink`` (a
        :class:`~audit_callbacks.auditing.sinks.WriterSink`, or any report sink), as one audit
        of ``run`` (default: a run of its own in that folder)."""
        self.run = run if run is not None else AuditRun(directory)
        self.run.register(self)
        self._sink = sink
        return self

    @property
    def sink(self) -> Any:
        """Where scalars, histograms, figures, text and the layout go: the one bound (a
        ``WriterSink(None)``, writing nothing, when none is)."""
        if self._sink is None:
            from audit_callbacks.auditing.sinks import WriterSink

            self._sink = WriterSink(None)
        return self._sink

    @property
    def step(self) -> int:
        """The training's step now (for the text of a warning)."""
        return 0

    @property
    def directory(self) -> str | None:
        """The run's folder (None off rank zero or without one)."""
        return None if self.run is None or not self.run.writes else self.run.directory

    def section(self) -> ReportSection | None:
        """The audit's report section now (from the provider it was made with)."""
        if self._section is None:
            return None
        try:
            return self._section()
        except Exception as err:  # noqa: BLE001 - a section's failure never loses the report
            self.warn("section", f"{self.audit}: its report section failed ({type(err).__name__}: {err})")
            return None

    # ------------------------------------------------------------------ warnings and sinks
    def warn(self, key: str, message: str, category: type[Warning] | None = None) -> None:
        """Warn once per ``key`` (and write it as TensorBoard text under ``text_tag``);
        ``category``, when given, is passed on to the front end's ``emit``."""
        if key in self.warned:
            return
        self.warned.add(key)
        if category is None:
            self._emit(message)
        else:
            self._emit(message, category)  # type: ignore[call-arg] - an emit that takes one
        if self.text_tag is not None and self.run is not None:
            text = getattr(self.sink, "text", None)
            if text is not None:
                self._write(text, {self.text_tag: f"[{key}] {message}"}, self.step)

    def scalars(self, values: Mapping[str, float | None], step: int) -> None:
        """Scalars through the sink (None and NaN dropped)."""
        self._write(self.sink.scalars, dict(values), step)

    def text(self, values: Mapping[str, str], step: int) -> None:
        """TensorBoard text through the sink, where it takes text (guarded like every write)."""
        write = getattr(self.sink, "text", None)
        if write is not None:
            self._write(write, dict(values), step)

    def layout(self, layout: Mapping[str, Any]) -> None:
        """The audit's TensorBoard custom-scalars layout through the sink (guarded like every
        write)."""
        self._write(self.sink.layout, dict(layout))

    def _write(self, write: Callable[..., None], *args: Any) -> None:
        """Call a sink's or logger's ``write(*args)``: any failure (a full disk, a read-only
        folder, a logger whose server is gone) is warned about once and never stops the
        training; the summary JSON still goes to the run's folder."""
        try:
            write(*args)
        except Exception as err:  # noqa: BLE001 - a logger's failure never stops the fit
            self.warn("sink", f"{self.audit}: a TensorBoard / logger write failed ({type(err).__name__}: "
                      f"{err}); the summary JSON still holds every number")

    # ------------------------------------------------------------------ the summary
    def write_summary(self, summary: Mapping[str, Any] | None) -> str | None:
        """Write ``summary`` (checked against the schema) atomically into the run's folder.

        Returns:
            The summary's path; None when none was written (``summary`` None, no file name,
            no folder, off rank zero, or the write failed: warned).
        """
        if summary is None or not self.summary_filename:
            return None
        from audit_callbacks.auditing.files import write_summary

        try:
            directory = self.directory  # resolving the run's folder claims it: may fail too
            if directory is None:
                return None
            validate_summary(summary)
            path = write_summary(directory, self.summary_filename, summary)
        except (OSError, ValueError, TypeError) as err:
            self.warn(f"write:{err}", f"{self.audit}: the summary could not be written ({err})")
            return None
        self.summary_path = path
        return path

    def done(self, status: str = "complete") -> tuple[str, str] | None:
        """This audit has finished: at a complete end, the run's report is written once every
        registered audit has (an interrupted run writes no report). Returns its paths, or
        None."""
        if self.run is None or status != "complete":
            return None
        paths = self.run.finish(self)
        if paths is not None:  # written now (rank zero only): say where, once
            self.info(f"audit report: {paths[0]}")
        return paths

    def finish(self, summary: Mapping[str, Any] | None, status: str = "complete") -> str | None:
        """:meth:`write_summary` then :meth:`done`: a front end's end (fit end, or a signal's
        ``interrupted at step N``). Returns the summary's path."""
        path = self.write_summary(summary)
        self.done(status)
        return path

    @property
    def report_paths(self) -> tuple[str, str] | None:
        """The run's report ``(html, markdown)`` once written."""
        return None if self.run is None else self.run.report_paths
