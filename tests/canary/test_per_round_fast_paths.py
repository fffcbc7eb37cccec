"""The per-round fast paths of DP-FedAvg's canary audit: the same numbers as the
definitions they replace, bit for bit where the arithmetic is unchanged, within a stated float
tolerance where it is not.

* ``fwht`` on the CPU: the Kronecker matmuls (blocks <= 32) up to n M = 2^17 entries, equal to
  ``scipy.linalg.hadamard @ x`` within 1e-6 relative in float32;
* ``_parity_signs``: the cached Sylvester rows equal the xor-folded parity;
* ``HadamardCanaries.sum`` and ``batch`` from numpy indices: the bits of the previous code;
* ``CanaryStatistics.add_delta``: the running maxima are the bits of ``fmax(max, cos * sign)``
  with the cosines of ``CanarySet.cosines`` (NaN and inf rounds included), and the projection it
  shares is the canaries' dot products of that very delta, never of another or modified one;
* ``KnownRoundScores.update``: one transform a round by linearity, within 1e-7 of ``(|Delta_t| +
  beta |Delta_{t-1}|) m / (C eta)`` of the float64 transform of the recovered average (measured:
  <= 1e-8, the previous code's <= 7e-9); the shared projection gives the same bits as computing
  it; a checkpoint keeps its format and a resumed run continues bit for bit; the update in fewer
  operations (one comparison for the finite test, slices added to in place) keeps the previous
  code's bits, NaN and inf rounds included;
* the backend: the canary sum's device and dtype follow the round's ``theta``; the
  representative row goes through the module's clip stage every round.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.linalg
import torch

from audit_callbacks.canary import vectors as canaries_mod
from audit_callbacks.canary.base import Release
from audit_callbacks.canary.known_rounds import KnownRoundScores
from audit_callbacks.canary.projection import Projection
from audit_callbacks.canary.statistics import CanaryStatistics
from audit_callbacks.canary.vectors import CanarySet, _index_array, _parity_signs, fwht


# ----------------------------------------------------------------------------- fwht
@pytest.mark.parametrize(("n", "cols"), [(2, 1), (8, 3), (512, 1), (2048, 2), (2048, 64)])
def test_cpu_fwht_equals_the_scipy_hadamard_product(n, cols):
    g = torch.Generator().manual_seed(n + cols)
    x = torch.randn(n, cols, generator=g)
    want = scipy.linalg.hadamard(n).astype(np.float64) @ x.double().numpy()
    got = fwht(x).double().numpy()
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


@pytest.mark.parametrize(("n", "cols", "kron"), [(2, 1, True), (1 << 13, 1, True), (1 << 17, 1, True),
                                                 (1 << 16, 2, True), (1 << 13, 16, True), (1 << 18, 1, False),
                                                 (1 << 16, 4, False), (1, 1, False)])
def test_cpu_fwht_takes_the_kronecker_path_up_to_2_17_entries(monkeypatch, n, cols, kron):
    calls = []
    inner = canaries_mod._fwht_kronecker

    def counting(x, block):
        calls.append(block)
        return inner(x, block)

    monkeypatch.setattr(canaries_mod, "_fwht_kronecker", counting)
    x = torch.randn(n, cols, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = fwht(x)
    assert calls == ([32] if kron else [])
    # float64 against the butterfly loop (a different order of the same additions)
    ref = canaries_mod._butterflies(x.clone(), 1)
    assert torch.allclose(got, ref, rtol=0, atol=1e-9 * float(ref.abs().max()))


def test_cpu_fwht_float32_at_the_federated_size_is_within_1e_6_of_float64():
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(2))
    want = fwht(x.double())
    assert float((fwht(x).double() - want).abs().max()) <= 1e-6 * float(want.abs().max())


# ----------------------------------------------------------------------------- parity rows
def _fold_parity(rows: torch.Tensor, length: int) -> torch.Tensor:
    """The previous code: xor-fold all 64 bits of r & c."""
    x = rows.unsqueeze(1) & torch.arange(length, dtype=torch.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        x ^= x >> shift
    return (1 - 2 * (x & 1)).to(torch.float32)


@pytest.mark.parametrize("length", [1, 2, 4, 64, 1024, 2048, 4096])
def test_parity_rows_equal_the_folded_parity_and_the_sylvester_matrix(length):
    rows = torch.randint(0, length, (9,), generator=torch.Generator().manual_seed(length))
    got = _parity_signs(rows, length)
    assert torch.equal(got, _fold_parity(rows, length))
    if length <= 1024:
        assert torch.equal(got, torch.from_numpy(scipy.linalg.hadamard(length)[rows.numpy()]).float())


# ----------------------------------------------------------------------------- canary sums and rows
def _old_sum(cs, idx):
    e = torch.zeros(cs.n)
    e.index_add_(0, cs.rows[torch.tensor(idx, dtype=torch.int64)], torch.ones(len(idx)))
    out = torch.zeros(cs.dim)
    out[: cs.n] = fwht(e).mul_(cs.signs).mul_(cs.scale)
    return out


@pytest.mark.parametrize("dim", [13_706, 125_626, 1000])
def test_hadamard_sums_and_rows_from_numpy_indices_have_the_previous_bits(dim):
    cs = CanarySet(3, dim, 300, kind="hadamard")
    idx = np.random.default_rng(0).choice(300, size=40, replace=False)
    got = cs.sum(idx)
    assert torch.equal(got, _old_sum(cs, idx.tolist()))
    assert torch.equal(got, cs.sum(idx.tolist()))
    frozen = idx.copy()
    frozen.setflags(write=False)  # a cohort's ids are read-only arrays
    assert torch.equal(cs.batch(frozen[:3], scale=10.0), cs.batch(idx[:3].tolist(), scale=10.0))
    assert torch.equal(cs.dots(got, indices=idx), cs.dots(got, indices=idx.tolist()))
    with pytest.raises(IndexError, match="300"):
        cs.sum(np.array([0, 300]))
    with pytest.raises(IndexError, match="-1"):
        cs.batch(np.array([-1]))


# ----------------------------------------------------------------------------- all-iterates maxima
def _old_fold(max_cos, cs, delta, sign):
    norms = torch.linalg.vector_norm(delta, dtype=torch.float64).reshape(1)
    dots = cs.dots(delta).unsqueeze(1)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    cos = (dots / safe.unsqueeze(0)).clamp_(-1.0, 1.0)
    cos = torch.where(torch.isfinite(norms).unsqueeze(0), cos, math.nan)[:, 0]
    return torch.fmax(max_cos, cos * sign)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_hadamard_maxima_are_the_bits_of_fmax_of_the_cosines(sign):
    dim = 5000
    cs = CanarySet(0, dim, 4096, kind="hadamard")
    st = CanaryStatistics(cs, 96, 4000, sign=sign)
    g = torch.Generator().manual_seed(4)
    ref = torch.full((4096,), -math.inf, dtype=torch.float64)
    nan_delta = torch.randn(dim, generator=g)
    nan_delta[7] = math.nan
    tail_inf = torch.randn(dim, generator=g)
    tail_inf[-1] = math.inf  # outside the n = 4096 coordinates: finite dots, infinite norm
    deltas = [torch.randn(dim, generator=g), nan_delta, torch.zeros(dim), tail_inf,
              torch.randn(dim, generator=g) * 1e-3]
    for delta in deltas:
        folded = st.add_delta(delta)
        ref = _old_fold(ref, cs, delta, sign)
        assert bool(folded) == bool(torch.isfinite(delta).all())
        assert torch.equal(st.max_cos, ref)
    assert st.rounds_seen == 3 and st.rounds_skipped == 2


def test_the_shared_projection_is_of_that_very_delta():
    dim = 3000
    cs = CanarySet(1, dim, 200, kind="hadamard")
    st = CanaryStatistics(cs, 100, 100)
    delta = torch.randn(dim, generator=torch.Generator().manual_seed(5))
    projection = Projection(cs, delta)
    st.fold(Release(projection))
    dots, norm = projection.dots, projection.norm
    assert torch.equal(dots, cs.dots(delta))
    assert torch.equal(norm, torch.linalg.vector_norm(delta, dtype=torch.float64))
    assert projection.dots is dots and projection.norm is norm  # computed once, shared
    alone = CanaryStatistics(cs, 100, 100)
    alone.add_delta(delta)  # the projection made inside: the same maxima
    assert torch.equal(alone.max_cos, st.max_cos)


# ----------------------------------------------------------------------------- known rounds
def _known_rounds_run(dim, beta, lr, *, rounds=10, share=False, reload_at=None, seed=0, bad_at=()):
    k, kun, m = 40, 400, 20
    cs = CanarySet(seed, dim, k + kun, kind="hadamard")

    def make():
        return KnownRoundScores(cs, k, clip_norm=1.0, divisor=m, noise_multiplier=1.0, server_lr=lr,
                                server_momentum=beta)

    st = make()
    stats = CanaryStatistics(cs, k, kun)
    g, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    buf = torch.zeros(dim, dtype=torch.float64)
    prev = None
    expected = np.zeros(k + kun)
    worst = 0.0
    s64 = cs.signs.double()
    for t in range(rounds):
        joined = np.flatnonzero(rng.random(k) < 0.2)
        buf = beta * buf + torch.randn(dim, generator=g, dtype=torch.float64) / m
        delta = (lr * buf).to(torch.float32)
        if t in bad_at:
            delta[3] = math.nan
        projection = None
        if share:
            shared = Projection(cs, delta)
            stats.fold(Release(shared))
            projection = (shared.dots, shared.norm)
        before = st.sums.copy()
        folded = bool(st.update(delta, joined, projection=projection))
        d64 = delta.double()
        ok = bool(torch.isfinite(d64).all())
        # with momentum a round is folded after a valid delta, or before any round was folded
        assert folded == (ok and (beta == 0 or prev is not None or st.rounds == int(folded)))
        if folded:
            avg = (d64 - beta * (prev if prev is not None else 0.0)) / lr
            y = (fwht(s64 * avg[: cs.n])[cs.rows] * cs.scale * m).numpy()  # float64 transform
            exp = np.zeros(k + kun)
            np.add.at(exp, joined, y[joined])
            exp[k:] += y[k:]
            bound = (float(d64.norm()) + beta * (0.0 if prev is None else float(prev.norm()))) * m / lr
            worst = max(worst, float(np.abs((st.sums - before) - exp).max()) / bound)
            expected += exp
        prev = d64 if ok else None
        if reload_at == t:
            resumed = make()
            resumed.load_state_dict(st.state_dict())
            st = resumed
    return st, worst, expected


@pytest.mark.parametrize(("dim", "beta", "lr"), [(5000, 0.0, 1.0), (5000, 0.9, 0.7), (70_000, 0.9, 1.0),
                                                  (5000, 0.0, 0.3)])
def test_known_rounds_by_linearity_are_within_1e_7_of_the_float64_transform(dim, beta, lr):
    _, worst, _ = _known_rounds_run(dim, beta, lr)
    assert worst <= 1e-7


def test_a_non_finite_round_and_the_one_after_it_under_momentum_are_skipped():
    st, worst, _ = _known_rounds_run(5000, 0.9, 1.0, rounds=8, bad_at=(3,))
    assert worst <= 1e-7
    assert st.skipped == 2 and st.rounds == 6  # round 3 (NaN) and round 4 (no previous delta)
    st0, worst0, _ = _known_rounds_run(5000, 0.9, 1.0, rounds=4, bad_at=(0,))
    # a NaN first round: no round folded yet, so the next is folded without a previous delta
    assert st0.skipped == 1 and st0.rounds == 3 and worst0 <= 1e-7


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_the_shared_projection_gives_the_same_bits(beta):
    alone, _, _ = _known_rounds_run(5000, beta, 0.7, share=False, bad_at=(4,))
    shared, _, _ = _known_rounds_run(5000, beta, 0.7, share=True, bad_at=(4,))
    for key in ("sums", "counts", "momentum_sums"):
        np.testing.assert_array_equal(getattr(alone, key), getattr(shared, key))
    assert (alone.un_squares, alone.decay, alone.decay_squares, alone.rounds, alone.skipped) == (
        shared.un_squares, shared.decay, shared.decay_squares, shared.rounds, shared.skipped)


def test_a_projection_of_the_wrong_shape_is_refused():
    cs = CanarySet(0, 300, 20, kind="hadamard")
    st = KnownRoundScores(cs, 10, clip_norm=1.0, divisor=2, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="projection"):
        st.update(torch.zeros(300), None, projection=(torch.zeros(19, dtype=torch.float64),
                                                       torch.zeros((), dtype=torch.float64)))
    with pytest.raises(IndexError):
        st.update(torch.zeros(300), np.array([10]))  # an unobserved canary's index


def test_known_rounds_checkpoint_keeps_its_format_and_resumes_bit_for_bit():
    straight, _, _ = _known_rounds_run(5000, 0.9, 0.7, rounds=9)
    resumed, _, _ = _known_rounds_run(5000, 0.9, 0.7, rounds=9, reload_at=4)
    state = straight.state_dict()
    assert set(state) == {"sums", "counts", "un_squares", "momentum_sums", "decay", "decay_squares",
                          "rounds", "skipped", "previous",
                          # the release's settings, which a resume must keep
                          "noise_multiplier", "clip_norm", "divisor", "server_lr", "server_momentum"}
    assert state["sums"].dtype == torch.float64 and state["counts"].dtype == torch.int64
    assert state["previous"].dtype == torch.float64 and state["previous"].shape == (5000,)
    assert isinstance(state["un_squares"], float) and isinstance(state["rounds"], int)
    for key in ("sums", "counts", "momentum_sums"):
        np.testing.assert_array_equal(getattr(straight, key), getattr(resumed, key))
    assert straight.un_squares == resumed.un_squares and straight.decay_squares == resumed.decay_squares
    # the saved previous delta is the last delta (float64 of the float32 values)
    _, _, _ = _known_rounds_run(5000, 0.9, 0.7, rounds=9)
    cs = straight.canaries
    fresh = KnownRoundScores(cs, straight.k, clip_norm=1.0, divisor=20, noise_multiplier=1.0,
                             server_lr=0.7, server_momentum=0.9)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.state_dict()["previous"], state["previous"])


# ----------------------------------------------------------------------------- the previous update
def _old_known_update(self, model_delta, participants, *, projection=None):
    """``KnownRoundScores.update`` before its finite test became one comparison and its slices
    were added to in place (kept to compare bits)."""
    x = model_delta.detach()
    dev = self._to_device(x.device)
    if projection is None:
        dots = self.canaries.dots(x)
        norm = torch.linalg.vector_norm(x, dtype=torch.float64)
    else:
        dots, norm = projection
        if tuple(dots.shape) != (len(self.canaries),) or norm.dim() != 0:
            raise ValueError(f"projection: expected dots [{len(self.canaries)}] and a 0-dim norm, "
                             f"got {tuple(dots.shape)} and {tuple(norm.shape)}")
    idx = _index_array(np.asarray([] if participants is None else participants), self.k, x.device)
    self._cache = None
    self._auditor = None
    ok = torch.isfinite(norm)  # a float64 sum of float32 squares: finite iff every entry is
    unit = self.divisor / (self.clip_norm * self.eta)  # y in units of one clipped update
    if self.beta > 0:
        assert self._has_previous is not None
        prev = self._previous_dots_on(x.device)  # 0 where the previous delta is not valid
        fold = ok & (self._has_previous | (dev["rounds"] == 0))
        y = torch.add(dots, prev, alpha=-self.beta).nan_to_num_(0.0, 0.0, 0.0)
        self._previous_dots = dots.nan_to_num(0.0, 0.0, 0.0).mul_(ok.to(torch.float64))
        self._previous = x
        self._has_previous = ok
    else:  # no momentum: no previous delta is kept
        fold = ok
        y = dots.nan_to_num(0.0, 0.0, 0.0)  # a new tensor: dots may be shared
    fold64 = fold.to(torch.float64)
    y.mul_(fold64 * unit)
    take = fold.to(torch.int64)
    k = self.k
    dev["sums"].index_add_(0, idx, y.index_select(0, idx))
    dev["counts"].index_add_(0, idx, take.expand(idx.numel()))
    un = y[k:]
    dev["sums"][k:] += un
    dev["counts"][k:] += take
    dev["un_squares"] += torch.dot(un, un)
    factor = torch.where(fold, self._beta_on, 1.0)  # beta in float64, not a float32 scalar
    dev["momentum_sums"].mul_(factor).index_add_(0, idx, fold64.expand(idx.numel()))
    dev["decay"].mul_(factor).add_(fold64)
    dev["decay_squares"].mul_(factor * factor).add_(fold64)
    dev["rounds"] += take
    dev["skipped"] += 1 - take
    return fold


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_the_known_rounds_update_has_the_previous_bits(monkeypatch, beta):
    """NaN and inf rounds included: every running sum, count and flag is the previous code's."""

    def run():
        cs = CanarySet(2, 3000, 300, kind="hadamard")
        st = KnownRoundScores(cs, 30, clip_norm=0.5, divisor=8, noise_multiplier=1.0, server_lr=0.7,
                              server_momentum=beta)
        g, rng = torch.Generator().manual_seed(5), np.random.default_rng(5)
        flags = []
        for t in range(9):
            delta = torch.randn(3000, generator=g) * 0.01
            if t == 3:
                delta[7] = math.nan
            if t == 6:
                delta[11] = math.inf
            flags.append(bool(st.update(delta, np.flatnonzero(rng.random(30) < 0.3))))
        return st, flags

    new, new_flags = run()
    monkeypatch.setattr(KnownRoundScores, "update", _old_known_update)
    old, old_flags = run()
    assert new_flags == old_flags and not all(new_flags)
    for key, value in new._dev.items():
        assert torch.equal(value, old._dev[key]), key
    if beta:
        assert torch.equal(new._previous_dots, old._previous_dots)


def test_restart_forgets_the_previous_delta():
    cs = CanarySet(0, 600, 40, kind="hadamard")

    def make():
        return KnownRoundScores(cs, 20, clip_norm=1.0, divisor=4, noise_multiplier=1.0, server_momentum=0.5)

    g = torch.Generator().manual_seed(0)
    first, second = torch.randn(600, generator=g), torch.randn(600, generator=g)
    a, alone_first, alone_second = make(), make(), make()
    a.update(first, np.array([1]))
    a.restart()  # a new fit: the next delta has no momentum to undo
    a.update(second, np.array([2]))
    alone_first.update(first, np.array([1]))
    alone_second.update(second, np.array([2]))
    np.testing.assert_array_equal(a.sums[20:], alone_first.sums[20:] + alone_second.sums[20:])
    assert a.rounds == 2 and a.skipped == 0
    assert torch.equal(a.state_dict()["previous"], second.double())


# ----------------------------------------------------------------------------- backend
def test_the_canary_sum_follows_the_rounds_theta_device_and_dtype():
    from audit_callbacks.backends.fedavg import FedAvgBackend

    backend = FedAvgBackend.__new__(FedAvgBackend)
    backend.module = SimpleNamespace(trainable_parameters=lambda: [torch.nn.Parameter(torch.zeros(2))])
    theta = torch.zeros(5, dtype=torch.float64)
    assert backend._device_dtype(SimpleNamespace(theta=theta)) == (theta.device, torch.float64)
    assert backend._device_dtype(None) == (torch.device("cpu"), torch.float32)  # no round: the parameters'


def test_the_representative_row_is_clipped_by_the_module_every_round():
    import warnings

    from audit_callbacks.callbacks import CanaryAudit
    from audit_callbacks.federated import DPFedAvg
    from tests._federated import quick_trainer, tiny_federation

    class Counting(DPFedAvg):
        def clip_virtual_updates(self, fl_round, name, indices, rows):
            self.calls.append((fl_round.index, rows.shape[0]))
            return super().clip_virtual_updates(fl_round, name, indices, rows)

    torch.manual_seed(0)
    module = Counting(torch.nn.Linear(15, 3), clients_per_round=8, noise_multiplier=1.0, clip_norm=0.5,
                      local_lr=0.1, seed=3, server_momentum=0.5)
    module.calls = []
    audit = CanaryAudit(num_canaries=12, num_unobserved=20, canaries="hadamard", seed=1, log_figures=False,
                        log_histograms=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quick_trainer(5, [audit]).fit(module, datamodule=tiny_federation(p=15))
    assert audit.auditor.participations.sum() > 0 and audit.auditor.matched.rounds == 5
    by_round: dict[int, list[int]] = {}
    for index, n_rows in module.calls:
        by_round.setdefault(index, []).append(n_rows)
    # every round with canaries in its cohort: one representative row through the module's clip
    assert by_round and set(by_round) <= set(range(1, 6))
    assert all(rows == [1] for rows in by_round.values())


def test_a_clipping_that_writes_outside_the_canaries_coordinates_sends_every_row_through_it():
    # a clip that adds 1e-9 beyond the first n coordinates (d = 15, n = 8): a least-squares
    # residual of ~1e-17 of |clipped|^2 that a tolerance would call a scaling, but not one
    from audit_callbacks.federated import DPFedAvg
    from tests.federated.test_fedavg_canary_clipping import run

    class TailClip(DPFedAvg):
        calls: list[int] = []

        def clip_updates(self, updates):
            norms = super().clip_updates(updates)
            updates[:, -1] += 1e-9
            return norms

        def clip_virtual_updates(self, fl_round, name, indices, rows):
            TailClip.calls.append(rows.shape[0])
            return super().clip_virtual_updates(fl_round, name, indices, rows)

    audit, capture = run(TailClip, "hadamard", rows=False)
    with_canaries = [ids.size for _, _, ids, _ in capture.rounds if ids.size]
    assert with_canaries
    # each such round: the representative row, then every canary's row through the clipping
    assert TailClip.calls == [n for size in with_canaries for n in (1, size)]
