"""Small convolutional classifier for 8x8 digits, 28x28 MNIST/EMNIST and 32x32 CIFAR-10."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN"]


def _groups(channels: int, max_groups: int = 4) -> int:
    """Largest group count <= max_groups that divides ``channels``."""
    return next(g for g in range(min(max_groups, channels), 0, -1) if channels % g == 0)


class SmallCNN(nn.Module):
    """[Conv3x3 -> (GroupNorm) -> ReLU -> MaxPool2] * 2 -> Flatten -> Linear -> ReLU -> Linear.

    No BatchNorm (it mixes examples in a batch, which breaks per-example gradients and
    DP-SGD); ``group_norm=True`` adds GroupNorm, which Opacus supports. With the defaults
    it has 13.7k parameters on 8x8 digits, ~106k on 28x28 MNIST.

    Args:
        in_channels: input channels (1 for digits/MNIST, 3 for CIFAR-10).
        num_classes: number of output logits.
        image_size: input height and width, an int (square) or ``(height, width)``; both
            must be >= 4 (two 2x2 poolings).
        channels: output channels of the two convolutions.
        hidden: width of the hidden linear layer.
        group_norm: put GroupNorm (up to 4 groups) after each convolution.

    Shapes:
        input ``[N, in_channels, H, W]``; output logits ``[N, num_classes]``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 8,
        channels: tuple[int, int] = (16, 32),
        hidden: int = 64,
        group_norm: bool = False,
    ) -> None:
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if h < 4 or w < 4:
            raise ValueError(f"image_size must be at least 4x4, got {h}x{w}")
        if in_channels < 1 or num_classes < 1 or hidden < 1 or min(channels) < 1:
            raise ValueError("in_channels, num_classes, hidden and channels must be positive")
        self.in_channels = int(in_channels)
        self.num_classes = int(num_classes)
        self.image_size = (int(h), int(w))
        c1, c2 = (int(c) for c in channels)

        def block(cin: int, cout: int) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel_size=3, padding=1)]
            if group_norm:
                layers.append(nn.GroupNorm(_groups(cout), cout))
            return layers + [nn.ReLU(), nn.MaxPool2d(2)]

        self.features = nn.Sequential(*block(self.in_channels, c1), *block(c1, c2))
        flat = c2 * (h // 4) * (w // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, int(hidden)),
            nn.ReLU(),
            nn.Linear(int(hidden), self.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [N, C, H, W] -> logits [N, num_classes]."""
        return self.classifier(self.features(x))
