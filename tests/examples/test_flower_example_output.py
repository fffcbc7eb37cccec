"""examples/flower_canary_audit.py without a simulation: the printed table shows the summary's
numbers with their status, and a client's reply carries no training loss (the end-to-end run is
tests/examples/test_flower_example.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("flower_canary_audit_output",
                                                  ROOT / "examples" / "flower_canary_audit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_estimate_with_a_caveat_is_printed_with_its_status(example):
    """The run of the end-to-end test (3 rounds, k = 19 canaries took part) printed "-" for
    every estimate and bound although the summary held 4.521, 0.0198, 14.86 and 1.38, each
    with the status "too few canaries (k = 19)"."""
    caveat = {"value": 4.521, "lower": 3.2, "upper": 6.0, "status": "too few canaries (k = 19)"}
    line = example.estimate_row("final model (equal-variance fit)", caveat)
    assert "4.521" in line and "[3.2, 6]" in line and line.endswith("(too few canaries (k = 19))")
    ok = example.estimate_row("all iterates", {"value": 1.25, "lower": None, "upper": None, "status": "ok"})
    assert "1.250" in ok and "(" not in ok
    skipped = example.estimate_row("(parametric)", {"status": "skipped: rejected: goodness-of-fit p = 0.001"})
    assert " - " in skipped and skipped.endswith("(skipped: rejected: goodness-of-fit p = 0.001)")
    assert example.estimate_row("missing", None).endswith("(not in the summary)")


def test_a_clients_reply_holds_the_model_and_its_weight_only(example):
    """No ``train_loss`` (an un-noised statistic of the client's data) in what Flower
    aggregates and prints every round; ``num-examples`` 1 stays (DP-FedAvg's equal weights)."""
    from flwr.app import ArrayRecord

    torch.manual_seed(0)
    start = ArrayRecord(example.make_model().state_dict())
    x, y = torch.randn(12, 64), torch.randint(0, 10, (12,))
    reply = example.client_reply(start, x, y, lr=0.1, epochs=1)
    assert set(reply.metric_records) == {"metrics"} and dict(reply["metrics"]) == {"num-examples": 1}
    assert set(reply.array_records) == {"arrays"}
    new = reply["arrays"].to_torch_state_dict()
    assert set(new) == set(start.to_torch_state_dict())
    assert any(not torch.equal(new[k], v) for k, v in start.to_torch_state_dict().items())  # it trained
