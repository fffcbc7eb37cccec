"""Users' scripts as they are: both Lightning namespaces, repeated fits, resume with the
accountant, no validation loop, the user's own evaluation inside DP-FedAvg."""

import os

import lightning.pytorch as L
import pytest
import pytorch_lightning as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from opacus import PrivacyEngine
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.callbacks import CanaryAudit
from datamodules import FederatedDataModule
from datamodules.breast_cancer import load_breast_cancer_tensors

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


def _events(log_dir):
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def _dp_module(base):
    """The usual Opacus + Lightning module (make_private in configure_optimizers), on the
    Lightning namespace ``base``; no validation loop."""

    class DPModule(base.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def train_dataloader(self):
            x, y = load_breast_cancer_tensors()
            return DataLoader(TensorDataset(x, y.long()), batch_size=64)

        def configure_optimizers(self):
            if getattr(self, "dp_optimizer", None) is not None:  # a second fit: Opacus hooks once
                return self.dp_optimizer
            optimizer = torch.optim.SGD(self.net.parameters(), lr=0.5)
            self.trainer.fit_loop.setup_data()
            self.privacy_engine = PrivacyEngine()
            _, self.dp_optimizer, _ = self.privacy_engine.make_private(
                module=self.net, optimizer=optimizer, data_loader=self.trainer.train_dataloader,
                noise_multiplier=1.0, max_grad_norm=1.0)
            return self.dp_optimizer

    return DPModule()


def _trainer(base, tmp_path, epochs, callbacks, *, logger=True, name="run", max_steps=-1):
    log = base.loggers.TensorBoardLogger(str(tmp_path), name=name) if logger else False
    return base.Trainer(max_epochs=epochs, max_steps=max_steps, callbacks=callbacks, logger=log, accelerator="cpu",
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                        default_root_dir=str(tmp_path), log_every_n_steps=1)


@pytest.mark.parametrize("base", [pl, L], ids=["pytorch_lightning", "lightning.pytorch"])
def test_opacus_script_of_either_namespace_gets_every_tensorboard_extra(tmp_path, base):
    audit = CanaryAudit(100, bootstrap=0)
    trainer = _trainer(base, tmp_path, 3, [audit])
    trainer.fit(_dp_module(base))
    acc = _events(trainer.logger.log_dir)
    tags = acc.Tags()
    assert {"audit/epsilon_final_model", "audit/epsilon_lower_bound_final_model"} <= set(tags["scalars"])
    # no validation loop: an estimate at every training epoch's end, not only at fit end
    assert len(acc.Scalars("audit/epsilon_final_model")) == 3
    assert len(tags["histograms"]) == 4 and len(tags["images"]) == 3  # 2 densities and the ROC
    assert acc.Tensors("custom_scalars__config__")  # the Custom Scalars layout
    assert audit.last_report.epsilon_analytic == pytest.approx(trainer.lightning_module.privacy_engine.get_epsilon(1e-5))


def test_federated_script_on_pytorch_lightning_uses_its_own_validation_step(tmp_path):
    from audit_callbacks.compat.pytorch_lightning import DPFedAvg

    class AutoEncoder(pl.LightningModule):  # no labels, no accuracy: an MSE validation
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64))

        def training_step(self, batch, batch_idx):
            x = batch[0].flatten(1)
            return nn.functional.mse_loss(self.net(x), x)

        def validation_step(self, batch, batch_idx):
            x = batch[0].flatten(1)
            self.log("val/mse", nn.functional.mse_loss(self.net(x), x))

    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    module = DPFedAvg(AutoEncoder(), clients_per_round=5, client_datasets=dm.client_datasets)
    audit = CanaryAudit(10, 100, log_figures=False)
    trainer = _trainer(pl, tmp_path, -1, [audit], max_steps=8)
    trainer.fit(module, train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader())
    acc = _events(trainer.logger.log_dir)
    assert len(acc.Scalars("val/mse")) == 2 and len(acc.Scalars("audit/epsilon_final_model")) >= 2
    assert len(acc.Tags()["histograms"]) == 4


def test_a_repeated_fit_continues_the_audit_and_the_accountant(tmp_path):
    whole = CanaryAudit(100, bootstrap=0)
    one = _dp_module(L)
    _trainer(L, tmp_path / "whole", 4, [whole], logger=False).fit(one)

    audit = CanaryAudit(100, bootstrap=0)
    module = _dp_module(L)
    _trainer(L, tmp_path / "twice", 2, [audit], name="first").fit(module)
    second = _trainer(L, tmp_path / "twice", 2, [audit], name="second")
    second.fit(module)
    assert audit.backend.progress() == whole.backend.progress()
    assert (audit.auditor.participations == whole.auditor.participations).all()
    eps = module.privacy_engine.get_epsilon(1e-5)
    assert eps == pytest.approx(one.privacy_engine.get_epsilon(1e-5))
    assert audit.last_report.epsilon_analytic == pytest.approx(eps)
    assert _events(second.logger.log_dir).Scalars("audit/epsilon_final_model")  # the second fit logs


def test_resume_restores_the_accountant(tmp_path):
    # Opacus' PrivacyEngine is not in Lightning's checkpoint: the resumed run's new accountant
    # gets the history back from the audit's state
    whole = _dp_module(L)
    full = CanaryAudit(100, bootstrap=0)
    _trainer(L, tmp_path / "a", 4, [full], logger=False).fit(whole)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    _trainer(L, tmp_path / "b", 2, [CanaryAudit(100, bootstrap=0), ckpt], logger=False).fit(_dp_module(L))
    resumed = _dp_module(L)
    audit = CanaryAudit(100, bootstrap=0)
    with pytest.warns(UserWarning, match="earlier steps were put back"):
        _trainer(L, tmp_path / "c", 4, [audit], logger=False).fit(
            resumed, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert resumed.privacy_engine.accountant.history == whole.privacy_engine.accountant.history
    assert audit.last_report.epsilon_analytic == pytest.approx(full.last_report.epsilon_analytic)
    assert (audit.auditor.participations == full.auditor.participations).all()


def test_the_callbacks_accept_a_pytorch_lightning_tensorboard_logger():
    from audit_callbacks.compat.namespaces import is_lightning_module, is_tensorboard_logger

    assert is_tensorboard_logger(pl.loggers.TensorBoardLogger(os.devnull))
    assert is_tensorboard_logger(TensorBoardLogger(os.devnull))
    assert not is_tensorboard_logger(pl.loggers.CSVLogger(os.devnull))
    assert is_lightning_module(pl.LightningModule()) and is_lightning_module(L.LightningModule())
    assert not is_lightning_module(nn.Linear(2, 2))


@pytest.mark.parametrize("how", ["make_private_with_epsilon", "gdp_accountant"])
def test_other_opacus_entry_points_give_the_accountants_epsilon(tmp_path, how):
    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def train_dataloader(self):
            x, y = load_breast_cancer_tensors()
            return DataLoader(TensorDataset(x, y.long()), batch_size=64)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.net.parameters(), lr=0.5)
            self.trainer.fit_loop.setup_data()
            loader = self.trainer.train_dataloader
            if how == "make_private_with_epsilon":
                self.privacy_engine = PrivacyEngine()
                _, optimizer, _ = self.privacy_engine.make_private_with_epsilon(
                    module=self.net, optimizer=optimizer, data_loader=loader, target_epsilon=3.0,
                    target_delta=1e-5, epochs=3, max_grad_norm=1.0)
            else:
                self.privacy_engine = PrivacyEngine(accountant="gdp")
                _, optimizer, _ = self.privacy_engine.make_private(
                    module=self.net, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                    max_grad_norm=1.0)
            return optimizer

    audit = CanaryAudit(100, bootstrap=0)
    module = Module()
    _trainer(L, tmp_path, 3, [audit], logger=False).fit(module)
    eps = module.privacy_engine.get_epsilon(1e-5)
    assert audit.last_report.epsilon_analytic == pytest.approx(eps)
    if how == "make_private_with_epsilon":
        assert eps == pytest.approx(3.0, rel=0.05)
    # the canaries joined at the rate the accountant was charged
    q = module.privacy_engine.accountant.history[0][1]
    assert audit.backend.injector.sample_rate == pytest.approx(q)


def test_ldp_audit_with_dpfedavg_on_pytorch_lightning(tmp_path):
    from audit_callbacks.callbacks import LDPAudit
    from audit_callbacks.compat.pytorch_lightning import DPFedAvg
    from audit_callbacks.mechanisms import LDPSGD
    from models import MLP

    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    module = DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.0,
                      local_batch_size=64, randomizer=LDPSGD(2.0, clip_norm=1.0),
                      client_datasets=dm.client_datasets, num_classes=10)
    audit = LDPAudit(trials=200, adversaries=("dummy",), every_n_rounds=2)
    trainer = _trainer(pl, tmp_path, -1, [audit], max_steps=4)
    trainer.fit(module, train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader())
    assert audit.audits == 2 and len(audit.history) == 2
    assert _events(trainer.logger.log_dir).Scalars("ldp/epsilon0_dummy")


def test_federated_label_attack_with_dpfedavg_on_pytorch_lightning(tmp_path):
    """FedSGD on the pytorch_lightning namespace: every label without noise, the per-client
    bound (exact clip factors) in TensorBoard."""
    from audit_callbacks.callbacks import FederatedLabelAttack
    from audit_callbacks.compat.pytorch_lightning import DPFedAvg
    from models import MLP

    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=3, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(64,)), clients_per_round=4, noise_multiplier=0.01, clip_norm=1.0,
                      local_lr=0.5, local_epochs=1, local_batch_size=1000, client_datasets=dm.client_datasets,
                      num_classes=10)
    attack = FederatedLabelAttack()
    trainer = _trainer(pl, tmp_path, -1, [attack], max_steps=3)
    trainer.fit(module, train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader())
    assert len(attack.history) == 12 and all(h["accuracy"] == 1.0 for h in attack.history)
    assert attack.flipped_clip.startswith("exact")
    assert len(_events(trainer.logger.log_dir).Scalars("fl_label_attack/epsilon_lower_bound")) == 3
