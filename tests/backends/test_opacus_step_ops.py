"""The Opacus canary audit's per-step work in few ops, with the bits of before.

* :class:`~audit_callbacks.backends.opacus.buffers.FlatGather` gathers tensors into one reused buffer by one op,
  equal bit for bit to the ``torch.cat`` of flattened casts it replaces;
* the steps-unknown statistic's per-step fold (Hadamard canaries) equals the reference
  ``sums += where(ok, steps_unknown_increment(dots / C, q, sigma), 0)`` bit for bit over
  random dots, clip norms, rates and noise multipliers, non-finite steps included; its
  finiteness check equals ``isfinite(x).all()`` on planted NaN / inf / huge entries;
* an Opacus run: the release's deltas are ``flat_parameters`` differences bit for bit, a
  persistent injector (its canary-row views cached per number of rows, reused across steps)
  trains bit-identically to fresh injectors (no cache) at every step;
* op counts (``torch.profiler``): the noisy sum is one op, the release's delta two, the canary
  rows' split into parameters none once their number has been seen, the fold of a step at most
  9 beyond the canaries' own transform (11 aten events in all; the code before: 25, 38, 37 and
  19, then 11 and 24 events); a run's finiteness flags are counted when read, whatever the
  number kept pending;
* the canary rows clipped as one flat parameter: the audit adds almost the same number of ops
  to a logical step of an MLP with 6 and with 48 parameter tensors (at most 300 aten events at
  48 tensors, nested ones included, and at most 4 a further tensor; measured +248 and 2, and
  +86 top-level ops; before: +593 top-level and +2,525 in all, then +368 in all), the summed
  gradient is the per-parameter blocks' up to float32 rounding, and the optimizer's
  ``param_groups`` are put back even when its clipping raises.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.backends.opacus.backend import OpacusBackend
from audit_callbacks.backends.opacus.buffers import FlatGather, flat_parameters
from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
from audit_callbacks.canary import steps_unknown
from audit_callbacks.canary.steps_unknown import (
    StepsUnknownScores,
    _all_finite,
    steps_unknown_increment,
)
from audit_callbacks.canary.vectors import CanarySet

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|does not have many workers|Optimal order|fewer than 2|too few).*")


def _aten_ops(fn) -> tuple[int, list[str]]:
    """The top-level aten ops ``fn()`` dispatches (those not inside another aten op)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = []
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            names.append(e.name)
    return len(names), names


# ------------------------------------------------------------------ FlatGather


def test_flat_gather_is_the_concatenation_bit_for_bit_in_one_op():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(3, 4, generator=gen), torch.randn(5, generator=gen, dtype=torch.float64),
             torch.randn(2, 1, 2, generator=gen).half(), torch.randn(0)]
    promoted = FlatGather()
    flat = promoted.gather(parts)
    assert flat.dtype == torch.float64 and torch.equal(flat, torch.cat([p.reshape(-1) for p in parts]))
    as32 = FlatGather(torch.float32)
    ref = torch.cat([p.reshape(-1).to(torch.float32) for p in parts])
    assert torch.equal(as32.gather(parts), ref)
    # the same buffer next time, refilled; one op
    params = [nn.Parameter(torch.randn(4, 3, generator=gen)), nn.Parameter(torch.randn(3, generator=gen))]
    g = FlatGather(torch.float32)
    first = g.gather(params)
    assert not first.requires_grad
    with torch.no_grad():
        params[0].mul_(2.0)
    copies = [p.detach().clone() for p in params]
    n, names = _aten_ops(lambda: g.gather(copies))  # other storages: one op
    assert n == 1 and names == ["aten::_foreach_copy_"]
    assert g.flat is first and torch.equal(first, flat_parameters(params))
    # the same storages on two calls in a row (persistent tensors): from then on one cat of
    # aliases, one aten event in all (not one copy_ a tensor), the updated values bit for bit
    g.gather(params)
    assert torch.equal(g.gather(params), flat_parameters(params))
    with torch.no_grad():
        params[1].add_(1.5)
    n, names = _aten_ops(lambda: g.gather(params))
    assert names == ["aten::cat"] and _all_events(lambda: g.gather(params)) == 1
    assert g.flat is first and torch.equal(first, flat_parameters(params))
    # a new layout: a new buffer
    other = g.gather([torch.ones(2, 2)])
    assert other is not first and torch.equal(other, torch.ones(4))
    with pytest.raises(ValueError, match="tensors"):
        g.gather([])


def test_flat_gather_of_new_or_replaced_tensors_copies_them():
    """Tensors made anew every call (``p.grad``) stay on ``_foreach_copy_`` (no aliases kept
    after a miss); a parameter whose storage is replaced is read from its new storage."""
    gen = torch.Generator().manual_seed(3)
    g = FlatGather(torch.float32)
    for _ in range(4):  # new tensors each call (the allocator may give back the same addresses)
        grads = [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]
        assert torch.equal(g.gather(grads), flat_parameters(grads))
    g.gather(grads)  # the same tensors twice: aliased (if not already)
    other = [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]
    assert torch.equal(g.gather(other), flat_parameters(other))  # a miss: no aliases from now on
    g.gather(other)
    assert _all_events(lambda: g.gather(other)) == 3  # _foreach_copy_ and its two copy_
    assert torch.equal(g.flat, flat_parameters(other))
    params = [nn.Parameter(torch.randn(4, 3, generator=gen)), nn.Parameter(torch.randn(3, generator=gen))]
    h = FlatGather(torch.float32)
    for _ in range(3):
        h.gather(params)
    params[0].data = torch.randn(4, 3, generator=gen)  # a new storage
    assert torch.equal(h.gather(params), flat_parameters(params))
    t = torch.randn(3, 4, generator=gen)
    mixed = FlatGather(torch.float32)  # a non-contiguous tensor: never aliased
    for _ in range(3):
        assert torch.equal(mixed.gather([t.t(), params[1]]), torch.cat([t.t().reshape(-1), params[1].detach()]))


# ------------------------------------------------------------------ the steps-unknown fold


def _reference_sums(cs: CanarySet, vecs, rates, clip: float, sigma: float) -> torch.Tensor:
    """The per-step fold as it was before the change (torch.isfinite, the increment
    function, torch.where, a slice added back)."""
    total = torch.zeros(len(cs), dtype=torch.float64)
    for g, q in zip(vecs, rates, strict=True):
        ok = torch.isfinite(g).all()
        y = cs.dots(g) / clip
        total[0:len(cs)] += torch.where(ok, steps_unknown_increment(y, q, sigma), 0.0)
    return total


@pytest.mark.parametrize("clip,sigma", [(1.0, 1.0), (0.7, 1.3), (3.0, 0.55), (1.0, 2.7), (0.25, 0.1)])
def test_hadamard_fold_is_the_reference_bit_for_bit(clip, sigma):
    dim, k, kk = 300, 20, 30
    cs = CanarySet(5, dim, k + kk, kind="hadamard")
    gen = torch.Generator().manual_seed(1)
    vecs = [torch.randn(dim, generator=gen) * s for s in (0.1, 1.0, 10.0, 100.0) for _ in range(4)]
    rates = [0.013, 0.25, 0.5, 1.0] * 4
    bad = vecs[5].clone()
    bad[7] = float("nan")
    vecs[5] = bad
    inf = vecs[9].clone()
    inf[299] = -float("inf")  # outside the Hadamard coordinates (n = 256): still a skipped step
    vecs[9] = inf
    s = StepsUnknownScores(cs, k, kk, max_grad_norm=clip, noise_multiplier=sigma)
    for g, q in zip(vecs, rates, strict=True):
        s.update(g, q)
    ref = _reference_sums(cs, vecs, rates, clip, sigma)
    assert torch.equal(s._sums, ref)
    assert s.steps_skipped == 2 and s.steps_seen == 14
    # steps 5 and 9 (q = 0.25) left out; no two neighbouring runs share a q
    assert s.history == [(sigma, q, 1) for q in (0.013, 0.25, 0.5, 1.0, 0.013, 0.5, 1.0, 0.013, 0.5, 1.0,
                                                  0.013, 0.25, 0.5, 1.0)]
    # a checkpoint taken now and restored gives the same sums, counts and history
    other = StepsUnknownScores(cs, k, kk, max_grad_norm=clip, noise_multiplier=sigma)
    other.load_state_dict(s.state_dict())
    assert torch.equal(other._sums, s._sums) and other.history == s.history
    assert other.steps_skipped == 2 and other.steps_seen == 14


def test_fold_ops_per_step_and_constants_made_once():
    cs = CanarySet(2, 4096, 64, kind="hadamard")
    s = StepsUnknownScores(cs, 32, 32, max_grad_norm=0.9, noise_multiplier=1.1)
    g = torch.randn(4096)
    s.update(g, 0.1)
    dots = cs.dots(g)
    cs.dots = lambda v: dots  # count the fold's own ops, not the transform's
    n, names = _aten_ops(lambda: s.update(g, 0.1))
    # aminmax, neg, maximum and lt (finite?), div (/ C), sub_, div_, add_, logaddexp, where,
    # add_ (the sums); the run's count keeps the flag as it is. Before: 19 (isfinite + all,
    # four count updates, a slice copied back, ...), then 11 (a float64 sum, sub, eq and the
    # count's add_), then 9 with max |x| < inf by vector_norm, which took ~25x aminmax's time
    # at d = 10^6 on the CPU (2.8 against 0.1 ms a step)
    assert n <= 11, names
    assert "aten::isfinite" not in names and "aten::copy_" not in names
    assert _all_events(lambda: s.update(g, 0.1)) <= 13  # 24 with the sum's and adds' conversions
    assert len(s._constants) == 2  # log1p(-q) and 0, on the CPU


@pytest.mark.parametrize("pending", [1, 3, 4096])
def test_finiteness_flags_of_a_run_are_counted_when_read(monkeypatch, pending):
    """A run's finiteness flags are kept as they are and summed every ``_PENDING_FLAGS``
    steps (no device op a step): the history, the counts of seen and skipped steps and a
    checkpoint are those of the steps given, whatever that number."""
    monkeypatch.setattr(steps_unknown, "_PENDING_FLAGS", pending)
    cs = CanarySet(5, 300, 40, kind="hadamard")
    s = StepsUnknownScores(cs, 20, 20, max_grad_norm=1.0, noise_multiplier=1.3)
    gen = torch.Generator().manual_seed(4)
    rates = [0.1] * 7 + [0.2] * 5 + [0.1] * 9
    bad = {2, 3, 8, 12, 20}
    for t, q in enumerate(rates):
        g = torch.randn(300, generator=gen)
        if t in bad:
            g[t] = float("nan") if t % 2 else float("inf")
        assert bool(s.update(g, q)) == (t not in bad)
    assert s.history == [(1.3, 0.1, 5), (1.3, 0.2, 4), (1.3, 0.1, 7)]
    assert s.steps_skipped == 5 and s.steps_seen == 16
    other = StepsUnknownScores(cs, 20, 20, max_grad_norm=1.0, noise_multiplier=1.3)
    other.load_state_dict(s.state_dict())
    assert other.history == s.history and other.steps_skipped == 5 and other.steps_seen == 16
    assert torch.equal(other._sums, s._sums)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_is_isfinite_all(dtype):
    big = torch.finfo(dtype).max
    cases = [torch.zeros(10, dtype=dtype), torch.full((1000,), big, dtype=dtype),
             torch.full((1000,), -big, dtype=dtype)]
    for value in (math.nan, math.inf, -math.inf):
        x = torch.randn(50, dtype=torch.float64)
        x[17] = value
        cases.append(x)
    both = torch.randn(50, dtype=torch.float64)
    both[1], both[2] = math.inf, -math.inf
    cases.append(both)
    for x in cases:
        x = x.to(dtype)
        got = _all_finite(x)
        assert got.dtype == torch.bool and got.dim() == 0
        assert bool(got) == bool(torch.isfinite(x).all()), (dtype, x[:3])


# ------------------------------------------------------------------ an Opacus run


def _private(seed: int = 0, noise: float = 0.0):
    torch.manual_seed(seed)
    x, y = torch.randn(48, 6) * 3, torch.randint(0, 3, (48,))
    net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, _ = PrivacyEngine().make_private(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.5),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=12), noise_multiplier=noise,
            max_grad_norm=0.7, poisson_sampling=False)
    return model, opt, net, x, y


def _step(model, opt, x, y, t: int) -> None:
    part = slice(12 * (t % 4), 12 * (t % 4) + 12)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x[part]), y[part]).backward()
    opt.step()


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_cached_canary_rows_train_as_fresh_injectors(kind, flat):
    """A persistent injector reuses its [m, d] rows (and, one block a parameter, their
    [m, *p.shape] views) whenever m repeats; fresh injectors (one a step, no cache) give the
    same parameters bit for bit, and so does Opacus' processed-flag check (rows marked
    processed would raise)."""
    dim = 6 * 5 + 5 + 5 * 3 + 3
    cs = CanarySet(3, dim, 12, kind=kind)
    model, opt, net, x, y = _private()
    inj = GradientCanaryInjector(opt, cs, 12, sample_rate=0.3, seed=2)
    inj.flat_rows = flat
    sizes = []
    for t in range(10):
        sizes.append(len(inj.joined(t, 0.3)))
        _step(model, opt, x, y, t)
    assert inj.steps == 10 and inj.insertion == "before clipping"
    assert len(set(sizes)) < len(sizes)  # some m repeated: cached views were reused
    assert len(inj._row_slices) == len(set(sizes) - {0})
    assert len(inj._row_views) == (0 if flat else len(set(sizes) - {0}))
    assert (inj._flat is not None) == flat
    cached = [p.detach().clone() for p in net.parameters()]
    model2, opt2, net2, x2, y2 = _private()
    for t in range(10):
        fresh = GradientCanaryInjector(opt2, cs, 12, sample_rate=0.3, seed=2)
        fresh.flat_rows = flat
        fresh.steps = t
        _step(model2, opt2, x2, y2, t)
        fresh.detach()
    assert all(torch.equal(a, b) for a, b in zip(cached, net2.parameters(), strict=True))
    # and the canaries moved the model: without them it ends elsewhere
    model3, opt3, net3, x3, y3 = _private()
    for t in range(10):
        _step(model3, opt3, x3, y3, t)
    assert not all(torch.equal(a, b) for a, b in zip(cached, net3.parameters(), strict=True))


class _Auditor:
    """What OpacusBackend needs of the auditor; records the released deltas (copies)."""

    def __init__(self, cs: CanarySet, k: int) -> None:
        self.canaries, self.num_canaries, self.num_unobserved = cs, k, len(cs) - k
        self.participations = np.zeros(k, dtype=np.int64)
        self.released: list[torch.Tensor] = []
        self.given: list[torch.Tensor] = []

    def release(self, delta, participants=None, *, noisy_sum=None, rate=None, what="", **_):
        if delta is not None:  # the model delta (the noisy sums are released at the step)
            self.given.append(delta)  # copied by the test, after the hook (not counted)


def test_release_deltas_are_flat_parameter_differences_in_two_ops():
    model, opt, net, x, y = _private(noise=1.0)
    dim = sum(p.numel() for p in net.parameters())
    cs = CanarySet(1, dim, 16, kind="hadamard")
    backend = OpacusBackend(opt, None, lambda key, msg: None, sample_rate=0.25, seed=3)
    auditor = _Auditor(cs, 8)
    backend.attach(auditor)
    backend._sampling_settled = True
    thetas = [flat_parameters(opt.params)]
    counts = []
    for t in range(6):
        _step(model, opt, x, y, t)
        thetas.append(flat_parameters(opt.params))
        n, names = _aten_ops(backend.on_train_batch_end)
        counts.append(n)
        auditor.released.append(auditor.given[-1].clone())
    assert len(auditor.released) == 6
    for t, delta in enumerate(auditor.released):
        assert torch.equal(delta, thetas[t + 1] - thetas[t])
    # the first calls build the second buffer and each buffer's aliases of the parameters (once);
    # then two ops, a cat and a subtraction (before: 38, a cat of 12 flattened casts and a fresh
    # subtraction)
    assert counts[3:] == [2] * 3, counts
    assert names == ["aten::cat", "aten::sub"], names
    assert len({d.data_ptr() for d in auditor.given}) == 2  # two buffers in turn, no allocation
    # a resume: the next delta is taken against the parameters at load time
    state = backend.state_dict()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    backend.load_state_dict(state)
    at_load = flat_parameters(opt.params)
    _step(model, opt, x, y, 6)
    backend.on_train_batch_end()
    assert torch.equal(auditor.given[-1], flat_parameters(opt.params) - at_load)
    backend.detach()


def test_noisy_sum_and_canary_rows_in_few_ops():
    """The observer's noisy sum is one op into a reused buffer (the values of the
    concatenation of p.grad); once a number of rows has been seen, splitting the canary rows
    into the parameters' shapes costs no op (the rows themselves are the canary set's)."""
    model, opt, net, x, y = _private(noise=1.0)
    dim = sum(p.numel() for p in net.parameters())
    cs = CanarySet(1, dim, 16, kind="hadamard")
    seen: list[tuple[torch.Tensor, int]] = []
    inj = GradientCanaryInjector(opt, cs, 16, sample_rate=0.5, seed=3,
                                 observer=lambda g, q: seen.append((g.clone(), g.data_ptr())))
    inj.flat_rows = False  # the rows one block a parameter (the flat rows: test_audit_ops_*)
    ops: dict[str, list[int]] = {"noisy_sum": [], "split": []}
    buffers: list[torch.Tensor] = []  # the rows' buffer of each call (grown by 8 rows when m outgrows it)
    refs: list[torch.Tensor] = []
    noisy, clip, original, batch = inj._noisy_sum, inj._clip_canaries, inj._clip_original, cs.batch

    def counted_noisy():
        out = []
        ops["noisy_sum"].append(_aten_ops(lambda: out.append(noisy()))[0])
        refs.append(torch.cat([p.grad.reshape(-1) for p in opt.params]))
        return out[0]

    def counted_clip(joined, layout):
        # the split of the rows into parameters: everything but the rows and Opacus' clipping
        inj._clip_original, cs.batch = (lambda: None), (lambda *a, **k: None)
        try:
            ops["split"].append(_aten_ops(lambda: clip(joined, layout))[0])
        finally:
            inj._clip_original, cs.batch = original, batch
        clip(joined, layout)
        buffers.append(inj._rows_buffer)  # kept alive: ids are not reused

    inj._noisy_sum, inj._clip_canaries = counted_noisy, counted_clip
    sizes = []
    for t in range(12):
        sizes.append(len(inj.joined(t, 0.5)))
        _step(model, opt, x, y, t)
    # the first call builds the buffer; then one op (before: 25, a cat of 12 flattened grads)
    assert len(seen) == 12 and ops["noisy_sum"][1:] == [1] * 11, ops["noisy_sum"]
    assert all(torch.equal(g, r) for (g, _), r in zip(seen, refs, strict=True))
    assert len({ptr for _, ptr in seen}) == 1  # one buffer, reused
    seen_m: set[tuple[int, int]] = set()
    ms = [s for s in sizes if s]
    assert len(ms) == len(ops["split"]) == len(buffers) and len(set(ms)) < len(ms)
    for m, n, buf in zip(ms, ops["split"], buffers, strict=True):
        assert (n == 0) == ((m, id(buf)) in seen_m), (m, n)  # before: 37 a step
        seen_m.add((m, id(buf)))
    assert any(n == 0 for n in ops["split"])
    inj.detach()


# ------------------------------------------------------------------ the flat canary rows


def _mlp_run(depth: int, audited: bool, seed: int = 0):
    """An Opacus MLP on 32 features (2 * depth + 2 parameter tensors), Poisson batches of 64,
    with or without OpacusCanaryAudit(500); returns (step(), its batches)."""
    from audit_callbacks.plain import OpacusCanaryAudit

    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(32, 4))
    x, y = torch.randn(2000, 32), torch.randint(0, 4, (2000,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=64), noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=True, noise_generator=torch.Generator().manual_seed(seed))
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=500) if audited else None
    batches = [iter(loader)]

    def next_batch():
        try:
            return next(batches[0])
        except StopIteration:  # the next epoch
            batches[0] = iter(loader)
            return next(batches[0])

    def step(batch=None):
        """One logical step on ``batch`` (default: the run's next Poisson batch)."""
        xb, yb = next_batch() if batch is None else batch
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    step.next_batch = next_batch  # (the audited run's loader draws its canaries too)
    return step, audit, net


def _top_and_all(fn) -> tuple[int, int]:
    """The top-level aten ops and every aten event of one call of ``fn``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    top = every = 0
    for e in prof.events():
        if e.name.startswith("aten::"):
            every += 1
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            top += parent is None
    return top, every


def _all_events(fn) -> int:
    """Every aten event ``fn()`` runs (those inside other aten ops included)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith("aten::") for e in prof.events())


def test_audit_ops_per_step_do_not_grow_with_the_parameter_tensors():
    """One Opacus logical step with and without the audit, at 6 and 48 parameter tensors, on
    the same batch (the audited run's: its loader draws the canaries; the loading is not
    profiled): the audit adds at most 300 aten ops at 48 tensors and at most 4 more a further
    tensor, in top-level ops and in all events, nested ones included (measured: +84 and +86
    top-level; +161 and +248 in all events, 2 a further tensor: the canary sum's ``add_`` into
    each ``p.summed_grad`` and the noisy sum's ``copy_`` of each ``p.grad``). Before: +173 and
    +593 top-level (10 a tensor: the canary rows' second per-tensor clip_and_accumulate), +551
    and +2,525 in all events; then +125 top-level and +284 and +368 in all events."""
    added: dict[int, tuple[int, int]] = {}
    for depth in (2, 23):
        runs = {audited: _mlp_run(depth, audited) for audited in (False, True)}
        for _ in range(3):
            batch = runs[True][0].next_batch()
            for step, _, _ in runs.values():
                step(batch)
        batch = runs[True][0].next_batch()
        inj = runs[True][1].backend.injector
        assert inj.insertion == "before clipping" and inj.flat_rows
        joined = inj.participations.sum()
        counts = {audited: _top_and_all(lambda s=step, b=batch: s(b)) for audited, (step, _, _) in runs.items()}
        assert inj.steps == 4 and inj.participations.sum() > joined  # the profiled step had canaries
        tensors = len(list(runs[True][2].parameters()))
        added[tensors] = (counts[True][0] - counts[False][0], counts[True][1] - counts[False][1])
    assert set(added) == {6, 48}
    # the budget: 300 (the finiteness test by aminmax, not the inf-norm: 2 events more,
    # 2.7 ms a step less at d = 10^6 on the CPU)
    assert added[48][0] <= 90 and added[48][1] <= 255, added
    assert (added[48][0] - added[6][0]) / 42 <= 4, added
    assert (added[48][1] - added[6][1]) / 42 <= 4, added


def _one_step(flat: bool, planted: bool = False, accumulate: int = 1):
    """The noiseless summed gradient of one logical step (canaries in, before clipping) and the
    canaries that joined, with the canary rows clipped flat or one block a parameter."""
    model, opt, net, x, y = _private(noise=0.0)
    if planted:
        own = opt.clip_and_accumulate

        def clip_at_2c():
            c = opt.max_grad_norm
            opt.max_grad_norm = 2 * c
            try:
                own()
            finally:
                opt.max_grad_norm = c

        opt.clip_and_accumulate = clip_at_2c
    dim = sum(p.numel() for p in net.parameters())
    cs = CanarySet(3, dim, 12, kind="gaussian")
    seen: list[torch.Tensor] = []
    inj = GradientCanaryInjector(opt, cs, 12, sample_rate=0.4, seed=5, observer=lambda g, q: seen.append(g.clone()))
    inj.flat_rows = flat
    groups = opt.original_optimizer.param_groups
    opt.zero_grad()
    for part in torch.arange(12).chunk(accumulate):
        nn.functional.cross_entropy(model(x[part]), y[part], reduction="sum").backward()
    opt.step()
    assert opt.original_optimizer.param_groups is groups  # put back: the same list
    assert (inj._flat is not None) == flat
    joined = np.repeat(np.arange(12), inj.participations)
    return seen[0], joined, cs


@pytest.mark.parametrize("accumulate", [1, 3])
def test_flat_canary_rows_add_what_the_per_parameter_blocks_add(accumulate):
    """The same step with the canary rows clipped as one flat parameter and as one block a
    parameter: the same summed gradient up to the float32 rounding of the canaries' norms
    (the flat row's norm against the norm of per-parameter norms); a planted 2C clipping in
    the optimizer's own clip_and_accumulate doubles the canaries' part either way."""
    ref, joined, _ = _one_step(flat=False, accumulate=accumulate)
    got, joined2, _ = _one_step(flat=True, accumulate=accumulate)
    assert np.array_equal(joined, joined2) and joined.size
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    # (test_preclip_canaries.py: the canaries' part doubles under the planted bug, flat rows)
    bad, _, _ = _one_step(flat=True, planted=True, accumulate=accumulate)
    bad_ref, _, _ = _one_step(flat=False, planted=True, accumulate=accumulate)
    torch.testing.assert_close(bad, bad_ref, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(bad, got, rtol=1e-3, atol=1e-3)


def test_param_groups_are_put_back_when_the_clipping_raises():
    model, opt, net, x, y = _private()
    dim = sum(p.numel() for p in net.parameters())
    inj = GradientCanaryInjector(opt, CanarySet(3, dim, 12, kind="hadamard"), 12, sample_rate=1.0, seed=5)
    own, calls = inj._clip_original, []

    def fails_on_the_canaries():
        calls.append(len(opt.params))
        if len(calls) == 2:  # the canaries' call: one flat parameter
            raise RuntimeError("planted")
        own()

    inj._clip_original = fails_on_the_canaries
    groups, params = opt.original_optimizer.param_groups, list(opt.params)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x[:12]), y[:12]).backward()
    with pytest.raises(RuntimeError, match="planted"):
        opt.step()
    assert calls == [4, 1]
    assert opt.original_optimizer.param_groups is groups and list(opt.params) == params
    assert inj._flat is not None and inj._flat.param.grad_sample is None


def _estimates(flat: bool) -> dict:
    """Every estimate of a short audited MLP run (Poisson batches, sigma 1), canary rows clipped
    flat or one block a parameter; the run and its noise follow the same seed either way."""
    step, audit, _ = _mlp_run(2, audited=True, seed=3)
    audit.backend.injector.flat_rows = flat
    for _ in range(40):
        step()
    report = audit.report(bootstrap=20)
    checks = {name: res.value for name, res in report.checks.items()}
    return {name: (res.value, res.lower, res.upper) for name, res in report.estimates.items()}, checks


def test_estimates_with_flat_canary_rows_are_within_the_previous_intervals():
    """The flat rows change the canaries' clipped sum by float32 rounding only: every estimate
    lies inside the per-parameter run's bootstrap interval (and within 1e-3 of its value), and
    the mechanism checks' ratios agree to 1e-4."""
    flat, flat_checks = _estimates(True)
    ref, ref_checks = _estimates(False)
    assert flat.keys() == ref.keys() and flat
    for name, (value, _, _) in flat.items():
        ref_value, lower, upper = ref[name]
        assert abs(value - ref_value) <= 1e-3 * max(1.0, abs(ref_value)), (name, value, ref_value)
        if lower is not None and upper is not None:
            assert lower <= value <= upper, (name, value, lower, upper)
    assert flat_checks.keys() == ref_checks.keys() and flat_checks
    for name, value in flat_checks.items():
        assert abs(value - ref_checks[name]) <= 1e-4 * max(1.0, abs(value)), name
