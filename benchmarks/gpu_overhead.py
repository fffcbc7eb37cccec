"""Cost of the audit callbacks on a GPU (or the CPU) at realistic model sizes (issue 28).

    PYTHONPATH=. .venv/bin/python benchmarks/gpu_overhead.py                    # auto: CUDA if present
    PYTHONPATH=. .venv/bin/python benchmarks/gpu_overhead.py --accelerator cpu  # CPU sizes, ~30 min on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/gpu_overhead.py --quick            # smoke test, a few minutes on CPU

Two scenarios, each timed as interleaved pairs (baseline-audited, audited-baseline, ...: a
machine drifting slower or faster favours neither side) after one untimed warm-up fit of every
variant (not with ``--quick``); a pair's ratio is audited / baseline ``trainer.fit`` seconds
(``timed_fit``), reported as the median ratio with its sign-test interval (``median_interval``).
Every fit builds a fresh model and module from the same seed and a fresh ``Trainer``
(TensorBoardLogger into a temporary folder, Lightning's default ``log_every_n_steps``, no
checkpointing, no progress bar); the data module is built once per scenario.

(1) opacus: Opacus DP-SGD (``models.dpsgd.DPSGDClassifier``, ``make_private`` in
    ``configure_optimizers``, noise multiplier 1, clip norm 1, lr 0.1) of a GroupNorm CNN
    (``SmallCNN`` with channels (32, 64), hidden 256: d = 1,070,986) on CIFAR-shaped random data
    (3 x 32 x 32, 10 classes; Poisson batches of expected size 256; a 1,000-example validation
    split each epoch). Variants: ``canary`` = ``CanaryAudit()`` at its defaults;
    ``all_three`` = ``CanaryAudit()`` + ``LabelReconstructionAttack()`` + ``LabelDPLowerBound()``
    at their defaults (the JSON records how many steps the label callbacks attacked and why
    they skipped the others: with a hidden width of 256 and batches of ~256 the last layer's
    Gram matrix is often rank deficient, and a skipped step costs little). GPU: 18,000
    examples, 3 epochs (the issue's setting); CPU: 2,560 examples, 2 epochs.
(2) fedavg: DP-FedAvg (``DPFedAvg``, noise multiplier 1, clip norm 1, one local epoch at batch
    10, local lr 0.05, server momentum 0.9) of a CNN (``SmallCNN`` with channels (32, 64), hidden
    512: d = 1,656,766) on EMNIST-shaped random data (1 x 28 x 28, 62 classes) split iid over
    3,400 clients of 10 examples, 50 real clients a round: the audited cohort is grown by
    (N + k) / N for the k = min(1000, N) canary clients sampled like real ones (Andrew et al.
    2024 Alg. 2), so both runs train the same number of real updates; validation (2,000
    examples) and an estimate every 25 rounds. Variant: ``canary`` = ``CanaryAudit()`` at its
    defaults (the label callbacks attack centralised DP-SGD, not DP-FedAvg). GPU: 100 rounds;
    CPU: 20 rounds.

``--quick``: 512 examples and 1 epoch (opacus), 5 rounds (fedavg), one pair each, no warm-up:
it checks that the script runs; its ratios are not measurements.

Long fits (``--min-fit-s S``; the default on CUDA is 60, elsewhere 0: off). A fit of a few
seconds is decided by the audit's fixed costs, so the Opacus scenario is sized to last: a timed
calibration fit of the baseline (``--calibration-epochs``, 2) gives the steady seconds an epoch
(the last epoch, from the epoch starts and the train end) and the fit's start-up and teardown
seconds, and the number of epochs is chosen so that the baseline fit lasts >= 1.05 S
(:func:`plan_epochs`). The data set is CIFAR-10's size (50,000 examples, ``--opacus-examples``;
196 Poisson batches of expected size 256 an epoch) unless given. After one untimed fit of each
audited variant at the calibration's length (the calibration is the baseline's warm-up), the
fits run in *blocks*: a baseline and each variant once, the order reversed every other block
(``B C A``, ``A C B``, ...), a variant's ratio against the baseline of its own block, reported
as the median with its sign-test interval; blocks run while the last block's time still fits in
``--budget-s`` (at least one; ``--reps`` fixes the number instead), and the JSON is rewritten
after each fit (``long_fit.complete`` false while a block is unfinished), so a run stopped from
outside keeps every fit it finished. With a baseline of 60 s and audited fits of 65-90 s (a
plan, not a measurement), one block takes about 4 minutes: a 10-minute device call holds one
block (two would need ~8 minutes for this script alone), so its interval is the one ratio.
The data set's size also sets the sampling rate: ~5 of the 1000 canaries join a step at 50,000
examples, ~14 at 18,000 (``--opacus-examples 18000``: the rate of the short fits and of
``per_step_profile.py``).

Each audited fit also gives, from its own hooks (every callback's ``setup``, ``on_fit_start``,
``on_train_start``, epoch and validation hooks, ``on_train_end``, ``on_fit_end`` and
``teardown`` timed by a ``HookTimer(sync=True)``: on CUDA the device is synchronised around those
few calls, a few dozen a fit, never around a step), the audit's cost split in
:func:`decompose`: ``fit_start_s``, ``per_epoch_s`` (the estimates at the epochs' ends),
``fit_end_s`` (the final estimate, summary and report), and the per-step marginal
``per_step_marginal_ms = (audited fit - baseline fit - fit start - epochs - fit end) / steps``
(what each training step costs: Opacus' canary work inside ``optimizer.step`` and the per-step
hooks); ``per_step_all_in_ms`` adds the epochs' estimates back. A direct measure beside it:
every fit (baseline too) carries a ``StepClock`` that records when each training batch starts
(no synchronisation), and ``per_step_direct_ms`` is the audited fit's steady seconds a step
less its block's baseline's (:func:`steady_step_s`: within each epoch after the first, from the
second batch's start to the last's, so no epoch boundary, validation or estimate is in it).
The JSON's ``targets`` (``TARGETS``: the ratios <= 1.10 with ``CanaryAudit()`` and <= 1.15 with
all three callbacks, the per-step marginal <= 0.5 ms, each on a baseline fit >= 60 s) say of
each ``value``, ``holds`` (the median), ``holds_at_upper`` (the interval's upper end) and
``pass`` (holds on a fit long enough); ``pass`` at the top: all of them.

Output: tables on stdout and ``benchmarks/results/gpu_overhead_<device>.json`` (``cuda`` or
``cpu``; ``_long`` with ``--min-fit-s``, ``_quick`` with ``--quick``; ``--output`` names another
file) with the device name
(``torch.cuda.get_device_name`` or the CPU's), ``machine_info()`` and the commit measured.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.callbacks import CanaryAudit, LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.federated import DPFedAvg
from benchmarks._common import (
    HookTimer,
    add_accelerator_argument,
    device_name,
    git_state,
    interleaved_pairs,
    machine_info,
    median_interval,
    parser,
    timed_fit,
    torch_device,
    write_json,
)
from datamodules import FederatedDataModule
from models import build_model, num_parameters
from models.dpsgd import DPSGDClassifier

OPACUS_CNN = {"channels": (32, 64), "hidden": 256, "group_norm": True}  # d = 1,070,986 on 3x32x32
FEDAVG_CNN = {"channels": (32, 64), "hidden": 512}  # d = 1,656,766 on 1x28x28, 62 classes

SIZES = {  # per device kind; --quick overrides
    "cuda": {"opacus": {"examples": 18_000, "epochs": 3, "reps": 5},
             "fedavg": {"rounds": 100, "reps": 3}},
    "cpu": {"opacus": {"examples": 2_560, "epochs": 2, "reps": 3},
            "fedavg": {"rounds": 20, "reps": 3}},
    "quick": {"opacus": {"examples": 512, "epochs": 1, "reps": 1},
              "fedavg": {"rounds": 5, "reps": 1}},
}


#: The long fit's data set (CIFAR-10's training set size) and the issue's targets on it: median
#: audited / baseline fit time with ``CanaryAudit()`` and with all three callbacks, the audit's
#: per-step marginal time at d ~ 10^6, and the baseline fit's length they need.
LONG_EXAMPLES = 50_000
TARGETS = {"canary": 1.10, "all_three": 1.15, "per_step_marginal_ms": 0.5, "min_fit_s": 60.0}
#: The hooks timed in a long fit's audited runs (each synchronised: a few dozen calls a fit); the
#: per-step hooks are not timed (they are in the per-step marginal).
START_HOOKS = ("setup", "on_fit_start", "on_train_start")
EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_validation_start",
               "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_end")
END_HOOKS = ("on_train_end", "on_fit_end", "teardown")


def quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings(
        "ignore",
        message=".*(does not have many workers|GPU available|secure RNG|Full backward hook|LeafSpec|"
        "canary clients|no validation loop|TensorBoard|log_every_n_steps).*",
    )


def make_trainer(device: torch.device, log_root: str, name: str, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator=device.type, devices=1, logger=TensorBoardLogger(log_root, name=name),
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, **kwargs,
    )


# ---------------------------------------------------------------------------------- (1) Opacus
class RandomImages(pl.LightningDataModule):
    """Random ``[N, *shape]`` standard-normal images with uniform labels: Poisson training
    batches (Opacus' ``DPDataLoader``, rate batch_size / N) and a fixed validation split."""

    def __init__(self, examples: int, shape: tuple[int, ...], classes: int, batch_size: int,
                 val_examples: int = 1000, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        total = examples + val_examples
        x = torch.randn(total, *shape, generator=gen)
        y = torch.randint(0, classes, (total,), generator=gen)
        self.train_set = TensorDataset(x[:examples], y[:examples])
        self.val_set = TensorDataset(x[examples:], y[examples:])
        self.batch_size, self.seed = batch_size, seed

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DPDataLoader.from_data_loader(DataLoader(self.train_set, batch_size=self.batch_size), generator=gen)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=500)


def attach_timer(timer: HookTimer | None, callbacks: list[Any]) -> None:
    """Time ``callbacks``' hooks on ``timer`` (a ``CanaryAudit`` with its backend's calls too;
    the other callbacks' hooks under ``ClassName.hook``)."""
    if timer is None:
        return
    for cb in callbacks:
        if isinstance(cb, CanaryAudit):
            timer.attach_audit(cb)
        else:
            timer.attach_hooks(cb, prefix=f"{type(cb).__name__}.")


class StepClock(pl.Callback):
    """When each training batch, each training epoch and the training's end began
    (``perf_counter`` seconds; no synchronisation: a few list appends a step, so a baseline fit
    carries it too). ``batch_starts`` is ``[(epoch, seconds)]``."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.batch_starts: list[tuple[int, float]] = []
        self.epoch_starts: list[float] = []
        self.train_end: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.epoch_starts.append(time.perf_counter())

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.batch_starts.append((int(trainer.current_epoch), time.perf_counter()))

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.train_end = time.perf_counter()


def steady_step_s(batch_starts: list[tuple[int, float]]) -> float | None:
    """Steady seconds a training step from ``[(epoch, start seconds)]`` of the batches: within
    each epoch, (last start - second start) / (batches - 2), so that no epoch boundary (the
    validation, the estimates, the loader's start) is in it; the median over the epochs after
    the first (the first alone when there is one). None when no epoch has 3 batches."""
    by: dict[int, list[float]] = {}
    for epoch, t in batch_starts:
        by.setdefault(epoch, []).append(t)
    rates = [(ts[-1] - ts[1]) / (len(ts) - 2) for _, ts in sorted(by.items()) if len(ts) >= 3]
    if not rates:
        return None
    return float(np.median(rates[1:] if len(rates) > 1 else rates))


def plan_epochs(fit_s: float, epoch_starts: list[float], train_end: float, min_fit_s: float,
                margin: float = 1.05) -> dict[str, float | int]:
    """Epochs for a fit of >= ``margin * min_fit_s`` seconds, from a calibration fit of
    ``fit_s`` seconds whose epochs started at ``epoch_starts`` and whose training ended at
    ``train_end`` (seconds on one clock): an epoch costs the last epoch's seconds (the steady
    one: the first pays the one-off start), the rest of the fit (``fixed_s``: the trainer's
    start-up and teardown) is paid once. Returns ``{epochs, epoch_s, fixed_s, predicted_fit_s}``.

    Raises:
        ValueError: ``min_fit_s`` or ``fit_s`` not positive, no epoch, or an epoch boundary
            out of order (``epoch_starts`` / ``train_end``).
    """
    if not min_fit_s > 0:
        raise ValueError(f"min_fit_s: must be positive, got {min_fit_s!r}")
    if not fit_s > 0:
        raise ValueError(f"fit_s: must be positive, got {fit_s!r}")
    if not epoch_starts:
        raise ValueError("epoch_starts: the calibration fit ran no epoch")
    bounds = [*epoch_starts, train_end]
    durations = np.diff(bounds)
    if np.any(durations <= 0):
        raise ValueError(f"epoch_starts / train_end: not increasing ({bounds})")
    epoch_s = float(durations[-1])
    fixed_s = max(0.0, fit_s - float(durations.sum()))
    epochs = max(1, math.ceil((margin * min_fit_s - fixed_s) / epoch_s))
    return {"epochs": epochs, "epoch_s": epoch_s, "fixed_s": fixed_s, "predicted_fit_s": fixed_s + epochs * epoch_s}


def attach_phases(timer: HookTimer, callbacks: list[Any]) -> None:
    """Time, on ``timer``, the hooks of ``START_HOOKS`` / ``EPOCH_HOOKS`` / ``END_HOOKS`` that
    each callback overrides, named ``start:Class.hook``, ``epoch:...`` and ``end:...``; no
    per-step hook (their cost is the per-step marginal's)."""
    phases = {**{h: "start" for h in START_HOOKS}, **{h: "epoch" for h in EPOCH_HOOKS},
              **{h: "end" for h in END_HOOKS}}
    for cb in callbacks:
        for hook, phase in phases.items():
            if getattr(type(cb), hook, None) is not getattr(pl.Callback, hook, None):
                timer.wrap(cb, hook, f"{phase}:{type(cb).__name__}.{hook}")


def phase_totals(timer: HookTimer) -> dict[str, float]:
    """``{start, epoch, end}``: the wall seconds of ``attach_phases``' hooks by phase."""
    out = {"start": 0.0, "epoch": 0.0, "end": 0.0}
    for name, wall in timer.wall.items():
        phase = name.split(":", 1)[0]
        if phase in out:
            out[phase] += wall
    return out


def opacus_fit(dm: RandomImages, epochs: int, variant: str, device: torch.device, log_root: str,
               name: str, timer: HookTimer | None = None, clock: StepClock | None = None,
               rare: HookTimer | None = None) -> dict[str, Any]:
    """One fit of ``variant`` (``baseline``, ``canary`` or ``all_three``) for ``epochs`` epochs:
    ``{fit_s, steps, num_parameters, ...}``. ``timer`` times every hook of the callbacks (the
    breakdown fit); ``rare`` only those of ``START_HOOKS``, ``EPOCH_HOOKS`` and ``END_HOOKS``
    (a long fit's decomposition, under the names ``phase:Class.hook``); ``clock`` (first in the
    callback list) records the training batches' start times."""
    pl.seed_everything(0, verbose=False)
    model = build_model("cnn", (3, 32, 32), 10, **OPACUS_CNN)
    module = DPSGDClassifier(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, noise_seed=0)
    callbacks: list[Any] = []
    if variant in ("canary", "all_three"):
        callbacks.append(CanaryAudit())
    if variant == "all_three":
        callbacks += [LabelReconstructionAttack(), LabelDPLowerBound()]
    attach_timer(timer, callbacks)
    if rare is not None:
        attach_phases(rare, callbacks)
    trainer = make_trainer(device, log_root, name, ([clock] if clock is not None else []) + callbacks,
                           max_epochs=epochs)
    fit_s = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {"fit_s": fit_s, "steps": int(trainer.global_step), "epochs": int(trainer.current_epoch),
                           "num_parameters": num_parameters(model)}
    for cb in callbacks:
        if isinstance(cb, CanaryAudit) and cb.auditor is not None:
            out["num_canaries"] = cb.auditor.num_canaries
            out["num_unobserved"] = cb.auditor.num_unobserved
        elif hasattr(cb, "coverage"):  # a label callback: how many steps it attacked or skipped
            out[f"{type(cb).__name__}_coverage"] = {k: v for k, v in cb.coverage().items() if k != "skip_reason_codes"}
    if rare is not None:
        out["phases_s"] = phase_totals(rare)
        out["hooks"] = rare.by_name()
    if clock is not None:
        out["step_s"] = steady_step_s(clock.batch_starts)
        out["epoch_starts"] = [t - clock.origin for t in clock.epoch_starts]
        out["train_end"] = None if clock.train_end is None else clock.train_end - clock.origin
    return out


# ---------------------------------------------------------------------------------- (2) DP-FedAvg
def emnist_shaped(clients: int, per_client: int, val_examples: int, rounds_per_epoch: int,
                  seed: int = 0) -> FederatedDataModule:
    """``clients * per_client`` training examples (1 x 28 x 28, 62 classes) split iid, plus
    ``val_examples`` held out (stratified: the split's sizes are within a few of these)."""
    gen = torch.Generator().manual_seed(seed)
    total = clients * per_client + val_examples
    x = torch.randn(total, 1, 28, 28, generator=gen)
    y = torch.randint(0, 62, (total,), generator=gen)
    dm = FederatedDataModule(features=x, labels=y, num_clients=clients, partition="iid",
                             test_fraction=val_examples / total, rounds_per_epoch=rounds_per_epoch,
                             eval_batch_size=500, seed=seed)
    dm.setup("fit")
    return dm


def fedavg_fit(dm: FederatedDataModule, rounds: int, real_per_round: int, variant: str,
               device: torch.device, log_root: str, name: str, timer: HookTimer | None = None) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = build_model("cnn", (1, 28, 28), 62, **FEDAVG_CNN)
    clients = len(dm.client_datasets)
    callbacks: list[Any] = []
    per_round = real_per_round
    if variant == "canary":
        callbacks.append(CanaryAudit())
        k = min(1000, clients)  # CanaryAuditConfig's default: min(1000, the real population)
        per_round = round(real_per_round * (clients + k) / clients)
    module = DPFedAvg(model, clients_per_round=per_round, noise_multiplier=1.0, clip_norm=1.0,
                      local_epochs=1, local_lr=0.05, local_batch_size=10, server_lr=1.0,
                      server_momentum=0.9, seed=0)
    attach_timer(timer, callbacks)
    trainer = make_trainer(device, log_root, name, callbacks, max_steps=rounds, max_epochs=-1)
    fit_s = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {"fit_s": fit_s, "rounds": int(trainer.global_step), "clients_per_round": per_round,
                           "num_parameters": num_parameters(model)}
    for cb in callbacks:
        if isinstance(cb, CanaryAudit) and cb.auditor is not None:
            out["num_canaries"] = cb.auditor.num_canaries
            out["num_unobserved"] = cb.auditor.num_unobserved
    return out


# ---------------------------------------------------------------------------------- pairs
def interleaved(fit: Any, variants: list[str], reps: int, warmup: bool, label: str) -> dict[str, Any]:
    """``reps`` pairs of (baseline, variant) per variant, the order alternating, variants
    interleaved; ``fit(variant, name)`` returns a dict with ``fit_s``."""

    def one(variant: str, i: int) -> dict[str, Any]:
        res = fit(variant, f"{label}_{variant}_{i}")
        print(f"  {label} {variant:9s} {i:2d}: fit {res['fit_s']:8.2f} s", flush=True)
        return res

    warm, pairs = interleaved_pairs(one, variants, reps, warmup)
    out: dict[str, Any] = {"warmup": warm, "variants": {}}
    for v, ps in pairs.items():
        tb = np.array([b["fit_s"] for b, _ in ps])
        ta = np.array([a["fit_s"] for _, a in ps])
        ratios = ta / tb
        out["variants"][v] = {
            "baseline_fit_s": tb.tolist(), "audit_fit_s": ta.tolist(), "pair_ratios": ratios.tolist(),
            "median_ratio": float(np.median(ratios)), "median_ratio_interval": median_interval(ratios),
            "runs": [{"baseline": b, "audit": a} for b, a in ps],
        }
    return out


def breakdown(fit: Any, variants: list[str], label: str) -> dict[str, Any]:
    """One more audited fit per variant, outside the pairs, with every callback hook (and
    DP-FedAvg's canary update and release calls) timed by a ``HookTimer(sync=True)``:
    ``{variant: {"fit_s", "hooks_wall_s", "hooks": {name: {"wall_s", "cpu_s", "calls"}}}}``.
    Its synchronisations are the timer's, so its ``fit_s`` is not a measurement of the ratio.
    Opacus' per-step canary work inside ``optimizer.step`` is in no hook
    (``per_step_profile.py`` times it)."""
    out: dict[str, Any] = {}
    for v in variants:
        timer = HookTimer(sync=True)
        res = fit(v, f"{label}_{v}_breakdown", timer)
        out[v] = {"fit_s": res["fit_s"], "hooks_wall_s": timer.totals()["wall_s"], "hooks": timer.by_name()}
        top = ", ".join(f"{k} {d['wall_s']:.3f} s/{d['calls']}" for k, d in list(timer.by_name().items())[:6])
        print(f"  {label} {v:9s} breakdown: fit {res['fit_s']:.2f} s, hooks {out[v]['hooks_wall_s']:.3f} s: {top}",
              flush=True)
    return out


# ---------------------------------------------------------------------------------- long fits
def decompose(base: dict[str, Any], audit: dict[str, Any]) -> dict[str, Any]:
    """The audit's cost in one block, from a baseline fit and an audited fit of the same length
    (``opacus_fit`` results, the audited one with ``phases_s`` and both with ``step_s``):
    ``added_s`` (audited - baseline fit seconds), ``fit_start_s``, ``epochs_s`` (the epoch and
    validation hooks, all epochs) and ``per_epoch_s``, ``fit_end_s``, ``per_step_marginal_ms``
    (what is left of ``added_s`` after those, a step), ``per_step_all_in_ms`` (the epochs'
    estimates back in) and ``per_step_direct_ms`` (the steady step seconds' difference, None
    without both).

    Raises:
        ValueError: the fits ran different numbers of steps (``base`` / ``audit``), or
            ``audit`` has no ``phases_s``.
    """
    if base["steps"] != audit["steps"] or not audit["steps"]:
        raise ValueError(f"base / audit: the fits ran {base['steps']} and {audit['steps']} steps")
    if "phases_s" not in audit:
        raise ValueError("audit: no phases_s (fit it with a rare-hook HookTimer)")
    steps, epochs, ph = audit["steps"], max(1, audit.get("epochs") or 1), audit["phases_s"]
    added = audit["fit_s"] - base["fit_s"]
    rest = added - ph["start"] - ph["epoch"] - ph["end"]
    a_step, b_step = audit.get("step_s"), base.get("step_s")
    return {"added_s": added, "fit_start_s": ph["start"], "epochs_s": ph["epoch"], "per_epoch_s": ph["epoch"] / epochs,
            "fit_end_s": ph["end"], "steps": steps, "epochs": epochs, "per_step_marginal_ms": 1e3 * rest / steps,
            "per_step_all_in_ms": 1e3 * (rest + ph["epoch"]) / steps,
            "per_step_direct_ms": None if a_step is None or b_step is None else 1e3 * (a_step - b_step)}


COST_KEYS = ("added_s", "fit_start_s", "per_epoch_s", "fit_end_s", "per_step_marginal_ms", "per_step_all_in_ms",
             "per_step_direct_ms")


def summarise_blocks(blocks: list[dict[str, dict[str, Any]]], variants: list[str]) -> dict[str, Any]:
    """Per variant, over the ``blocks`` (``[{variant or "baseline": opacus_fit result}]``) that
    hold it and a baseline (the last block may be unfinished): the fit times, the ratios against
    each block's baseline with their median and sign-test interval, and the decomposition of
    every block (``costs.blocks``) with the median and interval of each of ``COST_KEYS``
    (``costs.<key>``). A variant in no such block is left out."""
    out: dict[str, Any] = {}
    for v in variants:
        done = [b for b in blocks if "baseline" in b and v in b]
        if not done:
            continue
        tb = np.array([b["baseline"]["fit_s"] for b in done])
        ta = np.array([b[v]["fit_s"] for b in done])
        ratios = ta / tb
        parts = [decompose(b["baseline"], b[v]) for b in done]
        costs: dict[str, Any] = {"blocks": parts}
        for key in COST_KEYS:
            vals = [p[key] for p in parts if p[key] is not None]
            costs[key] = {"median": float(np.median(vals)), **median_interval(vals)} if vals else None
        out[v] = {"baseline_fit_s": tb.tolist(), "audit_fit_s": ta.tolist(), "pair_ratios": ratios.tolist(),
                  "median_ratio": float(np.median(ratios)), "median_ratio_interval": median_interval(ratios),
                  "costs": costs}
    return out


def target_checks(summary: dict[str, Any], baseline_fit_s: list[float]) -> dict[str, Any]:
    """``TARGETS`` against a long fit's ``summary`` (``summarise_blocks``): for the ratios of
    ``canary`` and ``all_three`` and the ``canary`` variant's per-step marginal, ``{target,
    value, interval, holds, holds_at_upper, pass}`` (``holds``: the median at most the target;
    ``pass``: it holds and every baseline fit lasted >= ``TARGETS["min_fit_s"]``), the fit's
    length ``fit_long_enough`` (the shortest baseline fit), and ``pass``: all four there and
    passing (a run cut short before a variant's fit does not pass)."""
    shortest = float(min(baseline_fit_s))
    long_enough = shortest >= TARGETS["min_fit_s"]
    out: dict[str, Any] = {"fit_long_enough": {"target": TARGETS["min_fit_s"], "value": shortest,
                                               "holds": long_enough, "pass": long_enough}}

    def check(name: str, target: float, value: float, lower: float, upper: float, **extra: Any) -> None:
        out[name] = {"target": target, "value": value, "interval": [lower, upper], "holds": value <= target,
                     "holds_at_upper": upper <= target, "pass": long_enough and value <= target, **extra}

    for v in ("canary", "all_three"):
        if v in summary:
            r = summary[v]
            ci = r["median_ratio_interval"]
            check(f"{v}_ratio", TARGETS[v], r["median_ratio"], ci["lower"], ci["upper"])
    if "canary" in summary and summary["canary"]["costs"]["per_step_marginal_ms"] is not None:
        c = summary["canary"]["costs"]
        m = c["per_step_marginal_ms"]
        direct = c["per_step_direct_ms"]
        check("per_step_marginal_ms", TARGETS["per_step_marginal_ms"], m["median"], m["lower"], m["upper"],
              direct_value=None if direct is None else direct["median"])
    required = ("fit_long_enough", "canary_ratio", "all_three_ratio", "per_step_marginal_ms")
    out["pass"] = all(name in out and out[name]["pass"] for name in required)
    return out


def long_fit_opacus(dm: RandomImages, cfg: dict[str, Any], device: torch.device, log_root: str, *,
                    min_fit_s: float, epochs: int | None, reps: int | None, budget_s: float | None,
                    started: float, warmup: bool, save: Any) -> dict[str, Any]:
    """The Opacus scenario sized to last (the module's docstring, "Long fits"): a calibration
    fit of the baseline, ``plan_epochs`` (unless ``epochs``), one untimed fit of each audited
    variant (``warmup``), then blocks of a baseline and each variant, ``reps`` of them or as many
    as ``budget_s`` (seconds since ``started``) holds, at least one; ``save(result)`` after each
    block."""
    variants = ["canary", "all_three"]
    cal_epochs = cfg["calibration_epochs"]
    clock = StepClock()
    cal = opacus_fit(dm, cal_epochs, "baseline", device, log_root, "opacus_calibration", clock=clock)
    plan = plan_epochs(cal["fit_s"], cal["epoch_starts"], cal["train_end"], min_fit_s)
    n_epochs = epochs or int(plan["epochs"])
    print(f"  calibration: {cal_epochs} epochs in {cal['fit_s']:.2f} s (steady epoch {plan['epoch_s']:.2f} s, "
          f"start-up and teardown {plan['fixed_s']:.2f} s): {n_epochs} epochs, ~{plan['predicted_fit_s']:.0f} s a "
          f"baseline fit", flush=True)
    warm = [cal]
    if warmup:
        for v in variants:
            w = opacus_fit(dm, cal_epochs, v, device, log_root, f"opacus_warmup_{v}")
            print(f"  opacus {v:9s} warm-up: fit {w['fit_s']:8.2f} s", flush=True)
            warm.append(w)
    blocks: list[dict[str, dict[str, Any]]] = []
    result: dict[str, Any] = {}

    def report(finished: int) -> dict[str, Any]:
        # every fit so far, the last block perhaps unfinished: a run stopped from outside keeps them
        summary = summarise_blocks(blocks, variants)
        baselines = [b["baseline"]["fit_s"] for b in blocks if "baseline" in b]
        out = {"long_fit": {"min_fit_s": min_fit_s, "calibration_epochs": cal_epochs, "plan": plan,
                            "epochs": n_epochs, "steps": next((f["steps"] for b in blocks for f in b.values()), None),
                            "blocks": finished, "complete": finished == len(blocks),
                            "order": "blocks of baseline and each variant, the order reversed every other block",
                            "budget_s": budget_s},
               "warmup": warm, "variants": summary, "blocks": blocks,
               "targets": target_checks(summary, baselines) if baselines and summary else {"pass": False}}
        save(out)
        return out

    while True:
        i = len(blocks)
        order = ["baseline", *variants] if i % 2 == 0 else [*variants[::-1], "baseline"]
        t_block = time.perf_counter()
        block: dict[str, dict[str, Any]] = {}
        blocks.append(block)
        for v in order:
            rare = HookTimer(sync=True) if v != "baseline" else None
            block[v] = opacus_fit(dm, n_epochs, v, device, log_root, f"opacus_{v}_{i}", clock=StepClock(), rare=rare)
            r = block[v]
            extra = "" if rare is None else (f", start {r['phases_s']['start']:.3f} s, epochs "
                                             f"{r['phases_s']['epoch']:.3f} s, end {r['phases_s']['end']:.3f} s")
            step = r.get("step_s")
            print(f"  opacus {v:9s} {i:2d}: fit {r['fit_s']:8.2f} s, {r['steps']} steps"
                  f"{'' if step is None else f', {1e3 * step:.2f} ms a step'}{extra}", flush=True)
            result = report(len(blocks) - (len(block) < len(order)))
        block_s = time.perf_counter() - t_block
        if reps is not None:
            if len(blocks) >= reps:
                break
        elif budget_s is None or time.perf_counter() - started + block_s > budget_s:
            break
    return result


def print_long(res: dict[str, Any]) -> None:
    print(f"\nOpacus DP-SGD, long fits ({res['long_fit']['epochs']} epochs, {res['long_fit']['steps']} steps, "
          f"{res['long_fit']['blocks']} finished block(s)): audited / baseline fit time and the audit's cost")
    for v, r in res["variants"].items():
        ci, c = r["median_ratio_interval"], r["costs"]
        direct = c["per_step_direct_ms"]
        print(f"  {v:10s} baseline {np.median(r['baseline_fit_s']):8.2f} s, audited {np.median(r['audit_fit_s']):8.2f} s:"
              f" ratio {r['median_ratio']:.3f} [{ci['lower']:.3f}, {ci['upper']:.3f}] ({ci['n']} block"
              f"{'s' if ci['n'] != 1 else ''}); fit start "
              f"{c['fit_start_s']['median']:.3f} s, {c['per_epoch_s']['median']:.3f} s an epoch, fit end "
              f"{c['fit_end_s']['median']:.3f} s; per step {c['per_step_marginal_ms']['median']:.3f} ms marginal, "
              f"{c['per_step_all_in_ms']['median']:.3f} ms with the epochs' estimates, "
              f"{'-' if direct is None else format(direct['median'], '.3f')} ms direct", flush=True)
    for name, t in res["targets"].items():
        if isinstance(t, dict):
            sign = ">=" if name == "fit_long_enough" else "<="
            print(f"  target {name} {sign} {t['target']:g}: {t['value']:.3f}, "
                  f"{'holds' if t['holds'] else 'missed'}{'' if t['pass'] or not t['holds'] else ' (fit too short)'}")
    print(f"  targets: {'all pass' if res['targets']['pass'] else 'not all pass'}", flush=True)


def print_table(title: str, res: dict[str, Any]) -> None:
    print(f"\n{title}")
    for v, r in res["variants"].items():
        ci = r["median_ratio_interval"]
        print(f"  {v:10s} baseline {np.median(r['baseline_fit_s']):8.2f} s, audited {np.median(r['audit_fit_s']):8.2f} s:"
              f" ratio {r['median_ratio']:.3f} [{ci['lower']:.3f}, {ci['upper']:.3f}] ({100 * ci['coverage']:.0f}%,"
              f" {ci['n']} pairs)", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    p = parser(__doc__, quick="tiny sizes, one pair, no warm-up: a smoke test", summary=True,
               output="result file name (default gpu_overhead_<device>[_long][_quick].json)")
    add_accelerator_argument(p)
    p.add_argument("--scenarios", default="opacus,fedavg", help="comma-separated: opacus, fedavg")
    p.add_argument("--reps", type=int, default=None,
                   help="pairs per variant (default: by device); with --min-fit-s, blocks (default: by --budget-s)")
    p.add_argument("--opacus-epochs", type=int, default=None, help="with --min-fit-s: instead of the calibration's")
    p.add_argument("--opacus-examples", type=int, default=None,
                   help=f"default: by device; {LONG_EXAMPLES:,} with --min-fit-s")
    p.add_argument("--opacus-batch-size", type=int, default=256, help="expected Poisson batch (default 256)")
    p.add_argument("--val-examples", type=int, default=1000, help="Opacus validation split (default 1000)")
    p.add_argument("--fedavg-rounds", type=int, default=None)
    p.add_argument("--min-fit-s", type=float, default=None,
                   help="long fits: size the Opacus baseline fit to last at least this many seconds "
                        "(default 60 on CUDA without --quick, else 0: off)")
    p.add_argument("--calibration-epochs", type=int, default=2, help="with --min-fit-s: the calibration fit's epochs")
    p.add_argument("--budget-s", type=float, default=None,
                   help="with --min-fit-s and no --reps: run blocks while the last block's time fits in this many "
                        "seconds from the start (default: one block)")
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="skip the extra per-hook timed fit of each audited variant")
    args = p.parse_args(argv)
    quiet()
    device = torch_device(args.accelerator)  # ValueError for gpu without CUDA
    min_fit_s = args.min_fit_s if args.min_fit_s is not None else (
        TARGETS["min_fit_s"] if device.type == "cuda" and not args.quick else 0.0)
    if not (math.isfinite(min_fit_s) and min_fit_s >= 0):
        raise ValueError(f"--min-fit-s: must be a finite number >= 0, got {min_fit_s!r}")
    if args.calibration_epochs < 2:
        raise ValueError(f"--calibration-epochs: must be >= 2 (the last epoch is the steady one), "
                         f"got {args.calibration_epochs}")
    if args.budget_s is not None and not args.budget_s > 0:
        raise ValueError(f"--budget-s: must be positive, got {args.budget_s!r}")
    for flag in ("reps", "opacus_epochs", "opacus_examples", "opacus_batch_size", "val_examples", "fedavg_rounds"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {value}")
    long_fit = min_fit_s > 0
    sizes = SIZES["quick" if args.quick else device.type]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in ("opacus", "fedavg"):
            raise SystemExit(f"--scenarios: unknown scenario {s!r}")
    mode = f"long fits of >= {min_fit_s:g} s" if long_fit else "full"
    print(f"gpu_overhead on {device_name(device)} ({'quick, ' if args.quick else ''}{mode})", flush=True)
    payload: dict[str, Any] = {"benchmark": "gpu_overhead", "device": device.type, "device_name": device_name(device),
                               "quick": args.quick, "min_fit_s": min_fit_s, "machine": machine_info(),
                               "git": git_state()}
    if device.type == "cuda":
        payload["cuda"] = {"torch_cuda": torch.version.cuda, "device_count": torch.cuda.device_count(),
                           "capability": list(torch.cuda.get_device_capability(device))}
    name = args.output or f"gpu_overhead_{device.type}{'_long' if long_fit else ''}{'_quick' if args.quick else ''}.json"
    with tempfile.TemporaryDirectory() as log_root:
        if "opacus" in scenarios:
            cfg = dict(sizes["opacus"], batch_size=args.opacus_batch_size, val_examples=args.val_examples)
            default_examples = LONG_EXAMPLES if long_fit and not args.quick else cfg["examples"]
            cfg["examples"] = args.opacus_examples or default_examples
            dm = RandomImages(cfg["examples"], (3, 32, 32), 10, cfg["batch_size"], val_examples=cfg["val_examples"])
            if long_fit:
                cfg.update(epochs=args.opacus_epochs, reps=args.reps, calibration_epochs=args.calibration_epochs)
                print(f"\n[1] Opacus DP-SGD, GroupNorm CNN, {cfg['examples']} CIFAR-shaped examples, batch "
                      f"{cfg['batch_size']}, baseline fits of >= {min_fit_s:g} s", flush=True)

                def save(res: dict[str, Any]) -> None:
                    payload["opacus"] = {"config": {**cfg, "model": OPACUS_CNN}, **res}
                    payload["pass"] = res["targets"]["pass"]
                    write_json(name, payload)

                res = long_fit_opacus(dm, cfg, device, log_root, min_fit_s=min_fit_s, epochs=args.opacus_epochs,
                                      reps=args.reps, budget_s=args.budget_s, started=started,
                                      warmup=not args.quick, save=save)
                print_long(res)
            else:
                cfg["epochs"] = args.opacus_epochs or cfg["epochs"]
                cfg["reps"] = args.reps or cfg["reps"]
                print(f"\n[1] Opacus DP-SGD, GroupNorm CNN, {cfg['examples']} CIFAR-shaped examples, batch "
                      f"{cfg['batch_size']}, {cfg['epochs']} epochs, {cfg['reps']} pairs", flush=True)
                res = interleaved(lambda v, run: opacus_fit(dm, cfg["epochs"], v, device, log_root, run),
                                  ["canary", "all_three"], cfg["reps"], not args.quick, "opacus")
                if args.breakdown:
                    res["breakdown"] = breakdown(
                        lambda v, run, timer: opacus_fit(dm, cfg["epochs"], v, device, log_root, run, timer),
                        ["canary", "all_three"], "opacus")
                payload["opacus"] = {"config": {**cfg, "model": OPACUS_CNN}, **res}
                print_table("Opacus DP-SGD: audited / baseline fit time", res)
        if "fedavg" in scenarios:
            cfg = dict(sizes["fedavg"], clients=3400, per_client=10, real_per_round=50, rounds_per_epoch=25,
                       val_examples=2000)
            cfg["rounds"] = args.fedavg_rounds or cfg["rounds"]
            cfg["reps"] = args.reps or cfg["reps"]
            dm_f = emnist_shaped(cfg["clients"], cfg["per_client"], cfg["val_examples"],
                                 min(cfg["rounds_per_epoch"], cfg["rounds"]))
            print(f"\n[2] DP-FedAvg, CNN, EMNIST-shaped: {cfg['clients']} clients x {cfg['per_client']}, "
                  f"{cfg['real_per_round']} real a round, {cfg['rounds']} rounds, {cfg['reps']} pairs", flush=True)
            res = interleaved(
                lambda v, run: fedavg_fit(dm_f, cfg["rounds"], cfg["real_per_round"], v, device, log_root, run),
                ["canary"], cfg["reps"], not args.quick, "fedavg")
            if args.breakdown:
                res["breakdown"] = breakdown(
                    lambda v, run, timer: fedavg_fit(dm_f, cfg["rounds"], cfg["real_per_round"], v, device,
                                                     log_root, run, timer),
                    ["canary"], "fedavg")
            payload["fedavg"] = {"config": {**cfg, "model": FEDAVG_CNN}, **res}
            print_table("DP-FedAvg: audited / baseline fit time", res)
    payload["wall_s"] = time.perf_counter() - started
    print(f"\nwrote {write_json(name, payload)} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
