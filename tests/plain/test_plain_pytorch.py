"""``OpacusCanaryAudit``: the canary audit of plain-PyTorch Opacus loops.

The port of Opacus' ``examples/mnist.py`` (``tests/fixtures/opacus_mnist.py``) audits with the
lines marked ``# audit`` and nothing else; its analytic epsilon is the example's accountant's.
"""

import json
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.plain import NoEstimateYet
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|secure RNG|Optimal order|pin_memory|fewer than 2 canaries).*")

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "opacus_mnist.py")
MARK = "# audit"


def test_the_mnist_port_audits(tmp_path, monkeypatch):
    from tests.fixtures.opacus_mnist import main

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    _, privacy_engine = main(["--device", "cpu", "-n", "2", "--test-batch-size", "256"])
    with open(tmp_path / "runs" / "audit" / "audit_summary.json", encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["callback"] == "OpacusCanaryAudit" and summary["inputs"]["steps"] == 46
    values = {k: v["value"] for k, v in summary["estimates"].items() if v.get("value") is not None}
    assert {"epsilon_final_model", "epsilon_lower_bound_all_iterates"} <= set(values)
    assert all(math.isfinite(v) for v in values.values())
    # the analytic epsilon is the example's own accountant's (the epsilon it prints)
    eps = privacy_engine.get_epsilon(1e-5)
    assert summary["epsilon_analytic"] == pytest.approx(eps)
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "runs" / "audit"))


def test_the_port_differs_from_opacus_only_by_few_audit_lines(tmp_path, monkeypatch):
    with open(FIXTURE, encoding="utf-8") as fh:
        lines = fh.read().splitlines(keepends=True)
    marked = [line for line in lines if line.rstrip().endswith(MARK)]
    assert 1 <= len(marked) <= 5
    plain = "".join(line for line in lines if not line.rstrip().endswith(MARK))
    code = plain.split('"""', 2)[2]  # below the module docstring
    assert "audit" not in code.lower()
    # without its audit lines the port is Opacus' example, and runs
    namespace = {"__name__": "opacus_mnist_plain"}
    exec(compile(plain, "opacus_mnist_plain.py", "exec"), namespace)
    assert {"SampleConvNet", "train", "test", "main"} <= set(namespace)
    monkeypatch.chdir(tmp_path)
    results, engine = namespace["main"](["--device", "cpu", "-n", "1", "--test-batch-size", "256"])
    assert len(results) == 1 and engine.get_epsilon(1e-5) > 0


def _loop(seed=0, *, n=256, batch=32):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=batch), noise_multiplier=1.0, max_grad_norm=1.0)
    return model, opt, loader, engine


def _epoch(model, opt, loader):
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_api_report_write_state_and_detach(tmp_path):
    model, opt, loader, engine = _loop()
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=50, bootstrap=0,
                              every_n_steps=4, log_dir=tmp_path / "tb")
    with pytest.raises(NoEstimateYet, match="OpacusCanaryAudit: fewer than 2 canaries"):
        audit.report()  # the same on every front end (tests/auditing/test_front_ends.py)
    assert audit.compute() is None and audit.steps == 0
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps the wrapped step again
    for _ in range(2):
        _epoch(model, opt, loader)
        sched.step()
    steps = sum(h[2] for h in engine.accountant.history)
    assert audit.steps == steps > 0
    report = audit.report()
    assert report is not None and report.progress == steps
    assert math.isfinite(report.estimates["epsilon_final_model"].value)
    assert report.epsilon_analytic == pytest.approx(engine.get_epsilon(1e-5))
    report_path = audit.write(tmp_path / "out")
    assert report_path == str(tmp_path / "out" / "audit_report.html") and os.path.exists(report_path)
    path = audit.summary_path
    assert path == str(tmp_path / "out" / "audit_summary.json") and os.path.exists(path)
    assert any(f.startswith("events") for f in os.listdir(tmp_path / "tb"))  # every_n_steps

    # resume: a new optimizer and accountant go on from the state, history included
    inputs = json.load(open(path))["inputs"]  # the loader's own Poisson sampler drew the canaries
    assert inputs["canary_insertion"] == "before clipping"
    assert inputs["canary_sampling"] == "training loader (Opacus UniformWithReplacementSampler)"
    assert inputs["loader_batches_drawn"] == steps and inputs["canary_draws_by_audit"] == 0
    state = audit.state_dict()
    audit.detach()
    audit.detach()  # idempotent
    assert "add_noise" not in opt.__dict__ and "clip_and_accumulate" not in opt.__dict__
    assert type(loader.batch_sampler).__name__ == "UniformWithReplacementSampler"
    assert loader.batch_sampler.num_samples == 256
    model2, opt2, loader2, engine2 = _loop()
    model2.load_state_dict(model.state_dict())
    resumed = OpacusCanaryAudit(opt2, data_loader=loader2, num_canaries=50, bootstrap=0)
    with pytest.warns(UserWarning, match="earlier steps were put back"):
        resumed.load_state_dict(state)
    assert resumed.steps == steps
    _epoch(model2, opt2, loader2)
    assert resumed.steps == sum(h[2] for h in engine2.accountant.history) > steps
    resumed.detach()
    assert "step" not in opt2.__dict__  # the class's step again


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"optimizer": torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=1.0)}, "optimizer"),
    ({"data_loader": object()}, "data_loader"),
    ({"log_dir": 3}, "log_dir"),
    ({"num_canaries": 1}, "num_canaries"),
    ({"every_n_steps": 0}, "every_n_steps"),
    ({"alpha": 2.0}, "alpha"),
    ({"no_such_setting": 1}, "no_such_setting"),
    ({"repeats": 2}, "repeats"),
    ({"summary_filename": 3}, "summary_filename"),
    ({"summary_filename": ""}, "summary_filename"),
    ({"summary_filename": "../escaped.json"}, "summary_filename"),
    ({"summary_filename": "/tmp/escaped.json"}, "summary_filename"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    _, opt, _, _ = _loop()
    kwargs = {"optimizer": opt, "num_canaries": 10, **kwargs}
    with pytest.raises(ValueError, match=name):
        OpacusCanaryAudit(kwargs.pop("optimizer"), **kwargs)


def test_write_without_a_folder_names_log_dir():
    _, opt, _, _ = _loop()
    audit = OpacusCanaryAudit(opt, num_canaries=10)
    with pytest.raises(ValueError, match="log_dir"):
        audit.write()
    audit.detach()



def test_a_log_dir_that_is_a_file_is_refused_and_a_failing_layout_never_stops_the_loop(tmp_path):
    model, opt, loader, _ = _loop()
    afile = tmp_path / "afile"
    afile.write_text("")
    for log_dir in (afile, afile / "below"):
        with pytest.raises(ValueError, match="log_dir"):
            OpacusCanaryAudit(opt, data_loader=loader, num_canaries=10, log_dir=log_dir, every_n_steps=2)
    assert "step" not in opt.__dict__  # refused before it wrapped the optimizer
    # the folder turns into a file after construction: the steps' writes are warned about once
    later = tmp_path / "later"
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=10, log_dir=later, every_n_steps=2)
    assert not later.exists()  # nothing is made at construction
    later.write_text("")
    with pytest.warns(UserWarning, match="TensorBoard / logger write failed") as caught:
        _epoch(model, opt, loader)
    assert audit.steps >= 2
    assert sum("write failed" in str(w.message) for w in caught) == 1
    audit.detach()


def test_two_audits_of_one_process_never_replace_each_others_outputs(tmp_path):
    """Two live audits given one log_dir: the second writes to <log_dir>-1 (warned once); the
    first's summary, report and TensorBoard series stay its own."""
    folder = tmp_path / "two"
    audits = []
    for seed in (0, 1):
        model, opt, loader, _ = _loop(seed)
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=50, bootstrap=0)
        for _ in range(1 + seed):
            _epoch(model, opt, loader)
        audits.append(audit)
    audits[0].write(folder)
    with pytest.warns(UserWarning, match="written by another OpacusCanaryAudit"):
        audits[1].write(folder)
    first, second = audits[0].summary_path, audits[1].summary_path
    assert first == str(folder / "audit_summary.json")
    assert second == str(tmp_path / "two-1" / "audit_summary.json")
    assert json.load(open(first))["inputs"]["steps"] == audits[0].steps < audits[1].steps
    assert json.load(open(second))["inputs"]["steps"] == audits[1].steps
    audits[1].write(folder)  # the same audit again: its own folder, no new warning or name
    assert audits[1].summary_path == second
