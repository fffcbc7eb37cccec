"""Every example takes ``--help`` and ``--quick`` (README: "each takes `--help`, `--quick`")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_are_found():
    assert "federated_canary_audit.py" in FILES and "flower_canary_audit.py" in FILES


@pytest.mark.parametrize("filename", FILES)
def test_every_example_takes_help_and_quick(filename, capsys):
    module = _load(EXAMPLES / filename, f"example_{filename[:-3]}_quick")
    assert module.parse_args([]).quick is False
    assert module.parse_args(["--quick"]).quick is True
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_quick_shortens_the_federated_demo():
    module = _load(EXAMPLES / "federated_canary_audit.py", "example_federated_quick_rounds")
    assert module.parse_args([]).rounds == 50
    assert module.parse_args(["--quick"]).rounds == 10
    assert module.parse_args(["--quick", "--rounds", "5"]).rounds == 5


def test_the_federated_demo_prints_a_number_under_too_few_canaries(tmp_path, capsys):
    """A summary number with a caveat ("too few canaries (k = 12)") is printed with it, not as
    '-' (the summary, the report and the log line hold it)."""
    import json
    import warnings

    module = _load(EXAMPLES / "federated_canary_audit.py", "example_federated_few_canaries")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module.main(["--quick", "--rounds", "4", "--canaries", "12", "--clients", "60",
                     "--clients-per-round", "20", "--log-dir", str(tmp_path)])
    out = capsys.readouterr().out
    (path,) = list(tmp_path.rglob("audit_summary.json"))
    entry = json.loads(path.read_text())["results"]["epsilon_all_iterates"]
    assert entry["status"].startswith("too few canaries") and entry["value"] is not None
    line = next(ln for ln in out.splitlines() if "the number to read" in ln)
    assert f"{entry['value']:.3f}" in line and f"({entry['status']})" in line, line
