"""The planner's ratio range against the tightness benchmark's real (correct) runs.

``benchmarks/results/tightness.json`` (``python -m benchmarks tightness --seeds 6``): DP-FedAvg
on digits (300 clients, 30 a round, shuffled cohorts, 300 Hadamard canaries, 100 rounds, delta
1e-6) and Opacus DP-SGD on breast cancer (455 examples, q = 0.125, 240 steps, delta 1e-5, PRV
accountant). Each run is planned at its own settings, as ``audit_callbacks.auditing.plan``
does at fit start (95% range, the real contributions' cross terms at the run's cohort or batch).
"""

import json
from pathlib import Path

import pytest

from audit_callbacks.auditing.plan import PLAN_COVERAGE
from audit_callbacks.estimators import plan_audit

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "tightness.json"


def _plan(run: dict, cache: dict):
    key = (run["setting"], run["noise_multiplier"], run.get("rounds"), run.get("steps"))
    if key in cache:
        return cache[key]
    k, ku = run["k"], run["k_unobserved"]
    common = dict(dim=k + ku, noise_multiplier=run["noise_multiplier"], coverage=PLAN_COVERAGE,
                  search_bugs=False)  # dim: the Hadamard length k + k' (the default k')
    if run["setting"] == "dpfedavg_digits":
        real, m = 300, 30  # q = m / (N + k); real clients a round: m N / (N + k)
        plan = plan_audit(k, ku, steps=run["rounds"], sample_rate=m / (real + k), delta=1e-6,
                          training="dpfedavg", participation="fixed",
                          real_per_step=m * real / (real + k), **common)
    else:
        plan = plan_audit(k, ku, steps=run["steps"], sample_rate=0.125, delta=1e-5,
                          reference_epsilon=run["reference_all_iterates"],
                          real_per_step=0.125 * run["k"], **common)  # k = N = 455 examples
    cache[key] = plan
    return plan


def test_ratio_range_covers_the_benchmarks_correct_runs() -> None:
    if not RESULTS.exists():
        pytest.skip("benchmarks/results/tightness.json is not there")
    runs = json.loads(RESULTS.read_text())["runs"]
    assert len(runs) >= 13
    cache: dict = {}
    inside = [_plan(r, cache).ratio_low <= r["ratio_all_iterates"] <= _plan(r, cache).ratio_high
              for r in runs]
    assert sum(inside) >= 0.9 * len(runs), (sum(inside), len(runs))

