import os
import warnings

import pytest
import torch

os.environ.setdefault("PL_DISABLE_FORK", "1")
torch.set_num_threads(1)  # small models train fastest on one thread; no oversubscription


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        yield


@pytest.fixture
def draws(monkeypatch):
    """Agg drawings per matplotlib figure (id -> count): the tests that a figure is drawn once."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    counts: dict[int, int] = {}
    real = FigureCanvasAgg.draw

    def counting(self):
        counts[id(self.figure)] = counts.get(id(self.figure), 0) + 1
        real(self)

    monkeypatch.setattr(FigureCanvasAgg, "draw", counting)
    return counts
