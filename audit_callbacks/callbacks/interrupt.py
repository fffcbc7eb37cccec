"""Audits that survive a scheduler's signal: a callback's ``on_exception`` writes the summary of
what was measured before the process exits, and the exit code says the run did not finish.

What Lightning 2.6 does (``trainer/connectors/signal_connector.py``, ``trainer/call.py``):

* **SIGTERM** (what SLURM, Kubernetes and ``timeout`` send): Lightning's handler only sets
  ``trainer.received_sigterm``; the loops raise ``SIGTERMException`` at the next batch (or
  validation) boundary. ``SIGTERMException`` is a ``SystemExit`` without a code, so the process
  exits with status **0**, as if training had finished. Before that, ``_interrupt`` calls every
  callback's ``on_exception(trainer, pl_module, exception)``.
* **SIGINT** (Ctrl+C): ``KeyboardInterrupt`` reaches ``_call_and_handle_interrupt``, which calls
  ``on_exception`` and then ``sys.exit(1)``.

:func:`on_interrupt` is the piece a callback's ``on_exception`` calls: for those two exceptions
(of either Lightning namespace) it runs the callback's ``finish(status)`` with ``status =
"interrupted at step N"`` (N: the trainer's ``global_step``), and gives a ``SIGTERMException``
the exit code ``128 + SIGTERM`` (143, the shell's code for a process ended by SIGTERM) so that a
scheduler or script sees the run did not finish. A training that finished before the signal was
seen raises nothing (Lightning defers the exit) and exits 0. Any other exception is left alone.

* **The fit-end window**: Lightning's teardown (``Trainer._teardown``) restores the default
  SIGTERM handler before ``on_fit_end``; a SIGTERM there ends the process at once, with no
  ``on_exception``. The audits therefore write their complete summaries at ``on_train_end``
  and only refresh them at fit end
  (:meth:`~audit_callbacks.callbacks.summary.LightningOutput.end_training`).

Usage in a callback (two lines)::

    def on_exception(self, trainer, pl_module, exception):
        on_interrupt(trainer, exception, lambda status: self._write_summary(trainer, status))
"""

from __future__ import annotations

import signal
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["SIGTERM_EXIT_CODE", "failed_status", "interrupt_status", "is_interrupt", "on_interrupt"]

#: The exit code a ``SIGTERMException`` is given: 128 + SIGTERM, as a shell reports it.
SIGTERM_EXIT_CODE = 128 + int(signal.SIGTERM)


def _is_sigterm(exception: BaseException) -> bool:
    """A ``SIGTERMException`` of ``lightning.pytorch`` or ``pytorch_lightning``."""
    return any(cls.__name__ == "SIGTERMException" for cls in type(exception).__mro__)


def is_interrupt(exception: BaseException) -> bool:
    """Whether ``exception`` is a signal's: Lightning's ``SIGTERMException`` or a
    ``KeyboardInterrupt`` (SIGINT)."""
    return _is_sigterm(exception) or isinstance(exception, KeyboardInterrupt)


def interrupt_status(trainer: Any) -> str:
    """``"interrupted at step N"``, N the trainer's ``global_step`` (the optimizer steps, or
    DP-FedAvg rounds, done when the signal stopped the fit)."""
    return f"interrupted at step {int(getattr(trainer, 'global_step', 0))}"


def failed_status(trainer: Any, exception: BaseException) -> str:
    """``"failed at step N (<exception's class>: <message>)"``: the ``run_status`` of a summary
    written when another exception (a logger that died mid-run) stopped the fit."""
    message = " ".join(str(exception).split())[:200]
    return f"failed at step {int(getattr(trainer, 'global_step', 0))} ({type(exception).__name__}: {message})"


def on_interrupt(trainer: Any, exception: BaseException, finish: Callable[[str], Any]) -> bool:
    """Call from a callback's ``on_exception``: for a signal's exception, ``finish(status)``
    (write the summary of what was measured, with ``status = "interrupted at step N"``), then
    make sure the process will not exit 0.

    Args:
        trainer: the Lightning ``Trainer``.
        exception: what ``on_exception`` received.
        finish: the callback's summary writer, given the status; an error in it is warned
            about, never raised over the signal's exception.

    Returns:
        Whether ``exception`` was a signal's (and ``finish`` was called).
    """
    if not is_interrupt(exception):
        return False
    try:
        finish(interrupt_status(trainer))
    except Exception as err:  # noqa: BLE001 - the signal's exit must go on
        warnings.warn(f"the audit summary could not be written on interrupt ({type(err).__name__}: "
                      f"{err})", UserWarning, stacklevel=2)
    if _is_sigterm(exception) and getattr(exception, "code", None) in (None, 0):
        exception.code = SIGTERM_EXIT_CODE  # type: ignore[attr-defined] - SystemExit's code
    return True
