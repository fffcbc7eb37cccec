"""``benchmarks/ops_per_step.py`` at tiny sizes: the op counter counts what it should, and one
plain-loop pass over the 6- and 48-tensor MLPs writes its JSON with the budget's check."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import _common, ops_per_step

pytestmark = pytest.mark.filterwarnings("ignore")


def test_count_ops_tells_top_level_from_nested_ops():
    x = torch.ones(4)
    counts = ops_per_step.count_ops(lambda: (x.add_(1), torch.stack([x, x]).sum()))
    # add_, stack, sum at the top; stack's own cat (and views) nested
    assert counts["top"] == 3 and counts["all"] > 3
    assert counts["kernels"] is None and counts["audit_top"] == counts["audit_all"] == 0


def test_a_quick_plain_pass_writes_the_budget_check(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "RESULTS_DIR", tmp_path)
    payload = ops_per_step.main(["--quick", "--models", "mlp6,mlp48", "--front-ends", "plain", "--steps", "2",
                                 "--output", "ops.json"])
    saved = json.loads((tmp_path / "ops.json").read_text())
    assert saved["benchmark"] == "ops_per_step" and len(saved["results"]) == 2
    by = {r["model"]: r for r in payload["results"]}
    assert by["mlp6"]["tensors"] == 6 and by["mlp48"]["tensors"] == 48
    for r in by.values():
        assert r["added"]["top"] > 0 and r["ops"]["audited"]["top"] > r["ops"]["baseline"]["top"]
        assert r["time"]["steps"] == 2 and "added_ms" in r["time"]
        assert ("cpu_time" in r) == (payload["device"] == "cpu")
    check = saved["budget_check"]["plain_top"]
    assert check["added_at_48_tensors"] == by["mlp48"]["added"]["top"]
    assert check["holds"] is (check["added_at_48_tensors"] <= 300 and check["per_tensor"] <= 4)


def test_unknown_models_are_refused():
    with pytest.raises(ValueError, match="--models"):
        ops_per_step.main(["--quick", "--models", "resnet"])
