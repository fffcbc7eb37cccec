"""``CanaryAudit``: one-shot empirical epsilon for DP-FedAvg or Opacus DP-SGD, in the run itself.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
Alg. 2 (final model) and Alg. 3 (all iterates); the formulas are in ``docs/methods.md``. The
callback is glue: a backend (:mod:`audit_callbacks.backends`) inserts the canaries into the
training it finds and folds the model's deltas into the cosine statistics; the estimators turn
those into a :class:`~audit_callbacks.estimators.canary_report.CanaryReport`, and
:meth:`CanaryAudit._log` writes it at the current ``global_step``, under the tags of
:data:`TAGS`. The ``epsilon_lo_max`` bounds are maximised over thresholds on all canaries:
tighter, but NOT valid 95% bounds at small epsilon (they exceed it in 7-10% of runs at
epsilon 1); the ``epsilon_lo`` bounds choose the threshold on a held-out half and are valid.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from audit_callbacks.backends import CanaryBackend, CanaryConfig, FedAvgBackend, OpacusBackend
from audit_callbacks.callbacks import tensorboard as tb
from audit_callbacks.callbacks.summary import write_summary
from audit_callbacks.canaries import KINDS
from audit_callbacks.estimators.canary_report import CanaryReport, canary_report, cosine_null_pdf

__all__ = ["CanaryAudit", "TAGS"]

#: TensorBoard tag -> the report entry it shows (an estimate's name, or a report field).
TAGS: dict[str, str] = {
    "audit/epsilon_final_model": "final_model",
    "audit/epsilon_lo_final_model": "final_model_lower_bound_heldout",
    "audit/epsilon_lo_max_final_model": "final_model_lower_bound",
    "audit/epsilon_all_iterates": "all_iterates",
    "audit/epsilon_lo_all_iterates": "all_iterates_lower_bound_heldout",
    "audit/epsilon_lo_max_all_iterates": "all_iterates_lower_bound",
    "audit/epsilon_analytic": "analytic_epsilon",
    "audit/epsilon_analytic_rdp": "analytic_epsilons.rdp",
    "audit/epsilon_analytic_prv": "analytic_epsilons.prv",
    "audit/num_canaries": "num_canaries_participated",
}
_SOURCE = ("Andrew, Dehghani, Zhang, Hu, Dvijotham, Kairouz: One-shot Empirical Privacy "
           "Estimation for Federated Learning (ICLR 2024), Alg. 2 (final model) and Alg. 3 "
           "(all iterates)")


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
            training epoch's end without a validation loop), and always at fit end.
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
            DP-SGD, more Hadamard canaries than n.
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
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not callable(getattr(pl_module, "register_virtual_clients", None)):
            return  # Opacus: the DPOptimizer exists only after configure_optimizers (fit start)
        if self.backend is None or self.backend.stats.dim != pl_module.num_parameters:
            self.backend = FedAvgBackend(self.config, pl_module, trainer, self._warn_once)
        else:  # a second fit: the same canaries go on
            self.backend.register()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.backend is None or isinstance(self.backend, OpacusBackend):
            if self.config.repeats is not None:
                raise ValueError("CanaryAudit(repeats=...) is for DP-FedAvg; DP-SGD canaries are sampled")
            if self.backend is not None:
                self.backend.detach()
            self.backend = OpacusBackend(self.config, trainer, self._warn_once)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self.backend.load_state_dict(state)
        stats = self.backend.stats
        if stats.theta0 is None:
            stats.set_initial(self.backend.flat_parameters())
        analytic = ["audit/epsilon_analytic"]
        if isinstance(self.backend, OpacusBackend):
            analytic += ["audit/epsilon_analytic_rdp", "audit/epsilon_analytic_prv"]
        tb.add_custom_scalars_layout(trainer, {"privacy audit": {
            "epsilon (final model)": ["Multiline", ["audit/epsilon_final_model",
                                                    "audit/epsilon_lo_final_model", *analytic]],
            "epsilon (all iterates)": ["Multiline", ["audit/epsilon_all_iterates",
                                                     "audit/epsilon_lo_all_iterates", *analytic]],
            # custom-scalars tags are regular expressions: any val*acc* tag of the user's module
            "accuracy": ["Multiline", [r"val.*acc.*"]],
        }})
        if not trainer.loggers:
            self._warn_once("nologger", "CanaryAudit: no logger is attached, so estimates are not "
                            "logged; they are written to the summary JSON at fit end")

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
            self._log(trainer, self.compute(), figures=False)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.backend is None:
            return
        report = self.compute(bootstrap=self.bootstrap)
        self._log(trainer, report, figures=True)
        if trainer.is_global_zero:
            self.summary_path = write_summary(tb.log_dir(trainer), self.summary_filename,
                                              self._summary(report))

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

    def compute(self, *, bootstrap: int = 0) -> CanaryReport | None:
        """Every estimate from the canaries so far; None (with a warning) until 2 canaries took
        part, or when the model has NaN or inf parameters. Logs nothing."""
        backend = self.backend
        if backend is None:
            return None
        with torch.inference_mode(False), torch.no_grad():  # validation runs in inference mode
            theta = backend.flat_parameters()
            if not bool(torch.isfinite(theta).all()):
                self._warn_once("theta", "CanaryAudit: the model has NaN or inf parameters; no estimate")
                return None
            took = backend.participations > 0
            if int(took.sum()) < 2:
                self._warn_once("few", "CanaryAudit: fewer than 2 canaries have taken part; no estimate yet")
                return None
            raw = {key: v.numpy() for key, v in backend.stats.compute(theta).items()}
        hadamard = backend.stats.canaries.kind == "hadamard"
        stats = {
            "final_observed": raw["final_observed"][took],
            "final_unobserved": raw["final_unobserved"],
            "all_observed": raw["all_observed"][took] if raw["all_observed"].size else raw["all_observed"],
            "all_unobserved": raw["all_unobserved"],
        }
        delta = self._delta()
        result = canary_report(
            stats["final_observed"], delta, dim=backend.stats.dim,
            observed_all=stats["all_observed"] if stats["all_observed"].size else None,
            unobserved_all=stats["all_unobserved"] if stats["all_unobserved"].size >= 2 else None,
            unobserved_final=stats["final_unobserved"] if hadamard else None,
            alpha=self.alpha, bootstrap=bootstrap, seed=self.config.seed,
        )
        analytic = backend.analytic(delta)
        self.last_report = CanaryReport(
            estimates=result["estimates"], skipped=result["skipped"],
            analytic_epsilon=analytic.pop("accountant"), analytic_epsilons=analytic,
            max_participations=int(backend.participations.max(initial=0)),
            num_canaries_participated=int(took.sum()), statistics=stats,
            progress=backend.progress(),
        )
        return self.last_report

    # ------------------------------------------------------------------ output
    def _log(self, trainer: pl.Trainer, report: CanaryReport | None, *, figures: bool) -> None:
        """Scalars and histograms at the current global step (once per report); the density
        figures at fit end."""
        if report is None:
            return
        step = int(trainer.global_step)
        if report.progress != self._last_logged:
            self._last_logged = report.progress
            tb.log_scalars(trainer, {tag: _field(report, key) for tag, key in TAGS.items()}, step)
            bins = tb.histogram_bins(trainer) if self.log_histograms else None
            if bins is not None:
                s = report.statistics
                tb.add_summaries(trainer, tb.histogram_summaries({
                    "audit/cosine_final_observed": s["final_observed"],
                    "audit/cosine_final_unobserved": s["final_unobserved"],
                    "audit/cosine_all_observed": s["all_observed"],
                    "audit/cosine_all_unobserved": s["all_unobserved"],
                }, bins), step)
        if figures and self.log_figures and tb.tensorboard_writer(trainer) is not None:
            self._figures(trainer, report, step)

    def _figures(self, trainer: pl.Trainer, report: CanaryReport, step: int) -> None:
        """Densities of observed and unobserved cosines (as Andrew et al., Figure 1)."""
        assert self.backend is not None
        s, dim = report.statistics, self.backend.stats.dim
        null = None
        if self.backend.stats.canaries.kind == "gaussian":
            grid = np.linspace(-5, 5, 200) / math.sqrt(dim)
            null = (grid, cosine_null_pdf(grid, dim))
        tb.add_density_figure(
            trainer, "audit/cosine_density_final_model",
            {"observed canaries": s["final_observed"], "unobserved canaries": s["final_unobserved"]},
            step, title="final model: canary cosines", null_pdf=null,
        )
        if s["all_observed"].size:
            tb.add_density_figure(
                trainer, "audit/cosine_density_all_iterates",
                {"observed (max over rounds)": s["all_observed"],
                 "unobserved (max over rounds)": s["all_unobserved"]},
                step, title="all iterates: max cosine over rounds",
            )

    def _summary(self, report: CanaryReport | None) -> dict[str, Any]:
        backend = self.backend
        assert backend is not None and backend.stats is not None
        inputs = {
            "training": backend.training,
            "canaries": backend.stats.canaries.kind,
            "num_canaries": self.num_canaries,
            "num_unobserved": self.num_unobserved,
            "dim": backend.stats.dim,
            "delta": self._delta(),
            "alpha": self.alpha,
            "seed": self.config.seed,
            "participations_histogram": np.bincount(backend.participations).tolist(),
            "rounds_skipped_non_finite": backend.stats.rounds_skipped,
            **backend.summary_inputs(),
        }
        sign = "theta_T - theta_0" if backend.sign > 0 else "theta_0 - theta_T"
        summary: dict[str, Any] = {
            "callback": "CanaryAudit",
            "source": _SOURCE,
            "threat_models": {
                "final_model": f"the adversary sees only the final model; statistic cos(c_j, {sign})",
                "all_iterates": "the adversary sees every round's (step's) model; statistic "
                                "max_t cos(c_j, model delta of round t)",
            },
            "inputs": inputs,
            "tags": TAGS,
        }
        if report is None:
            summary.update(estimates=None, skipped="fewer than 2 canaries took part, or the model "
                           "has NaN or inf parameters")
            return summary
        summary.update(
            estimates=report.estimates, skipped=report.skipped,
            analytic_epsilon=report.analytic_epsilon, analytic_epsilons=report.analytic_epsilons,
            max_participations=report.max_participations,
            num_canaries_participated=report.num_canaries_participated,
        )
        return summary

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {} if self.backend is None or self.backend.stats is None else self.backend.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if isinstance(self.backend, FedAvgBackend):
            self.backend.load_state_dict(state_dict)
        else:  # DP-SGD: restored before configure_optimizers; applied at fit start
            self._pending_state = state_dict


def _field(report: CanaryReport, key: str) -> float | None:
    """A report field (``analytic_epsilons.rdp``: an entry of a dict field) or an estimate."""
    head, _, tail = key.partition(".")
    if not hasattr(report, head):
        return report.value(key)
    value = getattr(report, head)
    value = value.get(tail) if tail else value
    return None if value is None else float(value)
