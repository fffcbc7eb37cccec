"""CanaryAudit on the port of Opacus' Lightning MNIST example (``pytorch_lightning`` imports
kept; the callbacks added to the Trainer and nothing else changed): fit, resume from a checkpoint
with the accountant restored, test with ``ckpt_path``, no validation loop, TensorBoard, CSV and
no logger.

Opacus' example cannot ``fit`` the same module twice: its ``configure_optimizers`` calls
``make_private(module=self)`` every time and Opacus refuses to hook a model twice. Repeated fits
of a module that keeps its optimizer are tested in ``tests/integration/test_users_scripts.py``.
"""

import csv
import glob
import os

import pytest
import pytorch_lightning as pl
import torch
from opacus.lightning import DPLightningDataModule
from pytorch_lightning.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import CanaryAudit
from tests.fixtures.opacus_mnist_lightning import DigitsDataModule, LitSampleConvNetClassifier, main

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|does not have many workers|secure RNG|Optimal order|val_dataloader).*")

_COMMON = {"enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 5}


def test_the_example_with_a_canary_audit_in_tensorboard(tmp_path):
    torch.manual_seed(0)
    audit = CanaryAudit(200, bootstrap=0)
    model, trainer = main(max_epochs=2, callbacks=[audit], default_root_dir=str(tmp_path),
                          logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="run"),
                          enable_checkpointing=False, **_COMMON)
    acc = EventAccumulator(trainer.logger.log_dir,
                           size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    # the example has no validation loop: an estimate at each training epoch's end
    assert len(acc.Scalars("audit/epsilon_final_model")) == 2
    assert {"audit/epsilon_lower_bound_all_iterates", "audit/epsilon_analytic", "epsilon"} <= set(tags["scalars"])
    assert len(tags["histograms"]) == 4 and len(tags["images"]) == 3  # 2 densities and the ROC
    assert acc.Tensors("custom_scalars__config__")
    # the analytic epsilon is the example's own accountant's (the value it logs as "epsilon")
    eps = model.privacy_engine.get_epsilon(model.delta)
    assert audit.last_report.epsilon_analytic == pytest.approx(eps)
    assert acc.Scalars("epsilon")[-1].value == pytest.approx(eps, rel=1e-6)


def _fit(tmp_path, name, epochs, callbacks, *, logger, ckpt_path=None):
    torch.manual_seed(0)
    model = LitSampleConvNetClassifier()
    data = DigitsDataModule(batch_size=64)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=logger,
                         default_root_dir=str(tmp_path / name),
                         enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                         **_COMMON)
    trainer.fit(model, DPLightningDataModule(data), ckpt_path=ckpt_path)
    return model, trainer, data


def test_resume_test_csv_and_no_logger(tmp_path):
    full_audit = CanaryAudit(200, bootstrap=0)
    full, _, _ = _fit(tmp_path, "full", 2, [full_audit], logger=False)
    # no logger: the summary goes to a fresh versioned folder of the run
    assert full_audit.summary_path == str(tmp_path / "full" / "audit" / "version_0" / "audit_summary.json")

    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    csv_logger = pl.loggers.CSVLogger(str(tmp_path), name="csv")
    _fit(tmp_path, "first", 1, [CanaryAudit(200, bootstrap=0), ckpt], logger=csv_logger)
    with open(os.path.join(csv_logger.log_dir, "metrics.csv"), encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert any(r.get("audit/epsilon_final_model") for r in rows)  # scalars reach a CSV logger

    audit = CanaryAudit(200, bootstrap=0)
    with pytest.warns(UserWarning, match="earlier steps were put back"):
        resumed, trainer, data = _fit(tmp_path, "resumed", 2, [audit], logger=False,
                                      ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    # Opacus' PrivacyEngine is not in Lightning's checkpoint: the audit restores its history, so
    # the example's own epsilon after resume equals the uninterrupted run's
    assert resumed.privacy_engine.get_epsilon(1e-5) == pytest.approx(full.privacy_engine.get_epsilon(1e-5))
    assert audit.last_report.epsilon_analytic == pytest.approx(full_audit.last_report.epsilon_analytic)
    assert audit.backend.progress() == full_audit.backend.progress()
    # test with a checkpoint after fit: works, and leaves the fit's audit alone
    fitted = audit.last_report
    results = trainer.test(resumed, data, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), verbose=False)
    assert 0.0 <= results[0]["test_accuracy"] <= 1.0 and audit.last_report is fitted
    assert len(glob.glob(str(tmp_path / "resumed" / "audit" / "version_*"))) == 1


def test_all_three_callbacks_complete_the_example(tmp_path):
    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack

    torch.manual_seed(0)
    audit, attack, bound = CanaryAudit(200, bootstrap=0), LabelReconstructionAttack(), LabelDPLowerBound()
    model, trainer = main(max_epochs=1, callbacks=[audit, attack, bound], default_root_dir=str(tmp_path),
                          logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="run"),
                          enable_checkpointing=False, **_COMMON)
    assert trainer.state.finished and audit.last_report is not None
    # the label callbacks chain the step hook: the accountant still counts every step
    steps = sum(h[2] for h in model.privacy_engine.accountant.history)
    assert audit.backend.progress() == steps == bound.steps
    assert audit.last_report.epsilon_analytic == pytest.approx(model.privacy_engine.get_epsilon(1e-5))
