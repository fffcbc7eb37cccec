"""The audit's bookkeeping for :class:`~audit_callbacks.flower.CanaryStrategy`: the canaries and
their statistics (a :class:`~audit_callbacks.backends.base.CanaryBackend`, whose ``report`` gives
the estimates, as for ``CanaryAudit``), TensorBoard scalars and histograms under the same tags
(:data:`~audit_callbacks.estimators.canary_report.TAGS`) through a ``SummaryWriter`` (no
Lightning Trainer here), and the same summary (:func:`~audit_callbacks.estimators.
canary_report.summary_json`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from audit_callbacks.backends.base import CanaryBackend, CanaryConfig
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.estimators.canary_report import CanaryReport, chart_layout, summary_json

__all__ = ["FlowerBackend", "Reporter"]

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

    def progress(self) -> int:
        return self.rounds

    def analytic(self, delta: float) -> dict[str, float | None]:
        """The Gaussian mechanism composed over the most-sampled canary's rounds, if the
        adversary knows them: sqrt(r)/z-GDP (Dong, Roth, Su 2022); ``inf`` without noise."""
        max_part = int(self.participations.max(initial=0))
        if self.noise_multiplier <= 0:
            return {"epsilon_analytic": math.inf}
        if max_part < 1:
            return {"epsilon_analytic": 0.0}
        return {"epsilon_analytic": gaussian_epsilon(self.noise_multiplier, delta, compositions=max_part)}

    def flat_parameters(self) -> torch.Tensor:
        assert self.theta is not None
        return self.theta

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
        self.skip_reason: str | None = None

    # ------------------------------------------------------------------ estimates
    def compute(self, *, bootstrap: int = 0) -> CanaryReport | None:
        """Every estimate from the canaries so far (the backend's ``report``, as
        ``CanaryAudit.compute``); None, with the reason logged once and kept for the summary,
        until 2 canaries took part or without a released model."""
        backend = self.backend
        if backend.theta is None:
            self.skip_reason = "no round was released yet"
            return None
        report = backend.report(self.delta, alpha=self.alpha, bootstrap=bootstrap,
                                step=backend.progress())
        if isinstance(report, str):
            self.skip_reason = report
            backend.warn(report, f"CanaryStrategy: {report}; no estimate")
            return None
        return report

    # ------------------------------------------------------------------ TensorBoard
    @property
    def writer(self) -> Any:
        """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir`` (made on first use)."""
        if self._writer is None and self.log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir)
            self._writer.add_custom_scalars(chart_layout(["audit/epsilon_analytic"]))
        return self._writer

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        """Write the values at ``step`` (the round); None and NaN are dropped, ``+inf`` (an
        infinite analytic epsilon) is kept."""
        writer = self.writer
        if writer is None:
            return
        for tag, value in values.items():
            if value is not None and not np.isnan(value):
                writer.add_scalar(tag, float(value), step)
        writer.flush()

    def log(self, report: CanaryReport | None) -> None:
        """The report's scalars (the tags of ``CanaryAudit``) and histograms at its round,
        once per round."""
        if report is None or report.progress == self._last_logged:
            return
        self._last_logged = report.progress
        self.scalars(report.scalars(), report.progress)
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
    def summary(self, report: CanaryReport | None, stale: bool = False) -> dict[str, Any]:
        """The summary JSON's content (the same keys as ``CanaryAudit``'s)."""
        return summary_json(report, stale=stale, skip_reason=self.skip_reason,
                            inputs=self.backend.audit_inputs(self.delta, self.alpha), gradients=False,
                            callback="CanaryStrategy")
