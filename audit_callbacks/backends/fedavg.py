"""Canary clients in :class:`~audit_callbacks.federated.DPFedAvg` (Andrew et al., "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024, Alg. 2 and §5.2).

Canary clients join the client population and are sampled by exactly the same rule as the real
clients; a sampled canary client ``j`` returns ``canary_norm_multiplier * clip_norm * c_j`` (10 C
by default), which the module's own clip stage clips, exactly as it clips the real clients'
updates: with correct clipping its contribution to the noisy sum is ``clip_norm *
c_j``; a clipping at the wrong norm moves it, and the estimates with it. The backend is the owner
of the virtual clients (:mod:`audit_callbacks.federated.protocol`); at each round's release it
gives the model delta, with the canaries of that round's cohort, to the auditor, and describes
the round's release (a model delta of server SGD on the noisy average,
:class:`~audit_callbacks.canary.base.NoisyAverageDelta`) for the auditor's statistics.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from audit_callbacks import names
from audit_callbacks.backends.base import (
    CANARY_SHARE_WARN,
    BackendBase,
    LightningHooks,
    total_rounds,
)
from audit_callbacks.canary.base import NoisyAverageDelta, NoMatchedStatistic, ReleaseModel

__all__ = ["FedAvgBackend", "crowding_warning", "fedavg_release_model"]


def crowding_warning(k: int, n_real: int, per_round: int | None, *, name: str = "CanaryAudit"
                     ) -> str | None:
    """The warning for ``k`` sampled canary clients among ``n_real`` real ones, or None when
    they are less than 10% of the population: they take about k / (N + k) of every cohort's
    places, and the message gives the ``clients_per_round`` that keeps ``per_round`` real
    clients a round (None: no cohort size to suggest, as on Flower, whose cohort is
    ``fraction_train`` of real and canary nodes). The DP-SGD path warns at the same share
    (:func:`audit_callbacks.backends.opacus.backend.canary_share_warning`)."""
    if n_real <= 0 or k <= 0 or k / (n_real + k) < CANARY_SHARE_WARN:
        return None
    share = k / (n_real + k)
    fix = "pass a smaller num_canaries"
    if per_round:
        keep = math.ceil(per_round * (n_real + k) / n_real)
        fix = (f"set clients_per_round={keep} to keep {per_round} real clients a round on average, or "
               + fix)
    what = "outnumber" if k > n_real else "are a large share of the population next to"
    return (f"{name}: {k} canary clients {what} the {n_real} real clients, so about "
            f"{share:.0%} of every cohort are canaries in places real clients would take, which "
            f"slows learning; {fix}")


def fedavg_release_model(module: Any, kind: str) -> ReleaseModel:
    """What a round of a ``DPFedAvg`` module releases, for canaries of ``kind``: the model
    delta of server SGD on the noisy average, or why no matched statistic applies."""
    if getattr(module, "randomizer", None) is not None:
        return NoMatchedStatistic("local DP: the release is the randomized clients' rows, not a noisy sum")
    z = float(module.noise_multiplier)
    if z <= 0:
        return NoMatchedStatistic("no DP noise (noise_multiplier = 0): the known-rounds statistic is undefined")
    return NoisyAverageDelta(clip_norm=float(module.clip_norm), divisor=int(module.clients_per_round),
                             noise_multiplier=z, server_lr=float(module.server_lr),
                             server_momentum=float(module.server_momentum),
                             tensors=_tensors(module))


def _tensors(module: Any) -> tuple[tuple[str, int], ...]:
    """``((name, numel), ...)`` of the module's trainable parameters, in flat-vector order."""
    model = getattr(module, "model", None)
    if model is None or not callable(getattr(model, "named_parameters", None)):
        return ()
    return tuple((name, int(p.numel())) for name, p in model.named_parameters() if p.requires_grad)


def _world_size(trainer: Any) -> int:
    """``trainer.world_size`` (processes: nodes x devices), 1 when the trainer has none."""
    value = getattr(trainer, "world_size", 1)
    return value if isinstance(value, int) else 1



def full_precision(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast off on ``device`` while the audit computes, where it is on. DP-FedAvg releases a
    round inside ``training_step``, i.e. inside the autocast region of a Trainer with
    ``precision="bf16-mixed"`` or ``"16-mixed"``, where the canary transform's matmuls (and
    the canary rows' ``mm``/``mv``) would run in bfloat16 or float16: the audit's arithmetic
    stays in the release's own dtype (float32 or float64)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()

class FedAvgBackend(LightningHooks, BackendBase):
    """Canary clients of a ``DPFedAvg`` module.

    Args:
        module: the ``DPFedAvg`` LightningModule.
        trainer: the Trainer (its length, when ``repeats`` is set).
        warn: ``warn(key, message)``, once per key.
        name: the name of the canary clients' block in the module (distinct per audit).
        repeats: each canary presented in ``repeats`` scheduled rounds instead of sampled
            (Andrew et al. §5.2); None: sampled.
        seed: the seed of the schedule.

    Raises:
        RuntimeError: the trainer runs more than one process (``trainer.world_size > 1``, e.g.
            ``strategy="ddp"`` or ``"ddp_spawn"`` with ``devices=2``): ``DPFedAvg`` simulates
            every client of a round in one process, so each rank would run the same full rounds
            with its own noise and its own canary clients, and the audit would describe none of
            them.
    """

    training = "DP-FedAvg"
    sign = 1.0
    default_delta = 1e-6

    def __init__(
        self, module: Any, trainer: Any, warn: Callable[[str, str], None], *,
        name: str = "canary", repeats: int | None = None, seed: int = 0,
    ) -> None:
        world_size = _world_size(trainer)
        if world_size > 1:
            raise RuntimeError(
                f"CanaryAudit: DP-FedAvg runs every client of a round in one process, but the "
                f"trainer runs {world_size} processes (world_size={world_size}, a DDP strategy): "
                "each rank would run the same full rounds with its own noise and canary clients. "
                "Train DPFedAvg with one process (Trainer(devices=1), strategy 'auto')"
            )
        super().__init__(int(module.num_parameters), int(module.num_real_clients))
        if getattr(module, "delta", None) is not None:
            self.default_delta = float(module.delta)
        self.module = module
        self.name = name
        self.warn = warn
        self.repeats = repeats
        self.seed = int(seed)
        self._released_round = -1  # the last round given to the auditor (released once)
        self._trainer = trainer
        self._schedule: dict[int, list[int]] | None = None

    def release_model(self, kind: str) -> ReleaseModel:
        """A round's release: the module's model delta of server SGD on the noisy average
        (:func:`fedavg_release_model`)."""
        return fedavg_release_model(self.module, kind)

    def attach(self, auditor: Any) -> None:
        super().attach(auditor)
        if self.repeats is None:
            message = crowding_warning(auditor.num_canaries, int(self.module.num_real_clients),
                                       getattr(self.module, "clients_per_round", None))
            if message:
                self.warn("crowding", message)
        self.register()

    def on_setup(self, trainer: Any, pl_module: Any) -> None:
        """A second fit of the same module: the same canaries go on (the server optimizer is
        built anew: the auditor's statistics that follow it restart)."""
        self._trainer = trainer
        self.register()
        assert self.auditor is not None
        self.auditor.new_fit()

    @property
    def num_canaries(self) -> int:
        assert self.auditor is not None
        return self.auditor.num_canaries

    def register(self) -> None:
        """Register the canary clients with the module (sampled, or on their schedule)."""
        schedule = None if self.repeats is None else self._scheduled
        self.module.register_virtual_clients(self, self.num_canaries, name=self.name, schedule=schedule,
                                             gives_sum=True)

    def _scheduled(self, round_idx: int) -> list[int]:
        """Repeated presentations (§5.2): each canary joins one uniformly chosen round of each of
        ``repeats`` equal periods of training."""
        if self._schedule is None:
            total, repeats = total_rounds(self._trainer), int(self.repeats or 1)
            rng = np.random.default_rng([self.seed, 0x5C4ED])
            bounds = np.linspace(0, total, repeats + 1).astype(int)
            schedule: dict[int, list[int]] = {}
            for p in range(repeats):
                lo, hi = int(bounds[p]), max(int(bounds[p + 1]), int(bounds[p]) + 1)
                for j, r in enumerate((rng.integers(lo, hi, size=self.num_canaries) + 1).tolist()):
                    schedule.setdefault(r, []).append(j)
            self._schedule = schedule
        return self._schedule.get(round_idx, [])

    # the virtual clients' updates (protocol) ------------------------------------------------
    def _device_dtype(self, fl_round: Any = None) -> tuple[torch.device, torch.dtype]:
        """The device and dtype of the round's flat vectors: those of ``fl_round.theta`` (the
        global model the round starts from, on the model's device, in the dtype of the update
        matrix; no walk over the module's parameters), else of the first trainable parameter."""
        theta = getattr(fl_round, "theta", None)
        if isinstance(theta, torch.Tensor):
            return theta.device, theta.dtype
        first = next(iter(self.module.trainable_parameters()))
        return first.device, first.dtype

    def _scale(self, clip_norm: float) -> float:
        """A canary's norm before clipping: ``canary_norm_multiplier * clip_norm``."""
        assert self.auditor is not None
        return float(self.auditor.config.canary_norm_multiplier) * float(clip_norm)

    def client_updates(self, fl_round: Any, indices: np.ndarray, clip_norm: float, out: torch.Tensor) -> None:
        """Write ``canary_norm_multiplier * clip_norm * c_j`` for the canary clients ``indices``
        into ``out`` ``[m, d]``; the module's clip stage clips them like real updates."""
        assert self.auditor is not None
        out.copy_(self.auditor.canaries.batch(np.asarray(indices, dtype=np.int64), scale=self._scale(clip_norm),
                                              device=out.device))

    def _clip(self, fl_round: Any, indices: np.ndarray, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` ``[m, d]`` of canary clients ``indices``, clipped by the module's clip stage."""
        clip = getattr(self.module, "clip_virtual_updates", None)
        if clip is None:  # a module without the method: the protocol's documented clipping
            from audit_callbacks.federated.clipping import clip_updates_

            clip_updates_(rows, float(fl_round.clip_norm))
            return rows
        return clip(fl_round, self.name, np.asarray(indices, dtype=np.int64), rows)

    def client_update_sum(self, fl_round: Any, indices: np.ndarray, clip_norm: float) -> torch.Tensor:
        """The sum ``[d]`` of the canary clients' updates ``canary_norm_multiplier * clip_norm *
        c_j``, each clipped by the module's clip stage (``DPFedAvg.clip_virtual_updates``).

        Hadamard canaries: one transform. Every canary has the same norm (entries +-s, s =
        canary_norm_multiplier * clip_norm / sqrt(n), on the first n = 2^floor(log2 d)
        coordinates, 0 on the rest), so one representative row goes through the module's
        clipping each round (no cache: a clipping that changes from round to round shows).
        When the clipping merely scaled it (``clipped_i * raw_0 == raw_i * clipped_0`` for every
        coordinate i), the sum of the unit canaries is scaled by the float64 ratio ``clipped_0 /
        raw_0`` times the canary norm (rounded to the dtype; the previous float64 least squares
        gave the same multiplier in every draw tested, tests/backends/test_per_round_ops.py); otherwise
        every canary's row goes through the clipping, chunk by chunk, instead. The device and
        dtype are those of the round's ``theta``. Gaussian canaries: chunk by chunk, each row
        clipped by the module.
        """
        assert self.auditor is not None
        device, dtype = self._device_dtype(fl_round)
        with full_precision(device):
            return self._client_update_sum(fl_round, indices, clip_norm, device, dtype)

    def _client_update_sum(self, fl_round: Any, indices: np.ndarray, clip_norm: float,
                           device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        assert self.auditor is not None
        canaries, idx = self.auditor.canaries, np.asarray(indices, dtype=np.int64).reshape(-1)
        scale = self._scale(clip_norm)
        if canaries.kind == "hadamard":
            raw = canaries.batch(idx[:1], scale=scale, device=device)
            if raw.dtype != dtype:
                raw = raw.to(dtype)
            kept = raw[0].clone()  # the clipping works in place
            clipped = self._clip(fl_round, idx[:1], raw)[0]
            # a scaling by f gives clipped_i = fl(raw_i f) with |raw_i| = s for every i < n (and
            # 0 beyond), so clipped_i * raw_0 and raw_i * clipped_0 are the same product: one
            # comparison of the whole row (a float64 least squares, within ~1e-5
            # relative, cost a third of the round's canary work). The one value read back to
            # the host in a round (which code runs next depends on it); the module reads the
            # sum back right after (DPFedAvg checks it is finite)
            if bool(torch.eq(clipped * kept[0], kept * clipped[0]).all()):
                # q / s in float64 (float32 / float64 promotes: the bits of both converted)
                factor = torch.div(clipped[:1], kept[:1].to(torch.float64)).mul_(scale).to(dtype)
                total = canaries.sum(idx, device=device)
                return total.mul_(factor) if total.dtype == dtype else total.to(dtype).mul_(factor)
            total = torch.zeros(canaries.dim, device=device, dtype=dtype)
            for start in range(0, len(idx), 64):  # not a scaling: every row through the clipping
                part = idx[start:start + 64]
                rows = canaries.batch(part, scale=scale, device=device).to(dtype)
                total += self._clip(fl_round, part, rows).sum(0)
            return total
        total = torch.zeros(canaries.dim, device=device, dtype=dtype)
        for part, block in canaries.chunks(idx, device=device):  # one chunk in memory at a time
            rows = block.to(dtype).mul_(scale)
            total += self._clip(fl_round, part, rows).sum(0)
        return total

    # rounds ---------------------------------------------------------------------------------
    def on_round_released(self, fl_round: Any) -> None:
        """The round's release (called by the module as the round's participations are counted,
        before any audit hook): the canaries of its cohort took part in its model delta. Once
        per round: :meth:`on_federated_round_end` then does nothing for it."""
        assert self.auditor is not None
        if fl_round.index == self._released_round:
            return
        self._released_round = int(fl_round.index)
        participants = fl_round.cohort.virtual_ids.get(self.name)
        with full_precision(fl_round.model_delta.device):
            self.auditor.release(fl_round.model_delta, participants, what=f"round {fl_round.index}")

    def on_federated_round_end(self, fl_round: Any) -> None:
        """The round's release, where the module did not already give it
        (:meth:`on_round_released`)."""
        self.on_round_released(fl_round)

    def flat_parameters(self) -> torch.Tensor:
        return self.module.flat_parameters()

    def progress(self) -> int:
        return int(self.module.round)

    def analytic(self, delta: float) -> dict[str, float | None]:
        """The Gaussian mechanism composed over the most-sampled canary's rounds, if the
        adversary knows them (the module's ``analytic_epsilon``) at the audit's ``delta``
        (which may differ from the module's own); ``inf`` without noise."""
        assert self.auditor is not None
        max_part = int(self.auditor.participations.max(initial=0))
        return {names.EPSILON_ANALYTIC: self.module.analytic_epsilon(max_part, delta=delta)}

    def claim(self, delta: float) -> dict[str, Any]:
        """The analytic epsilon assumes known rounds (no amplification by sampling): it holds
        whether or not the cohorts are secret; the cohorts' own mark (``cohort_sampling``) is
        quoted beside it."""
        hparams = getattr(self.module, "hparams", None)
        mark = hparams.get("cohort_sampling") if hasattr(hparams, "get") else None
        return {"claim_sampling": "known rounds: the analytic epsilon assumes the adversary knows "
                                  "every round each canary took part in (no amplification by "
                                  "sampling), so it holds for anyone holding the logs; cohorts: "
                                  f"{mark or 'sampled by the module'}"}

    def summary_inputs(self) -> dict[str, Any]:
        m = self.module
        return {
            "repeats": self.repeats,
            "rounds": int(m.round),
            "noise_multiplier": m.noise_multiplier,
            "clip_norm": m.clip_norm,
            "clients_per_round": m.clients_per_round,
            "sampling": m.sampling,
            "num_real_clients": m.num_real_clients,
            "canary_norm_multiplier": (None if self.auditor is None
                                       else float(self.auditor.config.canary_norm_multiplier)),
        }
