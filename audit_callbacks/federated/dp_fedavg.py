"""DP-FedAvg as a LightningModule: one federated round per training step.

The algorithm (McMahan et al. 2018, as run in Andrew et al. 2024 §4 / Alg. 2), one stage method
each, passing a typed :class:`~audit_callbacks.federated.round.FederatedRound` from stage to
stage (:mod:`audit_callbacks.federated.protocol` says which audit hook runs after which stage):

1. sample (``_sample``): the round's cohort from the population (real clients plus registered
   virtual clients, see :mod:`audit_callbacks.federated.protocol`) by the ``sampling`` rule;
2. local train (``_train_clients``): each sampled real client starts from the global model and
   runs ``local_epochs`` epochs of SGD (``local_lr``, ``local_batch_size``) on its own data; its
   update is ``theta_local - theta_global`` (a virtual client's owner gives its update instead);
3. clip (``_clip``): each update is clipped to L2 norm ``clip_norm`` (C);
4. randomize (``_randomize``): with a local randomizer, each clipped update is randomized
   (below);
5. aggregate (``_aggregate``): the clipped updates are summed,
   ``N(0, (noise_multiplier * C)^2 I_d)`` is added, and the sum is divided by the fixed cohort
   size m (``clients_per_round``);
6. server step (``_server_step``): the server optimizer (SGD, ``server_lr``,
   ``server_momentum``) takes the negated average as its gradient.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.utils import parameters_to_vector
from torchmetrics.classification import MulticlassAccuracy

from audit_callbacks.compat.namespaces import is_lightning_module, overrides
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.federated.clipping import clip_updates_
from audit_callbacks.federated.protocol import (
    FederatedAuditHooks,
    VirtualClientOwner,
    VirtualClientSumOwner,
)
from audit_callbacks.federated.round import REAL_CLIENT, Cohort, FederatedRound
from audit_callbacks.federated.sampling import SAMPLING_RULES, CohortSampler, sampling_mark
from audit_callbacks.names import (
    ACCURACY,
    COHORT_SIZE,
    EPSILON_ANALYTIC,
    FAMILY_FL,
    FAMILY_PRIVACY,
    FAMILY_TEST,
    FAMILY_VAL,
    LOSS,
    ROUND,
    tag,
)
from audit_callbacks.validation import (
    check_choice,
    check_count,
    check_delta,
    check_flag,
    check_optional_count,
    check_positive,
    check_real,
    check_seed,
)

__all__ = ["DPFedAvg", "DPFedAvgMixin"]

Schedule = Callable[[int], Iterable[int]]


class _VirtualBlock:
    """One owner's virtual clients: population ids ``start..start+count-1``."""

    def __init__(
        self, owner: VirtualClientOwner, name: str, start: int, count: int,
        schedule: Schedule | None, gives_sum: bool,
    ) -> None:
        self.owner, self.name, self.start, self.count, self.schedule = (
            owner, name, start, count, schedule,
        )
        self.gives_sum = gives_sum


def _no_log(*args: Any, **kwargs: Any) -> None:
    """A LightningModule worker's ``log`` / ``log_dict`` while a client trains."""


def _sub_round(fl_round: FederatedRound, rows: torch.Tensor, ids: np.ndarray, owner: int) -> FederatedRound:
    """``dataclasses.replace(fl_round, updates=rows, row_ids=ids, row_owner=[owner] * m,
    summed=(), released=None, average=None, model_delta=None)`` without running the record's
    validation again (a third of the cost of clipping one canary row): ``rows``
    ``[m, d]`` and ``ids`` ``[m]`` int64 are checked by the caller, and the id arrays are made
    read-only copies, as :class:`FederatedRound` makes them."""
    row_ids = np.array(ids, dtype=np.int64, copy=True)
    row_owner = np.full(row_ids.size, owner, dtype=np.int64)
    row_ids.setflags(write=False)
    row_owner.setflags(write=False)
    sub = object.__new__(FederatedRound)
    sub.__dict__.update(fl_round.__dict__)
    sub.__dict__.update(updates=rows, row_ids=row_ids, row_owner=row_owner, summed=(), released=None,
                        average=None, model_delta=None)
    return sub


def _clients_of(block: _VirtualBlock, local: np.ndarray) -> str:
    """``virtual client(s) i, j of owner 'name' (OwnerClass)``, for error messages."""
    ids = local.tolist()
    shown = ", ".join(str(i) for i in ids[:8]) + (f" (and {len(ids) - 8} more)" if len(ids) > 8 else "")
    return (f"virtual client{'s' if len(ids) > 1 else ''} {shown} of owner {block.name!r} "
            f"({type(block.owner).__name__})")


def _check_trainable(model: nn.Module) -> None:
    """Refuse a model DP-FedAvg cannot train: not an ``nn.Module``, or with no trainable
    parameter (torch's optimizer would fail later, naming neither the model nor why)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module (or a LightningModule), got {type(model).__name__}")
    params = list(model.parameters())
    if not params:
        raise ValueError(f"model ({type(model).__name__}) has no parameters: DP-FedAvg has nothing to train")
    if not any(p.requires_grad for p in params):
        raise ValueError(
            f"model ({type(model).__name__}) has no trainable parameters: all {len(params)} have "
            "requires_grad=False (frozen); unfreeze the ones DP-FedAvg should train "
            "(p.requires_grad_(True)): only those are sampled, clipped, noised and updated"
        )


class DPFedAvgMixin:
    """DP-FedAvg over a user model, one round per ``training_step``.

    :class:`DPFedAvg` is this on ``lightning.pytorch``; ``audit_callbacks.compat.pytorch_lightning.
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
        sampling_seed: None (default, secret sampling): the cohorts and the clients' local
            batches are drawn from generators seeded from OS entropy, never logged and never
            saved in a checkpoint (a resume draws from fresh ones: uniform and Poisson cohorts
            are i.i.d. across rounds, so nothing changes in law; a shuffled pass starts afresh).
            An integer: reproducible sampling from it (cohorts ``sampling_seed``, local batches
            ``sampling_seed + 1``), checkpointed so a resume samples the uninterrupted run's
            cohorts; it is logged in ``hparams`` as ``cohort_sampling: "reproducible from seed
            N: the claim assumes secret batches and does not hold for anyone holding the logs"``
            (secret runs log ``cohort_sampling: "secret: ..."``). The analytic epsilon assumes
            known rounds and holds either way; an amplified claim would not hold for anyone
            holding a reproducible run's logs.
        seed: the former name of ``sampling_seed`` (kept; the two must agree if both are given).
            Not logged under this name, so it never clashes with a datamodule's ``seed``.
        reproducible_noise: False (default, secure): the server's DP noise and the local
            randomizer's draws come from generators seeded from OS entropy, never logged and
            never saved in a checkpoint, so nobody can regenerate the noise from
            ``hparams.yaml`` or a checkpoint and subtract it from a released model (as Opacus'
            ``secure_mode`` intends). A resumed run then draws fresh noise: its estimates agree
            with an uninterrupted run's within their intervals, not bit for bit. True: they are
            seeded from ``sampling_seed`` (0 when not given: a reproducible run samples
            reproducibly too) and checkpointed, so runs and resumes are exactly reproducible -
            for tests and debugging only: anyone with the logs can remove the noise, and the
            run has no differential privacy against them.

    Raises:
        ValueError: a bad hyper-parameter, naming it (counts: integers, ``clients_per_round``
            and ``local_batch_size`` >= 1, ``local_epochs`` >= 0, ``num_classes`` None or >= 2;
            finite reals: ``noise_multiplier`` and ``local_lr`` >= 0, ``clip_norm`` and
            ``server_lr`` > 0, ``server_momentum`` in [0, 1), ``delta`` in (0, 1); ``seed`` an
            integer >= 0 or None, as ``sampling_seed``, and the two agreeing; ``reproducible_noise`` a
            bool; ``sampling`` one of the rules); a ``model`` with no trainable parameter
            (frozen, naming the model's class); no
            clients; a population smaller than the cohort; a client update with NaN or inf
            entries (lower ``local_lr``; a finite but huge one is clipped, never refused); a
            virtual client whose owner writes a row of the wrong shape (naming the owner and
            its clients); a ``randomizer`` without ``randomize`` and ``debias`` methods.
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
        seed: int | None = None,
        reproducible_noise: bool = False,
        sampling_seed: int | None = None,
    ) -> None:
        super().__init__()
        # checked once, in their canonical types; save_hyperparameters below logs these values
        clients_per_round = check_count(clients_per_round, "clients_per_round", minimum=1)
        noise_multiplier = check_real(noise_multiplier, "noise_multiplier", low=0.0)
        clip_norm = check_positive(clip_norm, "clip_norm")
        local_epochs = check_count(local_epochs, "local_epochs")  # 0: no local step (zero updates)
        local_lr = check_real(local_lr, "local_lr", low=0.0)  # 0: zero updates (the noise alone)
        local_batch_size = check_count(local_batch_size, "local_batch_size", minimum=1)
        server_lr = check_positive(server_lr, "server_lr")
        server_momentum = check_real(server_momentum, "server_momentum", low=0.0, high=1.0, high_inclusive=False)
        sampling = check_choice(sampling, "sampling", SAMPLING_RULES)
        delta = check_delta(delta)
        num_classes = check_optional_count(num_classes, "num_classes", minimum=2)
        seed = None if seed is None else check_seed(seed)
        sampling_seed = None if sampling_seed is None else check_seed(sampling_seed, "sampling_seed")
        reproducible_noise = check_flag(reproducible_noise, "reproducible_noise")
        if seed is not None and sampling_seed is not None and seed != sampling_seed:
            raise ValueError(f"sampling_seed={sampling_seed} and seed={seed} (its former name) disagree; "
                             "pass sampling_seed only")
        sampling_seed = sampling_seed if sampling_seed is not None else seed
        if sampling_seed is None and reproducible_noise:
            sampling_seed = 0  # a reproducible run is reproducible throughout (the former default seed)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(f"loss_fn must be None or a callable (logits, y) -> loss, got {loss_fn!r}")
        if randomizer is not None and not (
            callable(getattr(randomizer, "randomize", None)) and callable(getattr(randomizer, "debias", None))
        ):
            raise ValueError(f"randomizer must have randomize(x, generator) and debias(y) methods, got "
                             f"{type(randomizer).__name__}")
        _check_trainable(model)
        # the hyper-parameters Lightning logs: no `seed` (FederatedDataModule's split seed has that
        # name, and Lightning refuses to merge two different values of one key); the sampling's
        # seed only in reproducible mode, with the mark that says what it means
        self.save_hyperparameters({
            "clients_per_round": clients_per_round, "noise_multiplier": noise_multiplier,
            "clip_norm": clip_norm, "local_epochs": local_epochs, "local_lr": local_lr,
            "local_batch_size": local_batch_size, "server_lr": server_lr,
            "server_momentum": server_momentum, "sampling": sampling, "delta": delta,
            "num_classes": num_classes, "reproducible_noise": reproducible_noise,
            "sampling_seed": sampling_seed, "cohort_sampling": sampling_mark(sampling_seed),
        })
        self.randomizer = randomizer
        self.automatic_optimization = False
        self.model = model
        self.loss_fn = loss_fn or F.cross_entropy
        self.clients_per_round = clients_per_round
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.local_epochs = local_epochs
        self.local_lr = local_lr
        self.local_batch_size = local_batch_size
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.sampling = sampling
        self.delta = delta
        self.seed = sampling_seed
        self.reproducible_noise = reproducible_noise
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
        self._local_gen.manual_seed(self._sampling_generator_seed(1))
        self._worker: list[nn.Module] = []  # not a registered submodule
        self.round = 0
        self.val_accuracy: MulticlassAccuracy | None = None
        self.test_accuracy: MulticlassAccuracy | None = None
        self._warned_no_noise = False
        self._open_round: dict[str, Any] | None = None  # the state before the round in progress

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
        self, owner: VirtualClientOwner, count: int, *, name: str | None = None,
        schedule: Schedule | None = None, gives_sum: bool = False,
    ) -> str:
        """Add ``count`` virtual clients owned by ``owner`` to the population.

        Must be called before the first round (from a callback's ``setup`` or ``on_fit_start``).
        The same owner registering its ``name`` again (e.g. a second ``fit``) replaces its block;
        another owner's block of that name is refused: its clients would silently vanish.

        Args:
            owner: a :class:`~audit_callbacks.federated.protocol.VirtualClientOwner`: it writes
                its sampled clients' updates with ``client_updates(fl_round, indices,
                clip_norm, out)``.
            count: number of virtual clients (local indices ``0..count-1``).
            name: the block's name (default: the owner's class name).
            schedule: ``None``: the clients are sampled exactly like real ones. Otherwise
                ``schedule(round_idx) -> local indices``: those clients join that round on top
                of the sampled cohort and are never sampled.
            gives_sum: the owner is a :class:`~audit_callbacks.federated.protocol.
                VirtualClientSumOwner` and is asked for ``client_update_sum(fl_round, indices,
                clip_norm)``, the sum of its clients' clipped updates, in the rounds where
                nobody needs the rows (see :mod:`audit_callbacks.federated.protocol`).

        Returns:
            The block's name: the key of ``FederatedRound.cohort.virtual_ids`` and its entry in
            ``FederatedRound.owners``.

        Raises:
            ValueError: a negative ``count``; another owner's block has this ``name``.
            TypeError: ``owner`` has no ``client_updates``, or no ``client_update_sum`` with
                ``gives_sum=True``.
            RuntimeError: a new block after the first round.
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
        if not isinstance(owner, VirtualClientOwner):
            raise TypeError(
                f"{type(owner).__name__} is not a VirtualClientOwner: it needs a method "
                "client_updates(fl_round, indices, clip_norm, out) "
                "(audit_callbacks.federated.protocol)"
            )
        if gives_sum and not isinstance(owner, VirtualClientSumOwner):
            raise TypeError(
                f"gives_sum=True, but {type(owner).__name__} has no method "
                "client_update_sum(fl_round, indices, clip_norm) (audit_callbacks.federated.protocol)"
            )
        same = [b for b in self._blocks if b.name == name and b.owner is owner]
        if same and same[0].count == int(count) and same[0].schedule == schedule:
            same[0].gives_sum = bool(gives_sum)  # a repeated fit: the population does not change
            return name
        if self.round > 0 and self._sampler is not None:
            raise RuntimeError("virtual clients must be registered before the first round")
        self._blocks = [b for b in self._blocks if b.name != name]
        self._blocks.append(_VirtualBlock(owner, name, 0, int(count), schedule, bool(gives_sum)))
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
        elif not getattr(self, "_warned_no_classes", False):
            self._warned_no_classes = True
            rank_zero_warn("DPFedAvg: the number of classes is unknown, so validation and test "
                           "accuracy are not logged (only the loss); pass DPFedAvg(num_classes=...) "
                           "or give the datamodule a num_classes attribute", category=UserWarning)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            self.trainable_parameters(), lr=self.server_lr, momentum=self.server_momentum,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

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
                x = x_all[idx].to(self.device)  # in the parameters' dtype (precision="64-true" ...)
                x = x.to(global_flat.dtype) if x.is_floating_point() else x
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
            # the worker's self.log / self.log_dict as no-ops while a client trains: outside a
            # Trainer Lightning warns at every call, and a client's loss is not to be logged
            # (docs/security.md). No warning filter is touched: changing the filters resets
            # Python's once-per-location record, which repeated other libraries' warnings every
            # round and hid the worker's own.
            worker.log = worker.log_dict = _no_log
            try:
                out = worker.training_step((x, y), i)
            finally:
                del worker.log, worker.log_dict
            loss = out["loss"] if isinstance(out, dict) else out
        else:
            loss = self.loss_fn(worker(x), y)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("the client loss must be a scalar tensor")
        return loss

    # ------------------------------------------------------------------ one round, in stages
    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One federated round: sample -> local train -> clip -> randomize -> aggregate ->
        server step, with the audit hooks between them (:mod:`audit_callbacks.federated.protocol`).

        Raises:
            ValueError: a client's update is not finite, or an owner's ``client_update_sum`` is
                not a finite vector of ``d`` entries.
        """
        hooks = self._audit_hooks()
        self._ensure_sampler()
        # until the round's release, a checkpoint describes the state before the round (its
        # cohort is sampled again, from the same sampler state, on resume): see _commit
        self._open_round = self._state()
        fl_round = self._sample(self.round + 1)
        for hook in hooks:
            hook.on_federated_round_start(self.trainer, self, fl_round)
        # rows are needed by a local randomizer and by observers of the clipped updates; without
        # them an owner registered with gives_sum=True gives the sum of its clipped updates
        rows_needed = self.randomizer is not None or any(
            type(hook).on_federated_client_updates is not FederatedAuditHooks.on_federated_client_updates
            for hook in hooks
        )
        fl_round = self._train_clients(fl_round, rows_needed=rows_needed)
        fl_round = self._clip(fl_round)
        for hook in hooks:
            hook.on_federated_client_updates(self.trainer, self, fl_round)
        fl_round = self._randomize(fl_round)
        if fl_round.released is not None:
            for hook in hooks:
                hook.on_federated_randomized_updates(self.trainer, self, fl_round)
        fl_round = self._aggregate(fl_round)
        fl_round = self._server_step(fl_round)
        self._commit(fl_round)
        for hook in hooks:
            hook.on_federated_round_end(self.trainer, self, fl_round)
        self._log_round(fl_round)

    def _commit(self, fl_round: FederatedRound) -> None:
        """The round's release (its model delta is out): its participations are counted, the
        round is done for checkpoints, and the owners that count their own clients'
        participations hear of it (``on_round_released(fl_round)``, see
        :mod:`audit_callbacks.federated.protocol`) before any audit hook runs, so that a
        checkpoint saved from a later hook (or a signal handler, e.g. Lightning's SLURM
        auto-requeue on SIGUSR1) holds the same rounds in the module's and the owners' counts.
        """
        assert self._participations is not None
        self._participations[fl_round.cohort.population_ids] += 1
        self.round = fl_round.index
        self._open_round = None
        for block in self._blocks:
            released = getattr(block.owner, "on_round_released", None)
            if callable(released):
                released(fl_round)

    def _audit_hooks(self) -> list[FederatedAuditHooks]:
        """The trainer's callbacks that audit rounds: the instances of
        :class:`~audit_callbacks.federated.protocol.FederatedAuditHooks`, in callback order."""
        trainer = self._trainer
        if trainer is None:
            return []
        return [cb for cb in trainer.callbacks if isinstance(cb, FederatedAuditHooks)]

    def _sample(self, round_idx: int) -> FederatedRound:
        """Stage 1: the cohort of round ``round_idx`` (sampled clients, then each owner's
        scheduled ones) and the global model it starts from."""
        sampler = self._ensure_sampler()
        ids = sampler.sample()
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
        cohort = Cohort(
            real_ids=ids[ids < self.num_real_clients],
            virtual_ids=virtual,
            population_ids=np.unique(np.concatenate(all_ids)),
            divisor=self.clients_per_round,
        )
        return FederatedRound(
            index=round_idx, cohort=cohort, theta=self.flat_parameters(),
            clip_norm=self.clip_norm, owners=tuple(b.name for b in self._blocks),
        )

    def _train_clients(self, fl_round: FederatedRound, *, rows_needed: bool) -> FederatedRound:
        """Stage 2: the update matrix, the real clients' rows (local SGD), then each owner's
        (:meth:`VirtualClientOwner.client_updates`); an owner registered with ``gives_sum`` gives
        no rows where ``rows_needed`` is False (its sum is asked for by :meth:`_aggregate`)."""
        cohort, theta = fl_round.cohort, fl_round.theta
        summed = tuple(
            b.name for b in self._blocks
            if b.gives_sum and not rows_needed and cohort.virtual_ids[b.name].size
        )
        giving = [
            (k, b) for k, b in enumerate(self._blocks)
            if b.name not in summed and cohort.virtual_ids[b.name].size
        ]
        n_real = int(cohort.real_ids.size)
        row_owner = np.concatenate([
            np.full(n_real, REAL_CLIENT, dtype=np.int64),
            *[np.full(cohort.virtual_ids[b.name].size, k, dtype=np.int64) for k, b in giving],
        ])
        row_ids = np.concatenate([cohort.real_ids, *[cohort.virtual_ids[b.name] for _, b in giving]])
        # every row is written below (real clients, then each owner's virtual clients)
        updates = torch.empty(row_ids.size, theta.numel(), dtype=theta.dtype, device=theta.device)
        losses = []
        for row, cid in enumerate(cohort.real_ids.tolist()):
            update, loss = self._local_update(cid, theta)
            updates[row] = update
            if math.isfinite(loss):
                losses.append(loss)
        row = n_real
        for _, block in giving:
            local = cohort.virtual_ids[block.name]
            out = updates[row:row + local.size]
            try:
                block.owner.client_updates(fl_round, local, self.clip_norm, out)
            except RuntimeError as err:  # e.g. out.copy_(x) with x of another shape
                raise ValueError(
                    f"round {fl_round.index}: {_clients_of(block, local)} gave updates that are "
                    f"not rows of [{local.size}, {theta.numel()}] (the model's d = {theta.numel()} "
                    f"trainable parameters): {err}"
                ) from err
            row += int(local.size)
        return replace(
            fl_round, updates=updates, row_owner=row_owner, row_ids=row_ids, summed=summed,
            client_loss=float(np.mean(losses)) if losses else math.nan,
        )

    def clip_updates(self, updates: torch.Tensor) -> torch.Tensor:
        """The module's clipping of client updates: every row of ``updates`` ``[m, d]`` to L2
        norm ``clip_norm``, in place (:func:`~audit_callbacks.federated.clipping.clip_updates_`,
        finite huge rows included); returns the norms before clipping ``[m]``.

        The clip stage calls it on every row, real clients' and virtual clients' alike, and the
        owners that give sums clip through it (:meth:`clip_virtual_updates`): override it (or
        the stage) and canaries are clipped by the override too.
        """
        return clip_updates_(updates, self.clip_norm)

    def clip_virtual_updates(
        self, fl_round: FederatedRound, name: str, indices: np.ndarray, rows: torch.Tensor,
    ) -> torch.Tensor:
        """Clip the rows ``[m, d]`` of owner ``name``'s virtual clients ``indices`` ``[m]`` by this
        module's clip stage, in place, as they would be clipped inside the round's update matrix
        (what an owner giving ``client_update_sum`` calls, so that its clients go through the
        same clipping code as the real clients' updates). Returns ``rows``.

        Raises:
            KeyError: ``name`` is not a registered owner.
            ValueError: ``rows`` is not ``[len(indices), d]``, or a row is not finite.
        """
        if name not in fl_round.owners:
            raise KeyError(f"{name!r} is not a registered owner ({list(fl_round.owners)})")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        d = fl_round.theta.numel()
        if rows.dim() != 2 or rows.shape[0] != idx.size or rows.shape[1] != d:
            raise ValueError(f"rows of {name!r}'s clients {idx.tolist()[:8]} must be [{idx.size}, {d}], "
                             f"got {list(rows.shape)}")
        sub = _sub_round(fl_round, rows, idx, fl_round.owners.index(name))
        self._clip(sub)
        return rows

    def _clip(self, fl_round: FederatedRound) -> FederatedRound:
        """Stage 3: clip every row of ``fl_round.updates`` to ``clip_norm``, in place
        (:meth:`clip_updates`).

        Raises:
            ValueError: a row is not finite (naming the clients).
        """
        assert fl_round.updates is not None
        norms = self.clip_updates(fl_round.updates)
        # one value read back in the common case (a sum of finite norms that overflows, rare,
        # is looked at row by row and passes)
        bad = None if math.isfinite(float(norms.sum())) else ~torch.isfinite(norms)
        if bad is not None and bool(bad.any()):
            rows = bad.cpu().numpy()
            who = [
                f"real client {cid}" if owner == REAL_CLIENT
                else f"virtual client {cid} of {fl_round.owners[owner]!r}"
                for owner, cid in zip(fl_round.row_owner[rows].tolist(), fl_round.row_ids[rows].tolist(),
                                      strict=True)
            ]
            raise ValueError(
                f"round {fl_round.index}: non-finite update from {who}; lower local_lr or check the data"
            )
        return fl_round

    def _randomize(self, fl_round: FederatedRound) -> FederatedRound:
        """Stage 4, only with a local randomizer: the rows the clients release."""
        if self.randomizer is None:
            return fl_round
        assert fl_round.updates is not None
        released = self.randomizer.randomize(
            fl_round.updates, generator=self._ldp_generator(fl_round.updates),
        )
        return replace(fl_round, randomizer=self.randomizer, released=released)

    def _aggregate(self, fl_round: FederatedRound) -> FederatedRound:
        """Stage 5: the noisy average. The sum of the real clients' rows, then of each owner's
        rows or the sum it gives, in registration order (the same grouping whether an owner
        gives its rows or their sum, so either way trains the same bits), plus the noise,
        divided by m.

        Raises:
            ValueError: an owner's sum is not a finite vector of ``d`` entries.
        """
        assert fl_round.updates is not None
        rows = fl_round.updates if fl_round.released is None else fl_round.randomizer.debias(fl_round.released)
        cohort, d = fl_round.cohort, fl_round.theta.numel()
        end = int(cohort.real_ids.size)
        total = rows[0:end].sum(0)
        for block in self._blocks:
            local = cohort.virtual_ids[block.name]
            if not local.size:
                continue
            if block.name not in fl_round.summed:
                start, end = end, end + int(local.size)
                total.add_(rows[start:end].sum(0))
                continue
            part = block.owner.client_update_sum(fl_round, local, self.clip_norm)
            part = part.to(device=total.device, dtype=total.dtype).reshape(-1)
            finite = part.numel() == d and (
                math.isfinite(float(part.sum())) or bool(torch.isfinite(part).all())
            )
            if not finite:
                raise ValueError(
                    f"round {fl_round.index}: {block.name!r} gave a sum of clipped updates that is "
                    f"not a finite vector of {d} entries ({_clients_of(block, local)})"
                )
            total.add_(part)
        if self.noise_multiplier > 0:
            total.add_(self._noise(d, total), alpha=self.noise_multiplier * self.clip_norm)
        return replace(fl_round, average=total / cohort.divisor)

    def _server_step(self, fl_round: FederatedRound) -> FederatedRound:
        """Stage 6: the server optimizer takes ``-average`` as its gradient; the model delta."""
        assert fl_round.average is not None
        opt = self.optimizers()
        offset = 0
        for p in self.trainable_parameters():
            n = p.numel()
            p.grad = (-fl_round.average[offset:offset + n]).view_as(p).clone()
            offset += n
        opt.step()
        opt.zero_grad(set_to_none=True)
        return replace(fl_round, model_delta=self.flat_parameters() - fl_round.theta)

    def _log_round(self, fl_round: FederatedRound) -> None:
        """``fl/round``, ``fl/cohort_size`` and ``privacy/epsilon_analytic``
        (:mod:`audit_callbacks.names`), at the round's step. The cohort's mean local loss
        (``fl_round.client_loss``) is not logged: it is an un-noised value of the round's real
        clients, so it stays in the round passed to the hooks, in memory (docs/security.md)."""
        self.log(tag(FAMILY_FL, ROUND), float(fl_round.index), on_step=True, on_epoch=False, batch_size=1)
        self.log(tag(FAMILY_FL, COHORT_SIZE), float(fl_round.cohort.size), on_step=True, on_epoch=False,
                 batch_size=1)
        eps = self.analytic_epsilon()
        if eps == math.inf and not self._warned_no_noise:
            self._warned_no_noise = True
            if self.randomizer is None:
                rank_zero_warn("DPFedAvg: noise_multiplier = 0: no DP noise, the analytic epsilon "
                               "is infinite (logged as inf)", category=UserWarning)
            else:  # local DP: the central Gaussian mechanism's epsilon is inf, not the clients'
                rank_zero_warn(f"DPFedAvg: noise_multiplier = 0: no central Gaussian noise, so the "
                               f"central analytic epsilon is infinite (logged as inf); each client's "
                               f"update is protected by its local randomizer instead "
                               f"({type(self.randomizer).__name__}: LDPAudit measures its epsilon0)",
                               category=UserWarning)
        if eps is not None:
            self.log(tag(FAMILY_PRIVACY, EPSILON_ANALYTIC), eps, on_step=True, on_epoch=False, batch_size=1)

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

    @property
    def reproducible_sampling(self) -> bool:
        """True when the cohorts and the clients' local batches follow from ``sampling_seed``."""
        return self.seed is not None

    def _sampling_generator_seed(self, offset: int) -> int:
        """``sampling_seed + offset`` in reproducible mode, else 63 bits of OS entropy (kept
        only inside the generator, which is never saved)."""
        return self.seed + offset if self.seed is not None else secrets.randbits(63)

    def _generator_seed(self, offset: int) -> int:
        """``seed + offset`` with ``reproducible_noise``, else 63 bits of OS entropy (kept only
        inside the generator, which is never saved)."""
        return self.seed + offset if self.reproducible_noise else secrets.randbits(63)

    def participations(self) -> np.ndarray:
        """Rounds each population id took part in so far (real clients first), ``[N]``."""
        self._ensure_sampler()
        assert self._participations is not None
        return self._participations.copy()

    def analytic_epsilon(self, participations: int | None = None, delta: float | None = None
                         ) -> float | None:
        """Epsilon at ``delta`` (None: the module's) if the adversary knows the rounds
        (docs/methods/canaries.md, D).

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
        return gaussian_epsilon(self.noise_multiplier, self.delta if delta is None else delta,
                                compositions=participations)

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch: Any, prefix: str, metric: MulticlassAccuracy | None) -> torch.Tensor:
        x, y = batch[0], batch[1]
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        self.log(tag(prefix, LOSS), loss, on_step=False, on_epoch=True, prog_bar=prefix == FAMILY_VAL)
        if metric is not None:
            metric.update(logits.argmax(-1), y)
            self.log(tag(prefix, ACCURACY), metric, on_step=False, on_epoch=True, prog_bar=True)
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
        return self._eval_step(batch, FAMILY_VAL, self.val_accuracy)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        if is_lightning_module(self.model) and overrides(self.model, "test_step"):
            return self._user_step("test_step", batch, batch_idx)
        return self._eval_step(batch, FAMILY_TEST, self.test_accuracy)

    # ------------------------------------------------------------------ checkpointing
    def _state(self) -> dict[str, Any]:
        """The module's federated state now: round, local shuffling generator, sampler,
        participations (and, only with ``reproducible_noise``, the noise generators)."""
        state: dict[str, Any] = {"round": self.round}
        if self.reproducible_sampling:  # secret local batches: never written anywhere
            state["local_gen"] = self._local_gen.get_state()
        if self._sampler is not None:
            assert self._participations is not None
            state["sampler"] = self._sampler.state_dict()
            state["participations"] = self._participations.copy()  # a list in the checkpoint
        if self.reproducible_noise:  # secure noise is never written anywhere
            if self._noise_gen is not None:
                state["noise_gen"] = self._noise_gen.get_state()
            if self._ldp_gen is not None:
                state["ldp_gen"] = self._ldp_gen.get_state()
        return state

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The state after the last released round: a checkpoint saved inside a round (from an
        audit hook, or by Lightning's SLURM auto-requeue on SIGUSR1) holds the state from
        before that round, whose release has not happened, so the resumed run samples the same
        cohort again and counts its participations once. Not covered: a signal handler's
        checkpoint during the release itself (``_commit`` and the owners' ``on_round_released``,
        about a millisecond a round), see :mod:`audit_callbacks.federated.protocol`."""
        state = dict(self._open_round if self._open_round is not None else self._state())
        if "participations" in state:
            state["participations"] = np.asarray(state["participations"]).tolist()
        checkpoint["dp_fedavg"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("dp_fedavg")
        if state is None:
            return
        self.round = int(state["round"])
        if self.reproducible_sampling and "local_gen" in state:
            self._local_gen.set_state(state["local_gen"])
        self._sampler = None
        self._pending_state = state

    def _restore(self, state: dict[str, Any]) -> None:
        if "sampler" in state:
            assert self._sampler is not None
            virtual = ", ".join(f"{b.name}: {b.count}" for b in self._blocks if b.schedule is None)
            self._sampler.load_state_dict(state["sampler"], settings={
                "cohort_size": "clients_per_round", "rule": "sampling",
                "population": f"the population N of real and sampled virtual clients (here "
                              f"{self.num_real_clients} real + [{virtual or 'none'}]; a changed "
                              "num_clients or CanaryAudit num_canaries changes it)"})
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
