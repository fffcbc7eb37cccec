"""examples/flower_canary_audit.py runs a Flower simulation (Ray, 127.0.0.1) end to end and
writes TensorBoard event files and audit_summary.json (a short run: 3 rounds, 100 clients)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def test_example_quick(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "flower_canary_audit.py"), "--quick",
         "--rounds", "3", "--clients", "100", "--canaries", "50", "--clients-per-round", "15",
         "--log-dir", str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Flower DP-FedAvg on digits: 3 rounds, 100 clients + 50 canary clients" in out.stdout
    summary = json.loads((tmp_path / "version_0" / "audit_summary.json").read_text())
    assert summary["inputs"]["num_real_clients"] == 100 and summary["inputs"]["rounds"] == 3
    assert summary["inputs"]["clients_per_round"] == 15
    assert list((tmp_path / "version_0").glob("events.out.tfevents.*"))
