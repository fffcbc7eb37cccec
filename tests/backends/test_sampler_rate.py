"""The sampler check reads the real batches against the loader's own Poisson rate (the
accountant's), also where the canaries join at a rate the user gave
(``OpacusCanaryAudit(sample_rate=...)``): before, the real batch sizes were tested against
Binomial(N, the canaries' rate) and a correct Poisson run read ``unproven``."""

from __future__ import annotations

import json
import warnings

import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit


def _run(tmp_path, sample_rate):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=64), noise_multiplier=1.0, max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=20, bootstrap=0,
                                  sample_rate=sample_rate, delta=1e-5, log_dir=tmp_path,
                                  log_figures=False)
        for _ in range(4):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        audit.write()
    with open(audit.summary_path, encoding="utf-8") as fh:
        return json.load(fh)


def test_the_batches_are_read_at_the_loaders_rate_when_the_canaries_rate_is_given(tmp_path):
    summary = _run(tmp_path / "given", sample_rate=0.02)  # the loader's is 1/8
    check = summary["results"][names.BATCH_SIZE_VARIANCE_RATIO]
    assert check["status"] == "ok" and 0.3 < check["value"] < 3.0, check  # about 1: Poisson at 1/8
    assert summary[names.VERDICT_MECHANISM] != "unproven", summary[f"{names.VERDICT_MECHANISM}_sentence"]
