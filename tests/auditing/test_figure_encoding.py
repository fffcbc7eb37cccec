"""The figures' PNG (``figures.encode_png``) and text hinting while drawing: the PNG decodes to
the rendered pixels with the figure's dpi, PIL reads it as RGBA, a bad array is refused naming
``rgba``; ``render_figure`` draws with ``TEXT_HINTING`` and gives the global setting back, even
when the drawing fails."""

from __future__ import annotations

import io
from typing import Any

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from audit_callbacks.auditing import figures as figmod
from audit_callbacks.auditing.figures import encode_png, render_figure, roc_figure


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (350, 600)])
def test_png_decodes_to_the_pixels(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    rgba = rng.integers(0, 256, (*shape, 4), dtype=np.uint8)
    png = encode_png(rgba, 100)
    with Image.open(io.BytesIO(png)) as im:
        assert im.mode == "RGBA" and im.size == (shape[1], shape[0])
        assert np.array_equal(np.asarray(im), rgba)
        assert im.info["dpi"] == pytest.approx((100.0, 100.0), abs=1e-3)


def test_png_refuses_other_arrays() -> None:
    for bad in (np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 4), np.float32),
                np.zeros((0, 4, 4), np.uint8), [[0, 0, 0, 0]]):
        with pytest.raises(ValueError, match="rgba must be an"):
            encode_png(bad, 100)  # type: ignore[arg-type]


def test_render_draws_with_the_hinting_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = FigureCanvasAgg.draw

    def draw(self: Any) -> None:
        seen.append(matplotlib.rcParams["text.hinting"])
        real(self)

    monkeypatch.setattr(FigureCanvasAgg, "draw", draw)
    before = matplotlib.rcParams["text.hinting"]
    rendered = render_figure(roc_figure(np.arange(6.0), np.arange(6.0) - 2.0))
    assert seen == [figmod.TEXT_HINTING] and matplotlib.rcParams["text.hinting"] == before
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(rendered.png))), rendered.rgba)

    def broken(self: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(FigureCanvasAgg, "draw", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        render_figure(roc_figure(np.arange(6.0), np.arange(6.0) - 1.0))
    assert matplotlib.rcParams["text.hinting"] == before
