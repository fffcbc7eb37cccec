"""CanaryStrategy under the faults of a real Flower deployment, and canaries through the DP
wrapper's real clipping (issues 25 item 2, 26 items 1 and 3), on the in-process grid.

* a canary update of norm M C (M = ``canary_norm_multiplier``) is clipped by the code that
  clips the real replies: its contribution to the aggregate is C c_j; with a planted DP
  wrapper that clips at 2C it is 2C c_j (server-side and client-side clipping);
* a node that dies (its replies never arrive): the analytic epsilon composes the effective
  noise multiplier z n' / m of the short rounds, and the summary's status names them;
* a client reporting a weight far above the others flags every estimate; a NaN, inf or
  negative ``num-examples`` drops that reply and never stops the server;
* waiting for nodes ends with a ``TimeoutError`` (a SuperLink that restarted);
* no seed the summary logs regenerates the DP wrapper's noise.
"""

from __future__ import annotations

import json
import logging
import math
import random

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

from audit_callbacks.estimators import gaussian_epsilon  # noqa: E402
from audit_callbacks.flower import CanaryStrategy, LocalGrid  # noqa: E402

D_IN, D_OUT = 50, 4  # d = 204


def _model() -> ArrayRecord:
    rng = np.random.default_rng(0)
    return ArrayRecord({"w": Array(rng.normal(0, 0.1, (D_OUT, D_IN)).astype(np.float32)),
                        "b": Array(np.zeros(D_OUT, np.float32))})


U = np.random.default_rng(7).normal(0, 1, (D_OUT, D_IN)).astype(np.float32)
U *= 0.1 / np.linalg.norm(U)  # every real client's update: norm 0.1 < C, never clipped


def _fixed_update(weight=lambda i: 1.0):
    """Node i returns the model plus U (a known update of norm 0.1) with weight ``weight(i)``."""
    def handler(msg, i):
        arrays = msg.content["arrays"]
        out = ArrayRecord({"w": Array(arrays["w"].numpy() + U), "b": Array(arrays["b"].numpy().copy())})
        return RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": weight(i)})})
    return handler


class ServerClip2C(DifferentialPrivacyServerSideFixedClipping):
    """A planted bug: clips the replies at 2C, noises (and advertises) C."""

    def aggregate_train(self, server_round, replies):
        claimed, self.clipping_norm = self.clipping_norm, 2 * self.clipping_norm
        self._claimed = claimed
        try:
            return super().aggregate_train(server_round, replies)
        finally:
            self.clipping_norm = claimed

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays):
        clip, self.clipping_norm = self.clipping_norm, self._claimed
        try:
            return super()._add_noise_to_aggregated_arrays(aggregated_arrays)
        finally:
            self.clipping_norm = clip


class ClientClip2C(DifferentialPrivacyClientSideFixedClipping):
    """A planted bug: tells the clients to clip at 2C, noises (and advertises) C."""

    def configure_train(self, server_round, arrays, config, grid):
        claimed, self.clipping_norm = self.clipping_norm, 2 * self.clipping_norm
        try:
            return super().configure_train(server_round, arrays, config, grid)
        finally:
            self.clipping_norm = claimed


def _client_side(handler):
    """The clients clip in Flower's own ``fixedclipping_mod``."""
    from flwr.clientapp.mod import fixedclipping_mod

    def clipped(msg, i):
        reply = fixedclipping_mod(msg, None, lambda m, ctx: Message(handler(m, i), reply_to=m))
        assert not reply.has_error(), reply.error.reason
        return reply.content
    return clipped


@pytest.mark.parametrize(("wrapper", "multiplier", "factor"), [
    (DifferentialPrivacyServerSideFixedClipping, 10.0, 1.0),
    (ServerClip2C, 10.0, 2.0),
    (DifferentialPrivacyClientSideFixedClipping, 10.0, 1.0),
    (ClientClip2C, 10.0, 2.0),
    (ServerClip2C, 1.0, 1.0),  # a canary of norm C (the old insertion) cannot see the bug
])
def test_canary_contribution_is_the_clipped_norm(wrapper, multiplier, factor):
    """z = 0, every real reply the known update U (unclipped): in each round
    m (theta_t - theta_{t-1}) - (real replies) U = factor * C * sum_j c_j over the inserted
    canaries, factor 1 with correct clipping and 2 with the planted 2C clipping."""
    n, k, clip = 8, 24, 1.5
    seen = []

    class Spy(CanaryStrategy):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            before = self.backend.theta_prev.clone()
            out = super().aggregate_train(server_round, replies)
            seen.append((before, self.backend.theta.clone(), list(self.backend.last_inserted), len(replies)))
            return out

    random.seed(3)
    m = (n + k) // 2
    inner = wrapper(FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=n), 0.0, clip, m)
    handler = _fixed_update() if "Server" in wrapper.__name__ else _client_side(_fixed_update())
    strategy = Spy(inner, num_canaries=k, log_dir=None, bootstrap=0, canary_norm_multiplier=multiplier)
    strategy.start(LocalGrid(n, handler), _model(), num_rounds=3)
    canaries = strategy.auditor.stats.canaries
    u = torch.from_numpy(np.concatenate([U.reshape(-1), np.zeros(D_OUT, np.float32)]))
    assert sum(len(ins) for _, _, ins, _ in seen) > 10
    for before, after, inserted, n_real in seen:
        contribution = (after - before).double() * m - n_real * u.double()
        expected = factor * clip * canaries.sum(inserted).double()
        torch.testing.assert_close(contribution, expected, atol=2e-4, rtol=1e-4)
    inputs = strategy.backend.summary_inputs()
    assert inputs["canary_norm_multiplier"] == multiplier
    assert ("server-side" in inputs["canary_clipping"]) == ("Server" in wrapper.__name__)


class DroppingGrid(LocalGrid):
    """Nodes in ``dead`` stop answering from train round ``from_round`` on: their replies never
    arrive (no error reply), as when a SuperNode is killed."""

    def __init__(self, num_nodes, handler, dead, from_round):
        super().__init__(num_nodes, handler)
        self.dead, self.from_round, self.train_rounds = set(dead), from_round, 0
        self.dropped: dict[int, int] = {}

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        train = any(m.metadata.message_type.startswith("train") for m in messages)
        self.train_rounds += int(train)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        if not train or self.train_rounds < self.from_round:
            return replies
        keep = [r for r in replies if int(r.metadata.src_node_id) not in self.dead]
        self.dropped[self.train_rounds] = len(replies) - len(keep)
        return keep


def test_a_killed_node_gives_the_effective_noise_multiplier(tmp_path):
    """fraction 1: every client (6 real, 30 canaries) in every round, m = 36; nodes 1 and 2
    die at round 3 of 6: rounds 3-6 aggregate 34 replies under noise for 36, z_eff = z 34/36.
    Each canary is 2/z^2 + 4/z_eff^2 GDP-squared (Dong, Roth, Su 2022)."""
    n, k, z, rounds = 6, 30, 0.5, 6
    random.seed(0)
    np.random.seed(0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), z, 1.0, n + k)
    strategy = CanaryStrategy(dp, num_canaries=k, log_dir=str(tmp_path), bootstrap=0)
    grid = DroppingGrid(n, _fixed_update(), dead={1, 2}, from_round=3)
    strategy.start(grid, _model(), num_rounds=rounds)
    assert grid.dropped == {3: 2, 4: 2, 5: 2, 6: 2}
    summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
    z_eff = z * 34 / 36
    expected = gaussian_epsilon(1.0, 1e-6, sensitivity=math.sqrt(2 / z**2 + 4 / z_eff**2))
    assert summary["epsilon_analytic"] == pytest.approx(expected, rel=1e-9)
    assert summary["epsilon_analytic"] > gaussian_epsilon(z, 1e-6, compositions=rounds) * 1.02
    assert "rounds [3, 4, 5, 6]" in summary["epsilon_analytic_status"]
    assert summary["inputs"]["short_rounds"]["3"] == {
        "replies": 34, "num_sampled_clients": 36, "noise_multiplier_effective": pytest.approx(z_eff)}
    # resumed from a state, the short rounds and each canary's composition carry over
    again = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), z, 1.0, n + k),
        num_canaries=k, log_dir=None, bootstrap=0)
    again.load_state_dict(strategy.state_dict())
    again.start(LocalGrid(n, _fixed_update()), _model(), num_rounds=1)
    mu = math.sqrt(3 / z**2 + 4 / z_eff**2)
    assert again.compute().epsilon_analytic == pytest.approx(gaussian_epsilon(1.0, 1e-6, sensitivity=mu))
    # a state saved before the effective noise was kept: its rounds count at z, a later short
    # round at its z_eff
    from audit_callbacks.flower import FlowerBackend

    with pytest.MonkeyPatch.context() as patch:
        saved = FlowerBackend.state_dict
        patch.setattr(FlowerBackend, "state_dict", lambda self: {
            key: v for key, v in saved(self).items() if key not in ("inverse_variance", "short_rounds")})
        state = again.state_dict()
    legacy = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), z, 1.0, n + k),
        num_canaries=k, log_dir=None, bootstrap=0)
    legacy.load_state_dict(state)
    legacy.start(DroppingGrid(n, _fixed_update(), dead={1, 2}, from_round=1), _model(), num_rounds=1)
    mu = math.sqrt(7 / z**2 + 1 / z_eff**2)
    assert legacy.compute().epsilon_analytic == pytest.approx(gaussian_epsilon(1.0, 1e-6, sensitivity=mu))
    assert list(legacy.backend.short_rounds) == [8]  # rounds count on after the restored ones


def test_a_client_weighted_above_the_others_flags_the_estimates(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    n, k = 6, 30
    random.seed(0)
    np.random.seed(0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), 0.5, 1.0, n + k)
    strategy = CanaryStrategy(dp, num_canaries=k, log_dir=str(tmp_path), bootstrap=0)
    strategy.start(LocalGrid(n, _fixed_update(weight=lambda i: 1e6 if i == 0 else 1.0)), _model(),
                   num_rounds=3)
    summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
    assert "unequal 'num-examples'" in caplog.text
    statuses = {e["status"] for e in summary["estimates"].values()}
    assert all(s.startswith("flagged: unequal client weights in rounds [1, 2, 3]") or
               not s.startswith("ok") for s in statuses), statuses
    assert any(s.startswith("flagged") for s in statuses)
    assert summary["inputs"]["unequal_weight_rounds"]["1"] == pytest.approx(1e6 / ((1e6 + 5) / 6))
    # equal weights: nothing flagged
    plain = CanaryStrategy(DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), 0.5, 1.0, n + k),
        num_canaries=k, log_dir=None, bootstrap=0)
    plain.start(LocalGrid(n, _fixed_update()), _model(), num_rounds=2)
    assert all(e.status == "ok" for e in plain.compute().estimates.values())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -3.0])
def test_a_bad_num_examples_skips_the_reply(tmp_path, caplog, bad):
    """Node 1 reports ``num-examples`` NaN (inf, negative): its reply is dropped with a log
    line, the server runs every round; before, FedAvg's average became NaN and the next
    configure_train stopped the server app with a ValueError."""
    caplog.set_level(logging.WARNING, logger="flwr")
    n, k, z = 6, 30, 0.5
    random.seed(0)
    np.random.seed(0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n), z, 1.0, n + k)
    strategy = CanaryStrategy(dp, num_canaries=k, log_dir=str(tmp_path), bootstrap=0)
    result = strategy.start(LocalGrid(n, _fixed_update(weight=lambda i: bad if i == 1 else 1.0)),
                            _model(), num_rounds=3)
    assert np.isfinite(result.arrays["w"].numpy()).all()
    assert "has num-examples" in caplog.text and "it is skipped" in caplog.text
    assert strategy.auditor.stats.rounds_seen == 3
    summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
    assert set(summary["inputs"]["short_rounds"]) == {"1", "2", "3"}  # 35 of 36 replies
    assert all(e.endswith("replies skipped: bad num-examples") for e in summary["inputs"]["round_events"].values())


class VanishingGrid(LocalGrid):
    """A grid whose nodes vanish (a SuperLink restarted) once ``lost`` is set; it refuses to be
    polled more than ``max_polls`` times while empty (instead of a test waiting forever)."""

    def __init__(self, num_nodes, handler, lost=False, max_polls=4):
        super().__init__(num_nodes, handler)
        self.lost, self.polls, self.max_polls = lost, 0, max_polls

    def get_node_ids(self):
        if not self.lost:
            return super().get_node_ids()
        self.polls += 1
        if self.polls > self.max_polls:
            raise RuntimeError("polled for nodes without end")
        return []


def test_waiting_for_nodes_ends_with_a_clear_error():
    dp = lambda: DifferentialPrivacyServerSideFixedClipping(  # noqa: E731
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=4), 0.5, 1.0, 8)
    strategy = CanaryStrategy(dp(), num_canaries=12, log_dir=None, bootstrap=0, node_timeout=0.2)
    with pytest.raises(TimeoutError, match="0 node.*min_available_nodes=4.*node_timeout"):
        strategy.start(VanishingGrid(4, _fixed_update(), lost=True), _model(), num_rounds=2)
    # nodes lost after the first round: the second round's wait ends the same way
    grid = VanishingGrid(4, _fixed_update())
    handler = grid.handler

    def then_lose(msg, i):
        grid.lost = True
        return handler(msg, i)

    grid.handler = then_lose
    strategy = CanaryStrategy(dp(), num_canaries=12, log_dir=None, bootstrap=0, node_timeout=0.2)
    with pytest.raises(TimeoutError, match="min_available_nodes=4"):
        strategy.start(grid, _model(), num_rounds=3)
    assert strategy.backend.rounds == 1
    with pytest.raises(ValueError, match="node_timeout"):
        CanaryStrategy(dp(), num_canaries=12, log_dir=None, node_timeout=0)


def _noise_tap(monkeypatch):
    """Records each noise draw of Flower's DP wrapper (numpy's global generator)."""
    import flwr.serverapp.strategy.dp_fixed_clipping as dp_module

    draws = []
    original = dp_module.add_gaussian_noise_inplace

    def tapped(arrays, std):
        before = [np.array(a, copy=True) for a in arrays]
        original(arrays, std)
        draws.append((std, [a - b for a, b in zip(arrays, before, strict=True)]))

    monkeypatch.setattr(dp_module, "add_gaussian_noise_inplace", tapped)
    return draws


def _replayed(summary, std, shape):
    """An attacker's candidates for the first noise draw: numpy's global and new generators
    and torch's, seeded with the logged seed (and small offsets)."""
    seed = int(summary["inputs"]["seed"])
    out = []
    for s in range(seed, seed + 8):
        np.random.seed(s)
        out.append(np.random.normal(0, std, shape))
        out.append(np.random.default_rng(s).normal(0, std, shape))
        out.append((torch.randn(shape, generator=torch.Generator().manual_seed(s)) * std).numpy())
    return out


def test_no_logged_seed_replays_the_dp_wrappers_noise(tmp_path, monkeypatch):
    """Flower's DP wrapper draws its noise from numpy's global generator: our code never seeds
    a global generator (numpy's, torch's, Python's), so from a fresh process state no seed the
    summary logs regenerates the noise. The control: a run whose global numpy generator was
    seeded with the logged seed (what a script seeding "everything" with one seed does) is
    replayed from the summary."""
    calls = []
    for mod, name in ((np.random, "seed"), (np.random, "set_state"), (torch, "manual_seed"),
                      (random, "seed")):
        original = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _o=original, _n=name, **kw: (calls.append(_n), _o(*a, **kw))[1])

    def run(path, seed_numpy):
        draws = _noise_tap(monkeypatch)
        np.random.seed(5 if seed_numpy else None)  # None: fresh OS entropy, as at import
        calls.clear()
        dp = DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=6), 0.5, 1.0, 18)
        strategy = CanaryStrategy(dp, num_canaries=30, seed=5, log_dir=str(path), bootstrap=0)
        strategy.start(LocalGrid(6, _fixed_update()), _model(), num_rounds=3)
        assert calls == [], calls  # nothing seeded a global generator during the run
        summary = json.loads(open(strategy.summary_path, encoding="utf-8").read())
        std, first = draws[0]
        return any(np.allclose(c, first[0], atol=1e-5) for c in _replayed(summary, std, first[0].shape))

    assert not run(tmp_path / "secure", seed_numpy=False)
    assert run(tmp_path / "seeded", seed_numpy=True)  # the attack works where the seed leaks


def test_bad_grid_and_strategy_arguments_name_the_argument():
    handler = _fixed_update()
    for bad in (2.5, "3", 0, True):
        with pytest.raises(ValueError, match="num_nodes"):
            LocalGrid(bad, handler)
    with pytest.raises(ValueError, match="handler"):
        LocalGrid(3, None)
    assert LocalGrid(3, handler).num_nodes == 3
    inner = DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=0.5), 1.0, 1.0, 10)
    with pytest.raises(ValueError, match="log_dir"):
        CanaryStrategy(inner, num_canaries=10, log_dir=3)
