"""Fully connected classifier."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU] * len(hidden) -> Linear.

    The default ``hidden=(200, 200)`` is the two-hidden-layer, 200-unit ReLU network of the
    federated-learning literature (McMahan et al. 2017's "2NN"). Only Linear layers and
    ReLUs, so Opacus computes per-example gradients for it without changes.

    Args:
        in_features: number of input features D after flattening (64 for 8x8 digits).
        num_classes: number of output logits C.
        hidden: widths of the hidden layers; empty gives multinomial logistic regression.

    Shapes:
        input ``[N, *]`` with ``prod(*) == in_features`` (e.g. [N, 64] or [N, 1, 8, 8]);
        output logits ``[N, num_classes]``.
    """

    def __init__(
        self, in_features: int, num_classes: int, hidden: Sequence[int] = (200, 200)
    ) -> None:
        super().__init__()
        if in_features < 1 or num_classes < 1 or any(h < 1 for h in hidden):
            raise ValueError(
                f"sizes must be positive: in_features={in_features}, "
                f"num_classes={num_classes}, hidden={tuple(hidden)}"
            )
        self.in_features = int(in_features)
        self.num_classes = int(num_classes)
        layers: list[nn.Module] = [nn.Flatten()]
        width = self.in_features
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            width = int(h)
        layers.append(nn.Linear(width, self.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [N, *] -> logits [N, num_classes]."""
        return self.net(x)
