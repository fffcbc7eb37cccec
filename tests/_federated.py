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
