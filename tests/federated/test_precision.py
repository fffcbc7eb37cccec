"""DP-FedAvg and its canary audit under the Trainer's precision settings.

DP-FedAvg releases a round inside ``training_step``, so under ``precision="bf16-mixed"`` the
audit ran inside Lightning's autocast region: the canary transform's matmuls came back in
bfloat16 and the gather into its float32 buffer raised, stopping a training that runs without
the audit. Under ``"64-true"`` / ``"bf16-true"`` the clients' examples kept the data's float32
against the model's dtype and the module itself raised.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canary.vectors import CanarySet, fwht
from audit_callbacks.federated import DPFedAvg
from tests._federated import quick_trainer, tiny_federation


def _fit(precision: str, tmp_path, audited: bool = True):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    module = DPFedAvg(net, clients_per_round=8, noise_multiplier=1.0, clip_norm=0.5, local_lr=0.1, seed=0,
                      reproducible_noise=True)  # a test: the same noise every run (a verdict, not a rate)
    audit = CanaryAudit(num_canaries=16, seed=1, log_figures=False, log_histograms=False) if audited else None
    trainer = quick_trainer(6, [audit] if audit else [], precision=precision, default_root_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=tiny_federation(p=20, n_clients=40))
    return trainer, module, audit


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_fedavg_audit_runs_under_the_trainers_precision(precision, tmp_path):
    trainer, module, audit = _fit(precision, tmp_path)
    assert trainer.global_step == 6 and module.round == 6
    summary = audit.auditor.last_summary
    assert summary is not None and audit.disabled_reason is None
    reference = _fit("32-true", tmp_path / "ref")[2].auditor.last_summary
    # the claim depends on the rounds and the canaries' participations only
    assert summary["epsilon_analytic"] == pytest.approx(reference["epsilon_analytic"], rel=1e-12)
    assert summary["verdict_mechanism"] != "violation"


def test_fedavg_runs_on_a_bfloat16_model(tmp_path):
    trainer, module, _ = _fit("bf16-true", tmp_path, audited=False)
    assert module.round == 6 and next(module.parameters()).dtype == torch.bfloat16


def test_transform_and_canary_dots_stay_float32_under_autocast():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 12, generator=g)
    exact = fwht(x)
    cs = CanarySet(1, 3000, 32, kind="hadamard")
    v = torch.randn(3000, generator=g)
    dots = cs.dots(v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = fwht(x)
        dots_inside = cs.dots(v)
    assert inside.dtype == torch.float32 and dots_inside.dtype == dots.dtype
    # float32 rounding, not bfloat16's (~4e-3 relative)
    assert torch.allclose(inside, exact, rtol=0, atol=1e-5 * float(exact.abs().max()))
    assert torch.allclose(dots_inside, dots, rtol=0, atol=1e-5 * float(dots.abs().max()))
