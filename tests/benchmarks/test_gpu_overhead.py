"""``benchmarks/gpu_overhead.py``'s long fits: the epochs planned from a calibration, the audit's
cost split into fit start, epochs, fit end and the per-step marginal, the targets' pass/fail, a
tiny long-fit run on the CPU, and ``gpu_check.sh`` as one prepared call inside its time."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks import _common, gpu_overhead

pytestmark = pytest.mark.filterwarnings("ignore")

CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


def test_plan_epochs_sizes_the_fit_from_the_steady_last_epoch():
    # epochs of 3.0 s (the first, with the one-off start), 2.0 s and 2.0 s; 1.0 s around them
    plan = gpu_overhead.plan_epochs(8.0, [0.5, 3.5, 5.5], 7.5, min_fit_s=60.0)
    assert plan["epoch_s"] == pytest.approx(2.0) and plan["fixed_s"] == pytest.approx(1.0)
    assert plan["epochs"] == math.ceil((1.05 * 60.0 - 1.0) / 2.0) == 31
    assert plan["predicted_fit_s"] >= 60.0
    assert gpu_overhead.plan_epochs(8.0, [0.5, 3.5, 5.5], 7.5, min_fit_s=0.1)["epochs"] == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"min_fit_s": 0.0}, "min_fit_s"),
    ({"fit_s": -1.0}, "fit_s"),
    ({"epoch_starts": []}, "epoch_starts"),
    ({"epoch_starts": [0.0, 2.0], "train_end": 1.0}, "epoch_starts / train_end"),
])
def test_plan_epochs_refuses_bad_input_naming_it(kwargs, match):
    args = {"fit_s": 5.0, "epoch_starts": [0.0, 2.0], "train_end": 4.0, "min_fit_s": 60.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        gpu_overhead.plan_epochs(**args)


def test_steady_step_leaves_out_the_epoch_boundaries_and_the_first_epoch():
    # epoch 0: steps of 1 s after a slow first batch; epoch 1: 0.5 s steps after a 10 s boundary
    starts = [(0, 0.0), (0, 5.0), (0, 6.0), (0, 7.0), (1, 17.0), (1, 17.5), (1, 18.0), (1, 18.5)]
    assert gpu_overhead.steady_step_s(starts) == pytest.approx(0.5)
    assert gpu_overhead.steady_step_s(starts[:4]) == pytest.approx(1.0)  # one epoch: that one
    assert gpu_overhead.steady_step_s([(0, 0.0), (0, 1.0)]) is None


def _fit(fit_s: float, steps: int = 100, epochs: int = 4, step_s: float | None = 0.01, **phases: float):
    out = {"fit_s": fit_s, "steps": steps, "epochs": epochs, "step_s": step_s}
    if phases:
        out["phases_s"] = {"start": 0.0, "epoch": 0.0, "end": 0.0, **phases}
    return out


def test_decompose_reports_the_fixed_costs_and_the_per_step_marginal_apart():
    base = _fit(60.0)
    audit = _fit(62.0, step_s=0.0105, start=0.2, epoch=0.4, end=0.9)
    d = gpu_overhead.decompose(base, audit)
    assert d["added_s"] == pytest.approx(2.0)
    assert (d["fit_start_s"], d["epochs_s"], d["fit_end_s"]) == pytest.approx((0.2, 0.4, 0.9))
    assert d["per_epoch_s"] == pytest.approx(0.1)
    assert d["per_step_marginal_ms"] == pytest.approx(1e3 * (2.0 - 1.5) / 100)  # 5 ms
    assert d["per_step_all_in_ms"] == pytest.approx(1e3 * (2.0 - 1.1) / 100)
    assert d["per_step_direct_ms"] == pytest.approx(0.5)
    assert gpu_overhead.decompose(_fit(60.0, step_s=None), audit)["per_step_direct_ms"] is None
    with pytest.raises(ValueError, match="base / audit"):
        gpu_overhead.decompose(_fit(60.0, steps=99), audit)
    with pytest.raises(ValueError, match="phases_s"):
        gpu_overhead.decompose(base, _fit(62.0))


def test_targets_pass_only_on_a_fit_long_enough():
    def summary(base_s: float, ratio: float, marginal_s: float) -> dict:
        blocks = [{"baseline": _fit(base_s),
                   "canary": _fit(base_s * ratio, start=0.0, epoch=0.0, end=0.0 + (base_s * ratio - base_s) - marginal_s),
                   "all_three": _fit(base_s * ratio, start=0.0, epoch=0.0, end=0.1)}]
        return gpu_overhead.summarise_blocks(blocks, ["canary", "all_three"])

    # 1.05x on a 61 s fit, 0.03 s over 100 steps: 0.3 ms a step
    good = gpu_overhead.target_checks(summary(61.0, 1.05, 0.03), [61.0])
    assert good["pass"] and good["canary_ratio"]["pass"] and good["all_three_ratio"]["pass"]
    assert good["per_step_marginal_ms"]["value"] == pytest.approx(0.3)
    assert good["per_step_marginal_ms"]["pass"] and good["fit_long_enough"]["value"] == 61.0
    short = gpu_overhead.target_checks(summary(30.0, 1.05, 0.03), [30.0])
    assert not short["pass"] and short["canary_ratio"]["holds"] and not short["canary_ratio"]["pass"]
    slow = gpu_overhead.target_checks(summary(61.0, 1.12, 0.2), [61.0])
    assert not slow["pass"] and not slow["canary_ratio"]["holds"] and slow["all_three_ratio"]["holds"]
    assert slow["per_step_marginal_ms"]["value"] == pytest.approx(2.0) and not slow["per_step_marginal_ms"]["holds"]


def _fake_fits(fail_at: str | None = None):
    """``opacus_fit`` without training: a calibration of 7.5 s (epochs of 4 s and 3 s), 60 s
    baseline fits, audited
    fits of 63 s (canary) and 66 s (all three) with 0.5 s at fit end; KeyboardInterrupt when a
    fit's name is ``fail_at``."""
    names: list[str] = []

    def fit(dm, epochs, variant, device, log_root, name, timer=None, clock=None, rare=None):
        names.append(name)
        if name == fail_at:
            raise KeyboardInterrupt
        fit_s = 7.5 if name == "opacus_calibration" else {"baseline": 60.0, "canary": 63.0, "all_three": 66.0}[variant]
        out = {"fit_s": fit_s, "steps": 100,
               "epochs": epochs, "step_s": 0.01, "epoch_starts": [0.0, 4.0], "train_end": 7.0}
        if rare is not None:
            out["phases_s"] = {"start": 0.1, "epoch": 0.4, "end": 0.5}
        return out
    return fit, names


def _long(monkeypatch, **kwargs):
    saved: list[dict] = []
    args = {"min_fit_s": 60.0, "epochs": None, "reps": None, "budget_s": None, "started": 0.0, "warmup": True,
            "save": lambda res: saved.append(json.loads(json.dumps(res))), **kwargs}
    return gpu_overhead.long_fit_opacus(None, {"calibration_epochs": 2}, None, "", **args), saved


def test_a_long_run_plans_warms_up_and_runs_one_block_by_default(monkeypatch):
    fit, names = _fake_fits()
    monkeypatch.setattr(gpu_overhead, "opacus_fit", fit)
    res, saved = _long(monkeypatch)
    assert names == ["opacus_calibration", "opacus_warmup_canary", "opacus_warmup_all_three",
                     "opacus_baseline_0", "opacus_canary_0", "opacus_all_three_0"]
    assert res["long_fit"]["epochs"] == math.ceil((1.05 * 60.0 - 0.5) / 3.0) and res["long_fit"]["complete"]
    assert len(saved) == 3 and res["variants"]["canary"]["median_ratio"] == pytest.approx(1.05)
    # 3 s added, 1 s of it start, epochs and end: 2 s over 100 steps
    assert res["variants"]["canary"]["costs"]["per_step_marginal_ms"]["median"] == pytest.approx(20.0)
    assert res["targets"]["canary_ratio"]["pass"] and not res["targets"]["pass"]  # 20 ms a step
    assert _long(monkeypatch, budget_s=1.0, started=time.perf_counter() - 2.0)[0]["long_fit"]["blocks"] == 1
    res2, _ = _long(monkeypatch, reps=2)
    assert res2["long_fit"]["blocks"] == 2
    assert names[-3:] == ["opacus_all_three_1", "opacus_canary_1", "opacus_baseline_1"]  # reversed


def test_a_long_run_stopped_mid_block_keeps_the_fits_it_finished(monkeypatch):
    fit, _ = _fake_fits(fail_at="opacus_all_three_0")
    monkeypatch.setattr(gpu_overhead, "opacus_fit", fit)
    saved: list[dict] = []
    with pytest.raises(KeyboardInterrupt):
        gpu_overhead.long_fit_opacus(None, {"calibration_epochs": 2}, None, "", min_fit_s=60.0, epochs=None,
                                     reps=None, budget_s=None, started=0.0, warmup=False, save=saved.append)
    last = saved[-1]
    assert not last["long_fit"]["complete"] and last["long_fit"]["blocks"] == 0
    assert set(last["variants"]) == {"canary"} and last["variants"]["canary"]["median_ratio"] == pytest.approx(1.05)
    assert "all_three_ratio" not in last["targets"] and last["targets"]["pass"] is False


def test_a_tiny_long_fit_on_the_cpu_writes_the_costs_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "RESULTS_DIR", tmp_path)
    payload = gpu_overhead.main(["--accelerator", "cpu", "--scenarios", "opacus", "--quick", "--min-fit-s", "1",
                                 "--opacus-examples", "64", "--opacus-batch-size", "16", "--val-examples", "32",
                                 "--output", "long.json"])
    saved = json.loads((tmp_path / "long.json").read_text())
    assert saved["min_fit_s"] == 1.0 and saved["pass"] is False  # a 1 s fit decides nothing
    op = saved["opacus"]
    assert op["long_fit"]["epochs"] >= 1 and op["long_fit"]["blocks"] == 1
    assert op["long_fit"]["steps"] == op["blocks"][0]["baseline"]["steps"] > 0
    for v in ("canary", "all_three"):
        r = op["variants"][v]
        assert r["median_ratio"] > 0 and len(r["pair_ratios"]) == 1
        costs = r["costs"]
        for key in ("fit_start_s", "per_epoch_s", "fit_end_s", "per_step_marginal_ms", "per_step_direct_ms"):
            assert math.isfinite(costs[key]["median"]), (v, key)
        assert costs["fit_end_s"]["median"] > 0  # the final estimate and report: measured, not zero
        d = costs["blocks"][0]
        assert d["per_step_marginal_ms"] != d["per_step_all_in_ms"] or d["epochs_s"] == 0
        hooks = op["blocks"][0][v]["hooks"]
        assert "end:CanaryAudit.on_train_end" in hooks and not [h for h in hooks if "batch" in h]
    t = saved["opacus"]["targets"]
    assert {"fit_long_enough", "canary_ratio", "all_three_ratio", "per_step_marginal_ms", "pass"} <= set(t)
    assert t["canary_ratio"]["target"] == 1.10 and t["all_three_ratio"]["target"] == 1.15
    assert t["per_step_marginal_ms"]["target"] == 0.5 and not t["fit_long_enough"]["holds"]
    assert payload["opacus"]["targets"] == saved["opacus"]["targets"]


@pytest.mark.parametrize("flag, value", [("--min-fit-s", "-1"), ("--calibration-epochs", "1"),
                                         ("--budget-s", "0"), ("--opacus-batch-size", "0")])
def test_bad_long_fit_flags_are_refused_naming_them(flag, value):
    with pytest.raises(ValueError, match=flag):
        gpu_overhead.main(["--accelerator", "cpu", "--scenarios", "opacus", flag, value])


def _dry_run(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DRY_RUN": "1", "OUT": "", **env})


def test_gpu_check_is_one_call_that_fits_its_time():
    assert subprocess.run(["bash", "-n", str(CHECK)], capture_output=True, timeout=30).returncode == 0
    run = _dry_run()
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [ln for ln in run.stdout.splitlines() if ln.startswith("== ") and "[limit" in ln]
    assert [s.split("] ")[1].split()[0] for s in steps] == ["gpu_overhead", "ops_per_step", "per_step_profile"]
    assert "--min-fit-s 60" in steps[0] and "--models mlp6,mlp48,transformer --steps 10" in steps[1]
    limits = [int(s.split("[limit ")[1].split("s]")[0]) for s in steps]
    assert sum(limits) <= 540 - 5
    short = _dry_run(TOTAL_S="200")  # too little left for the later steps: they are skipped, not run
    assert "!! ops_per_step skipped" in short.stdout and short.returncode == 1
