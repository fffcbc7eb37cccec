"""The one canary auditor: its event interface on a simulated Gaussian mechanism,
the shared validating configuration and the name table (the package's import structure and the
front ends' contract: tests/integration/test_package_contracts.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from audit_callbacks import names
from audit_callbacks.auditing import CanaryAuditConfig, CanaryAuditor, NoEstimateYet
from audit_callbacks.backends.base import BackendBase
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.estimators import gaussian_epsilon


class SimulatedBackend(BackendBase):
    """A Gaussian mechanism in d dimensions: each release is C * (sum of the canaries that
    took part) + N(0, (z C)^2 I), exactly DP-FedAvg's noisy sum of a round without real
    clients (Andrew et al., ICLR 2024, Alg. 2)."""

    training = "simulated Gaussian mechanism"

    def __init__(self, dim: int, z: float, seed: int = 0) -> None:
        super().__init__(dim, None)
        self.z = z
        self.theta = torch.zeros(dim)
        self.rounds = 0
        self.gen = torch.Generator().manual_seed(seed)

    def step(self, participants: np.ndarray) -> None:
        assert self.auditor is not None
        noise = torch.randn(self.dim, generator=self.gen) * self.z
        signal = self.auditor.canaries.sum(participants.tolist()) if participants.size else 0.0
        delta = signal + noise
        self.theta = self.theta + delta
        self.rounds += 1
        self.auditor.release(delta, participants, what=f"round {self.rounds}")

    def flat_parameters(self) -> torch.Tensor:
        return self.theta

    def progress(self) -> int:
        return self.rounds

    def analytic(self, delta: float) -> dict[str, float | None]:
        assert self.auditor is not None
        r = int(self.auditor.participations.max(initial=0))
        return {"epsilon_analytic": gaussian_epsilon(self.z, delta, compositions=max(r, 1))}

    def summary_inputs(self) -> dict[str, float]:
        return {"noise_multiplier": self.z}


def _auditor(k=200, z=0.5, dim=4096, seed=0, **config):
    backend = SimulatedBackend(dim, z, seed=seed)
    warnings: list[tuple[str, str]] = []
    auditor = CanaryAuditor(CanaryAuditConfig(k, 1000, seed=seed, delta=1e-5, **config), backend,
                            lambda key, msg: warnings.append((key, msg)), name="Test")
    auditor.start()
    return auditor, backend, warnings


def test_no_estimate_before_two_canaries_took_part():
    auditor, backend, warnings = _auditor()
    with pytest.raises(NoEstimateYet, match="fewer than 2 canaries"):
        auditor.report()
    backend.step(np.array([0]))
    assert auditor.try_report() is None
    assert auditor.skip_reason == "fewer than 2 canaries have taken part"
    assert any("no estimate" in m for _, m in warnings)
    summary = auditor.summary()
    assert all(e["status"].startswith("skipped: fewer than 2") for e in summary["estimates"].values())


def test_one_release_of_the_gaussian_mechanism_is_estimated_near_its_epsilon():
    """Every canary once, in one release: the final-model cosines of the observed canaries are
    about N(1/(z sqrt(d)), 1/d) against N(0, 1/d), mu = 1/z; the estimate is near the analytic
    epsilon and the valid lower bound below it."""
    z = 0.5
    auditor, backend, _ = _auditor(k=500, z=z)
    backend.step(np.arange(500))
    report = auditor.report(step=1)
    truth = gaussian_epsilon(z, 1e-5)
    assert report.epsilon_analytic == pytest.approx(truth)
    assert 0.7 * truth < report.value("epsilon_final_model") < 1.3 * truth
    assert report.value("epsilon_lower_bound_final_model") < truth
    assert report.num_canaries_participated == 500 and report.max_participations == 1
    # one release: all iterates is the same release
    assert report.value("epsilon_all_iterates") == pytest.approx(report.value("epsilon_final_model"), rel=0.05)


def test_a_stronger_mechanism_gives_a_smaller_estimate():
    weak, wb, _ = _auditor(k=400, z=0.5, seed=1)
    strong, sb, _ = _auditor(k=400, z=2.0, seed=1)
    wb.step(np.arange(400))
    sb.step(np.arange(400))
    assert strong.report().value("epsilon_final_model") < weak.report().value("epsilon_final_model")


def test_non_finite_release_is_skipped_and_counted():
    auditor, backend, warnings = _auditor()
    auditor.release(torch.full((backend.dim,), math.nan), np.array([0, 1]), what="round 1")
    assert auditor.stats.rounds_skipped == 1
    assert auditor.participations[:2].tolist() == [1, 1]  # the release happened
    # nothing is read back per release: the warning comes with the next estimate or
    # summary, naming the release
    assert not any(key == "nan" for key, _ in warnings)
    assert auditor.summary()["inputs"]["rounds_skipped_non_finite"] == 1
    assert [m for key, m in warnings if key == "nan"] == [
        "Test: round 1 produced a model delta with NaN or inf; it is skipped by the all-iterates statistic"]


def test_state_round_trip_and_identity_check():
    auditor, backend, _ = _auditor(k=100)
    for _ in range(3):
        backend.step(np.arange(0, 100, 2))
    state = auditor.state_dict()
    other, _, _ = _auditor(k=100)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.participations, auditor.participations)
    torch.testing.assert_close(other.stats.max_cos, auditor.stats.max_cos)
    # the resumed series never reuses an index a point after the checkpoint may have spent
    assert other.logged_points == auditor.logged_points + 1
    wrong, _, _ = _auditor(k=100, seed=3)
    with pytest.raises(ValueError, match="seed=0.*this one 3"):
        wrong.load_state_dict(state)


def test_log_writes_each_report_once_and_the_layout_is_anchored():
    auditor, backend, _ = _auditor(k=50)
    backend.step(np.arange(50))

    class Sink:
        def __init__(self):
            self.calls = []

        def scalars(self, values, step):
            self.calls.append(("scalars", step, values))

        def histograms(self, values, step):
            self.calls.append(("histograms", step, values))

        def figures(self, figures, step):
            self.calls.append(("figures", step, sorted(figures)))

        def layout(self, layout):
            self.calls.append(("layout", layout))

    sink = Sink()
    auditor.update(sink, step=7)
    auditor.update(sink, step=7)  # the same round: not logged again
    assert [c[0] for c in sink.calls] == ["scalars", "histograms"]
    scalars = sink.calls[0][2]
    assert set(scalars) == {q.tag for q in names.family("audit")}
    layout = auditor.layout()
    drawn = [tag for section in layout.values() for chart in section.values() for tag in chart[1]]
    assert all(t.startswith("^") and t.endswith("$") for t in drawn if "audit/" in t)
    assert "^audit/epsilon_analytic_rdp$" not in drawn  # this backend gives no RDP epsilon


@pytest.mark.parametrize("kwargs, name", [
    ({"num_canaries": 2.5}, "num_canaries"), ({"num_canaries": True}, "num_canaries"),
    ({"num_canaries": "10"}, "num_canaries"), ({"num_canaries": 1}, "num_canaries"),
    ({"seed": -1}, "seed"), ({"seed": True}, "seed"), ({"seed": math.inf}, "seed"),
    ({"bootstrap": 0.5}, "bootstrap"), ({"max_buffered_rounds": -5}, "max_buffered_rounds"),
    ({"alpha": 1.0}, "alpha"), ({"delta": 0.0}, "delta"), ({"canaries": "uniform"}, "canaries"),
    ({"sample_rate": 1.5}, "sample_rate"), ({"repeats": 0}, "repeats"),
])
def test_both_front_ends_share_one_validating_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CanaryAuditConfig(**kwargs)
    with pytest.raises(ValueError, match=name):
        CanaryAudit(**kwargs)
    pytest.importorskip("flwr")
    from flwr.serverapp.strategy import FedAvg

    from audit_callbacks.flower import CanaryStrategy

    with pytest.raises(ValueError, match=name):
        CanaryStrategy(FedAvg(), noise_multiplier=1.0, clip_norm=1.0, log_dir=None, **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    ({"every_n_epochs": 1.5}, "every_n_epochs"), ({"every_n_epochs": 0}, "every_n_epochs"),
    ({"log_histograms": "yes"}, "log_histograms"), ({"log_figures": None}, "log_figures"),
])
def test_canary_audit_checks_its_own_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CanaryAudit(**kwargs)


def test_flower_import_loads_neither_lightning_nor_opacus():
    pytest.importorskip("flwr")
    code = ("import sys, audit_callbacks.flower, audit_callbacks.auditing\n"
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'opacus') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_name_table_is_one_name_per_quantity():
    """Every family has a section title; tags are unique; a lower bound is always called
    ``epsilon..._lower_bound...`` (never ``epsilon_lo``, ``lb``); every chart's tags are
    anchored and registered."""
    tags = [q.tag for q in names.QUANTITIES]
    assert len(tags) == len(set(tags))
    for q in names.QUANTITIES:
        assert q.family in names.SECTIONS, q
        assert q.description, q
        assert "epsilon_lo_" not in q.name and "epsilon0_lo_" not in q.name and not q.name.endswith("_lb"), q
        assert names.tag(q.family, q.name) == q.tag
    with pytest.raises(KeyError, match="not in"):
        names.tag("audit", "epsilon_lo_final_model")
    families = sorted({q.family for q in names.QUANTITIES})
    layout = names.chart_layout(families)
    drawn = [t for section in layout.values() for _, (kind, pats) in section.items() for t in pats]
    assert drawn and all(t.startswith("^") and t.endswith("$") for t in drawn)
    unescaped = {t[1:-1].replace("\\", "") for t in drawn}
    assert unescaped <= set(tags)


def test_huge_gaussian_num_unobserved_is_refused_before_any_allocation():
    with pytest.raises(ValueError, match=r"num_unobserved=1000000000.*canaries='hadamard'"):
        CanaryAuditConfig(50, 10**9, canaries="gaussian")
    with pytest.raises(ValueError, match="num_unobserved"):
        CanaryAudit(num_unobserved=10**9, canaries="gaussian")
    with pytest.raises(ValueError, match=r"num_canaries=20000000"):
        CanaryAuditConfig(2 * 10**7, canaries="gaussian")  # k' defaults to k
    CanaryAuditConfig(50, 10**9 // 100, canaries="hadamard")  # Hadamard cost does not grow with k'


def test_a_costly_gaussian_audit_warns_naming_num_unobserved():
    backend = SimulatedBackend(100_000, 1.0)
    warnings: list[tuple[str, str]] = []
    CanaryAuditor(CanaryAuditConfig(10, 200_000, canaries="gaussian"), backend,
                  lambda key, msg: warnings.append((key, msg)), name="Test")
    assert [key for key, _ in warnings] == ["cost"]
    assert "num_unobserved=200000" in warnings[0][1]


def test_too_many_hadamard_canaries_name_both_counts_and_the_fix():
    with pytest.raises(ValueError, match=r"num_canaries=100 .*num_unobserved=4000 .*k \+ k' = 4100.*"
                                         r"n = 4096.*num_canaries \+ num_unobserved <= 4096"):
        CanaryAuditor(CanaryAuditConfig(100, 4000), SimulatedBackend(4096, 1.0), lambda k, m: None,
                      name="Test")


def test_a_one_example_population_refuses_the_default_k_by_name():
    class OneExample(SimulatedBackend):
        def __init__(self):
            super().__init__(4096, 1.0)
            self.population = 1

    with pytest.raises(ValueError, match=r"num_canaries=None resolves to 1 .*population 1.*"
                                         r"num_canaries=2 or more"):
        CanaryAuditor(CanaryAuditConfig(), OneExample(), lambda k, m: None, name="Test")
    CanaryAuditor(CanaryAuditConfig(2), OneExample(), lambda k, m: None, name="Test")  # explicit k


def test_tensorboard_last_verdict_sentences_are_the_summarys(tmp_path):
    """Each verdict sentence TensorBoard holds last (``audit/verdict_<tm>_sentence``) is the
    summary's: the fit-end report (bounds at plain alpha) writes its sentences where they
    differ from the last logged point's (bounds at the level spent for that point); before,
    the Text tab kept quoting the watched bound while the summary and the report quoted the
    fit-end one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from audit_callbacks.auditing.sinks import WriterSink

    auditor, backend, _ = _auditor(k=200, z=1.0, bootstrap=0)
    sink = WriterSink(log_dir=str(tmp_path))
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        backend.step(np.flatnonzero(rng.random(200) < 0.5))
        auditor.update(sink, step=step)
    path = auditor.finish(sink, step=4, directory=str(tmp_path), figures=False, histograms=False)
    sink.close()
    with open(path, encoding="utf-8") as fh:
        summary = json.load(fh)
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    rewritten = 0
    for key in (f"verdict_{tm}_sentence" for tm in ("final_model", "all_iterates", "mechanism")):
        events = acc.Tensors(f"{names.FAMILY_AUDIT}/{key}/text_summary")
        assert events[-1].step == 4
        assert events[-1].tensor_proto.string_val[0].decode() == summary[key], key
        rewritten += len(events) - 4  # a fifth entry: the fit end changed that sentence
    # the all-iterates bound at plain alpha differs from the last watched point's, so at least
    # that sentence was written again (else this test could not fail)
    bound = summary["results"][names.EPSILON_LOWER_BOUND_ALL_ITERATES]["value"]
    watched = acc.Scalars(f"{names.FAMILY_AUDIT}/{names.EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED}")[-1].value
    assert f"{bound:.4g}" != f"{watched:.4g}" and rewritten >= 1
