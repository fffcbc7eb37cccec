"""Cost of CanaryAudit (Hadamard and Gaussian canaries) on DP-FedAvg: wall ratio, the audit's
own time, the estimation pass at d = 10^6 and peak memory.

    PYTHONPATH=. .venv/bin/python benchmarks/canary_overhead.py            # full, ~12 min on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/canary_overhead.py --quick    # smoke test, < 1 min
    PYTHONPATH=. .venv/bin/python benchmarks/canary_overhead.py --accelerator gpu   # fits on CUDA

Every fit runs in this process (except the memory fits): the data module is built once per
scenario; a fit builds a fresh model and ``DPFedAvg`` module from seed 0 and uses the same
Trainer (TensorBoardLogger into a temporary folder, no checkpointing, no progress bar), timed
with ``perf_counter`` around ``trainer.fit``. Timed pairs run in ABBA order (baseline-audit,
audit-baseline, ...), so a machine that drifts slower or faster favours neither side; the ratio
is the median of the pairs' ratios audited / baseline with its sign-test interval. Canary
clients are sampled like real clients (Andrew et al. 2024 Alg. 2), so the audited run samples
``clients_per_round * (N + k) / N`` clients a round: both runs train the same real updates.

(1) federated: a wider SmallCNN (~1.26e5 parameters) on digits split over 500 clients, 50 a
    round, one local epoch at batch 1 (about 3 SGD steps a client), 100 rounds with an estimate
    every 25 (issue 28: >= 100 rounds, so that the fixed fit-end cost is amortised as in a real
    run), 1000 Hadamard canaries (default k'); ``--fed-kinds hadamard,gaussian`` adds Gaussian
    canaries (their pairs interleaved with the Hadamard ones; ~90 s a fit at 100 rounds).
(2) demo: ``make demo``'s run (50 rounds, 1,400 clients, 310 a round, MLP 64-200-10, z = 2,
    local lr 0.5, ``CanaryAudit(150)``). The audit's own time is measured by wrapping the callback's hooks and
    the backend's protocol calls (``client_update_sum``, ``client_updates``,
    ``on_round_released``; ``perf_counter`` and ``thread_time``, all on the training thread) and
    reported as a share of the baseline fit.
(3) pass: the estimation pass ``CanaryStatistics.compute`` at d = 10^6 after one round, for
    Gaussian canaries (k = k' = 1000: 2000 canaries regenerated) and Hadamard canaries
    (k = 1000, k' = 10^5: one transform), against ``torch.randn`` alone; the per-round
    ``add_delta`` of Hadamard canaries and the canary sum of a round; torch on 1 and 2 threads.
(4) memory: peak RSS of a short fit of an MLP with ~1e6 parameters with and without
    ``CanaryAudit(1000, 1000)``, each variant in its own subprocess.

``--accelerator {auto,cpu,gpu}`` (default auto: CUDA when torch sees it) picks the Trainer's
device for (1), (2) and (4), and the device of the vectors of (3); CUDA timings synchronise the
device around every timed interval.

Output: tables on stdout and ``benchmarks/results/canary_overhead.json``
(``canary_overhead_<device>.json`` on a device other than the CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canary.statistics import CanaryStatistics
from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.federated import DPFedAvg
from benchmarks._common import (
    ROOT,
    HookTimer,
    add_accelerator_argument,
    device_name,
    git_state,
    interleaved_pairs,
    load_average,
    machine_info,
    median_interval,
    parser,
    peak_rss_mb,
    synchronize,
    timed_fit,
    torch_device,
    trainer_kwargs,
    write_json,
)
from datamodules import FederatedDataModule
from models import MLP, build_model

KINDS = ("hadamard", "gaussian")


def quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*canary clients.*")  # crowding: compensated
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")


# ---------------------------------------------------------------------------------- one fit
def make_model(dm: FederatedDataModule, cfg: dict[str, Any]) -> torch.nn.Module:
    if cfg["model"] == "mlp":
        return MLP(math.prod(dm.input_shape), dm.num_classes, hidden=tuple(cfg["hidden"]))
    return build_model("cnn", dm.input_shape, dm.num_classes, **cfg.get("cnn", {}))


def fit_once(
    dm: FederatedDataModule, cfg: dict[str, Any], audit_kwargs: dict[str, Any] | None,
    log_root: str, name: str,
) -> dict[str, Any]:
    """Fit a fresh model for ``cfg['rounds']`` rounds, with ``CanaryAudit(**audit_kwargs)``
    unless None (then ``clients_per_round`` is the baseline's)."""
    pl.seed_everything(cfg["seed"], verbose=False)
    audit = timer = None
    per_round = cfg["clients_per_round"]
    if audit_kwargs is not None:
        audit = CanaryAudit(**audit_kwargs)
        timer = HookTimer()
        timer.attach_audit(audit)
        per_round = audited_per_round(cfg, audit_kwargs["num_canaries"])
    module = DPFedAvg(
        make_model(dm, cfg), clients_per_round=per_round, noise_multiplier=cfg["noise_multiplier"],
        clip_norm=cfg["clip_norm"], local_epochs=cfg["local_epochs"], local_lr=cfg["local_lr"],
        local_batch_size=cfg["local_batch_size"], server_lr=cfg["server_lr"],
        server_momentum=cfg["server_momentum"], sampling=cfg["sampling"], delta=cfg["delta"],
        seed=cfg["seed"],
    )
    local = {"s": 0.0, "n": 0}
    inner = module._local_update

    def timed_local(cid: int, flat: torch.Tensor) -> Any:
        t = time.perf_counter()
        try:
            return inner(cid, flat)
        finally:
            local["s"] += time.perf_counter() - t
            local["n"] += 1

    module._local_update = timed_local  # instance attribute, both variants
    trainer = pl.Trainer(
        max_steps=cfg["rounds"], max_epochs=-1, logger=TensorBoardLogger(log_root, name=name),
        callbacks=[audit] if audit is not None else [], **trainer_kwargs(cfg["accelerator"]),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, log_every_n_steps=5,
    )
    main0 = time.thread_time()
    elapsed = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {
        "fit_s": elapsed,
        "main_thread_cpu_s": time.thread_time() - main0,
        "real_client_updates": local["n"],
        "local_update_s": local["s"],
        "num_parameters": module.num_parameters,
        "clients_per_round": per_round,
        "val_accuracy": _metric(trainer, "val/accuracy"),
    }
    if audit is not None and timer is not None:
        out.update(
            audit_wall_s=timer.totals()["wall_s"], audit_cpu_s=timer.totals()["cpu_s"],
            audit_wall_by_call_s=dict(timer.wall), audit_cpu_by_call_s=dict(timer.cpu),
            audit_calls=dict(timer.calls), num_canaries=audit.auditor.num_canaries,
            num_unobserved=audit.auditor.num_unobserved,
            canary_participations=int(audit.auditor.participations.sum()),
        )
        rep = audit.last_report
        if rep is not None:
            out["epsilon"] = {k: _value(rep, f"epsilon_{k}") for k in ("final_model", "all_iterates")}
            out["epsilon"]["analytic"] = rep.epsilon_analytic
    return out


def audited_per_round(cfg: dict[str, Any], k: int) -> int:
    """A cohort grown by (N + k) / N keeps the real clients a round."""
    n = cfg["clients"]
    return round(cfg["clients_per_round"] * (n + k) / n)


def matched_baseline(cfg: dict[str, Any], variants: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The baseline's configuration: ``cfg`` with ``server_lr`` scaled by its cohort over the
    audited cohort. ``DPFedAvg`` divides the noisy sum of a round's updates by
    ``clients_per_round``, so the audited run (the cohort grown by (N + k) / N) moves the model
    by its real updates and its noise divided by the larger cohort; the scaled baseline takes
    the same step on the same real updates with noise of the same standard deviation, i.e. the
    same training without the canaries. Unscaled, the federated scenario's baseline took steps
    3x as large and diverged (validation accuracy 0.19-0.64 against the audited run's 0.94).
    Variants with different numbers of canaries: ``cfg`` unchanged."""
    ks = {kw["num_canaries"] for kw in variants.values() if kw is not None}
    if len(ks) != 1:
        return dict(cfg)
    return dict(cfg, server_lr=cfg["server_lr"] * cfg["clients_per_round"] / audited_per_round(cfg, ks.pop()))


def _value(report: Any, key: str) -> float | None:
    try:
        return report.value(key)
    except Exception:  # noqa: BLE001 - a name the report does not have: not needed for timing
        return None


def _metric(trainer: pl.Trainer, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


# ---------------------------------------------------------------------------------- ABBA pairs
def abba(
    dm: FederatedDataModule, cfg: dict[str, Any], variants: dict[str, dict[str, Any]], reps: int,
    log_root: str, label: str, warmup: bool = True,
) -> dict[str, Any]:
    """``reps`` ABBA pairs (baseline vs each audited variant; variants interleaved), after one
    untimed warm-up fit of each (unless ``warmup`` is False). Returns per-variant ratios and
    raw runs."""

    base_cfg = matched_baseline(cfg, variants)

    def one(variant: str, i: int) -> dict[str, Any]:
        kwargs = variants.get(variant)
        res = fit_once(dm, cfg if kwargs is not None else base_cfg, kwargs, log_root, f"{label}_{variant}_{i}")
        extra = ""
        if kwargs is not None:
            extra = (f", audit {res['audit_cpu_s']:.2f} s CPU / {res['audit_wall_s']:.2f} s wall"
                     f" (k = {res['num_canaries']}, k' = {res['num_unobserved']})")
        print(f"  {variant:9s} {i:2d}: fit {res['fit_s']:7.2f} s, {res['real_client_updates']} real"
              f" updates ({res['local_update_s']:.2f} s){extra}", flush=True)
        return res

    warm, runs = interleaved_pairs(one, list(variants), reps, warmup)
    out: dict[str, Any] = {"config": cfg, "baseline_server_lr": base_cfg["server_lr"], "warmup": warm,
                           "variants": {}}
    for v, pairs in runs.items():
        tb = np.array([b["fit_s"] for b, _ in pairs])
        ta = np.array([a["fit_s"] for _, a in pairs])
        ratios = ta / tb
        cpu = np.array([a["audit_cpu_s"] for _, a in pairs])
        wall = np.array([a["audit_wall_s"] for _, a in pairs])
        first = pairs[0][1]
        out["variants"][v] = {
            "audit_kwargs": variants[v],
            "num_canaries": first["num_canaries"],
            "num_unobserved": first["num_unobserved"],
            "num_parameters": first["num_parameters"],
            "clients_per_round": {"baseline": cfg["clients_per_round"], "audit": first["clients_per_round"]},
            "real_client_updates": {"baseline": pairs[0][0]["real_client_updates"],
                                    "audit": first["real_client_updates"]},
            "baseline_fit_s": tb.tolist(),
            "audit_fit_s": ta.tolist(),
            "pair_ratios": ratios.tolist(),
            "median_ratio": float(np.median(ratios)),
            "median_ratio_interval": median_interval(ratios),
            "ratio_of_medians": float(np.median(ta) / np.median(tb)),
            **cpu_ratio(pairs),
            "audit_cpu_split": cost_split(pairs, cfg["rounds"]),
            "audit_cpu_s_median": float(np.median(cpu)),
            "audit_wall_s_median": float(np.median(wall)),
            "audit_cpu_share_of_baseline_median": float(np.median(cpu / tb)),
            "audit_wall_share_of_baseline_median": float(np.median(wall / tb)),
            "audit_cpu_by_call_s_median": {
                k: float(np.median([a["audit_cpu_by_call_s"].get(k, 0.0) for _, a in pairs]))
                for k in first["audit_cpu_by_call_s"]
            },
            "audit_calls": first["audit_calls"],
            "local_update_s_median": {"baseline": float(np.median([b["local_update_s"] for b, _ in pairs])),
                                      "audit": float(np.median([a["local_update_s"] for _, a in pairs]))},
            "val_accuracy": {"baseline": pairs[0][0]["val_accuracy"], "audit": first["val_accuracy"]},
            "epsilon": first.get("epsilon"),
            "pairs": [{"baseline": b, "audit": a} for b, a in pairs],
        }
    return out


def cpu_ratio(pairs: list[tuple[dict, dict]]) -> dict[str, Any]:
    """The training thread's CPU seconds (``thread_time``), audited / baseline, per pair: less
    sensitive than wall time to the other processes on the machine. Beside it, where the
    audited fit's extra seconds go (medians over the pairs): the audit's own CPU, the rest of
    the training thread's extra CPU (the local training's wall change, the same real updates,
    given apart: most of it when the audit's vectors evict the training's caches), and the
    fit's wall time off the training thread's CPU (waiting: other threads holding the GIL,
    e.g. the TensorBoard writer, file syncs, the machine's other processes)."""
    r = np.array([a["main_thread_cpu_s"] / b["main_thread_cpu_s"] for b, a in pairs])
    extra = np.array([a["fit_s"] - b["fit_s"] for b, a in pairs])
    audit = np.array([a["audit_cpu_s"] for _, a in pairs])
    local = np.array([a["local_update_s"] - b["local_update_s"] for b, a in pairs])
    cpu = np.array([a["main_thread_cpu_s"] - b["main_thread_cpu_s"] for b, a in pairs])
    wait = np.array([(a["fit_s"] - a["main_thread_cpu_s"]) - (b["fit_s"] - b["main_thread_cpu_s"])
                     for b, a in pairs])
    return {"cpu_pair_ratios": r.tolist(), "cpu_median_ratio": float(np.median(r)),
            "cpu_median_ratio_interval": median_interval(r),
            "extra_wall_s_median": {"total": float(np.median(extra)), "audit_cpu": float(np.median(audit)),
                                    "local_training": float(np.median(local)),
                                    "other_training_thread_cpu": float(np.median(cpu - audit)),
                                    "off_training_thread_cpu": float(np.median(wait))}}


#: The audit's hooks by the part of the fit they cost in: once a fit, at each estimate, each round.
FIXED_HOOKS = ("setup", "on_fit_start", "on_train_end", "on_fit_end", "teardown")
ESTIMATE_HOOKS = ("on_validation_epoch_end", "on_train_epoch_end")


def cost_split(pairs: list[tuple[dict, dict]], rounds: int) -> dict[str, Any]:
    """The audit's own CPU seconds split by when they are paid (medians over the pairs, each
    as a share of its pair's baseline fit): ``fixed`` once a fit (the plan at fit start; the
    summary, bounds, figures and report at fit end), ``estimates`` at each periodic estimate,
    ``per_round`` every round (the canary clients' updates and the release folded in; also
    in ms a round against the baseline's ms a round). ``floor_ratio`` = 1 + (fixed +
    estimates) / baseline: the wall ratio the fit would have if the per-round audit work cost
    nothing, i.e. what the fit's length and its estimates alone leave to the rounds."""
    def part(a: dict, hooks: tuple[str, ...] | None) -> float:
        by = a["audit_cpu_by_call_s"]
        if hooks is None:
            return sum(v for k, v in by.items() if k not in FIXED_HOOKS + ESTIMATE_HOOKS)
        return sum(by.get(k, 0.0) for k in hooks)

    tb = np.array([b["fit_s"] for b, _ in pairs])
    fixed = np.array([part(a, FIXED_HOOKS) for _, a in pairs])
    est = np.array([part(a, ESTIMATE_HOOKS) for _, a in pairs])
    per = np.array([part(a, None) for _, a in pairs])
    return {"fixed_s": float(np.median(fixed)), "estimates_s": float(np.median(est)),
            "per_round_s": float(np.median(per)),
            "fixed_share": float(np.median(fixed / tb)), "estimates_share": float(np.median(est / tb)),
            "per_round_share": float(np.median(per / tb)),
            "per_round_ms": float(np.median(per)) * 1e3 / rounds,
            "baseline_round_ms": float(np.median(tb)) * 1e3 / rounds,
            "floor_ratio": float(np.median(1.0 + (fixed + est) / tb))}


def print_abba(title: str, res: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"  {'kind':9s} {'k':>5} {'kprime':>7} {'d':>8} {'base s':>7} {'audit s':>7} "
          f"{'ratio [interval] (coverage)':>33} {'audit CPU s':>11} {'share':>6}")
    for v, r in res["variants"].items():
        ci = r["median_ratio_interval"]
        print(f"  {v:9s} {r['num_canaries']:5d} {r['num_unobserved']:7d} {r['num_parameters']:8d} "
              f"{np.median(r['baseline_fit_s']):7.2f} {np.median(r['audit_fit_s']):7.2f} "
              f"{r['median_ratio']:9.3f} [{ci['lower']:.3f}, {ci['upper']:.3f}] ({100 * ci['coverage']:.0f}%) "
              f"{r['audit_cpu_s_median']:11.2f} {100 * r['audit_cpu_share_of_baseline_median']:5.1f}%")
        cc = r["cpu_median_ratio_interval"]
        ex = r["extra_wall_s_median"]
        print(f"            training-thread CPU ratio {r['cpu_median_ratio']:.3f} [{cc['lower']:.3f}, "
              f"{cc['upper']:.3f}]; extra wall {ex['total']:.2f} s ~ audit CPU {ex['audit_cpu']:.2f} + other "
              f"training-thread CPU {ex['other_training_thread_cpu']:+.2f} (local training's wall "
              f"{ex['local_training']:+.2f}) + off the thread's CPU {ex['off_training_thread_cpu']:+.2f} (medians)")
        sp = r["audit_cpu_split"]
        print(f"            audit CPU: fixed {sp['fixed_s']:.2f} s ({100 * sp['fixed_share']:.1f}%), estimates "
              f"{sp['estimates_s']:.2f} s ({100 * sp['estimates_share']:.1f}%), per round {sp['per_round_ms']:.2f} ms "
              f"of the baseline's {sp['baseline_round_ms']:.1f} ms ({100 * sp['per_round_share']:.1f}%); "
              f"with no per-round work the ratio would be {sp['floor_ratio']:.3f}")
        calls = ", ".join(f"{k} {s:.2f}" for k, s in sorted(r["audit_cpu_by_call_s_median"].items(),
                                                           key=lambda kv: -kv[1]) if s >= 0.005)
        print(f"            pairs {', '.join(f'{x:.3f}' for x in r['pair_ratios'])}; audit CPU by call (s): "
              f"{calls}; real updates {r['real_client_updates']['audit']} / "
              f"{r['real_client_updates']['baseline']}", flush=True)


# ---------------------------------------------------------------------------------- (3) pass
def pass_benchmark(dim: int, k: int, k_gauss_un: int, k_had_un: int, threads: list[int],
                   device: torch.device | None = None) -> dict[str, Any]:
    """Seconds of the estimation pass (``compute`` after one ``add_delta``) at ``dim``, the
    model's vectors on ``device`` (default the CPU; the statistics follow them)."""
    device = device or torch.device("cpu")
    out: dict[str, Any] = {"dim": dim, "k": k, "gaussian_unobserved": k_gauss_un,
                           "hadamard_unobserved": k_had_un, "device": str(device), "by_threads": {}}
    gen = torch.Generator().manual_seed(1)
    theta0 = torch.zeros(dim, device=device)
    delta = torch.randn(dim, generator=gen).to(device)
    theta = theta0 + delta
    for t in threads:
        torch.set_num_threads(t)
        row: dict[str, Any] = {}
        # torch.randn alone: the physical limit of regeneration (same generator use as the canaries)
        buf = torch.empty(dim, device=device)
        g = torch.Generator(device=device)

        def draws(n: int = 20, g: torch.Generator = g, buf: torch.Tensor = buf) -> None:
            for i in range(n):
                g.manual_seed(i)
                torch.randn(dim, generator=g, out=buf)

        _, times = _median_of(draws, 3)
        row["randn_draws_per_s"] = 20 * dim / min(times)
        # Gaussian: k + k' canaries regenerated once, against one buffered round and the release
        gstats = CanaryStatistics(CanarySet(0, dim, k + k_gauss_un, kind="gaussian"), k, k_gauss_un)
        gstats.set_initial(theta0)
        gstats.add_delta(delta)
        synchronize()
        t0 = time.perf_counter()
        gstats.compute(theta)
        synchronize()
        row["gaussian_pass_s"] = time.perf_counter() - t0
        row["gaussian_draws_per_s"] = (k + k_gauss_un) * dim / row["gaussian_pass_s"]
        # Hadamard: one transform scores every canary
        hset = CanarySet(0, dim, k + k_had_un, kind="hadamard")
        hstats = CanaryStatistics(hset, k, k_had_un)
        hstats.set_initial(theta0)
        hstats.add_delta(delta)
        reps: list[float] = []
        for i in range(5):
            th = theta + i * 1e-3  # a new model each time: no cached result
            synchronize()
            t0 = time.perf_counter()
            hstats.compute(th)
            synchronize()
            reps.append(time.perf_counter() - t0)
        row["hadamard_pass_s"] = float(np.median(reps))
        row["hadamard_pass_s_all"] = reps
        row["hadamard_add_delta_s"], row["hadamard_add_delta_s_all"] = _median_of(
            lambda h=hstats: h.add_delta(delta), 5)
        # the transform alone (indices=None): add_delta passes range(k + k') as a list
        row["hadamard_dots_no_indices_s"], _ = _median_of(lambda h=hset: h.dots(delta), 5)
        idx = list(range(0, k, 25))  # a round's canary clients (40)
        row["hadamard_round_sum_s"], _ = _median_of(lambda h=hset, i=idx: h.sum(i), 5)
        row["speedup_gaussian_over_hadamard"] = row["gaussian_pass_s"] / row["hadamard_pass_s"]
        out["by_threads"][str(t)] = row
        print(f"  threads {t}: randn {row['randn_draws_per_s'] / 1e6:6.0f} M/s; Gaussian pass "
              f"({k}+{k_gauss_un}) {row['gaussian_pass_s']:6.2f} s = "
              f"{row['gaussian_draws_per_s'] / 1e6:.0f} M draws/s; Hadamard pass ({k}+{k_had_un}) "
              f"{row['hadamard_pass_s']:.3f} s ({row['speedup_gaussian_over_hadamard']:.0f}x faster); "
              f"Hadamard add_delta {row['hadamard_add_delta_s']:.3f} s (transform alone "
              f"{row['hadamard_dots_no_indices_s']:.3f} s); sum of {len(idx)} canaries "
              f"{row['hadamard_round_sum_s']:.3f} s", flush=True)
    return out


def per_round_hadamard(dim: int, k: int, k_un: int, device: torch.device | None = None) -> dict[str, Any]:
    """One round's fold at ``dim`` (the federated CNN's d): ``add_delta`` against the transform
    alone (``dots`` with indices=None), on the current thread count, vectors on ``device``."""
    device = device or torch.device("cpu")
    hset = CanarySet(0, dim, k + k_un, kind="hadamard")
    hstats = CanaryStatistics(hset, k, k_un)
    hstats.set_initial(torch.zeros(dim, device=device))
    delta = torch.randn(dim, generator=torch.Generator().manual_seed(2)).to(device)
    hstats.add_delta(delta)
    idx = list(range(k + k_un))
    out = {"dim": dim, "k": k, "unobserved": k_un, "threads": torch.get_num_threads(), "device": str(device)}
    out["add_delta_s"], _ = _median_of(lambda: hstats.add_delta(delta), 9)
    out["dots_no_indices_s"], _ = _median_of(lambda: hset.dots(delta), 9)
    out["index_list_s"], _ = _median_of(lambda: torch.as_tensor(hset._check_indices(idx)), 9)
    print(f"  d = {dim:,}, k + k' = {k + k_un:,}: add_delta {1e3 * out['add_delta_s']:.1f} ms a round; "
          f"the transform and selection alone (dots, indices=None) {1e3 * out['dots_no_indices_s']:.1f} ms; "
          f"checking and converting range(k + k') as a list {1e3 * out['index_list_s']:.1f} ms", flush=True)
    return out


def _median_of(fn: Any, n: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(n):
        synchronize()
        t = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), times


# ---------------------------------------------------------------------------------- (4) memory
def memory_child(variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: one short fit at d ~ 1e6; returns a JSON-able dict."""
    dm = FederatedDataModule("digits", num_clients=cfg["clients"],
                             rounds_per_epoch=cfg["rounds_per_epoch"], seed=cfg["seed"])
    dm.setup("fit")
    rss_setup = peak_rss_mb()
    reset = _reset_peak()  # the imports' peak would hide the fit's: VmHWM restarts here
    kwargs = None if variant == "baseline" else {
        "num_canaries": cfg["num_canaries"], "num_unobserved": cfg["num_unobserved"], "canaries": variant}
    with tempfile.TemporaryDirectory() as log_root:
        res = fit_once(dm, cfg, kwargs, log_root, f"memory_{variant}")
    res.update(variant=variant, peak_rss_before_fit_mib=rss_setup, peak_rss_mib=peak_rss_mb(),
               fit_peak_rss_mib=_vm_hwm_mib() if reset else None, torch_threads=torch.get_num_threads())
    return res


def _reset_peak() -> bool:
    """Reset the kernel's peak RSS (VmHWM) of this process (Linux; False elsewhere)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _vm_hwm_mib() is not None
    except OSError:
        return False


def _vm_hwm_mib() -> float | None:
    """VmHWM of /proc/self/status (peak RSS since the last reset), in MiB."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def memory_benchmark(cfg: dict[str, Any], threads: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for variant in ("baseline", *KINDS):
        cmd = [sys.executable, "-m", "benchmarks", "canary_overhead", "--memory-child", variant,
               "--memory-config", json.dumps(cfg), "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {variant} failed:\n{proc.stderr[-4000:]}")
        res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
        results[variant] = res
        extra = "" if variant == "baseline" else f", audit CPU {res['audit_cpu_s']:.1f} s"
        hwm = res["fit_peak_rss_mib"]
        print(f"  {variant:9s}: d = {res['num_parameters']:,}, peak RSS {res['peak_rss_mib']:7.1f} MiB "
              f"(before fit {res['peak_rss_before_fit_mib']:.1f}; during the fit {hwm or float('nan'):.1f}), "
              f"fit {res['fit_s']:.1f} s{extra}", flush=True)
    # the peak during the fit (VmHWM reset after the imports) where the kernel allows it
    key = "fit_peak_rss_mib" if all(r["fit_peak_rss_mib"] for r in results.values()) else "peak_rss_mib"
    base = results["baseline"][key]
    out: dict[str, Any] = {"config": cfg, "runs": results, "target_mb": 100, "measure": key,
                           "difference": {}}
    for kind in KINDS:
        diff = results[kind][key] - base
        out["difference"][kind] = {"mib": diff, "mb": diff * 2**20 / 1e6,
                                   "process_peak_mib": results[kind]["peak_rss_mib"] - results["baseline"]["peak_rss_mib"]}
        print(f"  -> {kind}: audit - baseline = {diff:+.1f} MiB ({diff * 2**20 / 1e6:+.1f} MB; target <= 100 MB; "
              f"{key})")
    return out


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, quick="smoke test: tiny versions of everything", output="file name under benchmarks/results/")
    p.add_argument("--fed-rounds", type=int, default=100, help="(1) rounds a fit (issue 28: >= 100)")
    p.add_argument("--fed-rounds-per-epoch", type=int, default=25, help="(1) rounds between estimates")
    p.add_argument("--fed-reps", type=int, default=5, help="(1) ABBA pairs per kind")
    p.add_argument("--fed-kinds", default="hadamard",
                   help="(1) canary kinds, comma-separated: hadamard (default), gaussian")
    p.add_argument("--fed-canaries", type=int, default=1000,
                   help="(1) num_canaries (default 1000, issue 28's; 55 keeps the canaries under 10%% "
                        "of the 500 clients' cohorts, the share the audit warns at)")
    p.add_argument("--demo-rounds", type=int, default=50, help="(2) rounds (make demo's)")
    p.add_argument("--demo-reps", type=int, default=3, help="(2) ABBA pairs")
    p.add_argument("--pass-dim", type=int, default=1_000_000, help="(3) d")
    p.add_argument("--pass-threads", default="1,2", help="(3) torch threads, comma-separated")
    p.add_argument("--memory-rounds", type=int, default=4)
    p.add_argument("--skip", default="", help="comma-separated: federated,demo,pass,memory")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the fits (default 1)")
    add_accelerator_argument(p)
    p.add_argument("--memory-child", choices=["baseline", *KINDS], help=argparse.SUPPRESS)
    p.add_argument("--memory-config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.memory_hidden = [1000, 925]  # 64 -> 1000 -> 925 -> 10: 1,000,185 parameters
    if args.quick:
        args.fed_rounds, args.fed_rounds_per_epoch, args.fed_reps = 4, 4, 1
        args.demo_rounds, args.demo_reps, args.pass_threads = 6, 1, "1"
        args.pass_dim, args.memory_rounds, args.memory_hidden = 100_000, 2, [200, 200]
    if args.fed_canaries < 1:
        p.error(f"--fed-canaries must be >= 1, got {args.fed_canaries}")
    args.fed_kinds = [k.strip() for k in args.fed_kinds.split(",") if k.strip()]
    if not args.fed_kinds or any(k not in KINDS for k in args.fed_kinds):
        p.error(f"--fed-kinds: comma-separated names among {', '.join(KINDS)}, got {args.fed_kinds}")
    args.device = torch_device(args.accelerator)  # ValueError for gpu without CUDA
    if args.output is None:
        suffix = "" if args.device.type == "cpu" else f"_{args.device.type}"
        args.output = f"canary_overhead{suffix}{'_quick' if args.quick else ''}.json"
    return args


def train_config(**over: Any) -> dict[str, Any]:
    """A fit's configuration: ``make demo``'s, with ``over`` replacing entries (``accelerator``
    is a value of ``--accelerator``)."""
    cfg = {
        "model": "cnn", "clients": 300, "clients_per_round": 30, "rounds": 200, "rounds_per_epoch": 25,
        "local_epochs": 1, "local_lr": 0.05, "local_batch_size": 8, "server_lr": 1.0,
        "server_momentum": 0.9, "noise_multiplier": 0.1, "clip_norm": 1.0, "sampling": "shuffle",
        "delta": 1e-6, "seed": 0, "accelerator": "auto",
    }
    cfg.update(over)
    return cfg


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet()
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, json.loads(args.memory_config))))
        return None
    skip = set(filter(None, args.skip.split(",")))
    print(f"CanaryAudit overhead on {device_name(args.device)}; torch threads = {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs, load {load_average()}", flush=True)
    payload: dict[str, Any] = {
        "benchmark": "canary_overhead",
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "machine": machine_info(),
        "torch_version": torch.__version__,
        "accelerator": args.accelerator,
        "device": args.device.type,
        "device_name": device_name(args.device),
        "git": git_state(),
        "targets": {"federated_wall_ratio_max": 1.05, "demo_audit_share_max": 0.03,
                    "hadamard_pass_s_max": 0.2, "pass_speedup_min": 50, "memory_mb_max": 100},
    }
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as log_root:
        if "federated" not in skip:
            cfg = train_config(clients=500, clients_per_round=50, rounds=args.fed_rounds,
                               rounds_per_epoch=args.fed_rounds_per_epoch, local_batch_size=1,
                               noise_multiplier=0.3, cnn={"channels": [32, 64], "hidden": 400},
                               accelerator=args.accelerator)
            dm = FederatedDataModule("digits", num_clients=cfg["clients"],
                                     rounds_per_epoch=cfg["rounds_per_epoch"], seed=cfg["seed"])
            dm.setup("fit")
            print(f"\n[1] federated: wide CNN, {cfg['clients']} clients, {cfg['clients_per_round']} a round, "
                  f"{cfg['rounds']} rounds (an estimate every {cfg['rounds_per_epoch']}), batch 1; {args.fed_canaries} canaries "
                  f"({', '.join(args.fed_kinds)}), {args.fed_reps} ABBA pairs each", flush=True)
            variants = {kind: {"num_canaries": args.fed_canaries, "canaries": kind} for kind in args.fed_kinds}
            payload["federated"] = abba(dm, cfg, variants, args.fed_reps, log_root, "fed",
                                        warmup=not args.quick)
            print_abba("[1] federated scenario (ratio: median of ABBA pairs audited / baseline)",
                       payload["federated"])
        if "demo" not in skip:
            cfg = train_config(model="mlp", hidden=[200], clients=1400, clients_per_round=310,
                               noise_multiplier=2.0, local_lr=0.5,
                               rounds=args.demo_rounds, rounds_per_epoch=min(10, args.demo_rounds),
                               accelerator=args.accelerator)
            dm = FederatedDataModule("digits", num_clients=cfg["clients"],
                                     rounds_per_epoch=cfg["rounds_per_epoch"], seed=cfg["seed"])
            dm.setup("fit")
            print(f"\n[2] make demo's scenario: {cfg['rounds']} rounds, CanaryAudit(150), "
                  f"{args.demo_reps} ABBA pairs", flush=True)
            payload["demo"] = abba(dm, cfg, {"hadamard": {"num_canaries": 150}}, args.demo_reps,
                                   log_root, "demo", warmup=not args.quick)
            print_abba("[2] make demo's scenario", payload["demo"])
    if "pass" not in skip:
        threads = [int(t) for t in args.pass_threads.split(",")]
        n_had = CanarySet(0, args.pass_dim, 2, kind="hadamard").n  # the library's transform length
        k_had_un = min(100_000, n_had - 1000)
        print(f"\n[3] estimation pass at d = {args.pass_dim:,}", flush=True)
        payload["pass"] = pass_benchmark(args.pass_dim, 1000, 1000, k_had_un, threads, args.device)
        torch.set_num_threads(args.threads)
        n_cnn = CanarySet(0, 125_626, 2, kind="hadamard").n
        payload["pass"]["per_round_at_cnn_dim"] = per_round_hadamard(125_626, 1000, min(100_000, n_cnn - 1000),
                                                                     args.device)
        torch.set_num_threads(args.threads)
    if "memory" not in skip:
        mem_cfg = train_config(model="mlp", hidden=args.memory_hidden, clients=1000,
                               rounds=args.memory_rounds, rounds_per_epoch=args.memory_rounds,
                               num_canaries=1000, num_unobserved=1000, accelerator=args.accelerator)
        print(f"\n[4] memory: MLP hidden {args.memory_hidden}, 1000 clients, 30 real a round, "
              f"{args.memory_rounds} rounds; CanaryAudit(1000, 1000) of each kind, separate processes",
              flush=True)
        payload["memory"] = memory_benchmark(mem_cfg, args.threads)
    payload["total_s"] = time.perf_counter() - t_start
    payload["load_average_end"] = load_average()
    summarize(payload)
    print(f"wrote {write_json(args.output, payload)}")
    return payload


def summarize(payload: dict[str, Any]) -> None:
    print(f"\nsummary (total {payload['total_s']:.0f} s)")
    for key, target in (("federated", "ratio <= 1.05"), ("demo", "audit share <= 3%")):
        for v, r in payload.get(key, {}).get("variants", {}).items():
            ci = r["median_ratio_interval"]
            print(f"  {key:9s} {v:9s} d = {r['num_parameters']:,}: ratio {r['median_ratio']:.3f} "
                  f"[{ci['lower']:.3f}, {ci['upper']:.3f}] (training-thread CPU {r['cpu_median_ratio']:.3f}), audit CPU {r['audit_cpu_s_median']:.2f} s = "
                  f"{100 * r['audit_cpu_share_of_baseline_median']:.1f}% of the baseline fit ({target})")
    p = payload.get("pass")
    if p:
        for t, row in p["by_threads"].items():
            print(f"  pass      d = {p['dim']:,}, {t} thread(s): Gaussian {row['gaussian_pass_s']:.2f} s "
                  f"({row['gaussian_draws_per_s'] / 1e6:.0f} M/s vs randn {row['randn_draws_per_s'] / 1e6:.0f} M/s),"
                  f" Hadamard {row['hadamard_pass_s']:.3f} s ({row['speedup_gaussian_over_hadamard']:.0f}x), "
                  f"Hadamard add_delta {row['hadamard_add_delta_s']:.3f} s a round")
    m = payload.get("memory")
    if m:
        print("  memory    " + ", ".join(f"{k}: {d['mb']:+.1f} MB" for k, d in m["difference"].items())
              + f" over the baseline's {m['runs']['baseline'][m['measure']]:.0f} MiB ({m['measure']}; target <= 100 MB)")


if __name__ == "__main__":
    main()
