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

The checks of the mechanism meet two more bug classes, ``fedavg_reused_noise`` (the same noise
vector every round: :class:`ReusedNoise`) and ``fedavg_bias_without_noise`` (the output layer's
bias without noise: :class:`BiasWithoutNoise`), and two more correct set-ups: server momentum
0.9 (server learning rate 0.1) and fixed-size (uniform) cohorts.

``CASES[name](seed)`` runs one seed (the data split, the canaries, the sampling and the noise
all follow ``seed``) and returns a JSON-able dict: the verdict word of each threat model
(``audit_callbacks.auditing.html_report.verdict`` on the run's summary), the analytic
epsilon, every estimate with its interval, the valid lower bounds and the run's seconds.

    PYTHONPATH=. python benchmarks/planted_bugs.py --seeds 2 --correct-seeds 2 --cases fedavg_correct  # a smoke run
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.federated.clipping import clip_updates_
from benchmarks._common import trainer_kwargs
from benchmarks._planted import case_result
from datamodules import FederatedDataModule
from models import MLP

__all__ = ["CASES", "BiasWithoutNoise", "Clip2C", "ReusedNoise", "run"]

ROUNDS, CLIENTS, PER_ROUND, CANARIES, Z, DELTA, HIDDEN, BOOTSTRAP = 30, 40, 20, 400, 1.0, 1e-5, 27, 1000


class Clip2C(DPFedAvg):
    """The planted bug: every client update (real and canary) clipped at 2C; the noise stays
    ``z C`` and the analytic epsilon is still computed for z."""

    def clip_updates(self, updates: torch.Tensor) -> torch.Tensor:
        return clip_updates_(updates, 2 * self.clip_norm)


class ReusedNoise(DPFedAvg):
    """The planted bug: the same noise vector added every round (drawn once)."""

    def _noise(self, d: int, like: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_fixed_noise", None) is None:
            self._fixed_noise = super()._noise(d, like).clone()
        return self._fixed_noise.clone()


class BiasWithoutNoise(DPFedAvg):
    """The planted bug: the output layer's bias (the last 10 coordinates) gets no noise."""

    def _noise(self, d: int, like: torch.Tensor) -> torch.Tensor:
        noise = super()._noise(d, like)
        noise[-10:] = 0.0
        return noise


def run(seed: int, module_class: type[DPFedAvg] = DPFedAvg, accelerator: str = "auto", *,
        server_momentum: float = 0.0, sampling: str = "poisson") -> dict[str, Any]:
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
                          clip_norm=1.0, local_lr=0.1, local_batch_size=16,
                          server_lr=1.0 - server_momentum if server_momentum else 1.0,
                          server_momentum=server_momentum, sampling=sampling, delta=DELTA, seed=seed,
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
    return case_result(summary, seed=seed, start=start)


CASES: dict[str, Callable[..., dict[str, Any]]] = {  # (seed, accelerator="auto")
    "fedavg_correct": lambda seed, accelerator="auto": run(seed, DPFedAvg, accelerator),
    "fedavg_clip_2c": lambda seed, accelerator="auto": run(seed, Clip2C, accelerator),
    "fedavg_reused_noise": lambda seed, accelerator="auto": run(seed, ReusedNoise, accelerator),
    "fedavg_bias_without_noise": lambda seed, accelerator="auto": run(seed, BiasWithoutNoise, accelerator),
    "fedavg_momentum_correct": lambda seed, accelerator="auto": run(seed, DPFedAvg, accelerator,
                                                                   server_momentum=0.9),
    "fedavg_uniform_correct": lambda seed, accelerator="auto": run(seed, DPFedAvg, accelerator,
                                                                  sampling="uniform"),
}
