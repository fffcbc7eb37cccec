"""Report sinks without Lightning: a ``torch.utils.tensorboard.SummaryWriter``.

Lightning's sink (scalars through every attached logger, the rest through its
``TensorBoardLogger``) is :class:`audit_callbacks.callbacks.tensorboard.LightningSink`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from audit_callbacks import names
from audit_callbacks.auditing.files import check_writable, fresh_version_dir
from audit_callbacks.auditing.report import REFERENCE_TITLES, THREAT_MODEL_TITLES

__all__ = ["FIT_END_TAG", "WriterSink", "clean_scalars", "fit_end_table"]

#: The TensorBoard text tag of the fit-end numbers (:func:`fit_end_table`), beside the
#: report's text (``audit/report``) in the Text tab.
FIT_END_TAG = f"{names.FAMILY_AUDIT}/{names.FIT_END_NUMBERS}"



def clean_scalars(values: dict[str, float | None]) -> dict[str, float]:
    """Drop None and NaN; keep ``+inf`` (an infinite analytic epsilon)."""
    return {k: float(v) for k, v in values.items() if v is not None and not np.isnan(v)}


def _cell(value: Any) -> str:
    """A Markdown table cell: a number in the report's format, ``|`` escaped."""
    from audit_callbacks.auditing.report import fmt

    return fmt(value).replace("|", "\\|")


def fit_end_table(summary: Mapping[str, Any]) -> str:
    """The fit-end numbers of a canary audit's summary as one Markdown table, for TensorBoard's
    Text tab (its text plugin renders Markdown tables): per threat model (all iterates first,
    the one the claim is about) the estimate with its interval, the valid lower bound, the
    reference and its value, estimate / reference, the verdict and the estimate's status (``ok``
    or why it is not to be read, e.g. too few canaries); below it the claim with its
    delta and the verdict of the checks of the mechanism.

    Args:
        summary: the summary JSON's content (``CanaryAuditor.summary``: ``results`` or
            ``estimates`` of ``{name: {value, lower, upper, status}}``, the references, the
            ratios, the ``verdict_*`` words and ``inputs``' ``delta`` and ``alpha``).

    Returns:
        Markdown; a number the summary lacks shows as ``-``.
    """
    from audit_callbacks.auditing.report import REFERENCES

    estimates = summary.get("results") or summary.get("estimates") or {}
    inputs = summary.get("inputs") or {}
    delta, alpha = inputs.get("delta"), inputs.get("alpha")
    level = "" if not isinstance(alpha, (int, float)) else f" {100 * (1 - alpha):g}%"
    lines = [f"**Fit-end numbers** (epsilon at delta = {_cell(delta)}; intervals:{level} "
             f"bootstrap; bounds: valid at{level} confidence)", "",
             "| threat model | estimate | interval | valid lower bound | reference | value "
             "| estimate / reference | verdict | status |", "|---|---|---|---|---|---|---|---|---|"]
    for tm in ("all_iterates", "final_model"):
        estimate_name, reference_name = REFERENCES[tm]
        est = estimates.get(estimate_name) or {}
        bound = (estimates.get(f"{names.EPSILON_LOWER_BOUND}_{tm}") or {}).get("value")
        lower, upper = est.get("lower"), est.get("upper")
        interval = "-" if lower is None or upper is None else f"[{_cell(lower)}, {_cell(upper)}]"
        lines.append(f"| {THREAT_MODEL_TITLES[tm]} | {_cell(est.get('value'))} | {interval} | {_cell(bound)} "
                     f"| {REFERENCE_TITLES[reference_name]} | {_cell(summary.get(reference_name))} "
                     f"| {_cell(summary.get(f'epsilon_ratio_{tm}'))} "
                     f"| {_cell(summary.get(f'verdict_{tm}', 'unchecked'))} | {_cell(est.get('status', '-'))} |")
    claim = summary.get(names.EPSILON_ANALYTIC)
    lines += ["", f"Claim: epsilon = {_cell(claim)} at delta = {_cell(delta)}; checks of the "
                  f"mechanism: {_cell(summary.get(names.VERDICT_MECHANISM, 'unchecked'))}."]
    return "\n".join(lines) + "\n"


def _is_torch_writer(writer: Any) -> bool:
    """Whether ``writer`` is torch's ``SummaryWriter`` (with its event file writer), whose
    events :meth:`WriterSink.image` may write directly; False without the tensorboard package
    (e.g. Lightning's tensorboardX fallback)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return False
    return isinstance(writer, SummaryWriter) and callable(getattr(writer, "_get_file_writer", None))


class WriterSink:
    """Writes reports through a TensorBoard ``SummaryWriter``: ``writer``, or one made on
    first use in ``log_dir`` (nothing when both are None). Histograms use the writer's default
    buckets; a matplotlib figure is written as the image of its one rendering
    (:func:`~audit_callbacks.auditing.figures.render_figure`), which the HTML report of the
    same figure reuses."""

    def __init__(self, writer: Any | None = None, *, log_dir: str | None = None,
                 versioned: bool = False) -> None:
        self._writer = writer
        self.log_dir = log_dir
        self.versioned = versioned
        self._run_dir: str | None = None

    @property
    def run_dir(self) -> str | None:
        """The run's own folder: ``log_dir``, or with ``versioned`` a fresh ``log_dir/version_N``
        chosen at first use (as Lightning's loggers do), so runs never mix or overwrite."""
        if self._run_dir is None and self.log_dir is not None:
            self._run_dir = fresh_version_dir(self.log_dir) if self.versioned else self.log_dir
        return self._run_dir

    @property
    def writer(self) -> Any | None:
        if self._writer is None and self.run_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.run_dir)
        return self._writer

    @property
    def writes_images(self) -> bool:
        """Whether :meth:`figures` writes anything (there is a writer, or a ``log_dir`` to make
        one in): the auditor builds no figure for a sink that does not."""
        return self._writer is not None or self.log_dir is not None

    def close(self) -> None:
        """Flush and close the writer this sink made (a later write opens a new one)."""
        if self._writer is not None and self.log_dir is not None:
            self._writer.close()
            self._writer = None

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in clean_scalars(values).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def histograms(self, values: dict[str, np.ndarray], step: int) -> None:
        if self.writer is None:
            return
        for tag, arr in values.items():
            arr = np.asarray(arr, dtype=np.float64)
            arr = arr[np.isfinite(arr)]
            if arr.size:
                self.writer.add_histogram(tag, arr, step)
        self.writer.flush()

    def figures(self, figures: dict[str, Any], step: int) -> None:
        """``{tag: figure}`` as TensorBoard images at ``step``. A matplotlib ``Figure`` is
        rendered once (:func:`~audit_callbacks.auditing.figures.render_figure`, kept with the
        figure for the HTML report) and written as that rendering (:meth:`image`); anything
        else (a list of figures) goes to the writer's ``add_figure``."""
        if self.writer is None:
            return
        from matplotlib.figure import Figure

        from audit_callbacks.auditing.figures import render_figure

        for tag, fig in figures.items():
            if isinstance(fig, Figure):
                self.image(tag, render_figure(fig), step)
            else:
                self.writer.add_figure(tag, fig, global_step=step, close=True)
        self.writer.flush()

    def image(self, tag: str, rendered: Any, step: int) -> None:
        """One TensorBoard image at ``step`` from a :class:`~audit_callbacks.auditing.figures.
        RenderedFigure` (``rgba`` ``[H, W, 4]`` uint8, ``png`` its bytes).

        Through torch's ``SummaryWriter``, the PNG already encoded goes into the event as it
        is: the ``Summary.Image`` proto (height, width, colorspace 4 = RGBA,
        ``encoded_image_string``) that ``add_image`` writes after encoding the pixels once
        more (and resampling them to the same size); read back, its pixels are the
        rendering's. Any other writer (tensorboardX, a stand-in) gets
        ``add_image(tag, rgb, dataformats="HWC")`` with the RGB pixels."""
        writer = self.writer
        if writer is None:
            return
        if _is_torch_writer(writer):
            from tensorboard.compat.proto.summary_pb2 import Summary

            height, width, channels = rendered.rgba.shape
            image = Summary.Image(height=height, width=width, colorspace=channels,
                                  encoded_image_string=rendered.png)
            writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
        else:
            writer.add_image(tag, rendered.rgba[:, :, :3], global_step=step, dataformats="HWC")

    def text(self, values: dict[str, str], step: int) -> None:
        """``{tag: text}`` as TensorBoard text (the verdicts' sentences)."""
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_text(tag, value, step)
        self.writer.flush()

    def layout(self, layout: dict[str, dict[str, list[Any]]], summary_filename: str | None = None) -> None:
        """Write the Custom Scalars ``layout``; with ``summary_filename``, first check that the
        summary can be written into the run folder (ValueError now, not at the end)."""
        if summary_filename is not None and self.run_dir is not None:
            check_writable(self.run_dir, summary_filename)
        if self.writer is not None:
            self.writer.add_custom_scalars(layout)
