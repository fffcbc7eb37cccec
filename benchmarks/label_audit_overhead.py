"""Cost of the label-privacy callbacks on an Opacus DP-SGD run: wall-time ratio per epoch.

    PYTHONPATH=. .venv/bin/python benchmarks/label_audit_overhead.py            # ~3 min
    PYTHONPATH=. .venv/bin/python benchmarks/label_audit_overhead.py --quick    # smoke test
    PYTHONPATH=. .venv/bin/python benchmarks/label_audit_overhead.py --dataset digits --reps 3 --epochs 4
        # issue 18: the 10-class MLP (softmax, multi-class bound), 22 steps per epoch

Setting (issue 3 item 7; Yuan et al. 2022's model): scikit-learn breast cancer (455 training examples),
``MLP(30, 1, hidden=(200, 200))`` (d = 46,601), Opacus ``make_private`` in
``configure_optimizers`` (RDP accountant), Poisson batches of expected size 64 (8 logical steps
per epoch), noise multiplier 1, clip norm 1, lr 0.1, 5 epochs per fit.

Measured in ONE process: the data module is built once; every fit builds a fresh model and module
from the same seed and uses the same Trainer (TensorBoardLogger into a temporary folder,
``log_every_n_steps=1`` so every per-step scalar of the callbacks reaches TensorBoard, validation
each epoch, no checkpointing, no progress bar). The lean module is then timed once more with
Lightning's default ``log_every_n_steps=50`` (``timing_lean_log50``): the callbacks compute on
every step either way; only how often their scalars are written changes. Two times per fit: ``trainer.fit`` (with
``time.perf_counter``), and the steady-state epoch, from the start of epoch 1 to the start of
the last epoch divided by the epochs in between (every hook, the validation and the module's
epoch end; not ``make_private``, the first epoch's warm-up or the fit-end summaries). Variants:

* ``baseline``: no callback;
* ``both``: ``LabelReconstructionAttack()`` + ``LabelDPLowerBound()`` as a user attaches them
  (defaults: the steps the Trainer logs and each epoch's last step; summary JSON at fit end) -
  the number the target (ratio <= 1.25 at Lightning's default ``log_every_n_steps=50``) is about;
* ``both_every_step``: both with ``every_n_steps=1`` (every step attacked, the running maximum
  over every batch);
* ``attack``, ``lower_bound``: each callback alone, every step;
* ``both_second_last``: ``both_every_step`` with ``LabelDPLowerBound(second_last=True)`` (the
  second-last layer bound of Yuan et al. 2022 Alg. 4, as the example uses it; reported, no target).

With ``log_every_n_steps=1`` the defaults attack every step, so ``both`` and ``both_every_step``
do the same work there.

Two modules: ``lean`` (``DPSGDClassifier`` without its per-epoch ``privacy/epsilon``, so the
baseline is the bare DP-SGD epoch) and ``module`` (``models.dpsgd.DPSGDClassifier`` as shipped,
whose epoch end computes Opacus' ``get_epsilon``, about as long as the epoch's 8 steps). For
each: one untimed warm-up fit of every variant, then ``--reps`` rounds of baseline, both,
attack, lower_bound, both_second_last in that order. Reported per variant: every time, the ratio
to the same round's baseline, the median of those ratios, and the callbacks' own time in their
hooks (a thin timing subclass; the forward hooks that copy the layer activations run inside the
model's forward and are not in it). Then one ``both`` and one ``both_second_last`` fit of the
lean module run under cProfile and the library's hot spots are listed.

Output: tables on stdout and ``benchmarks/results/label_audit_overhead.json`` (with SHA-256 of the
library files measured, checked again at the end). Torch on one thread.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from benchmarks._common import (
    add_accelerator_argument,
    load_average,
    machine_info,
    median_interval,
    parser,
    profile_tables,
    timed_fit,
    timing_subclass,
    trainer_kwargs,
    write_json,
)
from datamodules.central import CentralDataModule
from models import MLP, num_parameters
from models.dpsgd import DPSGDClassifier

_HOOKS = (
    "on_fit_start",
    "on_train_batch_start",
    "_step_hook",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_train_end",  # the summaries are written here (before Lightning's teardown)
    "on_fit_end",
    "teardown",
)
VARIANTS = ("baseline", "both", "both_every_step", "attack", "lower_bound", "both_second_last")
ROOT = Path(__file__).resolve().parent.parent
MEASURED_FILES = (
    "audit_callbacks/callbacks/label_base.py",
    "audit_callbacks/callbacks/label_step.py",
    "audit_callbacks/callbacks/label_dp.py",
    "audit_callbacks/callbacks/label_reconstruction.py",
    "audit_callbacks/attacks/label_gradients.py",
    "audit_callbacks/estimators/label_dp/inputs.py",
    "audit_callbacks/estimators/label_dp/attack.py",
    "audit_callbacks/estimators/label_dp/kclass.py",
    "audit_callbacks/estimators/label_dp/step.py",
    "audit_callbacks/estimators/label_dp/extrapolation.py",
    "audit_callbacks/attacks/label_reconstruction.py",
    "audit_callbacks/estimators/gaussian.py",
    "audit_callbacks/backends/opacus/optimizer.py",
    "audit_callbacks/backends/opacus/accounting.py",
    "models/dpsgd.py",
)


def _timing_subclass(base: type) -> type:
    """``base`` whose hooks accumulate their own wall time in ``hook_seconds``."""
    return timing_subclass(base, _HOOKS)


TimedAttack = _timing_subclass(LabelReconstructionAttack)
TimedLowerBound = _timing_subclass(LabelDPLowerBound)


class LeanDPSGDClassifier(DPSGDClassifier):
    """``DPSGDClassifier`` without its per-epoch ``privacy/epsilon`` (Opacus ``get_epsilon``,
    ~0.2-0.3 s here, comparable to the 8 training steps of an epoch): the bare DP-SGD epoch."""

    def on_train_epoch_end(self) -> None:
        return None


MODULES = {"module": DPSGDClassifier, "lean": LeanDPSGDClassifier}


class EpochTimer(pl.Callback):
    """Timestamps of every ``on_train_epoch_start``: the steady-state epoch time is
    ``(t[E-1] - t[1]) / (E - 2)``, whole epochs 1 .. E-2 with every hook, validation and the
    module's epoch end, without fit setup (``make_private``) or fit end (summaries)."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(time.perf_counter())

    def steady_epoch_s(self) -> float | None:
        if len(self.starts) < 4:
            return None
        return (self.starts[-1] - self.starts[1]) / (len(self.starts) - 2)


def callbacks_for(variant: str) -> list[Any]:
    if variant == "baseline":
        return []
    if variant == "both":
        return [TimedAttack(), TimedLowerBound()]
    if variant == "both_every_step":
        return [TimedAttack(every_n_steps=1), TimedLowerBound(every_n_steps=1)]
    if variant == "attack":
        return [TimedAttack(every_n_steps=1)]
    if variant == "lower_bound":
        return [TimedLowerBound(every_n_steps=1)]
    if variant == "both_second_last":
        return [TimedAttack(every_n_steps=1), TimedLowerBound(every_n_steps=1, second_last=True)]
    raise ValueError(variant)


def quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings(
        "ignore",
        message=".*(does not have many workers|GPU available|secure RNG|"
        "Full backward hook|LeafSpec).*",
    )


def fit_once(
    dm: CentralDataModule,
    cfg: dict[str, Any],
    variant: str,
    log_root: str,
    name: str,
    *,
    module_kind: str = "module",
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """Fit a fresh module for ``cfg['epochs']`` epochs with the variant's callbacks."""
    pl.seed_everything(cfg["seed"], verbose=False)
    model = MLP(dm.num_features, cfg.get("num_classes", 1), hidden=(cfg["width"], cfg["width"]))
    module = MODULES[module_kind](
        model,
        lr=cfg["lr"],
        noise_multiplier=cfg["noise_multiplier"],
        max_grad_norm=cfg["max_grad_norm"],
        delta=cfg["delta"],
        noise_seed=cfg["seed"],
    )
    callbacks = callbacks_for(variant)
    timer = EpochTimer()
    trainer = pl.Trainer(
        max_epochs=cfg["epochs"],
        logger=TensorBoardLogger(log_root, name=name),
        callbacks=[timer, *callbacks],
        **trainer_kwargs(cfg["accelerator"]),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.get("log_every_n_steps", 1),
    )
    elapsed = timed_fit(trainer, module, dm, profile)
    out: dict[str, Any] = {
        "variant": variant,
        "module": module_kind,
        "fit_s": elapsed,
        "epoch_s": timer.steady_epoch_s(),
        "steps": int(trainer.global_step),
        "num_parameters": num_parameters(model),
        "val_accuracy": _metric(trainer, "val/accuracy"),
    }
    hooks: dict[str, float] = defaultdict(float)
    for cb in callbacks:
        for k, v in cb.hook_seconds.items():
            hooks[f"{type(cb).__name__}.{k}"] += v
        if isinstance(cb, LabelReconstructionAttack):
            out["reconstruction_accuracy"] = cb.accuracy
        if isinstance(cb, LabelDPLowerBound):
            out["attacked_steps"] = len(cb.records)
            out["epsilon_lower_bound_max"] = cb.running_max
    out["callback_hooks_s"] = dict(hooks)
    out["callback_s"] = sum(hooks.values())
    return out


def _metric(trainer: pl.Trainer, key: str) -> float | None:
    v = trainer.callback_metrics.get(key)
    return None if v is None else float(v)


def timing(
    dm: CentralDataModule, cfg: dict[str, Any], module_kind: str, reps: int, log_root: str
) -> dict[str, Any]:
    """Warm-up fit of every variant, then ``reps`` rounds of every variant in ``VARIANTS`` order."""
    print(f"\n[{module_kind}] {MODULES[module_kind].__name__}", flush=True)

    def one(variant: str, i: int) -> dict[str, Any]:
        res = fit_once(
            dm, cfg, variant, log_root, f"{module_kind}_{variant}_{i}", module_kind=module_kind
        )
        res["rep"] = i
        extra = f", callbacks' hooks {res['callback_s']:.2f} s" if variant != "baseline" else ""
        epoch = res["epoch_s"]
        print(
            f"  rep {i:2d} {variant:17s} fit {res['fit_s']:6.2f} s ({res['steps']} steps), steady epoch "
            f"{'-' if epoch is None else f'{epoch:.3f}'} s{extra}",
            flush=True,
        )
        return res

    warmup = [one(v, -1) for v in VARIANTS]
    runs = [one(v, i) for i in range(reps) for v in VARIANTS]
    base = {r["rep"]: r for r in runs if r["variant"] == "baseline"}
    per_variant: dict[str, Any] = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        fit = np.array([r["fit_s"] for r in rs])
        fit_ratios = np.array([r["fit_s"] / base[r["rep"]]["fit_s"] for r in rs])
        own = np.array([r["callback_s"] for r in rs])
        entry: dict[str, Any] = {
            "fit_s": fit.tolist(),
            "fit_ratios_to_baseline": fit_ratios.tolist(),
            "fit_median_ratio": float(np.median(fit_ratios)),
            "fit_ratio_interval": median_interval(fit_ratios),
            "attacked_steps": rs[0].get("attacked_steps"),
            "callback_s_median": float(np.median(own)),
            "callback_fraction_of_baseline_fit_median": float(
                np.median(own / np.array([base[r["rep"]]["fit_s"] for r in rs]))
            ),
            "callback_hooks_s_median": {
                k: float(np.median([r["callback_hooks_s"].get(k, 0.0) for r in rs]))
                for k in rs[0]["callback_hooks_s"]
            },
            "val_accuracy": rs[0]["val_accuracy"],
            "reconstruction_accuracy": rs[0].get("reconstruction_accuracy"),
            "epsilon_lower_bound_max": rs[0].get("epsilon_lower_bound_max"),
        }
        if all(r["epoch_s"] is not None for r in runs):
            ep = np.array([r["epoch_s"] for r in rs])
            ratios = np.array([r["epoch_s"] / base[r["rep"]]["epoch_s"] for r in rs])
            entry.update(
                {
                    "epoch_s": ep.tolist(),
                    "epoch_s_median": float(np.median(ep)),
                    "epoch_ratios_to_baseline": ratios.tolist(),
                    "epoch_median_ratio": float(np.median(ratios)),
                    "epoch_ratio_interval": median_interval(ratios),
                }
            )
        per_variant[v] = entry
    return {
        "module": MODULES[module_kind].__name__,
        "warmup": warmup,
        "runs": runs,
        "variants": per_variant,
    }


def profile_variant(
    dm: CentralDataModule, cfg: dict[str, Any], variant: str, log_root: str, top: int = 20
) -> dict[str, Any]:
    """One fit (lean module) under cProfile: the library functions by cumulative time."""
    prof = cProfile.Profile()
    res = fit_once(
        dm, cfg, variant, log_root, f"profile_{variant}", module_kind="lean", profile=prof
    )
    in_lib, heavy, text = profile_tables(prof, top)
    print(
        f"\n[profile {variant}, lean module] one fit under cProfile: {res['fit_s']:.2f} s (profiled), "
        f"callbacks' hooks {res['callback_s']:.2f} s"
    )
    print(f"  {'cumtime s':>9} {'calls':>7}  library function")
    for r in in_lib[:12]:
        print(f"  {r['cumtime_s']:9.3f} {r['calls']:7d}  {r['function']}")
    return {
        "fit_s_profiled": res["fit_s"],
        "callback_s": res["callback_s"],
        "callback_hooks_s": res["callback_hooks_s"],
        "audit_callbacks_by_cumtime": in_lib[:top],
        "all_by_tottime": heavy,
        "pstats_text": text,
    }


def _hashes() -> dict[str, str]:
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in MEASURED_FILES}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, quick="smoke test: 4 epochs, 1 round, no profile",
               output="file name under benchmarks/results/")
    p.add_argument(
        "--epochs",
        type=int,
        default=5,
        help="epochs per fit (8 logical steps each; >= 4 for the steady-state epoch time)",
    )
    p.add_argument(
        "--reps", type=int, default=8, help="timed rounds (one fit of every variant each)"
    )
    p.add_argument("--width", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--noise-multiplier", type=float, default=1.0)
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument(
        "--dataset", choices=("breast_cancer", "digits"), default="breast_cancer",
        help="breast_cancer: binary (one sigmoid logit); digits: 10 classes (softmax, the multi-class bound)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    add_accelerator_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.reps, args.skip_profile = 4, 1, True
    if args.output is None:
        suffix = "" if args.dataset == "breast_cancer" else f"_{args.dataset}"
        args.output = (
            f"label_audit_overhead{suffix}_quick.json" if args.quick else f"label_audit_overhead{suffix}.json"
        )
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet()
    cfg = {
        "dataset": args.dataset,
        "num_classes": 1 if args.dataset == "breast_cancer" else 10,
        "epochs": args.epochs,
        "width": args.width,
        "batch_size": args.batch_size,
        "poisson": True,
        "noise_multiplier": args.noise_multiplier,
        "max_grad_norm": 1.0,
        "lr": 0.1,
        "delta": 1e-5,
        "seed": 0,
        "accountant": "rdp",
        "log_every_n_steps": 1,
        "accelerator": args.accelerator,
    }
    print(
        f"Label-callback overhead: {args.dataset}, MLP 2x{args.width}, batch {args.batch_size} (Poisson), "
        f"sigma {args.noise_multiplier}, {args.epochs} epochs per fit, {args.reps} rounds; torch threads = "
        f"{torch.get_num_threads()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    payload: dict[str, Any] = {
        "benchmark": "label_audit_overhead",
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "target": {"variant": "both", "wall_ratio_max": 1.25},
        "config": cfg,
        "library_files_sha256": _hashes(),
    }
    dm = CentralDataModule(
        args.dataset, batch_size=args.batch_size, poisson=True, seed=cfg["seed"]
    )
    dm.setup("fit")
    with tempfile.TemporaryDirectory() as log_root:
        for kind in ("lean", "module"):
            payload[f"timing_{kind}"] = timing(dm, cfg, kind, args.reps, log_root)
        # Lightning's default logging interval: the callbacks' per-step scalars, like
        # self.log(on_step=True), are written every 50 steps (the computation still runs every step)
        cfg50 = {**cfg, "log_every_n_steps": 50}
        payload["timing_lean_log50"] = timing(dm, cfg50, "lean", args.reps, log_root)
        payload["timing_lean_log50"]["log_every_n_steps"] = 50
        if not args.skip_profile:
            payload["profile_both"] = profile_variant(dm, cfg, "both", log_root)
            payload["profile_both_second_last"] = profile_variant(
                dm, cfg, "both_second_last", log_root
            )
    payload["load_average_end"] = load_average()
    after = _hashes()
    payload["library_files_changed_during_run"] = [
        f for f in MEASURED_FILES if after[f] != payload["library_files_sha256"][f]
    ]
    summarize(payload)
    path = write_json(args.output, payload)
    print(f"wrote {path}")
    return payload


def summarize(payload: dict[str, Any]) -> None:
    target = payload["target"]["wall_ratio_max"]
    for kind in ("lean", "module", "lean_log50"):
        t = payload.get(f"timing_{kind}")
        if t is None:
            continue
        print(f"\n[{kind}] log_every_n_steps = {t.get('log_every_n_steps', 1)}")
        v = t["variants"]
        has_epoch = "epoch_s_median" in v["baseline"]
        print(
            f"\nsummary, {t['module']} (medians over rounds; baseline fit {np.median(v['baseline']['fit_s']):.2f} s"
            + (f", steady epoch {v['baseline']['epoch_s_median']:.3f} s)" if has_epoch else ")")
        )
        print(
            f"  {'variant':17s} {'attacked':>8} {'epoch s':>8} {'epoch ratio [95% interval]':>27} {'fit ratio':>9} "
            f"{'hooks s':>8} {'hooks/fit':>9}  epoch ratios of the rounds"
        )
        for name in VARIANTS:
            r = v[name]
            iv = r.get("epoch_ratio_interval") or r["fit_ratio_interval"]
            print(
                f"  {name:17s} {str(r.get('attacked_steps') or '-'):>8} {r.get('epoch_s_median', float('nan')):8.3f} "
                f"{r.get('epoch_median_ratio', float('nan')):9.3f} [{iv['lower']:.3f}, {iv['upper']:.3f}] "
                f"({100 * iv['coverage']:.0f}%) {r['fit_median_ratio']:9.3f} {r['callback_s_median']:8.2f} "
                f"{100 * r['callback_fraction_of_baseline_fit_median']:8.1f}%  "
                + ", ".join(f"{x:.2f}" for x in r.get("epoch_ratios_to_baseline", []))
            )
        key = "epoch_median_ratio" if has_epoch else "fit_median_ratio"
        ratio = v["both"][key]
        print(
            f"  target (both callbacks, {key} <= {target}): {'MET' if ratio <= target else 'NOT MET'} "
            f"({ratio:.3f})"
        )
    if payload.get("library_files_changed_during_run"):
        print(
            f"  WARNING: library files changed during the run: {payload['library_files_changed_during_run']}"
        )


if __name__ == "__main__":
    main()
