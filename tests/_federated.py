"""Shared test helper: fit a federated module for a number of rounds (not a test module)."""

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger


def fit(dm, module, callbacks, steps, tmp_path, logger=True, ckpt_path=None, name="run"):
    """``steps`` rounds on CPU; TensorBoard logs under ``tmp_path/name/version_0`` if ``logger``."""
    log = TensorBoardLogger(str(tmp_path), name=name, version=0) if logger else False
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, logger=log, callbacks=callbacks,
                         accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                         num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer


def digits_dpfedavg(rounds_per_epoch):
    """The small DP-FedAvg run several canary tests share: digits over 40 clients, an MLP with
    one hidden layer of 32, 10 clients a round, noise multiplier 0.5; returns ``(dm, module)``."""
    import torch

    from audit_callbacks.federated import DPFedAvg
    from datamodules import FederatedDataModule
    from models import MLP

    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=rounds_per_epoch, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(32,)), clients_per_round=10, noise_multiplier=0.5,
                      clip_norm=1.0, local_lr=0.1, local_batch_size=8, sampling="shuffle", seed=0, reproducible_noise=True,
                      delta=1e-5)
    return dm, module


def tiny_federation(n_clients=6, n=12, p=4, classes=3, seed=0, rounds_per_epoch=5):
    """A minimal federated datamodule over ``n_clients`` random clients (``n`` examples of
    ``p`` features, ``classes`` labels) whose loader ticks once per round."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Ticks(pl.LightningDataModule):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.client_datasets = [
                TensorDataset(torch.randn(n, p, generator=g), torch.randint(0, classes, (n,), generator=g))
                for _ in range(n_clients)]
            self.num_classes = classes

        def train_dataloader(self):
            return DataLoader(list(range(rounds_per_epoch)), batch_size=None)

    return Ticks()


def quick_trainer(steps, callbacks=(), **kw):
    """A CPU Trainer of ``steps`` rounds without logger, checkpointing or progress bar."""
    return pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
                      accelerator="cpu", num_sanity_val_steps=0, **kw)
