"""``CanaryAudit``: one-shot empirical epsilon of DP-FedAvg or Opacus DP-SGD, in the run itself.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
Alg. 2 and 3 (``docs/methods/canaries.md``). A thin adapter: hooks forward to the backend
(:mod:`audit_callbacks.backends`), the :class:`~audit_callbacks.auditing.CanaryAuditor` owns
statistics, report and summary, and its :class:`~audit_callbacks.auditing.output.AuditOutput`
(shared with the run's other audits) writes them at the current ``global_step``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from audit_callbacks import names
from audit_callbacks.auditing import CanaryAuditConfig
from audit_callbacks.auditing.auditor import audit_settings, check_identity, check_settings
from audit_callbacks.auditing.frontend import AuditFrontEnd
from audit_callbacks.backends.base import NotAuditable
from audit_callbacks.backends.lightning import lightning_backend
from audit_callbacks.callbacks.summary import LightningOutput, LightningRun
from audit_callbacks.callbacks.summary import summary_dir as check_summary_dir
from audit_callbacks.compat.namespaces import overrides
from audit_callbacks.federated.protocol import FederatedAuditHooks, FederatedRound
from audit_callbacks.validation import check_count, check_flag

__all__ = ["CanaryAudit"]

#: TensorBoard text: why the audit stepped aside (a text tag, as the fit-end table's, not a
#: quantity of the report)
WARNINGS_TAG = f"{names.FAMILY_AUDIT}/{names.WARNINGS}"


class CanaryAudit(AuditFrontEnd, FederatedAuditHooks, Callback):
    """Insert canaries into DP-FedAvg or Opacus DP-SGD and estimate epsilon from their cosines.

    Attach it to a ``Trainer`` that fits a :class:`~audit_callbacks.federated.DPFedAvg`, or a
    LightningModule whose ``configure_optimizers`` returns an Opacus ``DPOptimizer``.

    Args:
        num_canaries, num_unobserved: k observed canaries and k' never inserted. These and the
            keyword arguments (``canaries``, ``seed``, ``delta``, ``alpha``, ``bootstrap``...)
            are :class:`~audit_callbacks.auditing.CanaryAuditConfig`'s. ``delta``: the delta of
            every epsilon (None: the LightningModule's ``delta`` attribute, else the default,
            1e-5 for Opacus DP-SGD, warned once at fit start; Opacus keeps no delta of its own,
            so give the one your module passes ``privacy_engine.get_epsilon``).
        every_n_epochs: estimate and log every n epochs (at the validation's end, or the
            training epoch's end without one), and always at fit end. A repeated ``fit`` and a
            resumed run continue the same audit (Opacus' accountant history included).
        log_histograms, log_figures: TensorBoard extras (need a ``TensorBoardLogger``).
        summary_filename: the JSON written at the training's end (``on_train_end``, before
            Lightning's teardown; refreshed at fit end) in the run's own folder (checked
            writable at fit start), with the verdicts; on SIGTERM / SIGINT: ``interrupted at
            step N``.

    :meth:`report` (every estimate so far) raises
    :class:`~audit_callbacks.auditing.NoEstimateYet` until there is one, as on every front end;
    ``last_report`` is the last one logged.

    Never stops a training it cannot audit: neither a DP-FedAvg module nor an Opacus
    ``DPOptimizer`` (a plain LightningModule) is warned about once (saying what it needs, also
    as TensorBoard text ``audit/warnings``), ``disabled_reason`` says why, and the fit goes on
    with nothing logged and no summary written.

    Raises:
        ValueError: a bad argument (naming it), ``repeats`` with DP-SGD, a checkpoint of
            another audit or a damaged one (naming the setting or field that differs); at
            setup, a second ``CanaryAudit`` in one Trainer, or a ``summary_filename`` another
            audit of the Trainer writes (naming it).
        RuntimeError: at fit start, under DDP: ``DPFedAvg`` (train it with ``devices=1``), or a
            non-distributed Opacus optimizer on each rank (wrap the model in ``DPDDP``).
    """

    output_type = LightningOutput

    def __init__(self, num_canaries: int | None = None, num_unobserved: int | None = None, *,
                 every_n_epochs: int = 1, log_histograms: bool = True, log_figures: bool = True,
                 summary_filename: str = "audit_summary.json", **config: Any) -> None:
        super().__init__()
        self.config = CanaryAuditConfig(num_canaries, num_unobserved, **config)
        self.every_n_epochs = check_count(every_n_epochs, "every_n_epochs", minimum=1)
        self.log_histograms = check_flag(log_histograms, "log_histograms")
        self.log_figures = check_flag(log_figures, "log_figures")
        self.summary_filename = summary_filename
        #: why the audit stepped aside in the last fit (``"no_dp_optimizer"``), else None
        self.disabled_reason: str | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.config.seed, num_canaries=self.config.num_canaries)

    def _emit(self, message: str) -> None:
        rank_zero_warn(message, category=UserWarning)

    def _info(self, message: str) -> None:
        rank_zero_info(message)

    def _bind(self, trainer: pl.Trainer, pl_module: Any) -> None:
        name = f"canary(seed={self.config.seed}, k={self.config.num_canaries})"
        if self.auditor is None:
            self._open(lightning_backend(self.config, trainer, pl_module, self._warn, name))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a second canary audit, or a summary file another audit writes: refused now
            LightningRun.of(trainer).register(self.output)
        if stage == "fit" and self.auditor is not None:
            self.auditor.backend.on_setup(trainer, pl_module)  # a repeated fit goes on
        elif stage == "fit":
            self._bind(trainer, pl_module)  # DP-FedAvg: the canary clients join before sampling

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.output.bind(trainer)  # only rank 0 writes; a bad path fails here, not at the end
        summary_dir = check_summary_dir(trainer, self.summary_filename) if trainer.is_global_zero else None
        self.disabled_reason = None
        if self.auditor is not None:
            self.auditor.backend.on_fit_start(trainer, pl_module)  # a repeated fit goes on
        resumed = self._state is not None  # before _bind: opening the audit applies the checkpoint
        try:
            self._bind(trainer, pl_module)  # Opacus: the DPOptimizer exists now
        except NotAuditable as err:  # neither DP-FedAvg nor DP-SGD: nothing to audit, training goes on
            self._step_aside(trainer, "no_dp_optimizer", str(err))
            return
        self._open(None)  # a checkpoint's state
        assert self.auditor is not None
        self.auditor.start()
        # a repeated fit (a new trainer, no checkpoint) goes on from the steps taken before it
        self._plan(_planned_steps(trainer, 0 if resumed else self.auditor.backend.progress()))
        self.output.layout(self.auditor.layout())
        if not trainer.loggers:
            self._warn("nologger", "CanaryAudit: no logger is attached, so estimates are not logged; "
                       f"they are written to {summary_dir} at fit end")
        if not overrides(pl_module, "validation_step") or not trainer.limit_val_batches:
            self._info(f"CanaryAudit: no validation loop, so estimates are computed at the end of "
                       f"every {self.every_n_epochs} training epoch(s) and at fit end")

    def _step_aside(self, trainer: pl.Trainer, reason: str, message: str) -> None:
        """Warn once (also as TensorBoard text under ``audit/warnings``) and do nothing more in
        this fit: no estimate is logged and no summary written (none would hold a number)."""
        self.disabled_reason = reason
        text = f"CanaryAudit disabled ({reason}): {message}; training continues without this audit"
        self._warn(reason, text)
        if self.output.run is not None and trainer.is_global_zero:
            self.output.text({WARNINGS_TAG: text}, int(trainer.global_step))

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint whose audit differs from this one, naming the setting: Lightning
        only gives a callback the state saved under its own ``state_key`` (made of ``seed`` and
        ``num_canaries``), so a changed one would otherwise start a fresh audit silently. The
        other settings are checked when the state is applied (``CanaryAuditor.load_state_dict``)."""
        states = checkpoint.get("callbacks") or {}
        if self.state_key in states:
            return  # our own state is there: other CanaryAudit entries are other callbacks'
        mine = {"canaries": self.config.canaries, "seed": self.config.seed, "delta": self.config.delta,
                "requested_num_canaries": self.config.num_canaries}
        for key, state in states.items():
            if str(key).startswith(type(self).__name__) and isinstance(state, dict) and state.get("config"):
                check_settings(state.get("settings") or {}, audit_settings(self.config), name="CanaryAudit")
                check_identity(state["config"], mine, name="CanaryAudit", strict=False)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.auditor is not None:
            self.auditor.backend.on_train_batch_end()

    def on_federated_round_end(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        if self.auditor is not None:
            self.auditor.backend.on_federated_round_end(fl_round)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.on_train_epoch_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Also without a validation loop (after one, the same estimate is logged once)."""
        if self.auditor is not None and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.auditor.update(self.output.bind(trainer).sink, step=int(trainer.global_step),
                                histograms=self.log_histograms)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final estimate, summary and report now, before Lightning's teardown can lose
        them (a SIGTERM after it restored the default handler); ``on_fit_end`` refreshes the
        summary."""
        self.output.bind(trainer).end_training(lambda: self._finish(trainer, "complete"))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer, "complete")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.output.on_exception(trainer, exception, lambda status: self._finish(trainer, status))  # signals

    def _finish(self, trainer: pl.Trainer, status: str) -> None:
        self.output.bind(trainer)  # only rank 0 writes the summary
        if self.auditor is None:
            self.output.done(status)
            return
        if self.output.refreshing(status):  # written at on_train_end: only written again
            self.output.write_summary(self.auditor.last_summary)
            return
        self.summary_path = self.auditor.finish(step=int(trainer.global_step), status=status, output=self.output,
                                                histograms=self.log_histograms, figures=self.log_figures)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.auditor is not None:
            self.auditor.backend.detach()


def _planned_steps(trainer: pl.Trainer, before: int = 0) -> float | None:
    """The steps (DP-SGD) or rounds (DP-FedAvg) the audit will have seen at the fit's end:
    ``before`` (taken in earlier fits) plus the trainer's ``estimated_stepping_batches`` (inf
    for an open-ended run, None where it cannot tell: the plan then says the run's length is
    unknown)."""
    try:
        return before + trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - no plan rather than a failed fit
        return None
