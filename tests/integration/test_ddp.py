"""CanaryAudit under Lightning's DDP strategy (2 CPU processes, gloo) with Opacus' distributed
DP-SGD, against the same global batches in one process; the refusals of the set-ups the audit
cannot describe (a one-process DPOptimizer per rank, DP-FedAvg under DDP).

The DDP runs launch ``tests/scripts/ddp_dpsgd.py`` with ``subprocess``; Lightning's launcher
re-runs it for rank 1. They are skipped when gloo or local sockets are unavailable. The
one-process reference runs the same script's ``main`` in this interpreter, while the DDP runs
start (one interpreter importing Lightning and Opacus fewer: most of the set-up's time).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from audit_callbacks.backends.fedavg import FedAvgBackend
from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
from audit_callbacks.backends.opacus.placement import canary_placement
from audit_callbacks.canary.vectors import CanarySet

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "ddp_dpsgd.py"
TIMEOUT_S = 240  # a hung rendezvous fails the test instead of blocking CI


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_available() -> str | None:
    """Why the DDP runs cannot happen here, or None."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        return "torch.distributed with the gloo backend is not available"
    try:
        _free_port()
    except OSError as err:
        return f"no local TCP port for the rendezvous: {err}"
    return None


needs_ddp = pytest.mark.skipif(_ddp_available() is not None, reason=str(_ddp_available()))


def _launch(out: Path, *args: str) -> subprocess.Popen[str]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)  # a launcher's variables would make the script join that job
    try:
        return subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(out), *args], cwd=str(out),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as err:  # pragma: no cover - a sandbox without process creation
        pytest.skip(f"cannot launch a subprocess: {err}")


def _wait(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the DDP script did not finish in {TIMEOUT_S} s:\n{output[-4000:]}")
    return proc.returncode, output


def _run_in_this_process(out: Path, *args: str) -> None:
    """``ddp_dpsgd.main`` in this interpreter, leaving its global state as it found it (the
    random generators, torch's thread count, the environment, the working directory)."""
    import importlib.util
    import random

    out.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.spec_from_file_location("ddp_dpsgd_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
             torch.get_num_threads(), dict(os.environ), os.getcwd(), list(sys.path))
    try:
        os.chdir(out)
        spec.loader.exec_module(script)
        script.main(["--out", str(out), *args])
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        torch.set_num_threads(saved[3])
        os.environ.clear()
        os.environ.update(saved[4])
        os.chdir(saved[5])
        sys.path[:] = saved[6]


def _ranks(out: Path, n: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three runs, launched together: DDP with DPDDP (2 ranks), the same global batches in
    one process, and DDP with a one-process DPOptimizer per rank (must be refused)."""
    reason = _ddp_available()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("ddp")
    procs = {
        "ddp": _launch(base / "ddp", "--devices", "2"),
        "plain": _launch(base / "plain", "--devices", "2", "--mode", "plain"),
    }
    try:
        _run_in_this_process(base / "single", "--devices", "1")
    finally:
        done = {name: _wait(proc) for name, proc in procs.items()}
    rc, output = done["ddp"]
    assert rc == 0, f"ddp run failed:\n{output[-6000:]}"
    return {"base": base, "ddp": _ranks(base / "ddp", 2), "single": _ranks(base / "single", 1)[0],
            "plain": done["plain"]}


@needs_ddp
def test_ddp_canaries_count_once_and_match_one_process(runs: dict[str, Any]) -> None:
    single, ranks = runs["single"], runs["ddp"]
    r0, r1 = ranks
    assert (r0["world_size"], r1["world_size"], single["world_size"]) == (2, 2, 1)
    assert r0["optimizer"] == r1["optimizer"] == "DistributedDPOptimizer"
    # every rank (and the one-process run) draws the same canaries
    assert r0["participations"] == r1["participations"] == single["participations"]
    assert r0["steps"] == r1["steps"] == single["steps"] == 18
    # the canaries' rate is the accountant's, the global one (one example's chance per step)
    rate = single["accountant_history"][0][1]
    for r in ranks:
        assert r["accountant_history"] == single["accountant_history"]
        assert r["canary_rate"] == pytest.approx(rate) == pytest.approx(1 / 9)
    parts = np.asarray(r0["participations"])
    trials = parts.size * r0["steps"]
    z = (parts.sum() - trials * rate) / math.sqrt(trials * rate * (1 - rate))
    assert abs(z) < 4, f"participations {parts.sum()} of {trials} at rate {rate}: z = {z:.2f}"
    # each canary enters the global clipped sum once, with one example's weight C c_j, and the
    # global gradient divides by the one-process expected batch (31.5 per rank x 2 = 63)
    for r in (*ranks, single):
        probe = r["probe"]
        assert probe["joined"] > 10
        assert probe["weight"] == pytest.approx(1.0, abs=1e-4)
        assert probe["residual"] < 1e-4
        assert probe["global_expected_batch"] == pytest.approx(single["expected_batch_size"]) == 63
    assert (r0["inserts"], r1["inserts"]) == (True, False)  # rank 0 alone adds them
    # the same model: both ranks, and the one-process run up to float rounding
    theta0, theta1, theta = (np.asarray(x["theta"]) for x in (r0, r1, single))
    np.testing.assert_array_equal(theta0, theta1)
    np.testing.assert_allclose(theta0, theta, atol=1e-4)
    # the estimates: equal on both ranks, inside the one-process run's intervals (and equal)
    assert r0["estimates"] == r1["estimates"]
    for name in ("epsilon_final_model", "epsilon_all_iterates"):
        ours, ref = r0["estimates"][name], single["estimates"][name]
        assert ref["lower"] <= ours["value"] <= ref["upper"], (name, ours, ref)
        assert ours["value"] == pytest.approx(ref["value"], rel=1e-3, abs=1e-3)
    # the analytic epsilon: the one-process accountant's
    assert r0["epsilon_analytic"] == pytest.approx(single["accountant_epsilon"], rel=1e-9)
    assert r1["epsilon_analytic"] == pytest.approx(single["accountant_epsilon"], rel=1e-9)


@needs_ddp
def test_ddp_summary_is_written_once_by_rank_zero(runs: dict[str, Any]) -> None:
    r0, r1 = runs["ddp"]
    out = runs["base"] / "ddp"
    assert r1["summary_path"] is None
    summaries = sorted(out.rglob("audit_summary.json"))
    assert [str(p) for p in summaries] == [r0["summary_path"]]
    summary = json.loads(summaries[0].read_text())
    assert summary["inputs"]["steps"] == 18
    assert summary["inputs"]["sample_rate"] == pytest.approx(1 / 9)
    # rank 0 put the canaries among its per-example gradients, before Opacus' clipping; the
    # custom shared sampler is not Opacus' Poisson one, so the audit drew them (the same on every rank)
    assert summary["inputs"]["canary_insertion"] == "before clipping"
    assert summary["inputs"]["canary_sampling"].startswith("drawn by the audit at the accountant's rate: data-parallel")
    assert summary["epsilon_analytic"] == pytest.approx(runs["single"]["accountant_epsilon"])
    est = summary["estimates"]["epsilon_final_model"]
    assert est["status"] == "ok" and est["value"] == pytest.approx(r0["estimates"]["epsilon_final_model"]["value"])


@needs_ddp
def test_ddp_with_a_one_process_dp_optimizer_per_rank_is_refused(runs: dict[str, Any]) -> None:
    rc, output = runs["plain"]
    assert rc != 0
    assert "one-process Opacus DPOptimizer" in output
    assert "DifferentiallyPrivateDistributedDataParallel" in output


def _dp_optimizer() -> Any:
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    net = nn.Linear(3, 2)
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8)), batch_size=4)
    _, opt, _ = PrivacyEngine().make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                                             data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
    return opt


def test_one_process_dp_optimizer_with_world_size_two_is_refused() -> None:
    opt = _dp_optimizer()
    assert canary_placement(opt, 1) == (True, 1.0)
    with pytest.raises(RuntimeError, match="world_size|2 processes") as info:
        GradientCanaryInjector(opt, CanarySet(0, 8, 4), 4, 0.5, world_size=2)
    assert "DPDDP" in str(info.value)
    assert "add_noise" not in opt.__dict__  # nothing was installed


def test_dp_fedavg_under_ddp_is_refused_at_construction() -> None:
    def warn(key: str, message: str) -> None:
        return None

    with pytest.raises(RuntimeError, match=r"world_size=2.*devices=1"):
        FedAvgBackend(SimpleNamespace(), SimpleNamespace(world_size=2), warn)


def test_dp_fedavg_under_a_ddp_trainer_is_refused_at_fit_start(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from audit_callbacks.callbacks import CanaryAudit
    from tests._federated import digits_dpfedavg

    _, module = digits_dpfedavg(rounds_per_epoch=2)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         default_root_dir=str(tmp_path))  # constructing launches nothing
    assert trainer.world_size == 2
    with pytest.raises(RuntimeError, match="DP-FedAvg runs every client"):
        CanaryAudit(num_canaries=4).setup(trainer, module, "fit")
