"""The known-rounds all-iterates statistic of DP-FedAvg on a simulated mechanism:
the recovered aggregate, the scores' laws under both hypotheses, the estimate against the
analytic epsilon, and the last-iterate shifts against their closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from audit_callbacks.canary.known_rounds import KnownRoundScores
from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.estimators import gaussian_epsilon

DIM = 4096


def simulate(k=400, k_un=2000, rounds=60, q=0.1, z=1.0, m=20, clip=1.0, lr=1.0, beta=0.0,
             seed=0, scale=1.0):
    """DP-FedAvg's release with only canary clients in the cohort (plus noise): each observed
    canary joins a round with probability q; the noisy average ``(scale C sum c_j + N(0, (z C)^2
    I)) / m`` drives the server's SGD with momentum. ``scale`` plants a clipping bug."""
    cs = CanarySet(seed, DIM, k + k_un, kind="hadamard")
    stats = KnownRoundScores(cs, k, clip_norm=clip, divisor=m, noise_multiplier=z, server_lr=lr,
                             server_momentum=beta)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    buf = torch.zeros(DIM, dtype=torch.float64)
    averages, participations = [], np.zeros(k, dtype=np.int64)
    for _ in range(rounds):
        joined = np.flatnonzero(rng.random(k) < q)
        signal = cs.sum(joined.tolist()).to(torch.float64) * clip * scale if joined.size else 0.0
        avg = (signal + torch.randn(DIM, generator=gen, dtype=torch.float64) * z * clip) / m
        buf = beta * buf + avg
        stats.update((lr * buf).to(torch.float32), joined)
        averages.append(avg)
        participations[joined] += 1
    return stats, participations, averages


def test_recovered_aggregate_undoes_server_lr_and_momentum():
    cs = CanarySet(0, DIM, 10, kind="hadamard")
    stats = KnownRoundScores(cs, 5, clip_norm=1.0, divisor=4, noise_multiplier=1.0, server_lr=0.5,
                             server_momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    buf = torch.zeros(DIM, dtype=torch.float64)
    for _ in range(5):
        avg = torch.randn(DIM, generator=gen, dtype=torch.float64)
        buf = 0.9 * buf + avg
        delta = 0.5 * buf
        torch.testing.assert_close(stats.aggregate(delta), avg, rtol=1e-9, atol=1e-9)
        stats.update(delta, np.array([0]))


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_scores_follow_their_laws_under_both_hypotheses(beta):
    z = 1.0
    stats, parts, _ = simulate(z=z, beta=beta, lr=0.7)
    obs, unobs = stats.scores()
    took = parts[parts > 0]
    assert obs.size == took.size
    # observed: N(sqrt(r_j) / z, 1); unobserved: N(0, 1)
    resid = obs - np.sqrt(took) / z
    assert abs(resid.mean()) < 4 / math.sqrt(obs.size) + 0.02
    assert abs(resid.std() - 1) < 0.1
    assert abs(unobs.mean()) < 4 / math.sqrt(unobs.size)
    assert abs(unobs.std() - 1) < 0.06


def test_estimate_approaches_the_analytic_epsilon_and_sees_a_clipping_bug():
    z, delta = 1.0, 1e-6
    stats, parts, _ = simulate(z=z, rounds=80)
    r_max = int(parts.max())
    analytic = gaussian_epsilon(z, delta, compositions=r_max)
    est = stats.estimate(delta, bootstrap=100, seed=0)
    assert 0.9 * analytic < est.value < 1.1 * analytic, (est.value, analytic)
    assert est.lower < analytic < est.upper
    assert est.details["per_round_mu"] == pytest.approx(1 / z, rel=0.08)
    buggy, bparts, _ = simulate(z=z, rounds=80, scale=2.0)  # canaries clipped at 2C
    assert buggy.estimate(delta).value > 1.5 * gaussian_epsilon(z, delta, compositions=int(bparts.max()))


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_last_iterate_shifts_match_their_closed_form(beta):
    stats, parts, _ = simulate(rounds=30, beta=beta)
    T = stats.rounds
    w = np.array([(1 - beta ** (T - t + 1)) / (1 - beta) if beta else 1.0 for t in range(1, T + 1)])
    # rebuild each canary's rounds from a second simulation's participations
    rng = np.random.default_rng(0)
    member = np.zeros((T, 400), dtype=bool)
    for t in range(T):
        member[t] = rng.random(400) < 0.1
    took = member.sum(0) > 0
    expected = (w @ member)[took] / (1.0 * math.sqrt((w ** 2).sum()))
    np.testing.assert_allclose(stats.last_iterate_shifts(), expected, rtol=1e-9)


def test_state_round_trip_and_a_non_finite_round():
    stats, _, _ = simulate(rounds=5)
    copy = KnownRoundScores(stats.canaries, stats.k, clip_norm=1.0, divisor=20, noise_multiplier=1.0)
    copy.load_state_dict(stats.state_dict())
    for a, b in zip(stats.scores(), copy.scores(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not copy.update(torch.full((DIM,), math.nan), np.array([0]))
    assert copy.skipped == 1 and copy.rounds == stats.rounds
    # another release (noise, clip, cohort, server step): refused, naming the setting
    for kw, name in ((dict(noise_multiplier=2.0), "noise_multiplier=1.0"), (dict(clip_norm=0.5), "clip_norm=1.0"),
                     (dict(divisor=2), "divisor=20")):
        other = KnownRoundScores(stats.canaries, stats.k, **{**dict(clip_norm=1.0, divisor=20, noise_multiplier=1.0),
                                                              **kw})
        with pytest.raises(ValueError, match=name):
            other.load_state_dict(stats.state_dict())
    bad = KnownRoundScores(CanarySet(0, DIM, 10, kind="hadamard"), 5, clip_norm=1.0, divisor=20,
                           noise_multiplier=1.0)
    with pytest.raises(ValueError, match="sums"):
        bad.load_state_dict(stats.state_dict())


def _momentum_run():
    """Digits over 40 clients, 10 a round, server SGD with momentum 0.9 and learning rate 0.7,
    a callback that keeps every round object, and a CanaryAudit: ``(dm, module, capture, audit)``."""
    import lightning.pytorch as pl

    from audit_callbacks.callbacks import CanaryAudit
    from audit_callbacks.federated import DPFedAvg, FederatedAuditHooks
    from datamodules import FederatedDataModule
    from models import MLP

    class Capture(FederatedAuditHooks, pl.Callback):
        def __init__(self):
            self.rounds = []

        def on_federated_round_end(self, trainer, pl_module, fl_round):
            self.rounds.append(fl_round)

    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(32,)), clients_per_round=10, noise_multiplier=0.5,
                      clip_norm=1.0, local_lr=0.1, local_batch_size=8, server_lr=0.7,
                      server_momentum=0.9, seed=0, delta=1e-5)
    return dm, module, Capture(), CanaryAudit(20, 200, seed=0, bootstrap=0)


def test_the_recovered_aggregate_is_dpfedavgs_noisy_average(tmp_path):
    """Through a real DPFedAvg run with server momentum 0.9 and learning rate 0.7: the average
    recovered from consecutive model deltas equals the noisy average the server applied; and
    CanaryAudit's known-rounds statistic is fed every round."""
    from tests._federated import fit

    dm, module, capture, audit = _momentum_run()
    fit(dm, module, [capture, audit], 6, tmp_path, logger=False)
    stats = KnownRoundScores(CanarySet(0, module.num_parameters, 4, kind="hadamard"), 2,
                             clip_norm=1.0, divisor=10, noise_multiplier=0.5, server_lr=0.7,
                             server_momentum=0.9)
    for fl_round in capture.rounds:
        delta, average = fl_round.model_delta, fl_round.average
        torch.testing.assert_close(stats.aggregate(delta), average.to(torch.float64), rtol=1e-4, atol=1e-6)
        stats.update(delta, None)
    assert audit.auditor.matched.rounds == 6
    assert audit.last_report.value("epsilon_all_iterates_matched") is not None


def test_a_repeated_fit_restarts_the_momentum_recovery(tmp_path):
    """A second ``fit`` of the same module and callback builds a new server optimizer (empty
    momentum buffer): the known-rounds sums must stay those of the true noisy averages."""
    from tests._federated import fit

    dm, module, capture, audit = _momentum_run()
    fit(dm, module, [capture, audit], 4, tmp_path / "a", logger=False)
    fit(dm, module, [capture, audit], 4, tmp_path / "b", logger=False)
    stats = audit.auditor.matched
    assert stats.rounds == len(capture.rounds) == 8
    direct = np.zeros_like(stats.sums)
    for fl_round in capture.rounds:
        joined = fl_round.cohort.virtual_ids.get(audit.backend.name)
        y = stats.canaries.dots(fl_round.average.to(torch.float32)).cpu().numpy() * (10 / 1.0)
        idx = np.asarray([] if joined is None else joined, dtype=np.int64)
        np.add.at(direct, idx, y[idx])
        direct[stats.k:] += y[stats.k:]
    np.testing.assert_allclose(stats.sums, direct, rtol=1e-3, atol=1e-3)
