"""The Opacus backend with Lightning's hooks: a repeated fit binds the canaries to the trainer's
new optimizer and loader."""

from __future__ import annotations

from typing import Any

from audit_callbacks.backends.base import LightningHooks
from audit_callbacks.backends.opacus.backend import OpacusBackend, _hparam_seeds, dp_optimizer

__all__ = ["LightningOpacusBackend", "lightning_loader", "lightning_world_size"]


class lightning_loader:  # noqa: N801 - a function to its callers
    """A function giving the trainer's training loader now (Lightning builds it after
    ``setup``; None before)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self) -> Any:
        return getattr(self.trainer, "train_dataloader", None)


def lightning_world_size(trainer: Any) -> int:
    """``trainer.world_size`` (processes: nodes x devices), 1 when the trainer has none."""
    return int(getattr(trainer, "world_size", 1))


class LightningOpacusBackend(OpacusBackend, LightningHooks):
    """:class:`~audit_callbacks.backends.opacus.backend.OpacusBackend` of a Lightning trainer's
    ``DPOptimizer`` and training loader."""

    @classmethod
    def of(cls, trainer: Any, warn: Any, **kwargs: Any) -> LightningOpacusBackend:
        """The backend of the trainer's ``DPOptimizer`` and loader (TypeError without one)."""
        backend = cls(dp_optimizer(trainer.optimizers), lightning_loader(trainer), warn,
                      world_size=lightning_world_size(trainer), **kwargs)
        backend.add_logged_seeds(trainer)
        backend.batches_per_step = _accumulated_batches(trainer)
        return backend

    def add_logged_seeds(self, trainer: Any) -> None:
        """The datamodule's logged seeds count as public too (its ``sampling_seed``)."""
        self._module_seeds += [s for s in _hparam_seeds(getattr(trainer, "datamodule", None))
                               if s not in self._module_seeds]

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """A repeated fit: the canaries go on with the new optimizer."""
        self.add_logged_seeds(trainer)
        self.batches_per_step = _accumulated_batches(trainer)
        self.bind(dp_optimizer(trainer.optimizers), lightning_loader(trainer),
                  lightning_world_size(trainer))


def _accumulated_batches(trainer: Any) -> int:
    """The batches Lightning accumulates into one optimizer step (``accumulate_grad_batches``;
    1 where the trainer does not say): Opacus' ``accumulated_iterations`` of every step."""
    try:
        return max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    except (TypeError, ValueError):
        return 1
