"""A resume that changes the audit is refused with the setting named, on every front end: the
auditor (every setting its numbers depend on, and a default that resolves to another k or k'),
CanaryAudit on Lightning + Opacus (a changed ``num_canaries`` changes the callback's state key,
so Lightning alone would start a fresh audit) and DP-FedAvg's cohort sampler."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from audit_callbacks.auditing import CanaryAuditConfig, CanaryAuditor
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.federated.sampling import CohortSampler
from datamodules import FederatedDataModule
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier
from tests.auditing.test_auditor import SimulatedBackend

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


def _state(population=None, **config):
    backend = SimulatedBackend(4096, 1.0)
    backend.population = population
    auditor = CanaryAuditor(CanaryAuditConfig(**config), backend, lambda k, m: None, name="Test")
    auditor.start()
    backend.step(np.arange(0, auditor.num_canaries, 2))
    return auditor.state_dict()


def _resume(state, population=None, **config):
    backend = SimulatedBackend(4096, 1.0)
    backend.population = population
    CanaryAuditor(CanaryAuditConfig(**config), backend, lambda k, m: None, name="Test").load_state_dict(state)


@pytest.mark.parametrize("changed, pattern", [
    ({"alpha": 0.1}, "alpha=0.05, this one 0.1"),
    ({"sample_rate": 0.5}, "sample_rate=None, this one 0.5"),
    ({"canary_norm_multiplier": 3.0}, "canary_norm_multiplier=10.0, this one 3.0"),
    ({"repeats": 2}, "repeats=None, this one 2"),
    ({"num_unobserved": 200}, "num_unobserved=100, this one 200"),
    ({"num_canaries": None}, "num_canaries=50, this one None"),
])
def test_every_changed_setting_is_refused_by_name(changed, pattern):
    kept = {"num_canaries": 50, "num_unobserved": 100, "seed": 3}
    state = _state(**kept)
    _resume(state, **kept, bootstrap=10, max_buffered_rounds=4)  # these change no number
    with pytest.raises(ValueError, match=pattern):
        _resume(state, **{**kept, **changed})


def test_a_default_that_resolves_to_another_k_is_refused_naming_it():
    state = _state(population=300)  # num_canaries=None resolves to 300
    _resume(state, population=300)
    with pytest.raises(ValueError, match=r"resolved num_canaries to 300, this one to 500 .*default.*"
                                         r"num_canaries=300 given explicitly"):
        _resume(state, population=500)


def _dpsgd_fit(tmp_path, audit, *, steps, ckpt_path=None, ckpt=None):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, shuffle=False, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.5, noise_multiplier=1.0, max_grad_norm=1.0)
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, callbacks=[audit] + ([ckpt] if ckpt else []),
                         accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=ckpt is not None, num_sanity_val_steps=0, limit_val_batches=0,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)


def test_lightning_dpsgd_resume_with_num_canaries_left_to_its_default_is_refused(tmp_path):
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    _dpsgd_fit(tmp_path / "a", CanaryAudit(50, seed=5, bootstrap=0), steps=4, ckpt=ckpt)
    last = str(tmp_path / "ckpt" / "last.ckpt")
    with pytest.raises(ValueError, match=r"CanaryAudit: .*num_canaries=50, this one .*None"):
        _dpsgd_fit(tmp_path / "b", CanaryAudit(seed=5, bootstrap=0), steps=8, ckpt_path=last)
    with pytest.raises(ValueError, match=r"CanaryAudit: .*alpha=0.05, this one 0.2"):
        _dpsgd_fit(tmp_path / "c", CanaryAudit(50, seed=5, bootstrap=0, alpha=0.2), steps=8, ckpt_path=last)


def _fedavg(tmp_path, *, clients=30, per_round=5, steps=3, ckpt_path=None):
    dm = FederatedDataModule("digits", num_clients=clients, rounds_per_epoch=3, seed=0)
    module = DPFedAvg(MLP(64, 10, hidden=(8,)), clients_per_round=per_round, noise_multiplier=1.0,
                      local_batch_size=16, sampling="uniform")
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, callbacks=[ckpt], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)


def test_dp_fedavg_refuses_a_changed_sampler_naming_the_setting(tmp_path):
    _fedavg(tmp_path / "a")
    last = str(tmp_path / "a" / "ckpt" / "last.ckpt")
    with pytest.raises(ValueError, match=r"clients_per_round: .*sampled with 5, this run has 6"):
        _fedavg(tmp_path / "b", per_round=6, steps=6, ckpt_path=last)
    with pytest.raises(ValueError, match=r"the population N .*here 40 real.*num_clients.*sampled with 30, this run has 40"):
        _fedavg(tmp_path / "c", clients=40, steps=6, ckpt_path=last)


def test_cohort_sampler_names_each_setting():
    state = CohortSampler(100, 10, "uniform").state_dict()
    with pytest.raises(ValueError, match="rule: .*sampled with 'uniform', this run has 'poisson'"):
        CohortSampler(100, 10, "poisson").load_state_dict(state)
    with pytest.raises(ValueError, match="sampling: .*sampled with 'uniform', this run has 'shuffle'"):
        CohortSampler(100, 10, "shuffle").load_state_dict(state, settings={"rule": "sampling"})
