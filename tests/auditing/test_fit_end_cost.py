"""Issue 28 item 3: the fit end's fixed costs (figures, TensorBoard images, report) cut without
changing what is written. No timing is asserted; the behaviour that makes it cheap is:

* a TensorBoard image is the PNG ``render_figure`` encoded, in the ``Summary.Image`` event that
  ``add_image`` writes: read back with ``EventAccumulator``, its bytes are the report's PNG and
  its pixels those ``add_image`` writes; ``LightningSink`` (a Trainer's ``TensorBoardLogger``)
  takes the same path, any other writer gets ``add_image``;
* at fit end (``CanaryAuditor.finish``) each figure is drawn exactly once, the TensorBoard
  images are the HTML report's images, and no figure is built where nobody reads it;
* ``InViewLocator`` gives exactly the ticks an axis draws (none beyond the view);
* the density outline is the one ``ax.stairs`` draws; the history figure's log axis has plain
  labels at 1-2-5 (decades over a wide span) and no minor ticks.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import StepPatch
from matplotlib.ticker import LogLocator, MaxNLocator
from PIL import Image

from audit_callbacks.auditing import figures as figmod
from audit_callbacks.auditing.figures import (
    InViewLocator,
    density_figure,
    in_view_ticks,
    render_figure,
    roc_figure,
)
from audit_callbacks.auditing.html_report import history_figure
from audit_callbacks.auditing.sinks import WriterSink
from tests.auditing.test_auditor import _auditor

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def _images(run_dir: str) -> dict[str, Any]:
    acc = EventAccumulator(run_dir, size_guidance={"images": 0})
    acc.Reload()
    return {tag: acc.Images(tag) for tag in acc.Tags()["images"]}


def _rgb(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def _no_add_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.tensorboard import SummaryWriter

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("add_image re-encodes the pixels")

    monkeypatch.setattr(SummaryWriter, "add_image", refuse)


# ------------------------------------------------------------------ TensorBoard images
def test_tensorboard_image_is_the_rendered_png(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    fig = roc_figure(rng.normal(2, 1, 40), rng.normal(0, 1, 400))
    rendered = render_figure(fig)
    sink = WriterSink(log_dir=str(tmp_path))
    writer = sink.writer
    # the reference: what SummaryWriter.add_image writes for the same pixels
    writer.add_image("reference", rendered.rgba[:, :, :3], global_step=3, dataformats="HWC")
    _no_add_image(monkeypatch)
    sink.figures({"audit/roc_final_model": fig}, 3)
    sink.close()
    images = _images(str(tmp_path))
    (event,), (ref,) = images["audit/roc_final_model"], images["reference"]
    height, width = rendered.rgba.shape[:2]
    assert event.step == ref.step == 3
    assert (event.width, event.height) == (ref.width, ref.height) == (width, height)
    assert event.encoded_image_string == rendered.png  # the report's PNG, not encoded again
    assert np.array_equal(_rgb(event.encoded_image_string), _rgb(ref.encoded_image_string))
    assert np.array_equal(_rgb(event.encoded_image_string), rendered.rgba[:, :, :3])


def test_lightning_sink_takes_the_same_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.loggers import TensorBoardLogger

    from audit_callbacks.callbacks.tensorboard import LightningSink

    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = Trainer(logger=logger, accelerator="cpu", devices=1, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    sink = LightningSink(trainer)
    assert sink.writes_images
    fig = density_figure({"observed": np.linspace(0, 1, 50)}, title="t")
    _no_add_image(monkeypatch)
    sink.figures({"audit/cosine_density_final_model": fig}, 5)
    logger.experiment.flush()
    (event,) = _images(logger.log_dir)["audit/cosine_density_final_model"]
    assert event.step == 5 and event.encoded_image_string == render_figure(fig).png
    no_logger = Trainer(logger=False, accelerator="cpu", devices=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    assert not LightningSink(no_logger).writes_images


def test_other_writers_get_add_image() -> None:
    class Recording:
        def __init__(self) -> None:
            self.images: list[tuple[str, np.ndarray, int, str]] = []

        def add_image(self, tag: str, img: np.ndarray, global_step: int, dataformats: str) -> None:
            self.images.append((tag, img, global_step, dataformats))

        def flush(self) -> None:
            pass

    fig = roc_figure(np.arange(5.0), np.arange(5.0) - 1.5)
    writer = Recording()
    WriterSink(writer).figures({"audit/roc": fig}, 2)
    ((tag, img, step, fmt),) = writer.images
    assert (tag, step, fmt) == ("audit/roc", 2, "HWC")
    assert np.array_equal(img, render_figure(fig).rgba[:, :, :3])


# ------------------------------------------------------------------ the fit end
def _audited(rounds: int = 4):
    auditor, backend, warnings = _auditor(k=100, bootstrap=20)
    rng = np.random.default_rng(1)
    for _ in range(rounds):
        backend.step(np.flatnonzero(rng.random(100) < 0.5))
    return auditor, backend


def test_fit_end_draws_each_figure_once(tmp_path: Any, draws: dict[int, int],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real SummaryWriter and the HTML report: 3 canary figures and the history, each
    drawn once; the TensorBoard images are byte for byte images of the report."""
    auditor, _ = _audited()
    sink = WriterSink(log_dir=str(tmp_path / "tb"))
    auditor.update(sink, step=1)
    built: list[dict[str, Any]] = []
    real = figmod.canary_figures
    monkeypatch.setattr(figmod, "canary_figures", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    _no_add_image(monkeypatch)
    path = auditor.finish(sink, step=4, directory=str(tmp_path / "out"), filename="audit_summary.json")
    sink.close()
    assert path is not None and len(built) == 1
    figs = built[0]
    assert set(figs) == {"audit/cosine_density_final_model", "audit/roc_final_model",
                         "audit/cosine_density_all_iterates"}
    assert all(draws[id(fig)] == 1 for fig in figs.values())
    assert len(draws) == len(figs) + 1 and set(draws.values()) == {1}  # and the history figure
    images = _images(str(tmp_path / "tb"))
    assert set(images) == set(figs)
    html_path, _ = auditor.report_paths
    with open(html_path, encoding="utf-8") as fh:
        embedded = re.findall(r"src='data:image/png;base64,([^']+)'", fh.read())
    assert len(embedded) == len(figs) + 1
    for tag, fig in figs.items():
        (event,) = images[tag]
        assert event.step == 4 and event.encoded_image_string == render_figure(fig).png
        assert base64.b64encode(event.encoded_image_string).decode("ascii") in embedded


def test_no_figure_is_built_for_nobody(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    auditor, _ = _audited()
    calls: list[int] = []
    real = figmod.canary_figures
    monkeypatch.setattr(figmod, "canary_figures", lambda *a, **k: calls.append(1) or real(*a, **k))
    # no writer and no summary folder (e.g. off rank zero): nothing to build
    assert auditor.finish(WriterSink(None), step=4, directory=None, filename="s.json") is None
    assert not calls

    class StandIn:  # a sink without ``writes_images`` is given the figures
        def __init__(self) -> None:
            self.figures_seen: list[str] = []

        def scalars(self, values: Any, step: int) -> None: ...

        def histograms(self, values: Any, step: int) -> None: ...

        def layout(self, layout: Any) -> None: ...

        def figures(self, figures: dict[str, Any], step: int) -> None:
            self.figures_seen += sorted(figures)

    stand_in = StandIn()
    auditor.finish(stand_in, step=4, directory=None, filename="s.json")
    assert len(calls) == 1 and "audit/roc_final_model" in stand_in.figures_seen
    # a report without a TensorBoard writer still gets its figures
    auditor.finish(WriterSink(None), step=4, directory=str(tmp_path), filename="s.json")
    assert len(calls) == 2
    with open(auditor.report_paths[0], encoding="utf-8") as fh:
        assert len(re.findall(r"data:image/png;base64,", fh.read())) == 4


# ------------------------------------------------------------------ the figures
def _view_ticks(axis: Any, locs: np.ndarray) -> np.ndarray:
    lo, hi = sorted(axis.get_view_interval())
    return locs[(locs >= lo * (1 - 1e-12)) & (locs <= hi * (1 + 1e-12))]


@pytest.mark.parametrize("scale, data, base", [
    ("linear", (0.03, 0.97), lambda: MaxNLocator(5)),
    ("log", (3e-4, 2.0), lambda: LogLocator()),
    ("log", (12.0, 1400.0), lambda: LogLocator(subs=(1.0, 2.0, 5.0))),
])
def test_in_view_locator_gives_the_ticks_drawn(scale: str, data: tuple[float, float], base: Any) -> None:
    fig = Figure(figsize=(4, 3), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(data, data)
    ax.set_xscale(scale)
    ax.set_yscale(scale)
    ax.xaxis.set_major_locator(base())
    plain = np.asarray(ax.xaxis.get_major_locator()(), float)  # autoscaled view, base's ticks
    in_view_ticks(ax)
    assert isinstance(ax.xaxis.get_major_locator(), InViewLocator)
    in_view_ticks(ax)  # idempotent: not wrapped twice
    assert not isinstance(ax.xaxis.get_major_locator().base, InViewLocator)
    ticks = np.asarray(ax.xaxis.get_major_locator()(), float)
    assert np.array_equal(ticks, _view_ticks(ax.xaxis, plain))
    assert ticks.size < plain.size  # the base gave ticks beyond the view: dropped
    FigureCanvasAgg(fig).draw()
    assert len(ax.xaxis.majorTicks) == ticks.size  # no Tick made only to be skipped
    with pytest.raises(ValueError, match="base must be a matplotlib Locator"):
        InViewLocator([0.0, 1.0])  # type: ignore[arg-type]


def test_density_outline_is_the_stairs_outline() -> None:
    rng = np.random.default_rng(3)
    samples = {"observed canaries": rng.normal(3, 1, 300) / 100,
               "unobserved canaries": rng.normal(0, 1, 3000) / 100}
    fig = density_figure(samples, title="final model: canary cosines")
    ax = fig.axes[0]
    lo = min(v.min() for v in samples.values())
    hi = max(v.max() for v in samples.values())
    bins = np.linspace(lo, hi, 50)
    assert len(ax.lines) == len(samples)
    for line, values in zip(ax.lines, samples.values(), strict=True):
        density, _ = np.histogram(values, bins=bins, density=True)
        stairs = StepPatch(density, bins, baseline=0).get_path().vertices
        assert np.array_equal(line.get_xydata(), stairs)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(samples)
    FigureCanvasAgg(fig).draw()
    assert ax.get_ylim()[0] == 0.0  # the density axis starts at the baseline, as stairs'


def test_history_figure_has_plain_log_labels_and_no_minor_ticks() -> None:
    rows = [(25 * i, 200.0 * i ** 0.8, 230.0 * i ** 0.8, 33.0 * i ** 0.7) for i in range(1, 9)]
    fig = history_figure(rows)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.yaxis.get_ticklabels()]
    assert labels == ["50", "100", "200", "500", "1000"]
    assert not ax.yaxis.get_minorticklocs().size and not ax.xaxis.get_minorticklocs().size
    steps = ax.xaxis.get_majorticklocs()
    assert 2 <= steps.size <= 6 and np.array_equal(steps, np.round(steps))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "epsilon_all_iterates (estimate)", "epsilon_analytic (claim)", "epsilon_final_model (estimate)"]
    wide = history_figure([(1, 0.01, 5e3), (2, 0.1, 6e3)])  # over five decades: powers of ten
    FigureCanvasAgg(wide).draw()
    decades = [t.get_text() for t in wide.axes[0].yaxis.get_ticklabels()]
    assert decades[:6] == ["0.01", "0.1", "1", "10", "100", "1000"]
    assert all(float(label) == 10.0 ** round(np.log10(float(label))) for label in decades)
    linear = history_figure([(1, 0.0, 2.0), (2, 0.5, 2.0)])  # a zero: no log scale
    FigureCanvasAgg(linear).draw()
    assert linear.axes[0].get_yscale() == "linear"
