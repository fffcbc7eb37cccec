"""Both Lightning namespaces: ``lightning.pytorch`` and the standalone ``pytorch_lightning``.

Scripts in the wild import either (Opacus' and Flower's examples use ``pytorch_lightning``).
The two packages hold parallel class hierarchies with the same names, so ``isinstance`` against
one misses the other; these helpers recognise an object of either by its classes' names and
packages.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_lightning_module", "is_tensorboard_logger", "overrides"]

_PACKAGES = ("lightning", "pytorch_lightning")


def _is_a(obj: Any, name: str) -> bool:
    return any(
        cls.__name__ == name and cls.__module__.split(".")[0] in _PACKAGES
        for cls in type(obj).__mro__
    )


def is_lightning_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``LightningModule`` of either namespace."""
    return _is_a(obj, "LightningModule")


def is_tensorboard_logger(obj: Any) -> bool:
    """Whether ``obj`` is a ``TensorBoardLogger`` of either namespace."""
    return _is_a(obj, "TensorBoardLogger")


def overrides(module: Any, name: str) -> bool:
    """Whether a LightningModule of either namespace defines its own ``name`` hook (rather
    than the base class's)."""
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule" and cls.__module__.split(".")[0] in _PACKAGES:
            return False
        if name in vars(cls):
            return True
    return False
