"""``CanaryStrategy``: canary clients in a Flower strategy (Andrew et al., ICLR 2024, Alg. 2,
3). A thin adapter: :class:`~audit_callbacks.flower.backend.FlowerBackend` inserts the canary
clients, :class:`~audit_callbacks.auditing.CanaryAuditor` owns statistics, report and summary."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from audit_callbacks import names
from audit_callbacks.auditing import CanaryAuditConfig
from audit_callbacks.auditing.frontend import AuditFrontEnd
from audit_callbacks.auditing.sinks import WriterSink
from audit_callbacks.flower.backend import FlowerBackend
from audit_callbacks.flower.records import LOGGER, flower_versions, numeric_metrics
from audit_callbacks.validation import check_count, check_flag, check_optional_count, check_real

__all__ = ["CanaryStrategy"]


class CanaryStrategy(AuditFrontEnd, Strategy):
    """Wrap a FedAvg-style Flower strategy (or Flower's central-DP wrapper around it, which it
    must wrap from outside) to add canary clients and estimate epsilon as ``CanaryAudit`` does::

        dp = DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=f, ...), z, C, m)
        strategy = CanaryStrategy(dp, num_canaries=k, num_rounds=R)  # z and C read from dp

    Set the DP wrapper's ``num_sampled_clients`` to the cohort over real and canary nodes
    (see :class:`~audit_callbacks.flower.backend.FlowerBackend`: sampling, bad replies).

    Args:
        strategy: the wrapped strategy. The audit's arguments are :class:`~audit_callbacks.
            auditing.CanaryAuditConfig`'s (``delta`` default 1e-6, warned once: give the delta
            your accountant reports epsilon at), and:
        noise_multiplier, clip_norm: z >= 0 and C > 0 (default: the DP wrapper's).
        num_rounds: the end's estimate and summary follow this round (or call :meth:`finish`).
        every_n_rounds: estimate and log every n rounds (and at the end).
        log_dir: events and summary go to a fresh ``log_dir/version_N`` (None: neither).
        summary_filename, log_histograms: the summary JSON's name; the cosine histograms.
        node_timeout: seconds to wait for the real nodes before a round (then TimeoutError).
    Raises:
        ValueError: a bad argument (naming it: ``strategy`` not a Flower ``Strategy``
            instance, an unknown keyword), or no clip norm / noise multiplier found.
    """

    name = "CanaryStrategy"

    def __init__(self, strategy: Strategy, num_canaries: int | None = None,
                 num_unobserved: int | None = None, *, noise_multiplier: float | None = None,
                 clip_norm: float | None = None, num_rounds: int | None = None,
                 every_n_rounds: int = 1, log_dir: str | None = "runs/flower_canary_audit",
                 summary_filename: str = "audit_summary.json", log_histograms: bool = True,
                 node_timeout: float = 600.0, **config: Any) -> None:
        super().__init__()  # the front end's, then Flower's Strategy's
        if not isinstance(strategy, Strategy):
            raise ValueError(f"{self.name}: strategy must be a Flower Strategy instance (e.g. "
                             f"FedAvg(...)), got {strategy!r}")
        unknown = sorted(set(config) - set(CanaryAuditConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{self.name}: unknown argument {unknown[0]}")
        self.noise_multiplier, self.clip_norm = FlowerBackend.noise_and_clip(
            strategy, noise_multiplier, clip_norm)
        self.config = CanaryAuditConfig(num_canaries, num_unobserved, **{"delta": 1e-6, **config})
        self._delta_source = None if config.get("delta") is not None else "default"  # warned
        self.strategy = strategy
        self.num_rounds = check_optional_count(num_rounds, "num_rounds", minimum=1)
        self.every_n_rounds = check_count(every_n_rounds, "every_n_rounds", minimum=1)
        self.log_histograms = check_flag(log_histograms, "log_histograms")
        self.node_timeout = check_real(node_timeout, "node_timeout", low=0.0, low_inclusive=False)
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(f"{self.name}: log_dir must be a path or None, got {log_dir!r}")
        self.summary_filename = summary_filename  # ValueError naming it unless a path in the run folder
        self.sink = WriterSink(log_dir=None if log_dir is None else os.fspath(log_dir), versioned=True)
        self._offset, self._finished_at = 0, -1  # rounds of a restored state; the end's round

    def _emit(self, message: str) -> None:
        LOGGER.log(WARNING, message)

    def _info(self, message: str) -> None:
        LOGGER.log(INFO, message)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """At the first round, make the canaries; then sample real and canary nodes."""
        if self.auditor is None:
            self._open(FlowerBackend.connect(self.strategy, grid, arrays, self.noise_multiplier,
                                             self.clip_norm, self._warn, self.node_timeout))
            self.auditor.start(self.auditor.backend.layout.flatten(arrays))
            self.sink.layout(self.auditor.layout(), self.summary_filename)  # checks it is writable
        self._open(None)  # a state loaded since
        messages = self.auditor.backend.configure_train(server_round, arrays, config, grid)
        # once the cohorts' sizes are known; a restored run's rounds count too
        self._plan(None if self.num_rounds is None else self._offset + self.num_rounds)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Add the canaries' replies, aggregate through the wrapped strategy, fold the release."""
        if self.auditor is None:
            return self.strategy.aggregate_train(server_round, replies)
        arrays, metrics, released = self.auditor.backend.aggregate_train(server_round, replies)
        rounds = self.auditor.backend.rounds
        if released and rounds % self.every_n_rounds == 0:
            self.auditor.update(self.sink, step=rounds, histograms=self.log_histograms)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Pass through; after round ``num_rounds``, the final estimate and the summary."""
        if self.auditor is not None:
            self.auditor.backend.check_evaluated(arrays)
        if self.num_rounds is not None and server_round == self.num_rounds:
            self.finish()
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pass through; the numeric metrics also go to TensorBoard as ``val_clients/<key>``."""
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        if metrics is not None:
            self.sink.scalars(numeric_metrics(metrics, "val_clients/"), self._offset + server_round)
        return metrics

    def summary(self) -> None:
        """Log the canary settings, then the wrapped strategy's summary."""
        LOGGER.log(INFO, "\t├──> Canary audit: %s", {"z": self.noise_multiplier, "C": self.clip_norm,
                                                       **self.config.to_dict()})
        self.strategy.summary()

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Any:
        """Flower's ``Strategy.start`` with the final estimate after ``num_rounds``, and the
        ``evaluate_fn`` metrics also in TensorBoard as ``val/<key>`` (e.g. ``val/accuracy``).

        A second ``start`` of the same strategy continues its run as a resume does: its rounds
        count on from the rounds already audited (round ``r`` of this start is round
        ``rounds + r`` of the audit), the plan covers the total, and its TensorBoard events and
        summary go to a fresh ``log_dir/version_N`` (the earlier summary stays as written).

        Raises:
            ValueError: ``num_rounds`` is not an integer >= 1.
        """
        self.num_rounds = check_count(num_rounds, "num_rounds", minimum=1)
        if self.auditor is not None and self._state is None:  # a continued run
            self._offset = self.auditor.backend.offset = self.auditor.backend.rounds
            self._finished_at = -1
            self.sink = WriterSink(log_dir=self.sink.log_dir, versioned=True)
            self.sink.layout(self.auditor.layout(), self.summary_filename)

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if res is not None:
                self.sink.scalars(numeric_metrics(res, f"{names.FAMILY_VAL}/"), self._offset + server_round)
            return res

        result = super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                               evaluate_config, evaluate if evaluate_fn is not None else None)
        self.finish()
        return result

    def finish(self) -> str | None:
        """The final estimate, logged, and the summary written atomically to
        ``log_dir/summary_filename``; once per round reached. Returns its path."""
        if self.auditor is None or self._finished_at == self.auditor.backend.rounds:
            return self.summary_path
        self._finished_at = rounds = self.auditor.backend.rounds
        self.summary_path = self.auditor.finish(
            step=rounds, output=self.output.bind_directory(self.sink.run_dir, self.sink),
            histograms=self.log_histograms, extra={"versions": flower_versions()})
        self.sink.close()
        return self.summary_path

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a state, applied at the next round; a resumed run's rounds add to its rounds."""
        super().load_state_dict(state_dict)
        self._offset = int(state_dict["backend"]["rounds"]) if state_dict else self._offset
