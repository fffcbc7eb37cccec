"""What the auditor needs from a backend (a ``typing.Protocol``), the defaults most backends
share, and the Lightning hooks the Lightning front end forwards.

A backend inserts the auditor's canaries into one kind of DP training, describes what one
release is (:meth:`CanaryBackend.release_model`: the auditor builds every statistic from that
description, the backend builds none) and feeds the auditor
(:class:`~audit_callbacks.auditing.CanaryAuditor`) its events: ``start`` with ``theta_0`` and
``release`` with each released vector and the canaries that took part. Lightning's hooks are
a separate mixin (:class:`LightningHooks`), forwarded by ``CanaryAudit``; every hook is a no-op
unless the backend needs it, so a front end never asks which backend it has.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from audit_callbacks import names
from audit_callbacks.canary.base import NoMatchedStatistic, ReleaseModel

if TYPE_CHECKING:  # pragma: no cover
    from audit_callbacks.auditing import CanaryAuditor

__all__ = ["CANARY_SHARE_WARN", "BackendBase", "CanaryBackend", "LightningHooks", "NotAuditable", "num_batches",
           "num_examples", "total_rounds"]


class NotAuditable(TypeError):
    """The training is not one a canary audit can audit (neither DP-FedAvg nor an Opacus
    ``DPOptimizer``): a Lightning callback warns once and steps aside; a ``TypeError`` for
    every other caller."""

#: The one canary-share rule of every path: canaries are warned about from this share of the
#: examples a DP-SGD step sees (k q / (N q + k q)) or of the federated population (k / (N + k)):
#: each is a clipped contribution no real example or client makes, so many of them slow
#: learning (and on the federated paths they take places real clients would have).
CANARY_SHARE_WARN = 0.1


@runtime_checkable
class CanaryBackend(Protocol):
    """What :class:`~audit_callbacks.auditing.CanaryAuditor` needs from a backend.

    Attributes:
        training: the kind of training, for the summary (``"DP-FedAvg"``...).
        sign: +1 when canaries are updates the model moves along, -1 for gradients.
        default_delta: the delta of the estimates when neither the audit nor the training
            gives one.
        analytic_names: the analytic epsilons :meth:`analytic` gives (names of family
            ``audit`` in :mod:`audit_callbacks.names`).
        dim: d, the model's trainable parameters.
        population: real clients or training examples (caps the default k), None if unknown.
    """

    training: str
    sign: float
    default_delta: float
    analytic_names: tuple[str, ...]
    dim: int
    population: int | None

    def attach(self, auditor: CanaryAuditor) -> None:
        """Install the auditor's canaries into the training (called by the auditor)."""
        ...

    def release_model(self, kind: str) -> ReleaseModel:
        """What one release is, for canaries of ``kind`` (``"hadamard"`` or ``"gaussian"``):
        the description the auditor builds the matched statistic from, or
        :class:`~audit_callbacks.canary.base.NoMatchedStatistic` with the reason."""
        ...

    def flat_parameters(self) -> torch.Tensor | None:
        """The flat model ``[d]`` whose deltas are audited (None before any release)."""
        ...

    def progress(self) -> int:
        """Rounds (DP-FedAvg, Flower) or logical steps (DP-SGD) taken so far."""
        ...

    def analytic(self, delta: float) -> dict[str, float | None]:
        """``{"epsilon_analytic": epsilon, ...}``: the analytic epsilon of a canary at
        ``delta`` (``inf`` without DP noise, None when unknown)."""
        ...

    def last_iterate(self, delta: float) -> float | None:
        """The final-model reference where the matched statistic gives none, None when
        unknown."""
        ...

    def summary_inputs(self) -> dict[str, Any]:
        """The training's settings for the summary JSON."""
        ...

    def estimate_flag(self) -> str | None:
        """Why every ``ok`` estimate must read ``flagged: <reason>``, or None."""
        ...

    def claim(self, delta: float) -> dict[str, Any]:
        """Which sampling the analytic epsilon assumes (``claim_sampling``, one sentence for the
        summary's inputs) and, where the run's sampling is known to whoever holds its logs, the
        claim that holds for them (summary entries); nothing by default."""
        return {}

    def summary_status(self) -> dict[str, str]:
        """Summary entries that replace the auditor's."""
        ...

    def detach(self) -> None:
        """Undo what was installed into the training."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The backend's own state for resume (beyond the auditor's)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


class BackendBase:
    """The defaults of a :class:`CanaryBackend` (see there for the attributes).

    Attributes:
        auditor: the auditor, once :meth:`attach` was called.
    """

    training = "abstract"
    sign = 1.0
    default_delta = 1e-6
    analytic_names: tuple[str, ...] = (names.EPSILON_ANALYTIC,)

    def __init__(self, dim: int, population: int | None) -> None:
        self.dim = int(dim)
        self.population = population
        self.auditor: CanaryAuditor | None = None

    def attach(self, auditor: CanaryAuditor) -> None:
        """Install the auditor's canaries into the training (called by the auditor)."""
        self.auditor = auditor

    def release_model(self, kind: str) -> ReleaseModel:
        """What one release is (default: no statistic matched to the analytic epsilon)."""
        return NoMatchedStatistic("this training has no statistic matched to the analytic epsilon")

    # what the auditor asks ----------------------------------------------------------------
    def flat_parameters(self) -> torch.Tensor | None:
        """The flat model ``[d]`` whose deltas are audited (None before any release)."""
        raise NotImplementedError

    def progress(self) -> int:
        """Rounds (DP-FedAvg, Flower) or logical steps (DP-SGD) taken so far."""
        raise NotImplementedError

    def analytic(self, delta: float) -> dict[str, float | None]:
        """``{"epsilon_analytic": epsilon, ...}``: the analytic epsilon of a canary at
        ``delta`` (``inf`` without DP noise, None when unknown)."""
        raise NotImplementedError

    def last_iterate(self, delta: float) -> float | None:
        """The final-model reference at ``delta`` where the matched statistic gives none: the
        last-iterate heuristic (Steinke et al., ICLR 2025), None when unknown."""
        return None

    def summary_inputs(self) -> dict[str, Any]:
        """The training's settings for the summary JSON."""
        raise NotImplementedError

    def estimate_flag(self) -> str | None:
        """Why every ``ok`` estimate must read ``flagged: <reason>`` (the training broke an
        assumption of the analysis, e.g. Flower's unequal client weights), or None."""
        return None

    def claim(self, delta: float) -> dict[str, Any]:
        """Which sampling the analytic epsilon assumes (``claim_sampling``, one sentence for the
        summary's inputs) and, where the run's sampling is known to whoever holds its logs, the
        claim that holds for them (summary entries); nothing by default."""
        return {}

    def summary_status(self) -> dict[str, str]:
        """Summary entries that replace the auditor's (e.g. ``epsilon_analytic_status`` when
        the analytic epsilon used an effective noise multiplier); none by default."""
        return {}

    def detach(self) -> None:
        """Undo what was installed into the training (nothing by default)."""

    def state_dict(self) -> dict[str, Any]:
        """The backend's own state for resume (beyond the auditor's)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class LightningHooks:
    """Lightning's hooks, forwarded by ``CanaryAudit`` (no-ops unless a backend needs them)."""

    def on_setup(self, trainer: Any, pl_module: Any) -> None:
        """``setup("fit")`` of a repeated fit."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """``on_fit_start`` of a repeated fit."""

    def on_train_batch_end(self) -> None:
        """After a training batch (and its optimizer call, if any)."""

    def on_federated_round_end(self, fl_round: Any) -> None:
        """A DP-FedAvg round released ``fl_round.model_delta`` ``[d]`` (a
        :class:`~audit_callbacks.federated.FederatedRound`)."""


def num_batches(loader: Any) -> int | None:
    """The training loader's length, or None when it has none."""
    try:
        return int(len(loader)) or None
    except TypeError:
        return None


def num_examples(loader: Any) -> int | None:
    """The training set's size (the loader's dataset), or None when it has none."""
    try:
        return int(len(loader.dataset))
    except (TypeError, AttributeError):
        return None


def total_rounds(trainer: Any) -> int:
    """The run's length in training steps; ValueError for an open-ended run."""
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total) or total < 1:
        raise ValueError("CanaryAudit(repeats=...) needs a finite run: set max_steps or max_epochs")
    return int(total)
