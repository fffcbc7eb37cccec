"""TensorBoard histograms without sorting: ``sinks.bucket_indices`` gives numpy.histogram's
counts in TensorFlow's buckets (values on every edge, zeros, both signs, beyond the last edge,
tiny and huge magnitudes), ``tensorboard_histogram`` is field for field the proto torch's
``make_histogram`` builds, and ``WriterSink.histograms`` writes the event ``add_histogram``
writes (read back through TensorBoard)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorboard")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from torch.utils.tensorboard.summary import make_histogram  # noqa: E402

from audit_callbacks.auditing.sinks import (  # noqa: E402
    WriterSink,
    _geometric_buckets,
    bucket_indices,
    tensorboard_histogram,
)


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    writer = SummaryWriter(str(tmp_path_factory.mktemp("tb")))
    bins = writer.default_bins
    writer.close()
    assert _geometric_buckets(bins)
    return bins


def _values(seed: int, edges: list[float]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = np.asarray(edges)
    parts = [rng.normal(0.0, 10.0 ** rng.uniform(-14, 22), 500), rng.choice(e, 300),
             np.nextafter(rng.choice(e, 100), np.inf), np.nextafter(rng.choice(e, 100), -np.inf),
             np.zeros(7), [e[0], e[-1], 2 * e[-1], -2 * e[-1], 1e-300, -1e-300, 5e-324],
             rng.standard_normal(2000) * 1e-2, rng.exponential(1e-12, 50)]
    return rng.permutation(np.concatenate(parts))


@pytest.mark.parametrize("seed", range(8))
def test_buckets_are_numpys(seed: int, edges: list[float]) -> None:
    values = _values(seed, edges)
    e = np.asarray(edges)
    idx = bucket_indices(values, e)
    bins = e.size - 1
    counts = np.bincount(idx[(idx >= 0) & (idx < bins)], minlength=bins)
    assert np.array_equal(counts, np.histogram(values, bins=e)[0])
    inside = (values >= e[0]) & (values <= e[-1])
    expected = np.minimum(np.searchsorted(e, values[inside], side="right") - 1, bins - 1)
    assert np.array_equal(idx[inside], expected)
    assert np.all(idx[values < e[0]] == -1) and np.all(idx[values > e[-1]] == bins)


@pytest.mark.parametrize("seed", range(4))
def test_proto_is_torchs(seed: int, edges: list[float]) -> None:
    rng = np.random.default_rng(seed)
    for values in (_values(seed, edges), rng.normal(0.01, 0.003, 65536), np.array([0.25]),
                   np.array([-3.0, -3.0])):
        ours = tensorboard_histogram(values, edges)
        assert ours.SerializeToString() == make_histogram(values, edges).SerializeToString()


def test_other_buckets_are_not_taken_for_tensorflows(edges: list[float]) -> None:
    assert not _geometric_buckets(edges[:-2] + [edges[-1], edges[-1] * 2])
    assert not _geometric_buckets(list(np.linspace(-1, 1, 11)))
    assert not _geometric_buckets(np.asarray(edges))
    assert not _geometric_buckets(None)


def _histograms(run_dir: str) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"histograms": 0})
    acc.Reload()
    return {tag: acc.Histograms(tag) for tag in acc.Tags()["histograms"]}


def test_sink_writes_add_histograms_event(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    values = {"audit/cosine_final_unobserved": rng.normal(0, 0.004, 5000),
              "audit/cosine_final_observed": np.append(rng.normal(0.01, 0.004, 300), np.nan),
              "audit/cosine_all_observed": np.array([np.inf])}
    ref = SummaryWriter(str(tmp_path / "ref"))
    for tag, v in values.items():
        v = v[np.isfinite(v)]
        if v.size:
            ref.add_histogram(tag, v, 3)
    ref.close()
    monkeypatch.setattr(SummaryWriter, "add_histogram",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("sorted again")))
    sink = WriterSink(log_dir=str(tmp_path / "ours"))
    sink.histograms(values, 3)
    sink.close()
    ours, theirs = _histograms(str(tmp_path / "ours")), _histograms(str(tmp_path / "ref"))
    assert set(ours) == set(theirs) == {"audit/cosine_final_unobserved", "audit/cosine_final_observed"}
    for tag in ours:
        (a,), (b,) = ours[tag], theirs[tag]
        assert a.step == b.step == 3 and a.histogram_value == b.histogram_value
