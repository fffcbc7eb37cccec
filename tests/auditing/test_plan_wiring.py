"""The audit plan wired into the front ends: one information line at fit start (not a
warning), the ``plan_*`` keys of the summary with the ratio read against the plan, and the
report's path given at the end (``audit report: <path>``, also ``report_path``)."""

import json
import os
import warnings

import pytest
import torch

from audit_callbacks import names
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit
from tests._federated import digits_dpfedavg, fit
from tests.plain.test_plain_pytorch import _epoch, _loop

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|Optimal order|pin_memory|fewer than 2 canaries|too few).*")


def test_fedavg_plans_once_at_fit_start_and_reads_the_ratio(tmp_path, monkeypatch):
    dm, module = digits_dpfedavg(4)
    audit = CanaryAudit(30, 30, seed=1)
    lines: list[str] = []  # what Lightning's rank_zero_info is given
    monkeypatch.setattr("audit_callbacks.callbacks.canary_audit.rank_zero_info", lines.append)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(dm, module, [audit], 12, tmp_path)
    plans = [m for m in lines if "CanaryAudit: plan:" in m]
    assert len(plans) == 1 and "can show a valid epsilon of at most" in plans[0]
    assert "weak to no formal privacy guarantee (epsilon > 10) on the scale of Ponomareva" in plans[0]
    assert not any("plan:" in str(w.message) for w in caught)  # information, not a warning
    summary = json.loads(open(audit.summary_path, encoding="utf-8").read())
    assert summary[names.PLAN_STATUS] == "ok"
    assert summary[names.PLAN_SENTENCE] in plans[0]
    assert summary[names.PLAN_RATIO_LOW] < summary[names.PLAN_RATIO_MEDIAN] < summary[names.PLAN_RATIO_HIGH]
    assert summary[names.PLAN_CEILING] > 0 and summary[names.PLAN_COVERAGE] == 0.95
    ratio = summary[names.EPSILON_RATIO_ALL_ITERATES]
    assert summary[names.PLAN_RATIO_READING].startswith(f"{ratio:.2f}: ")
    assert "expected for a correct run" in summary[names.PLAN_RATIO_READING]
    # the report's path, given once, is the file written
    # the terminal's number to read at the end, once, with the ratio's reading
    read = [m for m in lines if m.startswith("CanaryAudit: epsilon_all_iterates = ")]
    assert len(read) == 1 and summary[names.PLAN_RATIO_READING] in read[0]
    said = [m for m in lines if m.startswith("audit report: ")]
    assert said == [f"audit report: {audit.report_path}"] and os.path.exists(audit.report_path)
    page = open(audit.report_path, encoding="utf-8").read()
    assert summary[names.PLAN_RATIO_READING].split(":")[0] in page and "the number to read" in page


def test_plain_loop_plans_from_steps_and_prints_the_report_path(tmp_path, capsys):
    model, opt, loader, engine = _loop()
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=50, bootstrap=0, steps=16)
    err = capsys.readouterr().err
    assert err.count("OpacusCanaryAudit: plan:") == 1
    for _ in range(2):
        _epoch(model, opt, loader)
    audit.write(tmp_path / "out")
    err = capsys.readouterr().err
    assert "plan:" not in err  # once
    assert err.strip().endswith(f"audit report: {audit.report_path}")
    summary = json.loads((tmp_path / "out" / "audit_summary.json").read_text())
    assert summary[names.PLAN_STATUS] == "ok" and summary[names.PLAN_REFERENCE] > 0


def test_plain_loop_without_steps_plans_at_the_first_write(tmp_path, capsys):
    model, opt, loader, engine = _loop()
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=50, bootstrap=0)
    assert "plan:" not in capsys.readouterr().err
    torch.manual_seed(0)
    _epoch(model, opt, loader)
    audit.write(tmp_path / "out")
    assert capsys.readouterr().err.count("plan:") == 1
    assert audit.auditor.plan is not None and audit.auditor.plan_reason == ""


def test_plain_loop_stopped_early_reads_the_ratio_against_the_steps_taken(tmp_path, capsys):
    """Planned for 400 steps, stopped after 16: the ratio is read against a plan at the 16
    taken, whose claim is the run's, and the reading says so; the logged line stays."""
    model, opt, loader, engine = _loop()
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=50, bootstrap=0, steps=400)
    logged = capsys.readouterr().err
    for _ in range(2):
        _epoch(model, opt, loader)
    taken = audit.steps
    assert 1 <= taken < 400
    audit.write(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "audit_summary.json").read_text())
    assert summary[names.PLAN_REFERENCE] == pytest.approx(summary[names.EPSILON_ANALYTIC], rel=1e-9)
    assert audit.auditor.plan.reference_epsilon > 2 * summary[names.EPSILON_ANALYTIC]
    reading = summary[names.PLAN_RATIO_READING]
    assert f"(planned for 400 steps; read against a plan at the {taken} taken)" in reading
    assert audit.auditor.plan.steps == 400  # the fit-start plan is kept
    assert summary[names.PLAN_STEPS] == taken
    assert summary[names.PLAN_SENTENCE] in logged  # the fit-start line, as logged
    page = open(audit.report_path, encoding="utf-8").read()
    assert f"against the plan for {taken} steps" in page and "made at fit start" not in page


def test_fedavg_repeated_fit_plans_again_for_the_rounds_of_both_fits(tmp_path, monkeypatch):
    """A second fit goes on from the rounds taken: planned again at their sum, and the summary
    reads the ratio against a plan at the rounds taken (not the first fit's)."""
    dm, module = digits_dpfedavg(4)
    audit = CanaryAudit(30, 30, seed=1)
    lines: list[str] = []
    monkeypatch.setattr("audit_callbacks.callbacks.canary_audit.rank_zero_info", lines.append)
    fit(dm, module, [audit], 2, tmp_path, name="first")
    first = audit.auditor.plan
    fit(dm, module, [audit], 6, tmp_path, name="second")
    assert int(module.round) == 8
    summary = json.loads(open(audit.summary_path, encoding="utf-8").read())
    assert summary[names.PLAN_REFERENCE] != first.reference_epsilon
    plans = [m for m in lines if "CanaryAudit: plan:" in m]
    assert len(plans) == 2
    assert first.steps == 2 and audit.auditor.plan.steps == 8
    assert summary[names.PLAN_STEPS] == 8
    assert "planned for" not in summary[names.PLAN_RATIO_READING]  # planned at the rounds taken
    assert summary[names.PLAN_SENTENCE] in plans[1]
