"""Shared glue of the label callbacks: find the DP optimizer and layers, tap them, chain Opacus'
step hook, count what was attacked and why a step was not, and step aside when auditing is
impossible (warn once, log why, never abort the fit).

Both callbacks read the training through two hooks: forward hooks on the tapped layers (inputs
and outputs while a training batch runs) and a hook chained into the ``DPOptimizer``'s single
``step_hook`` slot (after clipping, noise and scaling, before the parameters move: ``p.grad`` is
the privatized gradient and ``p.grad_sample`` still holds the per-example gradients). The
accountant's own hook keeps running first.

Which steps. By default (``every_n_steps=None``) a callback considers the steps the Trainer
logs (``log_every_n_steps``, Lightning's default 50), as Lightning's ``DeviceStatsMonitor`` and
``LearningRateMonitor`` do, and the last step of every training epoch (so that a short epoch,
fewer steps than the interval, is still measured): the cost follows the logging interval and
every considered step reaches the logger. ``every_n_steps=n`` considers one logical step in n instead (``1``: every
step; the running maximum and the accuracy then cover every batch, at a cost measured in
``benchmarks/label_audit_overhead.py``). Which steps are considered never depends on the data,
so a maximum over them is still a valid lower bound.

Coverage. Every step the callback considers ends attacked or skipped with a reason code
(:data:`SKIP_REASONS`); ``<family>/attacked_fraction`` (attacked / considered so far) and
``<family>/skip_reason`` (the code of the latest considered step, 0 = attacked) are logged at
every logged step, together with the latest attacked step's values (running values: an attacked
step that is not on ``log_every_n_steps`` still reaches the logger at the next logged step). The
summary JSON holds the counts per reason. The first time a reason occurs the callback warns
(``rank_zero_warn``) and writes the text once to the logger (TensorBoard ``add_text`` under
``<family>/warnings`` when a ``TensorBoardLogger`` is attached), through its
:class:`~audit_callbacks.callbacks.summary.LightningOutput`, which also writes its summary (the
one schema) and gives the run's report its section. A callback that disabled itself (warned once,
``disabled_reason`` set, its hooks removed) logs no number afterwards, the step that found why
included; its summary keeps ``disabled_reason`` and the skip counts.

Which layer. A callback with no layer given attacks the ``nn.Linear`` whose output is the
model's output, found on the first step by
:class:`~audit_callbacks.callbacks.label_step.HeadProbe` (every ``nn.Linear`` is tapped until
then, so the first step is attacked too), not the last one registered: the registration order
need not be the order the layers run in. No ``nn.Linear`` output is the logits: disabled,
``unsupported_model``.

Resume. A checkpoint keeps the coverage, the latest values the logger may see, the latest
reason code (a resumed run logs the steps the uninterrupted one logs) and what the summary states
of the model (class count, layer as its repr), with the settings the results were computed at: a
resume at other settings raises ``ValueError`` naming the setting and both values (a checkpoint
saved before the settings were kept loads as before).

Names. ``<family>`` is the callback's family in :mod:`audit_callbacks.names` (``label_attack``,
``label_dp``): every tag is ``names.tag(family, name)`` and every chart comes from
``names.chart_layout``; the records and summaries use the same names as keys.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from audit_callbacks import names
from audit_callbacks.auditing.output import ReportSection
from audit_callbacks.backends.opacus.optimizer import (
    chain_step_hook,
    find_dp_optimizer,
    unchain_step_hook,
)
from audit_callbacks.callbacks.label_step import HeadProbe, LabelStepObserver, LayerTap
from audit_callbacks.callbacks.summary import LightningOutput, output_summary_filename
from audit_callbacks.validation import check_optional_count

__all__ = ["SKIP_REASONS", "default_labels", "linear_layers"]

#: reason code -> number logged as ``<family>/skip_reason`` (0: the step was attacked)
SKIP_REASONS: dict[str, int] = {
    "attacked": 0,
    "batch_wider_than_layer": 1,  # N > p (+1 bias): the linear system is under-determined
    "rank_deficient": 2,  # duplicate examples or dead ReLU units lower the usable width
    "unsupported_loss": 3,  # the logit layer's gradients are not kappa (p - e_y) x~
    "no_gradient": 4,  # the attacked layer got no gradient this step
    "unsupported_model": 5,  # no nn.Linear whose output is the logits (disabled: fit start or first step)
    "no_dp_optimizer": 6,  # not an Opacus DPOptimizer (disabled at fit start)
    "no_noise": 7,  # noise_multiplier 0: no step is private (bound disabled)
    "empty_batch": 8,  # a Poisson batch with no example
    "bad_labels": 9,  # label_fn gave no class index per example (e.g. one-hot targets)
}


def default_labels(batch: Any) -> torch.Tensor:
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[1]
    if isinstance(batch, dict) and "label" in batch:
        return batch["label"]
    raise ValueError("cannot find the labels in the batch: pass label_fn=lambda batch: ...")


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of ``module`` in registration order (``module.modules()``),
    which need not be the order they run in: the attacked head is found by
    :class:`~audit_callbacks.callbacks.label_step.HeadProbe`."""
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _rank_zero_warn(message: str) -> None:
    rank_zero_warn(message, category=UserWarning)


class CannotAudit(Exception):
    """Raised by ``_layers`` when the model cannot be audited: ``(reason, message)``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StepAuditCallback(Callback):
    """Base of the label callbacks (see the module docstring)."""

    name = "label audit"
    family = ""  # each subclass: the family of its quantities in audit_callbacks.names

    def __init__(self, *, every_n_steps: int | None, label_fn: Any, summary_filename: str | None,
                 observer: LabelStepObserver | None = None) -> None:
        # None: the Trainer's logging steps
        self.every_n_steps = check_optional_count(every_n_steps, "every_n_steps", minimum=1)
        if observer is not None and not isinstance(observer, LabelStepObserver):
            raise ValueError(f"observer must be a LabelStepObserver, got {type(observer).__name__}")
        if label_fn is not None and not callable(label_fn):
            raise ValueError(f"label_fn must be None or a callable batch -> labels, got {label_fn!r}")
        self.label_fn = label_fn or default_labels
        self.observer = observer
        self.optimizer: Any = None
        self._tap: LayerTap | None = None
        self._probe: HeadProbe | None = None  # until the first step: which nn.Linear is the head
        self._find_head = False  # set by _layers: the head is found on the first step
        self._hook: Any = None
        self._latest: dict[str, float] = {}
        self._unlogged = False  # an attacked step's values not yet logged (flushed at train end)
        self._log_this_batch = True
        self._stepped = False
        self._trainer: pl.Trainer | None = None
        #: the audit's output path: warnings once (also as TensorBoard text), the summary, the
        #: report section, the scalars
        self.output = LightningOutput(type(self).__name__, summary_filename, emit=_rank_zero_warn,
                                      section=self._section, text_tag=names.tag(self.family, names.WARNINGS))
        self.steps = 0
        self.considered = 0
        self.skips: Counter[str] = Counter()
        self.last_reason: str | None = None
        self.disabled_reason: str | None = None
        self.summary_path: str | None = None

    summary_filename = output_summary_filename

    # ------------------------------------------------------------------ coverage and warnings
    def _warn_once(self, key: str, message: str) -> None:
        self.output.warn(key, message)

    def _skip(self, reason: str, message: str) -> None:
        """Count this step as skipped for ``reason`` (a key of SKIP_REASONS); warn the first time."""
        self.skips[reason] += 1
        self.last_reason = reason
        self._warn_once(reason, f"{type(self).__name__}: step skipped ({reason}): {message}")

    def _disable(self, reason: str, message: str) -> None:
        self.disabled_reason = reason
        self.last_reason = reason
        self._warn_once(reason, f"{type(self).__name__} disabled ({reason}): {message}; training continues "
                        "without this audit")
        self._teardown_hooks()

    @property
    def attacked_steps(self) -> int:
        return self.considered - sum(self.skips.values())

    @property
    def attacked_fraction(self) -> float:
        return self.attacked_steps / self.considered if self.considered else 0.0

    def coverage(self) -> dict[str, Any]:
        """For the summary JSON: steps seen, considered, attacked, skipped per reason."""
        return {"steps": self.steps, "considered_steps": self.considered, "attacked_steps": self.attacked_steps,
                names.ATTACKED_FRACTION: self.attacked_fraction, "skipped": dict(self.skips),
                "skip_reason_codes": SKIP_REASONS, "disabled_reason": self.disabled_reason}

    # ------------------------------------------------------------------ to implement
    def _layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        """The layers to tap, by role; or, after setting ``_find_head``, {} (the head is then
        found on the first step and given to ``_bind_head``). Raises CannotAudit."""
        raise NotImplementedError

    def _bind_head(self, head: nn.Linear, previous: nn.Linear | None, order: list[nn.Linear]) -> dict[str, nn.Linear]:
        """The layers to tap, by role, once the head (the ``nn.Linear`` whose output is the
        model's output) is known; ``previous``: the ``nn.Linear`` called before it; ``order``:
        every ``nn.Linear`` called, in call order. Raises CannotAudit."""
        raise NotImplementedError

    def _norm_layers(self, pl_module: pl.LightningModule) -> dict[str, nn.Linear]:
        """Layers whose inputs the tap records as well (ghost norms, per-label norms)."""
        return {}

    def _check_optimizer(self) -> None:
        """Raise CannotAudit when the optimizer's settings make the audit impossible."""

    def _on_step(self, optimizer: Any, data: dict[str, Any]) -> dict[str, float] | None:
        """Attack one step: ``{name: value}`` (names of the callback's family, logged as
        ``names.tag(family, name)``), or None when the step was skipped (``_skip``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Lightning hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        self.output.bind(trainer)
        self.disabled_reason = None
        self.optimizer = find_dp_optimizer(trainer.optimizers)
        if self.optimizer is None:
            self._disable("no_dp_optimizer", "it audits Opacus DP-SGD: return the optimizer of "
                          "PrivacyEngine().make_private(...) from configure_optimizers")
            return
        self._find_head = False
        try:
            layers = self._layers(pl_module)
            self._check_optimizer()
        except CannotAudit as err:
            self._disable(err.reason, str(err))
            return
        if self.observer is None:
            self.observer = LabelStepObserver.attached(self.optimizer)
        if self._find_head:  # every nn.Linear is tapped until the first step tells which is the head
            layers = {f"linear{i}": m for i, m in enumerate(linear_layers(pl_module))}
            self._probe = HeadProbe(pl_module)
        self._tap = LayerTap(layers, self._norm_layers(pl_module))
        self._hook = chain_step_hook(self.optimizer, self._step_hook)

    def _resolve_head(self) -> bool:
        """On the first step: find the head, keep only its (and the roles') taps; False when
        the callback disabled itself (no ``nn.Linear`` layer's output is the model's output)."""
        assert self._probe is not None and self._tap is not None
        if sum(int(t.numel()) for t in self._tap.labels) == 0:
            return True  # an empty (Poisson) batch shows no rows to match: the next step tells
        probe, self._probe = self._probe, None
        found = probe.resolve()
        probe.remove()
        try:
            if isinstance(found, str):
                raise CannotAudit("unsupported_model", f"{found}; the label attacks need the logits to be "
                                  "the output of an nn.Linear layer (one sigmoid logit or K softmax outputs)")
            self._tap.narrow(self._bind_head(*found))
        except CannotAudit as err:
            self._disable(err.reason, str(err))
            return False
        return True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        connector = getattr(trainer, "_logger_connector", None)
        self._log_this_batch = bool(getattr(connector, "should_update_logs", True))
        if self.every_n_steps is None:  # also each epoch's last batch (it ends with an optimizer step)
            total = trainer.num_training_batches
            self._log_this_batch |= isinstance(total, int) and batch_idx + 1 == total
        if self._tap is None:
            return
        try:
            labels = torch.as_tensor(self.label_fn(batch)).detach()
        except Exception as err:  # a label_fn that cannot read this batch: never stop the fit
            self._disable("bad_labels", f"label_fn failed on a batch ({type(err).__name__}: {err}); "
                          "pass label_fn=lambda batch: <the batch's class indices>")
            return
        self._tap.active = True
        self._tap.labels.append(labels.reshape(-1).to("cpu"))
        if self._probe is not None:
            self._probe.begin()

    def _step_hook(self, optimizer: Any) -> None:
        assert self._tap is not None
        self.steps += 1
        self._stepped = True
        if self._probe is not None and not self._resolve_head():
            return
        if not self._considers_this_step():
            self._tap.clear()  # drop the step's activations without converting them
            return
        data = self._tap.take()
        self.considered += 1
        if data is None or data["labels"].numel() == 0:
            self._skip("empty_batch", "no example in this batch")
            return
        rows = {int(v.shape[0]) for v in data["inputs"].values()}
        if rows and data["labels"].numel() not in rows:
            self._skip("bad_labels", f"label_fn gave {data['labels'].numel()} labels for a batch of "
                       f"{min(rows)} examples: it must give one class index per example (e.g. "
                       "batch[1], not one-hot targets)")
            return
        reasons_before = sum(self.skips.values())
        out = self._on_step(optimizer, data)
        if out is not None:
            self.last_reason = "attacked"
            self._latest = dict(out)
            self._unlogged = True
        elif sum(self.skips.values()) == reasons_before:  # _on_step returned None without a reason
            self._skip("no_gradient", "nothing to attack this step")

    def _considers_this_step(self) -> bool:
        if self.every_n_steps is None:
            return self._log_this_batch
        return (self.steps - 1) % self.every_n_steps == 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.observer is not None:
            self.observer.release()
        if self._tap is not None:
            self._tap.active = False
        if self._probe is not None:
            self._probe.active = False
        # per-step scalars follow the Trainer's log_every_n_steps (as self.log(on_step=True) and
        # LearningRateMonitor do); the latest attacked values and the coverage are logged at
        # every logged step, so attacked steps off the interval still reach the logger
        stepped, self._stepped = self._stepped, False
        if not (self._log_this_batch and stepped) or self.last_reason is None:
            return  # a batch that accumulates gradients logs nothing: its values would be the last step's
        if self.disabled_reason is not None:
            return  # disabled (the step that found why included): no number reaches the logger
        self._log_latest(trainer)

    def _log_latest(self, trainer: pl.Trainer) -> None:
        """The latest attacked values and the coverage, at the trainer's step."""
        latest = {**self._latest, names.ATTACKED_FRACTION: self.attacked_fraction,
                  names.SKIP_REASON: float(SKIP_REASONS.get(self.last_reason, -1))}
        metrics = {names.tag(self.family, k): float(v) for k, v in latest.items() if v is not None and math.isfinite(v)}
        self.output.scalars(metrics, int(trainer.global_step))
        self._unlogged = False

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report: ``(title, {key: value})``."""
        raise NotImplementedError

    def _section(self) -> ReportSection:
        return ReportSection(*self.report_section())

    def _finish(self, trainer: pl.Trainer, summary: dict[str, Any], status: str) -> None:
        """Hand the summary to the output path (the run's folder, rank zero; the report once
        every audit of the run has finished)."""
        self.output.bind(trainer)
        self.output.summary_filename = self.summary_filename
        path = self.output.finish(summary, status)
        if path is not None:
            self.summary_path = path

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """The last attacked values that no logged step carried (every_n_steps off the
        logging interval), then the summary now, before Lightning's teardown can lose it (a
        SIGTERM after it restored the default handler); ``on_fit_end`` refreshes it."""
        if self._unlogged and self.last_reason is not None and self.disabled_reason is None:
            self.output.bind(trainer)
            self._log_latest(trainer)
        self.output.bind(trainer).end_training(lambda: self.on_fit_end(trainer, pl_module))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """SIGTERM / SIGINT: the summary of what was measured (``run_status``: ``interrupted at
        step N``), and an exit code that is not 0 (:mod:`audit_callbacks.callbacks.interrupt`)."""
        self.output.on_exception(trainer, exception,
                                 lambda status: self.on_fit_end(trainer, pl_module, status=status))

    def _teardown_hooks(self) -> None:
        if self._probe is not None:
            self._probe.remove()
            self._probe = None
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        if self.optimizer is not None and self._hook is not None:
            unchain_step_hook(self.optimizer, self._hook)
            self._hook = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._teardown_hooks()

    def _settings(self) -> dict[str, Any]:
        """The settings, as given, that a resume must keep (the checkpoint's results were
        computed at them); subclasses add theirs."""
        return {"every_n_steps": self.every_n_steps}

    def _check_settings(self, saved: Any) -> None:
        """Refuse a checkpoint whose audit ran at other settings, naming the setting and both
        values (a checkpoint saved before the settings were kept has none: nothing to compare).

        Raises:
            ValueError: a setting of :meth:`_settings` differs from the checkpoint's.
        """
        if not isinstance(saved, dict):
            return
        for key, value in self._settings().items():
            if key in saved and saved[key] != value:
                self._refuse(key, saved[key], value)

    def _refuse(self, key: str, saved: Any, value: Any) -> None:
        raise ValueError(f"{type(self).__name__}: the checkpoint's audit has {key}={saved!r}, this one "
                         f"{value!r}; resuming would mix two audits (its results were computed at "
                         f"{key}={saved!r}). Resume with {key}={saved!r}, or start a new run")

    def _coverage_state(self) -> dict[str, Any]:
        """The coverage, the latest attacked values (published ones only), the reason code of
        the latest considered step and the settings: what a resume needs to log and summarize
        as the uninterrupted run would."""
        return {"steps": self.steps, "considered": self.considered, "skips": dict(self.skips),
                "latest": dict(self._latest), "last_reason": self.last_reason, "settings": self._settings()}

    def _load_coverage_state(self, state: dict[str, Any]) -> None:
        """Raises ValueError (naming the setting) when the checkpoint's settings differ, before
        anything is loaded."""
        self._check_settings(state.get("settings"))
        self.steps = int(state.get("steps", 0))
        self.considered = int(state.get("considered", self.steps))
        self.skips = Counter({str(k): int(v) for k, v in state.get("skips", {}).items()})
        self._latest = {str(k): float(v) for k, v in state.get("latest", {}).items()}
        reason = state.get("last_reason")
        self.last_reason = reason if reason in SKIP_REASONS else None
