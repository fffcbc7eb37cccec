"""Issue 28 item 3: estimates and fit-end figures made cheaper without changing a result.

* ``one_run.fdp_mu`` runs its bisection in rounds (one pass of the f-DP recursion evaluates every
  midpoint the next b steps can visit): compared bit for bit with the step-by-step bisection it
  replaced (kept below as ``_fdp_mu_reference``, verbatim), with and without groups, at several
  ``iters``, for few and many lanes; and through ``tightest_valid_lower_bound``.
* ``last_iterate``: equal shifts merged and a lean log-sum-exp in the root finding; compared
  with the unmerged mixture and ``scipy.special.logsumexp`` (the previous computation) to 1e-9
  relative on many mixtures.
* Figures: rendered once (``figures.render_figure``), written to TensorBoard as that rendering's
  pixels and embedded in the HTML report from the same PNG; the ROC staircase drawn through its
  corners only is the same step function.
"""

from __future__ import annotations

import base64
import io
import math
import os
import re
from typing import Any

import numpy as np
import pytest
from PIL import Image
from scipy.special import logsumexp, ndtr, ndtri

from audit_callbacks.auditing import figures as figmod
from audit_callbacks.auditing.figures import (
    _step_corners,
    canary_figures,
    figure_png,
    render_figure,
    roc_figure,
)
from audit_callbacks.auditing.html_report import write_report
from audit_callbacks.auditing.sinks import WriterSink
from audit_callbacks.estimators import last_iterate as li
from audit_callbacks.estimators import one_run, valid_bounds
from audit_callbacks.estimators.one_run import (
    _PRUNE_AFTER,
    MU_MAX,
    _round_bits,
    fdp_mu,
    fdp_rejects,
    guess_counts,
)

# ------------------------------------------------------------------------------ f-DP bound


def _fdp_rejects_reference(mu, n, v, m, level):
    """``fdp_rejects`` before issue 28 (verbatim)."""
    r, h, i = level * v / m, level * (n - v) / m, (v - 1).astype(float)
    live = np.flatnonzero(v > 0)
    rr, hh, ii, mm, nn = r[live], h[live], i[live], mu[live], n[live].astype(float)
    step = 0
    while live.size:
        g = ndtr(ndtri(rr) - mm)
        act = ii >= 0
        h_new = np.where(act, np.maximum(hh, g), hh)
        moved = act & (h_new > hh)
        rr = np.where(moved, np.minimum(rr + ii / np.maximum(nn - ii, 1.0) * (h_new - hh), 1.0), rr)
        hh = h_new
        ii = np.where(moved, ii - 1.0, -1.0)
        step += 1
        if step % 16 == 0 or not moved.any():
            r[live], h[live] = rr, hh
            live, rr, hh, ii, mm, nn = (a[moved] for a in (live, rr, hh, ii, mm, nn))
    return r + h > n / m


def _fdp_mu_reference(n, v, m, level, iters=36, groups=None):
    """``fdp_mu`` before issue 28: one call of ``fdp_rejects`` per bisection step (verbatim)."""
    fdp_rejects = _fdp_rejects_reference
    n, v, m, level = one_run._lanes(n, v, m, level)
    ok0 = fdp_rejects(np.zeros(n.size), n, v, m, level)
    lo, hi, idx = np.zeros(n.size), np.full(n.size, MU_MAX), np.flatnonzero(ok0)
    for step in range(iters if idx.size else 0):
        if groups is not None and step == _PRUNE_AFTER:
            _, inv = np.unique(np.asarray(groups), return_inverse=True)
            best = np.zeros(inv.max() + 1)
            np.maximum.at(best, inv, lo)
            idx = idx[hi[idx] >= best[inv[idx]]]
        mid = 0.5 * (lo[idx] + hi[idx])
        rej = fdp_rejects(mid, n[idx], v[idx], m[idx], level[idx])
        lo[idx] = np.where(rej, mid, lo[idx])
        hi[idx] = np.where(rej, hi[idx], mid)
    return np.where(ok0, lo, 0.0)


def test_fdp_rejects_equals_the_previous_recursion() -> None:
    """Every answer of the in-place recursion, at mu on both sides of each lane's threshold."""
    n, v, m, level, _ = _lanes(30, seed=21)
    ref = _fdp_mu_reference(n, v, m, level)
    for mu in (np.zeros(n.size), ref, ref * (1 + 1e-12), ref + 1e-9, ref * 0.9, ref * 1.1 + 0.05,
               np.full(n.size, MU_MAX)):
        assert np.array_equal(fdp_rejects(mu, n, v, m, level),
                              _fdp_rejects_reference(mu, n, v, m, level))


def _lanes(sets: int, seed: int) -> tuple[np.ndarray, ...]:
    """Candidate rules of ``sets`` simulated pools (sizes 8..400, effects 0..4, ties)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(sets):
        m = int(rng.integers(8, 400))
        k = int(rng.integers(1, m))
        x = rng.normal(rng.uniform(0.0, 4.0), 1.0, k)
        y = rng.normal(0.0, 1.0, m - k)
        if d % 3 == 0:  # ties
            x, y = np.round(x), np.round(y)
        n, v, _, _ = guess_counts(x, y, d)
        out.append((n, v, np.full(n.size, float(m)), rng.uniform(1e-4, 0.2, n.size),
                    np.full(n.size, d)))
    return tuple(np.concatenate(a) for a in zip(*out, strict=True))


def _same_group_maxima(new: np.ndarray, ref: np.ndarray, groups: np.ndarray) -> None:
    """Each group's maximum and argmax equal (bit for bit); no lane above the reference."""
    assert np.all(new <= ref)
    for k in np.unique(groups):
        sel = groups == k
        assert new[sel].max() == ref[sel].max()
        assert np.argmax(new[sel]) == np.argmax(ref[sel])


@pytest.mark.parametrize("sets", [1, 5, 40])
def test_fdp_mu_equals_the_step_by_step_bisection(sets: int) -> None:
    n, v, m, level, g = _lanes(sets, seed=sets)
    new = fdp_mu(n, v, m, level)
    assert np.array_equal(new, _fdp_mu_reference(n, v, m, level))  # every lane
    assert new.max() > 0 and (new == 0).any()  # both kinds of lane are exercised
    # with groups: the pruning continues after every round, each group's maximum is the same
    _same_group_maxima(fdp_mu(n, v, m, level, groups=g),
                       _fdp_mu_reference(n, v, m, level, groups=g), g)


@pytest.mark.parametrize("iters", [0, 1, 5, _PRUNE_AFTER, _PRUNE_AFTER + 1, 17, 36, 40])
def test_fdp_mu_equals_the_bisection_at_any_number_of_steps(iters: int) -> None:
    n, v, m, level, g = _lanes(6, seed=iters + 100)
    assert np.array_equal(fdp_mu(n, v, m, level, iters=iters),
                          _fdp_mu_reference(n, v, m, level, iters=iters))
    new = fdp_mu(n, v, m, level, iters=iters, groups=g)
    ref = _fdp_mu_reference(n, v, m, level, iters=iters, groups=g)
    _same_group_maxima(new, ref, g)
    if iters <= _PRUNE_AFTER + 5:  # one round after the first pruning: every lane as before
        assert np.array_equal(new, ref)


def test_fdp_mu_scalar_level_and_wide_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scalar level; rounds of up to 8 steps and of 1 step (the plain bisection) agree."""
    n, v, m, _, g = _lanes(4, seed=7)
    ref = _fdp_mu_reference(n, v, m, 0.01)
    ref_g = _fdp_mu_reference(n, v, m, 0.01, groups=g)
    for bits, cells in ((8, 1 << 20), (1, 1 << 20), (5, 1)):
        monkeypatch.setattr(one_run, "_ROUND_BITS", bits)
        monkeypatch.setattr(one_run, "_ROUND_CELLS", cells)
        assert np.array_equal(fdp_mu(n, v, m, 0.01), ref)
        _same_group_maxima(fdp_mu(n, v, m, 0.01, groups=g), ref_g, g)


def test_round_bits_spread_the_steps_under_the_caps() -> None:
    for lanes in (1, 26, 100, 2000, 10**6):
        for steps in (1, 10, 26, 36):
            left, rounds = steps, []
            while left:
                b = _round_bits(lanes, left)
                assert 1 <= b <= min(left, one_run._ROUND_BITS)
                assert b == 1 or lanes * ((1 << b) - 1) <= one_run._ROUND_CELLS
                rounds.append(b)
                left -= b
            assert max(rounds) - min(rounds) <= 1 or rounds[-1] == 1  # even, or capped at 1


def test_tightest_valid_bound_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary report's valid bound (Clopper-Pearson + f-DP) is the same number as with the
    step-by-step bisection, at k = 200, k' = 20,000."""
    rng = np.random.default_rng(3)
    cases = [(rng.normal(mu, 1.0, 200), rng.normal(0.0, 1.0, 20_000)) for mu in (0.0, 1.5, 3.0)]
    kw = dict(alpha=0.05, delta=1e-5, methods=("clopper_pearson", "one_run_fdp"))
    new = [valid_bounds.tightest_valid_lower_bound(x, y, seed=i, **kw) for i, (x, y) in enumerate(cases)]
    monkeypatch.setattr(valid_bounds, "fdp_mu", _fdp_mu_reference)
    old = [valid_bounds.tightest_valid_lower_bound(x, y, seed=i, **kw) for i, (x, y) in enumerate(cases)]
    for a, b in zip(new, old, strict=True):
        assert a.value == b.value
        assert a.details["values"] == b.details["values"]
        assert a.details["one_run_fdp"] == b.details["one_run_fdp"]
    assert new[2].details["values"]["one_run_fdp"] > 0


# ------------------------------------------------------------------------- last iterate


class _Unmerged(li._Mixture):
    """The mixture as computed before issue 28: every component kept, scipy's logsumexp."""

    def __init__(self, shifts: np.ndarray, log_w: np.ndarray) -> None:
        self.s, self.lw = shifts, log_w
        self.s_min, self.s_max = float(shifts.min()), float(shifts.max())
        zero = shifts == 0.0
        lw0 = float(logsumexp(log_w[zero])) if zero.any() else -math.inf
        self.l_left = math.inf if self.s_min < 0 else lw0
        self.l_right = math.inf if self.s_max > 0 else lw0
        self.x_min = self._argmin()
        self.l_min = (self.loss(self.x_min) if math.isfinite(self.x_min)
                      else min(self.l_left, self.l_right))

    def loss(self, x: float) -> float:
        return float(logsumexp(self.lw + self.s * x - 0.5 * self.s * self.s))


def _mixtures(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        k = int(rng.integers(1, 80))
        kind = i % 4
        if kind == 0:
            s = rng.normal(0.0, 2.0, k)
        elif kind == 1:  # DP-FedAvg-like: few distinct participation counts, many canaries
            s = rng.binomial(40, 0.1, k) / (rng.uniform(0.5, 2.0) * math.sqrt(40))
        elif kind == 2:
            s = np.round(rng.normal(1.0, 2.0, k))  # negative, zero and positive shifts
        else:
            s = np.abs(rng.normal(0.0, 0.3, k))
        w = rng.dirichlet(np.ones(k)) if i % 3 == 0 else np.full(k, 1.0 / k)
        out.append((s, w, float(10.0 ** -rng.uniform(1.0, 12.0))))
    return out


def test_mixture_epsilon_matches_the_unmerged_computation() -> None:
    merged = 0
    for s, w, delta in _mixtures(160, seed=5):
        new = li.mixture_gaussian_epsilon(s, w, delta)
        mix = li._mixture(s, w, delta)
        merged += mix.s.size < s.size
        old = li._epsilon(_Unmerged(s.copy(), np.log(w)), delta)
        assert new == pytest.approx(old, rel=1e-9, abs=1e-11), (s, w, delta)
        eps = 0.5 * old
        assert li.mixture_gaussian_delta(s, w, eps) == pytest.approx(
            math.exp(_Unmerged(s.copy(), np.log(w)).log_hockey(eps)), rel=1e-9, abs=1e-300)
    assert merged > 40  # the merging was exercised


def test_merged_mixture_is_the_same_distribution() -> None:
    s = np.array([0.5, 2.0, 0.5, 0.0, 2.0, 0.5])
    w = np.array([0.1, 0.2, 0.3, 0.05, 0.15, 0.2])
    mix = li._mixture(s, w, 1e-6)
    assert mix.s.tolist() == [0.0, 0.5, 2.0]
    assert np.allclose(np.exp(mix.lw), [0.05, 0.6, 0.35], rtol=1e-14)
    assert mix.l_left == pytest.approx(math.log(0.05))  # the zero shift's weight
    for x in (-3.0, 0.0, 0.7, 5.0):
        assert mix.loss(x) == pytest.approx(_Unmerged(s, np.log(w)).loss(x), rel=1e-13, abs=1e-13)


def test_lean_logsumexp_matches_scipy() -> None:
    rng = np.random.default_rng(2)
    for size in (1, 2, 7, 1000):
        for scale in (1e-3, 1.0, 700.0, 1e6):
            a = rng.normal(0.0, scale, size)
            assert li._logsumexp(a) == pytest.approx(float(logsumexp(a)), rel=1e-13, abs=1e-13)
    assert li._logsumexp(np.array([-np.inf, -np.inf])) == -np.inf
    assert li._logsumexp(np.array([-np.inf, 0.0])) == 0.0
    assert li._logsumexp(np.array([1.0, np.inf])) == np.inf
    assert math.isnan(li._logsumexp(np.array([1.0, np.nan])))


def test_last_iterate_references_unchanged() -> None:
    """DP-SGD and DP-FedAvg references against the unmerged computation (1e-9 relative)."""
    t, q, sigma, delta = 142, 256 / 18000, 1.0, 1e-5
    m = np.arange(t + 1, dtype=float)
    from scipy.stats import binom

    lw = binom.logpmf(m, t, q)
    keep = np.isfinite(lw)
    ref = li._epsilon(_Unmerged(m[keep] / (sigma * math.sqrt(t)), lw[keep]), delta)
    assert li.dpsgd_last_iterate_epsilon(t, q, sigma, delta) == pytest.approx(ref, rel=1e-9)
    shifts = np.random.default_rng(0).binomial(100, 0.05, 1000) / 10.0
    ref = li._epsilon(_Unmerged(shifts, np.full(1000, -math.log(1000))), delta)
    assert li.fedavg_last_iterate_epsilon(shifts, delta) == pytest.approx(ref, rel=1e-9)


# ------------------------------------------------------------------------------ figures


def _statistics(k: int = 300, k_out: int = 3000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"final_observed": rng.normal(3, 1, k) / 100, "final_unobserved": rng.normal(0, 1, k_out) / 100,
            "all_observed": rng.normal(2, 1, k) / 100, "all_unobserved": rng.normal(0, 1, k_out) / 100}


def test_render_is_cached_until_the_figure_changes(draws: dict[int, int]) -> None:
    fig = roc_figure(np.arange(5.0), np.arange(5.0) - 1.5)
    first = render_figure(fig)
    assert render_figure(fig) is first and figure_png(fig) is first.png
    assert draws[id(fig)] == 1
    h, w = round(fig.get_figheight() * fig.dpi), round(fig.get_figwidth() * fig.dpi)
    assert first.rgba.shape == (h, w, 4) and first.rgba.dtype == np.uint8
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(first.png))), first.rgba)
    fig.axes[0].set_xlabel("changed")  # a change marks the figure stale: drawn again
    second = render_figure(fig)
    assert second is not first and draws[id(fig)] == 2
    assert not np.array_equal(second.rgba, first.rgba)
    with pytest.raises(ValueError, match="fig must be a matplotlib Figure"):
        render_figure("not a figure")


class _RecordingWriter:
    def __init__(self) -> None:
        self.images: dict[str, tuple[np.ndarray, int, str]] = {}
        self.figures: list[str] = []

    def add_image(self, tag: str, img: np.ndarray, global_step: int, dataformats: str) -> None:
        self.images[tag] = (img, global_step, dataformats)

    def add_figure(self, tag: str, figure: Any, global_step: int, close: bool) -> None:
        self.figures.append(tag)

    def flush(self) -> None:
        pass


def test_fit_end_draws_each_figure_once(tmp_path: Any, draws: dict[int, int]) -> None:
    """As CanaryAuditor.finish does: the sink writes the figures, then the HTML report embeds
    the same figures; every figure is drawn once, and the HTML holds the sink's pixels."""
    drawn = canary_figures(_statistics(), 1000, exact_null=True)
    writer = _RecordingWriter()
    WriterSink(writer).figures(drawn, 7)
    assert set(writer.images) == set(drawn) and not writer.figures
    for tag, fig in drawn.items():
        img, step, fmt = writer.images[tag]
        assert step == 7 and fmt == "HWC"
        assert np.array_equal(img, render_figure(fig).rgba[:, :, :3])
    html_path, _ = write_report({"inputs": {}}, str(tmp_path), figures=drawn,
                                history=[(1, 1.0, 2.0, 0.5), (2, 1.5, 2.0, 0.7)])
    assert all(draws[id(fig)] == 1 for fig in drawn.values())
    assert len(draws) == len(drawn) + 1  # and the history figure, drawn for the report
    with open(html_path, encoding="utf-8") as fh:
        page = fh.read()
    embedded = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(embedded) == len(drawn) + 1
    for fig in drawn.values():
        assert base64.b64encode(figure_png(fig)).decode("ascii") in embedded


def test_report_without_a_sink_still_draws_the_figures(tmp_path: Any, draws: dict[int, int]) -> None:
    drawn = canary_figures(_statistics(), 1000, exact_null=False)
    WriterSink(None).figures(drawn, 1)  # no writer: nothing drawn
    assert not draws
    write_report({"inputs": {}}, str(tmp_path), figures=drawn)
    assert all(draws[id(fig)] == 1 for fig in drawn.values())


def test_sink_passes_other_objects_to_add_figure() -> None:
    writer = _RecordingWriter()
    WriterSink(writer).figures({"audit/list": [roc_figure(np.arange(3.0), np.arange(3.0))]}, 1)
    assert writer.figures == ["audit/list"] and not writer.images


def test_summary_writer_event_holds_the_rendered_pixels(tmp_path: Any) -> None:
    """Through a real SummaryWriter: the event file's image is the figure's rendering (RGB)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fig = roc_figure(np.arange(10.0), np.arange(10.0) - 3.0)
    sink = WriterSink(log_dir=str(tmp_path))
    sink.figures({"audit/roc_final_model": fig}, 3)
    sink.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    (event,) = acc.Images("audit/roc_final_model")
    assert event.step == 3
    pixels = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
    assert np.array_equal(pixels, render_figure(fig).rgba[:, :, :3])


def _staircase(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The where="post" step function through (x_i, y_i) (x ascending): y of the last point
    with x_i <= t."""
    return y[np.searchsorted(x, at, side="right") - 1]


def test_step_corners_keep_the_same_staircase() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        size = int(rng.integers(1, 300))
        x = np.sort(rng.integers(0, 40, size)).astype(float)  # ties in x (vertical runs)
        y = np.sort(rng.integers(0, 12, size)).astype(float)  # runs of equal y
        keep = _step_corners(y)
        assert keep[0] == 0 and keep[-1] == size - 1
        at = np.unique(np.concatenate([x, x[:-1] + 0.5 * np.diff(x), x + 1e-9]))
        assert np.array_equal(_staircase(x[keep], y[keep], at), _staircase(x, y, at))
        assert keep.size <= np.unique(y).size + 1


def test_roc_figure_line_has_the_corners_only() -> None:
    rng = np.random.default_rng(6)
    ins, outs = rng.normal(2, 1, 200), rng.normal(0, 1, 20_000)
    fig = roc_figure(ins, outs)
    line = fig.axes[0].lines[0]
    xd, yd = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    assert xd.size <= ins.size + 2  # not the 20,201 thresholds
    # the full staircase, as before: every threshold
    thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([ins, outs]))[::-1]])
    si, so = np.sort(ins), np.sort(outs)
    floor = 0.5 / outs.size
    tpr = np.maximum(1.0 - np.searchsorted(si, thresholds, side="right") / ins.size, floor)
    fpr = np.maximum(1.0 - np.searchsorted(so, thresholds, side="right") / outs.size, floor)
    at = np.unique(np.concatenate([fpr, fpr * (1 + 1e-9)]))
    assert np.array_equal(_staircase(xd, yd, at), _staircase(fpr, tpr, at))
    assert not fig.axes[0].xaxis.get_minor_locator()()  # decades only


def test_figures_have_a_fixed_resolution() -> None:
    drawn = canary_figures(_statistics(50, 60), 1000, exact_null=False)
    assert {fig.dpi for fig in drawn.values()} == {figmod.DPI}
    assert os.path.basename(figmod.__file__) == "figures.py"


def test_decade_labels_are_plain_text() -> None:
    assert figmod.decade_label(1e-3) == "10\u207b\u00b3"
    assert figmod.decade_label(1.0) == "10\u2070"
    assert figmod.decade_label(100.0) == "10\u00b2"
    assert figmod.decade_label(1e-12) == "10\u207b\u00b9\u00b2"
    for x in (2e-3, 0.0, -1.0, float("nan"), float("inf")):
        assert figmod.decade_label(x) == ""


def test_log_axes_need_no_mathtext(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ROC and the epsilon-over-training figure draw no mathtext label (parsing it was
    most of their drawing); the labels are still there."""
    from matplotlib import mathtext

    from audit_callbacks.auditing.html_report import history_figure

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("mathtext parsed")

    monkeypatch.setattr(mathtext.MathTextParser, "parse", refuse)
    roc = roc_figure(np.linspace(0, 1, 100), np.linspace(-1, 0.5, 5000))
    hist = history_figure([(1, 0.5, 4.0, 0.4), (2, 2.0, 4.0, 1.0)])
    for fig in (roc, hist):
        render_figure(fig)
        labels = [t.get_text() for t in fig.axes[0].yaxis.get_ticklabels() if t.get_text()]
        assert labels and not any("$" in t for t in labels)
    assert hist.axes[0].get_yscale() == "log"
