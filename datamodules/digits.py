"""The UCI optical digits data set bundled with scikit-learn (1797 images, 8x8, 10 classes).

It ships inside scikit-learn, so it loads offline; the federated tests and quick demos use it.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits

__all__ = ["DIGITS_NUM_CLASSES", "load_digits_tensors"]

DIGITS_NUM_CLASSES = 10


def load_digits_tensors(flatten: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Load sklearn's digits as tensors.

    Args:
        flatten: return features of shape [N, 64] instead of images [N, 1, 8, 8].

    Returns:
        ``(x, y)``: ``x`` float32 [N, 1, 8, 8] (or [N, 64]) with pixel values scaled from
        0..16 to [0, 1]; ``y`` int64 [N] in 0..9. N = 1797.
    """
    bunch = load_digits()
    x = torch.as_tensor(bunch.images, dtype=torch.float32) / 16.0
    x = x.reshape(x.shape[0], 64) if flatten else x.unsqueeze(1)
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    return x.contiguous(), y
