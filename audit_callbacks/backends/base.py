"""What every canary backend shares: the audit's configuration, the canaries and their
statistics, the participation counts, and their state for resume."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from audit_callbacks.canaries import CanarySet
from audit_callbacks.canary_stats import CanaryStatistics
from audit_callbacks.estimators.canary_report import CanaryReport, canary_report

__all__ = ["CanaryBackend", "CanaryConfig", "check_config", "num_batches", "num_examples", "total_rounds"]

DEFAULT_CANARIES = 1000
DEFAULT_HADAMARD_UNOBSERVED = 100_000
_BUFFER_BYTES = 16 << 20  # Gaussian canaries: model deltas buffered between passes


@dataclass(frozen=True)
class CanaryConfig:
    """The audit's settings, as :class:`~audit_callbacks.callbacks.CanaryAudit` received them.

    ``num_canaries`` / ``num_unobserved`` None: the defaults (k = min(1000, population);
    k' = k for Gaussian canaries, min(n - k, 100,000) for Hadamard canaries, n the transform
    length).
    """

    num_canaries: int | None = None
    num_unobserved: int | None = None
    kind: str = "hadamard"
    seed: int = 0
    repeats: int | None = None
    sample_rate: float | None = None
    max_buffered_rounds: int | None = None


class CanaryBackend:
    """Base of the backends: owns the canaries (observed ``0..k-1``, unobserved ``k..k+k'-1``),
    their :class:`CanaryStatistics` and the participation counts ``[k]``.

    Subclasses set :attr:`training` and implement :meth:`flat_parameters`, :meth:`progress`,
    :meth:`analytic` and :meth:`summary_inputs`.
    """

    training = "abstract"
    sign = 1.0

    def __init__(self, config: CanaryConfig, warn: Callable[[str, str], None]) -> None:
        self.config = config
        self.warn = warn  # warn(key, message): once per key
        self.stats: CanaryStatistics | None = None
        self.participations = np.zeros(0, dtype=np.int64)

    def _make_stats(self, dim: int, population: int | None) -> None:
        """Create the canaries and their statistics for a model of ``dim`` parameters."""
        if dim < 2:
            raise ValueError(f"the model has {dim} trainable parameter(s); canaries need d >= 2")
        cfg = self.config
        if cfg.num_canaries is not None:
            k = int(cfg.num_canaries)
        else:
            k = min(DEFAULT_CANARIES, population) if population else DEFAULT_CANARIES
        if cfg.num_unobserved is not None:
            k_un = int(cfg.num_unobserved)
        elif cfg.kind == "hadamard":
            n = 1 << max(1, (dim - 1).bit_length())
            k_un = max(0, min(n - k, DEFAULT_HADAMARD_UNOBSERVED))
        else:
            k_un = k
        canaries = CanarySet(cfg.seed, dim, k + k_un, kind=cfg.kind)
        buffered = cfg.max_buffered_rounds or max(1, _BUFFER_BYTES // (4 * dim))
        self.stats = CanaryStatistics(canaries, k, k_un, sign=self.sign, max_buffered=buffered)
        self.participations = np.zeros(k, dtype=np.int64)

    @property
    def num_canaries(self) -> int:
        return 0 if self.stats is None else self.stats.num_observed

    @property
    def num_unobserved(self) -> int:
        return 0 if self.stats is None else self.stats.num_unobserved

    def fold(self, delta: torch.Tensor, what: str) -> None:
        """Fold one round's (step's) model delta; a non-finite one is skipped with a warning."""
        assert self.stats is not None
        if not self.stats.add_delta(delta):
            self.warn("nan", f"CanaryAudit: {what} produced a model delta with NaN or inf; it is "
                      "skipped by the all-iterates statistic")

    def report(
        self, delta: float, *, alpha: float, bootstrap: int, step: int = 0,
    ) -> CanaryReport | str:
        """Every estimate from the canaries so far, as a :class:`CanaryReport`, or the reason
        there is none (fewer than 2 canaries took part, a model with NaN or inf parameters).
        The bootstrap is seeded from the canaries' seed."""
        assert self.stats is not None
        with torch.inference_mode(False), torch.no_grad():  # validation runs in inference mode
            theta = self.flat_parameters()
            if not bool(torch.isfinite(theta).all()):
                return "the model has NaN or inf parameters"
            took = self.participations > 0
            if int(took.sum()) < 2:
                return "fewer than 2 canaries have taken part"
            raw = {key: v.numpy() for key, v in self.stats.compute(theta).items()}
        stats = {
            "final_observed": raw["final_observed"][took],
            "final_unobserved": raw["final_unobserved"],
            "all_observed": raw["all_observed"][took] if raw["all_observed"].size else raw["all_observed"],
            "all_unobserved": raw["all_unobserved"],
        }
        exact_null = self.stats.canaries.kind == "gaussian"
        estimates, skipped = canary_report(
            {"final_model": stats["final_observed"], "all_iterates": stats["all_observed"]},
            {"final_model": stats["final_unobserved"], "all_iterates": stats["all_unobserved"]},
            delta, dim=self.stats.dim if exact_null else None,
            alpha=alpha, bootstrap=bootstrap, seed=self.config.seed,
        )
        return CanaryReport(
            estimates=estimates, skipped=skipped, **self.analytic(delta),
            max_participations=int(self.participations.max(initial=0)),
            num_canaries_participated=int(took.sum()), statistics=stats,
            progress=self.progress(), step=step,
        )

    def identity(self) -> dict[str, Any]:
        """What identifies the audit: its settings and the canaries they resolved to (checked
        against a checkpoint's on resume, and the start of the summary's ``inputs``)."""
        return {
            "canaries": self.config.kind, "seed": self.config.seed,
            "requested_num_canaries": self.config.num_canaries,
            "num_canaries": self.num_canaries, "num_unobserved": self.num_unobserved,
            "training": self.training,
        }

    def audit_inputs(self, delta: float, alpha: float) -> dict[str, Any]:
        """The summary JSON's ``inputs``: the audit's settings and the training's."""
        assert self.stats is not None
        return {
            **self.identity(), "dim": self.stats.dim, "delta": delta, "alpha": alpha,
            "participations_histogram": np.bincount(self.participations).tolist(),
            "rounds_skipped_non_finite": self.stats.rounds_skipped,
            **self.summary_inputs(),
        }

    # subclasses ---------------------------------------------------------------------------
    def flat_parameters(self) -> torch.Tensor:
        """The flat model ``[d]`` whose deltas are audited."""
        raise NotImplementedError

    def progress(self) -> int:
        """Rounds (DP-FedAvg) or logical steps (DP-SGD) taken so far."""
        raise NotImplementedError

    def analytic(self, delta: float) -> dict[str, float | None]:
        """``{"epsilon_analytic": epsilon, ...}``: the analytic epsilon of a canary at
        ``delta`` (``inf`` without DP noise, None when unknown)."""
        raise NotImplementedError

    def summary_inputs(self) -> dict[str, Any]:
        """The training's settings for the summary JSON."""
        raise NotImplementedError

    def detach(self) -> None:
        """Undo what was installed into the training (nothing by default)."""

    # state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        assert self.stats is not None
        return {"stats": self.stats.state_dict(), "participations": self.participations.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; raises ``ValueError`` naming what does not match."""
        assert self.stats is not None
        self.stats.load_state_dict(state["stats"])
        saved = np.asarray(state["participations"], dtype=np.int64)
        if saved.shape != self.participations.shape:
            raise ValueError(f"checkpointed participations cover {saved.size} canaries, this run "
                             f"has {self.participations.size}")
        self.participations[:] = saved


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


def check_config(theirs: dict[str, Any], mine: dict[str, Any], *, strict_resolved: bool) -> None:
    """Raise ``ValueError`` naming the first audit setting in which a checkpoint differs."""
    fields = ["canaries", "seed", "requested_num_canaries", "delta", "training"]
    if strict_resolved:
        fields += ["num_canaries", "num_unobserved"]
    for name in fields:
        if name in theirs and mine.get(name) is not None and theirs[name] != mine[name]:
            raise ValueError(
                f"CanaryAudit: the checkpoint's audit has {name}={theirs[name]!r}, this callback "
                f"{mine[name]!r}; resuming would mix two audits. Resume with the same settings, "
                "or start a new run"
            )
