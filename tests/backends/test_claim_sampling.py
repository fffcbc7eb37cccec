"""The audit's claim says which sampling it assumes (summary ``inputs.claim_sampling`` and the
report), read from what the run can see: the training loader's Poisson generator (public when
seeded from a small or logged integer) and DP-FedAvg's cohort mark; where the batches are
known, the unamplified claim (the most-sampled canary's Gaussian mechanism composed over its
steps) stands beside the accountant's amplified one."""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl
import pytest
import torch
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.auditing.html_report import HTML_FILENAME, MARKDOWN_FILENAME
from audit_callbacks.backends.opacus.noise_source import SECRET_BATCHES, batch_source
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.federated.sampling import entropy_seed, sampling_mark
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier
from tests._federated import digits_dpfedavg, fit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

KNOWN = names.EPSILON_ANALYTIC_KNOWN_BATCHES


def _poisson(generator):
    data = TensorDataset(torch.randn(40, 3), torch.zeros(40))
    return DPDataLoader.from_data_loader(DataLoader(data, batch_size=8), generator=generator)


def test_the_loaders_generator_says_whether_the_batches_are_known():
    secret = batch_source(_poisson(torch.Generator().manual_seed(entropy_seed() % 2**63 | 2**40)))
    assert secret.known is False and secret.sampling == SECRET_BATCHES
    small = batch_source(_poisson(torch.Generator().manual_seed(1234)))
    assert small.known is True and "1234" not in small.sampling  # an unlogged seed is never written
    assert small.sampling.startswith("known:") and "does not hold" in small.sampling
    logged = batch_source(_poisson(torch.Generator().manual_seed(2**40 + 7)), logged_seeds=[2**40 + 7])
    assert logged.known is True and logged.sampling == sampling_mark(2**40 + 7)
    torch.manual_seed(0)  # no generator of its own: torch's global one, now seeded publicly
    assert batch_source(_poisson(None)).known is True
    shuffled = batch_source(DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4, shuffle=True))
    assert shuffled.known is None and shuffled.sampling.startswith("not checked")
    assert batch_source(None).known is None


def _dpsgd(tmp_path, **datamodule):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0, **datamodule)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0)
    audit = CanaryAudit(50, seed=3, bootstrap=0)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    folder = os.path.dirname(audit.summary_path)
    with open(os.path.join(folder, HTML_FILENAME), encoding="utf-8") as fh:
        html = fh.read()
    with open(os.path.join(folder, MARKDOWN_FILENAME), encoding="utf-8") as fh:
        markdown = fh.read()
    return audit, summary, html, markdown


def test_secret_batches_are_marked_and_no_unamplified_claim_is_given(tmp_path):
    _, summary, html, markdown = _dpsgd(tmp_path)
    assert summary["inputs"]["claim_sampling"] == SECRET_BATCHES
    assert KNOWN not in summary
    assert SECRET_BATCHES in markdown and "amplified by sampling" in html


def test_reproducible_batches_show_the_unamplified_claim_beside_the_accountants(tmp_path):
    audit, summary, html, markdown = _dpsgd(tmp_path, sampling_seed=7)
    assert summary["inputs"]["claim_sampling"] == sampling_mark(7)
    r = int(audit.auditor.participations.max())
    delta = summary["inputs"]["delta"]
    assert summary[KNOWN] == pytest.approx(gaussian_epsilon(1.0, delta, compositions=r))
    assert summary[KNOWN] > summary[names.EPSILON_ANALYTIC]  # amplification is what secrecy buys
    assert f"{r}-fold Gaussian mechanism" in summary[f"{KNOWN}_status"]
    for text in (html, markdown):
        assert KNOWN in text and "reproducible from seed 7" in text


def test_dp_fedavg_claim_says_it_assumes_known_rounds(tmp_path):
    dm, module = digits_dpfedavg(4)
    audit = CanaryAudit(20, 20, seed=1, bootstrap=0)
    fit(dm, module, [audit], 4, tmp_path, logger=False)
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    claim = summary["inputs"]["claim_sampling"]
    assert claim.startswith("known rounds:") and "holds for anyone holding the logs" in claim
    assert "reproducible from seed 0" in claim  # digits_dpfedavg samples from seed 0
    assert KNOWN not in summary
