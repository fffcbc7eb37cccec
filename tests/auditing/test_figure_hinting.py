"""Text hinting while drawing: ``render_figure`` draws with ``TEXT_HINTING`` and gives the
global setting back, even when the drawing fails; its PNG decodes to its pixels."""

from __future__ import annotations

import io
from typing import Any

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from audit_callbacks.auditing import figures as figmod
from audit_callbacks.auditing.figures import render_figure, roc_figure


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
