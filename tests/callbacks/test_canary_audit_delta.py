"""CanaryAudit on Lightning + Opacus: the claim is the module's own
``privacy_engine.get_epsilon(delta)`` at the delta the run uses (the audit's ``delta``, else the
LightningModule's ``delta`` attribute, else the default, warned once at fit start)."""

from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import pytest

from audit_callbacks import names
from audit_callbacks.callbacks import CanaryAudit
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


class NoDelta(DPSGDClassifier):
    """A DP-SGD module that keeps no delta (it logs no epsilon of its own)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.delta

    def on_train_epoch_end(self) -> None:
        pass


def _fit(tmp_path, audit, module_delta):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, shuffle=False, seed=0)
    kind = DPSGDClassifier if module_delta is not None else NoDelta
    module = kind(MLP(30, 1, hidden=(16,)), lr=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                  noise_seed=0, delta=module_delta or 1e-5)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    said = [str(w.message) for w in record if "no delta given" in str(w.message)]
    with open(audit.summary_path, encoding="utf-8") as fh:
        return module, said, json.load(fh)


@pytest.mark.parametrize(("given", "module_delta", "delta", "source"), [
    (3e-5, 8e-5, 3e-5, "argument"),   # the audit's delta wins
    (None, 8e-5, 8e-5, "module"),     # the LightningModule's delta attribute
    (None, None, 1e-5, "default"),    # neither: the default, warned once
])
def test_the_claim_is_the_modules_get_epsilon_at_the_runs_delta(tmp_path, given, module_delta,
                                                                  delta, source):
    audit = CanaryAudit(40, bootstrap=0, log_figures=False, log_histograms=False, delta=given)
    module, said, summary = _fit(tmp_path, audit, module_delta)
    claim = module.privacy_engine.get_epsilon(delta)
    report = audit.report()
    assert report.delta == delta and report.epsilon_analytic == pytest.approx(claim, rel=1e-9)
    assert summary[names.EPSILON_ANALYTIC] == pytest.approx(claim, rel=1e-9)
    assert summary["inputs"]["delta"] == delta and summary["inputs"][names.DELTA_SOURCE] == source
    for tm in ("final_model", "all_iterates"):
        assert f"at delta = {delta:.4g}" in summary[f"verdict_{tm}_sentence"]
    if source == "default":
        assert len(said) == 1 and said[0].startswith("CanaryAudit: no delta given")
        assert "give the LightningModule a delta attribute" in said[0]
    else:
        assert not said
