"""Verdicts per threat model (issue 25 part 3): a simulated Gaussian mechanism run correctly and
with a planted bug (the noise at a fraction of what the claimed epsilon assumes), the words in the
summary, the codes and sentences in TensorBoard, one warning a run, the name table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audit_callbacks import names
from audit_callbacks.auditing import CanaryAuditConfig, CanaryAuditor
from audit_callbacks.auditing.html_report import verdict as html_verdict
from audit_callbacks.auditing.report import VERDICT_CODES, verdict
from audit_callbacks.auditing.sinks import WriterSink
from audit_callbacks.estimators import gaussian_epsilon
from tests.auditing.test_auditor import SimulatedBackend


class BuggyBackend(SimulatedBackend):
    """The noise is drawn at ``z * noise_scale`` while the analytic epsilon claims ``z``: a
    planted bug such as Opacus' noise at sigma / 2 (``noise_scale = 0.5``)."""

    def __init__(self, dim: int, z: float, noise_scale: float, seed: int = 0) -> None:
        super().__init__(dim, z, seed=seed)
        self.true_z = z * noise_scale

    def step(self, participants: np.ndarray) -> None:
        claimed, self.z = self.z, self.true_z
        try:
            super().step(participants)
        finally:
            self.z = claimed


def _run(noise_scale: float, *, k: int = 400, z: float = 2.0, seed: int = 0):
    backend = BuggyBackend(4096, z, noise_scale, seed=seed)
    warned: list[tuple[str, str]] = []

    def warn(key: str, msg: str) -> None:  # once per key, as every front end (AuditFrontEnd._warn)
        if key not in {k for k, _ in warned}:
            warned.append((key, msg))

    auditor = CanaryAuditor(CanaryAuditConfig(k, 1000, seed=seed, delta=1e-5, bootstrap=50), backend,
                            warn, name="Test")
    auditor.start()
    backend.step(np.arange(k))  # one release: every canary once, as in Andrew et al.'s Alg. 2
    return auditor, backend, warned


class RecordingSink(WriterSink):
    """A sink that records what it is given (no TensorBoard)."""

    def __init__(self) -> None:
        super().__init__()
        self.scalar_log: list[dict] = []
        self.text_log: list[dict] = []

    def scalars(self, values, step):
        self.scalar_log.append(dict(values))

    def latest(self) -> dict:
        """Each tag's last value written (a write may hold only the tags that changed)."""
        out: dict = {}
        for values in self.scalar_log:
            out.update({k: v for k, v in values.items() if v is not None})
        return out

    def text(self, values, step):
        self.text_log.append(dict(values))


def test_a_correct_mechanism_is_consistent():
    auditor, _, warned = _run(1.0)
    sink = RecordingSink()
    auditor.finish(sink, step=1, directory=None, filename="s.json", figures=False)
    report = auditor.last_report
    assert report.epsilon_analytic == pytest.approx(gaussian_epsilon(2.0, 1e-5))
    assert {tm: w for tm, (w, _) in report.verdicts().items()} == {
        "final_model": "consistent", "all_iterates": "consistent"}
    assert sink.latest()["audit/verdict_all_iterates"] == VERDICT_CODES["consistent"] == 0
    assert not [k for k, _ in warned if k == "verdict"]


def test_noise_at_a_quarter_of_the_claimed_scale_is_a_violation_warned_once(tmp_path):
    """z = 2 claimed, z = 0.5 drawn: the canaries' mean shift is 4x what the claim allows; the
    valid lower bound on 400 + 1000 cosines exceeds the claimed epsilon (~2.4)."""
    auditor, backend, warned = _run(0.25)
    sink = RecordingSink()
    auditor.update(sink, step=1)
    backend.step(np.arange(400))
    path = auditor.finish(sink, step=2, directory=str(tmp_path), filename="audit_summary.json", figures=False)
    with open(path, encoding="utf-8") as fh:
        summary = json.load(fh)
    claim = summary["epsilon_analytic"]
    bound = summary["estimates"]["epsilon_lower_bound_all_iterates"]["value"]
    assert bound > claim
    assert summary["verdict_all_iterates"] == "violation"
    assert summary["verdict_all_iterates_sentence"].startswith(
        f"violation: the valid 95% lower bound {bound:.4g} exceeds the claimed epsilon {claim:.4g}")
    assert summary["verdict_final_model"] == "violation"
    assert summary["run_status"] == "complete"
    # TensorBoard: the code next to the estimates and the sentence as text, at every point
    assert [s["audit/verdict_all_iterates"] for s in sink.scalar_log[:2]] == [2, 2]
    assert sink.latest()["audit/verdict_all_iterates"] == 2
    sentences = [t for t in sink.text_log if "audit/verdict_all_iterates_sentence" in t]
    assert sentences[-1]["audit/verdict_all_iterates_sentence"].startswith("violation:")
    # the fit-end numbers (one table, after the last point's sentences) say it too
    assert "| violation |" in sink.text_log[-1]["audit/fit_end_numbers"]
    # one warning a run, however many points were flagged
    flagged = [m for k, m in warned if k == "verdict"]
    assert len(flagged) == 1 and "violation" in flagged[0] and "Training goes on" in flagged[0]
    # the report a person reads shows the summary's verdict; html_report.verdict is the same
    assert html_verdict(summary, "all_iterates") == verdict(summary, "all_iterates") == (
        summary["verdict_all_iterates"], summary["verdict_all_iterates_sentence"])


@pytest.mark.parametrize("noise_scale", [1.0, 0.25])
def test_the_report_gives_the_summary_verdicts_from_its_own_fields(noise_scale):
    """``CanaryReport.verdicts`` reads the report's fields (no summary dict built for it): the
    same words and sentences as the summary written from that report."""
    auditor, _, _ = _run(noise_scale)
    report = auditor.report(step=1)
    summary = auditor.summary(report)
    assert report.verdicts() == {tm: (summary[f"verdict_{tm}"], summary[f"verdict_{tm}_sentence"])
                                 for tm in ("final_model", "all_iterates")}
    # without a claim, and with a headline estimate skipped, the reasons agree as well
    from dataclasses import replace

    for changed in (replace(report, epsilon_analytic=None), replace(report, epsilon_analytic=float("inf")),
                    replace(report, estimates={}, skipped={"epsilon_all_iterates": "degenerate scores"})):
        summary = auditor.summary(changed)
        assert changed.verdicts() == {tm: verdict(summary, tm) for tm in ("final_model", "all_iterates")}


def test_suspicious_and_unchecked_from_the_summary():
    """``suspicious``: the interval's lower end above the claim while the valid bound is not;
    ``unchecked``: no finite claim."""
    summary = {"epsilon_analytic": 1.0, "inputs": {"alpha": 0.05}, "estimates": {
        "epsilon_all_iterates": {"value": 2.0, "lower": 1.5, "upper": 2.5, "details": {"confidence": 0.95}},
        "epsilon_lower_bound_all_iterates": {"value": 0.8}}}
    word, sentence = verdict(summary, "all_iterates")
    assert word == "suspicious"
    assert sentence.startswith("suspicious: the estimate's 95% interval lies above the claimed epsilon")
    assert verdict({**summary, "epsilon_analytic": None}, "all_iterates")[0] == "unchecked"
    assert verdict({**summary, "epsilon_analytic": float("inf")}, "all_iterates")[0] == "unchecked"


def test_an_estimate_of_too_few_canaries_is_not_judged_suspicious():
    """Below ``MIN_CANARIES`` the bootstrap interval of a handful of scores said ``suspicious``
    in 9-10 of 40 correct runs (k = 6 participating): the interval is not judged then, and the
    sentence says why; the valid bound still judges the claim."""
    few = "too few canaries (k = 6)"
    summary = {"epsilon_analytic": 1.0, "inputs": {"alpha": 0.05}, "estimates": {
        "epsilon_all_iterates": {"value": 2.0, "lower": 1.5, "upper": 2.5, "status": few,
                                 "details": {"confidence": 0.95}},
        "epsilon_lower_bound_all_iterates": {"value": 0.8, "status": few}}}
    word, sentence = verdict(summary, "all_iterates")
    assert word == "consistent" and sentence.endswith(f"the estimate's interval is not judged: {few}")
    summary["estimates"]["epsilon_lower_bound_all_iterates"]["value"] = 1.2  # valid at any k
    assert verdict(summary, "all_iterates")[0] == "violation"


def test_the_plan_does_not_read_the_ratio_of_too_few_canaries():
    from audit_callbacks.auditing.plan import plan_entries
    from audit_callbacks.estimators.planner import plan_audit

    plan = plan_audit(training="dpsgd", num_canaries=30, num_unobserved=994, dim=1025, steps=24,
                      sample_rate=64 / 569, noise_multiplier=1.0, delta=1e-5, seed=0, reference_epsilon=2.34)
    summary = {names.EPSILON_RATIO_ALL_ITERATES: 5.0,
               "estimates": {names.EPSILON_ALL_ITERATES: {"status": "ok"}}}
    assert "above the range" in plan_entries(plan, summary=summary)[names.PLAN_RATIO_READING]
    summary["estimates"][names.EPSILON_ALL_ITERATES]["status"] = "too few canaries (k = 6)"
    reading = plan_entries(plan, summary=summary)[names.PLAN_RATIO_READING]
    assert reading == "5.00: not read against the range expected for a correct run: too few canaries (k = 6)"


def test_verdict_codes_are_in_the_name_table_with_a_chart():
    table = {q.name: q for q in names.family("audit")}
    for tm in ("final_model", "all_iterates"):
        q = table[f"verdict_{tm}"]
        assert q.chart is not None and "consistent" in q.description and "violation" in q.description
    layout = names.chart_layout(["audit"])
    drawn = [t for charts in layout.values() for _, pats in charts.values() for t in pats]
    assert r"^audit/verdict_all_iterates$" in drawn


def test_verdicts_reach_tensorboard_as_scalars_and_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    auditor, _, _ = _run(0.25, k=100)
    sink = WriterSink(log_dir=str(tmp_path))
    auditor.finish(sink, step=1, directory=str(tmp_path), filename="audit_summary.json", figures=False)
    sink.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0}).Reload()
    assert [e.value for e in acc.Scalars("audit/verdict_all_iterates")] == [2.0]
    text = acc.Tensors("audit/verdict_all_iterates_sentence/text_summary")[0]
    assert text.tensor_proto.string_val[0].decode().startswith("violation:")


# ------------------------------------------------------------------ the sampler check's sentence
def _sampler_checks(sizes, population=1500, rate=64 / 1500, *, as_summary=False, drop=()):
    """``{batch_size_variance_ratio: ...}`` of ``sizes``: the result, or its summary dict
    (``to_dict``) less the details named in ``drop`` (a summary written before them)."""
    from audit_callbacks.estimators.mechanism_checks import sampler_check

    res = sampler_check(sizes, population, rate)
    if as_summary:
        res = res.to_dict()
        res["details"] = {k: v for k, v in res["details"].items() if k not in drop}
    return {names.BATCH_SIZE_VARIANCE_RATIO: res}


@pytest.mark.parametrize("form", [{}, {"as_summary": True}, {"as_summary": True, "drop": ("rejected_by",)}])
def test_a_rejection_by_the_repeats_test_alone_is_said_so(form):
    """A spread like Binomial(N, q)'s (variance 52.8 against 61.3, the dispersion test passes)
    with size 64 in 16 of 36 steps: the sentence names the repeats test and its numbers, not
    the means and variances, which the repeats test does not read."""
    from audit_callbacks.auditing.report import mechanism_verdict

    sizes = [64] * 16 + [53, 75, 56, 72, 60, 68, 58, 70, 49, 79] * 2
    word, sentence = mechanism_verdict(_sampler_checks(sizes, **form))
    assert word == "unproven"
    assert "the batch sizes are not Binomial(N, q)'s; rejected by the repeats test: size 64 in 16 of 36 steps" in sentence
    assert "dispersion test" not in sentence and "total test" not in sentence
    assert "variance" not in sentence


def test_a_multi_epoch_fixed_size_loader_reads_fixed_and_names_its_test():
    """Two epochs of 1,500 examples in batches of 64 (23 of 64 and one of 28 each), the imdb
    port's loader: "fixed-size batches of 64", rejected by the repeats test."""
    from audit_callbacks.auditing.report import mechanism_verdict

    word, sentence = mechanism_verdict(_sampler_checks(([64] * 23 + [28]) * 2))
    assert word == "unproven"
    assert ("the loader draws fixed-size batches of 64; rejected by the repeats test: size 64 in 46 "
            "of 48 steps") in sentence


def test_every_failed_sampler_test_is_named_with_its_numbers():
    """A doubled rate: the total test (its means) and the dispersion test (its variances)."""
    from audit_callbacks.auditing.report import mechanism_verdict

    sizes = np.random.default_rng(6).binomial(5000, 0.02, size=30)
    checks = _sampler_checks(sizes, 5000, 0.01)
    d = checks[names.BATCH_SIZE_VARIANCE_RATIO].details
    assert d["rejected_by"][:2] == ["total", "dispersion"]
    sentence = mechanism_verdict(checks)[1]
    assert (f"rejected by the total test: mean size {d['mean']:.4g} a step against Binomial(N, q)'s "
            f"{d['expected_mean']:.4g} (p = {d['p_value_total']:.4g}) and by the dispersion test: "
            f"variance {d['variance']:.4g}") in sentence


def test_the_sampler_fix_names_each_front_ends_loader():
    """The report cannot tell the front end: the sentence names the fix of each. Under
    Lightning the loader is train_dataloader's, so make_private's poisson_sampling=True alone
    changes nothing there."""
    from audit_callbacks.auditing.report import mechanism_verdict

    sentence = mechanism_verdict(_sampler_checks([64] * 23 + [28]))[1]
    assert "plain loop (OpacusCanaryAudit), train on the loader that make_private(..., poisson_sampling=True) returns" in sentence
    assert "Lightning (CanaryAudit), return DPDataLoader.from_data_loader(loader) from train_dataloader" in sentence
