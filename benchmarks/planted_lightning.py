"""Lightning + Opacus cases of ``benchmarks/planted_bugs.py``: the checks of the mechanism on
the path most Lightning scripts take, ``make_private`` in ``configure_optimizers`` over the
trainer's own loader.

One case is one Lightning fit of ``models.DPSGDClassifier`` (an MLP 30-64-1 on scikit-learn's
breast cancer, 455 training examples, z-scored; noise multiplier 1.5, C = 1, SGD, its noise from
an OS-entropy generator) over ``datamodules.CentralDataModule`` with ``CanaryAudit`` (Hadamard
canaries), EPOCHS epochs (the Trainer on ``--accelerator``). The planted bugs, which the accountant does not know about:

* ``lightning_shuffled_batches``: the datamodule's loader is a shuffled ``DataLoader`` of fixed
  batches (``poisson=False``), Lightning's default, while Opacus' accountant assumes Poisson
  sampling at 1 / len(loader);
* ``lightning_reused_noise``: the noise generator re-seeded before every step;
* ``lightning_layer_without_noise``: the output layer's parameters get no noise;

and two correct set-ups, Poisson batches of 64 (``lightning_correct``) and of 32
(``lightning_batch32_correct``).

    PYTHONPATH=. python -m benchmarks planted_bugs --seeds 2 --correct-seeds 2 --cases lightning_correct
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
from benchmarks._common import trainer_kwargs
from benchmarks._planted import case_result
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

__all__ = ["CASES", "run"]

EPOCHS, SIGMA, CANARIES, DELTA, HIDDEN = 8, 1.5, 200, 1e-5, 64
BUGS = ("correct", "batch32_correct", "shuffled_batches", "reused_noise", "layer_without_noise")


class _Planted(DPSGDClassifier):
    """``DPSGDClassifier`` with ``bug`` installed on its optimizer (before the audit wraps it)."""

    def __init__(self, model: torch.nn.Module, bug: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.bug = bug

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = super().configure_optimizers()
        add_noise = opt.add_noise
        if self.bug == "reused_noise":
            def same_noise() -> None:
                opt.generator = torch.Generator().manual_seed(1 << 40)
                add_noise()
            opt.add_noise = same_noise
        elif self.bug == "layer_without_noise":
            last = opt.params[-2:]

            def no_noise_on_the_output_layer() -> None:
                add_noise()
                for p in last:
                    p.grad = p.summed_grad.view_as(p).clone()
            opt.add_noise = no_noise_on_the_output_layer
        return opt


def run(seed: int, bug: str = "correct", accelerator: str = "auto") -> dict[str, Any]:
    """One seed of the set-up above with ``bug`` (one of :data:`BUGS`), the Trainer on
    ``accelerator`` (``--accelerator``: auto, cpu or gpu).

    Raises:
        ValueError: an unknown ``bug``.
    """
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    start = time.perf_counter()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dm = CentralDataModule("breast_cancer", batch_size=32 if bug == "batch32_correct" else 64,
                           poisson=bug != "shuffled_batches", seed=seed)
    module = _Planted(MLP(30, 1, hidden=(HIDDEN,)), bug, lr=0.5, noise_multiplier=SIGMA,
                      max_grad_norm=1.0, delta=DELTA)
    audit = CanaryAudit(CANARIES, canaries="hadamard", seed=seed, delta=DELTA, log_histograms=False,
                        log_figures=False)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(logger=False, callbacks=[audit], **trainer_kwargs(accelerator), max_epochs=EPOCHS,
                             enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
                             default_root_dir=root)
        trainer.fit(module, datamodule=dm)
        with open(audit.summary_path, encoding="utf-8") as fh:
            summary = json.load(fh)
    return case_result(summary, seed=seed, start=start, bug=bug)


CASES: dict[str, Callable[..., dict[str, Any]]] = {  # (seed, accelerator="auto")
    f"lightning_{bug}": (lambda seed, accelerator="auto", bug=bug: run(seed, bug, accelerator)) for bug in BUGS
}
