"""The canary audit's per-step (per-round) work at d ~ 10^6, piece by piece (issue 28).

    PYTHONPATH=. .venv/bin/python benchmarks/per_step_profile.py                    # auto: CUDA if present
    PYTHONPATH=. .venv/bin/python benchmarks/per_step_profile.py --accelerator cpu  # ~2 min on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/per_step_profile.py --quick            # smoke test

``gpu_overhead.py`` measures what a user pays (audited / baseline fit time); this script says
where the per-step part of it goes, at the same model sizes, so that a change can be aimed at
the piece that costs. Each piece is a method of the audit's own objects, wrapped on the
instance during a real ``trainer.fit`` (the library is not modified) and timed with
``perf_counter``; on CUDA the wrapper synchronises the device before and after each call, so a
piece's time includes the kernels it launched (the synchronisations themselves are the
profile's, not the audit's: the audit makes none per step, see ``tests/auditing/test_no_host_sync.py``).
No estimate runs during the timed steps (``every_n_epochs`` beyond the run); the fit-end
estimate, figures and report are not counted here (``canary_overhead.py`` times them).

(1) opacus: Opacus DP-SGD (``DPSGDClassifier``) of ``gpu_overhead.py``'s GroupNorm CNN (d =
    1,070,986) on CIFAR-shaped random data, Poisson batches of expected size ``--batch-size``
    (CPU default 32: the per-step audit work does not depend on the batch, only the step's
    own time does) at ``gpu_overhead.py``'s sampling rate 256 / 18,000 (the data set is sized
    for it, so ~14 of the k canaries join a step), ``CanaryAudit()`` at its defaults otherwise (k = 1000 Hadamard canaries,
    k' = min(n - k, 100,000)). Pieces, per logical step:

    * ``canary_rows_and_clip``: ``GradientCanaryInjector._clip_canaries_flat`` (or
      ``_clip_canaries`` where the rows go one block a parameter): the joining canaries' rows
      ``[m, d]`` built and put through the optimizer's own ``clip_and_accumulate`` (the
      canaries enter before clipping, issue 25);
    * ``add_noise_wrapper``: the injector's ``add_noise`` less Opacus' own ``add_noise``
      (participation counts, the noisy-sum observer where there is one);
    * ``release``: ``OpacusBackend.on_train_batch_end``: the parameter delta folded into the
      running statistics (the all-iterates cosines through the Walsh-Hadamard transform);

    and ``step``, the baseline's mean step time (the same fit without the audit), for scale.
(2) fedavg: ``gpu_overhead.py``'s EMNIST-shaped DP-FedAvg (CNN d = 1,656,766, 3,400 clients,
    ``--real-per-round`` real clients a round, the cohort grown by (N + k) / N for the canary
    clients). Pieces per round: ``client_update_sum`` (the canary clients' updates built and
    clipped by the module's own clip stage, summed), ``on_round_released`` (the release folded
    into the all-iterates and known-rounds statistics); ``round``: the baseline's mean round.

Output: a table on stdout and ``benchmarks/results/per_step_profile_<device>.json`` (median,
mean and 90th percentile per piece in milliseconds, with the device name and the commit).
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg
from benchmarks._common import (
    add_accelerator_argument,
    device_name,
    git_state,
    machine_info,
    parser,
    synchronize,
    timed_fit,
    torch_device,
    write_json,
)
from benchmarks.gpu_overhead import (
    FEDAVG_CNN,
    OPACUS_CNN,
    RandomImages,
    emnist_shaped,
    make_trainer,
    quiet,
)
from models import build_model, num_parameters
from models.dpsgd import DPSGDClassifier

#: Effectively never: no estimate during the timed steps (the fit-end one is not timed).
NO_ESTIMATE = 10**6


class PieceTimer:
    """Wall seconds of every call of wrapped instance methods, by piece name; with ``sync``
    (CUDA) the device is synchronised before and after each call."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.calls: dict[str, list[float]] = defaultdict(list)

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        fn = getattr(obj, attr)
        if getattr(fn, "_piece", None) is not None:
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.sync:
                synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync:
                    synchronize()
                self.calls[name].append(time.perf_counter() - t0)

        timed._piece = name  # type: ignore[attr-defined]
        setattr(obj, attr, timed)


class Attach(pl.Callback):
    """Wraps the audit's per-step pieces once its backend is bound (at the first batch)."""

    def __init__(self, audit: CanaryAudit, timer: PieceTimer, kind: str) -> None:
        self.audit, self.timer, self.kind, self.done = audit, timer, kind, False

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        backend = self.audit.backend
        if self.done or backend is None:
            return
        if self.kind == "opacus":
            inj = backend.injector
            self.timer.wrap(inj, "_clip_canaries", "canary_rows_and_clip")  # one block a parameter
            if hasattr(inj, "_clip_canaries_flat"):  # one flat parameter (the default)
                self.timer.wrap(inj, "_clip_canaries_flat", "canary_rows_and_clip")
            self.timer.wrap(inj.optimizer, "add_noise", "add_noise_wrapper_total")
            self.timer.wrap(inj, "_original", "opacus_add_noise")
            self.timer.wrap(backend, "on_train_batch_end", "release")
        else:
            self.timer.wrap(backend, "client_update_sum", "client_update_sum")
            self.timer.wrap(backend, "on_round_released", "on_round_released")
        self.done = True


def _stats(seconds: list[float], units: int) -> dict[str, Any]:
    """A piece's milliseconds: ``ms_per_unit`` (all its calls / steps or rounds), and per call
    the median, mean, 90th percentile and count."""
    ms = np.asarray(seconds, float) * 1e3
    if not ms.size:
        return {"n": 0, "ms_per_unit": 0.0}
    return {"ms_per_unit": float(ms.sum() / max(1, units)), "median_ms": float(np.median(ms)),
            "mean_ms": float(ms.mean()), "p90_ms": float(np.percentile(ms, 90)), "n": int(ms.size)}


def opacus_pieces(dm: RandomImages, steps: int, device: torch.device, log_root: str, audited: bool
                  ) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = build_model("cnn", (3, 32, 32), 10, **OPACUS_CNN)
    module = DPSGDClassifier(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, noise_seed=0)
    timer = PieceTimer(sync=device.type == "cuda")
    callbacks: list[Any] = []
    audit = None
    if audited:
        audit = CanaryAudit(every_n_epochs=NO_ESTIMATE, log_figures=False)
        callbacks = [audit, Attach(audit, timer, "opacus")]
    trainer = make_trainer(device, log_root, "opacus_audit" if audited else "opacus_base", callbacks,
                           max_steps=steps, max_epochs=-1, limit_val_batches=0)
    fit_s = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {"fit_s": fit_s, "steps": int(trainer.global_step),
                           "num_parameters": num_parameters(model)}
    if audit is not None and audit.auditor is not None:
        calls = dict(timer.calls)
        total, inner = calls.pop("add_noise_wrapper_total", []), calls.pop("opacus_add_noise", [])
        calls["add_noise_wrapper"] = [t - i for t, i in zip(total, inner, strict=False)]
        out["num_canaries"] = audit.auditor.num_canaries
        out["num_unobserved"] = audit.auditor.num_unobserved
        out["calls"] = calls
    return out


def fedavg_pieces(dm: Any, rounds: int, real_per_round: int, device: torch.device, log_root: str,
                  audited: bool) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = build_model("cnn", (1, 28, 28), 62, **FEDAVG_CNN)
    clients = len(dm.client_datasets)
    timer = PieceTimer(sync=device.type == "cuda")
    callbacks: list[Any] = []
    audit = None
    per_round = real_per_round
    if audited:
        audit = CanaryAudit(every_n_epochs=NO_ESTIMATE, log_figures=False)
        callbacks = [audit, Attach(audit, timer, "fedavg")]
        per_round = round(real_per_round * (clients + min(1000, clients)) / clients)
    module = DPFedAvg(model, clients_per_round=per_round, noise_multiplier=1.0, clip_norm=1.0,
                      local_epochs=1, local_lr=0.05, local_batch_size=10, server_lr=1.0,
                      server_momentum=0.9, seed=0)
    trainer = make_trainer(device, log_root, "fed_audit" if audited else "fed_base", callbacks,
                           max_steps=rounds, max_epochs=-1, limit_val_batches=0)
    fit_s = timed_fit(trainer, module, dm)
    out: dict[str, Any] = {"fit_s": fit_s, "rounds": int(trainer.global_step), "clients_per_round": per_round,
                           "num_parameters": num_parameters(model)}
    if audit is not None and audit.auditor is not None:
        out["num_canaries"] = audit.auditor.num_canaries
        out["num_unobserved"] = audit.auditor.num_unobserved
        out["calls"] = dict(timer.calls)
    return out


def summarise(base: dict[str, Any], audit: dict[str, Any], unit: str) -> dict[str, Any]:
    units = int(audit[f"{unit}s"])
    per = {name: _stats(ts, units) for name, ts in audit["calls"].items()}
    return {"pieces": per, f"audit_ms_per_{unit}": sum(p["ms_per_unit"] for p in per.values()),
            f"baseline_ms_per_{unit}": 1e3 * base["fit_s"] / max(1, int(base[f"{unit}s"])),
            "note": f"baseline_ms_per_{unit}: the whole baseline fit (start-up included) / {unit}s",
            "baseline": base, "audited": {k: v for k, v in audit.items() if k != "calls"}}


def print_table(title: str, res: dict[str, Any], unit: str) -> None:
    print(f"\n{title}: audit {res[f'audit_ms_per_{unit}']:.2f} ms a {unit} "
          f"(baseline {res[f'baseline_ms_per_{unit}']:.1f} ms a {unit})")
    for name, s in res["pieces"].items():
        if s.get("n"):
            print(f"  {name:22s} {s['ms_per_unit']:8.3f} ms a {unit}; a call: median {s['median_ms']:8.3f} ms, "
                  f"p90 {s['p90_ms']:8.3f} ({s['n']} calls)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="a few steps: a smoke test", summary=True)
    add_accelerator_argument(p)
    p.add_argument("--scenarios", default="opacus,fedavg", help="comma-separated: opacus, fedavg")
    p.add_argument("--steps", type=int, default=None, help="(1) logical steps (default: GPU 200, CPU 40)")
    p.add_argument("--batch-size", type=int, default=None, help="(1) expected batch (default: GPU 256, CPU 32)")
    p.add_argument("--rounds", type=int, default=None, help="(2) rounds (default: GPU 50, CPU 12)")
    p.add_argument("--real-per-round", type=int, default=None, help="(2) real clients a round (GPU 50, CPU 20)")
    p.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1, as the other benchmarks: on a shared host, several "
                             "OpenMP threads wait for each other at every op whenever another process takes a core)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet()
    device = torch_device(args.accelerator)
    gpu = device.type == "cuda"
    steps = args.steps or (4 if args.quick else 200 if gpu else 40)
    batch = args.batch_size or (256 if gpu else 32)
    rounds = args.rounds or (3 if args.quick else 50 if gpu else 12)
    real = args.real_per_round or (50 if gpu else 20)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    print(f"per_step_profile on {device_name(device)}", flush=True)
    payload: dict[str, Any] = {"benchmark": "per_step_profile", "device": device.type,
                               "device_name": device_name(device), "quick": args.quick,
                               "torch_threads": torch.get_num_threads(), "machine": machine_info(),
                               "git": git_state()}
    with tempfile.TemporaryDirectory() as log_root:
        if "opacus" in scenarios:
            # the sampling rate of gpu_overhead.py's scenario (256 of 18,000): ~14 canaries join a step
            dm = RandomImages(round(batch * 18_000 / 256), (3, 32, 32), 10, batch, val_examples=16)
            opacus_pieces(dm, 3, device, log_root, audited=True)  # warm-up: lazy imports, kernels
            base = opacus_pieces(dm, steps, device, log_root, audited=False)
            aud = opacus_pieces(dm, steps, device, log_root, audited=True)
            res = summarise(base, aud, "step")
            res["config"] = {"steps": steps, "batch_size": batch, "model": OPACUS_CNN}
            payload["opacus"] = res
            print_table(f"[1] Opacus DP-SGD, d = {aud['num_parameters']:,}, batch {batch}", res, "step")
        if "fedavg" in scenarios:
            dm_f = emnist_shaped(3400, 10, 200, rounds_per_epoch=max(rounds, 1))
            fedavg_pieces(dm_f, 2, real, device, log_root, audited=True)  # warm-up
            base = fedavg_pieces(dm_f, rounds, real, device, log_root, audited=False)
            aud = fedavg_pieces(dm_f, rounds, real, device, log_root, audited=True)
            res = summarise(base, aud, "round")
            res["config"] = {"rounds": rounds, "real_per_round": real, "clients": 3400, "model": FEDAVG_CNN}
            payload["fedavg"] = res
            print_table(f"[2] DP-FedAvg, d = {aud['num_parameters']:,}, {real} real clients a round", res, "round")
    name = f"per_step_profile_{device.type}{'_quick' if args.quick else ''}.json"
    print(f"\nwrote {write_json(name, payload)}")
    return payload


if __name__ == "__main__":
    main()
