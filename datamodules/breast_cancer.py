"""The Wisconsin diagnostic breast cancer data set bundled with scikit-learn (569 x 30, 2 classes)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_breast_cancer

__all__ = ["BREAST_CANCER_NUM_CLASSES", "load_breast_cancer_tensors", "zscore"]

BREAST_CANCER_NUM_CLASSES = 2


def zscore(
    train: torch.Tensor, *others: torch.Tensor, eps: float = 1e-8
) -> tuple[torch.Tensor, ...]:
    """Z-score features with the mean and standard deviation of ``train`` only.

    Args:
        train: float tensor [N, D] whose per-column statistics are used.
        others: further tensors [M, D] (e.g. the test split) transformed with the same
            statistics, so no information leaks from them into the scaling.
        eps: added to the standard deviation (constant columns stay finite).

    Returns:
        ``(train_z, *others_z)``, same shapes and dtype as the inputs.
    """
    mean = train.mean(dim=0, keepdim=True)
    std = train.std(dim=0, unbiased=False, keepdim=True) + eps
    return tuple((t - mean) / std for t in (train, *others))


def load_breast_cancer_tensors(standardize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Load sklearn's breast cancer data as tensors.

    Args:
        standardize: z-score every feature with the mean and standard deviation of the
            *whole* data set (simple and fine for quick experiments; when a held-out split
            matters, load raw features and use :func:`zscore` with train statistics,
            as :class:`datamodules.FederatedDataModule` does).

    Returns:
        ``(x, y)``: ``x`` float32 [569, 30]; ``y`` int64 [569] (0 = malignant, 1 = benign).
    """
    bunch = load_breast_cancer()
    x = torch.as_tensor(bunch.data, dtype=torch.float32)
    if standardize:
        (x,) = zscore(x)
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    return x.contiguous(), y
