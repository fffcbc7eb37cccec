"""``report()`` behaves the same on every front end (``CanaryAudit``, ``OpacusCanaryAudit``,
``CanaryStrategy``): it raises the typed ``NoEstimateYet`` (with the reason) until there is an
estimate, so ``audit.report().value("epsilon_all_iterates")`` either reads a number or says
why there is none; ``compute()`` returns None instead."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.auditing import CanaryReport, NoEstimateYet
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.plain import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|secure RNG|replayable).*")


def test_lightning_front_end_before_the_training():
    audit = CanaryAudit(10, 10)
    with pytest.raises(NoEstimateYet, match="CanaryAudit: the training has not started") as err:
        audit.report().value(names.EPSILON_ALL_ITERATES)
    assert "has not started" in err.value.reason
    assert audit.compute() is None and audit.last_report is None


def test_plain_front_end_before_two_canaries_took_part():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=16), noise_multiplier=1.0, max_grad_norm=1.0)
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=4, delta=1e-5)
    with pytest.raises(NoEstimateYet, match="OpacusCanaryAudit: fewer than 2 canaries have taken part"):
        audit.report().value(names.EPSILON_ALL_ITERATES)
    assert audit.compute() is None
    with pytest.raises(ValueError, match="bootstrap"):
        audit.report(bootstrap=-1)
    audit.detach()


def test_flower_front_end_before_and_after_the_rounds(tmp_path, caplog):
    pytest.importorskip("flwr")
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from audit_callbacks.flower import CanaryStrategy
    from tests.flower.test_flower import _run

    inner = DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=0.5), 1.0, 1.0, 10)
    strategy = CanaryStrategy(inner, num_canaries=10, log_dir=None)
    with pytest.raises(NoEstimateYet, match="CanaryStrategy: the training has not started"):
        strategy.report()
    assert strategy.compute() is None
    # after the rounds: a report, at the default delta (warned once, recorded as the default)
    with caplog.at_level(logging.WARNING):
        strategy, _, _ = _run(tmp_path / "default", rounds=3, bootstrap=0)
    report = strategy.report()
    assert isinstance(report, CanaryReport) and report.delta == 1e-6
    said = [r.getMessage() for r in caplog.records if "no delta given" in r.getMessage()]
    assert len(said) == 1 and "default delta = 1e-06" in said[0]
    summary = json.loads((tmp_path / "default" / "version_0" / "audit_summary.json").read_text())
    assert summary["inputs"][names.DELTA_SOURCE] == "default"
    assert "at delta = 1e-06" in summary["verdict_all_iterates_sentence"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        given, _, _ = _run(tmp_path / "given", rounds=3, bootstrap=0, delta=1e-5)
    assert not [r for r in caplog.records if "no delta given" in r.getMessage()]
    assert given.report().delta == 1e-5
    summary = json.loads((tmp_path / "given" / "version_0" / "audit_summary.json").read_text())
    assert summary["inputs"][names.DELTA_SOURCE] == "argument"


_BAD_NAMES = [3, "", "../escaped.json", "sub/../../escaped.json", "/tmp/escaped.json", "."]


@pytest.mark.parametrize("bad", _BAD_NAMES)
def test_every_front_end_refuses_a_summary_filename_outside_the_run_folder_at_construction(bad):
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
    from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
    from audit_callbacks.flower import CanaryStrategy

    inner = DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=0.5), 1.0, 1.0, 10)
    makers = [lambda n: CanaryAudit(10, summary_filename=n), lambda n: LabelDPLowerBound(summary_filename=n),
              lambda n: LabelReconstructionAttack(summary_filename=n),
              lambda n: FederatedLabelAttack(summary_filename=n),
              lambda n: CanaryStrategy(inner, num_canaries=10, log_dir=None, summary_filename=n)]
    for make in makers:
        with pytest.raises(ValueError, match="summary_filename"):
            make(bad)
    # a name in a subfolder of the run folder is fine; the label audits may write none
    assert CanaryAudit(10, summary_filename="audits/a.json").summary_filename == "audits/a.json"
    assert LabelDPLowerBound(summary_filename=None).summary_filename is None
    with pytest.raises(ValueError, match="summary_filename"):
        CanaryAudit(10, summary_filename=None)  # a canary audit always writes its summary
    bound = LabelDPLowerBound()
    with pytest.raises(ValueError, match="summary_filename"):
        bound.summary_filename = bad  # set later: refused then, not at the fit's end
    assert bound.summary_filename == "label_dp_summary.json"
