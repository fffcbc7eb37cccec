"""``OpacusCanaryAudit``: the canary audit of a plain-PyTorch Opacus training loop.

The same audit as the Lightning ``CanaryAudit`` on Opacus DP-SGD (Andrew et al., "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024, Alg. 2 and 3, with a canary in
the place of a training example; ``docs/methods/canaries.md``), for scripts such as Opacus'
``examples/mnist.py`` that call ``optimizer.step()`` themselves::

    model, optimizer, train_loader = privacy_engine.make_private(...)
    audit = OpacusCanaryAudit(optimizer, data_loader=train_loader, log_dir="runs/audit",
                              delta=DELTA)         # the delta the script gives get_epsilon
    for epoch in range(epochs):
        train(model, train_loader, optimizer)      # unchanged: every step is observed
    audit.write()                                  # summary JSON + TensorBoard in log_dir
    print(audit.report().value("epsilon_all_iterates"))  # NoEstimateYet before 2 canaries took part

A thin front end: :class:`~audit_callbacks.backends.opacus.backend.OpacusBackend` adds the canaries to
the ``DPOptimizer``'s noisy sum and releases the model delta of every logical step, and the one
:class:`~audit_callbacks.auditing.CanaryAuditor` owns statistics, report and summary. The
analytic epsilon is the run's own Opacus accountant's (found on the optimizer's step hook).
"""

from __future__ import annotations

import os
import types
import warnings
import weakref
from typing import Any

import torch

from audit_callbacks.auditing import CanaryAuditConfig
from audit_callbacks.auditing.files import check_writable
from audit_callbacks.auditing.frontend import AuditFrontEnd
from audit_callbacks.auditing.sinks import WriterSink
from audit_callbacks.backends.opacus.backend import OpacusBackend
from audit_callbacks.backends.opacus.optimizer import find_dp_optimizer
from audit_callbacks.validation import check_flag, check_optional_count, check_summary_filename

__all__ = ["OpacusCanaryAudit"]


def _world_size() -> int:
    dist = torch.distributed
    return int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else 1


class OpacusCanaryAudit(AuditFrontEnd):
    """Insert canaries into an Opacus ``DPOptimizer`` and estimate epsilon from their cosines.

    Construct it after ``PrivacyEngine.make_private`` and before the first step. It installs
    the canaries into the optimizer's ``add_noise`` and wraps the optimizer's ``step`` on the
    instance (the class is untouched; LR schedulers made later still work), so each logical
    step (one noise draw; gradient accumulation and ``BatchMemoryManager`` steps included) is
    observed without further calls.

    Args:
        optimizer: the ``DPOptimizer`` returned by ``make_private`` (or an object whose
            ``optimizer`` attribute is one).
        data_loader: the training loader (optional): its dataset's size caps the default k,
            and ``1 / len(data_loader)`` is the canaries' rate when no accountant is found.
        num_canaries: k observed canaries, >= 2 (None: min(1000, training examples)).
        log_dir: where :meth:`write` puts the summary JSON and TensorBoard events by default
            (None: give one to :meth:`write`).
        every_n_steps: also estimate and log to TensorBoard in ``log_dir`` every n logical
            steps (None: only at :meth:`write`). An estimate costs O(k d) time.
        summary_filename, log_histograms, log_figures: the summary's name; TensorBoard
            extras (cosine histograms, density figures).
        steps: the logical steps the training will take, for the audit's plan (its line is
            printed now; None: planned at the first :meth:`write` from the steps so far).
        **config: :class:`~audit_callbacks.auditing.CanaryAuditConfig`'s keyword arguments
            (``num_unobserved``, ``canaries``, ``seed``, ``delta``, ``alpha``, ``bootstrap``,
            ``sample_rate``, ``max_buffered_rounds``). Give ``delta`` the value your script
            gives ``privacy_engine.get_epsilon(delta)``: Opacus keeps no delta of its own
            (``make_private_with_epsilon`` drops ``target_delta``), so without it the claim is
            computed at 1e-5 (warned once, and ``inputs.delta_source`` is ``"default"``).

    :meth:`report` (every estimate so far) raises
    :class:`~audit_callbacks.auditing.NoEstimateYet` until there is one, as on every front end.

    Raises:
        ValueError: a bad argument, naming it (``optimizer`` that is not an Opacus
            ``DPOptimizer``, ``data_loader`` without a length, ``log_dir`` that is not a path or
            is a file, ``summary_filename`` that is not a path inside ``log_dir``,
            an unknown or out-of-range config keyword, ``repeats`` which is DP-FedAvg only).
        RuntimeError: several processes with a non-distributed ``DPOptimizer`` on each.
    """

    name = "OpacusCanaryAudit"

    def __init__(self, optimizer: Any, *, data_loader: Any = None, num_canaries: int | None = None,
                 log_dir: str | os.PathLike[str] | None = None, every_n_steps: int | None = None,
                 summary_filename: str = "audit_summary.json", log_histograms: bool = True,
                 log_figures: bool = True, steps: int | None = None, **config: Any) -> None:
        super().__init__()
        opt = find_dp_optimizer([optimizer])
        if opt is None:
            raise ValueError(
                f"{self.name}: optimizer must be the Opacus DPOptimizer returned by "
                f"PrivacyEngine().make_private(...), got {type(optimizer).__name__}")
        if data_loader is not None:
            try:
                len(data_loader)
            except TypeError:
                raise ValueError(f"{self.name}: data_loader must be a sized DataLoader (or None), "
                                 f"got {type(data_loader).__name__}") from None
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(f"{self.name}: log_dir must be a path or None, got {log_dir!r}")
        summary_filename = check_summary_filename(summary_filename, optional=False)
        if log_dir is not None:
            _check_log_dir(self.name, os.fspath(log_dir), summary_filename)
        unknown = sorted(set(config) - set(CanaryAuditConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{self.name}: unknown argument {unknown[0]}")
        if config.get("repeats") is not None:
            raise ValueError(f"{self.name}: repeats is for DP-FedAvg; DP-SGD canaries are sampled")
        self.config = CanaryAuditConfig(num_canaries, **config)
        self.every_n_steps = check_optional_count(every_n_steps, "every_n_steps", minimum=1)
        self.log_histograms = check_flag(log_histograms, "log_histograms")
        self.log_figures = check_flag(log_figures, "log_figures")
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.summary_filename = summary_filename
        self.optimizer = opt
        self._sinks: dict[str, WriterSink] = {}
        self._claimed: dict[str, str] = {}  # a requested log_dir -> the folder written
        self._open(OpacusBackend(opt, data_loader, self._warn, world_size=_world_size(),
                                 sample_rate=self.config.sample_rate, seed=self.config.seed))
        assert self.auditor is not None
        self.auditor.start()  # theta_0: the model now
        self._install_step()
        self._plan(check_optional_count(steps, "steps", minimum=1))  # unknown: at the first write

    # ------------------------------------------------------------------ the optimizer
    def _emit(self, message: str) -> None:
        warnings.warn(message, UserWarning, stacklevel=3)

    def _install_step(self) -> None:
        """Wrap ``optimizer.step`` on the instance as a bound method (so that ``LRScheduler``,
        which rebinds ``step.__func__``, can wrap it again)."""
        opt, audit = self.optimizer, self
        self._own_step = opt.__dict__.get("step")  # an instance attribute already there, if any
        inner = opt.step

        def step(opt_self: Any, *args: Any, **kwargs: Any) -> Any:
            before = audit.steps
            out = inner(*args, **kwargs)
            if audit._wrapped is not None:
                audit._after_step(before)
            return out

        self._wrapped = types.MethodType(step, opt)
        opt.step = self._wrapped

    def _after_step(self, before: int) -> None:
        """After ``optimizer.step()``; ``before``: the logical steps before it."""
        backend = self.auditor.backend
        backend.on_train_batch_end()  # releases the delta when a logical step was taken
        steps = backend.progress()
        if (self.every_n_steps and self.log_dir is not None and steps != before
                and steps % self.every_n_steps == 0):
            self.auditor.update(self._sink(self._directory(self.log_dir)), step=steps,
                                histograms=self.log_histograms)

    def _directory(self, directory: str) -> str:
        """The folder this audit writes for ``directory``: ``directory`` itself unless another
        live ``OpacusCanaryAudit`` of this process writes there, then the first free
        ``<directory>-<n>`` (warned once): no audit replaces another's summary, report or
        TensorBoard series."""
        if directory in self._claimed:
            return self._claimed[directory]
        candidate, n = directory, 0
        while True:
            key = os.path.realpath(candidate)
            owner = _DIRECTORY_OWNERS.get(key)
            if owner is None or owner() is None or owner() is self:
                _DIRECTORY_OWNERS[key] = weakref.ref(self)
                break
            n += 1
            candidate = f"{directory}-{n}"
        if candidate != directory:
            self._warn("log_dir", f"{self.name}: {directory} is written by another "
                       f"OpacusCanaryAudit in this process; this audit writes to {candidate} (pass "
                       "each audit its own log_dir)")
        self._claimed[directory] = candidate
        return candidate

    def _sink(self, directory: str) -> WriterSink:
        if directory not in self._sinks:
            self._sinks[directory] = sink = WriterSink(log_dir=directory)
            self.output._write(sink.layout, self.auditor.layout())  # a failure is warned, never raised
        return self._sinks[directory]

    # ------------------------------------------------------------------ results
    @property
    def steps(self) -> int:
        """Logical steps observed so far (each one noise draw of the ``DPOptimizer``)."""
        return 0 if self.auditor is None else int(self.auditor.backend.progress())

    def write(self, log_dir: str | os.PathLike[str] | None = None) -> str | None:
        """The final estimate (with the config's ``bootstrap`` intervals) logged to TensorBoard
        in ``log_dir`` (scalars, cosine histograms, density figures, the Custom Scalars
        layout) and the summary JSON written atomically to ``log_dir/summary_filename``.
        May be called again (e.g. each epoch): the summary is replaced, the series goes on.

        Args:
            log_dir: the folder (None: the constructor's ``log_dir``).

        Returns:
            The path of ``audit_report.html``, the report a person reads (printed as
            ``audit report: <path>``; None when it could not be written: warned). The
            summary JSON's path is :attr:`summary_path`.

        Raises:
            ValueError: no ``log_dir`` here nor at construction.
        """
        directory = self.log_dir if log_dir is None else os.fspath(log_dir)
        if directory is None:
            raise ValueError(f"{self.name}.write: log_dir is None here and at construction")
        directory = self._directory(directory)
        sink = self._sink(directory)
        self._plan(self.steps, replan=False)  # a run whose length was not given: planned now
        self.output.bind_directory(directory, sink)
        self.summary_path = self.auditor.finish(
            step=self.steps, output=self.output, histograms=self.log_histograms,
            figures=self.log_figures)
        sink.close()
        return self.report_path

    # ------------------------------------------------------------------ state
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` now (statistics, participations, steps, and the Opacus
        accountant's history, put in front of a new accountant's so its epsilon covers the
        whole training). Raises ``ValueError`` naming a setting that differs."""
        super().load_state_dict(state_dict)
        self._open(None)

    def detach(self) -> None:
        """Remove the canaries from the optimizer and stop observing its steps (idempotent).
        The statistics so far stay: :meth:`report` and :meth:`write` still work."""
        if self._wrapped is None:
            return
        opt = self.optimizer
        if opt.__dict__.get("step") is self._wrapped:  # else someone wrapped it since: stay inert
            if self._own_step is None:
                del opt.step
            else:
                opt.step = self._own_step
        self._wrapped = None
        self.auditor.backend.detach()
        for sink in self._sinks.values():
            sink.close()


#: realpath of a folder -> the live OpacusCanaryAudit of this process that writes there
_DIRECTORY_OWNERS: dict[str, weakref.ref[Any]] = {}


def _check_log_dir(name: str, log_dir: str, summary_filename: str) -> None:
    """Refuse a ``log_dir`` the summary can never be written into, at construction rather than
    at a step: a file there (or at a folder above it), or an existing folder that cannot be
    written (nothing is created here: a missing folder is made at the first write).

    Raises:
        ValueError: naming ``log_dir``.
    """
    existing = os.path.abspath(log_dir)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{name}: log_dir must be a folder, but {existing!r} is a file")
    if existing == os.path.abspath(log_dir):
        try:
            check_writable(log_dir, summary_filename)
        except ValueError as err:
            raise ValueError(f"{name}: log_dir {log_dir!r} cannot hold the summary ({err})") from None
