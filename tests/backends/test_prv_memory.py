"""The PRV epsilon beside a run's own accountant stays flat in memory and bounded in cost.

Each periodic estimate of a DP-SGD audit asks for Opacus' PRV epsilon of a history one period
longer; its grid grows with the steps and epsilon, and scipy's FFT plan cache kept ~80 MB per
grid length (RSS +0.9 GiB over ten estimates up to 3,000 steps at q = 0.125).
"""

from __future__ import annotations

import sys

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from audit_callbacks.backends.opacus import accounting
from audit_callbacks.backends.opacus.accounting import (
    PRV_MAX_POINTS,
    analytic_epsilons,
    prv_epsilon_status,
    prv_grid_points,
)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_rss_of_periodic_prv_epsilons_over_a_growing_3000_step_history_stays_flat():
    accounting._analytic_epsilons.cache_clear()
    analytic_epsilons([(1.0, 0.125, 10)], 1e-5)  # imports and first allocations
    start = _rss_mib()
    computed = {}
    for steps in range(600, 3001, 600):
        out = analytic_epsilons([(1.0, 0.125, steps)], 1e-5)
        assert out["prv"] is not None  # every one under the bound: computed
        computed[steps] = out
    grown = _rss_mib() - start
    assert grown < 50, f"RSS grew by {grown:.0f} MiB over 5 PRV estimates up to 3,000 steps"
    # the values are Opacus' own, bit for bit
    for steps in (600, 3000):
        history = [(1.0, 0.125, steps)]
        prv, rdp = PRVAccountant(), RDPAccountant()
        prv.history, rdp.history = list(history), list(history)
        assert computed[steps] == {"rdp": rdp.get_epsilon(1e-5), "prv": prv.get_epsilon(delta=1e-5)}


def test_prv_epsilon_past_the_bound_is_skipped_with_a_status_at_once():
    history = [(1.0, 0.125, 10_000)]
    points = prv_grid_points(history, 1e-5)
    assert points > PRV_MAX_POINTS
    status = prv_epsilon_status(history, 1e-5)
    assert status.startswith("skipped:") and str(points) in status and "10000 steps" in status
    accounting._analytic_epsilons.cache_clear()
    out = analytic_epsilons(history, 1e-5)
    rdp = RDPAccountant()
    rdp.history = list(history)
    assert out == {"rdp": rdp.get_epsilon(1e-5), "prv": None}
    # the bound is an argument; the old call (history, delta) still works; under it: "ok"
    small = [(1.0, 64 / 455, 32)]
    assert prv_epsilon_status(small, 1e-5) == "ok"
    assert prv_epsilon_status(small, 1e-5, max_prv_points=10).startswith("skipped:")
    assert analytic_epsilons(small, 1e-5, max_prv_points=10)["prv"] is None
    assert prv_epsilon_status([], 1e-5).startswith("skipped:")


def test_grid_points_are_the_size_of_opacus_own_domain():
    for history in ([(1.0, 256 / 18000, 213)], [(0.8, 0.01, 500), (1.2, 0.02, 100)]):
        acc = PRVAccountant()
        acc.history = list(history)
        dprv = acc._get_dprv(eps_error=0.01, delta_error=1e-5 / 1000)
        assert prv_grid_points(history, 1e-5) == dprv.domain.size
