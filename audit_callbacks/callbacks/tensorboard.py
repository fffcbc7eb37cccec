"""TensorBoard output of the audit callbacks through a Lightning Trainer.

Extras (custom-scalars layout, histograms, figures) are a no-op unless a ``TensorBoardLogger``
(``lightning.pytorch`` or ``pytorch_lightning``) is attached, and run on rank zero only. Plain
scalars go through every attached logger (see :func:`log_scalars`). :class:`LightningSink` is
the canary auditor's sink (:class:`~audit_callbacks.auditing.ReportSink`) over a Trainer.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from audit_callbacks.auditing.sinks import WriterSink, clean_scalars
from audit_callbacks.compat.namespaces import is_tensorboard_logger

__all__ = ["LightningSink", "add_custom_scalars_layout", "log_dir", "log_scalars", "tensorboard_writer"]


def tensorboard_writer(trainer: pl.Trainer) -> Any | None:
    """The ``SummaryWriter`` of the first ``TensorBoardLogger`` (of either Lightning namespace),
    or None (also off rank zero)."""
    if not trainer.is_global_zero:
        return None
    for logger in trainer.loggers:
        if is_tensorboard_logger(logger):
            return logger.experiment
    return None


def log_dir(trainer: pl.Trainer) -> str:
    """Where a summary file goes: the run's own folder (:func:`~audit_callbacks.callbacks.
    summary.run_dir`: the logger's versioned folder, else a fresh ``audit/version_N``)."""
    from audit_callbacks.callbacks.summary import run_dir

    return run_dir(trainer)


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: int) -> None:
    """Log scalars through every attached logger (as ``LearningRateMonitor`` does); None and
    NaN are dropped, ``+inf`` (an infinite analytic epsilon) is kept."""
    clean = clean_scalars(dict(metrics))
    if not clean or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


# Trainer -> the Custom Scalars layout of every callback attached to it, merged: TensorBoard
# shows only the last layout written to a run, so each callback's layout is merged into this
# one and the whole is written again.
_LAYOUTS: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def add_custom_scalars_layout(trainer: pl.Trainer, layout: dict[str, dict[str, Sequence]],
                              writer: Any | None = None) -> None:
    """Merge a custom-scalars layout ``{section: {chart: ["Multiline", [tags]]}}`` into the
    run's (one dashboard for every attached callback) and write the merged layout (with
    ``writer``, default: the ``TensorBoardLogger``'s)."""
    writer = writer if writer is not None else tensorboard_writer(trainer)
    if writer is None:
        return
    merged = _LAYOUTS.setdefault(trainer, {})
    for section, charts in layout.items():
        merged.setdefault(section, {}).update(charts)
    writer.add_custom_scalars(merged)


class LightningSink(WriterSink):
    """The canary auditor's sink over a Trainer: scalars through every attached logger at the
    given step, histograms, figures and the layout through its ``TensorBoardLogger`` (rank
    zero; nothing without one: then ``writes_images`` is False and no figure is built for it).
    A figure goes in as the PNG its one rendering encoded (:meth:`WriterSink.image`), the
    image the HTML report embeds.

    Where the run's folder is not its logger's (another Trainer or process used that one:
    :func:`~audit_callbacks.callbacks.summary.run_dir`), the audits' TensorBoard events go to
    a writer of the run's own folder instead, and their scalars to the other loggers, so no
    (tag, step) is written twice into one TensorBoard run."""

    def __init__(self, trainer: pl.Trainer) -> None:
        from audit_callbacks.callbacks.summary import diverted, run_dir

        writer = tensorboard_writer(trainer)
        self.own = writer is not None and diverted(trainer)
        if self.own:
            super().__init__(None, log_dir=run_dir(trainer))
        else:
            super().__init__(writer)
        self.trainer = trainer

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        """Through every logger, and into ``trainer.callback_metrics`` (so ``ModelCheckpoint``,
        ``EarlyStopping`` and the progress bar can use them)."""
        if self.own:
            WriterSink.scalars(self, values, step)
            clean = clean_scalars(dict(values))
            for logger in self.trainer.loggers if clean else ():
                if not is_tensorboard_logger(logger):
                    logger.log_metrics(clean, step=step)
        else:
            log_scalars(self.trainer, values, step)
        metrics = getattr(self.trainer, "callback_metrics", None)
        if isinstance(metrics, dict):
            metrics.update({k: torch.tensor(v) for k, v in clean_scalars(values).items()})

    def layout(self, layout: dict[str, dict[str, list[Any]]]) -> None:
        add_custom_scalars_layout(self.trainer, layout, self.writer if self.own else None)
