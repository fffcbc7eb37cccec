"""Bad inputs to DP-FedAvg and the federated datamodule, refused early and by name (or fixed):
a frozen model, and two seeds that Lightning's hparams merge used to refuse."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn

from audit_callbacks.federated import DPFedAvg
from datamodules import FederatedDataModule
from models import MLP


def _frozen(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_a_frozen_model_is_refused_at_construction_naming_the_model():
    with pytest.raises(ValueError, match=r"model \(MLP\) has no trainable parameters.*requires_grad=False"):
        DPFedAvg(_frozen(MLP(64, 10, hidden=(8,))))

    class Frozen(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _frozen(nn.Linear(4, 3))

    with pytest.raises(ValueError, match=r"model \(Frozen\) has no trainable parameters"):
        DPFedAvg(Frozen())
    with pytest.raises(ValueError, match=r"model \(ReLU\) has no parameters"):
        DPFedAvg(nn.ReLU())


def test_a_partly_frozen_model_trains_only_its_trainable_parameters():
    model = MLP(64, 10, hidden=(8,))
    first = list(model.parameters())[0]
    first.requires_grad_(False)
    before = first.detach().clone()
    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=2, seed=1)
    module = DPFedAvg(model, clients_per_round=4, local_batch_size=16)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    assert module.round == 2 and torch.equal(first, before)
    assert module.num_parameters == sum(p.numel() for p in model.parameters()) - first.numel()


@pytest.mark.parametrize("logger_cls", [CSVLogger, TensorBoardLogger])
def test_different_datamodule_and_module_seeds_log_with_any_logger(tmp_path, logger_cls):
    """FederatedDataModule's (public) split seed and DPFedAvg's sampling seed have distinct
    hparams names: Lightning's merge of the two no longer stops the fit."""
    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=2, seed=1)
    module = DPFedAvg(MLP(64, 10, hidden=(8,)), clients_per_round=4, local_batch_size=16, seed=2)
    trainer = pl.Trainer(max_steps=2, logger=logger_cls(str(tmp_path), name="run", version=0),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    assert module.round == 2
    assert dm.hparams["seed"] == 1 and module.hparams["sampling_seed"] == 2 and "seed" not in module.hparams


def test_sampling_seed_and_its_former_name_must_agree():
    with pytest.raises(ValueError, match="sampling_seed=3 and seed=4"):
        DPFedAvg(MLP(64, 10), sampling_seed=3, seed=4)
    assert DPFedAvg(MLP(64, 10), sampling_seed=3, seed=3).seed == 3
    with pytest.raises(ValueError, match="sampling_seed"):
        DPFedAvg(MLP(64, 10), sampling_seed=-1)
