"""The audit's bookkeeping for :class:`~audit_callbacks.flower.CanaryStrategy`: the canaries and
their statistics (a :class:`~audit_callbacks.backends.base.CanaryBackend`), the estimates (the
library's :func:`~audit_callbacks.estimators.canary_report.canary_report`), TensorBoard scalars
and histograms under :data:`~audit_callbacks.callbacks.canary_audit.TAGS`, and the summary.

The estimate, tag and summary glue mirrors ``CanaryAudit.compute``, ``CanaryAudit._log`` and
``CanaryAudit._summary`` (``audit_callbacks/callbacks/canary_audit.py``) without a Trainer;
``_field`` and ``_SOURCE`` are copied from that module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from audit_callbacks.backends.base import CanaryBackend, CanaryConfig
from audit_callbacks.callbacks.canary_audit import TAGS
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.estimators.canary_report import CanaryReport, canary_report

__all__ = ["FlowerBackend", "Reporter"]

_SOURCE = ("Andrew, Dehghani, Zhang, Hu, Dvijotham, Kairouz: One-shot Empirical Privacy "
           "Estimation for Federated Learning (ICLR 2024), Alg. 2 (final model) and Alg. 3 "
           "(all iterates)")
LOGGER = logging.getLogger("flwr")


class FlowerBackend(CanaryBackend):
    """Canary clients of a Flower strategy: the server creates their updates (virtual clients).

    Args:
        config: the audit's settings.
        warn: ``warn(key, message)``, once per key.
        dim: d, the model's floating parameters.
        population: N, the connected real nodes at the first round (caps the default k).
        noise_multiplier: z of the central Gaussian noise (0: none).

    Attributes:
        theta: the last released global model, flat ``[d]`` float32.
        rounds: rounds whose release the statistics have folded (or skipped as non-finite).
    """

    training = "DP-FedAvg (Flower)"
    sign = 1.0

    def __init__(
        self, config: CanaryConfig, warn: Callable[[str, str], None], dim: int,
        population: int, noise_multiplier: float,
    ) -> None:
        super().__init__(config, warn)
        self._make_stats(int(dim), int(population))
        self.noise_multiplier = float(noise_multiplier)
        self.theta: torch.Tensor | None = None
        self.rounds = 0
        self.inputs: dict[str, Any] = {}

    def flat_parameters(self) -> torch.Tensor:
        assert self.theta is not None
        return self.theta

    def progress(self) -> int:
        return self.rounds

    def analytic(self, delta: float) -> dict[str, float | None]:
        """The Gaussian mechanism composed over the most-sampled canary's rounds, if the
        adversary knows them: sqrt(r)/z-GDP (Dong, Roth, Su 2022); None without noise."""
        max_part = int(self.participations.max(initial=0))
        if self.noise_multiplier <= 0:
            return {"accountant": None}
        if max_part < 1:
            return {"accountant": 0.0}
        return {"accountant": gaussian_epsilon(self.noise_multiplier, delta, compositions=max_part)}

    def summary_inputs(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "noise_multiplier": self.noise_multiplier, **self.inputs}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["rounds"] = self.rounds
        state["theta"] = None if self.theta is None else self.theta.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = int(state["rounds"])
        theta = state.get("theta")
        if theta is not None and tuple(theta.shape) != (self.stats.dim,):
            raise ValueError(f"checkpointed theta has shape {tuple(theta.shape)}, expected "
                             f"({self.stats.dim},)")
        self.theta = None if theta is None else torch.as_tensor(theta, dtype=torch.float32).clone()


class Reporter:
    """Estimates from a :class:`FlowerBackend`, and their TensorBoard scalars and summary.

    Args:
        backend: the canaries and statistics.
        delta, alpha, seed: of the estimates (as ``CanaryAudit``).
        log_dir: TensorBoard event files go here (None: no TensorBoard).
        log_histograms: also write the cosine histograms.
    """

    def __init__(
        self, backend: FlowerBackend, *, delta: float, alpha: float, seed: int,
        log_dir: str | None, log_histograms: bool,
    ) -> None:
        self.backend = backend
        self.delta = float(delta)
        self.alpha = float(alpha)
        self.seed = int(seed)
        self.log_dir = log_dir
        self.log_histograms = log_histograms
        self._writer: Any = None
        self._last_logged = -1

    # ------------------------------------------------------------------ estimates
    def compute(self, *, bootstrap: int = 0) -> CanaryReport | None:
        """Every estimate from the canaries so far (``CanaryAudit.compute`` without a Trainer);
        None, with a logged reason, until 2 canaries took part or without a released model."""
        backend = self.backend
        if backend.theta is None:
            return None
        took = backend.participations > 0
        if int(took.sum()) < 2:
            backend.warn("few", "CanaryStrategy: fewer than 2 canaries have taken part; no "
                         "estimate yet")
            return None
        raw = {key: v.numpy() for key, v in backend.stats.compute(backend.theta).items()}
        hadamard = backend.stats.canaries.kind == "hadamard"
        stats = {
            "final_observed": raw["final_observed"][took],
            "final_unobserved": raw["final_unobserved"],
            "all_observed": raw["all_observed"][took] if raw["all_observed"].size
            else raw["all_observed"],
            "all_unobserved": raw["all_unobserved"],
        }
        result = canary_report(
            stats["final_observed"], self.delta, dim=backend.stats.dim,
            observed_all=stats["all_observed"] if stats["all_observed"].size else None,
            unobserved_all=stats["all_unobserved"] if stats["all_unobserved"].size >= 2 else None,
            unobserved_final=stats["final_unobserved"] if hadamard else None,
            alpha=self.alpha, bootstrap=bootstrap, seed=self.seed,
        )
        analytic = backend.analytic(self.delta)
        return CanaryReport(
            estimates=result["estimates"], skipped=result["skipped"],
            analytic_epsilon=analytic.pop("accountant"), analytic_epsilons=analytic,
            max_participations=int(backend.participations.max(initial=0)),
            num_canaries_participated=int(took.sum()), statistics=stats,
            progress=backend.progress(),
        )

    # ------------------------------------------------------------------ TensorBoard
    @property
    def writer(self) -> Any:
        """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir`` (made on first use)."""
        if self._writer is None and self.log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir)
            self._writer.add_custom_scalars({"privacy audit": {
                "epsilon (final model)": ["Multiline", ["audit/epsilon_final_model",
                                                        "audit/epsilon_lo_final_model",
                                                        "audit/epsilon_analytic"]],
                "epsilon (all iterates)": ["Multiline", ["audit/epsilon_all_iterates",
                                                         "audit/epsilon_lo_all_iterates",
                                                         "audit/epsilon_analytic"]],
                "accuracy": ["Multiline", [r"val.*acc.*"]],
            }})
        return self._writer

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        """Write the finite values at ``step`` (the round)."""
        writer = self.writer
        if writer is None:
            return
        for tag, value in values.items():
            if value is not None and np.isfinite(value):
                writer.add_scalar(tag, float(value), step)
        writer.flush()

    def log(self, report: CanaryReport | None) -> None:
        """The report's scalars (the tags of ``CanaryAudit``) and histograms at its round,
        once per round."""
        if report is None or report.progress == self._last_logged:
            return
        self._last_logged = report.progress
        self.scalars({tag: _field(report, key) for tag, key in TAGS.items()}, report.progress)
        if self.log_histograms and self.writer is not None:
            for name, values in report.statistics.items():
                vals = np.asarray(values, dtype=np.float64)
                vals = vals[np.isfinite(vals)]
                if vals.size:
                    self.writer.add_histogram(f"audit/cosine_{name}", vals, report.progress)
            self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------------ summary
    def summary(self, report: CanaryReport | None) -> dict[str, Any]:
        """The summary JSON's content (``CanaryAudit._summary``'s keys)."""
        backend = self.backend
        inputs = {
            "training": backend.training,
            "canaries": backend.stats.canaries.kind,
            "num_canaries": backend.num_canaries,
            "num_unobserved": backend.num_unobserved,
            "dim": backend.stats.dim,
            "delta": self.delta,
            "alpha": self.alpha,
            "seed": self.seed,
            "participations_histogram": np.bincount(backend.participations).tolist(),
            "rounds_skipped_non_finite": backend.stats.rounds_skipped,
            **backend.summary_inputs(),
        }
        summary: dict[str, Any] = {
            "callback": "CanaryStrategy",
            "source": _SOURCE,
            "threat_models": {
                "final_model": "the adversary sees only the final model; statistic "
                               "cos(c_j, theta_T - theta_0)",
                "all_iterates": "the adversary sees every round's model; statistic "
                                "max_t cos(c_j, model delta of round t)",
            },
            "inputs": inputs,
            "tags": TAGS,
        }
        if report is None:
            summary.update(estimates=None, skipped="fewer than 2 canaries took part, or no "
                           "round was released")
            return summary
        summary.update(
            estimates=report.estimates, skipped=report.skipped,
            analytic_epsilon=report.analytic_epsilon, analytic_epsilons=report.analytic_epsilons,
            max_participations=report.max_participations,
            num_canaries_participated=report.num_canaries_participated,
        )
        return summary


def _field(report: CanaryReport, key: str) -> float | None:
    """A report field (``analytic_epsilons.rdp``: an entry of a dict field) or an estimate
    (copied from ``audit_callbacks/callbacks/canary_audit.py``)."""
    head, _, tail = key.partition(".")
    if not hasattr(report, head):
        return report.value(key)
    value = getattr(report, head)
    value = value.get(tail) if tail else value
    return None if value is None else float(value)
