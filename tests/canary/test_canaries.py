import numpy as np
import pytest
import torch
from scipy import stats

from audit_callbacks.canary.statistics import CanaryStatistics, group_rounds
from audit_callbacks.canary.vectors import CanarySet, canary_seed
from audit_callbacks.estimators import cosine_null_cdf


def test_canaries_are_unit_and_regenerated_from_seed():
    a = CanarySet(seed=3, dim=500, num_canaries=20)
    b = CanarySet(seed=3, dim=500, num_canaries=20, chunk_elements=500 * 3)
    for j in (0, 7, 19):
        c = a.canary(j)
        assert c.shape == (500,)
        assert torch.linalg.vector_norm(c).item() == pytest.approx(1.0, abs=1e-6)
        assert torch.equal(c, b.canary(j))
    assert not torch.equal(a.canary(0), a.canary(1))
    assert not torch.equal(a.canary(0), CanarySet(seed=4, dim=500, num_canaries=20).canary(0))


def test_canary_seed_is_stable_and_validated():
    assert canary_seed(0, 1) == canary_seed(0, 1)
    assert canary_seed(0, 1) != canary_seed(1, 0)
    with pytest.raises(ValueError):
        canary_seed(-1, 0)
    with pytest.raises(ValueError):
        CanarySet(0, 1, 3)
    with pytest.raises(IndexError):
        CanarySet(0, 10, 3).canary(3)


def test_chunks_bound_memory_and_cover_all():
    cs = CanarySet(seed=1, dim=1000, num_canaries=25, chunk_elements=4000)
    assert cs.chunk_size == 4
    seen = []
    for part, block in cs.chunks():
        assert block.shape[0] <= 4 and block.shape[1] == 1000
        seen.extend(part)
    assert seen == list(range(25))


def test_dots_cosines_and_sum_match_brute_force():
    torch.manual_seed(0)
    cs = CanarySet(seed=2, dim=300, num_canaries=13, chunk_elements=900)
    full = torch.stack([cs.canary(j) for j in range(13)]).double()
    v = torch.randn(4, 300)
    assert torch.allclose(cs.dots(v), full @ v.double().t(), atol=1e-10)
    cos = cs.cosines(v)
    expect = (full @ v.double().t()) / torch.linalg.vector_norm(v.double(), dim=1)
    assert torch.allclose(cos, expect, atol=1e-10)
    assert torch.allclose(cs.cosines(v[0]), expect[:, 0], atol=1e-10)
    assert torch.allclose(cs.sum().double(), full.sum(0), atol=1e-5)
    w = torch.arange(13, dtype=torch.float32)
    assert torch.allclose(cs.sum(weights=w).double(), w.double() @ full, atol=1e-4)
    sub = [5, 1, 12]
    assert torch.allclose(cs.dots(v, indices=sub), full[sub] @ v.double().t(), atol=1e-10)
    with pytest.raises(ValueError):
        cs.cosines(torch.full((300,), float("nan")))
    assert torch.all(cs.cosines(torch.zeros(300)) == 0)


def test_canary_cosines_follow_the_exact_null():
    # Canaries are uniform on the sphere: cosines with a fixed vector follow METHODS A1.
    dim = 20
    cs = CanarySet(seed=11, dim=dim, num_canaries=4000)
    cos = cs.cosines(torch.ones(dim)).numpy()
    res = stats.kstest(cos, lambda t: cosine_null_cdf(t, dim))
    assert res.pvalue > 1e-3


def test_statistics_max_over_rounds_and_final_model():
    torch.manual_seed(1)
    dim, k, ku = 200, 6, 4
    cs = CanarySet(seed=5, dim=dim, num_canaries=k + ku)
    full = torch.stack([cs.canary(j) for j in range(k + ku)]).double()
    st = CanaryStatistics(cs, k, ku, max_buffered=3)
    theta0 = torch.randn(dim)
    st.set_initial(theta0)
    deltas = [torch.randn(dim) for _ in range(7)]
    for dlt in deltas:
        assert st.add_delta(dlt)
    assert not st.add_delta(torch.full((dim,), float("inf")))
    assert st.rounds_skipped == 1 and st.rounds_seen == 7
    theta = theta0 + sum(deltas)
    out = st.compute(theta)
    D = torch.stack(deltas).double()
    cos = (full @ D.t()) / torch.linalg.vector_norm(D, dim=1)
    best = cos.max(dim=1).values
    assert torch.allclose(out["all_observed"], best[:k], atol=1e-9)
    assert torch.allclose(out["all_unobserved"], best[k:], atol=1e-9)
    diff = (theta - theta0).double()
    fin = full @ diff / torch.linalg.vector_norm(diff)
    assert torch.allclose(out["final_observed"], fin[:k], atol=1e-6)
    # sign -1: the model moves against canary gradients (METHODS A7)
    neg = CanaryStatistics(cs, k, ku, sign=-1.0)
    neg.set_initial(theta0)
    assert torch.allclose(neg.compute(theta)["final_observed"], -fin[:k], atol=1e-6)


def test_statistics_state_roundtrip_equals_uninterrupted():
    torch.manual_seed(2)
    dim = 64
    cs = CanarySet(seed=9, dim=dim, num_canaries=10)
    deltas = [torch.randn(dim) for _ in range(9)]
    a = CanaryStatistics(cs, 5, 5, max_buffered=4)
    a.set_initial(torch.zeros(dim))
    for dlt in deltas:
        a.add_delta(dlt)
    b = CanaryStatistics(cs, 5, 5, max_buffered=2)
    b.set_initial(torch.zeros(dim))
    for dlt in deltas[:5]:
        b.add_delta(dlt)
    c = CanaryStatistics(cs, 5, 5, max_buffered=2)
    c.load_state_dict(b.state_dict())
    for dlt in deltas[5:]:
        c.add_delta(dlt)
    theta = sum(deltas)
    ra, rc = a.compute(theta), c.compute(theta)
    for key in ra:
        assert torch.equal(ra[key], rc[key]), key
    with pytest.raises(ValueError):
        CanaryStatistics(CanarySet(seed=8, dim=dim, num_canaries=10), 5, 5).load_state_dict(b.state_dict())


def test_memory_is_independent_of_the_number_of_canaries():
    # The set stores no canary: its size does not grow with k.
    small = CanarySet(seed=0, dim=10_000, num_canaries=10, kind="gaussian")
    large = CanarySet(seed=0, dim=10_000, num_canaries=100_000, kind="gaussian")
    assert vars(small).keys() == vars(large).keys()
    assert all(not isinstance(v, (torch.Tensor, np.ndarray)) for v in vars(large).values())


def test_compute_reuses_the_pass_when_nothing_changed(monkeypatch):
    # Fit end right after a validation at the same round: no second pass over the canaries,
    # and the statistics are identical; a new round or a new model forces a fresh pass.
    torch.manual_seed(3)
    dim = 50
    cs = CanarySet(seed=4, dim=dim, num_canaries=8)
    st = CanaryStatistics(cs, 4, 4)
    st.set_initial(torch.zeros(dim))
    st.add_delta(torch.randn(dim))
    theta = torch.randn(dim)
    calls = []
    original = cs._fill
    monkeypatch.setattr(cs, "_fill", lambda idx, out, scale: (calls.extend(idx), original(idx, out, scale)))
    first = st.compute(theta)
    assert len(calls) == 8
    again = st.compute(theta.clone())
    assert len(calls) == 8
    for key in first:
        assert torch.equal(first[key], again[key]), key
    moved = st.compute(theta + 1e-3)
    assert len(calls) == 16 and not torch.equal(moved["final_observed"], first["final_observed"])
    st.add_delta(torch.randn(dim))
    st.compute(theta + 1e-3)
    assert len(calls) == 24


def test_a_canary_is_the_seeded_normal_vector_normalised():
    # the definition, computed here with plain torch calls: re-seeded Mersenne Twister, divided
    # by the float32 norm.
    cs = CanarySet(seed=5, dim=4001, num_canaries=6, kind="gaussian")
    for j in (0, 5):
        gen = torch.Generator().manual_seed(canary_seed(5, j))
        ref = torch.randn(4001, generator=gen)
        ref = ref / torch.linalg.vector_norm(ref)
        assert torch.equal(cs.canary(j), ref)


def test_batch_rows_are_the_canaries_times_scale():
    single = CanarySet(seed=1, dim=3000, num_canaries=4, kind="gaussian")
    rows = single.batch(range(4), scale=0.5)
    assert torch.equal(rows, torch.stack([single.canary(j, scale=0.5) for j in range(4)]))
    assert torch.equal(single.batch([2, 0, 2]), torch.stack([single.canary(j) for j in (2, 0, 2)]))


def test_clipping_is_min_one_c_over_norm_times_u():
    # DP-FedAvg's clipping gives the bits of the formula min(1, C / ||u||) * u
    from audit_callbacks.federated import clipping

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 20_001, generator=g) * torch.tensor([0.1, 0.5, 1.0, 2.0, 30.0, 1.0, 0.0])[:, None]
    for clip_norm in (1.0, 0.37, 3):
        for _ in range(2):
            eager = rows.clone()
            norms = torch.linalg.vector_norm(eager, dim=1)
            eager.mul_(torch.clamp(clip_norm / norms.clamp_min(1e-12), max=1.0).unsqueeze(1))
            got = rows.clone()
            assert torch.equal(clipping.clip_updates_(got, clip_norm), norms)
            assert torch.equal(got, eager)
        assert torch.all(torch.linalg.vector_norm(got.double(), dim=1) <= clip_norm * (1 + 1e-6))
    assert torch.equal(got[6], torch.zeros(20_001))  # a zero update stays zero


def _run(cs, deltas, theta, *, max_buffered=1000, flush_at=(), reload_at=()):
    st = CanaryStatistics(cs, 12, 12, max_buffered=max_buffered)
    st.set_initial(torch.zeros(cs.dim))
    for i, delta in enumerate(deltas, 1):
        assert st.add_delta(delta)
        if i in flush_at:
            st.flush()
        if i in reload_at:  # a checkpoint (flushes) and a fresh object, as a resumed run
            resumed = CanaryStatistics(cs, 12, 12, max_buffered=max_buffered)
            resumed.load_state_dict(st.state_dict())
            st = resumed
    return st.compute(theta)


@pytest.mark.parametrize("dim", [64, 3000])
def test_all_iterates_do_not_depend_on_when_the_passes_run(dim):
    # max_buffered=1 puts a single delta in every pass: a product over the pending columns only
    # (a matrix-vector product in disguise) rounds differently from the fixed 16-wide block.
    torch.manual_seed(0)
    cs = CanarySet(seed=1, dim=dim, num_canaries=24, kind="gaussian")
    assert group_rounds(dim) == 16
    deltas = [torch.randn(dim) for _ in range(37)]
    theta = sum(deltas)
    ref = _run(cs, deltas, theta)
    variants = (
        {"max_buffered": 1},
        {"max_buffered": 5},
        {"flush_at": {1, 2, 17, 18, 33}},
        {"reload_at": {3, 16, 20, 36}},
        {"max_buffered": 7, "reload_at": {9}},
    )
    for kwargs in variants:
        got = _run(cs, deltas, theta, **kwargs)
        for key in ref:
            assert torch.equal(got[key], ref[key]), (kwargs, key)
    # deltas whose cosines are all negative for some canaries: a resumed block's zero rows
    # (rounds folded before the checkpoint) must not enter the maximum
    away = -sum(cs.canary(j) for j in range(24))  # every canary's cosine about -1/sqrt(24)
    neg = [away + 0.01 * torch.randn(dim) for _ in range(20)]
    ref_neg = _run(cs, neg, sum(neg))
    got_neg = _run(cs, neg, sum(neg), reload_at={5, 7})
    assert (ref_neg["all_observed"] < 0).all()
    for key in ref_neg:
        assert torch.equal(got_neg[key], ref_neg[key]), key
    # the final-model column is the per-column product of CanarySet.cosines, bit for bit
    assert torch.equal(ref["final_observed"], cs.cosines(theta)[:12])
    # and the all-iterates maxima are the exact ones up to float32 rounding of the products
    full = torch.stack([cs.canary(j) for j in range(24)]).double()
    deltas64 = torch.stack(deltas).double()
    exact = ((full @ deltas64.t()) / torch.linalg.vector_norm(deltas64, dim=1)).max(dim=1).values
    assert torch.allclose(ref["all_observed"], exact[:12], rtol=1e-5, atol=1e-7)
    assert torch.allclose(ref["all_unobserved"], exact[12:], rtol=1e-5, atol=1e-7)


def test_group_rounds_bounds_a_block_to_8_mib():
    assert group_rounds(13_706) == 16
    assert group_rounds(1_000_000) == 2
    assert group_rounds(10_000_000) == 1


@pytest.mark.parametrize("kind", ["gaussian", "hadamard"])
def test_cosines_without_the_finite_check_give_nan_columns_and_read_nothing_back(kind, monkeypatch):
    # check_finite=False: the same cosines for finite vectors, NaN in a non-finite vector's
    # column (the others untouched), and no tensor is turned into a Python bool on the way
    cs = CanarySet(seed=3, dim=300, num_canaries=12, kind=kind)
    g = torch.Generator().manual_seed(0)
    good = torch.randn(300, generator=g)
    bad = good.clone()
    bad[7] = float("inf")
    assert torch.equal(cs.cosines(good, check_finite=False), cs.cosines(good))
    calls = []
    real_bool = torch.Tensor.__bool__

    def counting_bool(self):
        calls.append(tuple(self.shape))
        return real_bool(self)

    monkeypatch.setattr(torch.Tensor, "__bool__", counting_bool)
    both = cs.cosines([good, bad], check_finite=False)
    monkeypatch.undo()
    assert calls == []
    assert torch.isnan(both[:, 1]).all() and torch.isfinite(both[:, 0]).all()
    assert torch.allclose(both[:, 0], cs.cosines(good))
    with pytest.raises(ValueError, match="NaN or inf"):
        cs.cosines([good, bad])


def test_hadamard_sum_takes_more_indices_than_canaries() -> None:
    # repeated indices are allowed (a canary drawn in two accumulated batches appears twice):
    # more of them than there are canaries must sum, not fail on the cached vector of ones
    cs = CanarySet(0, 64, 3, kind="hadamard")
    idx = [0, 1, 0, 1, 0, 2, 2]
    rows = cs.batch(idx)
    assert torch.allclose(cs.sum(idx), rows.sum(0), atol=1e-6)
    assert torch.allclose(cs.sum([0, 1]), rows[:2].sum(0), atol=1e-6)  # the grown cache serves short calls
