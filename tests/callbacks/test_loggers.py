"""The audit report and summary reach the run's other loggers, for real: Lightning's
``MLFlowLogger`` (a local file store, read back with ``MlflowClient``) and ``WandbLogger``
(offline, read back from the offline run's files folder), after a short DP-FedAvg fit with
``CanaryAudit``. Nothing goes to a network. The packages come with the ``loggers`` test extra
(``pip install -e ".[test,loggers]"``, what ``make install`` and CI install); without one, its
test is skipped saying so."""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl
import pytest

from audit_callbacks.callbacks import CanaryAudit
from tests._federated import digits_dpfedavg

pytestmark = [pytest.mark.slow,  # a fit each, and the loggers' start-up (W&B starts its service)
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]

REPORT = ("audit_report.html", "audit_report.md")


def _fit(tmp_path, logger) -> CanaryAudit:
    callback = CanaryAudit(10, 20, bootstrap=0, log_figures=False, log_histograms=False)
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    trainer = pl.Trainer(max_steps=4, max_epochs=-1, logger=logger, callbacks=[callback], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(tmp_path / "root"))
    trainer.fit(module, datamodule=dm)
    assert callback.summary_path and callback.auditor.report_paths
    return callback


def _same_files(callback: CanaryAudit, folder: str) -> None:
    """The summary and the report in ``folder`` are the run folder's, byte for byte."""
    local = [callback.summary_path, *callback.auditor.report_paths]
    for path in local:
        copy = os.path.join(folder, os.path.basename(path))
        assert os.path.isfile(copy), (copy, sorted(os.listdir(folder)))
        with open(path, "rb") as a, open(copy, "rb") as b:
            assert a.read() == b.read(), path
    with open(os.path.join(folder, os.path.basename(callback.summary_path)), encoding="utf-8") as fh:
        assert json.load(fh)["run_status"] == "complete"


def test_mlflow_gets_the_summary_and_the_report_as_artifacts(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (the loggers test extra: pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    # a local file store (MLflow 3 asks to opt in to it; its SQLite store needs SQLAlchemy,
    # which mlflow-skinny does not bring)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(experiment_name="audit", tracking_uri=uri)
    callback = _fit(tmp_path, logger)
    client = MlflowClient(tracking_uri=uri)
    listed = {a.path for a in client.list_artifacts(logger.run_id)}
    assert {os.path.basename(callback.summary_path), *REPORT} <= listed, listed
    folder = client.download_artifacts(logger.run_id, "", str(tmp_path / "download"))
    _same_files(callback, folder)


def test_wandb_offline_gets_the_summary_and_the_report_as_run_files(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (the loggers test extra: pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import WandbLogger

    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                       "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    logger = WandbLogger(project="audit", save_dir=str(tmp_path), offline=True)
    try:
        callback = _fit(tmp_path, logger)
        files = logger.experiment.dir  # the offline run's files folder, synced later by `wandb sync`
    finally:
        logger.experiment.finish()
    assert "offline-run-" in files and files.startswith(str(tmp_path))
    _same_files(callback, files)
