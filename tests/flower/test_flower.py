"""CanaryStrategy through Flower's own strategies and DP wrappers, on an in-process grid.

Every run here is Flower's ``Strategy.start`` loop (FedAvg sampling, the DP wrapper's clipping
and noise, FedAvg's aggregation) over ``LocalGrid`` nodes; the real runtimes are exercised by
``test_flower_deployment.py``.
"""

from __future__ import annotations

import json
import logging
import math
import random
from importlib import metadata

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from scipy import stats  # noqa: E402

from audit_callbacks import names  # noqa: E402
from audit_callbacks.flower import CanaryStrategy, LocalGrid  # noqa: E402

D_IN, D_OUT = 100, 4  # a linear model: d = 100 * 4 + 4 = 404 parameters


def _model(with_int: bool = False) -> ArrayRecord:
    """The global model; ``with_int`` adds an int64 array (outside d; Flower's DP wrappers
    cannot clip integer arrays, so only without them)."""
    rng = np.random.default_rng(0)
    arrays = {"w": Array(rng.normal(0, 0.1, (D_OUT, D_IN)).astype(np.float32)),
              "b": Array(np.zeros(D_OUT, np.float32))}
    if with_int:
        arrays["steps"] = Array(np.zeros(1, np.int64))
    return ArrayRecord(arrays)


def _client(step: float = 0.05, weight: float = 1.0, fail: set[int] | None = None,
            bad: set[int] | None = None):
    """Node i moves the model toward a fixed random target of its own (a data-driven update)."""
    targets = {}

    def handler(msg, i):
        if fail and i in fail:
            raise RuntimeError(f"node {i} crashed")
        arrays = msg.content["arrays"]
        if i not in targets:
            targets[i] = np.random.default_rng(100 + i).normal(0, 1, (D_OUT, D_IN)).astype(np.float32)
        w = arrays["w"].numpy()
        out = {"w": Array((w + step * (targets[i] - w)).astype(np.float32)),
               "b": Array(arrays["b"].numpy().copy())}
        if "steps" in arrays:
            out["steps"] = Array(arrays["steps"].numpy() + 1)
        if bad and i in bad:
            out["w"] = Array(np.zeros((3, 3), np.float32))  # not the model's weights
        return RecordDict({"arrays": ArrayRecord(out),
                           "metrics": MetricRecord({"num-examples": weight, "loss": float(i)})})

    return handler


def _run(tmp_path, *, n=20, k=60, fraction=0.2, z=0.5, clip=1.0, rounds=8, handler=None,
         seed=0, dp="server", **kw):
    random.seed(seed)
    np.random.seed(seed)
    inner = FedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=n,
                   min_train_nodes=1)
    m = max(int((n + k) * fraction), 1)
    if dp == "server":
        inner = DifferentialPrivacyServerSideFixedClipping(inner, z, clip, m)
    elif dp == "client":
        inner = DifferentialPrivacyClientSideFixedClipping(inner, z, clip, m)
    else:
        kw.update(noise_multiplier=z, clip_norm=clip)
    kw.setdefault("bootstrap", 20)
    strategy = CanaryStrategy(inner, num_canaries=k, log_dir=str(tmp_path), seed=seed, **kw)
    grid = LocalGrid(n, handler or _client())
    result = strategy.start(grid, _model(with_int=dp is None), num_rounds=rounds)
    return strategy, result, grid


def _finite_estimates(summary):
    for name, est in summary["estimates"].items():
        assert est["status"] == "ok" and math.isfinite(est["value"]), name


def test_summary_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    strategy, result, _ = _run(tmp_path, rounds=6, every_n_rounds=2)
    summary = json.loads((tmp_path / "version_0" / "audit_summary.json").read_text())
    assert summary["callback"] == "CanaryStrategy" and summary["tags"] == {q.name: q.tag for q in names.family("audit")}
    assert summary["versions"]["flwr"] == metadata.version("flwr")
    assert summary["inputs"]["num_canaries"] == 60 and summary["inputs"]["rounds"] == 6
    assert summary["inputs"]["clients_per_round"] == 16
    assert set(summary["estimates"]) >= {"epsilon_final_model", "epsilon_all_iterates"}
    _finite_estimates(summary)
    assert summary["max_participations"] == int(strategy.auditor.participations.max())
    acc = EventAccumulator(str(tmp_path / "version_0")).Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("audit/epsilon_final_model", "audit/epsilon_all_iterates",
                "audit/epsilon_analytic", "audit/num_canaries_participated"):
        assert tag in tags
    assert [e.step for e in acc.Scalars("audit/epsilon_final_model")] == [2, 4, 6]
    assert "audit/cosine_final_observed" in acc.Tags()["histograms"]
    assert not list((tmp_path / "version_0").glob(".audit_summary.json.*"))  # the temp file was renamed
    assert strategy.last_report.progress == 6
    # the checks of the mechanism ran on every floating array of the released model
    assert summary["verdict_mechanism"] == "consistent", summary["verdict_mechanism_sentence"]
    assert summary["results"]["fresh_noise_ratio"]["counts"]["groups"] == len(strategy.auditor.backend.layout.entries)
    assert "audit/noise_scale_ratio" in tags and "audit/verdict_mechanism" in tags


def test_canary_enters_the_clipped_sum_before_the_noise(tmp_path):
    """Real clients that do not move: the release is theta + (C / m) sum_j c_j exactly."""
    seen = []

    class Spy(CanaryStrategy):
        def aggregate_train(self, server_round, replies):
            before = self.backend.theta_prev.clone()
            out = super().aggregate_train(server_round, replies)
            seen.append((before, self.backend.theta.clone(), list(self.backend.last_inserted)))
            return out


    random.seed(1)
    # no DP wrapper: flwr 1.41's clipping divides by the norm of an update, zero here
    inner = FedAvg(fraction_train=0.25, fraction_evaluate=0.0, min_available_nodes=8)
    strategy = Spy(inner, num_canaries=32, noise_multiplier=0.0, clip_norm=2.0, log_dir=None,
                   bootstrap=0)
    strategy.start(LocalGrid(8, _client(step=0.0)), _model(), num_rounds=3)
    canaries = strategy.auditor.stats.canaries
    assert any(inserted for _, _, inserted in seen)
    for before, after, inserted in seen:
        expected = canaries.sum(inserted) * 2.0 / 10 if inserted else torch.zeros_like(before)
        torch.testing.assert_close(after - before, expected, atol=1e-6, rtol=1e-4)


def test_participations_are_binomial(tmp_path):
    # 100 real nodes: a cohort without a real client (whose canaries are not inserted, see
    # test_cohort_without_a_real_client) has probability about 0.9^100
    n, k, fraction, rounds = 100, 300, 0.1, 25
    strategy, _, grid = _run(tmp_path, n=n, k=k, fraction=fraction, rounds=rounds,
                             handler=_client(step=0.0), bootstrap=0, every_n_rounds=100, dp=None,
                             canaries="gaussian")
    q = int((n + k) * fraction) / (n + k)
    assert strategy.backend.inputs["sample_rate"] == pytest.approx(q)
    parts = strategy.auditor.participations
    mean, var = rounds * q, rounds * q * (1 - q)
    assert abs(parts.mean() - mean) < 4 * math.sqrt(var / k)
    # goodness of fit of the counts to Binomial(rounds, q) (bins with small expectation merged)
    observed = np.bincount(parts, minlength=rounds + 1).astype(float)
    expected = stats.binom.pmf(np.arange(rounds + 1), rounds, q) * k
    top = int(np.flatnonzero(expected >= 5).max())
    obs = np.r_[observed[:top], observed[top:].sum()]
    exp = np.r_[expected[:top], expected[top:].sum()]
    low = int(np.flatnonzero(exp >= 5).min())
    obs = np.r_[obs[:low + 1].sum(), obs[low + 1:]]
    exp = np.r_[exp[:low + 1].sum(), exp[low + 1:]]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    # the real nodes were sampled at the same rate
    real = np.bincount(grid.sent, minlength=n + 1)[1:]
    assert abs(real.mean() - mean) < 4 * math.sqrt(var / n) + 1


def test_no_noise_canaries_stand_out(tmp_path):
    strategy, _, _ = _run(tmp_path, z=0.0, rounds=8, bootstrap=0)
    report = strategy.last_report
    s = report.statistics
    null_sd = s["all_unobserved"].std()
    assert s["all_observed"].mean() > s["all_unobserved"].mean() + 5 * null_sd
    assert s["final_observed"].mean() > s["final_unobserved"].mean() + 3 * s["final_unobserved"].std()
    assert report.epsilon_analytic == math.inf  # no noise: infinite analytic epsilon
    assert report.value("epsilon_lower_bound_all_iterates") > 1.0


def test_large_noise_estimate_falls_toward_zero(tmp_path):
    """z = 30: the equal-variance estimates fall to the sampling noise of 60 canaries (about
    0.5, against 9 and 51 at z = 0.3; the analytic epsilon is 0.26) and the lower bounds are 0.
    The unequal-variance fit (Andrew et al.) keeps a floor of about 1.5-3.5 here from the sampling
    noise of 60 canaries' variance ratio, so it is only required to fall far below z = 0.3's."""
    small, _, _ = _run(tmp_path / "small", z=0.3, rounds=8, bootstrap=0)
    large, _, _ = _run(tmp_path / "large", z=30.0, rounds=8, bootstrap=0)
    for name in ("final_model", "all_iterates"):
        assert large.last_report.value(f"epsilon_{name}") < max(0.5, 0.1 * small.last_report.value(f"epsilon_{name}"))
        assert large.last_report.value(f"epsilon_lower_bound_{name}") < 0.1
        assert small.last_report.value(f"epsilon_lower_bound_{name}") > 1.0
    unequal = "epsilon_final_model_unequal_fit"
    assert large.last_report.value(unequal) < 0.3 * small.last_report.value(unequal)
    # the known-rounds statistic: near 0 at z = 30, near the analytic epsilon at z = 0.3
    assert large.last_report.value("epsilon_all_iterates_matched") < 0.5
    ratio = small.last_report.value("epsilon_all_iterates_matched") / small.last_report.epsilon_analytic
    assert 0.5 < ratio < 1.5, ratio


def test_bad_arguments():
    inner = FedAvg()
    with pytest.raises(ValueError, match="clip_norm"):
        CanaryStrategy(inner, noise_multiplier=1.0, clip_norm=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        CanaryStrategy(inner, noise_multiplier=-1.0, clip_norm=1.0)
    with pytest.raises(ValueError, match="no noise_multiplier"):
        CanaryStrategy(inner)
    with pytest.raises(ValueError, match="num_canaries"):
        CanaryStrategy(inner, num_canaries=1, noise_multiplier=1.0, clip_norm=1.0)


def test_failures_and_bad_replies_are_skipped_not_nan(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    # node 0 crashes, node 1 answers with arrays that are not the model: with the DP wrapper
    # (which skips rounds with failures) those rounds count no canary participation
    strategy, _, grid = _run(tmp_path, n=6, k=30, fraction=0.5, rounds=6,
                             handler=_client(fail={0}, bad={1}))
    events = strategy.backend.round_events
    assert any("not aggregated" in e for e in events.values())
    assert "not model weights" in caplog.text and "counted as a failure" in caplog.text
    folded = [r for r, e in events.items() if e.startswith("folded")]
    assert strategy.auditor.stats.rounds_seen == len(folded)
    summary = json.loads((tmp_path / "version_0" / "audit_summary.json").read_text())
    _finite_estimates(summary)
    # without a DP wrapper FedAvg aggregates the valid replies and the canaries
    plain, result, _ = _run(tmp_path / "plain", n=6, k=30, fraction=0.5, rounds=4, dp=None,
                            handler=_client(fail={0}, bad={1}))
    assert plain.auditor.stats.rounds_seen == 4
    assert plain.backend.layout.dim == D_IN * D_OUT + D_OUT  # the int64 array is not audited
    assert "steps" in result.arrays  # carried through (canary clients copy it)


def test_cohort_without_a_real_client(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    # 1 real node among 200 canaries, 2 sampled a round: most rounds have no real client
    strategy, _, _ = _run(tmp_path, n=1, k=200, fraction=0.01, rounds=5, dp=None)
    assert "no valid real reply" in caplog.text
    assert int(strategy.auditor.participations.sum()) <= 5
    summary = json.loads((tmp_path / "version_0" / "audit_summary.json").read_text())
    assert all(e["status"] != "ok" or math.isfinite(e["value"]) for e in summary["estimates"].values())


def test_canaries_over_a_tenth_of_the_nodes_are_warned_about_once(tmp_path, caplog):
    """The one canary-share rule on Flower too: 30 canaries beside 20 real nodes are 60% of every
    cohort (warned once, naming the fix); 2 beside 20 are under 10% (no warning)."""
    caplog.set_level(logging.WARNING, logger="flwr")
    _run(tmp_path / "crowded", n=20, k=30, fraction=0.2, rounds=2)
    said = [r.getMessage() for r in caplog.records if "canary clients" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("CanaryStrategy: 30 canary clients outnumber the 20")
    assert "60% of every cohort" in said[0] and "pass a smaller num_canaries" in said[0]
    caplog.clear()
    _run(tmp_path / "few", n=20, k=2, fraction=0.2, rounds=2)
    assert not [r for r in caplog.records if "canary clients" in r.getMessage()]


def test_client_side_clipping_and_unequal_weights(tmp_path, caplog):
    """Client-side fixed clipping: the clients clip with Flower's ``fixedclipping_mod``, and so
    do the canaries (norm 10 C before it). With z = 0 every released delta is an average of
    updates of norm <= C, so its norm is <= C (the clients' raw updates have norm ~40)."""
    from flwr.app import Message
    from flwr.clientapp.mod import fixedclipping_mod

    caplog.set_level(logging.WARNING, logger="flwr")
    raw = _client(step=2.0)

    def clipped(msg, i):
        reply = fixedclipping_mod(msg, None, lambda m, ctx: Message(raw(m, i), reply_to=m))
        if reply.has_error():
            raise RuntimeError(reply.error.reason)
        return reply.content

    deltas = []

    class Spy(CanaryStrategy):
        def aggregate_train(self, server_round, replies):
            before = self.backend.theta_prev.clone()
            out = super().aggregate_train(server_round, replies)
            deltas.append(float(torch.linalg.vector_norm(self.backend.theta - before)))
            return out

    random.seed(0)
    inner = DifferentialPrivacyClientSideFixedClipping(
        FedAvg(fraction_train=0.2, fraction_evaluate=0.0, min_available_nodes=20), 0.0, 1.0, 16)
    strategy = Spy(inner, num_canaries=60, log_dir=None, bootstrap=0)
    strategy.start(LocalGrid(20, clipped), _model(), num_rounds=4)
    assert strategy.auditor.stats.rounds_seen == 4 and strategy.auditor.participations.sum() > 0
    assert max(deltas) <= 1.0 + 1e-4 and min(deltas) > 0.05
    # unclipped, the same clients move the model much further
    unclipped, _, _ = _run(tmp_path / "raw", rounds=1, handler=raw, dp=None, z=0.0)
    assert float(torch.linalg.vector_norm(unclipped.backend.theta - unclipped.auditor.stats.theta0)) > 1.5

    def weighted(msg, i):
        out = _client()(msg, i)
        out["metrics"]["num-examples"] = float(i + 1)
        return out

    _run(tmp_path / "w", rounds=2, handler=weighted)
    assert "unequal 'num-examples'" in caplog.text


def test_dp_wrapper_outside_is_detected(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    random.seed(0)
    inner = CanaryStrategy(FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=4),
                           num_canaries=8, noise_multiplier=1.0, clip_norm=1.0, log_dir=None,
                           bootstrap=0)
    outer = DifferentialPrivacyServerSideFixedClipping(inner, 1.0, 1.0, 6)
    outer.start(LocalGrid(4, _client()), _model(), num_rounds=2)
    assert "not the one this wrapper released" in caplog.text


def test_state_round_trip_and_resume(tmp_path):
    first, result, _ = _run(tmp_path / "a", rounds=4, bootstrap=0)
    state = first.state_dict()
    second = CanaryStrategy(
        DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_train=0.2, fraction_evaluate=0.0, min_available_nodes=20), 0.5, 1.0, 16),
        num_canaries=60, log_dir=str(tmp_path / "b"), bootstrap=0)
    second.load_state_dict(state)
    second.start(LocalGrid(20, _client()), result.arrays, num_rounds=1)
    assert second.backend.rounds == 5
    assert second.auditor.stats.rounds_seen == 5
    assert (second.auditor.participations >= first.auditor.participations).all()
    torch.testing.assert_close(second.auditor.stats.theta0, first.auditor.stats.theta0)
    bad = CanaryStrategy(FedAvg(), num_canaries=61, noise_multiplier=1.0, clip_norm=1.0, log_dir=None)
    bad.load_state_dict(state)
    with pytest.raises(ValueError, match="num_canaries|num_observed|participations"):
        bad.start(LocalGrid(20, _client()), result.arrays, num_rounds=1)
    # another noise multiplier or clip norm: the sums are in units of the checkpoint's clipped
    # update and noise (the noise check read a correct run as a violation, the claim dropped
    # the rounds before the resume): refused, naming the setting
    for z, clip, name in ((2.0, 1.0, "noise_multiplier=0.5"), (0.5, 0.25, "clip_norm=1.0")):
        other = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_train=0.2, fraction_evaluate=0.0, min_available_nodes=20), z, clip, 16),
            num_canaries=60, log_dir=None, bootstrap=0)
        other.load_state_dict(state)
        with pytest.raises(ValueError, match=name):
            other.start(LocalGrid(20, _client()), result.arrays, num_rounds=1)


def test_evaluate_fn_accuracy_is_logged(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    random.seed(0)
    inner = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=4), 0.5, 1.0, 8)
    strategy = CanaryStrategy(inner, num_canaries=12, log_dir=str(tmp_path), bootstrap=0)
    strategy.start(LocalGrid(4, _client()), _model(), num_rounds=3,
                   evaluate_fn=lambda rnd, arrays: MetricRecord({"accuracy": 0.1 * rnd}))
    acc = EventAccumulator(str(tmp_path / "version_0")).Reload()
    assert [round(e.value, 6) for e in acc.Scalars("val/accuracy")] == [0.0, 0.1, 0.2, 0.3]


def test_unchanged_model_reply_does_not_stop_the_server(tmp_path, caplog):
    """flwr 1.41's server-side clipping divides by the update's norm: a client that returns the
    global model unchanged raises ZeroDivisionError inside the DP wrapper; the round is
    skipped with a logged reason instead of stopping the server app."""
    caplog.set_level(logging.WARNING, logger="flwr")
    strategy, _, _ = _run(tmp_path, n=4, k=8, fraction=0.5, rounds=2, handler=_client(step=0.0))
    assert "ZeroDivisionError" in caplog.text
    assert strategy.auditor.stats.rounds_seen == 0 and strategy.auditor.participations.sum() == 0


def test_library_imports_without_flwr():
    """With flwr unimportable the library and CanaryAudit import; audit_callbacks.flower raises
    an ImportError that says how to install the extra."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['flwr'] = None\n"
            "import audit_callbacks, audit_callbacks.callbacks, audit_callbacks.estimators\n"
            "from audit_callbacks.callbacks import CanaryAudit\n"
            "try:\n    import audit_callbacks.flower\nexcept ImportError as err:\n"
            "    print('IMPORT-ERROR', err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'IMPORT-ERROR audit_callbacks.flower needs Flower: pip install "audit-callbacks[flower]"' \
        in out.stdout


def test_accounted_dp_wrapper_counts_the_canaries_in_its_cohort(tmp_path):
    """Flower's accounted mode (``accountant=``) requires exactly num_sampled_clients messages
    and replies with equal weights: with CanaryStrategy outside, the cohort it checks holds the
    canaries, and every round is composed once (a counting accountant stands in for Flower's
    RDP one, whose dp-accounting dependency is not installed here)."""
    from flwr.supercore.privacy_accounting import (
        NeighboringRelation,
        PrivacyConfig,
        PrivacySpent,
        SamplingMethod,
    )

    n, k, fraction = 20, 60, 0.2
    m = int((n + k) * fraction)

    class Counting:
        def __init__(self) -> None:
            self.config = PrivacyConfig(1e-6, n + k, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                        SamplingMethod.NO_AMPLIFICATION)
            self.events = []

        def compose(self, event, count=1):
            self.events.append(event)

        def would_exceed(self, event, max_epsilon=None):
            return False

        def get_privacy_spent(self, delta=None):
            return PrivacySpent(0.0, 1e-6, len(self.events), "counting")

    accountant = Counting()
    random.seed(0)
    np.random.seed(0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=n), 0.5, 1.0,
        m, accountant=accountant)
    strategy = CanaryStrategy(dp, num_canaries=k, log_dir=None, bootstrap=0)
    strategy.start(LocalGrid(n, _client()), _model(), num_rounds=3)
    assert [e.sample_size for e in accountant.events] == [m, m, m]
    assert strategy.auditor.stats.rounds_seen == 3 and strategy.auditor.participations.sum() > 0


def test_resume_equals_uninterrupted(tmp_path):
    """3 rounds, state_dict, a new strategy resumed for 3 more rounds (Python's and numpy's
    global generators, which Flower samples and noises with, carried over) gives the
    uninterrupted 6-round run's statistics, participations and model exactly."""
    full, _, _ = _run(tmp_path / "full", rounds=6, bootstrap=0)
    first, result, _ = _run(tmp_path / "a", rounds=3, bootstrap=0)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    second = CanaryStrategy(
        DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_train=0.2, fraction_evaluate=0.0, min_available_nodes=20,
                   min_train_nodes=1), 0.5, 1.0, 16),
        num_canaries=60, log_dir=str(tmp_path / "b"), bootstrap=0)
    second.load_state_dict(first.state_dict())
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    second.start(LocalGrid(20, _client()), result.arrays, num_rounds=3)
    assert second.backend.rounds == 6
    np.testing.assert_array_equal(second.auditor.participations, full.auditor.participations)
    assert torch.equal(second.backend.theta, full.backend.theta)
    assert torch.equal(second.auditor.stats.max_cos, full.auditor.stats.max_cos)
    a, b = second.compute(), full.compute()
    assert a.estimates["epsilon_final_model"].value == b.estimates["epsilon_final_model"].value
    assert a.estimates["epsilon_all_iterates"].value == b.estimates["epsilon_all_iterates"].value


def test_an_error_in_the_audit_does_not_stop_training(tmp_path, caplog, monkeypatch):
    from audit_callbacks.auditing import CanaryAuditor

    caplog.set_level(logging.WARNING, logger="flwr")

    def broken(self, *, bootstrap=0, step=0, index=None):
        raise RuntimeError("estimator broke")

    monkeypatch.setattr(CanaryAuditor, "report", broken)
    strategy, result, _ = _run(tmp_path, rounds=3)
    assert strategy.backend.rounds == 3 and strategy.auditor.stats.rounds_seen == 3
    assert "no estimate after 3 rounds (steps) (RuntimeError: estimator broke)" in caplog.text
    summary = json.loads((tmp_path / "version_0" / "audit_summary.json").read_text())
    assert all(e["status"].startswith("skipped") for e in summary["estimates"].values())


@pytest.mark.parametrize("name", ["FedProx", "FedAvgM", "FedAdam"])
def test_other_fedavg_style_strategies(tmp_path, name):
    """The sampling and the canary replies go through FedAvg's subclasses too; the released
    model (after FedAvgM's momentum or FedAdam's server step) is what the statistics fold."""
    import flwr.serverapp.strategy as strategies

    kwargs = {"FedProx": {"proximal_mu": 0.1}, "FedAvgM": {"server_momentum": 0.9},
              "FedAdam": {"eta": 0.05}}[name]
    random.seed(0)
    np.random.seed(0)
    inner = getattr(strategies, name)(fraction_train=0.5, fraction_evaluate=0.0,
                                      min_available_nodes=8, **kwargs)
    strategy = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(inner, 0.5, 1.0, 20),
                              num_canaries=32, log_dir=None, bootstrap=0)
    result = strategy.start(LocalGrid(8, _client()), _model(), num_rounds=3)
    assert strategy.auditor.stats.rounds_seen == 3 and strategy.auditor.participations.sum() > 0
    flat = strategy.backend.layout.flatten(result.arrays)
    assert torch.equal(flat, strategy.backend.theta)


def test_two_runs_into_one_log_dir_keep_both_summaries(tmp_path):
    """Runs are versioned like Lightning's, never mixed."""
    import os

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first, _, _ = _run(tmp_path, rounds=2, bootstrap=0)
    second, _, _ = _run(tmp_path, rounds=2, bootstrap=0, seed=1)
    assert first.summary_path != second.summary_path
    assert first.summary_path.endswith(os.path.join("version_0", "audit_summary.json"))
    assert second.summary_path.endswith(os.path.join("version_1", "audit_summary.json"))
    for strategy in (first, second):
        summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
        assert summary["inputs"]["seed"] == strategy.config.seed
    # the density figures of the canary cosines reach TensorBoard, as with CanaryAudit
    acc = EventAccumulator(str(tmp_path / "version_0")).Reload()
    assert "audit/cosine_density_final_model" in acc.Tags()["images"]


def test_a_second_start_continues_the_run_into_a_version_of_its_own(tmp_path):
    """``start`` again on the same strategy goes on as a resume does: rounds, plan, round events
    and TensorBoard steps count on from the first start's rounds; the second summary goes to a
    fresh version folder and the first stays as written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first, result, _ = _run(tmp_path, n=4, k=8, fraction=0.5, rounds=3, bootstrap=0)
    first_path = first.summary_path
    first_text = open(first_path, encoding="utf-8").read()
    first.start(LocalGrid(4, _client()), result.arrays, num_rounds=2)
    assert first.backend.rounds == first.auditor.stats.rounds_seen == 5
    assert first.summary_path != first_path and "version_1" in first.summary_path
    assert open(first_path, encoding="utf-8").read() == first_text
    summary = json.loads(open(first.summary_path, encoding="utf-8").read())
    assert summary["inputs"]["rounds"] == 5 and summary["plan_steps"] == 5
    assert set(summary["inputs"]["round_events"]) == {str(r) for r in range(1, 6)}
    tag = summary["tags"][names.EPSILON_ANALYTIC]
    steps = [[e.step for e in EventAccumulator(str(tmp_path / v)).Reload().Scalars(tag)]
             for v in ("version_0", "version_1")]
    assert steps == [[1, 2, 3], [4, 5]]


def test_persistent_round_problems_are_warned_once(tmp_path, caplog):
    """A cohort of 1 node among 2 real and 20 canary nodes is a canary alone in most rounds:
    one warning up front names fraction_train / min_train_nodes, and "no valid real reply" /
    "was not aggregated" are warned once each (every round stays in round_events)."""
    caplog.set_level(logging.WARNING, logger="flwr")
    strategy, _, _ = _run(tmp_path, n=2, k=20, fraction=0.01, rounds=8, bootstrap=0)
    said = [r.getMessage() for r in caplog.records]
    events = strategy.backend.round_events
    skipped = [r for r, e in events.items() if e.startswith("no real reply")]
    assert len(skipped) >= 2  # the problem persists over rounds
    assert sum("no valid real reply" in m for m in said) == 1
    assert sum("was not aggregated" in m for m in said) == 1
    cohort = [m for m in said if "canaries alone fill it" in m]
    assert len(cohort) == 1 and "fraction_train=0.01" in cohort[0] and "min_train_nodes" in cohort[0]
    caplog.clear()
    _run(tmp_path / "big", n=20, k=6, fraction=0.5, rounds=1, bootstrap=0)
    assert not [r for r in caplog.records if "canaries alone fill it" in r.getMessage()]


def test_a_short_cohort_in_every_round_is_warned_once(tmp_path, caplog):
    """The DP wrapper's num_sampled_clients one above the cohort: every round's effective noise
    multiplier is below z (each in the summary's short_rounds), warned once."""
    caplog.set_level(logging.WARNING, logger="flwr")
    random.seed(0)
    np.random.seed(0)
    inner = FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=4)
    strategy = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(inner, 0.5, 1.0, 7),
                              num_canaries=8, log_dir=str(tmp_path), bootstrap=0)
    strategy.start(LocalGrid(4, _client()), _model(), num_rounds=4)
    summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
    assert set(summary["inputs"]["short_rounds"]) == {"1", "2", "3", "4"}
    assert sum("effective noise multiplier" in r.getMessage() for r in caplog.records) == 1


def test_strategy_unknown_keywords_and_num_rounds_are_checked():
    """ValueError naming the argument: a strategy that is not a Flower Strategy instance, an
    unknown keyword, a start's num_rounds that is not an integer >= 1 (before any round)."""
    for bad in (None, FedAvg, "fedavg"):
        with pytest.raises(ValueError, match="strategy must be a Flower Strategy"):
            CanaryStrategy(bad, num_canaries=4, noise_multiplier=1.0, clip_norm=1.0, log_dir=None)
    with pytest.raises(ValueError, match="unknown argument foo"):
        CanaryStrategy(FedAvg(), num_canaries=4, noise_multiplier=1.0, clip_norm=1.0,
                       log_dir=None, foo=1)
    for bad in (0, -1, 2.7, True):
        strategy = CanaryStrategy(FedAvg(fraction_train=0.5, fraction_evaluate=0.0),
                                  num_canaries=4, noise_multiplier=1.0, clip_norm=1.0, log_dir=None)
        with pytest.raises(ValueError, match="num_rounds"):
            strategy.start(LocalGrid(4, _client()), _model(), num_rounds=bad)
        assert strategy.auditor is None
