"""The run's own folder of a Lightning run, where every audit writes its summary at fit end,
and the report handed to the run's loggers.

The callbacks reach both through their :class:`~audit_callbacks.auditing.output.AuditOutput`;
the JSON itself is written atomically by :func:`audit_callbacks.auditing.files.write_summary`.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from audit_callbacks.auditing.files import (
    check_writable,
    claim_dir,
    fresh_version_dir,
    to_jsonable,
    versions,
    write_summary,
)
from audit_callbacks.auditing.output import AuditOutput, AuditRun
from audit_callbacks.callbacks.interrupt import failed_status, on_interrupt
from audit_callbacks.callbacks.tensorboard import LightningSink, log_scalars
from audit_callbacks.validation import check_summary_filename

__all__ = ["LightningOutput", "LightningRun", "publish_report", "diverted", "run_dir", "summary_dir", "to_jsonable", "versions",
           "write_summary"]

# Trainer -> the fresh folder of a run without a logger: every callback of one run writes there.
_RUN_DIRS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# The run folders this process has used -> the Trainer that took each (a weak reference): a
# second Trainer of this process gets a sibling folder.
_OWNERS: dict[str, weakref.ref[Any]] = {}
# The Trainers whose audits write to a folder other than their logger's (see run_dir).
_DIVERTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _owned_by_another(path: str, trainer: Any) -> bool:
    """Whether another Trainer of this process took ``path`` (also one that is gone now: its
    files are there)."""
    owner = _OWNERS.get(os.path.realpath(path))
    return owner is not None and owner() is not trainer


def run_dir(trainer: Any) -> str:
    """The run's own folder: the first logger's ``log_dir`` (Lightning's versioned folder),
    else a fresh ``default_root_dir/audit/version_N`` (N one more than the largest there),
    chosen once per Trainer so that every callback of the run shares it.

    One folder, one owner: the folder is claimed for this process
    (:func:`~audit_callbacks.auditing.files.claim_dir`) and for this Trainer within it. Where
    another process claimed it first (two runs that took the same automatic version, two
    processes resuming one checkpoint), or another Trainer of this process used it before (two
    fits into one logger version), the run's audit files (summaries, report and the audits'
    TensorBoard events) go to a fresh sibling ``version_N`` instead, with a warning: no run
    overwrites another's, and no (tag, step) is written twice. Only rank zero claims (the
    other ranks of a DDP run are other processes of the same run).
    """
    cached = _RUN_DIRS.get(trainer)
    if cached is not None:
        return cached
    path = next((str(p) for p in (getattr(lg, "log_dir", None) for lg in getattr(trainer, "loggers", None) or [])
                 if p), None)
    if path is None:
        path = fresh_version_dir(os.path.join(str(trainer.default_root_dir), "audit"))
    if getattr(trainer, "is_global_zero", True):  # rank zero writes
        if _owned_by_another(path, trainer):
            why = "another Trainer of this process wrote its audit files there"
        elif not claim_dir(path):
            why = "it is another run's (two runs took the same version)"
        else:
            why = ""
        if why:
            taken, path = path, fresh_version_dir(os.path.dirname(os.path.abspath(path)))
            claim_dir(path)
            _DIVERTED.add(trainer)
            warnings.warn(f"{taken}: {why}: this run's audit summaries, report and audit TensorBoard "
                          f"events go to {path}", UserWarning, stacklevel=2)
        _OWNERS[os.path.realpath(path)] = weakref.ref(trainer)
    _RUN_DIRS[trainer] = path
    return path


def diverted(trainer: Any) -> bool:
    """Whether ``trainer``'s audits write to a folder of their own, not their logger's
    (:func:`run_dir` found the logger's folder taken)."""
    try:
        return trainer in _DIVERTED
    except TypeError:
        return False


def summary_dir(trainer: Any, filename: str) -> str:
    """:func:`run_dir`, with the folder of ``filename`` (which may hold subfolders) created
    and checked writable.

    Raises:
        ValueError: ``filename`` is absolute or leaves the run folder, is an existing folder,
            or its folder cannot be created or written (called at fit start, so a bad path
            fails before any training).
    """
    filename = check_summary_filename(filename, optional=False)
    try:
        directory = run_dir(trainer)
    except OSError as err:
        raise ValueError(f"summary_filename {filename!r}: cannot create the run folder ({err})") from err
    check_writable(directory, filename)
    return directory


def publish_report(trainer: Any, paths: tuple[str, str] | None, summaries: Sequence[str] = ()) -> None:
    """Attach the audit report and the audits' summaries to the run's loggers where they take
    files: the report's Markdown as TensorBoard text (``audit/report``); the report (HTML and
    Markdown) and every summary JSON as artifacts of the run of a ``MLFlowLogger``
    (``MlflowClient.log_artifact(run_id, path, artifact_path)``) or files of the run of a
    ``WandbLogger`` (``Run.save(path, base_path, policy="now")``), each under its path relative
    to the run's folder. A logger that fails to take them is warned about and skipped (the
    files are on disk in the run's folder).

    Args:
        trainer: the run's Trainer (only rank zero publishes).
        paths: the report's ``(html, markdown)``, or None (nothing is published).
        summaries: the audits' summary files (in the run's folder, as the report).
    """
    if not paths or not getattr(trainer, "is_global_zero", True):
        return
    html, markdown = paths
    base = os.path.dirname(os.path.abspath(html))
    files = [*paths, *(s for s in summaries if s and os.path.isfile(s))]
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__.lower()
        try:
            if "tensorboard" in kind:
                with open(markdown, encoding="utf-8") as fh:
                    logger.experiment.add_text("audit/report", fh.read(), int(trainer.global_step))
            elif "mlflow" in kind:
                for path in files:
                    folder = os.path.dirname(os.path.relpath(os.path.abspath(path), base))
                    logger.experiment.log_artifact(logger.run_id, path, folder or None)
            elif "wandb" in kind:
                for path in files:
                    logger.experiment.save(os.path.abspath(path), base_path=base, policy="now")
        except Exception as err:  # noqa: BLE001 - a logger's failure never loses the files or the fit
            warnings.warn(f"{type(logger).__name__} did not take the audit report and summaries "
                          f"({type(err).__name__}: {err}); they are in {base}", UserWarning, stacklevel=2)


# Trainer -> the audits of its run (every callback of one Trainer shares it).
_RUNS: weakref.WeakKeyDictionary[Any, LightningRun] = weakref.WeakKeyDictionary()


def _summary_filename(callback: Any) -> str | None:
    return callback.output.summary_filename


def _set_summary_filename(callback: Any, value: str | None) -> None:
    callback.output.summary_filename = value


#: A callback's ``summary_filename``, held by its ``output`` (a :class:`LightningOutput`): the
#: summary's file in the run's folder (None: none); set: ``ValueError`` naming
#: ``summary_filename`` unless None or a path inside the run's folder. A class attribute:
#: ``summary_filename = output_summary_filename``.
output_summary_filename = property(_summary_filename, _set_summary_filename,
                                   doc="The summary's file in the run's folder (None: none); set: "
                                       "ValueError naming summary_filename unless None or a path "
                                       "inside the run's folder.")


class LightningRun(AuditRun):
    """The audits of one Trainer: its run folder (:func:`run_dir`, chosen on first use), rank
    zero writes, and the report goes to its loggers (:func:`publish_report`)."""

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        self.trainer = trainer

    @classmethod
    def of(cls, trainer: Any) -> LightningRun:
        """The run of ``trainer`` (one per Trainer, shared by every callback)."""
        try:
            run = _RUNS.get(trainer)
            if run is None:
                run = _RUNS[trainer] = cls(trainer)
        except TypeError:  # a stand-in that takes no weak reference: a run of its own
            run = cls(trainer)
        return run

    @property
    def writes(self) -> bool:
        return bool(getattr(self.trainer, "is_global_zero", True))

    @property
    def directory(self) -> str | None:
        if self._directory is None:
            self._directory = run_dir(self.trainer)
        return self._directory

    def publish(self, paths: tuple[str, str]) -> None:
        publish_report(self.trainer, paths, [o.summary_path for o in self.outputs if o.summary_path])


class LightningOutput(AuditOutput):
    """A Lightning callback's output path: bound to the Trainer's run at fit start; scalars
    through every logger, the rest through its ``TensorBoardLogger``
    (:class:`~audit_callbacks.callbacks.tensorboard.LightningSink`); warnings' text at the
    trainer's step."""

    @property
    def trainer(self) -> Any:
        return getattr(self.run, "trainer", None)

    def __getstate__(self) -> dict[str, Any]:
        """Without the run and its sink (a pickled or copied callback joins a run at its next
        fit start, as Lightning's spawned processes do)."""
        return {**self.__dict__, "run": None, "_sink": None}

    def bind(self, trainer: Any) -> LightningOutput:
        """Join ``trainer``'s run (at fit start; a repeated fit joins again, and a call for the
        trainer already bound only makes sure of it).

        Raises:
            ValueError: the run refuses it (:meth:`AuditRun.register`: another audit of this
                Trainer writes the same ``summary_filename``, or a second canary audit); it
                then stays unbound.
        """
        if self.trainer is not trainer:
            run = LightningRun.of(trainer)
            run.register(self)  # refused before anything is claimed or written
            self.run, self._sink = run, None
            try:  # the run's folder is chosen (and claimed) before its first write
                if self.summary_filename:
                    _ = self.directory
            except OSError as err:
                self.warn(f"folder:{err}", f"{self.audit}: the run's folder cannot be made ({err}); "
                          "training goes on, the summary is tried again at the end")
        assert self.run is not None
        self.run.register(self)
        return self

    # ------------------------------------------------------------------ the fit-end window
    def _mark(self) -> tuple[int, int]:
        return id(self.trainer), self.step

    def end_training(self, end: Callable[[], Any]) -> None:
        """A callback's ``on_train_end``: ``end()`` (the callback's fit end: the summary, and
        the report once every audit of the run has one) now. Lightning restores SIGTERM's
        default handler in its teardown, before ``on_fit_end``: a signal in that window kills
        the process at once, and keeps this summary (written atomically). The fit end then
        only refreshes it (:meth:`refreshing`)."""
        self._ended: tuple[int, int] | None = None
        end()
        self._ended = self._mark()

    def refreshing(self, status: str = "complete") -> bool:
        """Whether this complete end only refreshes the summary written at ``on_train_end`` of
        this fit (the same Trainer and step; the report is not written again). True once: the
        fit end that asks takes it, and a later end is a whole one again."""
        if status != "complete" or getattr(self, "_ended", None) != self._mark():
            return False
        self._ended = None
        return True

    def done(self, status: str = "complete") -> tuple[str, str] | None:
        if self.refreshing(status):
            return None
        return super().done(status)

    def finish(self, summary: Mapping[str, Any] | None, status: str = "complete") -> str | None:
        """:meth:`AuditOutput.finish`; at the fit end after :meth:`end_training`, only the
        summary is written again."""
        if self.refreshing(status):
            return self.write_summary(summary)
        return super().finish(summary, status)

    @property
    def sink(self) -> Any:
        if self._sink is None and self.trainer is not None:
            self._sink = LightningSink(self.trainer)
        return super().sink

    @property
    def step(self) -> int:
        return int(getattr(self.trainer, "global_step", 0))

    def scalars(self, values: Mapping[str, float | None], step: int) -> None:
        """Through every logger of the Trainer (rank zero; as ``LearningRateMonitor`` does)."""
        if self.trainer is None:
            return super().scalars(values, step)
        self._write(log_scalars, self.trainer, dict(values), step)

    def on_exception(self, trainer: Any, exception: BaseException, finish: Callable[[str], Any]) -> bool:
        """A callback's ``on_exception``: on SIGTERM / SIGINT, ``finish(status)``
        (``interrupted at step N``) and an exit code that is not 0
        (:func:`audit_callbacks.callbacks.interrupt.on_interrupt`). Any other exception
        after training steps were taken (a logger that died, a failing hook) writes the
        summary of what was measured, ``failed at step N (<exception>)``, into the run's
        folder, and is left to propagate; an error in that write is only warned about. An
        exception in another stage (``trainer.validate`` / ``trainer.test`` after the fit) leaves
        the fit's outputs alone."""
        state = getattr(trainer, "state", None)
        if state is not None and getattr(state, "fn", "fit") != "fit":
            return False
        if on_interrupt(trainer, exception, finish):
            return True
        if int(getattr(trainer, "global_step", 0)) > 0:
            try:
                finish(failed_status(trainer, exception))
            except Exception as err:  # noqa: BLE001 - the fit's own exception goes on
                self.warn("failed", f"{self.audit}: the summary could not be written after "
                          f"{type(exception).__name__} ({type(err).__name__}: {err})")
        return False
