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

Output: tables on stdout and ``benchmarks/results/gpu_overhead_<device>.json`` (``cuda`` or
``cpu``; ``_quick`` appended with ``--quick``) with the device name
(``torch.cuda.get_device_name`` or the CPU's), ``machine_info()`` and the commit measured.
"""

from __future__ import annotations

import logging
import tempfile
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


def opacus_fit(dm: RandomImages, epochs: int, variant: str, device: torch.device, log_root: str,
               name: str, timer: HookTimer | None = None) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = build_model("cnn", (3, 32, 32), 10, **OPACUS_CNN)
    module = DPSGDClassifier(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, noise_seed=0)
    callbacks: list[Any] = []
    if variant in ("canary", "all_three"):
        callbacks.append(CanaryAudit())
    if variant == "all_three":
        callbacks += [LabelReconstructionAttack(), LabelDPLowerBound()]
    attach_timer(timer, callbacks)
    trainer = make_trainer(device, log_root, name, callbacks, max_epochs=epochs)
    fit_s = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {"fit_s": fit_s, "steps": int(trainer.global_step), "num_parameters": num_parameters(model)}
    for cb in callbacks:
        if isinstance(cb, CanaryAudit) and cb.auditor is not None:
            out["num_canaries"] = cb.auditor.num_canaries
            out["num_unobserved"] = cb.auditor.num_unobserved
        elif hasattr(cb, "coverage"):  # a label callback: how many steps it attacked or skipped
            out[f"{type(cb).__name__}_coverage"] = {k: v for k, v in cb.coverage().items() if k != "skip_reason_codes"}
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


def print_table(title: str, res: dict[str, Any]) -> None:
    print(f"\n{title}")
    for v, r in res["variants"].items():
        ci = r["median_ratio_interval"]
        print(f"  {v:10s} baseline {np.median(r['baseline_fit_s']):8.2f} s, audited {np.median(r['audit_fit_s']):8.2f} s:"
              f" ratio {r['median_ratio']:.3f} [{ci['lower']:.3f}, {ci['upper']:.3f}] ({100 * ci['coverage']:.0f}%,"
              f" {ci['n']} pairs)", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="tiny sizes, one pair, no warm-up: a smoke test", summary=True)
    add_accelerator_argument(p)
    p.add_argument("--scenarios", default="opacus,fedavg", help="comma-separated: opacus, fedavg")
    p.add_argument("--reps", type=int, default=None, help="pairs per variant (default: by device)")
    p.add_argument("--opacus-epochs", type=int, default=None)
    p.add_argument("--opacus-examples", type=int, default=None)
    p.add_argument("--fedavg-rounds", type=int, default=None)
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="skip the extra per-hook timed fit of each audited variant")
    args = p.parse_args(argv)
    quiet()
    device = torch_device(args.accelerator)  # ValueError for gpu without CUDA
    sizes = SIZES["quick" if args.quick else device.type]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in ("opacus", "fedavg"):
            raise SystemExit(f"--scenarios: unknown scenario {s!r}")
    print(f"gpu_overhead on {device_name(device)} ({'quick' if args.quick else 'full'})", flush=True)
    payload: dict[str, Any] = {"benchmark": "gpu_overhead", "device": device.type, "device_name": device_name(device),
                               "quick": args.quick, "machine": machine_info(), "git": git_state()}
    if device.type == "cuda":
        payload["cuda"] = {"torch_cuda": torch.version.cuda, "device_count": torch.cuda.device_count(),
                           "capability": list(torch.cuda.get_device_capability(device))}
    with tempfile.TemporaryDirectory() as log_root:
        if "opacus" in scenarios:
            cfg = dict(sizes["opacus"], batch_size=256)
            cfg["examples"] = args.opacus_examples or cfg["examples"]
            cfg["epochs"] = args.opacus_epochs or cfg["epochs"]
            cfg["reps"] = args.reps or cfg["reps"]
            dm = RandomImages(cfg["examples"], (3, 32, 32), 10, cfg["batch_size"])
            print(f"\n[1] Opacus DP-SGD, GroupNorm CNN, {cfg['examples']} CIFAR-shaped examples, batch "
                  f"{cfg['batch_size']}, {cfg['epochs']} epochs, {cfg['reps']} pairs", flush=True)
            res = interleaved(lambda v, name: opacus_fit(dm, cfg["epochs"], v, device, log_root, name),
                              ["canary", "all_three"], cfg["reps"], not args.quick, "opacus")
            if args.breakdown:
                res["breakdown"] = breakdown(
                    lambda v, name, timer: opacus_fit(dm, cfg["epochs"], v, device, log_root, name, timer),
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
                lambda v, name: fedavg_fit(dm_f, cfg["rounds"], cfg["real_per_round"], v, device, log_root, name),
                ["canary"], cfg["reps"], not args.quick, "fedavg")
            if args.breakdown:
                res["breakdown"] = breakdown(
                    lambda v, name, timer: fedavg_fit(dm_f, cfg["rounds"], cfg["real_per_round"], v, device,
                                                      log_root, name, timer),
                    ["canary"], "fedavg")
            payload["fedavg"] = {"config": {**cfg, "model": FEDAVG_CNN}, **res}
            print_table("DP-FedAvg: audited / baseline fit time", res)
    name = f"gpu_overhead_{device.type}{'_quick' if args.quick else ''}.json"
    print(f"\nwrote {write_json(name, payload)}")
    return payload


if __name__ == "__main__":
    main()
