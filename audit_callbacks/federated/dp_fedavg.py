"""DP-FedAvg as a LightningModule: one federated round per training step.

The algorithm (McMahan et al. 2018, as run in Andrew et al. 2024 §4 / Alg. 2):

1. sample the round's cohort from the population (real clients plus registered virtual clients,
   see :mod:`audit_callbacks.federated.protocol`) by the ``sampling`` rule;
2. each sampled real client starts from the global model and runs ``local_epochs`` epochs of
   SGD (``local_lr``, ``local_batch_size``) on its own data; its update is
   ``theta_local - theta_global`` (a virtual client returns its owner's update instead);
3. each update is clipped to L2 norm ``clip_norm`` (C);
4. the clipped updates are summed, ``N(0, (noise_multiplier * C)^2 I_d)`` is added, and the sum is
   divided by the fixed cohort size m (``clients_per_round``);
5. the server optimizer (SGD, ``server_lr``, ``server_momentum``) takes the negated average as
   its gradient.

Local DP (Matsumoto et al.; Varun et al. 2024): with a ``randomizer`` (an
:class:`~audit_callbacks.mechanisms.LocalRandomizer`), every clipped client update is randomized
on the client before aggregation, and the server sums ``randomizer.debias(...)`` of the released
rows (unbiased for the clipped updates) before dividing by m. Central noise may still be added.

Analytic reference (docs/methods/canaries.md, D, Andrew et al. 2024 footnote 5): if the adversary knows in which rounds a
client took part, a client that took part r times is sqrt(r)/z-GDP (z = noise_multiplier): the
module logs ``privacy/epsilon_analytic`` at ``delta`` for the largest r of any real client.
"""

from __future__ import annotations

import copy
import math
import secrets
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.utils import parameters_to_vector
from torchmetrics.classification import MulticlassAccuracy

from audit_callbacks._lightning import is_lightning_module, overrides
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.federated.clipping import clip_updates_
from audit_callbacks.federated.protocol import Cohort
from audit_callbacks.federated.sampling import CohortSampler

__all__ = ["DPFedAvg", "DPFedAvgMixin"]

Schedule = Callable[[int], Iterable[int]]


class _VirtualBlock:
    def __init__(self, owner: Any, name: str, start: int, count: int, schedule: Schedule | None):
        self.owner, self.name, self.start, self.count, self.schedule = (
            owner, name, start, count, schedule,
        )


class DPFedAvgMixin:
    """DP-FedAvg over a user model, one round per ``training_step``.

    :class:`DPFedAvg` is this on ``lightning.pytorch``; ``audit_callbacks.pytorch_lightning.
    DPFedAvg`` is the same on the standalone ``pytorch_lightning`` namespace, for scripts whose
    ``Trainer`` comes from there.

    Args:
        model: the ``nn.Module`` to train (logits out), or a ``LightningModule`` (either
            namespace) whose ``training_step((x, y), batch_idx)`` returns the loss (a tensor or
            ``{"loss": ...}``); its own ``validation_step`` / ``test_step``, when it defines
            them, are used for evaluation (its ``self.log`` calls reach the trainer's loggers),
            else the cross-entropy loss and accuracy of ``model(x)`` are logged.
        loss_fn: ``loss_fn(logits, y)`` for an ``nn.Module`` model (default cross-entropy).
        clients_per_round: m, the cohort size (expected size for Poisson sampling); the noisy
            sum is always divided by m.
        noise_multiplier: z; the noise std on the sum is ``z * clip_norm``. 0 means clipping only.
        clip_norm: C, the L2 bound of each client's update.
        randomizer: optional local randomizer applied to each client's clipped update (LDP);
            it must offer ``randomize(x [B, d], generator)`` and ``debias(y [B, d])``.
        local_epochs, local_lr, local_batch_size: the clients' local SGD.
        server_lr, server_momentum: the server's SGD.
        sampling: ``"uniform"`` (default), ``"shuffle"`` or ``"poisson"`` (see
            :class:`~audit_callbacks.federated.sampling.CohortSampler`).
        delta: the delta of the logged analytic epsilon.
        num_classes: for the accuracy metric (default: ``trainer.datamodule.num_classes``).
        client_datasets: the real clients' ``TensorDataset``s (default:
            ``trainer.datamodule.client_datasets``).
        seed: seeds cohort sampling and local shuffling (and the noise, only with
            ``reproducible_noise``).
        reproducible_noise: False (default, secure): the server's DP noise and the local
            randomizer's draws come from generators seeded from OS entropy, never logged and
            never saved in a checkpoint, so nobody can regenerate the noise from
            ``hparams.yaml`` or a checkpoint and subtract it from a released model (as Opacus'
            ``secure_mode`` intends). A resumed run then draws fresh noise: its estimates agree
            with an uninterrupted run's within their intervals, not bit for bit. True: they are
            seeded from ``seed`` and checkpointed, so runs and resumes are exactly reproducible -
            for tests and debugging only: anyone with the logs can remove the noise, and the
            run has no differential privacy against them.

    Raises:
        ValueError: bad hyper-parameters; no clients; a population smaller than the cohort; a
            client update with NaN or inf entries (lower ``local_lr``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        clients_per_round: int = 10,
        noise_multiplier: float = 1.0,
        clip_norm: float = 1.0,
        local_epochs: int = 1,
        local_lr: float = 0.1,
        local_batch_size: int = 16,
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        sampling: str = "uniform",
        delta: float = 1e-6,
        num_classes: int | None = None,
        client_datasets: Sequence[torch.utils.data.Dataset] | None = None,
        randomizer: Any | None = None,
        seed: int = 0,
        reproducible_noise: bool = False,
    ) -> None:
        super().__init__()
        if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
            raise ValueError(f"noise_multiplier must be >= 0 and finite, got {noise_multiplier}")
        if clip_norm <= 0 or not math.isfinite(clip_norm):
            raise ValueError(f"clip_norm must be > 0 and finite, got {clip_norm}")
        if clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
        if local_epochs < 0 or local_batch_size < 1 or local_lr < 0:
            raise ValueError("local_epochs >= 0, local_batch_size >= 1, local_lr >= 0 required")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if randomizer is not None and not (
            callable(getattr(randomizer, "randomize", None)) and callable(getattr(randomizer, "debias", None))
        ):
            raise TypeError("randomizer must have randomize(x, generator) and debias(y) methods")
        self.save_hyperparameters(ignore=["model", "loss_fn", "client_datasets", "randomizer"])
        self.randomizer = randomizer
        self.automatic_optimization = False
        self.model = model
        self.loss_fn = loss_fn or F.cross_entropy
        self.clients_per_round = int(clients_per_round)
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.local_epochs = int(local_epochs)
        self.local_lr = float(local_lr)
        self.local_batch_size = int(local_batch_size)
        self.server_lr = float(server_lr)
        self.server_momentum = float(server_momentum)
        self.sampling = sampling
        self.delta = float(delta)
        self.seed = int(seed)
        self.reproducible_noise = bool(reproducible_noise)
        self._num_classes = num_classes
        self._client_datasets = list(client_datasets) if client_datasets is not None else None
        self._client_tensors: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._blocks: list[_VirtualBlock] = []
        self._sampler: CohortSampler | None = None
        self._pending_state: dict[str, Any] | None = None
        self._participations: np.ndarray | None = None
        self._noise_gen: torch.Generator | None = None
        self._ldp_gen: torch.Generator | None = None
        self._local_gen = torch.Generator(device="cpu")
        self._local_gen.manual_seed(self.seed + 1)
        self._worker: list[nn.Module] = []  # not a registered submodule
        self.round = 0
        self.val_accuracy: MulticlassAccuracy | None = None
        self.test_accuracy: MulticlassAccuracy | None = None
        self._warned_no_noise = False

    # ------------------------------------------------------------------ parameters & clients
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The model's trainable parameters, in the order of the flat vectors."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def num_parameters(self) -> int:
        """d, the length of every flat vector the protocol passes."""
        return sum(p.numel() for p in self.trainable_parameters())

    def flat_parameters(self) -> torch.Tensor:
        """The current global model as a detached flat vector ``[d]``."""
        return parameters_to_vector(self.trainable_parameters()).detach().clone()

    @property
    def num_real_clients(self) -> int:
        return len(self._clients())

    def _clients(self) -> list[torch.utils.data.Dataset]:
        if self._client_datasets is None:
            dm = getattr(self._trainer, "datamodule", None) if self._trainer else None
            datasets = getattr(dm, "client_datasets", None)
            if datasets is None:
                raise ValueError(
                    "DPFedAvg has no clients: pass client_datasets=... or fit with a datamodule "
                    "that has a `client_datasets` attribute (e.g. datamodules.FederatedDataModule)"
                )
            self._client_datasets = list(datasets)
        if not self._client_datasets:
            raise ValueError("DPFedAvg needs at least one real client")
        return self._client_datasets

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Real client ``cid``'s examples as ``(features [n_i, ...], labels [n_i])`` tensors
        (what an audit that crafts inputs from client data, such as ``LDPAudit``, reads)."""
        return self._client_data(cid)

    def _client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._client_tensors is None:
            tensors = []
            for ds in self._clients():
                if isinstance(ds, torch.utils.data.TensorDataset) and len(ds.tensors) >= 2:
                    tensors.append((ds.tensors[0], ds.tensors[1]))
                else:
                    xs, ys = zip(*[ds[i] for i in range(len(ds))], strict=True)
                    tensors.append((torch.stack(list(xs)), torch.as_tensor(ys)))
            self._client_tensors = tensors
        return self._client_tensors[cid]

    # ------------------------------------------------------------------ virtual clients
    def register_virtual_clients(
        self, owner: Any, count: int, *, name: str | None = None, schedule: Schedule | None = None,
    ) -> str:
        """Add ``count`` virtual clients owned by ``owner`` to the population.

        Must be called before the first round (from a callback's ``setup`` or ``on_fit_start``).
        The same owner registering its ``name`` again (e.g. a second ``fit``) replaces its block;
        another owner's block of that name is refused: its clients would silently vanish.

        Args:
            owner: the object that gives the updates: ``federated_client_update_sum`` (the
                sum of a round's clipped updates, where no hook needs the rows),
                ``federated_client_updates`` (all of a round's rows at once) or
                ``federated_client_update`` (one client), see
                :mod:`audit_callbacks.federated.protocol`.
            count: number of virtual clients (local indices ``0..count-1``).
            name: the block's name (default: the owner's class name).
            schedule: ``None``: the clients are sampled exactly like real ones. Otherwise
                ``schedule(round_idx) -> local indices``: those clients join that round on top
                of the sampled cohort and are never sampled.

        Returns:
            The block's name, used as the key in :class:`Cohort.virtual`.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        name = name or type(owner).__name__
        clash = [b for b in self._blocks if b.name == name and b.owner is not owner]
        if clash:
            raise ValueError(
                f"virtual clients named {name!r} are already registered by another "
                f"{type(clash[0].owner).__name__}; give each owner its own name"
            )
        same = [b for b in self._blocks if b.name == name and b.owner is owner]
        if same and same[0].count == int(count) and same[0].schedule == schedule:
            return name  # a repeated fit: the population does not change
        if self.round > 0 and self._sampler is not None:
            raise RuntimeError("virtual clients must be registered before the first round")
        self._blocks = [b for b in self._blocks if b.name != name]
        self._blocks.append(_VirtualBlock(owner, name, 0, int(count), schedule))
        self._sampler = None
        return name

    def _ensure_sampler(self) -> CohortSampler:
        if self._sampler is None:
            start = self.num_real_clients
            # sampled blocks first: the sampler draws from [0, population)
            ordered = sorted(self._blocks, key=lambda b: b.schedule is not None)
            population = start + sum(b.count for b in ordered if b.schedule is None)
            for block in ordered:
                block.start = start
                start += block.count
            self._sampler = CohortSampler(population, self.clients_per_round, self.sampling, self.seed)
            self._participations = np.zeros(start, dtype=np.int64)
            if self._pending_state is not None:
                self._restore(self._pending_state)
                self._pending_state = None
        return self._sampler

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        if self._num_classes is None:
            dm = getattr(self.trainer, "datamodule", None)
            self._num_classes = getattr(dm, "num_classes", None)
        if self._num_classes is not None:
            self.val_accuracy = MulticlassAccuracy(num_classes=int(self._num_classes), average="micro")
            self.test_accuracy = MulticlassAccuracy(num_classes=int(self._num_classes), average="micro")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            self.trainable_parameters(), lr=self.server_lr, momentum=self.server_momentum,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _hooks(self, name: str) -> list[Callable[..., Any]]:
        trainer = self._trainer
        if trainer is None:
            return []
        return [getattr(cb, name) for cb in trainer.callbacks if callable(getattr(cb, name, None))]

    def _sample_cohort(self, round_idx: int) -> tuple[Cohort, np.ndarray]:
        sampler = self._ensure_sampler()
        ids = sampler.sample()
        n_real = self.num_real_clients
        virtual: dict[str, np.ndarray] = {}
        all_ids = [ids]
        for block in self._blocks:
            mask = (ids >= block.start) & (ids < block.start + block.count)
            local = ids[mask] - block.start
            if block.schedule is not None:
                forced = np.asarray(sorted({int(i) for i in block.schedule(round_idx)}), dtype=np.int64)
                if forced.size and (forced.min() < 0 or forced.max() >= block.count):
                    raise ValueError(f"schedule of {block.name!r} gave indices outside [0, {block.count})")
                local = forced
                all_ids.append(forced + block.start)
            virtual[block.name] = local
        population_ids = np.unique(np.concatenate(all_ids))
        cohort = Cohort(
            round_idx=round_idx,
            real_ids=ids[ids < n_real],
            virtual=virtual,
            size=int(population_ids.size),
            divisor=self.clients_per_round,
        )
        return cohort, population_ids

    def _local_update(self, cid: int, global_flat: torch.Tensor) -> tuple[torch.Tensor, float]:
        if not self._worker:
            self._worker.append(copy.deepcopy(self.model))
        worker = self._worker[0]
        worker.train()
        params = [p for p in worker.parameters() if p.requires_grad]
        with torch.no_grad():  # copy (vector_to_parameters would alias global_flat)
            offset = 0
            for p in params:
                p.copy_(global_flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        x_all, y_all = self._client_data(cid)
        n = len(x_all)
        losses = []
        for _ in range(self.local_epochs):
            perm = torch.randperm(n, generator=self._local_gen)
            for start in range(0, n, self.local_batch_size):
                idx = perm[start:start + self.local_batch_size]
                x = x_all[idx].to(self.device)
                y = y_all[idx].to(self.device)
                loss = self._client_loss(worker, x, y, start // self.local_batch_size)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                with torch.no_grad():
                    for p, g in zip(params, grads, strict=True):
                        if g is not None:
                            p.sub_(g, alpha=self.local_lr)
                losses.append(float(loss.detach()))
        update = parameters_to_vector(params).detach() - global_flat
        return update, (float(np.mean(losses)) if losses else math.nan)

    def _client_loss(self, worker: nn.Module, x: torch.Tensor, y: torch.Tensor, i: int) -> torch.Tensor:
        if is_lightning_module(worker):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # self.log outside a trainer
                out = worker.training_step((x, y), i)
            loss = out["loss"] if isinstance(out, dict) else out
        else:
            loss = self.loss_fn(worker(x), y)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("the client loss must be a scalar tensor")
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One federated round (see the class docstring).

        Raises:
            ValueError: a client's update is not finite, or an owner's
                ``federated_client_update_sum`` is not a finite vector of ``d`` entries.
        """
        round_idx = self.round + 1
        cohort, population_ids = self._sample_cohort(round_idx)
        for hook in self._hooks("on_federated_round_start"):
            hook(self.trainer, self, round_idx, cohort)

        global_flat = self.flat_parameters()
        d = global_flat.numel()
        # Rows are needed by observers of the clipped updates and by a local randomizer; without
        # them an owner that gives the sum of its clipped updates is not asked for its rows.
        need_rows = self.randomizer is not None or bool(self._hooks("on_federated_client_updates"))
        summed = {
            block.name for block in self._blocks
            if not need_rows and callable(getattr(block.owner, "federated_client_update_sum", None))
        }
        n_rows = cohort.real_ids.size + sum(
            int(cohort.virtual[b.name].size) for b in self._blocks if b.name not in summed
        )
        # every row is written below (real clients, then each owner's virtual clients)
        updates = torch.empty(n_rows, d, dtype=global_flat.dtype, device=global_flat.device)
        labels: list[str] = []
        client_losses = []
        row = 0
        for cid in cohort.real_ids.tolist():
            update, loss = self._local_update(cid, global_flat)
            updates[row] = update
            labels.append(f"client/{cid}")
            if math.isfinite(loss):
                client_losses.append(loss)
            row += 1
        groups: list[tuple[int, int] | _VirtualBlock] = [(0, row)]  # summed separately, in order
        for block in self._blocks:
            local = cohort.virtual[block.name]
            if not local.size:
                continue
            if block.name in summed:
                groups.append(block)
                continue
            start = row
            fill = getattr(block.owner, "federated_client_updates", None)
            if callable(fill):  # the owner writes all its rows at once
                fill(self.trainer, self, local, round_idx, self.clip_norm, updates[row:row + local.size])
                labels.extend(f"{block.name}/{j}" for j in local.tolist())
                row += int(local.size)
            else:
                for j in local.tolist():
                    upd = block.owner.federated_client_update(self.trainer, self, j, round_idx, self.clip_norm)
                    updates[row] = upd.to(device=updates.device, dtype=updates.dtype).reshape(-1)
                    labels.append(f"{block.name}/{j}")
                    row += 1
            groups.append((start, row))

        norms = clip_updates_(updates, self.clip_norm)
        bad = ~torch.isfinite(norms)
        if bad.any():
            who = [labels[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise ValueError(
                f"round {round_idx}: non-finite update from {who}; lower local_lr or check the data"
            )
        for hook in self._hooks("on_federated_client_updates"):
            hook(self.trainer, self, round_idx, labels, updates)

        rows = updates
        if self.randomizer is not None:
            released = self.randomizer.randomize(updates, generator=self._ldp_generator(updates))
            for hook in self._hooks("on_federated_randomized_updates"):
                hook(self.trainer, self, round_idx, labels, released)
            rows = self.randomizer.debias(released)
        # the sum of the real clients' rows, then of each owner's: the same grouping whether an
        # owner gives its rows or their sum, so either way trains the same bits
        total = rows[0:groups[0][1]].sum(0)
        for group in groups[1:]:
            if isinstance(group, tuple):
                total.add_(rows[group[0]:group[1]].sum(0))
                continue
            part = group.owner.federated_client_update_sum(
                self.trainer, self, cohort.virtual[group.name], round_idx, self.clip_norm,
            ).to(device=total.device, dtype=total.dtype).reshape(-1)
            finite = part.numel() == d and (
                math.isfinite(float(part.sum())) or bool(torch.isfinite(part).all())
            )
            if not finite:
                raise ValueError(
                    f"round {round_idx}: {group.name!r} gave a sum of clipped updates that is not "
                    f"a finite vector of {d} entries"
                )
            total.add_(part)
        if self.noise_multiplier > 0:
            total.add_(self._noise(d, total), alpha=self.noise_multiplier * self.clip_norm)
        average = total / cohort.divisor

        opt = self.optimizers()
        params = self.trainable_parameters()
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = (-average[offset:offset + n]).view_as(p).clone()
            offset += n
        opt.step()
        opt.zero_grad(set_to_none=True)
        model_delta = self.flat_parameters() - global_flat

        self.round = round_idx
        assert self._participations is not None
        self._participations[population_ids] += 1
        for hook in self._hooks("on_federated_round_end"):
            hook(self.trainer, self, round_idx, model_delta)

        self.log("fl/round", float(round_idx), on_step=True, on_epoch=False, batch_size=1)
        self.log("fl/cohort_size", float(cohort.size), on_step=True, on_epoch=False, batch_size=1)
        if client_losses:
            self.log("train/client_loss", float(np.mean(client_losses)), on_step=True, on_epoch=True, batch_size=1)
        eps = self.analytic_epsilon()
        if eps == math.inf and not self._warned_no_noise:
            self._warned_no_noise = True
            rank_zero_warn("DPFedAvg: noise_multiplier = 0: no DP noise, the analytic epsilon "
                           "is infinite (logged as inf)", category=UserWarning)
        if eps is not None:
            self.log("privacy/epsilon_analytic", eps, on_step=True, on_epoch=False, batch_size=1)

    def _noise(self, d: int, like: torch.Tensor) -> torch.Tensor:
        if self._noise_gen is None or self._noise_gen.device != like.device:
            gen = torch.Generator(device=like.device)
            gen.manual_seed(self._generator_seed(2))
            if self._noise_gen is not None and self._noise_gen.device.type == like.device.type:
                gen.set_state(self._noise_gen.get_state())
            self._noise_gen = gen
        return torch.randn(d, generator=self._noise_gen, device=like.device, dtype=like.dtype)

    def _ldp_generator(self, like: torch.Tensor) -> torch.Generator:
        if self._ldp_gen is None:
            gen = torch.Generator(device=like.device)
            gen.manual_seed(self._generator_seed(3))
            self._ldp_gen = gen
        return self._ldp_gen

    def _generator_seed(self, offset: int) -> int:
        """``seed + offset`` with ``reproducible_noise``, else 63 bits of OS entropy (kept only
        inside the generator, which is never saved)."""
        return self.seed + offset if self.reproducible_noise else secrets.randbits(63)

    def participations(self) -> np.ndarray:
        """Rounds each population id took part in so far (real clients first), ``[N]``."""
        self._ensure_sampler()
        assert self._participations is not None
        return self._participations.copy()

    def analytic_epsilon(self, participations: int | None = None) -> float | None:
        """Epsilon at ``delta`` if the adversary knows the rounds (docs/methods/canaries.md, D).

        ``participations`` defaults to the most rounds any real client took part in. Returns
        ``inf`` without noise (``noise_multiplier = 0``), ``None`` before the first round.
        """
        if participations is None:
            if self._participations is None:
                return None
            participations = int(self._participations[: self.num_real_clients].max(initial=0))
        if self.noise_multiplier == 0:
            return math.inf
        if participations < 1:
            return 0.0
        return gaussian_epsilon(self.noise_multiplier, self.delta, compositions=participations)

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch: Any, prefix: str, metric: MulticlassAccuracy | None) -> torch.Tensor:
        x, y = batch[0], batch[1]
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        self.log(f"{prefix}/loss", loss, on_step=False, on_epoch=True, prog_bar=prefix == "val")
        if metric is not None:
            metric.update(logits.argmax(-1), y)
            self.log(f"{prefix}/accuracy", metric, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def _user_step(self, name: str, batch: Any, batch_idx: int) -> Any:
        """The wrapped LightningModule's own ``validation_step`` / ``test_step``, its
        ``self.log`` routed to this module's trainer and hook."""
        inner = self.model
        inner.trainer = self.trainer
        inner._current_fx_name = self._current_fx_name
        try:
            return getattr(inner, name)(batch, batch_idx)
        finally:
            inner._current_fx_name = None

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if is_lightning_module(self.model) and overrides(self.model, "validation_step"):
            return self._user_step("validation_step", batch, batch_idx)
        return self._eval_step(batch, "val", self.val_accuracy)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        if is_lightning_module(self.model) and overrides(self.model, "test_step"):
            return self._user_step("test_step", batch, batch_idx)
        return self._eval_step(batch, "test", self.test_accuracy)

    # ------------------------------------------------------------------ checkpointing
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state: dict[str, Any] = {"round": self.round, "local_gen": self._local_gen.get_state()}
        if self._sampler is not None:
            state["sampler"] = self._sampler.state_dict()
            state["participations"] = self._participations.tolist()
        if self.reproducible_noise:  # secure noise is never written anywhere
            if self._noise_gen is not None:
                state["noise_gen"] = self._noise_gen.get_state()
            if self._ldp_gen is not None:
                state["ldp_gen"] = self._ldp_gen.get_state()
        checkpoint["dp_fedavg"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("dp_fedavg")
        if state is None:
            return
        self.round = int(state["round"])
        self._local_gen.set_state(state["local_gen"])
        self._sampler = None
        self._pending_state = state

    def _restore(self, state: dict[str, Any]) -> None:
        if "sampler" in state:
            assert self._sampler is not None
            self._sampler.load_state_dict(state["sampler"])
            self._participations = np.asarray(state["participations"], dtype=np.int64).copy()
        if "noise_gen" in state and self.reproducible_noise:
            gen = torch.Generator(device="cpu")
            gen.set_state(state["noise_gen"])
            self._noise_gen = gen
        if "ldp_gen" in state and self.reproducible_noise:
            gen = torch.Generator(device="cpu")
            gen.set_state(state["ldp_gen"])
            self._ldp_gen = gen


class DPFedAvg(DPFedAvgMixin, pl.LightningModule):
    __doc__ = DPFedAvgMixin.__doc__
