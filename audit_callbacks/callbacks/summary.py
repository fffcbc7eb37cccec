"""The run's own folder of a Lightning run, where every audit writes its summary at fit end,
and the report handed to the run's loggers.

The callbacks reach both through their :class:`~audit_callbacks.auditing.output.AuditOutput`;
the JSON itself is written atomically by :func:`audit_callbacks.auditing.files.write_summary`.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Mapping
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
from audit_callbacks.callbacks.interrupt import on_interrupt
from audit_callbacks.callbacks.tensorboard import LightningSink, log_scalars

__all__ = ["LightningOutput", "LightningRun", "publish_report", "run_dir", "summary_dir", "to_jsonable", "versions",
           "write_summary"]

# Trainer -> the fresh folder of a run without a logger: every callback of one run writes there.
_RUN_DIRS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def run_dir(trainer: Any) -> str:
    """The run's own folder: the first logger's ``log_dir`` (Lightning's versioned folder),
    else a fresh ``default_root_dir/audit/version_N`` (N one more than the largest there),
    chosen once per Trainer so that every callback of the run shares it.

    The folder is claimed for this process (:func:`~audit_callbacks.auditing.files.claim_dir`). Where
    another process claimed it first (two runs that took the same automatic version, two
    processes resuming one checkpoint), the run's summaries go to a fresh sibling
    ``version_N`` instead, with a warning: no run overwrites another's. Only rank zero claims
    (the other ranks of a DDP run are other processes of the same run).
    """
    cached = _RUN_DIRS.get(trainer)
    if cached is not None:
        return cached
    path = next((str(p) for p in (getattr(lg, "log_dir", None) for lg in getattr(trainer, "loggers", None) or [])
                 if p), None)
    if path is None:
        path = fresh_version_dir(os.path.join(str(trainer.default_root_dir), "audit"))
    if getattr(trainer, "is_global_zero", True) and not claim_dir(path):  # rank zero writes
        taken, path = path, fresh_version_dir(os.path.dirname(os.path.abspath(path)))
        claim_dir(path)
        warnings.warn(f"{taken} is another run's (two runs took the same version): this run's audit "
                      f"summaries go to {path}", UserWarning, stacklevel=2)
    _RUN_DIRS[trainer] = path
    return path


def summary_dir(trainer: Any, filename: str) -> str:
    """:func:`run_dir`, with the folder of ``filename`` (which may hold subfolders) created
    and checked writable.

    Raises:
        ValueError: ``filename`` is absolute or leaves the run folder, is an existing folder,
            or its folder cannot be created or written (called at fit start, so a bad path
            fails before any training).
    """
    if os.path.isabs(filename) or os.path.normpath(filename).startswith(".."):
        raise ValueError(f"summary_filename must be a path inside the run folder, got {filename!r}")
    try:
        directory = run_dir(trainer)
    except OSError as err:
        raise ValueError(f"summary_filename {filename!r}: cannot create the run folder ({err})") from err
    check_writable(directory, filename)
    return directory


def publish_report(trainer: Any, paths: tuple[str, str] | None) -> None:
    """Attach the audit report to the run's loggers where they take it: the Markdown as
    TensorBoard text (``audit/report``), both files as MLflow artifacts or W&B files. A logger
    that fails to take it is skipped (the files are on disk next to the summary)."""
    if not paths or not getattr(trainer, "is_global_zero", True):
        return
    html, markdown = paths
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__.lower()
        try:
            if "tensorboard" in kind:
                with open(markdown, encoding="utf-8") as fh:
                    logger.experiment.add_text("audit/report", fh.read(), int(trainer.global_step))
            elif "mlflow" in kind:
                for path in paths:
                    logger.experiment.log_artifact(logger.run_id, path)
            elif "wandb" in kind:
                for path in paths:
                    logger.experiment.save(path, base_path=os.path.dirname(html), policy="now")
        except Exception:  # noqa: BLE001 - a logger's failure never loses the files or the fit
            continue


# Trainer -> the audits of its run (every callback of one Trainer shares it).
_RUNS: weakref.WeakKeyDictionary[Any, LightningRun] = weakref.WeakKeyDictionary()


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
        publish_report(self.trainer, paths)


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
        trainer already bound only makes sure of it)."""
        if self.trainer is not trainer:
            self.run = LightningRun.of(trainer)
            self._sink = None
        assert self.run is not None
        self.run.register(self)
        return self

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
        (:func:`audit_callbacks.callbacks.interrupt.on_interrupt`)."""
        return on_interrupt(trainer, exception, finish)
