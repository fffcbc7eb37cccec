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


# ------------------------------------------------------------------------------------ slow tests
#: The tests ``make test-fast`` (``pytest -m "not slow"``) leaves out, marked ``slow`` here, in one
#: place: a path (every test of the file) or ``path::test_name`` (every parametrization of it).
#: Subprocesses, DDP, the Flower deployment and simulation, the examples, the screenshots, and
#: the tests that took over ~2 s on 2 shared cores (``pytest --durations=0 -p no:randomly``, a
#: folder at a time). ``make test`` (CI) runs them all.
SLOW: tuple[str, ...] = (
)


def _slow_rules() -> dict[str, set[str] | None]:
    rules: dict[str, set[str] | None] = {}
    for entry in SLOW:
        path, _, name = entry.partition("::")
        if not name:
            rules[path] = None
        elif rules.get(path, set()) is not None:
            rules.setdefault(path, set()).add(name)  # type: ignore[union-attr]
    return rules


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark the ``SLOW`` tests; a ``SLOW`` entry that names no test of a file collected whole
    is an error (a renamed test would otherwise silently join the fast run)."""
    rules = _slow_rules()
    seen: dict[str, set[str]] = {}
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        name = rest.split("[")[0].split("::")[-1]
        seen.setdefault(path, set()).add(name)
        if path in rules and (rules[path] is None or name in rules[path]):
            item.add_marker(pytest.mark.slow)
    stale = sorted(f"{path}::{name}" for path, names in rules.items() if path in seen and names
                   for name in names - seen[path])
    subset = config.option.keyword or config.option.deselect or getattr(config.option, "lf", False) or any(
        "::" in str(arg) for arg in config.args)
    if stale and not subset:
        raise pytest.UsageError("tests/conftest.py SLOW names tests that do not exist: " + ", ".join(stale))
