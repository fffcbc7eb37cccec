"""The canary audit's valid bounds use the f-DP one-run bound only where a release is a Gaussian
noisy sum: the bound rejects mu-GDP, which says nothing of a mechanism that is not
Gaussian-shaped (randomized response: ``tests/estimators/test_valid_bounds.py``)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.estimators.canary_report import BOUND_METHODS
from audit_callbacks.estimators.valid_bounds import DEFAULT_METHODS
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.mechanisms import LDPSGD
from tests._federated import quick_trainer, tiny_federation


def _fit(noise_multiplier: float, randomizer: object = None) -> CanaryAudit:
    torch.manual_seed(0)
    module = DPFedAvg(nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 3)), clients_per_round=4,
                      noise_multiplier=noise_multiplier,
                      clip_norm=1.0, local_lr=0.1, seed=3, randomizer=randomizer)
    audit = CanaryAudit(num_canaries=6, num_unobserved=6, canaries="hadamard", seed=1,
                        log_figures=False, log_histograms=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quick_trainer(8, [audit]).fit(module, datamodule=tiny_federation())
    return audit


def _methods(audit: CanaryAudit) -> set[tuple[str, ...]]:
    report = audit.auditor.last_report
    assert report is not None
    return {tuple(r.details["methods"]) for name, r in report.estimates.items()
            if r.method == "tightest_valid"}


def test_gaussian_noisy_sum_uses_the_fdp_bound() -> None:
    audit = _fit(noise_multiplier=1.0)
    assert audit.auditor.bound_methods == BOUND_METHODS
    assert _methods(audit) == {BOUND_METHODS}


def test_local_randomizer_uses_the_bounds_valid_for_any_mechanism() -> None:
    audit = _fit(noise_multiplier=0.0, randomizer=LDPSGD(2.0, 1.0))
    assert audit.auditor.bound_methods == DEFAULT_METHODS
    assert _methods(audit) == {DEFAULT_METHODS}
