"""How close the canary audit's numbers come to their references (issue 24).

Two settings, each statistic against the reference of its own threat model:

* DP-FedAvg on scikit-learn digits (``examples/federated_canary_audit.py``'s set-up: 300
  clients, 30 a round, CNN, server momentum 0.9, 300 Hadamard canaries), 100 rounds,
  z in {0.5, 1, 2}, 3 seeds. All iterates: the known-rounds estimate against the analytic
  epsilon (the Gaussian mechanism composed over the most-sampled canary's rounds); final model:
  the cosine estimate against the last-iterate heuristic (Steinke et al., ICLR 2025).
* Opacus DP-SGD on breast cancer (MLP 2 x 200, Poisson batches of 64: q = 0.125 per step, C =
  1), 30 epochs, sigma in {1, 2}, 2 seeds, Opacus' PRV accountant as the run's accountant. All
  iterates: the steps-unknown likelihood-ratio estimate against the PRV epsilon; final model:
  against the DP-SGD last-iterate heuristic.

Reported per run: every estimate, the tightest valid 95% lower bound of each threat model (the
summary's, at plain alpha), the references and the ratios; per setting the mean over seeds.
The cap of a valid bound for the run's canary counts (perfectly separated scores) and the
canaries that would lift it to 0.35 of the reference are given where the cap binds.

    PYTHONPATH=. python benchmarks/tightness.py            # the full table (~10 min, 2 cores)
    PYTHONPATH=. python benchmarks/tightness.py --quick    # one seed, fewer rounds
    PYTHONPATH=. python benchmarks/tightness.py --seeds 6  # six seeds of every setting

Writes ``benchmarks/results/tightness.json``.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.estimators.valid_bounds import METHODS, tightest_valid_lower_bound
from audit_callbacks.federated import DPFedAvg
from benchmarks._common import (
    add_accelerator_argument,
    machine_info,
    parser,
    trainer_kwargs,
    write_json,
)
from datamodules import FederatedDataModule
from datamodules.central import CentralDataModule
from models import MLP, build_model
from models.dpsgd import DPSGDClassifier

DELTA_FL, DELTA_SGD = 1e-6, 1e-5
KEYS = ("epsilon_all_iterates", "epsilon_all_iterates_matched", "epsilon_all_iterates_max_cosine",
        "epsilon_final_model", "epsilon_lower_bound_all_iterates", "epsilon_lower_bound_final_model")


def quiet() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _trainer(callbacks: list, root: str, accelerator: str, **kw: Any) -> pl.Trainer:
    return pl.Trainer(logger=False, callbacks=callbacks, **trainer_kwargs(accelerator),
                      enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=root,
                      limit_val_batches=0, **kw)


def _row(audit: CanaryAudit, summary_reference: str) -> dict[str, Any]:
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    est = summary["estimates"]
    row: dict[str, Any] = {k: est[k].get("value") for k in KEYS}
    row.update({k: summary.get(k) for k in (
        "epsilon_analytic", "epsilon_analytic_rdp", "epsilon_analytic_prv",
        "epsilon_last_iterate_heuristic", "max_participations", "num_canaries_participated")})
    ref_all = summary.get(summary_reference)
    row["reference_all_iterates"] = ref_all
    row["ratio_all_iterates"] = row["epsilon_all_iterates"] / ref_all if ref_all else None
    heur = row["epsilon_last_iterate_heuristic"]
    row["ratio_final_model"] = row["epsilon_final_model"] / heur if heur else None
    row["bound_ratio_all_iterates"] = (row["epsilon_lower_bound_all_iterates"] or 0) / ref_all if ref_all else None
    row["all_iterates_ge_final_model"] = row["epsilon_all_iterates"] >= row["epsilon_final_model"] - 1e-12
    row["winner_all_iterates"] = est["epsilon_all_iterates"].get("details", {}).get("statistic")
    row["k"], row["k_unobserved"] = summary["inputs"]["num_canaries"], summary["inputs"]["num_unobserved"]
    return row


def fedavg_run(z: float, seed: int, rounds: int, root: str, accelerator: str = "auto") -> dict[str, Any]:
    pl.seed_everything(seed, verbose=False)
    dm = FederatedDataModule("digits", num_clients=300, rounds_per_epoch=25, seed=seed)
    dm.setup("fit")
    module = DPFedAvg(build_model("cnn", dm.input_shape, dm.num_classes), clients_per_round=30,
                      noise_multiplier=z, clip_norm=1.0, local_lr=0.05, local_batch_size=8,
                      server_lr=1.0, server_momentum=0.9, sampling="shuffle", delta=DELTA_FL,
                      seed=seed)
    audit = CanaryAudit(300, canaries="hadamard", seed=seed, bootstrap=100, log_histograms=False,
                        log_figures=False)
    _trainer([audit], root, accelerator, max_steps=rounds, max_epochs=-1).fit(module, datamodule=dm)
    return {"setting": "dpfedavg_digits", "noise_multiplier": z, "seed": seed, "rounds": rounds,
            **_row(audit, "epsilon_analytic")}


def dpsgd_run(sigma: float, seed: int, epochs: int, root: str, accelerator: str = "auto") -> dict[str, Any]:
    pl.seed_everything(seed, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, seed=seed)
    module = DPSGDClassifier(MLP(30, 1, hidden=(200, 200)), lr=0.1, noise_multiplier=sigma,
                             max_grad_norm=1.0, delta=DELTA_SGD, accountant="prv")
    audit = CanaryAudit(canaries="hadamard", seed=seed, bootstrap=100, log_histograms=False,
                        log_figures=False)
    _trainer([audit], root, accelerator, max_epochs=epochs).fit(module, datamodule=dm)
    return {"setting": "dpsgd_breast_cancer", "noise_multiplier": sigma, "seed": seed,
            "epochs": epochs, "steps": int(audit.backend.injector.steps),
            **_row(audit, "epsilon_analytic_prv")}


def bound_cap(k: int, k_un: int, delta: float) -> float:
    """The tightest valid 95% bound of perfectly separated scores: the most any valid bound
    can show with k in- and k' out-scores."""
    return tightest_valid_lower_bound(np.full(k, 10.0) + np.arange(k) * 1e-6, np.arange(k_un) * 1e-6,
                                      alpha=0.05, delta=delta, methods=METHODS).value


def canaries_to_lift(target: float, k_un: int, delta: float) -> int | None:
    """The fewest observed canaries (with max(k', k) unobserved) whose cap reaches ``target``."""
    for k in (300, 1000, 3000, 10_000, 30_000, 100_000):
        if bound_cap(k, max(k_un, k), delta) >= target:
            return k
    return None


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for noise in dict.fromkeys(r["noise_multiplier"] for r in rows if r["setting"] == setting):
            grp = [r for r in rows if r["setting"] == setting and r["noise_multiplier"] == noise]
            mean = {k: float(np.mean([r[k] for r in grp if r[k] is not None]))
                    for k in ("epsilon_all_iterates", "reference_all_iterates", "epsilon_final_model",
                              "epsilon_last_iterate_heuristic", "epsilon_lower_bound_all_iterates",
                              "epsilon_lower_bound_final_model", "ratio_all_iterates",
                              "ratio_final_model", "bound_ratio_all_iterates")}
            delta = DELTA_FL if setting.startswith("dpfedavg") else DELTA_SGD
            cap = bound_cap(grp[0]["k"], grp[0]["k_unobserved"], delta)
            row = {"setting": setting, "noise_multiplier": noise, "seeds": len(grp), **mean,
                   "all_iterates_ge_final_model_every_run": all(r["all_iterates_ge_final_model"] for r in grp),
                   "valid_bound_cap": cap}
            target = 0.35 * mean["reference_all_iterates"]
            if cap < target:
                row["canaries_to_reach_0.35_of_reference"] = canaries_to_lift(target, grp[0]["k_unobserved"], delta)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="one seed, 40 rounds, 10 epochs")
    add_accelerator_argument(p)
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per setting (default: 3 for DP-FedAvg, 2 for DP-SGD; 1 with --quick)")
    args = p.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    seeds_fl, seeds_sgd = ([0], [0]) if args.quick else ([0, 1, 2], [0, 1])
    if args.seeds is not None:
        if args.seeds < 1:
            p.error("--seeds must be >= 1")
        seeds_fl = seeds_sgd = list(range(args.seeds))
    rounds, epochs = (40, 10) if args.quick else (100, 30)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        for z in (0.5, 1.0, 2.0):
            for seed in seeds_fl:
                rows.append(fedavg_run(z, seed, rounds, root, args.accelerator))
                print(json.dumps({k: rows[-1][k] for k in ("setting", "noise_multiplier", "seed",
                                  "ratio_all_iterates", "ratio_final_model", "bound_ratio_all_iterates")}))
        for sigma in (1.0, 2.0):
            for seed in seeds_sgd:
                rows.append(dpsgd_run(sigma, seed, epochs, root, args.accelerator))
                print(json.dumps({k: rows[-1][k] for k in ("setting", "noise_multiplier", "seed",
                                  "ratio_all_iterates", "ratio_final_model", "bound_ratio_all_iterates")}))
    table = summarize(rows)
    print(f"\n{'setting':<22}{'noise':>6}{'all-it':>9}{'ref':>8}{'ratio':>7}{'final':>8}{'heur':>8}"
          f"{'ratio':>7}{'bound':>8}{'/ref':>6}")
    for r in table:
        print(f"{r['setting']:<22}{r['noise_multiplier']:>6}{r['epsilon_all_iterates']:>9.2f}"
              f"{r['reference_all_iterates']:>8.2f}{r['ratio_all_iterates']:>7.2f}"
              f"{r['epsilon_final_model']:>8.2f}{r['epsilon_last_iterate_heuristic']:>8.2f}"
              f"{r['ratio_final_model']:>7.2f}{r['epsilon_lower_bound_all_iterates']:>8.2f}"
              f"{r['bound_ratio_all_iterates']:>6.2f}")
    payload = {"benchmark": "tightness", "quick": args.quick, "seconds": time.perf_counter() - start,
               "accelerator": args.accelerator, "machine": machine_info(), "summary": table, "runs": rows}
    path = write_json("tightness_quick.json" if args.quick else "tightness.json", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
