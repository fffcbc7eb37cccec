"""A report that cannot be misread: every verdict sentence states the delta of its epsilons,
``value()`` reads every quantity of family ``audit`` by name and refuses an unknown one with
the names, and the default delta is warned once and recorded in the summary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from audit_callbacks import names
from audit_callbacks.auditing import CanaryAuditConfig, CanaryAuditor, CanaryReport
from audit_callbacks.auditing.report import summary_json, value_names, verdict
from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.estimators.result import AuditResult
from tests.auditing.test_auditor import SimulatedBackend


def _result(value, lower=None, upper=None):
    return AuditResult(value=value, lower=lower, upper=upper, alpha=0.05, delta=3e-5,
                       method="test", details={"confidence": 0.95})


def _report(*, claim=4.0, bound=None, estimate=None, lower=None, upper=None, delta=3e-5,
            skipped=None):
    estimates = {}
    if estimate is not None:
        estimates[names.EPSILON_ALL_ITERATES] = _result(estimate, lower, upper)
        estimates[names.EPSILON_FINAL_MODEL] = _result(estimate, lower, upper)
    if bound is not None:
        estimates[names.EPSILON_LOWER_BOUND_ALL_ITERATES] = _result(bound)
        estimates[names.EPSILON_LOWER_BOUND_FINAL_MODEL] = _result(bound)
    return CanaryReport(estimates=estimates, skipped=dict(skipped or {}), epsilon_analytic=claim,
                        epsilon_last_iterate_heuristic=2.0, delta=delta)


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"bound": 5.0, "estimate": 6.0, "lower": 4.5, "upper": 7.0}, "violation"),
    ({"bound": 1.0, "estimate": 6.0, "lower": 4.5, "upper": 7.0}, "suspicious"),
    ({"bound": 1.0, "estimate": 2.0, "lower": 1.5, "upper": 2.5}, "consistent"),
    ({"claim": None, "bound": 1.0, "estimate": 2.0}, "unchecked"),
    ({"skipped": {names.EPSILON_ALL_ITERATES: "too few"}}, "unchecked"),
])
def test_every_verdict_sentence_states_the_delta(kwargs, word):
    report = _report(**kwargs)
    verdicts = report.verdicts()
    assert verdicts["all_iterates"][0] == word
    for _, sentence in verdicts.values():
        assert "at delta = 3e-05" in sentence, sentence
    # the summary's sentences (the same judge on the summary's numbers, delta from its inputs)
    summary = summary_json(report, stale=False, skip_reason=None, inputs={"alpha": 0.05, "delta": 3e-5},
                           gradients=True, callback="Test")
    for tm in ("final_model", "all_iterates"):
        assert "at delta = 3e-05" in summary[f"verdict_{tm}_sentence"]
        assert verdict(summary, tm) == (summary[f"verdict_{tm}"], summary[f"verdict_{tm}_sentence"])


def test_value_reads_every_audit_quantity_and_refuses_an_unknown_name():
    report = _report(bound=1.0, estimate=2.0, lower=1.5, upper=2.5,
                     skipped={names.EPSILON_ALL_ITERATES_MATCHED: "no matched statistic"})
    assert report.value(names.EPSILON_ALL_ITERATES) == 2.0
    assert report.value(names.EPSILON_ANALYTIC) == 4.0  # an attribute, by its name too
    assert report.value(names.EPSILON_RATIO_ALL_ITERATES) == pytest.approx(0.5)
    assert report.value(names.NOISE_SCALE_RATIO) is None  # a check that did not run
    # skipped: None, and the reason is readable
    assert report.value(names.EPSILON_ALL_ITERATES_MATCHED) is None
    assert report.status(names.EPSILON_ALL_ITERATES_MATCHED) == "skipped: no matched statistic"
    assert report.status(names.EPSILON_ALL_ITERATES) == "ok"
    assert report.status(names.EPSILON_GDP_LOWER_BOUND_FINAL_MODEL) == "skipped: not computed"
    # a misspelling is not a skipped estimate: KeyError listing the names
    with pytest.raises(KeyError, match="epsilon_all_iterate'.*epsilon_all_iterates.*epsilon_analytic"):
        report.value("epsilon_all_iterate")
    with pytest.raises(KeyError, match=r"verdict is a word: read report.verdicts\(\)"):
        report.value(names.VERDICT_ALL_ITERATES)
    with pytest.raises(KeyError):
        report.status("nope")
    listed = value_names()
    assert names.EPSILON_ANALYTIC in listed and names.EPSILON_ALL_ITERATES in listed
    assert names.VERDICT_MECHANISM not in listed
    # the scalars are the values by name (one reading of every number)
    scalars = report.scalars()
    for name in listed:
        got = report.value(name)
        assert scalars[names.tag(names.FAMILY_AUDIT, name)] == (None if got is None else float(got))


def test_value_gives_one_number_a_name_at_a_logged_point_as_the_scalars_do():
    """At a logged point (``index`` set) the bounds at the spent alpha are read under the
    ``_watched`` names and the plain names are None, as in TensorBoard and the summary; at fit
    end (``index`` None) the other way round (before, ``value`` gave the spent-alpha bound under
    the plain name and refused the watched one)."""
    watched = names.EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED
    plain = names.EPSILON_LOWER_BOUND_ALL_ITERATES
    point = dataclasses.replace(_report(bound=1.0, estimate=2.0, lower=1.5, upper=2.5), index=3)
    assert point.value(watched) == 1.0 and point.value(plain) is None
    assert point.status(watched) == "ok" and point.status(plain).startswith("not at this point")
    end = _report(bound=1.0, estimate=2.0, lower=1.5, upper=2.5)
    assert end.value(plain) == 1.0 and end.value(watched) is None
    assert watched in value_names()
    for report in (point, end):
        scalars = report.scalars()
        for name in value_names():
            got = report.value(name)
            assert scalars[names.tag(names.FAMILY_AUDIT, name)] == (None if got is None else float(got))


def _auditor(delta=None, delta_source=None):
    said: list[tuple[str, str]] = []
    auditor = CanaryAuditor(CanaryAuditConfig(40, 400, delta=delta), SimulatedBackend(1024, 1.0),
                            lambda key, msg: said.append((key, msg)), name="Test",
                            delta_source=delta_source)
    return auditor, said


def test_the_default_delta_is_warned_once_and_recorded():
    auditor, said = _auditor()
    auditor.start()
    auditor.start()  # a repeated fit: still once (the front end's warn is once per key)
    default = [m for k, m in said if k == "delta"]
    assert len(default) == 2 and default[0] == default[1]  # this stand-in warn does not dedupe
    assert "no delta given" in default[0] and "default delta = 1e-06" in default[0]
    assert "Test(..., delta=...)" in default[0]
    assert auditor.summary()["inputs"][names.DELTA_SOURCE] == "default"
    # given: no warning, recorded as the argument; the report carries it
    given, said = _auditor(delta=2e-5)
    given.start()
    assert not [k for k, _ in said if k == "delta"]
    assert given.summary()["inputs"][names.DELTA_SOURCE] == "argument"
    backend = given.backend
    for _ in range(3):
        backend.step(np.arange(40))
    report = given.report()
    assert report.delta == 2e-5 and "at delta = 2e-05" in report.verdicts()["all_iterates"][1]
    # a front end that put its own default into the config says so (CanaryStrategy's 1e-6)
    flower, said = _auditor(delta=1e-6, delta_source="default")
    flower.start()
    assert [k for k, _ in said if k == "delta"] == ["delta"]
    assert flower.summary()["inputs"][names.DELTA_SOURCE] == "default"


def test_a_training_that_gives_its_own_delta_is_not_warned():
    class OwnDelta(SimulatedBackend):
        def __init__(self):
            super().__init__(1024, 1.0)
            self.default_delta = 4e-5  # as DPFedAvg's and a LightningModule's delta attribute

    said: list[tuple[str, str]] = []
    auditor = CanaryAuditor(CanaryAuditConfig(40, 400), OwnDelta(), lambda k, m: said.append((k, m)))
    auditor.start()
    assert not said and auditor.delta == 4e-5 and auditor.delta_source == "module"


def test_the_hadamard_cap_names_both_fixes():
    with pytest.raises(ValueError, match=r"n = 1024.*fewer canaries.*num_unobserved=None fills the rest"
                                         r".*canaries='gaussian'"):
        CanaryAuditor(CanaryAuditConfig(100, 1000), SimulatedBackend(1024, 1.0), lambda k, m: None)
    with pytest.raises(ValueError, match=r"at most n = 64 .*fewer canaries.*canaries='gaussian'"):
        CanarySet(0, 100, 65, kind="hadamard")
