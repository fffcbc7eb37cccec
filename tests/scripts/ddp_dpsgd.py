"""CanaryAudit on Opacus DP-SGD under Lightning's DDP (or in one process, for comparison).

Launched by ``tests/integration/test_ddp.py``; Lightning's ``strategy="ddp"`` launcher re-runs this script
for the other ranks. Every rank writes ``<out>/rank<r>.json`` (what its audit saw); rank 0 alone
writes the audit's summary (``<out>/logs/.../audit_summary.json``).

Modes:

* ``distributed``: the network is wrapped in Opacus' ``DPDDP`` before ``make_private``, so Opacus
  returns a ``DistributedDPOptimizer`` (noise on rank 0, gradients averaged across ranks). The
  batches are Poisson samples of the whole training set, drawn from a generator seeded by
  ``(seed, epoch, step)`` and split across the ranks (rank r takes every W-th selected example),
  so a one-process run (``--devices 1``) sees exactly the same global batches; with the same
  noise seed on rank 0 the two runs take the same steps up to float rounding. With
  ``--loader opacus`` the batches come from ``make_private(poisson_sampling=True)`` instead
  (Opacus' ``DistributedUniformWithReplacementSampler`` under DDP), as most users train.
* ``plain``: each rank calls ``make_private`` on the bare network (a one-process ``DPOptimizer``
  per rank) with its own shard of the data, as a LightningModule written for one process does;
  ``CanaryAudit`` must refuse this at fit start (``--audit 0``: train without the audit and
  report each rank's final parameters).

Usage: ``python ddp_dpsgd.py --out DIR [--devices 2] [--mode distributed|plain] [--audit 1]``,
or ``main(["--out", DIR, "--devices", "1"])`` from Python (the one-process run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from opacus import PrivacyEngine
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from audit_callbacks.callbacks import CanaryAudit  # noqa: E402
from datamodules.breast_cancer import load_breast_cancer_tensors  # noqa: E402

warnings.filterwarnings("ignore", ".*(backward hook|does not have many workers|secure RNG|"
                        "Lightning couldn't infer|GPU available|sync_dist|log_every_n_steps).*")


class SharedPoissonBatches(Sampler[list[int]]):
    """Poisson batches of the whole data set, the same on every rank, split across the ranks.

    Step ``t`` of epoch ``e`` selects every example independently with probability ``rate``
    (``torch.Generator`` seeded by ``(seed, e, t)``); rank ``r`` of ``W`` yields the selected
    indices ``r, r + W, ...``. With ``W = 1`` this is the one-process Poisson batch.
    """

    def __init__(self, n: int, rate: float, steps: int, seed: int, rank: int, world_size: int) -> None:
        self.n, self.rate, self.steps, self.seed = n, rate, steps, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        for t in range(self.steps):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 1009 + t)
            selected = torch.nonzero(torch.rand(self.n, generator=g) < self.rate).flatten()
            yield selected[self.rank::self.world_size].tolist()


class CanaryWeightProbe(pl.Callback):
    """After the first logical step: the canaries' weight in the globally summed clipped gradient.

    On every rank the clipped per-example gradients are recomputed from Opacus' ``grad_sample``
    (flat clipping: factor ``min(1, C / (||g_i|| + 1e-6))``, as Opacus clips) and summed; both
    that sum and the optimizer's ``summed_grad`` as Opacus' ``add_noise`` receives it (a copy
    taken by wrapping the injector's call of it: the other ranks' ``p.grad`` aliases
    ``summed_grad``, which the scaling and the all-reduce then change in place), which holds the
    canaries wherever the injector added them, are summed across the ranks. Their difference is what the canaries added to the
    global clipped sum; ``weight`` is its least-squares coefficient on ``C * sum_j c_j`` over the
    joined canaries (1: each canary counted once, as one example; 2: once per rank of two).
    """

    def __init__(self, audit: CanaryAudit) -> None:
        self.audit = audit
        self.result: dict[str, float] = {}
        self.summed: torch.Tensor | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        injector = self.audit.backend.injector  # type: ignore[union-attr]
        original = injector._original

        def snapshot() -> None:
            if self.summed is None:
                self.summed = torch.cat([p.summed_grad.reshape(-1) for p in injector.optimizer.params]).clone()
            original()

        injector._original = snapshot

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.result:
            return
        injector = self.audit.backend.injector  # type: ignore[union-attr]
        opt = injector.optimizer
        params = list(opt.params)
        per_example = torch.cat([p.grad_sample.reshape(len(p.grad_sample), -1) for p in params], dim=1)
        factor = (opt.max_grad_norm / (per_example.norm(dim=1) + 1e-6)).clamp(max=1.0)
        clipped = (factor[:, None] * per_example).sum(0)
        assert self.summed is not None
        both = torch.stack([clipped, self.summed]).double()
        if trainer.world_size > 1:
            torch.distributed.all_reduce(both)
        added = both[1] - both[0]
        joined = injector.joined(0, injector.sample_rate).tolist()
        expected = injector.canaries.sum(joined).double() * float(opt.max_grad_norm)
        weight = float(added @ expected / (expected @ expected))
        self.result = {
            "weight": weight, "joined": len(joined),
            "residual": float((added - weight * expected).norm() / expected.norm()),
            "global_expected_batch": float(opt.expected_batch_size) * trainer.world_size,
        }


class Classifier(pl.LightningModule):
    """A small MLP on breast cancer, ``make_private`` in ``configure_optimizers``."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1))
        x, y = load_breast_cancer_tensors()
        self.dataset = TensorDataset(x, y.float())
        self.loader: DataLoader | None = None
        self.engine: PrivacyEngine | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self(x), y)

    def train_dataloader(self) -> DataLoader:
        assert self.loader is not None, "configure_optimizers runs first"
        return self.loader

    def configure_optimizers(self) -> torch.optim.Optimizer:
        a, world, rank = self.args, self.trainer.world_size, self.trainer.global_rank
        n = len(self.dataset)
        if a.mode == "distributed" and a.loader == "opacus":  # Opacus' own distributed Poisson loader
            loader = DataLoader(self.dataset, batch_size=-(-n // a.steps))
            module = DPDDP(self.net) if world > 1 else self.net
        elif a.mode == "distributed":
            sampler = SharedPoissonBatches(n, 1.0 / a.steps, a.steps, a.seed, rank, world)
            loader = DataLoader(self.dataset, batch_sampler=sampler)
            module: nn.Module = DPDDP(self.net) if world > 1 else self.net
        else:  # one-process code under DDP: a shard of the data per rank, a bare network
            shard = DistributedSampler(self.dataset, world, rank, shuffle=True, seed=a.seed) if world > 1 else None
            loader = DataLoader(self.dataset, batch_size=-(-n // (a.steps * world)), sampler=shard)
            module = self.net
        optimizer = torch.optim.SGD(self.net.parameters(), lr=a.lr)
        self.engine = PrivacyEngine(accountant="rdp")
        _, optimizer, self.loader = self.engine.make_private(
            module=module, optimizer=optimizer, data_loader=loader, noise_multiplier=a.noise,
            max_grad_norm=a.clip, poisson_sampling=a.loader == "opacus",
            noise_generator=torch.Generator().manual_seed(a.seed + 17),
        )
        return optimizer


def main(argv: list[str] | None = None) -> None:
    """Train and write ``<out>/rank<r>.json``; ``argv`` as on the command line (default
    ``sys.argv[1:]``), so that ``tests/integration/test_ddp.py`` can run the one-process reference in its
    own interpreter."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--mode", choices=["distributed", "plain"], default="distributed")
    parser.add_argument("--audit", type=int, default=1)
    parser.add_argument("--loader", choices=["shared", "opacus"], default="shared",
                        help="distributed mode: the shared Poisson batches, or make_private's "
                             "Poisson loader (DistributedUniformWithReplacementSampler under DDP)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=9, help="logical steps per epoch (rate 1/steps)")
    parser.add_argument("--noise", type=float, default=0.8)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    model = Classifier(args)
    audit = CanaryAudit(seed=args.seed, bootstrap=100, log_histograms=False, log_figures=False) if args.audit else None
    probe = CanaryWeightProbe(audit) if audit else None
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs, logger=CSVLogger(os.path.join(args.out, "logs"), name="run", version=0),
        callbacks=[audit, probe] if audit else [], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(model)
    result: dict[str, Any] = {
        "rank": trainer.global_rank, "world_size": trainer.world_size,
        "seconds": time.perf_counter() - start,
        "theta": torch.cat([p.detach().reshape(-1) for p in model.net.parameters()]).tolist(),
    }
    assert model.engine is not None
    result["accountant_history"] = [list(h) for h in model.engine.accountant.history]
    result["accountant_epsilon"] = float(model.engine.get_epsilon(1e-5))
    if audit is not None:
        report, backend = audit.last_report, audit.backend
        injector = backend.injector  # type: ignore[union-attr]
        opt = injector.optimizer
        result.update(
            optimizer=type(opt).__name__, expected_batch_size=float(opt.expected_batch_size),
            canary_rate=injector.sample_rate, inserts=injector.inserts, steps=injector.steps,
            participations=injector.participations.tolist(), summary_path=audit.summary_path,
            probe=probe.result if probe else None,
            epsilon_analytic=None if report is None else report.epsilon_analytic,
            estimates=None if report is None else {
                name: {"value": est.value, "lower": est.lower, "upper": est.upper}
                for name, est in report.estimates.items()
            },
        )
    with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
