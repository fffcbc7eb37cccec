"""Flower cases of ``benchmarks/planted_bugs.py`` (issue 25, case e): a Flower server-side DP
wrapper that clips at 2C and adds noise for C, against the same run with Flower's own wrapper.

One case is one small Flower run, Flower's own ``Strategy.start`` loop (FedAvg sampling, the
server-side fixed-clipping DP wrapper, FedAvg's aggregation) on the in-process grid
(``audit_callbacks.flower.LocalGrid``), with ``CanaryStrategy`` outside the DP wrapper: 40 real
clients, each a softmax regression on its shard of scikit-learn digits (d = 650, numpy local
gradient steps), 400 Hadamard canary clients sampled with the real ones (cohort m = 20 of 440
a round), z = 1, C = 1, 30 rounds, one estimate at the end (the summary's, with a
100-resample bootstrap). A canary client's update is ``10 C c_j``
(``canary_norm_multiplier``), clipped by the DP wrapper's own clipping with the real replies.
The planted bug, :class:`ServerClip2C`, is a subclass of Flower's
``DifferentialPrivacyServerSideFixedClipping`` whose clipping runs at 2C while its noise (and
the clip norm it advertises, which ``CanaryStrategy`` reads) stays C: each canary's shift in
the released model doubles, so the known-rounds estimate lands near the epsilon of noise
multiplier z / 2, far above the analytic epsilon the run claims for z.

``CASES[name](seed)`` runs one seed (the data split, the canaries, the cohorts and the DP noise
all follow ``seed``: the noise through numpy's global generator, which Flower's wrapper draws
from, seeded here on purpose, as a benchmark's reproducibility asks) and returns a JSON-able
dict: the verdict word of each threat model (``audit_callbacks.auditing.html_report.verdict``
on the run's summary), the analytic epsilon, every estimate with its interval, the valid lower
bounds and the run's seconds.

    PYTHONPATH=. python benchmarks/planted_bugs.py --seeds 2 --correct-seeds 2 --cases flower_correct  # a smoke run
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from audit_callbacks.flower import CanaryStrategy, LocalGrid
from benchmarks._planted import case_result

__all__ = ["CASES", "CastNoise", "NoisyFedAvg", "ReusedNoise", "ServerClip2C", "run"]

ROUNDS, CLIENTS, PER_ROUND, CANARIES, Z, CLIP, DELTA = 30, 40, 20, 400, 1.0, 1.0, 1e-5
LOCAL_STEPS, LR = 5, 0.5


class ServerClip2C(DifferentialPrivacyServerSideFixedClipping):
    """The planted bug: every reply (real and canary) clipped at 2C; the noise stays z C / m
    and ``clipping_norm`` still says C."""

    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        claimed, self.clipping_norm = self.clipping_norm, 2 * self.clipping_norm
        self._claimed = claimed
        try:
            return super().aggregate_train(server_round, replies)
        finally:
            self.clipping_norm = claimed

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        clip, self.clipping_norm = self.clipping_norm, self._claimed
        try:
            return super()._add_noise_to_aggregated_arrays(aggregated_arrays)
        finally:
            self.clipping_norm = clip


class ReusedNoise(DifferentialPrivacyServerSideFixedClipping):
    """The planted bug: the wrapper's noise drawn from a generator re-seeded every round (the
    same noise vector each round)."""

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        state = np.random.get_state()
        np.random.seed(1234)
        try:
            return super()._add_noise_to_aggregated_arrays(aggregated_arrays)
        finally:
            np.random.set_state(state)


class NoisyFedAvg(FedAvg):
    """A DP aggregator that handles integer buffers (Flower's own wrappers cannot clip them):
    FedAvg plus Gaussian noise of std ``z C / m`` on every array of the aggregate; with
    ``cast_noise`` the noise is cast to an integer buffer's own dtype (Flower #4868), which
    rounds it to 0. The replies are not clipped (the canaries are, by CanaryStrategy)."""

    def __init__(self, *args: Any, cast_noise: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cast_noise = cast_noise
        self.num_sampled_clients = PER_ROUND  # the noise's divisor, as a DP wrapper names it

    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        out = {}
        for key, arr in arrays.items():
            nd = arr.numpy()
            if key == "steps" and self.cast_noise:
                nd = np.rint(nd).astype(np.int64)
            noise = np.random.normal(0, Z * CLIP / PER_ROUND, nd.shape).astype(nd.dtype)
            out[key] = Array(np.asarray(nd + noise))
        return ArrayRecord(out), metrics


class CastNoise(NoisyFedAvg):
    """The planted bug: the noise cast to the integer buffer's dtype (rounded to 0)."""


def _shards(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Digits split over the clients at random (``seed``): ``(x [n_i, 64] in [0, 1], y [n_i])``."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    return [((x[idx] / 16.0).astype(np.float32), y[idx].astype(np.int64))
            for idx in np.array_split(order, CLIENTS)]


def _handler(shards: list[tuple[np.ndarray, np.ndarray]], local_steps: int = LOCAL_STEPS
             ) -> Callable[[Any, int], RecordDict]:
    """Node i: ``local_steps`` full-batch gradient steps of softmax regression on its shard."""
    def handler(msg: Any, i: int) -> RecordDict:
        x, y = shards[i]
        arrays = msg.content["arrays"]
        w, b = arrays["w"].numpy().copy(), arrays["b"].numpy().copy()
        for _ in range(local_steps):
            logits = x @ w.T + b
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(y)), y] -= 1.0
            w -= LR * (p.T @ x) / len(y)
            b -= LR * p.mean(0)
        out = {"w": Array(w.astype(np.float32)), "b": Array(b.astype(np.float32))}
        if "steps" in arrays:  # an integer buffer: the local steps taken so far (data-dependent)
            out["steps"] = Array(np.rint(arrays["steps"].numpy()).astype(np.int64) + len(y) // 10)
        out = ArrayRecord(out)
        return RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": 1})})
    return handler


def run(seed: int, wrapper: type[Any] = DifferentialPrivacyServerSideFixedClipping, *,
        per_round: int = PER_ROUND, local_steps: int = LOCAL_STEPS) -> dict[str, Any]:
    """One seed of the set-up above with ``wrapper`` (Flower's DP wrapper or a planted one), or
    with :class:`NoisyFedAvg` / :class:`CastNoise` (a model with an integer buffer, the
    aggregator adding the noise; ``CanaryStrategy`` is told z and C)."""
    start = time.perf_counter()
    logging.getLogger("flwr").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    random.seed(seed)  # FedAvg's cohorts
    np.random.seed(10_000 + seed)  # the DP wrapper's noise (reproducible on purpose, see above)
    fraction = per_round / (CLIENTS + CANARIES)
    fedavg = FedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=CLIENTS)
    arrays = {"w": Array(np.zeros((10, 64), np.float32)), "b": Array(np.zeros(10, np.float32))}
    extra: dict[str, Any] = {}
    if issubclass(wrapper, NoisyFedAvg):  # the aggregator itself adds the noise
        dp = wrapper(fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=CLIENTS,
                     cast_noise=wrapper is CastNoise)
        arrays["steps"] = Array(np.zeros(1, np.int64))
        extra = {"noise_multiplier": Z, "clip_norm": CLIP}
    else:
        dp = wrapper(fedavg, Z, CLIP, per_round)
    init = ArrayRecord(arrays)
    with tempfile.TemporaryDirectory() as root:
        strategy = CanaryStrategy(dp, num_canaries=CANARIES, seed=seed, delta=DELTA, bootstrap=100,
                                  log_dir=root, log_histograms=False, every_n_rounds=ROUNDS, **extra)
        strategy.start(LocalGrid(CLIENTS, _handler(_shards(seed), local_steps)), init, num_rounds=ROUNDS)
        with open(strategy.summary_path, encoding="utf-8") as fh:
            summary = json.load(fh)
    return case_result(summary, seed=seed, start=start)


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "flower_correct": lambda seed: run(seed, DifferentialPrivacyServerSideFixedClipping),
    "flower_clip_2c": lambda seed: run(seed, ServerClip2C),
    "flower_reused_noise": lambda seed: run(seed, ReusedNoise),
    "flower_int_buffer_correct": lambda seed: run(seed, NoisyFedAvg),
    "flower_int_buffer_noise_cast": lambda seed: run(seed, CastNoise),
    "flower_small_cohort_correct": lambda seed: run(seed, per_round=10),
    "flower_more_local_steps_correct": lambda seed: run(seed, local_steps=20),
}
