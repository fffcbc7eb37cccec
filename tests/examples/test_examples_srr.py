"""examples/srr_vs_two_point.py: the --quick run's outputs, and its exact helpers.

The run is one seeded configuration, so the checks below are on what must hold for any seed
(exact audits, composition, the empirical counts against the exact rates at a Bonferroni-small
level), not on accuracy orderings.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binom, binomtest

from audit_callbacks.mechanisms import GRR, Staircase, TwoPoint, exact_epsilon

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "srr_vs_two_point.py"


def _load():
    spec = importlib.util.spec_from_file_location("srr_vs_two_point_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ex = _load()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("srr")
    result = ex.main(["--quick", "--out", str(out)])
    return out, result


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _num(s: str) -> float:
    v = float(s)
    assert math.isfinite(v), s
    return v


# ------------------------------------------------------------------------------ the quick run
def test_training_csv_rows_and_values(quick):
    out, result = quick
    args = result["args"]
    rows = _read(out / "training.csv")
    assert tuple(rows[0].keys()) == ex.TRAINING_FIELDS
    expected = {("none", "")} | {(m, f"{e:g}") for m in ex.MECHANISMS for e in args["epsilons"]}
    assert {(r["mechanism"], r["epsilon"]) for r in rows} == expected
    assert len(rows) == len(expected)
    for r in rows:
        assert 0.0 <= _num(r["accuracy"]) <= 1.0
        assert int(r["d"]) == 650  # logistic regression on 8x8 digits: 64 * 10 + 10
        if r["mechanism"] == "none":
            assert r["attack_error"] == r["claimed_whole_update_epsilon"] == ""
            continue
        eps = _num(r["epsilon"])
        # basic composition over the d weights of one update
        assert _num(r["claimed_whole_update_epsilon"]) == pytest.approx(650 * eps, rel=1e-6)
        for k in ("attack_error", "attack_error_median", "attack_error_naive", "trivial_error"):
            assert _num(r[k]) >= 0.0
        assert 0.0 < _num(r["attack_confidence"]) <= 100.0  # eq. 10's range
        assert 0.0 <= _num(r["clipped_fraction"]) <= 1.0
    # two-point's unbiased estimator is the identity: both attacks see the same values
    for r in result["training"]:
        if r["mechanism"] == "two_point":
            assert r["attack_error"] == r["attack_error_naive"]


def test_audit_exact_epsilons_and_composition(quick):
    out, result = quick
    args = result["args"]
    rows = _read(out / "audit.csv")
    assert tuple(rows[0].keys()) == ex.AUDIT_FIELDS
    assert len(rows) == len(ex.AUDITED) * len(args["epsilons"]) * len(args["dims"])
    assert {(r["mechanism"], float(r["epsilon"]), int(r["d"])) for r in rows} == {
        (m, e, d) for m in ex.AUDITED for e in args["epsilons"] for d in args["dims"]
    }
    for r in result["audit"]:
        eps, d = r["epsilon"], r["d"]
        # enumeration: each correct randomizer's per-weight epsilon is exactly the claimed one
        assert r["exact_per_coordinate"] == pytest.approx(eps, abs=1e-9)
        assert r["exact_whole"] == pytest.approx(d * eps, abs=1e-8)
        assert r["claimed_whole"] == pytest.approx(d * eps, rel=1e-12)
        assert r["tp"] + r["fn"] + r["fp"] + r["tn"] == r["trials"] == args["trials"]
        # a correct randomizer is never flagged, and the test cannot see more than d eps
        assert 0.0 <= r["test_lower_bound"] <= r["claimed_whole"]
        assert r["population_epsilon"] <= r["exact_whole"] + 1e-9
        for k in ("test_epsilon", "ceiling", "population_fpr", "population_fnr", "population_epsilon"):
            assert math.isfinite(r[k])
    for r in rows:  # written finite (an infinite upper bound is left empty)
        for k in ex.AUDIT_FIELDS[1:]:
            if not (k == "test_upper_bound" and r[k] == ""):
                _num(r[k])


def test_audit_counts_agree_with_the_exact_rates(quick):
    _, result = quick
    rows = result["audit"]
    level = 1e-3 / (2 * len(rows))  # Bonferroni over all rows and both rates
    for r in rows:
        n1, n2 = r["fp"] + r["tn"], r["fn"] + r["tp"]
        assert binomtest(r["fp"], n1, r["population_fpr"]).pvalue > level, r
        assert binomtest(r["fn"], n2, r["population_fnr"]).pvalue > level, r
    # d = 1 two-point: FPR = FNR = 1/(1 + e^eps), the test converges to eps exactly
    for r in rows:
        if r["mechanism"] == "two_point" and r["d"] == 1:
            p_low = 1.0 / (1.0 + math.exp(r["epsilon"]))
            assert r["population_fpr"] == pytest.approx(p_low, rel=1e-12)
            assert r["population_epsilon"] == pytest.approx(r["epsilon"], rel=1e-12)


def test_figure_written(quick):
    out, result = quick
    png = Path(result["paths"]["figure"])
    assert png == out / "srr_vs_two_point.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ---------------------------------------------------------------------------- exact helpers
@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("d", [1, 4, 16, 64])
def test_sum_sign_rates_two_point_is_a_binomial_majority(eps, d):
    twin, s = ex.integer_twin(TwoPoint(eps, 0.0, 0.3))
    fpr, fnr = ex.sum_sign_rates(twin, d, s)
    p = 1.0 / (1.0 + math.exp(-eps))  # P(high output) at the top of the domain
    # guess "1" iff #high >= d/2 (ties -> 1)
    assert fpr == pytest.approx(float(binom.cdf(math.ceil(d / 2) - 1, d, p)), rel=1e-9, abs=1e-300)
    assert fnr == pytest.approx(float(binom.sf(math.ceil(d / 2) - 1, d, 1.0 - p)), rel=1e-9)


def test_sum_sign_rates_grr_single_weight_closed_form():
    mech = GRR(1.5, 0.0, 0.02, 4, rounding="stochastic")
    twin, s = ex.integer_twin(mech)
    fpr, fnr = ex.sum_sign_rates(twin, 1, s)
    half = (mech.domain_size - 1) // 2
    q = mech.other_probability
    assert fpr == pytest.approx(half * q, rel=1e-12)  # the half values below 0
    assert fnr == pytest.approx((half + 1) * q, rel=1e-12)  # 0 and the half above


@pytest.mark.parametrize(
    "mech",
    [
        Staircase(2.0, 0.0, 0.02, 3, 4, rounding="stochastic"),
        Staircase(1.0, 0.0, 0.05, 3, 5, 3.0),
        GRR(3.0, 0.0, 0.02, 3),
    ],
    ids=repr,
)
def test_integer_twin_has_the_same_law(mech):
    twin, s = ex.integer_twin(mech)
    assert torch.equal(twin.transition_matrix(), mech.transition_matrix())
    values = twin.output_values().numpy()
    assert np.array_equal(values, np.rint(values)) and s == values.max()
    assert exact_epsilon(twin) == pytest.approx(exact_epsilon(mech), abs=1e-12)


def test_dims_must_keep_the_sums_exact():
    for bad in ("2", "3", "8", "9"):
        with pytest.raises(SystemExit):
            ex.parse_args(["--dims", bad])
    assert ex.parse_args(["--dims", "1", "4", "16", "64"]).dims == [1, 4, 16, 64]
