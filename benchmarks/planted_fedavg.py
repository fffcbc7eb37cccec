"""DP-FedAvg cases of ``benchmarks/planted_bugs.py`` (issue 25, case d): clipping at 2C with the
noise at z C, against the same run with correct clipping.

One case is one small DP-FedAvg run on scikit-learn digits with ``CanaryAudit`` (Hadamard
canaries) on the CPU: 40 real clients, an MLP with one hidden layer of 27 (d = 2,035), Poisson
cohorts of expected size m = 20, z = 1, C = 1, server SGD without momentum, 30 rounds, 400
observed canary clients sampled like the real ones (q = 20 / 440 a round) and the default
unobserved ones. A canary client's update is ``10 C c_j``, clipped by the module's own clip
stage (``DPFedAvg.clip_updates``); the planted bug is a ``DPFedAvg`` subclass whose
``clip_updates`` clips every client's update (real and canary) at 2C while the noise stays
``N(0, (z C)^2 I)`` and the analytic epsilon still says z. Each canary's contribution to the
noisy sum doubles, so its known-rounds score shifts twice as far: the all-iterates estimate
lands near the epsilon of noise multiplier z / 2, far above the claimed one.

Why d = 2,035: Hadamard canaries are rows of a 2^k transform truncated to d coordinates, and
rows truncated just above a power of two are far from orthogonal (d = 1,210 = 1,024 + 186:
88 pairs among 600 canaries with |cos| > 0.3, up to 0.69), so one canary's participation moves
another's score and the estimate scatters beyond its bootstrap interval (measured at d = 1,210:
3 of 20 correct runs flagged). Just below a power of two (2,035 = 2,048 - 13) every |cos| is
below 0.007.

``CASES[name](seed)`` runs one seed (the data split, the canaries, the sampling and the noise
all follow ``seed``) and returns a JSON-able dict: the verdict word of each threat model
(``audit_callbacks.auditing.html_report.verdict`` on the run's summary), the analytic
epsilon, every estimate with its interval, the valid lower bounds and the run's seconds.

    PYTHONPATH=. python benchmarks/planted_fedavg.py --seeds 2     # a smoke run of both cases
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _common import add_accelerator_argument, trainer_kwargs  # noqa: E402

from audit_callbacks.auditing.html_report import verdict  # noqa: E402
from audit_callbacks.callbacks import CanaryAudit  # noqa: E402
from audit_callbacks.federated import DPFedAvg  # noqa: E402
from audit_callbacks.federated.clipping import clip_updates_  # noqa: E402
from datamodules import FederatedDataModule  # noqa: E402
from models import MLP  # noqa: E402

__all__ = ["CASES", "Clip2C", "run"]

ROUNDS, CLIENTS, PER_ROUND, CANARIES, Z, DELTA, HIDDEN, BOOTSTRAP = 30, 40, 20, 400, 1.0, 1e-5, 27, 1000
THREAT_MODELS = ("final_model", "all_iterates")
ESTIMATES = ("epsilon_all_iterates", "epsilon_all_iterates_matched", "epsilon_all_iterates_max_cosine",
             "epsilon_final_model")
BOUNDS = ("epsilon_lower_bound_all_iterates", "epsilon_lower_bound_final_model")


class Clip2C(DPFedAvg):
    """The planted bug: every client update (real and canary) clipped at 2C; the noise stays
    ``z C`` and the analytic epsilon is still computed for z."""

    def clip_updates(self, updates: torch.Tensor) -> torch.Tensor:
        return clip_updates_(updates, 2 * self.clip_norm)


def run(seed: int, module_class: type[DPFedAvg] = DPFedAvg, accelerator: str = "auto") -> dict[str, Any]:
    """One seed of the set-up above with ``module_class`` (``DPFedAvg`` or :class:`Clip2C`), the
    Trainer on ``accelerator`` (``--accelerator``: auto, cpu or gpu)."""
    start = time.perf_counter()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    pl.seed_everything(seed, verbose=False)
    dm = FederatedDataModule("digits", num_clients=CLIENTS, rounds_per_epoch=ROUNDS, seed=seed)
    dm.setup("fit")
    module = module_class(MLP(64, 10, hidden=(HIDDEN,)), clients_per_round=PER_ROUND, noise_multiplier=Z,
                          clip_norm=1.0, local_lr=0.1, local_batch_size=16, server_lr=1.0,
                          server_momentum=0.0, sampling="poisson", delta=DELTA, seed=seed,
                          reproducible_noise=True)
    audit = CanaryAudit(CANARIES, canaries="hadamard", seed=seed, bootstrap=BOOTSTRAP, log_histograms=False,
                        log_figures=False)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(logger=False, callbacks=[audit], **trainer_kwargs(accelerator),
                             enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=root,
                             limit_val_batches=0, max_steps=ROUNDS, max_epochs=-1)
        trainer.fit(module, datamodule=dm)
        with open(audit.summary_path, encoding="utf-8") as fh:
            summary = json.load(fh)
    est = summary["estimates"]
    return {
        "seed": seed,
        "verdicts": {tm: verdict(summary, tm)[0] for tm in THREAT_MODELS},
        "epsilon_analytic": summary.get("epsilon_analytic"),
        "epsilon_last_iterate_heuristic": summary.get("epsilon_last_iterate_heuristic"),
        "estimates": {k: {f: est.get(k, {}).get(f) for f in ("value", "lower", "upper", "status")}
                      for k in ESTIMATES},
        "lower_bounds": {k: est.get(k, {}).get("value") for k in BOUNDS},
        "max_participations": summary.get("max_participations"),
        "num_canaries_participated": summary.get("num_canaries_participated"),
        "seconds": time.perf_counter() - start,
    }


CASES: dict[str, Callable[..., dict[str, Any]]] = {  # (seed, accelerator="auto")
    "fedavg_correct": lambda seed, accelerator="auto": run(seed, DPFedAvg, accelerator),
    "fedavg_clip_2c": lambda seed, accelerator="auto": run(seed, Clip2C, accelerator),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--output", default=None, help="write the runs to this JSON file")
    add_accelerator_argument(parser)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    for name, case in CASES.items():
        runs = [case(seed, args.accelerator) for seed in range(args.first, args.first + args.seeds)]
        flagged = sum(any(w in ("suspicious", "violation") for w in r["verdicts"].values()) for r in runs)
        out[name] = {"flagged": flagged, "n": len(runs), "runs": runs}
        print(f"{name}: flagged {flagged}/{len(runs)}, "
              f"{sum(r['seconds'] for r in runs) / len(runs):.1f} s/run", flush=True)
        for r in runs:
            e = r["estimates"]["epsilon_all_iterates"]
            print(f"  seed {r['seed']}: {r['verdicts']} analytic {r['epsilon_analytic']:.2f} all-iterates "
                  f"{e['value']:.2f} [{e['lower']:.2f}, {e['upper']:.2f}] ({r['seconds']:.1f} s)", flush=True)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
