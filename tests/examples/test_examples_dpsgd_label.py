"""examples/dpsgd_label_audit.py --quick: paper 004's Figures 1/2 sweep on breast cancer and one
Trainer run with CanaryAudit + LabelReconstructionAttack + LabelDPLowerBound."""

import contextlib
import csv
import glob
import importlib.util
import io
import json
import math
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.estimators.gaussian import gaussian_epsilon

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "dpsgd_label_audit.py"
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|does not have many workers|secure RNG).*"
)

BOUNDS = (
    "epsilon_lower_bound_max",
    "epsilon_lower_bound_second_last_max",
    "epsilon_pair_optimal_test_max",
    "epsilon_pair_layer_max",
    "epsilon_pair_all_params_max",
)


def load_example():
    spec = importlib.util.spec_from_file_location("dpsgd_label_audit_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpsgd_label")
    example = load_example()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        res = example.main(["--quick", "--out", str(out)])
    return example, res, out, printed.getvalue()


def test_csv_rows_are_finite_and_lower_bounds_stay_below_the_single_step_bound(quick_run):
    example, res, _, _ = quick_run
    assert res["ok"], res["failures"]
    with open(res["csv"], encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    # --quick: sigmas {0.5, 4} at C = 1 (Figure 1), clip norms {1, 10} at sigma 0.5 (Figure 2)
    assert [
        (r["sweep"], float(r["noise_multiplier"]), float(r["max_grad_norm"])) for r in rows
    ] == [
        ("noise_multiplier", 0.5, 1.0),
        ("noise_multiplier", 4.0, 1.0),
        ("clip_norm", 0.5, 1.0),
        ("clip_norm", 0.5, 10.0),
    ]
    assert list(rows[0]) == list(example.CSV_FIELDS)
    for r in rows:
        vals = {k: float(v) for k, v in r.items() if k != "sweep"}
        assert all(math.isfinite(v) for v in vals.values()), r
        assert vals["steps"] == vals["attacked_steps"] == 3  # every step attacked
        single = vals["epsilon_single_step"]
        # the Gaussian with sensitivity 2/sigma at delta (closed form, independent of the run)
        assert single == pytest.approx(
            gaussian_epsilon(vals["noise_multiplier"], vals["delta"], sensitivity=2.0)
        )
        for key in BOUNDS:
            assert 0.0 <= vals[key] <= single * (1 + 1e-9), (key, r)
        # maxima over steps keep the per-step B9 order
        assert vals["epsilon_lower_bound_max"] <= vals["epsilon_pair_optimal_test_max"] * (1 + 1e-9)
        assert vals["epsilon_pair_optimal_test_max"] <= vals["epsilon_pair_layer_max"] * (1 + 1e-9)
        assert vals["epsilon_pair_layer_max"] <= vals["epsilon_pair_all_params_max"] * (1 + 1e-9)
        assert vals["epsilon_lower_bound_max"] > 0  # the attack carries information at these sigmas
        assert 0.0 <= vals["reconstruction_accuracy"] <= 1.0 and 0.0 <= vals["val_accuracy"] <= 1.0
    by = {(r["sweep"], float(r["noise_multiplier"]), float(r["max_grad_norm"])): r for r in rows}
    # the shared point (sigma 0.5, C 1) is one fit written in both sweeps
    a, b = by[("noise_multiplier", 0.5, 1.0)], by[("clip_norm", 0.5, 1.0)]
    assert {k: v for k, v in a.items() if k != "sweep"} == {
        k: v for k, v in b.items() if k != "sweep"
    }
    # Figure 1's shape: more noise, smaller bounds and smaller upper bounds
    lo, hi = by[("noise_multiplier", 0.5, 1.0)], by[("noise_multiplier", 4.0, 1.0)]
    for key in ("epsilon_lower_bound_max", "epsilon_single_step", "epsilon_accountant"):
        assert float(hi[key]) < float(lo[key]), key
    # the accountant does not depend on the clip norm (same sigma, same steps)
    assert float(by[("clip_norm", 0.5, 10.0)]["epsilon_accountant"]) == pytest.approx(
        float(lo["epsilon_accountant"])
    )


def test_png_is_written(quick_run):
    _, res, _, _ = quick_run
    with open(res["png"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(res["png"]) > 20_000  # two panels with lines, not an empty canvas


def test_audited_run_logs_label_and_canary_tags_to_tensorboard(quick_run):
    _, res, out, printed = quick_run
    run = res["run"]
    assert run["failures"] == []
    assert run["steps"] == 3
    for key in BOUNDS:
        assert 0.0 <= run[key] <= run["epsilon_single_step"] * (1 + 1e-9), key
    assert run["num_canaries"] >= 2 and math.isfinite(run["canary_final_model"])
    assert run["canary_analytic"] == pytest.approx(run["epsilon_accountant"], rel=1e-6)
    events = glob.glob(os.path.join(str(out), "audited_run", "version_0", "events.out.tfevents.*"))
    assert events
    tags: set[str] = set()
    for path in events:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
        for tag in acc.Tags()["scalars"]:
            assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    for tag in (
        "label_dp/epsilon_lower_bound",
        "label_dp/epsilon_lower_bound_max",
        "label_dp/epsilon_lower_bound_extrapolated",
        "label_dp/epsilon_lower_bound_second_last",
        "label_dp/epsilon_single_step",
        "label_dp/epsilon_accountant",
        "label_attack/accuracy",
        "audit/epsilon_final_model",
        "audit/epsilon_analytic",
        "val/accuracy",
    ):
        assert tag in tags, (tag, sorted(tags))
    for name in ("audit_summary.json", "label_attack_summary.json", "label_dp_summary.json"):
        with open(os.path.join(str(out), "audited_run", "version_0", name), encoding="utf-8") as fh:
            assert json.load(fh)["callback"]
    assert "[PASS]" in printed and "[FAIL]" not in printed
    assert "TensorBoard logs:" in printed


def test_multiclass_run_writes_csv_and_png_and_stays_below_the_single_step_bound(quick_run):
    """(d) digits, 10 classes: every step attacked, the bound below the single-step bound and the
    accountant's growth with less noise; the PNG and the CSV are written."""
    _, res, _, _ = quick_run
    rows = res["multiclass"]
    assert [r["noise_multiplier"] for r in rows] == [0.5, 2.0]
    with open(res["multiclass_csv"], encoding="utf-8") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == 2
    for r in rows:
        assert r["failures"] == [] and r["steps"] == r["attacked_steps"] == 3
        assert r["flipped_norms"].startswith("exact")
        assert 0.0 < r["epsilon_lower_bound_max"] <= r["epsilon_single_step"]
        assert 0.0 <= r["expected_attack_accuracy"] <= 1.0
    assert rows[0]["epsilon_lower_bound_max"] > rows[1]["epsilon_lower_bound_max"]
    with open(res["multiclass_png"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
