"""The DP-SGD plan's claim is the run's: computed by the run's own claim function (no PRV cost
bound for a PRV run), at the accountant's rate, while the statistic's law is at the canaries'
rate (``docs/methods/planner.md``, "What the plan reads")."""

import json

import pytest
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.backends.opacus import accounting
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|Optimal order|pin_memory|fewer than 2 canaries|too few"
    "|canaries join|replayable|no delta given|drawn by the audit).*")


def _prv_run(n=256, batch=32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    engine = PrivacyEngine(accountant="prv")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=batch), noise_multiplier=1.0, max_grad_norm=1.0)
    return model, opt, loader, engine


def _prv_epsilon(history, delta):
    acc = PRVAccountant()
    acc.history = list(history)
    return float(acc.get_epsilon(delta=delta))


def test_dpsgd_plan_claim_is_the_runs_prv_claim_at_the_accountants_rate(tmp_path, monkeypatch):
    # a PRV grid above the cost bound of the PRV epsilon beside an RDP run (emulated: the bound
    # lowered to 1 point); the run's own PRV claim has no bound, nor may the plan's
    monkeypatch.setitem(accounting.analytic_epsilons.__kwdefaults__, "max_prv_points", 1)
    monkeypatch.setattr(accounting, "PRV_MAX_POINTS", 1)
    model, opt, loader, engine = _prv_run()
    steps, canary_rate, delta = 16, 0.05, 1e-5
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=20, bootstrap=0, steps=steps,
                              sample_rate=canary_rate, delta=delta)
    plan = audit.auditor.plan
    assert plan is not None
    accountant_rate = 1.0 / len(loader)  # make_private's: one batch of the loader
    assert accountant_rate != canary_rate
    expected = _prv_epsilon([(1.0, accountant_rate, steps)], delta)
    assert plan.reference_epsilon == pytest.approx(expected, rel=1e-9)
    assert plan.steps == steps
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert audit.steps == steps
    audit.write(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "audit_summary.json").read_text())
    # the fit-start plan's claim is the run's: read against it, with no note
    assert summary[names.EPSILON_ANALYTIC] == pytest.approx(plan.reference_epsilon, rel=1e-9)
    assert summary[names.PLAN_REFERENCE] == plan.reference_epsilon
    assert "planned" not in (summary[names.PLAN_RATIO_READING] or "")


def test_the_plan_sentence_says_where_the_runs_own_claim_lies_against_the_ceiling() -> None:
    """DP-FedAvg plans at the claim of the median simulated most-sampled canary; the run's own
    claim (its r_max) can lie on the other side of the ceiling (planned 6.97 at or above 6.93,
    the run's 6.27 below): the summary's plan sentence says so beside the fit-start line."""
    import types

    from audit_callbacks.auditing.plan import summary_plan_entries
    from audit_callbacks.estimators import plan_audit

    plan = plan_audit(150, 8000, dim=12_000, steps=10, sample_rate=0.1, noise_multiplier=1.8,
                      delta=1e-6, training="dpfedavg", replicates=20, search_bugs=False,
                      real_per_step=30.0)
    line = "plan: the fit-start line"
    auditor = types.SimpleNamespace(plan=plan, plan_line=line, plan_reason="",
                                    backend=types.SimpleNamespace(progress=lambda: plan.steps))
    below = plan.ceiling * 0.9
    entries = summary_plan_entries(auditor, {names.EPSILON_ANALYTIC: below,
                                             names.EPSILON_RATIO_ALL_ITERATES: 1.0})
    assert entries[names.PLAN_SENTENCE].startswith(line)
    assert f"the run's claim is {below:.3g}, below the ceiling" in entries[names.PLAN_SENTENCE]
    same = summary_plan_entries(auditor, {names.EPSILON_ANALYTIC: plan.reference_epsilon,
                                          names.EPSILON_RATIO_ALL_ITERATES: 1.0})
    assert same[names.PLAN_SENTENCE] == line
