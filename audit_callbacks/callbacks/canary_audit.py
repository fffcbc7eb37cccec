"""``CanaryAudit``: one-shot empirical epsilon for DP-FedAvg or Opacus DP-SGD, in the run itself.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
Alg. 2 (final model) and Alg. 3 (all iterates); the formulas are in ``docs/methods.md``. The
callback is glue: a backend (:mod:`audit_callbacks.backends`) inserts the canaries into the
training it finds and folds the model's deltas into the cosine statistics; the estimators turn
those into a :class:`~audit_callbacks.estimators.canary_report.CanaryReport`, and
:meth:`CanaryAudit._log` writes it at the current ``global_step``, under the tags of
:data:`TAGS` (the names are explained in :mod:`audit_callbacks.estimators.canary_report`).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from audit_callbacks._lightning import overrides
from audit_callbacks.backends import CanaryBackend, CanaryConfig, FedAvgBackend, OpacusBackend
from audit_callbacks.backends.base import check_config
from audit_callbacks.callbacks import tensorboard as tb
from audit_callbacks.callbacks.summary import summary_dir, write_summary
from audit_callbacks.canaries import KINDS
from audit_callbacks.estimators.canary_report import TAGS, CanaryReport, chart_layout, summary_json

__all__ = ["CanaryAudit", "TAGS"]


class CanaryAudit(Callback):
    """Insert canaries into DP-FedAvg or Opacus DP-SGD and estimate epsilon from their cosines.

    Attach it to a ``Trainer`` that fits a :class:`~audit_callbacks.federated.DPFedAvg`, or a
    LightningModule whose ``configure_optimizers`` returns an Opacus ``DPOptimizer``.

    Args:
        num_canaries: k observed canaries (clients, or gradient canaries in DP-SGD). Default:
            1000, capped at the number of real clients (DP-FedAvg) or training examples (DP-SGD).
            DP-FedAvg: sampled canaries take about k / (N + k) of every cohort's places from the
            N real clients; a warning says so when that share is 10% or more.
        num_unobserved: k' canaries never inserted, the null of the all-iterates estimate (and
            of the final-model estimate with Hadamard canaries). Default: k for Gaussian
            canaries; min(n - k, 100,000) for Hadamard canaries (n = 2^ceil(log2 d)), which
            cost nothing more to score. 0 disables the all-iterates estimate.
        canaries: ``"hadamard"`` (default): rows of a randomly signed Walsh-Hadamard matrix,
            every canary scored by one fast transform a round; or ``"gaussian"``: uniform on the
            sphere, regenerated for every pass (O(k d) a pass), whose final-model cosines follow
            an exact known law (see :mod:`audit_callbacks.canaries`).
        repeats: DP-FedAvg only: canaries are not sampled, each is presented ``repeats`` times,
            once in a uniformly chosen round of each of ``repeats`` equal periods of training
            (Andrew et al. §5.2). Needs ``max_steps`` or a finite epoch count.
        delta: the delta of every epsilon (default: the module's ``delta``, else 1e-6 for
            DP-FedAvg and 1e-5 for DP-SGD).
        alpha: 1 - confidence of the lower bounds.
        bootstrap: bootstrap resamples for the estimates' percentile intervals, computed at fit
            end for the summary JSON (0: none).
        seed: the canaries' seed: canary j is a function of (seed, j). Canaries are public by
            design; the seed may be logged.
        every_n_epochs: estimate and log every n epochs (at the validation's end, or at the
            training epoch's end without a validation loop), and always at fit end. A repeated
            ``fit`` continues the same audit (canaries, participations, steps; for Opacus the
            accountant's history is carried into a new ``PrivacyEngine``), and a resumed run
            restores it from the checkpoint, the accountant's history included.
        max_buffered_rounds: Gaussian canaries: model deltas kept between passes over the
            canaries (default: as many as fit in 16 MiB). The estimates do not depend on it.
        log_histograms, log_figures: TensorBoard extras (need a ``TensorBoardLogger``).
        summary_filename: the JSON written at fit end in the logger's directory.
        sample_rate: DP-SGD only: the Poisson rate at which a canary joins a step. Default: the
            rate the Opacus accountant is charged (read from its step hook), else
            ``1 / len(train_dataloader)``.

    Raises:
        TypeError: neither a DP-FedAvg module nor an Opacus ``DPOptimizer`` (at fit start).
        ValueError: bad arguments, a model with fewer than 2 parameters, ``repeats`` with
            DP-SGD, more Hadamard canaries than n, a checkpoint of another audit (naming the
            setting that differs).
        RuntimeError: at fit start, under DDP: ``DPFedAvg`` (train it with ``devices=1``), or a
            non-distributed Opacus optimizer on each rank (wrap the model in ``DPDDP``).
    """

    def __init__(
        self,
        num_canaries: int | None = None,
        num_unobserved: int | None = None,
        *,
        canaries: str = "hadamard",
        repeats: int | None = None,
        delta: float | None = None,
        alpha: float = 0.05,
        bootstrap: int = 200,
        seed: int = 0,
        every_n_epochs: int = 1,
        max_buffered_rounds: int | None = None,
        log_histograms: bool = True,
        log_figures: bool = True,
        summary_filename: str = "audit_summary.json",
        sample_rate: float | None = None,
    ) -> None:
        checks = {
            "num_canaries": num_canaries is None or num_canaries >= 1,
            "num_unobserved": num_unobserved is None or num_unobserved >= 0,
            "canaries": canaries in KINDS,
            "repeats": repeats is None or repeats >= 1,
            "delta": delta is None or 0 < delta < 1,
            "alpha": 0 < alpha < 1,
            "bootstrap": bootstrap >= 0,
            "every_n_epochs": every_n_epochs >= 1,
            "sample_rate": sample_rate is None or 0 < sample_rate <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"CanaryAudit: invalid {name}={locals()[name]!r}")
        self.config = CanaryConfig(num_canaries, num_unobserved, canaries, int(seed), repeats,
                                   sample_rate, max_buffered_rounds)
        self.delta = delta
        self.alpha = float(alpha)
        self.bootstrap = int(bootstrap)
        self.every_n_epochs = int(every_n_epochs)
        self.log_histograms = log_histograms
        self.log_figures = log_figures
        self.summary_filename = summary_filename
        self.backend: CanaryBackend | None = None
        self.last_report: CanaryReport | None = None
        self.summary_path: str | None = None
        self._pending_state: dict[str, Any] | None = None
        self._last_logged = -1  # progress of the last logged report
        self._skip_reason: str | None = None
        self._summary_dir: str | None = None
        self._warned: set[str] = set()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.config.seed, num_canaries=self.config.num_canaries)

    @property
    def num_canaries(self) -> int:
        return 0 if self.backend is None else self.backend.num_canaries

    @property
    def num_unobserved(self) -> int:
        return 0 if self.backend is None else self.backend.num_unobserved

    @property
    def participations(self) -> np.ndarray:
        return np.zeros(0, np.int64) if self.backend is None else self.backend.participations

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    # ------------------------------------------------------------------ set-up
    @property
    def block_name(self) -> str:
        """The name of this audit's canary clients in DP-FedAvg (one per audit of a run)."""
        return f"canary(seed={self.config.seed}, k={self.config.num_canaries})"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not callable(getattr(pl_module, "register_virtual_clients", None)):
            return  # Opacus: the DPOptimizer exists only after configure_optimizers (fit start)
        if self.backend is None or self.backend.stats.dim != pl_module.num_parameters:
            self.backend = FedAvgBackend(self.config, pl_module, trainer, self._warn_once,
                                         name=self.block_name)
        else:  # a second fit: the same canaries go on
            self.backend.register()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:  # only rank 0 writes; a bad path fails here, not at the end
            self._summary_dir = summary_dir(trainer, self.summary_filename)
        if isinstance(self.backend, OpacusBackend):
            self.backend.bind(trainer)  # a repeated fit: the audit goes on
        elif self.backend is None:
            if self.config.repeats is not None:
                raise ValueError("CanaryAudit(repeats=...) is for DP-FedAvg; DP-SGD canaries are sampled")
            self.backend = OpacusBackend(self.config, trainer, self._warn_once)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._load(state)
        stats = self.backend.stats
        if stats.theta0 is None:
            stats.set_initial(self.backend.flat_parameters())
        analytic = ["audit/epsilon_analytic"]
        if isinstance(self.backend, OpacusBackend):
            analytic += ["audit/epsilon_analytic_rdp", "audit/epsilon_analytic_prv"]
        tb.add_custom_scalars_layout(trainer, chart_layout(analytic))
        if not trainer.loggers:
            self._warn_once("nologger", "CanaryAudit: no logger is attached, so estimates are not "
                            f"logged; they are written to {self._summary_dir} at fit end")
        if not overrides(pl_module, "validation_step") or not trainer.limit_val_batches:
            self._warn_once("noval", "CanaryAudit: no validation loop: estimates are computed at "
                            f"the end of every {self.every_n_epochs} training epoch(s) and at fit end")

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint whose audit differs from this one (it would restart silently)."""
        states = checkpoint.get("callbacks") or {}
        if self.state_key in states:
            return
        for key, state in states.items():
            if str(key).startswith(type(self).__name__) and isinstance(state, dict) and state.get("config"):
                check_config(state["config"], self._config_dict(), strict_resolved=False)

    # ------------------------------------------------------------------ training
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if isinstance(self.backend, OpacusBackend):
            self.backend.after_batch()

    def on_federated_round_start(self, trainer: pl.Trainer, pl_module: Any, round_idx: int, cohort: Any) -> None:
        if isinstance(self.backend, FedAvgBackend):
            self.backend.on_round_start(cohort)

    def on_federated_round_end(
        self, trainer: pl.Trainer, pl_module: Any, round_idx: int, model_delta: torch.Tensor,
    ) -> None:
        if isinstance(self.backend, FedAvgBackend):
            self.backend.on_round_end(round_idx, model_delta)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._epoch_end(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end(trainer)  # without a validation loop (or after one: logged once)

    def _epoch_end(self, trainer: pl.Trainer) -> None:
        if self.backend is None or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        if self.backend.progress() != self._last_logged:
            self._log(trainer, self.compute(step=int(trainer.global_step)), figures=False)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.backend is None:
            return
        previous = self.last_report
        report = self.compute(bootstrap=self.bootstrap, step=int(trainer.global_step))
        self._log(trainer, report, figures=True)
        if trainer.is_global_zero:
            stale = report is None and previous is not None
            self.summary_path = write_summary(self._summary_dir or summary_dir(trainer, self.summary_filename),
                                              self.summary_filename, self._summary(report or previous, stale))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.backend is not None:
            self.backend.detach()

    # ------------------------------------------------------------------ estimates
    def _delta(self) -> float:
        if self.delta is not None:
            return self.delta
        module = getattr(self.backend, "module", None)
        if getattr(module, "delta", None) is not None:
            return float(module.delta)
        return 1e-5 if isinstance(self.backend, OpacusBackend) else 1e-6

    def compute(self, *, bootstrap: int = 0, step: int = 0) -> CanaryReport | None:
        """Every estimate from the canaries so far, as a :class:`CanaryReport`; None (with a
        one-time warning, the reason kept for the summary) until 2 canaries took part, or when
        the model has NaN or inf parameters. Logs nothing."""
        if self.backend is None:
            return None
        report = self.backend.report(self._delta(), alpha=self.alpha, bootstrap=bootstrap, step=step)
        if isinstance(report, str):
            self._skip_reason = report
            self._warn_once(report, f"CanaryAudit: {report}; no estimate")
            return None
        if report.epsilon_analytic == math.inf:
            self._warn_once("nonoise", "CanaryAudit: no DP noise (noise_multiplier = 0): the "
                            "analytic epsilon is infinite")
        self.last_report = report
        return report

    # ------------------------------------------------------------------ output
    def _log(self, trainer: pl.Trainer, report: CanaryReport | None, *, figures: bool) -> None:
        """Scalars and histograms at the current global step (once per report); the density
        figures at fit end."""
        if report is None:
            return
        step = int(trainer.global_step)
        if report.progress != self._last_logged:
            self._last_logged = report.progress
            tb.log_scalars(trainer, report.scalars(), step)
            bins = tb.histogram_bins(trainer) if self.log_histograms else None
            if bins is not None:
                tb.add_summaries(trainer, tb.histogram_summaries(
                    {f"audit/cosine_{key}": value for key, value in report.statistics.items()}, bins), step)
        if figures and self.log_figures and self.backend is not None:
            stats = self.backend.stats
            tb.add_canary_figures(trainer, report.statistics, stats.dim,
                                  exact_null=stats.canaries.kind == "gaussian", step=step)

    def _config_dict(self) -> dict[str, Any]:
        """What the numbers depend on, checked against a checkpoint's on resume (before the
        backend exists, only the requested settings)."""
        if self.backend is not None:
            return {**self.backend.identity(), "delta": self.delta}
        return {"canaries": self.config.kind, "seed": self.config.seed,
                "requested_num_canaries": self.config.num_canaries, "delta": self.delta}

    def _summary(self, report: CanaryReport | None, stale: bool) -> dict[str, Any]:
        assert self.backend is not None
        return summary_json(report, stale=stale, skip_reason=self._skip_reason,
                            inputs=self.backend.audit_inputs(self._delta(), self.alpha),
                            gradients=self.backend.sign < 0)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        if self.backend is None or self.backend.stats is None:
            return {}
        return {**self.backend.state_dict(), "config": self._config_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if isinstance(self.backend, FedAvgBackend):
            self._load(state_dict)
        else:  # DP-SGD: restored before configure_optimizers; applied at fit start
            self._pending_state = state_dict

    def _load(self, state: dict[str, Any]) -> None:
        assert self.backend is not None
        check_config(state.get("config") or {}, self._config_dict(), strict_resolved=True)
        self.backend.load_state_dict(state)

