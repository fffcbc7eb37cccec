"""A real Flower deployment on localhost: one SuperLink and two SuperNodes as separate
processes (127.0.0.1, free ports, insecure HTTP), a Flower app submitted with ``flwr run``;
its ServerApp runs ``CanaryStrategy`` around FedAvg and the server-side fixed-clipping DP
wrapper for 2 rounds, and the test reads the ``audit_summary.json`` it wrote.

Skipped where flwr is missing or 127.0.0.1 ports cannot be opened. The ClientApp is numpy-only
(softmax regression on a digits shard) so that each round's ClientApp process starts fast.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
ROUNDS, CANARIES = 2, 6


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _can_listen() -> bool:
    try:
        _free_port()
        return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not _can_listen(), reason="cannot open a port on 127.0.0.1"),
    pytest.mark.skipif(not all((BIN / exe).exists() for exe in
                               ("flower-superlink", "flower-supernode", "flwr")),
                       reason="Flower's executables are not next to this Python"),
]

APP = '''
"""Flower app of test_flower_deployment.py."""
import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    data = np.load(str(context.run_config["data-path"]))
    x, y = data[f"x{pid}"], data[f"y{pid}"]
    arrays = msg.content["arrays"]
    w, b = arrays["w"].numpy().copy(), arrays["b"].numpy().copy()
    for _ in range(5):  # softmax regression, full-batch gradient steps
        logits = x @ w.T + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        w -= 0.5 * (p.T @ x) / len(y)
        b -= 0.5 * p.mean(0)
    out = ArrayRecord({"w": Array(w.astype(np.float32)), "b": Array(b.astype(np.float32))})
    return Message(RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from audit_callbacks.flower import CanaryStrategy

    cfg = context.run_config
    k = int(cfg["canaries"])
    fedavg = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=2)
    dp = DifferentialPrivacyServerSideFixedClipping(fedavg, 0.5, 1.0, 2 + k)
    strategy = CanaryStrategy(dp, num_canaries=k, num_unobserved=200, bootstrap=20,
                              log_dir=str(cfg["log-dir"]))
    init = ArrayRecord({"w": Array(np.zeros((10, 64), np.float32)),
                        "b": Array(np.zeros(10, np.float32))})
    strategy.start(grid, init, num_rounds=int(cfg["num-rounds"]))
'''

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "canary-deployment-test"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "auditcallbacks"

[tool.flwr.app.components]
serverapp = "canary_app:server"
clientapp = "canary_app:client"

[tool.flwr.app.config]
num-rounds = {rounds}
canaries = {canaries}
log-dir = "{log_dir}"
data-path = "{data}"
"""


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def test_superlink_and_two_supernodes(tmp_path):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    shards = {}
    for pid in range(2):
        shards[f"x{pid}"] = (x[pid::2] / 16.0).astype(np.float32)
        shards[f"y{pid}"] = y[pid::2].astype(np.int64)
    np.savez(tmp_path / "digits.npz", **shards)
    app, home, out, logs = (tmp_path / d for d in ("app", "home", "out", "logs"))
    for d in (app, home, logs):
        d.mkdir()
    (app / "canary_app.py").write_text(textwrap.dedent(APP))
    (app / "pyproject.toml").write_text(PYPROJECT.format(
        rounds=ROUNDS, canaries=CANARIES, log_dir=out, data=tmp_path / "digits.npz"))
    link = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{link}"\n'
        "insecure = true\n")
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        fh = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp_path, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        superlink = start("superlink", "flower-superlink", "--insecure", "--host", "127.0.0.1",
                          "--port", str(link), "--disable-runtime-dependency-installation")
        _wait_port(link, superlink)
        nodes = []
        for pid in range(2):  # both start at once; then both must listen
            port = _free_port()
            nodes.append((port, start(
                f"supernode{pid}", "flower-supernode", "--insecure", "--superlink",
                f"127.0.0.1:{link}", "--host", "127.0.0.1", "--port", str(port),
                "--node-config", f"partition-id={pid} num-partitions=2")))
        for port, node in nodes:
            _wait_port(port, node)
        run = subprocess.run([str(BIN / "flwr"), "run", str(app), "test", "--stream"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=240)
        summary_path = out / "version_0" / "audit_summary.json"
        detail = (f"flwr run rc={run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}\n"
                  f"superlink:\n{_tail(logs / 'superlink.log')}")
        assert run.returncode == 0 and summary_path.exists(), detail
        summary = json.loads(summary_path.read_text())
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
    assert summary["callback"] == "CanaryStrategy"
    assert summary["inputs"]["num_real_clients"] == 2
    assert summary["inputs"]["num_canaries"] == CANARIES and summary["inputs"]["rounds"] == ROUNDS
    # fraction 1.0: every canary takes part in every round
    assert summary["inputs"]["participations_histogram"] == [0] * ROUNDS + [CANARIES]
    assert set(summary["inputs"]["round_events"]) == {str(r) for r in range(1, ROUNDS + 1)}
    assert all(e.startswith("folded") for e in summary["inputs"]["round_events"].values())
    assert summary["versions"]["flwr"] == "1.41.0"
    assert summary["estimates"]["epsilon_final_model"]["status"] == f"too few canaries (k = {CANARIES})"
    assert list((out / "version_0").glob("events.out.tfevents.*"))
    shutil.rmtree(home, ignore_errors=True)
