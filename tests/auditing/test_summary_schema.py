"""One output path: every audit's summary follows the one schema (docs/summary_schema.md), and the
audit report is written for a run with only label callbacks and for one with only local-DP
callbacks (real, tiny Lightning fits)."""

import json
import os
import warnings

import lightning.pytorch as pl
import pytest
import torch

from audit_callbacks import names
from audit_callbacks.auditing.html_report import HTML_FILENAME, MARKDOWN_FILENAME
from audit_callbacks.auditing.output import (
    SCHEMA,
    AuditOutput,
    AuditRun,
    ReportSection,
    result_entry,
    summary_document,
    validate_summary,
)
from audit_callbacks.callbacks import CanaryAudit, LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
from audit_callbacks.callbacks.ldp_audit import LDPAudit
from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.mechanisms import TwoPoint
from datamodules import FederatedDataModule
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier
from tests._federated import digits_dpfedavg, fit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

_KNOWN = {q.name for q in names.QUANTITIES}
_SCHEMA_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "summary_schema.md")
#: names docs/summary_schema.md says are in no summary where what they measure did not run
_ONLY_WHEN_RUN = {names.BATCH_SIZE_VARIANCE_RATIO, names.EPSILON_EXACT_PER_COORDINATE,
                  names.EPSILON_CLAIMED_PER_COORDINATE}


def _documented(doc: dict) -> None:
    """docs/summary_schema.md names every top-level and ``inputs`` key of ``doc`` (a canary
    threat model's keys may be written with ``<tm>``); every result with an interval states
    its ``alpha``; every name of ``tags`` is where the doc's "Where each name is" puts it."""
    with open(_SCHEMA_DOC, encoding="utf-8") as fh:
        text = fh.read()

    def named(key: str) -> bool:
        generic = key.replace("final_model", "<tm>").replace("all_iterates", "<tm>")
        return f"`{key}`" in text or f"`{generic}`" in text

    missing = [k for k in (*doc, *doc["inputs"]) if not named(k)]
    assert not missing, f"keys of {doc['audit']} not in docs/summary_schema.md: {missing}"
    for name, entry in doc["results"].items():
        if entry.get("lower") is not None or entry.get("upper") is not None:
            assert entry.get("alpha") is not None, (name, "an interval without its alpha")
    for name in doc.get("tags", {}):
        assert (name in doc["results"] or name in doc or name in doc["inputs"]
                or name.endswith("_watched") or name in _ONLY_WHEN_RUN), name


def _check(path, audit):
    """Read a summary and check it against the schema, and the schema's promises."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    validate_summary(doc)
    _documented(doc)
    assert doc["schema"] == SCHEMA and doc["audit"] == audit == doc["callback"]
    assert doc["run_status"] == "complete"
    assert doc["results"], "an audit reports at least one result"
    for name, entry in doc["results"].items():
        assert name in _KNOWN
        if entry["status"] == "ok":
            assert "value" in entry, (name, entry)  # an ok result has its number
        if "value" not in entry:
            assert entry["status"].startswith(("skipped", "infinite")), (name, entry)
    assert isinstance(doc["versions"], dict)
    return doc


def _dpsgd_fit(tmp_path, callbacks):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(64, 64)), lr=0.3, noise_multiplier=1.0,
                             max_grad_norm=1.0, noise_seed=0)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return trainer


def _ldp_fit(tmp_path, callbacks, rounds=4):
    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.0,
                      clip_norm=1.0, local_lr=0.5, local_batch_size=64, server_lr=0.1,
                      server_momentum=0.0, seed=0, randomizer=TwoPoint(3.0, center=0.0, radius=0.2),
                      reproducible_noise=True, client_datasets=dm.client_datasets)
    return fit(dm, module, callbacks, rounds, tmp_path, logger=False)


def _report(folder):
    html_path, md_path = os.path.join(folder, HTML_FILENAME), os.path.join(folder, MARKDOWN_FILENAME)
    assert os.path.exists(html_path) and os.path.exists(md_path), sorted(os.listdir(folder))
    with open(html_path, encoding="utf-8") as fh:
        html = fh.read()
    with open(md_path, encoding="utf-8") as fh:
        return html, fh.read()


def test_label_only_run_writes_schema_summaries_and_the_report(tmp_path):
    bound, attack = LabelDPLowerBound(every_n_steps=1), LabelReconstructionAttack(every_n_steps=1)
    _dpsgd_fit(tmp_path, [bound, attack])
    folder = os.path.dirname(bound.summary_path)
    assert os.path.dirname(attack.summary_path) == folder  # one run folder for every audit
    doc = _check(bound.summary_path, "LabelDPLowerBound")
    assert doc["status"] == "ok" and doc["results"]["epsilon_lower_bound_max"]["status"] == "ok"
    # the result is the key of before, in the schema's form
    assert doc["results"]["epsilon_lower_bound_max"]["value"] == doc["epsilon_lower_bound_max"]
    assert doc["results"]["epsilon_single_step"]["value"] == doc["epsilon_single_step"]
    assert doc["inputs"]["noise_multiplier"] == 1.0
    _check(attack.summary_path, "LabelReconstructionAttack")
    html, markdown = _report(folder)
    for title in (bound.report_section()[0], attack.report_section()[0]):
        assert title in html and title in markdown
    assert "epsilon_lower_bound_max" in html
    assert "chance level: 1 / 2 = 0.5" in html and "chance level" in markdown  # a binary model


def test_ldp_only_run_writes_schema_summaries_and_the_report(tmp_path):
    audit, inference = LDPAudit(trials=200, every_n_rounds=2, seed=1), LDPInferenceAudit(seed=1)
    _ldp_fit(tmp_path, [audit, inference])
    folder = os.path.dirname(audit.summary_path)
    assert os.path.dirname(inference.summary_path) == folder
    doc = _check(audit.summary_path, "LDPAudit")
    assert doc["status"] == "ok"
    last = [r for r in audit.history if r["adversary"] == "benign"][-1]
    assert doc["results"]["epsilon0_benign"]["value"] == last["epsilon0"]
    assert doc["results"]["epsilon0_lower_bound_benign"]["value"] == last["epsilon0_lower_bound"]
    assert doc["results"]["epsilon_exact_per_coordinate"]["value"] == audit.exact["epsilon_exact_per_coordinate"]
    inf = _check(inference.summary_path, "LDPInferenceAudit")
    assert inf["results"]["error_debiased"]["value"] == inf["final"]["error_debiased"]
    html, markdown = _report(folder)
    for title in (audit.report_section()[0], inference.report_section()[0]):
        assert title in html and title in markdown


def test_federated_label_attack_and_canary_summaries_follow_the_schema(tmp_path):
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    canary, attack = CanaryAudit(num_canaries=20, seed=0), FederatedLabelAttack()
    fit(dm, module, [canary, attack], 4, tmp_path, logger=False)
    doc = _check(canary.summary_path, "CanaryAudit")
    # the canary's estimates are its results, beside the checks of the mechanism
    assert {k: v for k, v in doc["results"].items() if k in doc["estimates"]} == doc["estimates"]
    assert set(doc["results"]) - set(doc["estimates"]) <= {"noise_scale_ratio", "fresh_noise_ratio",
                                                           "batch_size_variance_ratio"}
    _check(attack.summary_path, "FederatedLabelAttack")
    folder = os.path.dirname(canary.summary_path)
    assert os.path.dirname(attack.summary_path) == folder
    html, _ = _report(folder)  # one report: the canary audit's headline and the attack's section
    assert "Headline numbers" in html and attack.report_section()[0] in html
    if attack.attacked_clients:  # the attack's accuracy beside its chance level (10 digits)
        assert "chance level: 1 / 10 = 0.1" in html
    assert canary.auditor.report_paths[0] == os.path.join(folder, HTML_FILENAME)


def test_dpsgd_canary_summary_follows_the_schema(tmp_path):
    """An Opacus DP-SGD canary audit's summary (its own inputs: the loader's canary draws,
    the accountant) is documented key by key, with a bootstrap interval stating its alpha."""
    canary = CanaryAudit(num_canaries=20, seed=0, bootstrap=20)
    _dpsgd_fit(tmp_path, [canary])
    doc = _check(canary.summary_path, "CanaryAudit")
    final = doc["results"][names.EPSILON_FINAL_MODEL]
    assert final["lower"] is not None and final["alpha"] == doc["inputs"]["alpha"]


def test_the_schema_rejects_what_it_does_not_describe():
    good = summary_document("LDPAudit", run_status="complete", status="ok", source="s", inputs={},
                            results={"epsilon0_benign": result_entry(1.5, method="m")})
    validate_summary(good)
    assert good["results"]["epsilon0_benign"]["value"] == 1.5
    assert result_entry(None, reason="why") == {"status": "skipped: why"}
    assert result_entry(float("inf")) == {"status": "skipped: not computed"}
    for broken in ({k: v for k, v in good.items() if k != "results"},
                   {**good, "schema": "other/1"},
                   {**good, "results": {"not_a_name": {"status": "ok", "value": 1.0}}},
                   {**good, "results": {"epsilon0_benign": {"value": 1.0}}},
                   {**good, "results": {"epsilon0_benign": {"status": "ok", "value": None}}},
                   {**good, "results": {"epsilon0_benign": {"status": "ok", "extra": 1}}},
                   {**good, "inputs": []}):
        with pytest.raises(ValueError, match="summary"):
            validate_summary(broken)
    with pytest.raises(ValueError, match="schema"):
        summary_document("x", run_status="complete", status="ok", source="", inputs={}, results={},
                         callback="y")


def test_warn_once_a_failing_write_and_the_report_of_registered_sections(tmp_path):
    messages = []
    run = AuditRun(str(tmp_path))
    first = AuditOutput("LabelDPLowerBound", "a.json", emit=messages.append,
                        section=lambda: ReportSection("first audit", {"value": 1.0}))
    second = AuditOutput("LDPAudit", "b.json", emit=messages.append,
                         section=lambda: ReportSection("second audit", {"value": 2.0}))
    first.bind_directory(str(tmp_path), run=run)
    second.bind_directory(str(tmp_path), run=run)
    first.warn("k", "once")
    first.warn("k", "twice")
    assert messages == ["once"]
    # a summary that breaks the schema is warned about, never raised, and not written
    assert first.finish({"schema": SCHEMA}) is None
    assert "could not be written" in messages[-1] and not os.path.exists(tmp_path / "a.json")
    assert run.report_paths is None  # the second audit has not finished
    doc = summary_document("LDPAudit", run_status="complete", status="ok", source="s", inputs={},
                           results={})
    assert second.finish(doc) == str(tmp_path / "b.json")
    html, markdown = _report(str(tmp_path))
    assert "first audit" in html and "second audit" in markdown
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # an interrupted audit writes its summary and no report
        other = AuditRun(str(tmp_path / "interrupted"))
        out = AuditOutput("LDPAudit", "c.json", section=lambda: ReportSection("x", {}))
        out.bind_directory(str(tmp_path / "interrupted"), run=other)
        assert out.finish({**doc, "run_status": "interrupted at step 3"}, "interrupted at step 3")
        assert sorted(os.listdir(tmp_path / "interrupted")) == ["c.json"]


def test_a_run_refuses_a_second_writer_of_one_summary_file_and_a_second_canary_audit(tmp_path):
    run = AuditRun(str(tmp_path))
    first = AuditOutput("LabelDPLowerBound", "a.json").bind_directory(str(tmp_path), run=run)
    first.bind_directory(str(tmp_path), run=run)  # the same audit again: fine
    for name in ("a.json", "./a.json", "sub/../a.json"):
        with pytest.raises(ValueError, match="summary_filename"):
            AuditOutput("LDPAudit", name).bind_directory(str(tmp_path), run=run)
    AuditOutput("LDPAudit", None).bind_directory(str(tmp_path), run=run)  # no file: no clash
    canary = AuditOutput("CanaryAudit", "c.json")
    canary.one_per_run = True
    canary.bind_directory(str(tmp_path), run=run)
    other = AuditOutput("CanaryAudit", "d.json")
    other.one_per_run = True
    with pytest.raises(ValueError, match="one canary audit per run"):
        other.bind_directory(str(tmp_path), run=run)
    assert [o.audit for o in run.outputs] == ["LabelDPLowerBound", "LDPAudit", "CanaryAudit"]
    assert CanaryAudit(10).output.one_per_run and not LabelDPLowerBound().output.one_per_run
