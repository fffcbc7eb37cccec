"""Density figures of canary scores (as Andrew et al., ICLR 2024, Figure 1), drawn with
matplotlib's Agg backend; no Lightning, no Flower."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["canary_figures", "density_figure", "roc_figure"]


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


def canary_figures(statistics: Mapping[str, np.ndarray], dim: int, *, exact_null: bool) -> dict[str, Any]:
    """``{tag: figure}``: densities of observed and unobserved canary cosines for both threat
    models, with the exact null of a random direction when the canaries are uniform on the
    sphere (``exact_null``; Andrew et al., ICLR 2024, §3)."""
    from audit_callbacks.estimators.canary_report import cosine_null_pdf

    null = None
    if exact_null:
        grid = np.linspace(-5, 5, 200) / np.sqrt(dim)
        null = (grid, cosine_null_pdf(grid, dim))
    out = {"audit/cosine_density_final_model": density_figure(
        {"observed canaries": statistics["final_observed"],
         "unobserved canaries": statistics["final_unobserved"]},
        title="final model: canary cosines", null_pdf=null)}
    out["audit/roc_final_model"] = roc_figure(statistics["final_observed"], statistics["final_unobserved"])
    if np.size(statistics["all_observed"]):
        out["audit/cosine_density_all_iterates"] = density_figure(
            {"observed (max over rounds)": statistics["all_observed"],
             "unobserved (max over rounds)": statistics["all_unobserved"]},
            title="all iterates: max cosine over rounds")
    return out


def roc_figure(in_scores: np.ndarray, out_scores: np.ndarray, *, title: str = "") -> Any:
    """The ROC of the threshold attack "observed iff score > t" on log-log axes (Carlini et al.,
    IEEE S&P 2022, §4: the low-FPR region is what matters for privacy), with the diagonal of a
    blind guess."""
    from matplotlib.figure import Figure

    ins = np.sort(np.asarray(in_scores, float)[np.isfinite(in_scores)])
    outs = np.sort(np.asarray(out_scores, float)[np.isfinite(out_scores)])
    fig = Figure(figsize=(4.5, 4))
    fig.subplots_adjust(left=0.16, right=0.96, bottom=0.14, top=0.9)
    ax = fig.add_subplot(1, 1, 1)
    if ins.size and outs.size:
        thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([ins, outs]))[::-1]])
        tpr = 1.0 - np.searchsorted(ins, thresholds, side="right") / ins.size
        fpr = 1.0 - np.searchsorted(outs, thresholds, side="right") / outs.size
        floor = 0.5 / max(ins.size, outs.size)
        ax.step(np.maximum(fpr, floor), np.maximum(tpr, floor), where="post", label="attack")
        ax.plot([floor, 1], [floor, 1], "k--", linewidth=0.8, label="guess")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    fig.text(0.5, 0.985, title or "final model: ROC of the canary attack", ha="center", va="top")
    ax.legend(loc="lower right", fontsize="small", frameon=False)
    return fig
