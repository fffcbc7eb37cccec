"""The fast paths of the canary audit give the same numbers as the straightforward ones.

* all-iterates cosines: one matrix product per fixed block of deltas, bit-identical whenever
  the passes over the canaries run (resume, checkpoint flushes, any ``max_buffered``);
* final-model cosines: bit-identical to :meth:`CanarySet.cosines` (per-column products);
* the scalar two-Gaussian delta behind every point estimate: bit-identical to the vectorised one;
* a scaled canary client update: bit-identical to ``canary * scale``;
* fit end right after a validation logs no second histogram at the same step.
"""

import math
import os

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canaries import CanarySet
from audit_callbacks.canary_stats import CanaryStatistics, group_rounds
from audit_callbacks.estimators.gaussian import (
    _eps_upper_bracket,
    _epsilon_standardized_scalar,
    _log_delta_standardized,
    _log_delta_standardized_scalar,
)
from tests._federated import digits_dpfedavg, fit


def _run(cs, deltas, theta, *, max_buffered=1000, flush_at=(), reload_at=()):
    st = CanaryStatistics(cs, 12, 12, max_buffered=max_buffered)
    st.set_initial(torch.zeros(cs.dim))
    for i, delta in enumerate(deltas, 1):
        assert st.add_delta(delta)
        if i in flush_at:
            st.flush()
        if i in reload_at:  # a checkpoint (flushes) and a fresh object, as a resumed run
            resumed = CanaryStatistics(cs, 12, 12, max_buffered=max_buffered)
            resumed.load_state_dict(st.state_dict())
            st = resumed
    return st.compute(theta)


@pytest.mark.parametrize("dim", [64, 3000])
def test_all_iterates_do_not_depend_on_when_the_passes_run(dim):
    # max_buffered=1 puts a single delta in every pass: a product over the pending columns only
    # (a matrix-vector product in disguise) rounds differently from the fixed 16-wide block.
    torch.manual_seed(0)
    cs = CanarySet(seed=1, dim=dim, num_canaries=24)
    assert group_rounds(dim) == 16
    deltas = [torch.randn(dim) for _ in range(37)]
    theta = sum(deltas)
    ref = _run(cs, deltas, theta)
    variants = (
        {"max_buffered": 1},
        {"max_buffered": 5},
        {"flush_at": {1, 2, 17, 18, 33}},
        {"reload_at": {3, 16, 20, 36}},
        {"max_buffered": 7, "reload_at": {9}},
    )
    for kwargs in variants:
        got = _run(cs, deltas, theta, **kwargs)
        for key in ref:
            assert torch.equal(got[key], ref[key]), (kwargs, key)
    # the final-model column is the per-column product of CanarySet.cosines, bit for bit
    assert torch.equal(ref["final_observed"], cs.cosines(theta)[:12])
    # and the all-iterates maxima are the exact ones up to float32 rounding of the products
    full = torch.stack([cs.canary(j) for j in range(24)]).double()
    deltas64 = torch.stack(deltas).double()
    exact = ((full @ deltas64.t()) / torch.linalg.vector_norm(deltas64, dim=1)).max(dim=1).values
    assert torch.allclose(ref["all_observed"], exact[:12], rtol=1e-5, atol=1e-7)
    assert torch.allclose(ref["all_unobserved"], exact[12:], rtol=1e-5, atol=1e-7)


def test_group_rounds_bounds_a_block_to_8_mib():
    assert group_rounds(13_706) == 16
    assert group_rounds(1_000_000) == 2
    assert group_rounds(10_000_000) == 1


def test_scaled_canary_is_canary_times_scale():
    cs = CanarySet(seed=2, dim=777, num_canaries=5)
    for scale in (1.0, 0.7, 3.0):
        assert torch.equal(cs.canary(3, scale=scale), cs.canary(3) * scale)
    assert torch.equal(cs.canary(1, dtype=torch.float64, scale=0.3),
                       cs.canary(1, dtype=torch.float64) * 0.3)


def _bits(x: float) -> bytes:
    return np.float64(x).tobytes()


def test_scalar_two_gaussian_delta_is_the_vectorised_one_bit_for_bit():
    rng = np.random.default_rng(0)
    cases = [(0.0, 0.0, 1.0), (1.0, 0.0, 1.0), (2.0, -4.0, 1.0), (0.5, 0.0, 2.0), (0.5, 0.0, 0.5),
             (1.0, 3.0, 1e170), (1.0, 1e-200, 1e-170), (1e3, 30.0, 0.01)]
    for _ in range(4000):
        scale_m, scale_r = rng.choice([0.1, 1.0, 5.0, 30.0]), rng.choice([0.0, 0.05, 0.3, 1.0, 3.0])
        eps = float(np.exp(rng.normal(0.0, 2.0)))
        cases.append((eps, float(rng.normal(0.0, scale_m)), float(np.exp(rng.normal(0.0, scale_r)))))
    for eps, m, r in cases:
        with np.errstate(all="ignore"):  # the extreme r overflow on purpose
            want = float(_log_delta_standardized(eps, m, r))
        got = _log_delta_standardized_scalar(eps, m, r)
        assert _bits(got) == _bits(want), (eps, m, r, got, want)


def _epsilon_vectorised(m: float, r: float, delta: float) -> float:
    """The root finding of _epsilon_standardized_scalar on the vectorised delta (the reference)."""
    log_target = math.log(delta)
    floor = log_target - 700.0

    def f(eps: float) -> float:
        return max(float(_log_delta_standardized(eps, m, r)), floor) - log_target

    if f(0.0) <= 0.0:
        return 0.0
    hi = float(_eps_upper_bracket(np.float64(m), np.float64(r), delta))
    while f(hi) > 0.0:
        hi *= 2.0
    return float(brentq(f, 0.0, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500))


def test_scalar_epsilon_root_is_unchanged():
    rng = np.random.default_rng(1)
    for i in range(60):
        m = float(rng.normal(0.0, [0.1, 1.0, 5.0][i % 3]))
        r = float(np.exp(rng.normal(0.0, [0.0, 0.1, 1.0][i % 3])))
        delta = float(10.0 ** -rng.uniform(1, 10))
        assert _epsilon_standardized_scalar(m, r, delta) == _epsilon_vectorised(m, r, delta), (m, r, delta)


def test_fit_end_after_a_validation_logs_each_histogram_once(tmp_path):
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    audit = CanaryAudit(30, 30, seed=1)
    fit(dm, module, [audit], 8, tmp_path)  # validations at rounds 4 and 8, fit end at 8
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"),
                           size_guidance={"histograms": 0, "images": 0})
    acc.Reload()
    for tag in ("audit/cosine_final_observed", "audit/cosine_final_null",
                "audit/cosine_all_observed", "audit/cosine_all_unobserved"):
        assert [e.step for e in acc.Histograms(tag)] == [4, 8], tag
    for tag in ("audit/cosine_density_final_model", "audit/cosine_density_all_iterates"):
        images = acc.Images(tag)
        assert [e.step for e in images] == [8] and images[0].width > 0, tag
