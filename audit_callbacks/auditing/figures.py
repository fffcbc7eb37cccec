"""Density figures of canary scores (as Andrew et al., ICLR 2024, Figure 1), drawn with
matplotlib's Agg backend; no Lightning, no Flower.

A figure is rendered once (:func:`render_figure`): the pixels and their PNG are kept with the
figure until it changes, so the TensorBoard image (:class:`~audit_callbacks.auditing.sinks.
WriterSink`, which writes that PNG into the event as it is) and the HTML report
(:mod:`~audit_callbacks.auditing.html_report`) of the same figure share one drawing and one
PNG encoding.

Drawing is most of a fit end's fixed cost: matplotlib's text layout is ~0.5-1 ms a
text artist and a tick ~0.5 ms more, so the figures keep few ticks, make none outside the
view (:class:`InViewLocator`), draw no mathtext, and place titles and legends without a search.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib.ticker import Locator, NullLocator

__all__ = ["InViewLocator", "RenderedFigure", "canary_figures", "decade_label", "density_figure",
           "figure_png", "in_view_ticks", "render_figure", "roc_figure"]

#: Resolution of the figures drawn here (dots per inch): fixed, whatever the matplotlibrc.
DPI = 100

#: zlib level of the figures' PNG (1: fastest; 6, PIL's default, takes ~1.5x the time for
#: files ~6% smaller).
PNG_COMPRESS_LEVEL = 1

#: FreeType hinting of the figures' text while they are drawn (matplotlib's ``text.hinting``):
#: "no_hinting" draws each glyph in ~60% of the time of the default's hinting (a figure's text
#: is most of its drawing, ~1/5 of it saved) for glyphs a pixel's fraction softer.
TEXT_HINTING = "no_hinting"

# attribute of a matplotlib Figure holding its last rendering (see render_figure)
_RENDERED = "_audit_callbacks_rendered"


@dataclass(frozen=True)
class RenderedFigure:
    """One rendering of a figure: ``rgba`` ``[H, W, 4]`` uint8 pixels (H, W: the figure's size
    in inches times its dpi) and ``png``, the same pixels as PNG bytes."""

    rgba: np.ndarray
    png: bytes


def render_figure(fig: Any) -> RenderedFigure:
    """Draw a matplotlib figure once with the Agg backend at its own dpi (its text with
    :data:`TEXT_HINTING`, the global ``text.hinting`` restored after) and encode it as PNG
    with PIL, or return the rendering made before if the figure has not changed
    since (matplotlib marks a figure ``stale`` whenever one of its artists changes, and draws
    clear it).

    Args:
        fig: a ``matplotlib.figure.Figure`` (one closed by a sink included: it is given a
            new Agg canvas).

    Returns:
        :class:`RenderedFigure`; the same object on every call until the figure changes.

    Raises:
        ValueError: ``fig`` is not a matplotlib Figure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    cached = getattr(fig, _RENDERED, None)
    if cached is not None and not fig.stale:
        return cached
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    with matplotlib.rc_context({"text.hinting": TEXT_HINTING}):  # read at each text drawn
        canvas.draw()
    rgba = np.array(canvas.buffer_rgba(), dtype=np.uint8)  # a copy: the buffer is reused
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="png", dpi=(fig.dpi, fig.dpi),
                                       compress_level=PNG_COMPRESS_LEVEL)
    out = RenderedFigure(rgba=rgba, png=buf.getvalue())
    setattr(fig, _RENDERED, out)
    return out


def figure_png(fig: Any) -> bytes:
    """The figure as PNG bytes, from :func:`render_figure` (drawn at most once)."""
    return render_figure(fig).png


def in_view_ticks(ax: Any) -> None:
    """Give both axes of ``ax`` their major and minor locators' ticks inside the view only
    (:class:`InViewLocator`): the same ticks drawn, none made only to be skipped."""
    for axis in (ax.xaxis, ax.yaxis):
        if not isinstance(axis.get_major_locator(), InViewLocator):
            axis.set_major_locator(InViewLocator(axis.get_major_locator()))
        if not isinstance(axis.get_minor_locator(), (InViewLocator, NullLocator)):
            axis.set_minor_locator(InViewLocator(axis.get_minor_locator()))


class InViewLocator(Locator):
    """A matplotlib locator giving ``base``'s ticks inside the axis' view interval only
    (inclusive, with matplotlib's tolerance of 1e-10 of the interval, in the axis' scale):
    exactly the ticks the axis draws. Locators add a tick beyond each end of the view, and the
    axis makes a ``Tick`` (five artists) and a formatted label for each before it skips them
    at drawing: about 1 ms a figure. Autoscaling (``nonsingular``, ``view_limits``) and
    ``tick_values`` are ``base``'s.

    Raises:
        ValueError: ``base`` is not a matplotlib ``Locator``.
    """

    def __init__(self, base: Locator) -> None:
        if not isinstance(base, Locator):
            raise ValueError(f"base must be a matplotlib Locator, got {type(base).__name__}")
        self.base = base

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.base.set_axis(axis)

    def __call__(self) -> Any:
        locs = np.asarray(self.base(), dtype=float)
        if locs.size == 0 or self.axis is None:
            return locs
        transform = self.axis.get_transform()
        with np.errstate(invalid="ignore", divide="ignore"):  # a log scale maps <= 0 to nan
            lo, hi = np.sort(np.asarray(transform.transform(np.asarray(
                self.axis.get_view_interval(), dtype=float)), dtype=float))
            at = np.asarray(transform.transform(locs), dtype=float)
        tol = 1e-10 * (hi - lo)
        return locs[(at >= lo - tol) & (at <= hi + tol)]

    def tick_values(self, vmin: float, vmax: float) -> Any:
        return self.base.tick_values(vmin, vmax)

    def nonsingular(self, v0: float, v1: float) -> tuple[float, float]:
        return self.base.nonsingular(v0, v1)

    def view_limits(self, vmin: float, vmax: float) -> tuple[float, float]:
        return self.base.view_limits(vmin, vmax)


def density_figure(
    samples: Mapping[str, np.ndarray], *, title: str = "",
    null_pdf: tuple[np.ndarray, np.ndarray] | None = None,
) -> Any:
    """The matplotlib figure behind :func:`add_density_figure` (Agg backend, not shown).

    Kept light, as it is drawn in the training run: each sample is one ``np.histogram`` drawn as
    a step outline (the line ``stairs`` draws, as a ``Line2D``), at most 5 ticks an axis and
    none outside the view (:func:`in_view_ticks`), fixed margins instead of
    ``tight_layout`` (which draws the whole figure once more), the legend in a fixed corner
    (``loc="best"`` searches the data for a place) and the title as figure text (an axes title
    is positioned against the tick labels at every draw).
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 3.5), dpi=DPI)
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
            # the outline ``ax.stairs`` draws (from the baseline 0 up, along the bins, back
            # down), as a Line2D: a StepPatch's data limits are found segment by segment in
            # Python (~4 ms a figure), a line's from its points
            (line,) = ax.plot(np.repeat(bins, 2), np.concatenate([[0.0], np.repeat(density, 2), [0.0]]),
                              linewidth=1.5, label=label)
            line.sticky_edges.y.append(0.0)  # as stairs: the density axis starts at 0
    if null_pdf is not None:
        ax.plot(null_pdf[0], null_pdf[1], "k--", linewidth=1, label="null (exact)")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    in_view_ticks(ax)
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
        title="final model: how far the inserted canaries lie from the never-inserted ones", null_pdf=null)}
    out["audit/roc_final_model"] = roc_figure(statistics["final_observed"], statistics["final_unobserved"])
    if np.size(statistics["all_observed"]):
        out["audit/cosine_density_all_iterates"] = density_figure(
            {"observed (max over rounds)": statistics["all_observed"],
             "unobserved (max over rounds)": statistics["all_unobserved"]},
            title="all iterates: each canary's largest cosine with a round's update")
    return out


def roc_figure(in_scores: np.ndarray, out_scores: np.ndarray, *, title: str = "") -> Any:
    """The ROC of the threshold attack "observed iff score > t" on log-log axes (Carlini et al.,
    IEEE S&P 2022, §4: the low-FPR region is what matters for privacy), with the diagonal of a
    blind guess.

    The staircase is drawn through the first point of each run of equal true positive rate
    and the last point (:func:`_step_corners`): the same line as through all k + k' + 1
    points, with at most k + 2 vertices. Ticks at the decades only (no minor ticks), labelled
    as plain text (:func:`decade_label`), as the density figures keep few ticks: tick artists
    and matplotlib's mathtext labels were most of the drawing's cost."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    ins = np.sort(np.asarray(in_scores, float)[np.isfinite(in_scores)])
    outs = np.sort(np.asarray(out_scores, float)[np.isfinite(out_scores)])
    fig = Figure(figsize=(4.5, 4), dpi=DPI)
    fig.subplots_adjust(left=0.16, right=0.96, bottom=0.14, top=0.88)
    ax = fig.add_subplot(1, 1, 1)
    if ins.size and outs.size:
        thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([ins, outs]))[::-1]])
        tpr = 1.0 - np.searchsorted(ins, thresholds, side="right") / ins.size
        fpr = 1.0 - np.searchsorted(outs, thresholds, side="right") / outs.size
        floor = 0.5 / max(ins.size, outs.size)
        x, y = np.maximum(fpr, floor), np.maximum(tpr, floor)
        keep = _step_corners(y)
        ax.step(x[keep], y[keep], where="post", label="attack")
        ax.plot([floor, 1], [floor, 1], "k--", linewidth=0.8, label="guess")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_locator(NullLocator())  # the ~50 minor ticks an axis: ~60% of the drawing
            axis.set_major_formatter(FuncFormatter(decade_label))  # no mathtext parsing
        in_view_ticks(ax)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    # two lines: the 4.5-inch figure is narrower than the sentence on one line (it was cut)
    fig.text(0.5, 0.985, title or "final model: how well the canaries' cosines\ntell inserted from never inserted",
             ha="center", va="top")
    ax.legend(loc="lower right", fontsize="small", frameon=False)
    return fig


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077"
                             "\u2078\u2079")


def decade_label(x: float, pos: int | None = None) -> str:
    """Tick label of a log axis: ``10⁻³`` (Unicode superscripts, no mathtext to parse) at a
    power of ten, empty elsewhere (a ``matplotlib.ticker.FuncFormatter`` function)."""
    if not x > 0 or not math.isfinite(x):
        return ""
    e = math.log10(x)
    return "10" + str(round(e)).translate(_SUPERSCRIPT) if abs(e - round(e)) < 1e-9 else ""


def _step_corners(y: np.ndarray) -> np.ndarray:
    """Indices of the vertices a ``where="post"`` staircase through (x_i, y_i) needs: the first
    and last point and the first point of each run of equal y. Between P_{i-1} and P_{i+1}
    with y_i = y_{i-1} the staircase runs along y = y_{i-1} from x_{i-1} to x_{i+1} and then
    up, through P_i or not, so dropping P_i changes no drawn segment.

    Args:
        y: ``[N]`` the staircase's y values (N >= 1).

    Returns:
        int64 indices, ascending.
    """
    keep = np.ones(y.size, dtype=bool)
    keep[1:-1] = y[1:-1] != y[:-2]
    return np.flatnonzero(keep)
