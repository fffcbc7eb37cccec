"""What a reader finds in TensorBoard at fit end: the fit-end numbers as one Markdown table in
the Text tab beside the report's text, and Custom Scalars charts whose lines can be told apart
(TensorBoard colours a chart's lines by run only, so each chart holds one kind of number: an
estimate shares its chart only with the reference it is read against)."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugin_util import markdown_to_safe_html
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as cs_meta

from audit_callbacks import names
from audit_callbacks.auditing.report import REFERENCES
from audit_callbacks.auditing.sinks import FIT_END_TAG, fit_end_table
from audit_callbacks.callbacks import CanaryAudit
from tests._federated import digits_dpfedavg, fit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SUMMARY = {
    "results": {
        names.EPSILON_ALL_ITERATES: {"value": 8.041, "lower": 7.049, "upper": 8.806, "status": "ok"},
        names.EPSILON_LOWER_BOUND_ALL_ITERATES: {"value": 2.671, "status": "ok"},
        names.EPSILON_FINAL_MODEL: {"value": 1.878, "lower": 1.23, "upper": 2.749, "status": "ok"},
        names.EPSILON_LOWER_BOUND_FINAL_MODEL: {"value": 0.3235, "status": "ok"},
    },
    names.EPSILON_ANALYTIC: 8.306, names.EPSILON_LAST_ITERATE_HEURISTIC: 2.209,
    names.EPSILON_RATIO_ALL_ITERATES: 0.9681, names.EPSILON_RATIO_FINAL_MODEL: 0.8504,
    names.VERDICT_ALL_ITERATES: "consistent", names.VERDICT_FINAL_MODEL: "suspicious",
    names.VERDICT_MECHANISM: "consistent",
    "inputs": {"delta": 1e-6, "alpha": 0.05},
}


def _rows(markdown: str) -> dict[str, list[str]]:
    """The table's rows by their first cell."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_the_fit_end_table_holds_each_threat_models_numbers_and_renders_as_a_table():
    text = fit_end_table(SUMMARY)
    rows = _rows(text)
    assert list(rows)[1:] == ["all iterates", "final model"]  # the claim's threat model first
    assert rows["all iterates"] == ["8.041", "[7.049, 8.806]", "2.671", "claim (analytic epsilon)", "8.306",
                                    "0.9681", "consistent", "ok"]
    assert rows["final model"][0] == "1.878" and rows["final model"][4] == "2.209"
    assert rows["final model"][-2:] == ["suspicious", "ok"]
    assert "delta = 1e-06" in text and "95%" in text and "mechanism: consistent" in text
    html = markdown_to_safe_html(text)  # what TensorBoard's Text tab shows
    assert "<table>" in html and html.count("<tr>") == 3 and "8.041" in html


def test_a_missing_number_shows_as_a_dash_and_a_skipped_estimate_its_status():
    summary = {**SUMMARY, "results": {names.EPSILON_ALL_ITERATES: {"value": None, "status": "skipped"}},
               names.EPSILON_LAST_ITERATE_HEURISTIC: None}
    rows = _rows(fit_end_table(summary))
    assert rows["all iterates"][:3] == ["-", "-", "-"] and rows["all iterates"][-1] == "skipped"
    assert rows["final model"][:5] == ["-", "-", "-", "last-iterate heuristic (not a bound)", "-"]


def test_each_chart_holds_one_kind_of_number():
    """Every chart of the audit's section draws one tag, an estimate with its reference
    (the pairs of ``REFERENCES``) or a valid bound with its watched series; before, one chart drew the estimate, the matched statistic
    (equal to it), the valid bound and the claim, and one the three verdict codes."""
    pairs = {frozenset(f"^{names.FAMILY_AUDIT}/{n}$" for n in pair) for pair in REFERENCES.values()}
    # a valid bound with its watched series (the points logged during training, at spent alpha)
    pairs |= {frozenset((f"^{names.FAMILY_AUDIT}/{n}$", f"^{names.FAMILY_AUDIT}/{n}_watched$"))
              for n in (names.EPSILON_LOWER_BOUND_ALL_ITERATES, names.EPSILON_LOWER_BOUND_FINAL_MODEL)}
    layout = names.chart_layout([names.FAMILY_AUDIT])[names.SECTIONS[names.FAMILY_AUDIT]]
    for title, (kind, tags) in layout.items():
        assert kind == "Multiline"
        assert len(tags) == 1 or frozenset(tags) in pairs, (title, tags)
    drawn = [t for _, tags in layout.values() for t in tags]
    assert len(drawn) == len(set(drawn))  # no tag in two charts
    assert f"^{names.FAMILY_AUDIT}/{names.EPSILON_LOWER_BOUND_ALL_ITERATES}$" in drawn


def test_a_fit_writes_the_table_beside_the_report_and_the_layout_read_back(tmp_path):
    callback = CanaryAudit(10, 20, bootstrap=0, log_figures=False, log_histograms=False)
    fit(*digits_dpfedavg(rounds_per_epoch=4), [callback], 4, tmp_path)
    acc = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert f"{FIT_END_TAG}/text_summary" in tags and "audit/report/text_summary" in tags
    (event,) = acc.Tensors(f"{FIT_END_TAG}/text_summary")  # one entry, at fit end
    text = event.tensor_proto.string_val[0].decode()
    with open(callback.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    assert text == fit_end_table(summary)
    row = _rows(text)["all iterates"]
    estimate = summary["results"][names.EPSILON_ALL_ITERATES]
    assert row[0] == f"{estimate['value']:.4g}" and row[-1] == estimate["status"]
    assert row[-2] == summary[names.VERDICT_ALL_ITERATES]
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG)[-1].tensor_proto.string_val[0])
    (section,) = [c for c in layout.category if c.title == names.SECTIONS[names.FAMILY_AUDIT]]
    charts = {c.title: list(c.multiline.tag) for c in section.chart}
    assert all(len(t) <= 2 for t in charts.values()), charts
    allit = f"^{names.FAMILY_AUDIT}/{names.EPSILON_ALL_ITERATES}$"
    assert [allit, f"^{names.FAMILY_AUDIT}/{names.EPSILON_ANALYTIC}$"] in charts.values()
