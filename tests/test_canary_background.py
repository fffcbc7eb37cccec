"""Canaries generated and estimates computed off the training thread give the same numbers.

* a chunk filled by two threads, and a canary generated ahead in the pool, equal the canary
  generated alone on this thread, bit for bit;
* the canary rows ``CanaryAudit`` writes into a round's update matrix (generated ahead, a batch
  cancelled because the thread was busy, indices outside the plan) are ``clip_norm * c_j``, the
  sum of clipped updates it gives is the module's sum of those rows clipped, and a DP-FedAvg run
  through the sum, the batched rows or the per-client protocol (or with an observer that needs
  the rows) trains the same model bit for bit;
* a background pass (``compute_async``, and the pass a full buffer starts) folds the same
  statistics as the synchronous one, whatever ``torch.set_num_threads`` says;
* an error on the estimation thread reaches the caller;
* ``CanaryAudit(background=True)`` logs the same TensorBoard scalars at the same steps, and ends
  with the same estimates, as ``background=False``; a fit whose rounds are cut short still logs
  every validation.
"""

import os
import pickle
import threading
import time
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canaries import CanarySet
from audit_callbacks.canary_stats import CanaryStatistics
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.federated.clipping import clip_updates_
from datamodules import FederatedDataModule
from models import MLP
from tests._federated import digits_dpfedavg, fit


def test_parallel_fill_and_prefetch_equal_the_canary_alone():
    alone = CanarySet(seed=3, dim=5000, num_canaries=9, workers=1)
    pooled = CanarySet(seed=3, dim=5000, num_canaries=9, workers=2)
    ref = torch.stack([alone.canary(j) for j in range(9)])
    rows = torch.cat([block.clone() for _, block in pooled.chunks()])
    assert torch.equal(rows, ref)
    futures = {j: pooled.submit(j, scale=0.7) for j in (8, 0, 4)}
    for j, fut in futures.items():
        assert torch.equal(fut.result(), alone.canary(j, scale=0.7)), j
    batch = pooled.submit_many([8, 0, 4], scale=0.7).result()
    assert torch.equal(batch, torch.stack([alone.canary(j, scale=0.7) for j in (8, 0, 4)]))
    assert torch.equal(alone.batch([8, 0, 4], scale=0.7), batch)
    assert torch.equal(alone.submit_many([3], scale=0.7).result()[0], alone.canary(3, scale=0.7))
    # one worker: submit generates at once, same values
    assert torch.equal(alone.submit(2, scale=0.7).result(), pooled.canary(2, scale=0.7))
    # threads are scratch space: a pickled set has none and regenerates the same canaries
    clone = pickle.loads(pickle.dumps(pooled))
    assert torch.equal(clone.canary(5), ref[5])
    pooled.close()
    assert torch.equal(pooled.canary(5), ref[5])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_canary_is_the_same_in_any_batch(threads):
    # batches are normalised with one row-wise norm: a row's bits must not depend on the batch
    # size, also where torch could split a long reduction over threads (d above its grain size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cs = CanarySet(seed=9, dim=70_001, num_canaries=9, workers=1)
        alone = [cs.canary(j) for j in range(9)]
        for size in (2, 3, 9):
            out = torch.empty(size, cs.dim)
            cs._fill_rows(list(range(9 - size, 9)), out)
            for row, j in enumerate(range(9 - size, 9)):
                assert torch.equal(out[row], alone[j]), (size, j)
        norms = torch.linalg.vector_norm(torch.stack(alone).double(), dim=1)
        assert torch.allclose(norms, torch.ones(9, dtype=torch.float64), atol=1e-6)
    finally:
        torch.set_num_threads(before)


def _audit_for(canaries: CanarySet) -> CanaryAudit:
    """A CanaryAudit wired to ``canaries`` as setup would, without a trainer."""
    audit = CanaryAudit()
    audit.stats = CanaryStatistics(canaries, canaries.num_canaries, 0, background=False)
    audit.participations = np.zeros(canaries.num_canaries, dtype=np.int64)
    return audit


@pytest.mark.parametrize("busy", [False, True])
def test_batched_canary_rows_are_the_canaries(busy):
    canaries = CanarySet(seed=4, dim=3000, num_canaries=12, workers=2)
    alone = CanarySet(seed=4, dim=3000, num_canaries=12, workers=1)
    audit = _audit_for(canaries)
    module = SimpleNamespace(clip_norm=0.8, device=torch.device("cpu"), dtype=torch.float32)
    gate = threading.Event()
    if busy:  # the thread is busy (an estimate): the batch does not start, it is cancelled
        blocker = canaries.executor().submit(gate.wait)
    cohort = SimpleNamespace(virtual={"canary": np.array([7, 2, 11, 5])})
    audit.on_federated_round_start(None, module, 1, cohort)
    out = torch.full((4, 3000), float("nan"))
    audit.federated_client_updates(None, module, cohort.virtual["canary"], 1, 0.8, out)
    gate.set()
    ref = torch.stack([alone.canary(j, scale=0.8) for j in (7, 2, 11, 5)])
    assert torch.equal(out, ref)
    if busy:
        blocker.result()
        # canaries generated ahead but never used do not hold the thread: dropped and cancelled
        gate.clear()
        blocker = canaries.executor().submit(gate.wait)
        audit.on_federated_round_start(None, module, 2, cohort)
        pending = {id(b): b for b, _ in audit._prefetched.values()}
        audit._drop_prefetched()
        assert pending and all(b.future.cancelled() for b in pending.values())
        assert not audit._prefetched
        gate.set()
        blocker.result()
    # the sum of the clipped updates: the module's clipping and sum of the reference rows, bits
    for round_idx in (3, 4):
        if busy and round_idx == 4:
            gate.clear()
            blocker = canaries.executor().submit(gate.wait)
        audit.on_federated_round_start(None, module, round_idx, cohort)
        total = audit.federated_client_update_sum(None, module, cohort.virtual["canary"], round_idx, 0.8)
        if busy and round_idx == 4:
            gate.set()
            blocker.result()
        clipped = ref.clone()
        clip_updates_(clipped, 0.8)
        assert torch.equal(total, clipped.sum(0)), round_idx
        assert not audit._prefetched
    # not generated ahead (another clip norm), and a float64 model: built in the model's dtype
    module64 = SimpleNamespace(clip_norm=0.8, device=torch.device("cpu"), dtype=torch.float64)
    total64 = audit.federated_client_update_sum(None, module64, np.array([7, 2]), 5, 0.5)
    rows64 = torch.stack([alone.canary(j, scale=0.5) for j in (7, 2)]).double()
    clip_updates_(rows64, 0.5)
    assert total64.dtype == torch.float64 and torch.equal(total64, rows64.sum(0))
    # indices the plan does not know, and a float64 model: generated on use, converted exactly
    out64 = torch.empty(2, 3000, dtype=torch.float64)
    audit.federated_client_updates(None, module, np.array([3, 7]), 1, 0.8, out64)
    assert torch.equal(out64, torch.stack([alone.canary(j, scale=0.8) for j in (3, 7)]).double())
    assert list(audit.participations[[7, 2, 11, 5]]) == [4 if busy else 3] * 4  # rounds started
    canaries.close()


def test_chunks_do_not_wait_behind_a_long_background_task():
    # a DP-SGD step sums its joined canaries with chunks() while an estimate runs in the background
    cs = CanarySet(seed=2, dim=2000, num_canaries=8, workers=2)
    ref = torch.stack([CanarySet(seed=2, dim=2000, num_canaries=8, workers=1).canary(j) for j in range(8)])
    gate = threading.Event()
    long_task = cs.run_in_background(lambda: gate.wait(timeout=30))
    start = time.perf_counter()
    rows = torch.cat([block.clone() for _, block in cs.chunks()])  # would wait 30 s behind it
    assert time.perf_counter() - start < 10
    assert torch.equal(rows, ref)
    queued = cs.run_in_background(lambda: None)  # cancelled before it runs: no longer counted
    assert cs._long_tasks == 2 and queued.cancel() and cs._long_tasks == 1
    gate.set()
    assert long_task.result() is True
    assert cs._long_tasks == 0
    # the thread is free again: chunks use it, same values
    assert torch.equal(torch.cat([block.clone() for _, block in cs.chunks()]), ref)
    with pytest.raises(RuntimeError, match="no background thread"):
        CanarySet(seed=2, dim=10, num_canaries=2, workers=1).run_in_background(lambda: None)
    cs.close()


class _Sums(CanaryAudit):
    """CanaryAudit, counting the rounds that sampled canaries and the sums it gave."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled = self.sums = 0

    def on_federated_round_start(self, trainer, pl_module, round_idx, cohort):
        self.sampled += int(cohort.virtual["canary"].size > 0)
        super().on_federated_round_start(trainer, pl_module, round_idx, cohort)

    def federated_client_update_sum(self, *args):
        self.sums += 1
        return super().federated_client_update_sum(*args)


class _Rows(CanaryAudit):
    """The same callback seen through the batched rows protocol only."""

    federated_client_update_sum = None


class _PerClient(CanaryAudit):
    """The same callback seen through the per-client protocol only."""

    federated_client_update_sum = None
    federated_client_updates = None


class _Observer(pl.Callback):
    """Needs the rows: the module then asks every owner for rows, not sums."""

    def __init__(self):
        self.rows = 0

    def on_federated_client_updates(self, trainer, pl_module, round_idx, client_ids, updates):
        self.rows += sum(cid.startswith("canary/") for cid in client_ids)


def test_sum_rows_and_per_client_protocols_train_the_same_model(tmp_path):
    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=3, seed=0)
    models = {}
    observer = _Observer()
    variants = {"sum": (_Sums,), "rows": (_Rows,), "per_client": (_PerClient,), "observed": (_Sums, observer)}
    for name, (cls, *more) in variants.items():
        torch.manual_seed(0)
        module = DPFedAvg(MLP(64, 10, hidden=(16,)), clients_per_round=8, noise_multiplier=0.5,
                          local_batch_size=8, seed=0)
        audit = cls(num_canaries=10, log_figures=False)
        fit(dm, module, [audit, *more], 6, tmp_path, name=name)
        models[name] = module.flat_parameters()
        if name == "sum":  # the sum was given in every round that sampled a canary
            assert audit.sums == audit.sampled > 0
        if name == "observed":  # an observer needs the rows: no sums, every canary row seen
            assert audit.sums == 0 and observer.rows == int(audit.participations.sum()) > 0
    for name in ("rows", "per_client", "observed"):
        assert torch.equal(models[name], models["sum"]), name


def _statistics(background, deltas, theta, *, checkpoints=(), use_async=False, max_buffered=5):
    cs = CanarySet(seed=7, dim=deltas[0].numel(), num_canaries=20)
    st = CanaryStatistics(cs, 10, 10, max_buffered=max_buffered, background=background)
    st.set_initial(torch.zeros(cs.dim))
    pending = []
    for i, delta in enumerate(deltas, 1):
        st.add_delta(delta)
        if i in checkpoints:
            # a validation: its estimate in flight while the next rounds are added
            if use_async:
                pending.append((i, st.compute_async(sum(deltas[:i]))))
            else:
                pending.append((i, st.compute(sum(deltas[:i]))))
    out = {i: (r.result() if use_async else r) for i, r in pending}
    out["end"] = st.compute(theta)
    st.close()
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_background_passes_fold_the_same_statistics(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        deltas = [torch.randn(3000) for _ in range(23)]
        theta = sum(deltas)
        ref = _statistics(False, deltas, theta, checkpoints=(4, 11, 17))
        for kwargs in ({"use_async": True}, {"use_async": True, "max_buffered": 2},
                       {"use_async": False, "max_buffered": 1}):
            got = _statistics(True, deltas, theta, checkpoints=(4, 11, 17), **kwargs)
            assert got.keys() == ref.keys()
            for when in ref:
                for key in ref[when]:
                    assert torch.equal(got[when][key], ref[when][key]), (kwargs, when, key)
    finally:
        torch.set_num_threads(before)


def test_errors_reach_the_caller_and_nothing_is_lost(monkeypatch):
    cs = CanarySet(seed=0, dim=100, num_canaries=4)
    st = CanaryStatistics(cs, 2, 2)
    st.set_initial(torch.zeros(100))
    st.add_delta(torch.ones(100))
    bad = torch.zeros(100)
    bad[3] = float("inf")
    # a non-finite model is refused on the calling thread, before the pending delta is taken
    with pytest.raises(ValueError, match="NaN or inf"):
        st.compute_async(bad)
    assert st._pending == 1
    # an error on the estimation thread: raised by the Future, and by wait()
    original = cs._fill_rows

    def broken(indices, out):
        raise RuntimeError("generator failed")

    monkeypatch.setattr(cs, "_fill_rows", broken)
    future = st.compute_async(torch.ones(100))
    with pytest.raises(RuntimeError, match="generator failed"):
        future.result()
    with pytest.raises(RuntimeError, match="generator failed"):
        st.wait()
    monkeypatch.setattr(cs, "_fill_rows", original)
    st.add_delta(torch.ones(100))
    assert st.compute(torch.ones(100))["all_observed"].shape == (2,)
    # close() on the way out of a failed fit does not raise a second time
    monkeypatch.setattr(cs, "_fill_rows", broken)
    st.add_delta(torch.ones(100))
    st.compute_async(torch.ones(100))
    st.close()
    assert st._executor is None and st._inflight is None


def _fit_audit(tmp_path, background, name, steps=12):
    dm, module = digits_dpfedavg(rounds_per_epoch=3)
    audit = CanaryAudit(30, 30, seed=1, background=background, bootstrap=20)
    fit(dm, module, [audit], steps, tmp_path, name=name)
    acc = EventAccumulator(os.path.join(str(tmp_path), name, "version_0"),
                           size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return audit, acc


def test_background_estimates_log_what_the_synchronous_ones_log(tmp_path, monkeypatch):
    sync, acc_sync = _fit_audit(tmp_path, False, "sync")
    started = []
    original = CanaryStatistics.compute_async

    def counted(self, *args, **kwargs):
        started.append(self.rounds_seen)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CanaryStatistics, "compute_async", counted)
    bg, acc_bg = _fit_audit(tmp_path, True, "bg")
    assert started == [3, 6, 9]  # the background estimates; round 12's was computed at once
    tags = [t for t in acc_sync.Tags()["scalars"] if t.startswith("audit/")]
    assert "audit/epsilon_final_model" in tags and "audit/epsilon_all_iterates" in tags
    assert sorted(tags) == sorted(t for t in acc_bg.Tags()["scalars"] if t.startswith("audit/"))
    for tag in tags:
        want = [(e.step, e.value) for e in acc_sync.Scalars(tag)]
        got = [(e.step, e.value) for e in acc_bg.Scalars(tag)]
        assert got == want, tag
    # validations at rounds 3, 6, 9 (in the background) and 12 (the last: at once)
    assert [e.step for e in acc_bg.Scalars("audit/epsilon_final_model")] == [3, 6, 9, 12]
    assert [e.step for e in acc_bg.Histograms("audit/cosine_all_observed")] == [3, 6, 9, 12]
    # histograms built on the estimation thread: the same buckets as the synchronous ones
    hist_tags = [t for t in acc_sync.Tags()["histograms"] if t.startswith("audit/")]
    assert len(hist_tags) == 4 and sorted(hist_tags) == sorted(acc_bg.Tags()["histograms"])
    for tag in hist_tags:
        want = [(e.step, e.histogram_value) for e in acc_sync.Histograms(tag)]
        got = [(e.step, e.histogram_value) for e in acc_bg.Histograms(tag)]
        assert got == want, tag
    for key, est in sync.last_report["estimates"].items():
        assert bg.last_report["estimates"][key].value == est.value, key
    assert not bg._jobs and bg.stats._inflight is None and bg.stats._executor is None


def test_a_background_estimate_is_logged_when_the_fit_stops_early(tmp_path):
    # max_steps falls inside an epoch: no validation is the last one by the step count, so
    # the last validation's estimate is computed in the background and fit end waits for it
    audit, acc = _fit_audit(tmp_path, True, "short", steps=10)
    assert [e.step for e in acc.Scalars("audit/epsilon_final_model")] == [3, 6, 9, 10]
    assert audit.last_report is not None and not audit._jobs
