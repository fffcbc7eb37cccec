"""What a user sees in TensorBoard and Lightning (issue 27, items 1 and 3): one Custom Scalars
dashboard merged from every attached callback, each chart naming exactly its registered series,
and the audit's numbers in ``trainer.callback_metrics`` where ``EarlyStopping`` can use them."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as cs_meta

from audit_callbacks import names
from audit_callbacks.callbacks import CanaryAudit, LabelDPLowerBound, LabelReconstructionAttack
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


def _fit(tmp_path, callbacks, epochs=2, logger=True):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(32, 32)), lr=0.3, noise_multiplier=1.0,
                             max_grad_norm=1.0, noise_seed=0)
    log = TensorBoardLogger(str(tmp_path), name="run", version=0) if logger else False
    trainer = pl.Trainer(max_epochs=epochs, logger=log, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return trainer


def test_one_dashboard_holds_every_callbacks_charts(tmp_path):
    callbacks = [CanaryAudit(100, seed=0, bootstrap=0), LabelReconstructionAttack(),
                 LabelDPLowerBound()]
    _fit(tmp_path, callbacks)
    acc = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"tensors": 0, "images": 0})
    acc.Reload()
    # the audit report: next to the summary, with the label audits' sections, and in TensorBoard
    html, markdown = callbacks[0].auditor.report_paths
    text = open(markdown, encoding="utf-8").read()
    assert "label reconstruction attack" in text and "label-DP lower bound" in text
    assert "audit/report/text_summary" in acc.Tags()["tensors"]  # the text plugin stores tensors
    assert {"audit/roc_final_model", "audit/cosine_density_final_model"} <= set(acc.Tags()["images"])
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG)[-1].tensor_proto.string_val[0])
    sections = {cat.title: {c.title: list(c.multiline.tag) for c in cat.chart} for cat in layout.category}
    for family in ("audit", "label_attack", "label_dp"):
        assert names.SECTIONS[family] in sections, (family, sorted(sections))
    registered = {f"^{q.tag}$".replace(".", r"\.") for q in names.QUANTITIES}
    for title, charts in sections.items():
        for chart, tags in charts.items():
            for tag in tags:
                assert tag.startswith("^") and tag.endswith("$"), (title, chart, tag)
                assert tag in registered or tag in (r"^val.*acc.*$", "^val/accuracy$"), (title, chart, tag)


def test_early_stopping_watches_an_audit_number(tmp_path):
    """The headline estimate reaches trainer.callback_metrics at each epoch's end, so
    EarlyStopping on it stops the fit (here at the first estimate: any value above -1)."""
    audit = CanaryAudit(100, seed=0, bootstrap=0)
    stop = EarlyStopping(monitor="audit/epsilon_final_model", mode="max", stopping_threshold=-1.0,
                         check_on_train_epoch_end=True)
    trainer = _fit(tmp_path, [audit, stop], epochs=5, logger=False)
    assert "audit/epsilon_final_model" in trainer.callback_metrics
    assert trainer.current_epoch < 4 and stop.stopped_epoch < 4
