"""``--accelerator {auto,cpu,gpu}`` of the examples and the benchmarks (issue 28, item 4).

The shared helper (``examples/_cli.py``) resolves ``auto`` to the GPU exactly when torch sees
CUDA, refuses ``gpu`` without CUDA with a ValueError naming the argument, and every example and
every benchmark that builds a Trainer takes the flag; no script hard-codes the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cli() -> Any:
    return _load(EXAMPLES / "_cli.py", "examples_cli_under_test")


@pytest.mark.parametrize("cuda, expected", [(False, "cpu"), (True, "gpu")])
def test_auto_picks_the_gpu_exactly_when_torch_sees_cuda(cli, monkeypatch, cuda, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert cli.resolve_accelerator("auto") == expected
    assert cli.trainer_kwargs("auto") == {"accelerator": expected, "devices": 1}
    assert cli.torch_device("auto").type == ("cuda" if cuda else "cpu")
    assert cli.resolve_accelerator("cpu") == "cpu"  # cpu is always the CPU


def test_gpu_without_cuda_and_unknown_names_raise_value_error(cli, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="accelerator"):
        cli.resolve_accelerator("gpu")
    with pytest.raises(ValueError, match="accelerator"):
        cli.trainer_kwargs("gpu")
    for bad in ("tpu", "cuda", "", "CPU"):
        with pytest.raises(ValueError, match="accelerator"):
            cli.resolve_accelerator(bad)


def test_on_this_machine_auto_runs_where_torch_can():
    from_cli = _load(EXAMPLES / "_cli.py", "examples_cli_here")
    assert from_cli.resolve_accelerator("auto") == ("gpu" if torch.cuda.is_available() else "cpu")


EXAMPLE_FILES = ["federated_canary_audit.py", "dpsgd_label_audit.py", "ldp_audit.py", "srr_vs_two_point.py"]


@pytest.mark.parametrize("filename", EXAMPLE_FILES)
def test_every_example_takes_the_flag_with_default_auto(filename):
    module = _load(EXAMPLES / filename, f"example_{filename[:-3]}_flag")
    assert module.parse_args([]).accelerator == "auto"
    assert module.parse_args(["--accelerator", "cpu"]).accelerator == "cpu"
    with pytest.raises(SystemExit):  # argparse: not a choice
        module.parse_args(["--accelerator", "tpu"])


def test_no_example_or_benchmark_hard_codes_the_cpu():
    """Outside the tests, a Trainer's accelerator comes from --accelerator (the helper)."""
    pattern = re.compile(r"accelerator\s*=\s*['\"]cpu['\"]")
    offenders = [str(p.relative_to(ROOT)) for folder in (EXAMPLES, BENCHMARKS) for p in sorted(folder.glob("*.py"))
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
    trainers = [p.name for folder in (EXAMPLES, BENCHMARKS) for p in sorted(folder.glob("*.py"))
                if "pl.Trainer(" in p.read_text(encoding="utf-8")]
    assert trainers, "no script builds a Trainer?"
    for name in trainers:
        text = ((EXAMPLES if (EXAMPLES / name).exists() else BENCHMARKS) / name).read_text(encoding="utf-8")
        if "__main__" not in text:  # a case module: its Trainer takes the driver's flag
            assert "trainer_kwargs(accelerator)" in text, f"{name} builds a Trainer without the flag"
            continue
        assert "add_accelerator_argument" in text, f"{name} builds a Trainer without --accelerator"
    driver = (BENCHMARKS / "planted_bugs.py").read_text(encoding="utf-8")
    assert "add_accelerator_argument" in driver and "args.accelerator" in driver


def test_benchmark_parsers_take_the_flag_and_the_federated_scenario_runs_100_rounds():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        overhead = _load(BENCHMARKS / "canary_overhead.py", "canary_overhead_flag")
    finally:
        sys.path.remove(str(BENCHMARKS))
    args = overhead.parse_args([])
    assert args.accelerator == "auto"
    assert args.fed_rounds >= 100  # issue 28: the realistic federated scenario at >= 100 rounds
    assert args.fed_kinds == ["hadamard"]
    assert overhead.parse_args(["--fed-kinds", "hadamard,gaussian"]).fed_kinds == ["hadamard", "gaussian"]
    with pytest.raises(SystemExit):
        overhead.parse_args(["--fed-kinds", "bogus"])


def test_demo_runs_on_the_cpu_with_the_flag(tmp_path, monkeypatch):
    """A tiny run of make demo's script with --accelerator cpu, and with auto when torch sees
    no CUDA: the Trainer gets accelerator='cpu' and devices=1, and the audit writes its summary."""
    import lightning.pytorch as pl

    seen: list[dict[str, Any]] = []
    real = pl.Trainer

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append({k: kwargs.get(k) for k in ("accelerator", "devices")})
            super().__init__(*args, **kwargs)

    demo = _load(EXAMPLES / "federated_canary_audit.py", "example_demo_flag")
    monkeypatch.setattr(demo.pl, "Trainer", Recording)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    small = ["--rounds", "3", "--rounds-per-epoch", "3", "--clients", "40", "--clients-per-round", "8",
             "--canaries", "20", "--model", "mlp"]
    for i, flag in enumerate(("cpu", "auto")):
        summary = demo.main([*small, "--log-dir", str(tmp_path / str(i)), "--accelerator", flag])
        assert summary["num_canaries_participated"] >= 1
        paths = list((tmp_path / str(i)).rglob("audit_summary.json"))
        assert len(paths) == 1 and "estimates" in json.loads(paths[0].read_text())
    assert seen == [{"accelerator": "cpu", "devices": 1}] * 2


def test_gpu_flag_without_cuda_stops_the_demo_before_training(tmp_path, monkeypatch):
    demo = _load(EXAMPLES / "federated_canary_audit.py", "example_demo_gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="accelerator"):
        demo.main(["--rounds", "2", "--clients", "40", "--log-dir", str(tmp_path), "--accelerator", "gpu"])
    assert not any(tmp_path.rglob("audit_summary.json"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
