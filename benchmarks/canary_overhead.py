"""Cost of CanaryAudit on a DP-FedAvg run: wall-time ratio and peak memory.

    PYTHONPATH=. .venv/bin/python benchmarks/canary_overhead.py            # full, ~18 min
    PYTHONPATH=. .venv/bin/python benchmarks/canary_overhead.py --quick    # smoke test

(a) Wall time. The same DP-FedAvg run on scikit-learn digits is fitted with and without
``CanaryAudit`` in ONE process: the datamodule is built once; every fit builds a fresh model and
module from the same seed and uses the same Trainer settings (TensorBoardLogger into a temporary
folder, validation every ``--rounds-per-epoch`` rounds, no checkpointing, no progress bar). The
default run is ``make demo``'s: 200 rounds of 30 real clients. One untimed warm-up pair runs
first, then timed pairs in ABBA order (baseline-audit, audit-baseline, ...: a machine that
drifts slower or faster during the run favours neither side), and ``trainer.fit`` is timed with
``time.perf_counter``. Reported: every time, the median of the pairs' ratios audit / baseline,
the callback's own time on the training thread (its hooks, timed by a thin subclass; estimates
computed on the background thread are not in it, their cost is in the ratio), and as
diagnostics the CPU time of the training thread and of the other threads (canary generation). Canary clients are sampled like real clients (paper 003 Alg. 2), so at the same cohort
size they would take slots from real clients; the audited run therefore samples
``clients_per_round * (N + k) / N`` clients a round, which keeps the real clients a round (and,
with shuffled sampling, the real local updates of the whole run) equal to the baseline's: the
ratio compares runs that train the same real updates, with no correction.
Scenario "default" uses CanaryAudit's defaults (k = min(1000, real clients), k' = k);
scenario "k1000" sets 1000 canaries on 1000 real clients. One audited fit is then run under
cProfile and the callback's hot spots are reported.

(b) Memory at d ~ 1e6. Separate subprocesses (so ``ru_maxrss`` is isolated) run a short
DP-FedAvg fit of an MLP with ~1e6 parameters, with and without
``CanaryAudit(num_canaries=1000, num_unobserved=1000)``; the difference of their peak RSS is the
audit's memory. The wall time of each estimation pass (2000 canaries regenerated) is recorded.

Output: tables on stdout and ``benchmarks/results/canary_overhead.json``. Torch runs on one
thread (``--threads``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import math
import os
import pstats
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from _common import (
    load_average,
    machine_info,
    median_interval,
    peak_rss_mb,
    profile_tables,
    timed_fit,
    timing_subclass,
    write_json,
)
from lightning.pytorch.loggers import TensorBoardLogger

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg
from datamodules import FederatedDataModule
from models import MLP, build_model

_HOOKS = (
    "setup",
    "on_fit_start",
    "federated_client_update_sum",
    "federated_client_updates",
    "federated_client_update",
    "on_federated_round_start",
    "on_federated_round_end",
    "on_validation_epoch_end",
    "on_fit_end",
    "compute",
)


class TimedCanaryAudit(timing_subclass(CanaryAudit, _HOOKS)):
    """CanaryAudit whose hooks accumulate their own wall time (``hook_seconds``)."""

    def own_seconds(self) -> float:
        """Time inside the callback. Nested hooks are not added again: ``compute`` runs inside
        two hooks, ``federated_client_updates`` inside ``federated_client_update_sum`` (a round
        whose canaries were not generated ahead as one batch) and ``federated_client_update``
        inside ``federated_client_updates`` (a canary whose batch was not generated ahead)."""
        nested = {"compute"}
        if self.hook_calls.get("federated_client_update_sum"):
            nested.add("federated_client_updates")
        if self.hook_calls.get("federated_client_updates") or self.hook_calls.get("federated_client_update_sum"):
            nested.add("federated_client_update")
        return sum(v for k, v in self.hook_seconds.items() if k not in nested)


def quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")


# ---------------------------------------------------------------------------------- one fit
def fit_once(
    dm: FederatedDataModule,
    cfg: dict[str, Any],
    audit: CanaryAudit | None,
    log_root: str,
    name: str,
    *,
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """Fit a fresh model for ``cfg['rounds']`` rounds; returns times and counts."""
    pl.seed_everything(cfg["seed"], verbose=False)
    if cfg["model"] == "mlp_1e6":
        model = MLP(math.prod(dm.input_shape), dm.num_classes, hidden=tuple(cfg["hidden"]))
    else:
        model = build_model(cfg["model"], dm.input_shape, dm.num_classes)
    module = DPFedAvg(
        model,
        clients_per_round=cfg["clients_per_round"],
        noise_multiplier=cfg["noise_multiplier"],
        clip_norm=cfg["clip_norm"],
        local_epochs=cfg["local_epochs"],
        local_lr=cfg["local_lr"],
        local_batch_size=cfg["local_batch_size"],
        server_lr=cfg["server_lr"],
        server_momentum=cfg["server_momentum"],
        sampling=cfg["sampling"],
        delta=cfg["delta"],
        seed=cfg["seed"],
    )
    # the time spent in real clients' local training, same wrapper for both variants
    local = {"s": 0.0, "n": 0}
    inner = module._local_update

    def timed_local(cid: int, flat: torch.Tensor):
        t = time.perf_counter()
        try:
            return inner(cid, flat)
        finally:
            local["s"] += time.perf_counter() - t
            local["n"] += 1

    module._local_update = timed_local  # instance attribute: the library is not modified

    trainer = pl.Trainer(
        max_steps=cfg["rounds"],
        max_epochs=-1,
        logger=TensorBoardLogger(log_root, name=name),
        callbacks=[audit] if audit is not None else [],
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=5,
    )
    cpu0, main0 = time.process_time(), time.thread_time()
    elapsed = timed_fit(trainer, module, dm, profile)
    main_cpu = time.thread_time() - main0
    out: dict[str, Any] = {
        "fit_s": elapsed,
        # diagnostics: CPU time of the training thread, and of every other thread of the process
        # (the canary thread; TensorBoard's writer thread)
        "main_thread_cpu_s": main_cpu,
        "other_threads_cpu_s": time.process_time() - cpu0 - main_cpu,
        "real_client_updates": local["n"],
        "local_update_s": local["s"],
        "num_parameters": module.num_parameters,
        "val_accuracy": _metric(trainer, "val/accuracy"),
    }
    if isinstance(audit, TimedCanaryAudit):
        out["callback_s"] = audit.own_seconds()
        out["callback_hooks_s"] = dict(audit.hook_seconds)
        out["callback_hook_calls"] = dict(audit.hook_calls)
        out["compute_s"] = list(audit.hook_times["compute"])
        out["num_canaries"] = audit.num_canaries
        out["num_unobserved"] = audit.num_unobserved
        out["canary_participations"] = int(audit.participations.sum())
        rep = audit.last_report or {}
        est = rep.get("estimates", {})
        out["epsilon"] = {k: est[k].value for k in ("final_model", "all_iterates") if k in est}
        out["epsilon_analytic"] = rep.get("analytic_epsilon")
    return out


def audited_config(cfg: dict[str, Any], num_canaries: int) -> dict[str, Any]:
    """The audited run's config: a cohort grown by (N + k) / N keeps the real clients a round."""
    n = cfg["clients"]
    return dict(cfg, clients_per_round=round(cfg["clients_per_round"] * (n + num_canaries) / n))


def _metric(trainer: pl.Trainer, key: str) -> float | None:
    v = trainer.callback_metrics.get(key)
    return None if v is None else float(v)


# ---------------------------------------------------------------------------------- (a)
def timing_scenario(
    label: str, cfg: dict[str, Any], audit_kwargs: dict[str, Any], reps: int, log_root: str,
) -> dict[str, Any]:
    dm = FederatedDataModule(
        "digits", num_clients=cfg["clients"], rounds_per_epoch=cfg["rounds_per_epoch"],
        seed=cfg["seed"],
    )
    dm.setup("fit")
    sizes = dm.client_sizes
    print(f"\n[{label}] digits, {cfg['clients']} real clients ({min(sizes)}-{max(sizes)} examples "
          f"each), {cfg['clients_per_round']} per round, {cfg['rounds']} rounds, "
          f"{cfg['model']}, local_epochs {cfg['local_epochs']}, {cfg['sampling']} sampling, "
          f"z = {cfg['noise_multiplier']}, validation every {cfg['rounds_per_epoch']} rounds; "
          f"CanaryAudit({_kw(audit_kwargs)})", flush=True)

    k = audit_kwargs.get("num_canaries", min(1000, cfg["clients"]))
    audit_cfg = audited_config(cfg, k)

    def one(variant: str, i: int) -> dict[str, Any]:
        audit = TimedCanaryAudit(**audit_kwargs) if variant == "audit" else None
        res = fit_once(dm, audit_cfg if audit else cfg, audit, log_root, f"{label}_{variant}_{i}")
        res["variant"] = variant
        extra = ""
        if variant == "audit":
            extra = (f"  callback {res['callback_s']:.2f} s, k = {res['num_canaries']}, "
                     f"k' = {res['num_unobserved']}")
        print(f"  {variant:8s} rep {i}: fit {res['fit_s']:7.2f} s, real updates "
              f"{res['real_client_updates']:5d} ({res['local_update_s']:.2f} s){extra}",
              flush=True)
        return res

    warmup = [one("baseline", -1), one("audit", -1)]
    runs = []
    for i in range(reps):  # ABBA: baseline first in even pairs, audit first in odd ones
        order = ("baseline", "audit") if i % 2 == 0 else ("audit", "baseline")
        for variant in order:
            runs.append(one(variant, i))
    base = [r for r in runs if r["variant"] == "baseline"]
    aud = [r for r in runs if r["variant"] == "audit"]
    tb = np.array([r["fit_s"] for r in base])
    ta = np.array([r["fit_s"] for r in aud])
    pair_ratios = ta / tb
    lb = np.array([r["local_update_s"] for r in base])
    la = np.array([r["local_update_s"] for r in aud])
    cb = np.array([r["callback_s"] for r in aud])
    result = {
        "label": label,
        "config": cfg,
        "audited_clients_per_round": audit_cfg["clients_per_round"],
        "audit_kwargs": audit_kwargs,
        "num_canaries": aud[0]["num_canaries"],
        "num_unobserved": aud[0]["num_unobserved"],
        "num_parameters": aud[0]["num_parameters"],
        "client_sizes_min_max": [min(sizes), max(sizes)],
        "baseline_fit_s": tb.tolist(),
        "audit_fit_s": ta.tolist(),
        "warmup": warmup,
        "pair_ratios": pair_ratios.tolist(),
        "median_ratio": float(np.median(pair_ratios)),
        # the sign-test interval of the median pair ratio (distribution-free; ~96% for 12 pairs)
        "median_ratio_interval": median_interval(pair_ratios),
        "mean_ratio": float(np.mean(pair_ratios)),
        "ratio_of_medians": float(np.median(ta) / np.median(tb)),
        "local_update_s_median": {"baseline": float(np.median(lb)), "audit": float(np.median(la))},
        "main_thread_cpu_s_median": {
            "baseline": float(np.median([r["main_thread_cpu_s"] for r in base])),
            "audit": float(np.median([r["main_thread_cpu_s"] for r in aud])),
        },
        "other_threads_cpu_s_median": {
            "baseline": float(np.median([r["other_threads_cpu_s"] for r in base])),
            "audit": float(np.median([r["other_threads_cpu_s"] for r in aud])),
        },
        "callback_s_median": float(np.median(cb)),
        "callback_fraction_of_baseline_median": float(np.median(cb / tb)),
        "real_client_updates": {"baseline": int(base[0]["real_client_updates"]),
                                "audit": int(aud[0]["real_client_updates"])},
        "val_accuracy": {"baseline": base[0]["val_accuracy"], "audit": aud[0]["val_accuracy"]},
        "callback_hooks_s_median": {
            key: float(np.median([r["callback_hooks_s"].get(key, 0.0) for r in aud]))
            for key in _HOOKS
        },
        "runs": runs,
    }
    ci = result["median_ratio_interval"]
    print(f"  -> median ratio audit/baseline {result['median_ratio']:.3f} "
          f"[{ci['lower']:.3f}, {ci['upper']:.3f}] ({100 * ci['coverage']:.1f}% sign-test interval; "
          f"mean {result['mean_ratio']:.3f}, ratio of medians {result['ratio_of_medians']:.3f}; pairs "
          f"{', '.join(f'{x:.3f}' for x in pair_ratios)}) at "
          f"{result['real_client_updates']['audit']} / {result['real_client_updates']['baseline']} "
          f"real updates; local training {np.median(la):.2f} / {np.median(lb):.2f} s; callback's "
          f"own time on the training thread {result['callback_s_median']:.2f} s = "
          f"{100 * result['callback_fraction_of_baseline_median']:.1f}% of the baseline fit",
          flush=True)
    mc, oc = result["main_thread_cpu_s_median"], result["other_threads_cpu_s_median"]
    print(f"     CPU (median s): training thread {mc['audit']:.2f} / {mc['baseline']:.2f}, other "
          f"threads {oc['audit']:.2f} / {oc['baseline']:.2f} (audit / baseline)", flush=True)
    h = result["callback_hooks_s_median"]
    canary_updates = (h["federated_client_update_sum"] or h["federated_client_updates"]
                      or h["federated_client_update"])
    print(f"     callback breakdown (median s): canary client updates "
          f"{canary_updates:.2f}, round hooks "
          f"{h['on_federated_round_start'] + h['on_federated_round_end']:.2f}, estimation "
          f"passes + estimates ({aud[0]['callback_hook_calls'].get('compute', 0)}x compute) "
          f"{h['compute']:.2f}, logging extras (histograms, figures, summary) "
          f"{h['on_validation_epoch_end'] + h['on_fit_end'] - h['compute']:.2f}", flush=True)
    return result


def profile_audit(
    cfg: dict[str, Any], audit_kwargs: dict[str, Any], log_root: str, top: int = 25,
) -> dict[str, Any]:
    """One audited fit under cProfile: where the callback's time goes."""
    dm = FederatedDataModule(
        "digits", num_clients=cfg["clients"], rounds_per_epoch=cfg["rounds_per_epoch"],
        seed=cfg["seed"],
    )
    dm.setup("fit")
    prof = cProfile.Profile()
    audit = TimedCanaryAudit(**audit_kwargs)
    k = audit_kwargs.get("num_canaries", min(1000, cfg["clients"]))
    res = fit_once(dm, audited_config(cfg, k), audit, log_root, "profile", profile=prof)
    total = pstats.Stats(prof).total_tt
    in_lib, heavy, text = profile_tables(prof, top, exclude=("dp_fedavg", "sampling"))
    print(f"\n[profile] one audited fit under cProfile: {res['fit_s']:.2f} s (profiled), "
          f"callback {res['callback_s']:.2f} s")
    print(f"  {'cumtime s':>9} {'calls':>7}  callback / library function")
    for r in in_lib[:15]:
        print(f"  {r['cumtime_s']:9.3f} {r['calls']:7d}  {r['function']}")
    return {
        "fit_s_profiled": res["fit_s"],
        "profiled_total_s": total,
        "callback_s": res["callback_s"],
        "callback_hooks_s": res["callback_hooks_s"],
        "callback_hook_calls": res["callback_hook_calls"],
        "audit_callbacks_by_cumtime": in_lib[:top],
        "all_by_tottime": heavy,
        "pstats_text": text,
    }


def _kw(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "defaults"


# ---------------------------------------------------------------------------------- (b)
def memory_child(variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: one short fit at d ~ 1e6; prints a JSON line."""
    dm = FederatedDataModule(
        "digits", num_clients=cfg["clients"], rounds_per_epoch=cfg["rounds_per_epoch"],
        seed=cfg["seed"],
    )
    dm.setup("fit")
    rss_setup = peak_rss_mb()
    audit = None
    if variant == "audit":
        audit = TimedCanaryAudit(cfg["num_canaries"], cfg["num_unobserved"])
    with tempfile.TemporaryDirectory() as log_root:
        res = fit_once(dm, cfg, audit, log_root, f"memory_{variant}")
    res["variant"] = variant
    res["peak_rss_before_fit_mib"] = rss_setup
    res["peak_rss_mib"] = peak_rss_mb()
    res["torch_threads"] = torch.get_num_threads()
    return res


def memory_benchmark(cfg: dict[str, Any], threads: int) -> dict[str, Any]:
    print(f"\n[memory] separate processes: MLP hidden={tuple(cfg['hidden'])}, "
          f"{cfg['clients']} real clients, {cfg['clients_per_round']} per round, "
          f"{cfg['rounds']} rounds (validation at the end); audit: "
          f"CanaryAudit({cfg['num_canaries']}, {cfg['num_unobserved']})", flush=True)
    results = {}
    for variant in ("baseline", "audit"):
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", variant,
               "--memory-config", json.dumps(cfg), "--threads", str(threads)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {variant} failed:\n{proc.stderr[-4000:]}")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
        res = json.loads(line)
        res["process_wall_s"] = wall
        results[variant] = res
        extra = ""
        if variant == "audit":
            extra = ("; estimation passes " + ", ".join(f"{x:.1f} s" for x in res["compute_s"])
                     + f"; callback total {res['callback_s']:.1f} s")
        print(f"  {variant:8s}: d = {res['num_parameters']:,}, peak RSS "
              f"{res['peak_rss_mib']:7.1f} MiB (before fit {res['peak_rss_before_fit_mib']:.1f}), "
              f"fit {res['fit_s']:.1f} s{extra}", flush=True)
    diff = results["audit"]["peak_rss_mib"] - results["baseline"]["peak_rss_mib"]
    print(f"  -> audit peak RSS - baseline peak RSS = {diff:+.1f} MiB (target < 100 MB = "
          f"{100e6 / 2**20:.1f} MiB)")
    return {
        "config": cfg,
        "baseline": results["baseline"],
        "audit": results["audit"],
        "peak_rss_difference_mib": diff,
        "peak_rss_difference_mb": diff * 2**20 / 1e6,
        "target_mb": 100,
        "estimation_pass_s": results["audit"]["compute_s"],
    }


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=200, help="rounds a fit (default: make demo's)")
    p.add_argument("--rounds-per-epoch", type=int, default=25, help="rounds between validations")
    p.add_argument("--clients", type=int, default=300, help="real clients (default scenario)")
    p.add_argument("--clients-per-round", type=int, default=30)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--noise-multiplier", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=12, help="timed pairs per scenario (ABBA order)")
    p.add_argument("--reps-k1000", type=int, default=3, help="timed pairs, k = 1000 scenario")
    p.add_argument("--memory-rounds", type=int, default=6)
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--skip-k1000", action="store_true")
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--quick", action="store_true", help="smoke test: few rounds, 1 pair")
    p.add_argument("--output", default=None, help="file name under benchmarks/results/")
    p.add_argument("--memory-child", choices=["baseline", "audit"], help=argparse.SUPPRESS)
    p.add_argument("--memory-config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.rounds_per_epoch, args.reps, args.reps_k1000 = 10, 5, 1, 1
        args.memory_rounds = 2
    if args.output is None:
        args.output = "canary_overhead_quick.json" if args.quick else "canary_overhead.json"
    return args


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "clients": args.clients,
        "clients_per_round": args.clients_per_round,
        "rounds": args.rounds,
        "rounds_per_epoch": args.rounds_per_epoch,
        "model": args.model,
        "local_epochs": args.local_epochs,
        "local_lr": 0.05,
        "local_batch_size": 8,
        "server_lr": 1.0,
        "server_momentum": 0.9,
        "noise_multiplier": args.noise_multiplier,
        "clip_norm": 1.0,
        "sampling": "shuffle",
        "delta": 1e-6,
        "seed": 0,
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet()
    if args.memory_child:
        res = memory_child(args.memory_child, json.loads(args.memory_config))
        print(json.dumps(res))
        return None

    print(f"CanaryAudit overhead; torch threads = {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs")
    payload: dict[str, Any] = {
        "benchmark": "canary_overhead",
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "target": {"wall_ratio_max": 1.05, "memory_mb_max": 100},
    }
    cfg = base_config(args)
    with tempfile.TemporaryDirectory() as log_root:
        if not args.skip_timing:
            payload["timing_default"] = timing_scenario("default", cfg, {}, args.reps, log_root)
            if not args.skip_k1000:
                cfg_k = dict(cfg, clients=1000)
                payload["timing_k1000"] = timing_scenario(
                    "k1000", cfg_k, {"num_canaries": 1000, "num_unobserved": 1000},
                    args.reps_k1000, log_root,
                )
        if not args.skip_profile:
            payload["profile_default"] = profile_audit(cfg, {}, log_root)
    if not args.skip_memory:
        mem_cfg = dict(
            cfg, model="mlp_1e6", hidden=[1000, 925], clients=1000,
            rounds=args.memory_rounds, rounds_per_epoch=args.memory_rounds,
            num_canaries=1000, num_unobserved=1000,
        )
        payload["memory_d1e6"] = memory_benchmark(mem_cfg, args.threads)

    payload["load_average_end"] = load_average()
    summarize(payload)
    path = write_json(args.output, payload)
    print(f"wrote {path}")
    return payload


def summarize(payload: dict[str, Any]) -> None:
    print("\nsummary")
    for key in ("timing_default", "timing_k1000"):
        r = payload.get(key)
        if r is None:
            continue
        tb, ta = np.median(r["baseline_fit_s"]), np.median(r["audit_fit_s"])
        print(f"  {r['label']:8s} k = {r['num_canaries']:4d}, k' = {r['num_unobserved']:4d}, "
              f"d = {r['num_parameters']:,}: baseline median {tb:.2f} s,"
              f" audit median {ta:.2f} s, median ratio at equal real updates "
              f"{r['median_ratio']:.3f} (target <= 1.05), callback "
              f"{100 * r['callback_fraction_of_baseline_median']:.1f}% of baseline; "
              f"val accuracy {r['val_accuracy']['baseline']:.3f} -> "
              f"{r['val_accuracy']['audit']:.3f}")
    m = payload.get("memory_d1e6")
    if m is not None:
        print(f"  memory   d = {m['audit']['num_parameters']:,}: peak RSS baseline "
              f"{m['baseline']['peak_rss_mib']:.0f} MiB, audit {m['audit']['peak_rss_mib']:.0f} "
              f"MiB, difference {m['peak_rss_difference_mb']:+.1f} MB; estimation passes "
              + ", ".join(f"{x:.1f} s" for x in m["estimation_pass_s"]))


if __name__ == "__main__":
    main()
