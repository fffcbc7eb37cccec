"""Opacus canaries enter before per-example clipping, and the training loader's own Poisson
sampler decides when they join.

* with correct clipping a canary adds ``max_grad_norm * c_j`` to the summed gradient; with a
  planted clipping at 2C it adds ``2 C c_j`` (after-clipping insertion cannot see that);
* the canaries' join rate is the loader's: q with a loader of rate q, 2q with a planted loader of
  rate 2q while the accountant is told q (binomial tests over many steps); batches are aligned
  with their draws under prefetching workers and under ``BatchMemoryManager``;
* ghost clipping falls back to after-clipping insertion, a plain loader to the audit's draws, each
  with its reason in the summary.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.optimizers import DPOptimizer
from opacus.utils.batch_memory_manager import BatchMemoryManager
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
from audit_callbacks.backends.opacus.placement import preclip_unsupported
from audit_callbacks.backends.opacus.sampling import LoaderCanarySampling, find_poisson_sampler
from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|does not have many workers|Optimal order|fewer than 2|too few).*")


def _clip_at_2c(opt: DPOptimizer) -> None:
    """Plant a bug: per-example clipping at 2C (noise and accountant stay at C)."""
    own = opt.clip_and_accumulate

    def clip() -> None:
        c = opt.max_grad_norm
        opt.max_grad_norm = 2 * c
        try:
            own()
        finally:
            opt.max_grad_norm = c

    opt.clip_and_accumulate = clip


def _one_step_sum(*, canaries: bool, planted: bool, before: bool = True, accumulate: int = 1):
    """The noiseless summed gradient of one logical step of a Linear(6, 2) on fixed data
    (C = 0.7, sigma = 0): ``(sum [d], joined canaries, optimizer)``."""
    torch.manual_seed(0)
    x, y = torch.randn(12, 6) * 3, torch.randint(0, 2, (12,))
    net = nn.Linear(6, 2)
    model, opt, _ = PrivacyEngine().make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=12), noise_multiplier=0.0, max_grad_norm=0.7,
        poisson_sampling=False)
    if planted:
        _clip_at_2c(opt)
    seen: list[torch.Tensor] = []
    cs = CanarySet(3, 14, 8, kind="gaussian")
    inj = GradientCanaryInjector(opt, cs, 8 if canaries else 2, sample_rate=0.5 / accumulate, seed=4,
                                 observer=lambda g, q: seen.append(g.clone()), before_clipping=before)
    if not canaries:
        inj.num_observed = 0  # nothing joins
        inj.participations = np.zeros(0, dtype=np.int64)
    opt.zero_grad()
    for part in torch.arange(12).chunk(accumulate):  # gradient accumulation: several backward passes
        nn.functional.cross_entropy(model(x[part]), y[part], reduction="sum").backward()
    opt.step()
    assert len(seen) == 1 and inj.steps == 1
    joined = np.repeat(np.arange(inj.num_observed), inj.participations)
    return seen[0], joined, opt, cs, inj


@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_canary_adds_max_grad_norm_times_c_and_twice_that_under_a_2c_clipping(accumulate):
    for planted, factor in ((False, 1.0), (True, 2.0)):
        with_c, joined, opt, cs, inj = _one_step_sum(canaries=True, planted=planted, accumulate=accumulate)
        without, _, _, _, _ = _one_step_sum(canaries=False, planted=planted, accumulate=accumulate)
        assert inj.insertion == "before clipping" and 0 < joined.size < 8
        expected = factor * 0.7 * cs.sum(joined.tolist())
        # Opacus' clip factor C / (||10 C c|| + 1e-6) loses 1e-7 of C: well inside the tolerance
        torch.testing.assert_close(with_c - without, expected, atol=1e-5, rtol=1e-5)
        # the per-example gradients the label attacks read are the real examples' only
        assert all(p.grad_sample is None or len(opt._get_flat_grad_sample(p)) == 12 for p in opt.params)
    # after clipping (the old insertion) the planted bug is invisible: C c_j either way
    with_c, joined, *_ = _one_step_sum(canaries=True, planted=True, before=False, accumulate=accumulate)
    without, *_ = _one_step_sum(canaries=False, planted=True, before=False, accumulate=accumulate)
    torch.testing.assert_close(with_c - without, 0.7 * CanarySet(3, 14, 8, kind="gaussian").sum(joined.tolist()),
                               atol=1e-5, rtol=1e-5)


def test_detach_puts_back_an_instance_override_and_bad_multipliers_are_refused():
    _, _, opt, _, inj = _one_step_sum(canaries=True, planted=True)
    planted = inj._own["clip_and_accumulate"]
    assert callable(planted) and opt.__dict__["clip_and_accumulate"] == inj._clip_and_accumulate
    inj.detach()
    assert "add_noise" not in opt.__dict__ and opt.__dict__["clip_and_accumulate"] is planted
    with pytest.raises(ValueError, match="norm_multiplier"):
        GradientCanaryInjector(opt, CanarySet(0, 14, 2), 2, 0.5, norm_multiplier=0.5)


class _Indexed(Dataset):
    """Returns (index, feature): the batch tells which examples it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range")  # a canary index must never get here
        return torch.tensor(i), torch.tensor([float(i % 3)])


def _poisson_run(*, loader_rate: float, accountant_rate: float, epochs: int, k: int = 100, n: int = 40,
                 num_workers: int = 0, memory_manager: bool = False):
    """Train Linear(1, 1) on ``_Indexed(n)`` with a ``DPDataLoader`` at ``loader_rate`` while
    make_private was given a loader of ``accountant_rate``; returns what was seen."""
    from opacus.data_loader import DPDataLoader

    torch.manual_seed(1)
    data = _Indexed(n)
    net = nn.Linear(1, 1)
    base = DataLoader(data, batch_size=max(1, round(accountant_rate * n)))
    model, opt, _ = PrivacyEngine().make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
                                                  data_loader=base, noise_multiplier=1.0, max_grad_norm=1.0,
                                                  poisson_sampling=False)
    loader = DPDataLoader(data, sample_rate=loader_rate, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(2))
    sampler, reason = find_poisson_sampler(loader)
    assert sampler is loader.batch_sampler and reason == ""
    sampling = LoaderCanarySampling(sampler, k, seed=0)
    draws: list[tuple[list[int], list[int]]] = []  # (real indices, canaries) per sampler draw
    split = sampling._split

    def spy(batch):
        real = split(batch)
        draws.append((sorted(int(i) for i in real), sorted(sampling.queue[-1].tolist())))
        return real
    sampling._split = spy
    inj = GradientCanaryInjector(opt, CanarySet(0, 2, k, kind="gaussian"), k, accountant_rate, seed=0,
                                 sampling=sampling)
    steps: list[tuple[list[int], list[int]]] = []  # (real indices consumed, canaries inserted) per step
    for _ in range(epochs):
        consumed: list[int] = []
        source = loader
        if memory_manager:
            mm = BatchMemoryManager(data_loader=loader, max_physical_batch_size=3, optimizer=opt)
            source = mm.__enter__()
        for idx, yb in source:
            consumed += idx.tolist()
            opt.zero_grad()
            (model(yb) ** 2).sum().backward()
            before = inj.participations.copy()
            opt.step()
            if len(steps) < inj.steps:  # a logical step was taken
                joined = np.repeat(np.arange(k), inj.participations - before).tolist()
                steps.append((sorted(consumed), joined))
                consumed = []
    assert sampler.num_samples == n  # N outside the sampler's own draws
    return inj, sampling, draws, steps


def _z(successes: int, trials: int, rate: float) -> float:
    return (successes - trials * rate) / math.sqrt(trials * rate * (1 - rate))


@pytest.mark.parametrize("loader_rate", [0.1, 0.2])
def test_canaries_join_at_the_loaders_rate_not_the_accountants(loader_rate):
    # the accountant is told q = 0.1; a planted loader samples at 2q = 0.2
    inj, sampling, draws, steps = _poisson_run(loader_rate=loader_rate, accountant_rate=0.1, epochs=40)
    trials = inj.num_observed * inj.steps
    joins = int(inj.participations.sum())
    assert abs(_z(joins, trials, loader_rate)) < 4, (joins, trials)
    other = 0.2 if loader_rate == 0.1 else 0.1
    assert abs(_z(joins, trials, other)) > 10
    assert sampling.draws_by_audit == 0 and sampling.batches == inj.steps
    # every step inserted exactly the canaries drawn with the batch it consumed
    assert [d for d in draws] == steps


def test_draws_stay_aligned_with_prefetching_workers():
    inj, sampling, draws, steps = _poisson_run(loader_rate=0.2, accountant_rate=0.2, epochs=2, num_workers=2)
    assert len(steps) == inj.steps == 10 and draws == steps and sampling.draws_by_audit == 0


def test_batch_memory_manager_takes_one_draw_per_logical_step():
    inj, sampling, draws, steps = _poisson_run(loader_rate=0.3, accountant_rate=0.3, epochs=2, n=30,
                                               memory_manager=True)
    assert len(steps) == inj.steps == sampling.batches == 6
    assert draws == steps  # the physical batches of one draw make one step with its canaries


def test_an_iteration_begun_before_the_audit_gets_audit_draws_then_the_loader_takes_over():
    from opacus.data_loader import DPDataLoader

    torch.manual_seed(0)
    data = _Indexed(20)
    net = nn.Linear(1, 1)
    model, opt, loader = PrivacyEngine().make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01), data_loader=DataLoader(data, batch_size=4),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True)
    assert isinstance(loader, DPDataLoader)
    early = iter(loader)  # e.g. Lightning's first epoch, created in configure_optimizers
    sampling = LoaderCanarySampling(loader.batch_sampler, 5, seed=0)
    inj = GradientCanaryInjector(opt, CanarySet(0, 2, 5), 5, 0.2, sampling=sampling)
    for batches in (early, loader):
        for _idx, yb in batches:  # the early iterator never yields a canary index
            opt.zero_grad()
            (model(yb) ** 2).sum().backward()
            opt.step()
    assert sampling.draws_by_audit == 5 and sampling.batches == 5 and inj.steps == 10
    sampling.detach()
    assert type(loader.batch_sampler) is UniformWithReplacementSampler and loader.batch_sampler.num_samples == 20
    assert "_audit_canary_sampling" not in loader.batch_sampler.__dict__


def _audit_run(tmp_path, **make_private):
    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    out = PrivacyEngine().make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=8), noise_multiplier=1.0,
        max_grad_norm=1.0, **make_private)
    model, opt, loader = (out[0], out[1], out[-1])
    criterion = out[2] if len(out) == 4 else nn.CrossEntropyLoss()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=10, bootstrap=0)
        for xb, yb in loader:
            opt.zero_grad()
            if len(xb):
                loss = criterion(model(xb), yb)
                loss.backward()
                opt.step()
    summary = audit.auditor.summary(audit.report())["inputs"]
    audit.detach()
    return summary, [str(w.message) for w in caught], audit


def test_ghost_clipping_falls_back_to_after_clipping_with_the_reason(tmp_path):
    summary, messages, audit = _audit_run(tmp_path, poisson_sampling=True, grad_sample_mode="ghost",
                                          criterion=nn.CrossEntropyLoss())
    assert summary["canary_insertion"].startswith("after clipping: DPOptimizerFastGradientClipping (ghost")
    assert summary["canary_sampling"] == "training loader (Opacus UniformWithReplacementSampler)"
    assert any("after clipping" in m for m in messages)
    assert audit.steps > 0 and audit.auditor.participations.sum() > 0
    assert preclip_unsupported(audit.optimizer) is not None


def test_a_plain_loader_falls_back_to_the_audits_draws_with_the_reason(tmp_path):
    summary, messages, _ = _audit_run(tmp_path, poisson_sampling=False)
    assert summary["canary_insertion"] == "before clipping"
    assert summary["canary_sampling"].startswith("drawn by the audit at the accountant's rate: the training "
                                                 "loader's batch sampler is BatchSampler")
    assert any("drawn by the audit" in m for m in messages)
