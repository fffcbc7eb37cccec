"""The benchmarks as one package: one runner (``python -m benchmarks NAME [args]``), one harness
(``benchmarks/_common.py``), no ``sys.path`` edits, result files named by what they hold."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as runner
from benchmarks import _common

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_runner_lists_every_benchmark_with_a_main(capsys):
    names = runner.benchmarks()
    assert {"canary_overhead", "gaussian_one_shot", "planted_bugs", "watched_coverage"} <= set(names)
    assert not {"planted_fedavg", "planted_flower", "planted_opacus", "_common", "_planted"} & set(names)
    assert all(names.values())  # each with its docstring's first line
    assert runner.run([]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in names)
    assert runner.run(["no_such_benchmark"]) == 2


def test_a_benchmark_runs_its_main_with_the_arguments(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the runner sets it to the benchmark's command
    with pytest.raises(SystemExit) as exc:  # argparse's --help exits 0 after printing
        runner.run(["watched_coverage", "--help"])
    assert exc.value.code == 0


def test_no_benchmark_edits_sys_path_or_builds_its_own_parser():
    for path in sorted(BENCHMARKS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "sys.path" not in text.replace("no ``sys.path``", ""), path.name
        if path.name != "_common.py":
            assert "ArgumentParser(" not in text, f"{path.name}: use _common.parser"


def test_result_files_are_named_by_what_they_hold():
    names = [p.name for p in (BENCHMARKS / "results").glob("*.json")]
    assert names and not [n for n in names if re.search(r"issue\d", n)]


def test_every_result_file_records_the_machine_and_its_device(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "RESULTS_DIR", tmp_path)
    path = _common.write_json("example.json", {"benchmark": "example", "value": float("nan")})
    payload = json.loads(path.read_text())
    machine = payload["machine"]
    assert {"cpu_count", "versions", "device"} <= set(machine)
    assert {"torch", "numpy"} <= set(machine["versions"])
    assert payload["value"] is None  # non-finite floats are written as null
