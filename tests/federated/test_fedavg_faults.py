"""DP-FedAvg's faults (issue 26): participations committed at a round's release (a checkpoint
saved mid-round, as Lightning's SLURM auto-requeue saves one on SIGUSR1, resumes to the
uninterrupted run's counts and estimate), a finite but huge client update clipped without
overflow, a virtual client of the wrong shape refused naming it, and noise that no logged
seed regenerates."""

from __future__ import annotations

import json
import os
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg, FederatedAuditHooks
from audit_callbacks.federated.clipping import clip_updates_
from datamodules import FederatedDataModule
from models import MLP
from tests._federated import fit, quick_trainer, tiny_federation

ROUNDS = 10


def _digits(reproducible=True):
    dm = FederatedDataModule("digits", num_clients=30, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(16,)), clients_per_round=8, noise_multiplier=1.0, clip_norm=1.0,
                      local_batch_size=8, sampling="poisson", seed=0, delta=1e-5,
                      reproducible_noise=reproducible)
    return dm, module


def _audit():
    return CanaryAudit(20, 200, seed=5, bootstrap=50, log_figures=False, log_histograms=False)


class SaveInside(FederatedAuditHooks, pl.Callback):
    """Saves a checkpoint from inside round ``at``: at ``where`` (a FederatedAuditHooks hook, or
    ``on_train_batch_end``), as a signal handler would at any point of the round."""

    def __init__(self, path, at, where):
        self.path, self.at, self.where = path, at, where

    def _save(self, trainer, index):
        if index == self.at:
            trainer.save_checkpoint(self.path)

    def on_federated_round_start(self, trainer, pl_module, fl_round):
        if self.where == "round_start":
            self._save(trainer, fl_round.index)

    def on_federated_round_end(self, trainer, pl_module, fl_round):
        if self.where == "round_end":
            self._save(trainer, fl_round.index)

    def on_train_batch_end(self, trainer, pl_module, *args):
        if self.where == "batch_end":
            self._save(trainer, pl_module.round)


@pytest.mark.parametrize("where", ["round_start", "round_end", "batch_end"])
def test_a_checkpoint_saved_mid_round_resumes_to_the_uninterrupted_counts(tmp_path, where):
    path = str(tmp_path / "mid.ckpt")
    dm, module = _digits()
    full = _audit()
    # the saver runs before the audit's own round-end hook (callback order): the module's
    # release has already given the round to the audit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(dm, module, [SaveInside(path, 5, where), full], ROUNDS, tmp_path / "a", logger=False)
        dm2, resumed_module = _digits()
        resumed = _audit()
        fit(dm2, resumed_module, [resumed], ROUNDS, tmp_path / "b", logger=False, ckpt_path=path)
    assert resumed_module.round == module.round == ROUNDS
    assert np.array_equal(resumed_module.participations(), module.participations())
    assert np.array_equal(resumed.auditor.participations, full.auditor.participations)
    a, b = full.auditor.summary(), resumed.auditor.summary()
    assert a["inputs"]["participations_histogram"] == b["inputs"]["participations_histogram"]
    for name in ("epsilon_all_iterates", "epsilon_final_model"):
        assert full.last_report.value(name) == pytest.approx(resumed.last_report.value(name), rel=1e-6)
    assert full.last_report.epsilon_analytic == resumed.last_report.epsilon_analytic


def test_clipping_a_finite_huge_row_does_not_overflow():
    rows = torch.zeros(3, 1000)
    rows[0, 7] = 1e30  # float32: its square overflows
    rows[1] = 3e38  # every entry near float32's largest value: the norm is above it
    rows[2, :4] = torch.tensor([3.0, 4.0, 0.0, 0.0])
    norms = clip_updates_(rows, 2.0)
    assert torch.isfinite(rows).all()
    torch.testing.assert_close(torch.linalg.vector_norm(rows.double(), dim=1),
                               torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64), rtol=1e-6, atol=0)
    assert rows[0, 7] == pytest.approx(2.0) and rows[0].abs().sum() == pytest.approx(2.0)
    assert norms[0] == pytest.approx(1e30, rel=1e-6) and norms[1] == torch.finfo(torch.float32).max
    big = torch.full((1, 10), 1e300, dtype=torch.float64)  # float64 whose norm overflows too
    clip_updates_(big, 1.0)
    assert torch.linalg.vector_norm(big) == pytest.approx(1.0)
    bad = torch.tensor([[float("nan"), 1.0], [float("inf"), 1.0]])
    assert not torch.isfinite(clip_updates_(bad, 1.0)).any()  # still rejected by the module


class Owner(pl.Callback):
    """Virtual clients whose update is ``make(d)`` (rows), or a sum of ``sum_size`` entries."""

    def __init__(self, make, count=4, sum_size=None):
        self.make, self.count, self.sum_size = make, count, sum_size

    def setup(self, trainer, pl_module, stage):
        self.d = pl_module.num_parameters
        pl_module.register_virtual_clients(self, self.count, name="odd", gives_sum=self.sum_size is not None)

    def client_updates(self, fl_round, indices, clip_norm, out):
        for row in range(len(indices)):
            out[row].copy_(self.make(self.d))

    def client_update_sum(self, fl_round, indices, clip_norm):
        return torch.ones(self.sum_size)


class Rows(FederatedAuditHooks, pl.Callback):
    norms: list

    def __init__(self):
        self.norms = []

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        rows = fl_round.rows_of("odd")
        self.norms.extend(torch.linalg.vector_norm(fl_round.updates[rows].double(), dim=1).tolist())


def _huge(d):
    u = torch.zeros(d)
    u[3] = 1e30
    return u


def test_a_huge_finite_client_update_is_clipped_and_training_goes_on():
    torch.manual_seed(0)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.5, clip_norm=0.7, seed=1)
    rows = Rows()
    quick_trainer(6, [Owner(_huge), rows]).fit(module, datamodule=tiny_federation())
    assert module.round == 6 and rows.norms and np.allclose(rows.norms, 0.7, rtol=1e-6)
    assert torch.isfinite(module.flat_parameters()).all()


@pytest.mark.parametrize("sums", [False, True], ids=["rows", "sum"])
def test_a_virtual_client_of_the_wrong_shape_is_refused_naming_it(sums):
    torch.manual_seed(0)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.5, seed=1)
    owner = Owner(lambda d: torch.ones(d + 1), count=1, sum_size=16 if sums else None)
    with pytest.raises(ValueError, match=r"virtual client 0 of owner 'odd' \(Owner\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quick_trainer(40, [owner]).fit(module, datamodule=tiny_federation())


class NoiseTap:
    """Records every noise vector the module draws (test instrumentation only)."""

    def __init__(self, module):
        self.draws = []
        original = module._noise

        def tapped(d, like):
            out = original(d, like)
            self.draws.append(out.clone())
            return out

        module._noise = tapped


def test_no_logged_seed_or_checkpoint_regenerates_the_noise(tmp_path):
    """An attacker holding every artifact of a secure run (hparams.yaml, audit_summary.json with
    the canary seed, a checkpoint saved at a round's end and one saved mid-round) tries every
    logged seed, with small offsets, and every generator state in the checkpoints, replayed
    from the start: none gives any of the noise vectors the run drew (extends
    tests/auditing/test_reliability.py to the canary seed and mid-round checkpoints)."""
    dm, module = _digits(reproducible=False)
    tap = NoiseTap(module)
    audit = CanaryAudit(20, 200, seed=11, log_figures=False, log_histograms=False)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    mid = str(tmp_path / "mid.ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(dm, module, [SaveInside(mid, 3, "round_start"), audit, ckpt], 5, tmp_path)
    with open(os.path.join(str(tmp_path), "run", "version_0", "hparams.yaml"), encoding="utf-8") as fh:
        seeds = {int(yaml.safe_load(fh)["seed"])}
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    seeds.add(int(summary["inputs"]["seed"]))
    assert 11 in seeds
    candidates = []
    for seed in seeds:
        for offset in range(8):
            gen = torch.Generator().manual_seed(seed + offset)
            candidates.append(torch.randn(len(tap.draws) * module.num_parameters, generator=gen))
    for path in (str(tmp_path / "ckpt" / "last.ckpt"), mid):
        state = torch.load(path, weights_only=False)
        assert "noise_gen" not in state["dp_fedavg"] and "ldp_gen" not in state["dp_fedavg"]
        for value in state["dp_fedavg"].values():
            if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
                gen = torch.Generator()
                gen.set_state(value)
                candidates.append(torch.randn(len(tap.draws) * module.num_parameters, generator=gen))
    d = module.num_parameters
    for c in candidates:  # any draw at any position of a replayed stream
        windows = c.unfold(0, d, d)
        for draw in tap.draws:
            assert not torch.isclose(windows, draw).all(1).any()
