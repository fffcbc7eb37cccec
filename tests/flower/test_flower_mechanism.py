"""The checks of the mechanism on Flower releases: every floating array and every integer buffer
a released model carries is checked for fresh noise of the claimed scale (Flower #4868: Gaussian
noise cast to an int64 buffer adds nothing)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from audit_callbacks.flower import CanaryStrategy, LocalGrid  # noqa: E402

D_IN, D_OUT, Z, CLIP = 50, 4, 0.5, 1.0


class _NoisyFedAvg(FedAvg):
    """FedAvg plus Gaussian noise of std ``z C / m`` on the aggregate (the DP wrapper's), on the
    floating arrays and, unless ``int_bug``, on the integer buffer too (FedAvg averages it in
    float64); with ``int_bug`` the noise is cast to the buffer's int64, i.e. rounded to 0."""

    def __init__(self, m: int, int_bug: bool, **kw):
        super().__init__(**kw)
        self.m, self.int_bug = m, int_bug
        self.num_sampled_clients = m  # what a Flower DP wrapper calls its divisor

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        std = Z * CLIP / self.m
        out = {}
        for key, arr in arrays.items():
            nd = arr.numpy()
            if key == "steps" and self.int_bug:
                nd = np.rint(nd).astype(np.int64)
            noise = np.random.normal(0, std, nd.shape).astype(nd.dtype)
            out[key] = Array(np.asarray(nd + noise))
        return ArrayRecord(out), metrics


def _handler(msg, i):
    arrays = msg.content["arrays"]
    rng = np.random.default_rng(100 + i)
    w = arrays["w"].numpy()
    out = {"w": Array((w + 0.05 * (rng.normal(0, 1, w.shape) - w)).astype(np.float32)),
           "b": Array(arrays["b"].numpy().copy()),
           "steps": Array(np.rint(arrays["steps"].numpy()).astype(np.int64) + 1 + i % 3)}  # local steps
    return RecordDict({"arrays": ArrayRecord(out), "metrics": MetricRecord({"num-examples": 1})})


def _run(tmp_path, int_bug: bool):
    random.seed(0)
    np.random.seed(0)
    n, k, fraction = 20, 40, 0.25
    m = int((n + k) * fraction)
    strategy = CanaryStrategy(
        _NoisyFedAvg(m, int_bug, fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=n),
        num_canaries=k, log_dir=str(tmp_path), seed=0, noise_multiplier=Z, clip_norm=CLIP, bootstrap=0)
    rng = np.random.default_rng(0)
    model = ArrayRecord({"w": Array(rng.normal(0, 0.1, (D_OUT, D_IN)).astype(np.float32)),
                         "b": Array(np.zeros(D_OUT, np.float32)), "steps": Array(np.zeros(1, np.int64))})
    strategy.start(LocalGrid(n, _handler), model, num_rounds=8)
    return json.loads(open(strategy.summary_path, encoding="utf-8").read())


def test_an_integer_buffer_with_noise_passes(tmp_path):
    summary = _run(tmp_path, int_bug=False)
    fresh = summary["results"]["fresh_noise_ratio"]
    assert fresh["counts"]["groups"] == 3 and "steps" in fresh["details"]["ratios"]
    assert summary["verdict_mechanism"] == "consistent", summary["verdict_mechanism_sentence"]


def test_an_integer_buffer_whose_noise_is_cast_away_is_named(tmp_path):
    summary = _run(tmp_path, int_bug=True)
    assert summary["verdict_mechanism"] == "violation"
    assert "noise on steps" in summary["verdict_mechanism_sentence"], summary["verdict_mechanism_sentence"]
