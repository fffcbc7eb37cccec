"""The canary audit's per-step (DP-SGD) and per-round (DP-FedAvg) work reads nothing back to the
host: no ``.item()``, ``bool``/``float``/``int`` of a tensor, ``.tolist()``,
``.numpy()`` or ``.cpu()`` between estimates; the counts, the finiteness checks and the
statistics are read at estimate time.

* CPU stand-in (always runs): a ``TorchFunctionMode`` records every such call made while a
  DP-FedAvg + ``CanaryAudit`` fit and an Opacus + ``CanaryAudit`` fit train, with the frame that
  made it. A read counts against the audit when it is made by the audit's own code (the first
  frame outside torch is in ``audit_callbacks`` but not in the DP-FedAvg module, whose own
  clipping and checks are the training's) under one of the audit's per-step or per-round entry
  points (``PER_STEP``); estimates (``CanaryAudit.on_train_epoch_end``, ``compute``, the fit
  end) are not entry points. On the CPU a ``.to(device)`` to the model's device cannot be told
  from a copy to the host, so ``.to`` is not recorded there (the CUDA test sees it).
* CUDA (skipped without it): ``torch.cuda.set_sync_debug_mode("error")`` around Opacus'
  ``optimizer.step()`` with the canary injector, the steps-unknown observer and the
  all-iterates release, and around DP-FedAvg's release (``CanaryAuditor.release`` and the
  known-rounds update), from the second step on (the first copies the canaries' signs and rows
  to the GPU, once): any synchronisation raises.

The one read left in a round is DP-FedAvg's Hadamard canary sum (``FedAvgBackend.
client_update_sum``, in its ``_client_update_sum``): whether the module's clipping merely
scaled the representative row decides which code runs next (the module reads the sum back right after it anyway); it is allowed once
per round and no more.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canary.base import NoMatchedStatistic
from audit_callbacks.federated import DPFedAvg
from tests._federated import quick_trainer, tiny_federation

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|does not have many workers|Optimal order|fewer than 2|too few|"
    "no logger|canaries are drawn|outnumber|large share).*")

_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__"}
_PACKAGE = os.path.join("audit_callbacks", "")
_MODULE_CODE = os.path.join("audit_callbacks", "federated", "")  # the DP-FedAvg module's own
#: (file suffix, function): the audit's per-step and per-round entry points
PER_STEP = {
    ("audit_callbacks/callbacks/canary_audit.py", "on_train_batch_end"),
    ("audit_callbacks/callbacks/canary_audit.py", "on_federated_round_end"),
    ("audit_callbacks/backends/opacus/injector.py", "_clip_and_accumulate"),
    ("audit_callbacks/backends/opacus/injector.py", "_add_noise"),
    ("audit_callbacks/backends/opacus/injector.py", "_reduce_gradients"),
    ("audit_callbacks/backends/fedavg.py", "client_updates"),
    ("audit_callbacks/backends/fedavg.py", "client_update_sum"),
    ("audit_callbacks/backends/fedavg.py", "on_round_released"),
}
_TORCH = os.path.dirname(torch.__file__)


class HostReads(TorchFunctionMode):
    """Records the host reads the audit's per-step code makes: ``reads`` counts them by the
    function that made them (``file:function``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _READS:
            self._record(func.__name__)
        return func(*args, **(kwargs or {}))

    def _record(self, name: str) -> None:
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith(_TORCH)
                                     or frame.f_code.co_filename == __file__):
            frame = frame.f_back
        if frame is None:
            return
        reader = frame.f_code.co_filename
        if _PACKAGE not in reader or _MODULE_CODE in reader:
            return  # Lightning's, Opacus', the DP-FedAvg module's own: the training's reads
        outer = frame
        while outer is not None:
            code = outer.f_code
            if any(code.co_filename.endswith(f) and code.co_name == fn for f, fn in PER_STEP):
                self.reads[f"{reader.split(_PACKAGE)[-1]}:{frame.f_code.co_name}:{name}"] += 1
                return
            outer = outer.f_back


def _fedavg_fit(kind: str, rounds: int = 7) -> tuple[HostReads, CanaryAudit]:
    torch.manual_seed(0)
    module = DPFedAvg(nn.Linear(15, 3), clients_per_round=4, noise_multiplier=1.0, clip_norm=0.5,
                      local_lr=0.1, seed=3, server_momentum=0.5 if kind == "hadamard" else 0.0)
    audit = CanaryAudit(num_canaries=12, num_unobserved=20, canaries=kind, seed=1, log_figures=False,
                        log_histograms=False)
    mode = HostReads()
    with warnings.catch_warnings(), mode:
        warnings.simplefilter("ignore")
        quick_trainer(rounds, [audit]).fit(module, datamodule=tiny_federation(p=15))
    return mode, audit


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_dp_fedavg_rounds_read_nothing_back_but_the_sum_paths_decision(kind):
    mode, audit = _fedavg_fit(kind)
    stats = audit.auditor.stats
    assert stats.rounds_seen == 7 and audit.auditor.last_report is not None  # estimates were made
    if kind == "hadamard":
        assert audit.auditor.matched is not None and audit.auditor.matched.rounds == 7  # every round folded
    decision = "backends/fedavg.py:_client_update_sum:__bool__"
    others = {key: n for key, n in mode.reads.items() if key != decision}
    assert others == {}
    assert mode.reads[decision] <= (7 if kind == "hadamard" else 0)


def test_opacus_steps_read_nothing_back():
    from datamodules.central import CentralDataModule
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, shuffle=False, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(8,)), lr=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                             noise_seed=0)
    audit = CanaryAudit(40, 100, seed=2, log_figures=False, log_histograms=False)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0)
    mode = HostReads()
    with warnings.catch_warnings(), mode:
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    backend = audit.backend
    assert backend.injector.insertion == "before clipping" and backend.injector.steps >= 10
    assert audit.auditor.stats.rounds_seen == backend.injector.steps
    assert audit.auditor.matched is not None and audit.auditor.matched.steps_seen == backend.injector.steps
    assert int(audit.auditor.participations.sum()) > 0 and audit.auditor.last_report is not None
    assert dict(mode.reads) == {}


def test_the_stand_in_sees_a_host_read():
    # the counter is not blind: a per-step read of the audit's own (an older finiteness
    # check of a release, bool(torch.isfinite(delta).all())) is recorded against it
    from audit_callbacks.canary import statistics as canary_stats

    original = canary_stats.CanaryStatistics.add_delta

    def add_delta(self, delta, **kwargs):
        canary_stats._finite(delta)
        return original(self, delta, **kwargs)

    canary_stats.CanaryStatistics.add_delta = add_delta
    try:
        mode, _ = _fedavg_fit("hadamard", rounds=3)
    finally:
        canary_stats.CanaryStatistics.add_delta = original
    assert mode.reads["canary/statistics.py:_finite:__bool__"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_and_rounds_do_not_synchronise():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from audit_callbacks.auditing.auditor import CanaryAuditor
    from audit_callbacks.auditing.config import CanaryAuditConfig
    from audit_callbacks.backends.opacus.buffers import flat_parameters
    from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
    from audit_callbacks.canary.known_rounds import KnownRoundScores
    from audit_callbacks.canary.statistics import CanaryStatistics
    from audit_callbacks.canary.steps_unknown import StepsUnknownScores
    from audit_callbacks.canary.vectors import CanarySet

    dev = torch.device("cuda")
    torch.manual_seed(0)
    x, y = torch.randn(64, 40, device=dev), torch.randint(0, 2, (64,), device=dev)
    net = nn.Sequential(nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 2)).to(dev)
    model, opt, _ = PrivacyEngine().make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x.cpu(), y.cpu()), batch_size=32), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=False)
    dim = sum(p.numel() for p in net.parameters())
    for kind in ("hadamard", "gaussian"):
        cs = CanarySet(0, dim, 40, kind=kind)
        scores = StepsUnknownScores(cs, 20, 20, max_grad_norm=1.0, noise_multiplier=1.0, max_buffered=2)
        stats = CanaryStatistics(cs, 20, 20, sign=-1.0, max_buffered=2)
        inj = GradientCanaryInjector(opt, cs, 20, sample_rate=0.5, seed=1, observer=scores.update)
        prev = flat_parameters(opt.params)
        stats.set_initial(prev)
        for step in range(5):  # the first step copies the canaries' signs and rows to the GPU once
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[:32]), y[:32]).backward()
            torch.cuda.set_sync_debug_mode("error" if step else 0)
            try:
                opt.step()
                theta = flat_parameters(opt.params)
                stats.add_delta(theta - prev)
                stats.add_delta(torch.full_like(theta, float("nan")))  # skipped, lazily
            finally:
                torch.cuda.set_sync_debug_mode(0)
            prev = theta
        inj.detach()
        assert stats.rounds_seen == 5 and stats.rounds_skipped == 5 and scores.steps_seen == 5
        assert inj.insertion == "before clipping" and theta.device.type == "cuda"
        assert np.isfinite(stats.compute(theta)["all_observed"].numpy()).all()

    class Backend:  # the auditor's release with a DP-FedAvg-like backend on CUDA
        dim, population, sign, training, default_delta = 4096, 100, 1.0, "sim", 1e-5
        def release_model(self, kind):
            return NoMatchedStatistic("none")


        def attach(self, auditor):
            pass

    auditor = CanaryAuditor(CanaryAuditConfig(20, 100, seed=0, delta=1e-5), Backend(), lambda k, m: None)
    auditor.start(torch.zeros(4096, device=dev))
    known = KnownRoundScores(auditor.canaries, 20, clip_norm=1.0, divisor=10, noise_multiplier=1.0,
                             server_momentum=0.5)
    for t in range(4):
        delta = torch.randn(4096, device=dev)
        torch.cuda.set_sync_debug_mode("error" if t else 0)
        try:
            auditor.release(delta, np.array([t, t + 1]), what=f"round {t}")
            known.update(delta, np.array([t, t + 1]))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert auditor.stats.rounds_seen == 4 and known.rounds == 4


class _Backend:
    """The least a CanaryAuditor needs for releases."""
    dim, population, sign, training, default_delta = 256, 100, 1.0, "sim", 1e-5
    def release_model(self, kind):
        return NoMatchedStatistic("none")


    def attach(self, auditor):
        pass

    def summary_inputs(self):
        return {}

    def summary_status(self):
        return {}

    def claim(self, delta):
        return {}


def test_the_non_finite_warning_names_the_first_bad_release_and_its_labels_stay_bounded(monkeypatch):
    from audit_callbacks.auditing import auditor as auditor_module
    from audit_callbacks.auditing.auditor import CanaryAuditor
    from audit_callbacks.auditing.config import CanaryAuditConfig

    monkeypatch.setattr(auditor_module, "_UNCHECKED_RELEASES", 8)
    said: list[tuple[str, str]] = []
    auditor = CanaryAuditor(CanaryAuditConfig(20, 100, seed=0, delta=1e-5), _Backend(),
                            lambda key, msg: said.append((key, msg)))
    auditor.start(torch.zeros(256))
    for t in range(8):
        auditor.release(torch.randn(256), np.array([t]), what=f"round {t}")
    assert said == [] and len(auditor._unchecked) == 8
    for t in range(8, 11):  # the 9th release checks the first 8 (all finite) and starts a new list
        bad = torch.randn(256)
        if t >= 9:
            bad[200] = float("inf") if t == 9 else float("nan")  # outside the first n = 128 coordinates too
        auditor.release(bad, np.array([t]), what=f"round {t}")
    assert said == [] and len(auditor._unchecked) == 3
    summary = auditor.summary()
    assert summary["inputs"]["rounds_skipped_non_finite"] == 2 and auditor.stats.rounds_seen == 9
    assert said == [("nan", "CanaryAudit: round 9 produced a model delta with NaN or inf; it is skipped "
                            "by the all-iterates statistic")]
