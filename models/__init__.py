"""Reference models for the examples and tests (Opacus-compatible: no BatchNorm).

Not part of the ``audit_callbacks`` library, which never imports this package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from .cnn import SmallCNN
from .mlp import MLP

__all__ = ["MLP", "SmallCNN", "build_model", "num_parameters"]


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Build a model for inputs of shape ``input_shape`` (one example, no batch dim).

    Args:
        name: "mlp" (any input shape; flattened) or "cnn" (``input_shape = (C, H, W)``).
        input_shape: e.g. ``datamodule.input_shape``: (1, 8, 8), (1, 28, 28), (30,).
        num_classes: number of logits.
        kwargs: passed on to :class:`MLP` or :class:`SmallCNN`.
    """
    shape = tuple(int(s) for s in input_shape)
    if name == "mlp":
        return MLP(math.prod(shape), num_classes, **kwargs)
    if name == "cnn":
        if len(shape) != 3:
            raise ValueError(f"cnn needs input_shape (C, H, W), got {shape}")
        return SmallCNN(shape[0], num_classes, image_size=(shape[1], shape[2]), **kwargs)
    raise ValueError(f"unknown model {name!r}; choose 'mlp' or 'cnn'")


def num_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
