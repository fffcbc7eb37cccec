"""The noise checks' sums of squares from one flat buffer: each tensor's sum equals the float64
sum of its squares (within float32 rounding of a row), with momentum and integer extras, a
non-finite difference never reaches the sums of the release itself, and the number of
dispatched ops of a fold does not grow with the number of parameter tensors."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

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
    # CPU: 2 x (4, 48, 300) more profiler events
    assert len(set(dispatched)) == 1 and dispatched[0] <= (25 if momentum else 24), dispatched
    assert len(set(events)) == 1, events
    # every event, nested ones included (before: 58 and 59: the square's pow_, the float64
    # conversion inside cumsum, the count gate's selects and stack)
    assert events[0] <= (48 if momentum else 47), events


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
