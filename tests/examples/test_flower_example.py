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
    # no client's un-noised training loss in what Flower aggregates and prints each round
    assert "train_loss" not in out.stdout + out.stderr
    # every estimate the summary holds is printed, with its status where that is not "ok" (at
    # these settings about 19 canaries take part: "too few canaries (k = 19)")
    printed = 0
    for key in ("epsilon_final_model", "epsilon_lower_bound_final_model", "epsilon_all_iterates",
                "epsilon_lower_bound_all_iterates", "epsilon_gdp_lower_bound_final_model",
                "epsilon_gdp_lower_bound_all_iterates"):
        entry = summary["results"].get(key) or {}
        if entry.get("value") is None:
            continue
        lines = [line for line in out.stdout.splitlines() if f"{entry['value']:>10.3f}" in line]
        assert lines, (key, entry, out.stdout[-3000:])
        assert entry["status"] == "ok" or lines[0].endswith(f"({entry['status']})"), (key, lines)
        printed += 1
    assert printed >= 4
