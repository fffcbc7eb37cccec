"""The fault table of issue 26 (parts 2, 4, 5) for the canary audit's outputs and state.

| fault                                        | what must hold                                   |
|----------------------------------------------|--------------------------------------------------|
| SIGTERM / SIGINT mid-fit                      | summary ``interrupted at step N``; exit code != 0 |
| the logger fails (OSError) at fit end         | the summary is still written                      |
| a folder where the summary file should go     | ValueError at fit start, before any round         |
| an unwritable summary folder                  | ValueError at fit start                           |
| disk full while writing                       | OSError; no temp file; final name untouched       |
| a summary file another run wrote              | never replaced: a fresh name, warned              |
| two processes in one log dir (same version)   | two summaries kept                                |
| one value of a saved audit state changed      | ValueError naming the field; untouched: loads     |
| a state saved before checksums                | loads with one warning                            |
"""

from __future__ import annotations

import copy
import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from audit_callbacks.auditing import CanaryAuditConfig, CanaryAuditor
from audit_callbacks.auditing import files as outputs
from audit_callbacks.auditing.output import validate_summary
from audit_callbacks.auditing.sinks import WriterSink
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.callbacks.summary import run_dir
from tests._federated import digits_dpfedavg, fit
from tests.auditing.test_auditor import SimulatedBackend

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "sigterm_fit.py")


# ------------------------------------------------------------------ signals
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 1)])
def test_a_signal_mid_fit_writes_the_interrupted_summary_and_exits_non_zero(tmp_path, signum, code):
    """Lightning turns SIGTERM into ``SIGTERMException`` (a ``SystemExit`` of code 0) and
    SIGINT into ``sys.exit(1)``; the audit writes what it measured in ``on_exception``."""
    # a shell without job control starts background commands with SIGINT ignored, and a child
    # inherits that: give the script the default handlers a user's terminal gives it
    proc = subprocess.Popen([sys.executable, SCRIPT, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, restore_signals=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        started = tmp_path / "started"
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()[0].decode()[-3000:]
        proc.send_signal(signum)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:  # never leave the fit running
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, out[-3000:]
    path = tmp_path / "audit" / "version_0" / "audit_summary.json"
    assert path.exists(), out[-3000:]
    summary = json.loads(path.read_text())
    validate_summary(summary)
    assert summary["run_status"].startswith("interrupted at step ")
    assert int(summary["run_status"].rsplit(" ", 1)[1]) >= 4
    assert summary["inputs"]["rounds"] >= 4 and summary["num_canaries_participated"] >= 2


# ------------------------------------------------------------------ fit end
def _auditor(k=50):
    backend = SimulatedBackend(1024, 0.5)
    auditor = CanaryAuditor(CanaryAuditConfig(k, 100, delta=1e-5, bootstrap=0), backend,
                            lambda key, msg: None, name="Test")
    auditor.start()
    backend.step(np.arange(k))
    return auditor, backend


class FullDiskSink(WriterSink):
    """Every TensorBoard write fails as on a full disk."""

    def _fail(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    scalars = histograms = figures = text = layout = _fail


def test_a_logger_failing_at_fit_end_never_loses_the_summary(tmp_path):
    auditor, _ = _auditor()
    path = auditor.finish(FullDiskSink(), step=1, directory=str(tmp_path), filename="audit_summary.json")
    assert path is not None and os.path.exists(path)
    assert json.loads(open(path, encoding="utf-8").read())["run_status"] == "complete"


def test_a_folder_where_the_summary_goes_fails_at_fit_start(tmp_path):
    os.makedirs(tmp_path / "run" / "version_0" / "audit_summary.json")
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    with pytest.raises(ValueError, match="is a folder"):
        fit(dm, module, [CanaryAudit(10, 20)], 4, tmp_path)
    assert module.round == 0  # refused before any training


def test_an_unwritable_folder_fails_at_fit_start(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):  # root ignores permission bits: refuse the probe as a read-only disk would
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    with pytest.raises(ValueError, match="not writable"):
        fit(dm, module, [CanaryAudit(10, 20)], 4, tmp_path, logger=False)
    assert module.round == 0


def test_disk_full_leaves_no_truncated_file_under_the_final_name(tmp_path, monkeypatch):
    path = outputs.write_summary(str(tmp_path), "audit_summary.json", {"round": 1})
    before = open(path, encoding="utf-8").read()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", full)  # the data never reached the disk
    with pytest.raises(OSError, match="No space"):
        outputs.write_summary(str(tmp_path), "audit_summary.json", {"round": 2, "x": "y" * 100_000})
    assert open(path, encoding="utf-8").read() == before
    assert sorted(os.listdir(tmp_path)) == ["audit_summary.json"]  # no temp file left


# ------------------------------------------------------------------ no run overwrites another
def test_a_file_another_run_wrote_is_never_replaced(tmp_path):
    theirs = tmp_path / "audit_summary.json"
    theirs.write_text('{"run": "theirs"}')
    with pytest.warns(UserWarning, match="written by another run"):
        mine = outputs.write_summary(str(tmp_path), "audit_summary.json", {"run": "mine"})
    assert mine == str(tmp_path / "audit_summary-1.json")
    assert json.loads(theirs.read_text()) == {"run": "theirs"}
    again = outputs.write_summary(str(tmp_path), "audit_summary.json", {"run": "mine, again"})
    assert again == mine and json.loads(open(mine).read())["run"] == "mine, again"  # no third file


class _Logger:
    def __init__(self, log_dir):
        self.log_dir = log_dir


class _Trainer:
    """What :func:`run_dir` reads of a Trainer: its loggers."""

    is_global_zero = True
    default_root_dir = "."

    def __init__(self, log_dir):
        self.loggers = [_Logger(log_dir)]


def _one_run(log_dir, name, barrier):
    """One process of a run that took ``log_dir`` (Lightning's automatic version) as another
    process did: claim it, write the summary."""
    barrier.wait()
    with np.errstate(all="ignore"):
        folder = run_dir(_Trainer(log_dir))
    outputs.write_summary(folder, "audit_summary.json", {"run": name})


def test_two_processes_in_one_version_folder_keep_two_summaries(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    log_dir = str(tmp_path / "lightning_logs" / "version_0")
    procs = [ctx.Process(target=_one_run, args=(log_dir, name, barrier)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("audit_summary*.json"))
    runs = sorted(json.loads((tmp_path / f).read_text())["run"] for f in found)
    assert runs == ["a", "b"], found
    assert len({os.path.dirname(f) for f in found}) == 2  # the second run took its own folder


def test_a_resume_into_the_version_of_a_finished_or_killed_run_keeps_its_folder(tmp_path):
    """A claim left by a process that is gone on this host (a run that ended, or was killed
    with -9, and is now resumed into the same Lightning version) is taken over; a claim of a
    live process, or of another host, is not; several takers of one stale claim: one wins."""
    import socket

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone
    folder = tmp_path / "version_0"
    folder.mkdir()
    marker = folder / outputs.CLAIM_FILENAME
    marker.write_text(f"{socket.gethostname()}:{proc.pid}-{'0' * 32}")
    assert outputs.claim_dir(str(folder))
    assert marker.read_text() == outputs.RUN_TOKEN and sorted(os.listdir(folder)) == [outputs.CLAIM_FILENAME]
    assert run_dir(_Trainer(str(folder))) == str(folder)  # the summary goes with the events
    marker.write_text(f"{socket.gethostname()}:{os.getppid()}-{'0' * 32}")  # alive: not ours
    assert not outputs.claim_dir(str(folder))
    marker.write_text(f"another-host.example:{proc.pid}-{'0' * 32}")  # cannot tell: not ours
    assert not outputs.claim_dir(str(folder))


def _take_stale(folder, results, barrier):
    barrier.wait()
    results.put(outputs.claim_dir(folder))


def test_of_several_processes_taking_one_stale_claim_one_wins(tmp_path):
    # 10 rounds of 8 processes racing for one stale claim: exactly one wins every round (the
    # former rename-then-create let a slow process rename away the winner's fresh claim and
    # win too: 4 of 40 such rounds had two winners, and CI once saw it with 4 processes)
    import socket

    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        folder = tmp_path / f"version_{round_}"
        folder.mkdir()
        (folder / outputs.CLAIM_FILENAME).write_text(f"{socket.gethostname()}:{proc.pid}-{'0' * 32}")
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_take_stale, args=(str(folder), results, barrier)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert sorted(results.get(timeout=10) for _ in procs) == [False] * 7 + [True]
        assert (folder / outputs.CLAIM_FILENAME).read_text() != f"{socket.gethostname()}:{proc.pid}-{'0' * 32}"


# ------------------------------------------------------------------ the state's checksum
def test_a_changed_value_in_the_saved_state_is_refused_naming_the_field():
    auditor, backend = _auditor()
    state = auditor.state_dict()
    saved = copy.deepcopy(state)
    other, _ = _auditor()
    other.load_state_dict(copy.deepcopy(saved))  # untouched: loads
    damaged = copy.deepcopy(saved)
    damaged["stats"]["theta0"][7] = 174.2  # the bit flip (theta_0 -0.0106 -> 174.2)
    with pytest.raises(ValueError, match=r"damaged: stats\.theta0 does not match"):
        _auditor()[0].load_state_dict(damaged)
    damaged = copy.deepcopy(saved)
    damaged["participations"][3] += 1
    with pytest.raises(ValueError, match="participations"):
        _auditor()[0].load_state_dict(damaged)


def test_a_state_without_a_checksum_loads_with_one_warning():
    auditor, _ = _auditor()
    state = auditor.state_dict()
    del state["checksum"]
    warned = []
    backend = SimulatedBackend(1024, 0.5)
    other = CanaryAuditor(CanaryAuditConfig(50, 100, delta=1e-5, bootstrap=0), backend,
                          lambda key, msg: warned.append(key), name="Test")
    other.load_state_dict(state)
    assert warned == ["nochecksum"]
    np.testing.assert_array_equal(other.participations, auditor.participations)


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_a_state_of_other_canary_vectors_is_refused(kind):
    """A checkpoint from before issue 28 (no ``canary_construction``) holds the statistics of
    Hadamard rows cut to d of 2^ceil(log2 d) coordinates: the same seed now builds other
    vectors, so resuming would mix two audits; Gaussian canaries did not change."""
    def auditor():
        return CanaryAuditor(CanaryAuditConfig(50, 100, canaries=kind, delta=1e-5, bootstrap=0),
                             SimulatedBackend(1024, 0.5), lambda key, msg: None, name="Test")

    state = auditor().state_dict()
    assert state["config"]["canary_construction"].startswith(kind)
    del state["checksum"], state["config"]["canary_construction"]
    if kind == "hadamard":
        with pytest.raises(ValueError, match="other canary vectors"):
            auditor().load_state_dict(state)
    else:
        auditor().load_state_dict(state)


def test_a_damaged_lightning_checkpoint_is_refused_at_resume(tmp_path):
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    fit(dm, module, [CanaryAudit(10, 20, seed=5, bootstrap=0, log_figures=False), ckpt], 4, tmp_path,
        logger=False)
    state = torch.load(str(tmp_path / "ckpt" / "last.ckpt"), weights_only=False)
    key = next(k for k in state["callbacks"] if k.startswith("CanaryAudit"))
    state["callbacks"][key]["stats"]["theta0"][0] = 174.2
    torch.save(state, str(tmp_path / "damaged.ckpt"))
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    with pytest.raises(ValueError, match=r"stats\.theta0"):
        fit(dm, module, [CanaryAudit(10, 20, seed=5, bootstrap=0)], 8, tmp_path / "b", logger=False,
            ckpt_path=str(tmp_path / "damaged.ckpt"))


# ------------------------------------------------------------------ signals: label and LDP callbacks
class _SigtermAt(pl.Callback):
    """Raises Lightning's ``SIGTERMException`` after ``step`` optimizer steps (rounds), as its
    signal connector does at the next batch once SIGTERM has been received."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise SIGTERMException


def _interrupted(tmp_path, run) -> list[dict]:
    """Run ``run()`` (a fit that gets SIGTERM at step 3); the process would exit 143; every
    summary JSON written under ``tmp_path``."""
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 143
    paths = sorted(tmp_path.rglob("*summary*.json"))
    assert paths
    assert not list(tmp_path.rglob("audit_report.*"))  # an interrupted run writes no report
    summaries = [json.loads(p.read_text()) for p in paths]
    for summary in summaries:  # what was measured, in the one schema
        validate_summary(summary)
    return summaries


def test_sigterm_mid_fit_writes_the_label_callbacks_interrupted_summaries(tmp_path):
    """DP-SGD with ``LabelReconstructionAttack`` and ``LabelDPLowerBound``: both summaries say
    ``interrupted at step 3``."""
    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
    from datamodules.central import CentralDataModule
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    def run():
        dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
        module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0)
        trainer = pl.Trainer(max_epochs=5, logger=TensorBoardLogger(str(tmp_path), name="run"),
                             callbacks=[LabelReconstructionAttack(), LabelDPLowerBound(), _SigtermAt(3)],
                             enable_progress_bar=False, enable_checkpointing=False, accelerator="cpu",
                             enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(module, datamodule=dm)

    summaries = _interrupted(tmp_path, run)
    assert sorted(s["callback"] for s in summaries) == ["LabelDPLowerBound", "LabelReconstructionAttack"]
    assert all(s["run_status"] == "interrupted at step 3" for s in summaries)


def test_sigterm_mid_fit_writes_the_federated_label_and_ldp_interrupted_summaries(tmp_path):
    """DP-FedAvg with ``FederatedLabelAttack``, and local-DP clients with ``LDPAudit`` and
    ``LDPInferenceAudit``: every summary says ``interrupted at step 3``."""
    from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
    from audit_callbacks.callbacks.ldp_audit import LDPAudit
    from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit
    from audit_callbacks.federated import DPFedAvg
    from audit_callbacks.mechanisms import TwoPoint
    from datamodules import FederatedDataModule
    from models import MLP
    from tests._federated import fit

    def module(randomizer=None):
        dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=50, seed=0)
        dm.setup("fit")
        return dm, DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.5 if randomizer is None
                            else 0.0, clip_norm=1.0, local_lr=0.5, local_batch_size=1000, sampling="shuffle",
                            randomizer=randomizer, client_datasets=dm.client_datasets)

    dm, fl = module()
    _interrupted(tmp_path / "label", lambda: fit(dm, fl, [FederatedLabelAttack(), _SigtermAt(3)], 50, tmp_path / "label"))
    dm, ldp = module(TwoPoint(2.0, center=0.0, radius=0.2))
    _interrupted(tmp_path / "ldp", lambda: fit(dm, ldp, [LDPAudit(), LDPInferenceAudit(), _SigtermAt(3)], 50,
                                              tmp_path / "ldp"))
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("*summary*.json"))]
    assert sorted(s["callback"] for s in summaries) == ["FederatedLabelAttack", "LDPAudit", "LDPInferenceAudit"]
    assert all(s["run_status"] == "interrupted at step 3" for s in summaries)


# ------------------------------------------------------------------ the fit-end window
FIT_END_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "sigterm_fit_end.py")


@pytest.mark.parametrize("run, audits", [
    ("dpsgd", ["CanaryAudit", "LabelDPLowerBound", "LabelReconstructionAttack"]),
    ("federated", ["CanaryAudit", "FederatedLabelAttack"]),
    ("ldp", ["LDPAudit", "LDPInferenceAudit"]),
])
def test_sigterm_in_the_fit_end_window_keeps_every_complete_summary(tmp_path, run, audits):
    """Lightning's teardown restores the default SIGTERM handler before ``on_fit_end``: a
    signal there ends the process at once. Every audit wrote its complete summary (and the
    run's report) at ``on_train_end``, before that window."""
    proc = subprocess.run([sys.executable, FIT_END_SCRIPT, "--out", str(tmp_path), "--run", run],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = proc.stdout.decode()[-3000:]
    assert proc.returncode == -signal.SIGTERM, out  # killed in the window, by the default handler
    folder = tmp_path / "run" / "version_0"
    summaries = [json.loads(p.read_text()) for p in sorted(folder.glob("*summary*.json"))]
    assert sorted(s["callback"] for s in summaries) == audits, out
    for summary in summaries:
        validate_summary(summary)
        assert summary["run_status"] == "complete"
    assert (folder / "audit_report.md").exists() and (folder / "audit_report.html").exists()
    assert not list(folder.glob(".tmp-*"))  # no partial file left


# ------------------------------------------------------------------ one folder, one owner, within a process
def test_two_trainers_of_one_process_in_one_folder_keep_both_runs(tmp_path):
    """Two fits of one process into one logger version (``version=0`` twice): the second
    Trainer's audit files go to a sibling folder with a warning; the first run's summary and
    report are kept, and no audit (tag, step) is written twice into one TensorBoard run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from audit_callbacks import names

    first = fit(*digits_dpfedavg(rounds_per_epoch=4), [CanaryAudit(10, 20, seed=1, bootstrap=0)], 4, tmp_path)
    with pytest.warns(UserWarning, match="another Trainer of this process"):
        second = fit(*digits_dpfedavg(rounds_per_epoch=4), [CanaryAudit(10, 20, seed=2, bootstrap=0)], 4, tmp_path)
    assert run_dir(first) == str(tmp_path / "run" / "version_0")
    assert run_dir(second) == str(tmp_path / "run" / "version_1")
    for version, seed in ((0, 1), (1, 2)):
        folder = tmp_path / "run" / f"version_{version}"
        summary = json.loads((folder / "audit_summary.json").read_text())
        assert summary["inputs"]["seed"] == seed
        assert (folder / "audit_report.md").exists()
        assert not list(folder.glob("audit_summary-*.json"))
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        audit = [t for t in acc.Tags()["scalars"] if t.startswith(f"{names.FAMILY_AUDIT}/")]
        assert audit
        for tag in audit:
            steps = [e.step for e in acc.Scalars(tag)]
            assert len(steps) == len(set(steps)), (version, tag, steps)
    assert run_dir(first) == str(tmp_path / "run" / "version_0")  # each Trainer keeps its folder
