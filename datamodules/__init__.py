"""Data loading for the examples and tests: offline sklearn data sets, MNIST/EMNIST/CIFAR-10
download-and-parse, client partitions and a federated LightningDataModule.

Not part of the ``audit_callbacks`` library, which never imports this package.
"""

from .breast_cancer import BREAST_CANCER_NUM_CLASSES, load_breast_cancer_tensors, zscore
from .digits import DIGITS_NUM_CLASSES, load_digits_tensors
from .federated import DATASETS, FederatedDataModule, RoundTicks
from .partition import dirichlet_partition, iid_partition, label_entropy
from .vision import (
    EMNIST_NUM_CLASSES,
    EMNIST_SPLITS,
    RESOURCES,
    ChecksumError,
    DownloadError,
    RemoteSource,
    download_url,
    load_cifar10,
    load_emnist,
    load_mnist,
    md5sum,
    read_idx,
)

__all__ = [
    "BREAST_CANCER_NUM_CLASSES",
    "DATASETS",
    "DIGITS_NUM_CLASSES",
    "EMNIST_NUM_CLASSES",
    "EMNIST_SPLITS",
    "RESOURCES",
    "ChecksumError",
    "DownloadError",
    "FederatedDataModule",
    "RemoteSource",
    "RoundTicks",
    "dirichlet_partition",
    "download_url",
    "iid_partition",
    "label_entropy",
    "load_breast_cancer_tensors",
    "load_cifar10",
    "load_digits_tensors",
    "load_emnist",
    "load_mnist",
    "md5sum",
    "read_idx",
    "zscore",
]
