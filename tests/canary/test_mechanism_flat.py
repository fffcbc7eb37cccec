"""The noise checks' sums of squares from one flat buffer: each tensor's sum equals the float64
sum of its squares (within float32 rounding of a row), with momentum and integer extras, a
non-finite difference never reaches the sums of the release itself, the number of
dispatched ops of a fold does not grow with the number of parameter tensors (19 aten events
in all), and the fold has the bits of the fold before it took that few (flags, sums, counts)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from audit_callbacks import names
from audit_callbacks.canary.mechanism import CHUNK, NoiseChecks


def _release(vec, extras=None):
    return types.SimpleNamespace(vector=vec, extras=extras)


def _reference(vecs, sizes, momentum=0.0):
    """Per-tensor float64 sums of squares of the folded vectors and of their differences."""
    folded, prev_delta = [], None
    for v in vecs:
        v = v.double()
        folded.append(v if prev_delta is None or not momentum else v - momentum * prev_delta)
        prev_delta = v
    e1 = sum(torch.stack([x.square().sum() for x in f.split(sizes)]) for f in folded)
    e2 = sum(torch.stack([x.square().sum() for x in (b - a).split(sizes)])
             for a, b in zip(folded, folded[1:], strict=False))
    return torch.cat([e1, e2])


LAYOUTS = [
    [1],
    [CHUNK],  # one whole row
    [CHUNK - 1, 1, CHUNK + 1, 2 * CHUNK],  # boundaries just before, at and after row ends
    [3, 5, 7, 1, 1, 1, 900],  # several boundaries inside one row
    [1000, 3, 4096, 7, 64, 10],
]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("sizes", LAYOUTS)
def test_sums_of_squares_are_the_per_tensor_sums(sizes, momentum):
    gen = torch.Generator().manual_seed(len(sizes))
    vecs = [torch.randn(sum(sizes), generator=gen) * s for s in (0.5, 2.0, 1.0, 30.0)]
    checks = NoiseChecks([(f"t{i}", s) for i, s in enumerate(sizes)], 1.0, momentum=momentum)
    for v in vecs:
        assert bool(checks.fold(_release(v)))
    got = checks._buffers["e"]
    ref = _reference(vecs, sizes, momentum)
    # float32 within a row of CHUNK entries: about 1e-7 of the sum of the rows a tensor's ends
    # fall in (the old per-tensor norms: about 1e-7 of the tensor's own sum)
    assert torch.all((got - ref).abs() <= 1e-6 * _row_sums(vecs, sizes, momentum)), (got, ref)
    assert checks.counts() == (4, 3)


def _row_sums(vecs, sizes, momentum):
    """Per tensor, the float64 sums of squares of the rows of CHUNK entries its two ends fall
    in, over the folded vectors (then over their differences)."""
    starts = np.concatenate(([0], np.cumsum(sizes)))
    folded = [vecs[0].double()] + [b.double() - momentum * a.double() for a, b in zip(vecs, vecs[1:], strict=False)]
    diffs = [b - a for a, b in zip(folded, folded[1:], strict=False)]
    out = []
    for group in (folded, diffs):
        for lo, hi in zip(starts[:-1], starts[1:], strict=True):
            total = 0.0
            for v in group:
                for x in (lo, hi - 1):
                    r = x // CHUNK
                    total += float(v[r * CHUNK:(r + 1) * CHUNK].square().sum())
            out.append(total)
    return torch.tensor(out, dtype=torch.float64)


def test_a_non_finite_release_is_skipped_and_its_difference_never_reaches_the_next_release():
    sizes = [300, 5, CHUNK, 40]
    gen = torch.Generator().manual_seed(0)
    a, c, d = (torch.randn(sum(sizes), generator=gen) for _ in range(3))
    bad = a.clone()
    bad[303] = float("nan")  # in the second tensor: the sums from there on are not finite
    checks = NoiseChecks([(f"t{i}", s) for i, s in enumerate(sizes)], 1.0)
    flags = [bool(checks.fold(_release(v))) for v in (a, bad, c, d)]
    # the release after the bad one is finite (its difference is not: not counted), the next whole
    assert flags == [True, False, True, True]
    assert checks.counts() == (3, 1)
    ref = torch.cat([_reference([a, c, d], sizes)[:4], _reference([c, d], sizes)[4:]])
    torch.testing.assert_close(checks._buffers["e"], ref, rtol=1e-6, atol=0)


def test_integer_extras_are_checked_as_further_groups():
    sizes, extra = [50, 7], [("counter", 3)]
    checks = NoiseChecks([("w", 50), ("b", 7)], 0.25, extra_tensors=extra)
    gen = torch.Generator().manual_seed(1)
    vecs = [torch.randn(57, generator=gen) * 0.25 for _ in range(3)]
    extras = [torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0, 3.0, 1.0])]
    for v, x in zip(vecs, extras, strict=True):
        assert bool(checks.fold(_release(v, x)))
    full = [torch.cat([v, x]) for v, x in zip(vecs, extras, strict=True)]
    torch.testing.assert_close(checks._buffers["e"], _reference(full, sizes + [3]), rtol=1e-6, atol=0)
    assert int(checks._buffers["integral"][0]) == 3
    res = checks.results(0.05)
    assert set(res) == {"noise_scale_ratio", "fresh_noise_ratio"}


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _all_aten_events(fn) -> int:
    """Every aten op event of ``fn()`` in the CPU profiler, those inside other ops included."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith("aten::") for e in prof.events())


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_a_fold_costs_the_same_ops_whatever_the_number_of_tensors(momentum):
    dispatched, events = [], []
    for sizes in ([1800, 60, 90, 3], [50] * 48, [7] * 300):
        checks = NoiseChecks([(f"t{i}", s) for i, s in enumerate(sizes)], 1.0, momentum=momentum)
        v = torch.randn(sum(sizes))
        checks.fold(_release(v))
        checks.fold(_release(v))
        with _Ops() as mode:
            checks.fold(_release(v))
        dispatched.append(mode.count)
        events.append(_all_aten_events(lambda c=checks, v=v: c.fold(_release(v))))
    # before: 28 and 31 dispatched (one _foreach_norm), but 2 norms a tensor inside it on the
    # CPU: 2 x (4, 48, 300) more profiler events; then 24 and 25
    assert len(set(dispatched)) == 1 and dispatched[0] <= (18 if momentum else 17), dispatched
    assert len(set(events)) == 1, events
    # every event, nested ones included (before: 58 and 59: the square's pow_, the float64
    # conversion inside cumsum, the count gate's selects and stack; then 47 and 48: the tail
    # rows' index_select and where, the gate, the squares' abs and all, the count's
    # conversion, the flag's select)
    assert events[0] <= (20 if momentum else 19), events


def test_momentum_without_a_mask_is_the_masked_recovery_bit_for_bit():
    """The previous delta starts at zeros (and a restart zeroes it): ``vec - beta * 0`` is
    ``vec`` bit for bit, so no mask is needed for the first release after a (re)start. Against
    the masked recovery (``head = vec - beta * delta`` only once a delta was released since the
    last restart), folded by a momentum-free instance: the same flags, sums and counts, with a
    NaN release, a -inf release and a restart in the sequence."""
    sizes, beta = [300, 5, 40], 0.9
    gen = torch.Generator().manual_seed(7)
    vecs = [torch.randn(345, generator=gen) for _ in range(10)]
    vecs[3] = vecs[3].clone()
    vecs[3][4] = float("nan")
    vecs[6] = vecs[6].clone()
    vecs[6][340] = -float("inf")
    mine = NoiseChecks([(f"t{i}", s) for i, s in enumerate(sizes)], 1.0, momentum=beta)
    ref = NoiseChecks([(f"t{i}", s) for i, s in enumerate(sizes)], 1.0)
    delta, flags = None, []
    for t, v in enumerate(vecs):
        if t == 5:  # a new fit
            mine.restart()
            ref.restart()
            delta = None
        head = v.clone() if delta is None else torch.sub(v, delta, alpha=beta)
        delta = v
        flags.append((bool(mine.fold(_release(v))), bool(ref.fold(_release(head)))))
    # the bad releases and the ones after them (their recovery reads the bad delta)
    assert all(a == b for a, b in flags) and [t for t, (a, _) in enumerate(flags) if not a] == [3, 4, 6, 7]
    assert torch.equal(mine._buffers["e"], ref._buffers["e"]) and torch.equal(mine._buffers["n"], ref._buffers["n"])


def test_checkpoint_round_trip_keeps_the_sums():
    checks = NoiseChecks([("a", 10), ("b", 300)], 1.0)
    for s in range(3):
        checks.fold(_release(torch.randn(310, generator=torch.Generator().manual_seed(s))))
    other = NoiseChecks([("a", 10), ("b", 300)], 1.0)
    other.load_state_dict(checks.state_dict())
    assert np.array_equal(other._buffers["e"].numpy(), checks._buffers["e"].numpy())
    assert other.counts() == checks.counts() == (3, 2)


class _NoiseChecksBefore(NoiseChecks):
    """The fold as it was before it took 19 aten events (47): the tail rows by an
    index_select and a where, a gate tensor for the first difference, finiteness from the
    squares' absolute values, the count added as a bool. The reference of the bits."""

    def _on(self, like):
        buf = self._buffers
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        if buf is not None and buf["cur"].device == like.device and buf["cur"].dtype == dtype:
            return buf
        dev, m = like.device, len(self.sizes)
        old = buf
        full = self.dim + self.extra
        chunks, ends = -(-full // CHUNK), m + 1
        block = chunks + ends
        both = torch.zeros((1 + 2 * block) * CHUNK, dtype=dtype, device=dev)
        blocks = both[CHUNK:].view(2, block, CHUNK)
        starts = np.concatenate(([0], np.cumsum(self.sizes)))
        first = 1 + block * np.arange(2)[:, None]
        row = first + starts[None, :] // CHUNK
        tail = first + chunks + np.arange(ends)[None, :]
        terms = np.stack((row[:, 1:] - 1, row[:, :-1] - 1, tail[:, 1:], tail[:, :-1], tail[:, :-1] - 1), -1)
        buf = {
            "both": both, "cur": blocks[0].reshape(-1)[:full], "diff": blocks[1].reshape(-1)[:full],
            "rows": both.view(-1, CHUNK), "tails": blocks[:, chunks:],
            "row": torch.as_tensor(row.reshape(-1), dtype=torch.int64, device=dev),
            "before": (torch.arange(CHUNK)[None, None, :]
                       < torch.as_tensor(starts % CHUNK)[None, :, None]).expand(2, ends, CHUNK).to(dev),
            "terms": torch.as_tensor(terms.reshape(-1, 5), dtype=torch.int64, device=dev),
            "signs": torch.tensor([1.0, -1.0, 1.0, -2.0, 1.0], dtype=torch.float64, device=dev),
            "zero": torch.zeros((), dtype=dtype, device=dev),
            "prev": torch.zeros(full, dtype=dtype, device=dev),
            "delta": torch.zeros(self.dim, dtype=dtype, device=dev),
            "e": torch.zeros(2 * m, dtype=torch.float64, device=dev),
            "n": torch.zeros(2, dtype=torch.float64, device=dev),
            "gate": torch.tensor([True, False], device=dev),
            "norms64": torch.zeros(1 + 2 * block, dtype=torch.float64, device=dev),
            "cums": torch.zeros(1 + 2 * block, dtype=torch.float64, device=dev),
        }
        buf["has_prev"] = buf["gate"][1]
        buf["squares"] = torch.zeros(2 * m, dtype=torch.float64, device=dev)
        buf["squares2"], buf["e2"] = buf["squares"].view(2, m), buf["e"].view(2, m)
        buf["zero64"] = torch.zeros((), dtype=torch.float64, device=dev)
        if old is not None:
            buf["e"].copy_(old["e"].to(dev))
            buf["n"].copy_(old["n"].to(dev))
            # (since: the previous delta carried over too; before, a release of another dtype
            # was folded against a zero delta under server momentum)
            buf["delta"].copy_(old["delta"].to(device=dev, dtype=buf["delta"].dtype))
        buf["integral"] = torch.zeros(len(self.sizes) - self._first_extra, dtype=torch.int64, device=dev)
        if old is not None:
            buf["integral"].copy_(old["integral"].to(dev))
        self._buffers = buf
        self._extra_views = list(torch.split(buf["cur"], self.sizes))[self._first_extra:]
        return buf

    def fold(self, release):
        vec = release.vector
        vec = vec if vec.dim() == 1 else vec.reshape(-1)
        b = self._on(vec)
        if vec.dtype != b["cur"].dtype:
            vec = vec.to(b["cur"].dtype)
        cur = b["cur"]
        head = cur[:self.dim] if self.extra else cur
        if self.momentum:
            torch.sub(vec, b["delta"], alpha=self.momentum, out=head)
            b["delta"].copy_(vec)
        else:
            head.copy_(vec)
        if self.extra:
            extras = getattr(release, "extras", None)
            if extras is None or extras.numel() != self.extra:
                cur[self.dim:].fill_(float("nan"))
            else:
                cur[self.dim:].copy_(extras.reshape(-1))
                whole = torch.stack([(v == v.round()).all() for v in self._extra_views])
                b["integral"].add_(whole.to(torch.int64))
        torch.sub(cur, b["prev"], out=b["diff"])
        rows = b["rows"]
        picked = rows.index_select(0, b["row"]).view(b["before"].shape)
        torch.where(b["before"], picked, b["zero"], out=b["tails"])
        norms = torch.linalg.vector_norm(rows, dim=1)
        b["norms64"].copy_(norms.mul_(norms))
        cums = torch.cumsum(b["norms64"], 0, out=b["cums"])
        torch.mv(torch.take(cums, b["terms"]), b["signs"], out=b["squares"])
        squares = b["squares2"]
        finite = (squares.abs() < float("inf")).all(1)
        counted = finite & b["gate"] & finite[:1]
        b["e2"].add_(torch.where(counted.unsqueeze(1), squares, b["zero64"]))
        b["n"].add_(counted)
        b["prev"].copy_(cur)
        b["has_prev"].fill_(True)
        return counted[0]

    def restart(self):
        if self._buffers is not None:
            self._buffers["has_prev"].fill_(False)
            self._buffers["delta"].zero_()


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("sizes", [*LAYOUTS, [32 * 32, 32] * 23 + [128, 4]])
@pytest.mark.parametrize("extra", [(), (("counter", 3),)])
def test_the_fold_has_the_bits_of_before(sizes, momentum, extra):
    """Against the fold as it was: the same flags, sums, counts and integral counts, bit for
    bit, over releases with NaN, -inf and float32-overflowing entries, a restart, a float64
    release (new buffers, the sums carried over), a missing extras and a checkpoint resume.
    The prefix sum at each half's last row stands for the finiteness of every sum of the half;
    a NaN previous release for the gate of the first difference."""
    tensors = [(f"t{i}", s) for i, s in enumerate(sizes)]
    mine = NoiseChecks(tensors, 1.0, momentum=momentum, extra_tensors=extra)
    ref = _NoiseChecksBefore(tensors, 1.0, momentum=momentum, extra_tensors=extra)
    gen = torch.Generator().manual_seed(sum(sizes))
    d = sum(sizes)
    for t in range(14):
        v = torch.randn(d, generator=gen) * (0.5 + t)
        if t == 2:
            v[d // 2] = float("nan")
        if t == 5:
            v[-1] = -float("inf")
        if t == 8:
            v[0] = 3e20  # finite, but its row's float32 norm squared overflows
        if t == 11:
            v = v.double()
        if t in (7, 12):
            mine.restart()
            ref.restart()
        extras = torch.tensor([1.0, float(t), 2.0]) if extra and t != 4 else None
        got, want = mine.fold(_release(v, extras)), ref.fold(_release(v, extras))
        assert got.dtype == want.dtype == torch.bool and got.shape == want.shape == ()
        assert bool(got) == bool(want), t
    for key in ("e", "n", "integral"):
        assert mine._buffers[key].dtype == ref._buffers[key].dtype
        assert mine._buffers[key].numpy().tobytes() == ref._buffers[key].numpy().tobytes(), key
    assert mine.counts() == ref.counts() and 0 < mine.counts()[1] < mine.counts()[0] < 14
    resumed, ref_resumed = (cls(tensors, 1.0, momentum=momentum, extra_tensors=extra)
                            for cls in (NoiseChecks, _NoiseChecksBefore))
    resumed.load_state_dict(mine.state_dict())
    ref_resumed.load_state_dict(ref.state_dict())
    for _ in range(3):
        v = torch.randn(d, generator=gen)
        extras = torch.tensor([0.0, 1.0, 5.0]) if extra else None
        assert bool(resumed.fold(_release(v, extras))) == bool(ref_resumed.fold(_release(v, extras)))
    assert resumed._buffers["e"].numpy().tobytes() == ref_resumed._buffers["e"].numpy().tobytes()
    assert resumed.counts() == ref_resumed.counts()


def test_resume_with_server_momentum_leaves_out_the_release_whose_noise_is_unknown() -> None:
    """With server momentum a release's noise part is delta_t - beta delta_(t-1). A resumed fit
    does not hold delta_(t-1): its first release is left out of both checks, and the sums go
    on as in the uninterrupted run (before, beta delta_(t-1) was counted as noise energy, which
    hides too little noise: the noise-scale check is one-sided)."""
    beta, std, split = 0.9, 0.5, 6
    tensors = [("w", 300), ("b", 20)]
    gen = torch.Generator().manual_seed(0)
    deltas, prev = [], torch.zeros(320)
    for _ in range(12):
        prev = beta * prev + std * torch.randn(320, generator=gen) + 0.3  # drift: not noise
        deltas.append(prev.clone())

    def folded(checks: NoiseChecks, vectors: list[torch.Tensor]) -> None:
        for v in vectors:
            checks.fold(types.SimpleNamespace(vector=v, extras=None))

    whole = NoiseChecks(tensors, std, reads="model_delta", momentum=beta)
    folded(whole, deltas)
    first = NoiseChecks(tensors, std, reads="model_delta", momentum=beta)
    folded(first, deltas[:split])
    resumed = NoiseChecks(tensors, std, reads="model_delta", momentum=beta)
    resumed.load_state_dict(first.state_dict())
    folded(resumed, deltas[split:])
    # the uninterrupted sums less release `split` (and, for the differences, the two that read it)
    n1, n2 = whole.counts()
    assert resumed.counts() == (n1 - 1, n2 - 2)
    e_whole = whole.state_dict()["e1"]
    e_res = resumed.state_dict()["e1"]
    noise_part = deltas[split] - beta * deltas[split - 1]
    left_out = [float((noise_part[:300] ** 2).sum()), float((noise_part[300:] ** 2).sum())]
    assert np.allclose(np.add(e_res, left_out), e_whole, rtol=1e-5)


def test_resume_marker_survives_a_release_of_another_dtype() -> None:
    """load_state_dict builds float32 buffers; a float64 (or CUDA) release rebuilds them: the
    resumed release's unknown momentum carry-over must still leave it out (before, the rebuilt
    delta was zeros and a noiseless release added its whole energy)."""
    beta, tensors = 0.9, [("w", 300), ("b", 20)]
    gen = torch.Generator().manual_seed(1)
    first = NoiseChecks(tensors, 0.5, reads="model_delta", momentum=beta)
    for _ in range(4):
        first.fold(types.SimpleNamespace(vector=torch.randn(320, generator=gen), extras=None))
    resumed = NoiseChecks(tensors, 0.5, reads="model_delta", momentum=beta)
    resumed.load_state_dict(first.state_dict())
    before = resumed.counts(), list(resumed.state_dict()["e1"])
    resumed.fold(types.SimpleNamespace(vector=torch.randn(320, generator=gen, dtype=torch.float64) + 5.0,
                                       extras=None))
    assert (resumed.counts(), list(resumed.state_dict()["e1"])) == before
    resumed.fold(types.SimpleNamespace(vector=torch.randn(320, generator=gen, dtype=torch.float64),
                                       extras=None))
    assert resumed.counts()[0] == before[0][0] + 1  # the next one is folded


def _integer_buffer_runs(noise_std: float, split: int | None, rounds: int = 12) -> dict:
    """Releases of one float tensor with its noise and an integer buffer whose change is local
    steps plus the noise cast to int (truncated toward zero, as numpy's astype)."""
    gen = torch.Generator().manual_seed(2)
    checks = NoiseChecks([("w", 400)], noise_std, reads="model_delta",
                         extra_tensors=[("num_batches_tracked", 1)])
    for t in range(rounds):
        if split is not None and t == split:
            state = checks.state_dict()
            checks = NoiseChecks([("w", 400)], noise_std, reads="model_delta",
                                 extra_tensors=[("num_batches_tracked", 1)])
            checks.load_state_dict(state)
        steps = 50.0 + noise_std * torch.randn(1, generator=gen)
        checks.fold(types.SimpleNamespace(vector=noise_std * torch.randn(400, generator=gen),
                                          extras=steps.trunc()))
    return checks.results(0.05)


@pytest.mark.parametrize("noise_std", [0.3, 0.8, 0.95])
def test_an_integer_buffer_whose_noise_was_cast_away_is_flagged_also_after_a_resume(noise_std) -> None:
    """Below a std of 1 a noise cast to an integer is 0 in most draws (70% at 0.95 truncated);
    the whole-number changes name the buffer, with or without a resume (its count is in the
    checkpoint: before, a resume lost it and the fault passed)."""
    for split in (None, 6):
        res = _integer_buffer_runs(noise_std, split)[names.NOISE_SCALE_RATIO]
        assert res.details["rejected"] and res.details["group"] == "num_batches_tracked", (split, res)
