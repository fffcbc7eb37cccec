"""OpacusCanaryAudit on a plain loop: the claim is the script's own ``get_epsilon(delta)`` at
the script's delta (Opacus keeps none: ``make_private_with_epsilon`` drops ``target_delta``),
the default is warned once and recorded, and the warnings about the loader and the canaries'
share name this front end and say what follows."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.plain import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|secure RNG).*")


def _digits(n):
    x, y = load_digits(return_X_y=True)
    return TensorDataset(torch.tensor(x[:n] / 16, dtype=torch.float32), torch.tensor(y[:n]))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))  # d = 2410


def _epoch(model, opt, loader):
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def _messages(record, text):
    return [str(w.message) for w in record if text in str(w.message)]


def test_the_claim_is_the_scripts_get_epsilon_at_its_delta(tmp_path):
    _check_claim(tmp_path, with_epsilon=False)


@pytest.mark.slow  # make_private_with_epsilon's search: ~2 s
def test_the_claim_after_make_private_with_epsilon_is_at_its_target(tmp_path):
    _check_claim(tmp_path, with_epsilon=True)


def _check_claim(tmp_path, *, with_epsilon):
    engine = PrivacyEngine(accountant="rdp")
    model = _model()
    common = {"module": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.5),
              "data_loader": DataLoader(_digits(600), batch_size=60), "max_grad_norm": 1.0}
    if with_epsilon:  # Opacus calibrates the noise to (3, 8e-5) and keeps neither number
        model, opt, loader = engine.make_private_with_epsilon(
            **common, target_epsilon=3.0, target_delta=8e-5, epochs=2)
    else:
        model, opt, loader = engine.make_private(**common, noise_multiplier=1.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=40, delta=8e-5,
                                  bootstrap=0, log_figures=False)
        for _ in range(2):
            _epoch(model, opt, loader)
        report = audit.report()
        path = audit.write(tmp_path)
    assert not _messages(record, "no delta given")
    claim = engine.get_epsilon(8e-5)
    assert report.delta == 8e-5 and report.epsilon_analytic == pytest.approx(claim, rel=1e-9)
    if with_epsilon:
        assert claim == pytest.approx(3.0, abs=0.05)  # make_private_with_epsilon's target
    assert abs(engine.get_epsilon(1e-5) - claim) > 0.1  # another delta, another epsilon
    for _, sentence in report.verdicts().values():
        assert "at delta = 8e-05" in sentence
    summary = json.loads(open(path, encoding="utf-8").read())
    assert summary[names.EPSILON_ANALYTIC] == pytest.approx(claim, rel=1e-9)
    assert summary["inputs"]["delta"] == 8e-5 and summary["inputs"][names.DELTA_SOURCE] == "argument"
    assert "at delta = 8e-05" in summary["verdict_all_iterates_sentence"]
    audit.detach()


def test_the_default_delta_is_warned_once_with_the_fix(tmp_path):
    engine = PrivacyEngine(accountant="rdp")
    model = _model()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(_digits(400), batch_size=40), noise_multiplier=1.0, max_grad_norm=1.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=20, bootstrap=0,
                                  every_n_steps=5, log_dir=tmp_path, log_figures=False)
        for _ in range(2):
            _epoch(model, opt, loader)
        report = audit.report()
        path = audit.write()
    said = _messages(record, "no delta given")
    assert len(said) == 1, said
    assert said[0].startswith("OpacusCanaryAudit: ") and "default delta = 1e-05" in said[0]
    assert "OpacusCanaryAudit(..., delta=...)" in said[0] and "get_epsilon(delta)" in said[0]
    assert report.epsilon_analytic == pytest.approx(engine.get_epsilon(1e-5), rel=1e-9)
    summary = json.loads(open(path, encoding="utf-8").read())
    assert summary["inputs"][names.DELTA_SOURCE] == "default" and summary["inputs"]["delta"] == 1e-5
    audit.detach()


def _audit_on(n, k, *, poisson=True):
    model = _model()
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(_digits(n), batch_size=20), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=poisson)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=k, delta=1e-5, bootstrap=0)
        _epoch(model, opt, loader)
    audit.detach()
    return [str(w.message) for w in record]


def test_canaries_outnumbering_the_data_warn_with_the_fix():
    said = [m for m in _audit_on(200, 250) if "of every step's examples are canaries" in m]
    assert len(said) == 1
    # k / (N + k) = 250 / 450 = 56%; under 10%: k q / (N q + k q) < 0.1, i.e. k <= 22
    assert said[0].startswith("OpacusCanaryAudit: 250 canaries outnumber the 200 training examples")
    assert "about 56%" in said[0] and "num_canaries=22 or fewer" in said[0]
    # a small share (10 / 210 = 4.8%): no warning
    assert not [m for m in _audit_on(200, 10) if "examples are canaries" in m]


def test_the_sampling_warning_names_this_front_end_and_what_follows():
    said = [m for m in _audit_on(200, 10, poisson=False) if "drawn by the audit" in m]
    assert len(said) == 1
    assert said[0].startswith("OpacusCanaryAudit: canaries are drawn by the audit")
    assert "cannot catch a sampling bug in this loader" in said[0]
    assert "poisson_sampling=True to make_private" in said[0]
