"""What every canary backend answers: the events of one kind of training, and what the auditor
needs from it.

A backend inserts the auditor's canaries into one kind of DP training and feeds the auditor
(:class:`~audit_callbacks.auditing.CanaryAuditor`) its events: ``start`` with ``theta_0`` and
``release`` with each model delta and the canaries that took part. Front ends forward their
framework's hooks to it; every hook is a no-op unless the backend needs it, so a front end
never asks which backend it has.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from audit_callbacks.auditing import CanaryAuditor

__all__ = ["CanaryBackend", "num_batches", "num_examples", "total_rounds"]


class CanaryBackend:
    """Base of the backends.

    Attributes:
        training: the kind of training, for the summary (``"DP-FedAvg"``...).
        sign: +1 when canaries are updates the model moves along, -1 for gradients.
        default_delta: the delta of the estimates when neither the audit nor the training
            gives one.
        analytic_names: the analytic epsilons :meth:`analytic` gives (names of family
            ``audit`` in :mod:`audit_callbacks.names`).
        dim: d, the model's trainable parameters.
        population: real clients or training examples (caps the default k), None if unknown.
        auditor: the auditor, once :meth:`attach` was called.
    """

    training = "abstract"
    sign = 1.0
    default_delta = 1e-6
    analytic_names: tuple[str, ...] = ("epsilon_analytic",)
    #: the all-iterates statistic matched to the analytic epsilon's adversary (scores(),
    #: estimate(delta, alpha=, bootstrap=, seed=), state_dict()), or None with the reason
    matched: Any = None
    matched_reason = "this training has no statistic matched to the analytic epsilon"

    def __init__(self, dim: int, population: int | None) -> None:
        self.dim = int(dim)
        self.population = population
        self.auditor: CanaryAuditor | None = None

    def attach(self, auditor: CanaryAuditor) -> None:
        """Install the auditor's canaries into the training (called by the auditor)."""
        self.auditor = auditor

    # Lightning's hooks, forwarded by CanaryAudit (no-ops unless a backend needs them) -------
    def on_setup(self, trainer: Any, pl_module: Any) -> None:
        """``setup("fit")`` of a repeated fit."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """``on_fit_start`` of a repeated fit."""

    def on_train_batch_end(self) -> None:
        """After a training batch (and its optimizer call, if any)."""

    def on_federated_round_end(self, fl_round: Any) -> None:
        """A DP-FedAvg round released ``fl_round.model_delta`` ``[d]`` (a
        :class:`~audit_callbacks.federated.FederatedRound`)."""

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
        """The final-model reference at ``delta``: the last-iterate heuristic (Steinke et al.,
        ICLR 2025), None when unknown."""
        return None

    def summary_inputs(self) -> dict[str, Any]:
        """The training's settings for the summary JSON."""
        raise NotImplementedError

    def estimate_flag(self) -> str | None:
        """Why every ``ok`` estimate must read ``flagged: <reason>`` (the training broke an
        assumption of the analysis, e.g. Flower's unequal client weights), or None."""
        return None

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


def num_batches(trainer: Any) -> int | None:
    """The training loader's length, or None when it has none."""
    try:
        return int(len(trainer.train_dataloader)) or None
    except TypeError:
        return None


def num_examples(trainer: Any) -> int | None:
    """The training set's size, or None when it has none."""
    try:
        return int(len(trainer.train_dataloader.dataset))
    except (TypeError, AttributeError):
        return None


def total_rounds(trainer: Any) -> int:
    """The run's length in training steps; ValueError for an open-ended run."""
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total) or total < 1:
        raise ValueError("CanaryAudit(repeats=...) needs a finite run: set max_steps or max_epochs")
    return int(total)
