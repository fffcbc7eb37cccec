"""TensorBoard extras for the audit callbacks: custom-scalars layout, histograms, figures.

Everything here is a no-op unless a ``TensorBoardLogger`` (``lightning.pytorch`` or
``pytorch_lightning``) is attached, and runs on rank zero only. Plain scalars go through every
attached logger (see :func:`log_scalars`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np

from audit_callbacks._lightning import is_tensorboard_logger

__all__ = [
    "tensorboard_writer", "log_scalars", "add_custom_scalars_layout", "histogram_summaries",
    "histogram_bins", "add_summaries", "add_density_figure", "add_canary_figures", "log_dir",
]


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
    clean = {k: float(v) for k, v in metrics.items() if v is not None and not np.isnan(v)}
    if not clean or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


def add_custom_scalars_layout(trainer: pl.Trainer, layout: dict[str, dict[str, Sequence]]) -> None:
    """Write a custom-scalars layout ``{category: {chart: ["Multiline", [tags]]}}``."""
    writer = tensorboard_writer(trainer)
    if writer is not None:
        writer.add_custom_scalars(layout)


def histogram_summaries(values: Mapping[str, np.ndarray], bins: Sequence[float]) -> list[Any]:
    """TensorBoard histogram summaries of the non-empty finite arrays, one tag each.

    ``bins``: the bucket edges, e.g. the writer's ``default_bins`` (what ``add_histogram(...,
    bins="tensorflow")`` uses, see :func:`histogram_bins`). Pure computation: runs on any thread,
    so a background estimate builds them there and the training thread only writes them
    (:func:`add_summaries`).
    """
    from torch.utils.tensorboard.summary import histogram

    out = []
    for tag, arr in values.items():
        arr = np.asarray(arr, dtype=np.float64)
        arr = arr[np.isfinite(arr)]
        if arr.size:
            out.append(histogram(tag, arr, bins))
    return out


def histogram_bins(trainer: pl.Trainer) -> list[float] | None:
    """The TensorBoard writer's default histogram buckets, or None without a TensorBoard logger."""
    writer = tensorboard_writer(trainer)
    return None if writer is None else list(writer.default_bins)


def add_summaries(trainer: pl.Trainer, summaries: Sequence[Any], step: int) -> None:
    """Write prepared summaries (e.g. :func:`histogram_summaries`) at ``step``."""
    writer = tensorboard_writer(trainer)
    if writer is None or not summaries:
        return
    file_writer = writer._get_file_writer()  # what SummaryWriter.add_histogram writes through
    for summary in summaries:
        file_writer.add_summary(summary, step)


def add_density_figure(
    trainer: pl.Trainer, tag: str, samples: Mapping[str, np.ndarray], step: int, *,
    title: str = "", null_pdf: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """A density plot of several samples (Andrew et al. 2024 Figure 1 style), as a TensorBoard figure.

    Args:
        samples: ``{label: values}``; each drawn as a normalised histogram outline.
        null_pdf: optional ``(t, pdf)`` of the exact null drawn as a line.
    """
    writer = tensorboard_writer(trainer)
    if writer is None:
        return
    fig = density_figure(samples, title=title, null_pdf=null_pdf)
    writer.add_figure(tag, fig, global_step=step, close=True)


def density_figure(
    samples: Mapping[str, np.ndarray], *, title: str = "",
    null_pdf: tuple[np.ndarray, np.ndarray] | None = None,
) -> Any:
    """The matplotlib figure behind :func:`add_density_figure` (Agg backend, not shown).

    Kept light, as it is drawn in the training run: each sample is one ``np.histogram`` drawn as
    a step outline (``stairs``), at most 5 ticks an axis, fixed margins instead of
    ``tight_layout`` (which draws the whole figure once more), the legend in a fixed corner
    (``loc="best"`` searches the data for a place) and the title as figure text (an axes title
    is positioned against the tick labels at every draw).
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 3.5))
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.14, top=0.9 if title else 0.96)
    ax = fig.add_subplot(1, 1, 1)
    finite = {label: np.asarray(v, float) for label, v in samples.items()}
    finite = {label: v[np.isfinite(v)] for label, v in finite.items()}
    finite = {label: v for label, v in finite.items() if v.size}
    if finite:
        lo = min(v.min() for v in finite.values())
        hi = max(v.max() for v in finite.values())
        if null_pdf is not None:
            lo, hi = min(lo, float(null_pdf[0].min())), max(hi, float(null_pdf[0].max()))
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-6, 50)
        for label, vals in finite.items():
            density, _ = np.histogram(vals, bins=bins, density=True)
            ax.stairs(density, bins, linewidth=1.5, label=label)
    if null_pdf is not None:
        ax.plot(null_pdf[0], null_pdf[1], "k--", linewidth=1, label="null (exact)")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlabel("cosine")
    ax.set_ylabel("density")
    if title:
        fig.text(0.5, 0.985, title, ha="center", va="top")
    ax.legend(loc="upper left", fontsize="small", frameon=False)
    return fig


def add_canary_figures(
    trainer: pl.Trainer, statistics: Mapping[str, np.ndarray], dim: int, *, exact_null: bool,
    step: int,
) -> None:
    """Densities of observed and unobserved canary cosines for both threat models (as Andrew
    et al., ICLR 2024, Figure 1), with the exact null of a random direction when the canaries
    are uniform on the sphere (``exact_null``)."""
    if tensorboard_writer(trainer) is None:
        return
    from audit_callbacks.estimators.canary_report import cosine_null_pdf

    null = None
    if exact_null:
        grid = np.linspace(-5, 5, 200) / np.sqrt(dim)
        null = (grid, cosine_null_pdf(grid, dim))
    add_density_figure(
        trainer, "audit/cosine_density_final_model",
        {"observed canaries": statistics["final_observed"],
         "unobserved canaries": statistics["final_unobserved"]},
        step, title="final model: canary cosines", null_pdf=null,
    )
    if np.size(statistics["all_observed"]):
        add_density_figure(
            trainer, "audit/cosine_density_all_iterates",
            {"observed (max over rounds)": statistics["all_observed"],
             "unobserved (max over rounds)": statistics["all_unobserved"]},
            step, title="all iterates: max cosine over rounds",
        )
