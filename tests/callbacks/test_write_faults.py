"""Every Lightning callback's writes are guarded: a read-only run folder, or a logger that dies
mid-run, is warned about and never raises out of ``trainer.fit``.

| fault                                    | what must hold                                         |
|------------------------------------------|--------------------------------------------------------|
| the version folder made immutable mid-fit | each of the six callbacks warns; ``fit`` returns       |
| the logger fails at every write           | each warns; its summary is still written in the folder |
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import warnings

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from audit_callbacks.auditing.output import validate_summary
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
from audit_callbacks.callbacks.ldp_audit import LDPAudit
from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit
from tests._federated import digits_dpfedavg, fit


def _dpsgd(tmp_path, callbacks, logger):
    from datamodules.central import CentralDataModule
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0)
    trainer = pl.Trainer(max_steps=6, logger=logger, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, accelerator="cpu", enable_model_summary=False,
                         num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)


def _ldp():
    from audit_callbacks.federated import DPFedAvg
    from audit_callbacks.mechanisms import TwoPoint
    from datamodules import FederatedDataModule
    from models import MLP

    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=50, seed=0)
    dm.setup("fit")
    return dm, DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.0, clip_norm=1.0,
                        local_lr=0.5, local_batch_size=1000, sampling="shuffle",
                        randomizer=TwoPoint(2.0, center=0.0, radius=0.2), client_datasets=dm.client_datasets)


def _label_callbacks():
    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack

    return [LabelReconstructionAttack(), LabelDPLowerBound()]


# (name, the fit given its callbacks and the folder, the audit callbacks)
RUNS = {
    "label": (lambda cbs, d: _dpsgd(d, cbs, TensorBoardLogger(str(d), name="run", version=0)), _label_callbacks),
    "canary_federated_label": (lambda cbs, d: fit(*digits_dpfedavg(rounds_per_epoch=6), cbs, 6, d),
                               lambda: [CanaryAudit(10, 20, bootstrap=0), FederatedLabelAttack()]),
    "ldp": (lambda cbs, d: fit(*_ldp(), cbs, 4, d), lambda: [LDPAudit(), LDPInferenceAudit()]),
}


class _Immutable(pl.Callback):
    """Makes the run's version folder immutable once training started (``chattr +i``: root
    ignores permission bits), as the probe of the issue did."""

    def __init__(self) -> None:
        self.folder: str | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: object) -> None:
        self.folder = trainer.loggers[0].log_dir
        subprocess.run(["chattr", "+i", self.folder], check=True)

    def release(self) -> None:
        if self.folder is not None:
            subprocess.run(["chattr", "-i", self.folder], check=False)


def _can_make_immutable(tmp_path) -> bool:
    if shutil.which("chattr") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
        if ok:
            with contextlib.suppress(OSError):
                (probe / "x").write_text("x")
                ok = False  # the flag did not hold (not root, or a file system without it)
        return ok
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_read_only_version_folder_warns_and_never_stops_the_fit(tmp_path, run):
    if not _can_make_immutable(tmp_path):
        pytest.skip("needs chattr +i (root on a file system with the immutable flag)")
    go, make = RUNS[run]
    audits, immutable = make(), _Immutable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            go([*audits, immutable], tmp_path)  # raises nothing
    finally:
        immutable.release()
    said = " ".join(str(w.message) for w in caught)
    for audit in audits:
        assert f"{type(audit).__name__}: the summary could not be written" in said, said[-2000:]
    assert not list(tmp_path.rglob("*summary*.json"))


class _DeadLogger(TensorBoardLogger):
    """A logger whose every write fails once training started (a dead tracking server)."""

    dead = False

    def log_metrics(self, metrics, step=None):
        if self.dead:
            raise RuntimeError("logger connection lost")
        return super().log_metrics(metrics, step)


class _Kill(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step >= 2:
            trainer.loggers[0].dead = True


def test_a_logger_that_dies_mid_run_never_loses_the_label_summaries(tmp_path):
    """The audits' own writes to the dead logger are warned about; Lightning's own logging then
    stops the fit with the logger's error, and each audit's summary of what it measured is
    still written to the run's folder (``failed at step N (...)``)."""
    audits = _label_callbacks()
    logger = _DeadLogger(str(tmp_path), name="run", version=0)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match="connection lost"):
        warnings.simplefilter("always")
        _dpsgd(tmp_path, [*audits, _Kill()], logger)
    said = " ".join(str(w.message) for w in caught)
    assert "a TensorBoard / logger write failed (RuntimeError: logger connection lost)" in said, said[-2000:]
    found = sorted((tmp_path / "run" / "version_0").glob("*summary*.json"))
    summaries = [json.loads(p.read_text()) for p in found]
    assert sorted(s["callback"] for s in summaries) == ["LabelDPLowerBound", "LabelReconstructionAttack"]
    for summary in summaries:
        validate_summary(summary)
        assert summary["run_status"].startswith("failed at step ")
        assert "RuntimeError: logger connection lost" in summary["run_status"]
    assert not list(tmp_path.rglob("audit_report.*"))  # a failed run writes no report


def test_the_six_callbacks_write_only_through_their_output_path():
    """Every write of the six Lightning callbacks goes through its ``LightningOutput`` (whose
    writes are guarded): no file, writer, logger or sink is reached past it."""
    import inspect
    import re

    from audit_callbacks.callbacks import (
        LabelDPLowerBound,
        LabelReconstructionAttack,
        canary_audit,
        federated_label_attack,
        label_base,
        label_dp,
        label_reconstruction,
        ldp_audit,
        ldp_inference,
    )
    from audit_callbacks.callbacks.summary import LightningOutput

    for callback in (CanaryAudit(10, 20), LabelReconstructionAttack(), LabelDPLowerBound(), FederatedLabelAttack(),
                     LDPAudit(), LDPInferenceAudit()):
        assert isinstance(callback.output, LightningOutput), type(callback).__name__
    direct = re.compile(r"\bopen\(|write_text\(|json\.dump|SummaryWriter|log_metrics\(|\.experiment\b|"
                        r"\.sink\.|files\.write_summary|add_custom_scalars")
    for module in (canary_audit, federated_label_attack, label_base, label_dp, label_reconstruction, ldp_audit,
                   ldp_inference):
        found = [line.strip() for line in inspect.getsource(module).splitlines() if direct.search(line)]
        assert not found, (module.__name__, found)


def test_the_fit_end_refreshes_the_summaries_and_writes_the_report_once(tmp_path, monkeypatch):
    """Each summary is written at ``on_train_end`` and written again at fit end; the run's
    report is written once (at the training's end, when every audit has its summary)."""
    from audit_callbacks.auditing import files, html_report

    written: list[str] = []
    reports: list[str] = []
    write_summary, write_report = files.write_summary, html_report.write_report
    monkeypatch.setattr(files, "write_summary", lambda d, f, s: written.append(f) or write_summary(d, f, s))
    monkeypatch.setattr(html_report, "write_report", lambda *a, **k: reports.append(a[1]) or write_report(*a, **k))
    fit(*digits_dpfedavg(rounds_per_epoch=4), [CanaryAudit(10, 20, bootstrap=0, log_figures=False),
                                               FederatedLabelAttack()], 4, tmp_path)
    assert sorted(written) == sorted(["audit_summary.json", "federated_label_attack_summary.json"] * 2)
    assert len(reports) == 1
    folder = tmp_path / "run" / "version_0"
    assert (folder / "audit_report.html").exists()
    assert json.loads((folder / "audit_summary.json").read_text())["run_status"] == "complete"


def test_a_failing_test_or_validate_after_the_fit_leaves_its_summaries_alone(tmp_path):
    """``trainer.test`` raising after a completed fit (the module has no ``test_step``):
    Lightning calls every callback's ``on_exception``, and the fit's summaries stay
    ``complete`` (they read ``failed at step N (MisconfigurationException ...)`` before)."""
    from datamodules.central import CentralDataModule
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    audits = [CanaryAudit(30, 30, bootstrap=0, log_figures=False), *_label_callbacks()]
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0)
    trainer = pl.Trainer(max_steps=6, logger=TensorBoardLogger(str(tmp_path), name="run", version=0),
                         callbacks=audits, enable_progress_bar=False, enable_checkpointing=False,
                         accelerator="cpu", enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
        folder = tmp_path / "run" / "version_0"
        before = {p.name: p.read_text() for p in folder.glob("*summary*.json")}
        assert len(before) == 3 and all(json.loads(t)["run_status"] == "complete" for t in before.values())
        with pytest.raises(Exception, match="test_step"):
            trainer.test(module, datamodule=dm)
    assert {p.name: p.read_text() for p in folder.glob("*summary*.json")} == before
