"""A LightningDataModule that splits a classification data set among simulated clients."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, Dataset, TensorDataset

from audit_callbacks.validation import (
    check_count,
    check_flag,
    check_positive,
    check_probability,
    check_seed,
)

from .breast_cancer import BREAST_CANCER_NUM_CLASSES, load_breast_cancer_tensors, zscore
from .digits import DIGITS_NUM_CLASSES, load_digits_tensors
from .partition import dirichlet_partition, iid_partition
from .vision import EMNIST_NUM_CLASSES, load_cifar10, load_emnist, load_mnist

__all__ = ["DATASETS", "FederatedDataModule", "RoundTicks"]

#: Data set names accepted by :class:`FederatedDataModule` ("custom" = tensors passed in).
DATASETS: tuple[str, ...] = ("digits", "breast_cancer", "mnist", "emnist", "cifar10", "custom")
_DOWNLOADABLE = ("mnist", "emnist", "cifar10")
_PARTITIONS = ("iid", "dirichlet")


class RoundTicks(Dataset):
    """``rounds`` items; item ``i`` is ``torch.tensor(i)`` (int64 scalar), a round clock."""

    def __init__(self, rounds: int) -> None:
        self.rounds = int(rounds)

    def __len__(self) -> int:
        return self.rounds

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.rounds:
            raise IndexError(index)
        return torch.tensor(index, dtype=torch.int64)


class FederatedDataModule(L.LightningDataModule):
    """Clients' training shards plus a held-out evaluation split.

    The training loader is only a clock: it yields ``rounds_per_epoch`` int64 scalars
    (``0, 1, ...``), one per federated round; the federated LightningModule reads the
    clients' data from :attr:`client_datasets` (``trainer.datamodule.client_datasets``).
    Validation and test loaders both iterate over the held-out split.

    Args:
        dataset: "digits" (sklearn, offline), "breast_cancer" (sklearn, offline; z-scored
            with training-split statistics), "mnist", "emnist" (split ``emnist_split``),
            "cifar10", or "custom" (implied by passing ``features``/``labels``).
        num_clients: number of clients K; at most the number of training examples.
        partition: "iid" (uniform shards, sizes differ by at most one) or "dirichlet"
            (label skew with Dirichlet(``concentration``) class proportions per client).
        concentration: Dirichlet parameter for ``partition="dirichlet"``; smaller = more skew.
        test_fraction: share held out for evaluation, stratified by label, for "digits",
            "breast_cancer" and "custom"; MNIST/EMNIST/CIFAR-10 use their official test split.
        rounds_per_epoch: training steps (= federated rounds) per Lightning epoch.
        eval_batch_size: batch size of the validation/test loaders.
        data_root: folder of the downloadable data sets (see :mod:`datamodules.vision`).
        download: fetch missing MNIST/EMNIST/CIFAR-10 files.
        seed: seed of the train/test split and of the partition, both public (logged as
            ``seed``); it drives no secret draw: ``DPFedAvg`` samples the cohorts and local
            batches from its own ``sampling_seed`` (secret by default), logged under that name,
            so the two never clash in Lightning's hparams merge.
        features: custom inputs [N, ...] (float); requires ``labels``.
        labels: custom integer labels [N].
        emnist_split: EMNIST split for ``dataset="emnist"``.
        min_client_size: smallest client allowed by the Dirichlet partition.

    Attributes set by :meth:`setup`:
        client_datasets: ``list[TensorDataset]`` of ``(x [n_k, *input_shape], y [n_k])``.
        client_indices: ``list[np.ndarray]``, each client's indices into the training split.
        train_dataset: ``TensorDataset`` of the whole training split.
        test_dataset: ``TensorDataset`` of the held-out split.
        num_classes: number of classes C (labels are in ``0..C-1``).
        input_shape: shape of one example, e.g. ``(1, 8, 8)``.
    """

    def __init__(
        self,
        dataset: str = "digits",
        num_clients: int = 100,
        partition: str = "iid",
        concentration: float = 0.5,
        test_fraction: float = 0.2,
        rounds_per_epoch: int = 10,
        eval_batch_size: int = 256,
        data_root: str | Path = "data",
        download: bool = False,
        seed: int = 0,
        features: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        emnist_split: str = "balanced",
        min_client_size: int = 1,
    ) -> None:
        super().__init__()
        if (features is None) != (labels is None):
            raise ValueError("pass both features and labels, or neither")
        if features is not None:
            if dataset not in ("digits", "custom"):
                raise ValueError(
                    f"got features/labels and dataset={dataset!r}; pass one or the other"
                )
            dataset = "custom"
            features = torch.as_tensor(features)
            labels = torch.as_tensor(labels)
            if labels.ndim != 1 or features.shape[0] != labels.shape[0]:
                raise ValueError(
                    f"features {tuple(features.shape)} and labels {tuple(labels.shape)} must "
                    "share the first dimension and labels must be one-dimensional"
                )
            if labels.dtype.is_floating_point or labels.dtype == torch.bool:
                raise ValueError(f"labels must be integers, got {labels.dtype}")
            if labels.numel() and int(labels.min()) < 0:
                raise ValueError("labels must be non-negative")
        elif dataset == "custom":
            raise ValueError('dataset="custom" needs features and labels')
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; choose from {DATASETS}")
        if partition not in _PARTITIONS:
            raise ValueError(f"unknown partition {partition!r}; choose from {_PARTITIONS}")
        num_clients = check_count(num_clients, "num_clients", minimum=1)
        if partition == "dirichlet":
            concentration = check_positive(concentration, "concentration")
        test_fraction = check_probability(test_fraction, "test_fraction")
        rounds_per_epoch = check_count(rounds_per_epoch, "rounds_per_epoch", minimum=1)
        eval_batch_size = check_count(eval_batch_size, "eval_batch_size", minimum=1)
        download = check_flag(download, "download")
        seed = check_seed(seed, "seed")
        min_client_size = check_count(min_client_size, "min_client_size", minimum=0)
        if dataset == "emnist" and emnist_split not in EMNIST_NUM_CLASSES:
            raise ValueError(f"unknown EMNIST split {emnist_split!r}")
        self.save_hyperparameters(ignore=["features", "labels"])

        self.dataset = dataset
        self.num_clients = int(num_clients)
        self.partition = partition
        self.concentration = float(concentration)
        self.test_fraction = float(test_fraction)
        self.rounds_per_epoch = int(rounds_per_epoch)
        self.eval_batch_size = int(eval_batch_size)
        self.data_root = Path(data_root)
        self.download = bool(download)
        self.seed = int(seed)
        self.emnist_split = emnist_split
        self.min_client_size = int(min_client_size)
        self._features = features
        self._labels = labels

        self.client_datasets: list[TensorDataset] = []
        self.client_indices: list[np.ndarray] = []
        self.train_dataset: TensorDataset | None = None
        self.test_dataset: TensorDataset | None = None
        self.num_classes: int | None = None
        self.input_shape: tuple[int, ...] | None = None

    # ---------------------------------------------------------------- loading
    def prepare_data(self) -> None:
        """Download MNIST/EMNIST/CIFAR-10 if ``download=True`` (Lightning runs this once)."""
        if self.download and self.dataset in _DOWNLOADABLE:
            for train in (True, False):
                self._load_official(train)

    def _load_official(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dataset == "mnist":
            return load_mnist(self.data_root, train=train, download=self.download)
        if self.dataset == "emnist":
            return load_emnist(
                self.data_root, split=self.emnist_split, train=train, download=self.download
            )
        return load_cifar10(self.data_root, train=train, download=self.download)

    def _split(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stratified train/test split (plain random split if a class has < 2 members)."""
        counts = torch.bincount(y)
        stratify = y.numpy() if int(counts[counts > 0].min()) >= 2 else None
        train_idx, test_idx = train_test_split(
            np.arange(y.shape[0]),
            test_size=self.test_fraction,
            random_state=self.seed,
            stratify=stratify,
        )
        train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
        return x[train_idx], y[train_idx], x[test_idx], y[test_idx]

    def setup(self, stage: str | None = None) -> None:
        """Load the data, split off the test set, and partition the training split.

        Idempotent: a second call (e.g. for another ``stage``) does nothing.
        """
        if self.train_dataset is not None:
            return
        if self.dataset in _DOWNLOADABLE:
            x_train, y_train = self._load_official(True)
            x_test, y_test = self._load_official(False)
            num_classes = {
                "mnist": 10,
                "cifar10": 10,
                "emnist": EMNIST_NUM_CLASSES[self.emnist_split],
            }[self.dataset]
        elif self.dataset == "digits":
            x, y = load_digits_tensors()
            x_train, y_train, x_test, y_test = self._split(x, y)
            num_classes = DIGITS_NUM_CLASSES
        elif self.dataset == "breast_cancer":
            x, y = load_breast_cancer_tensors(standardize=False)
            x_train, y_train, x_test, y_test = self._split(x, y)
            x_train, x_test = zscore(x_train, x_test)
            num_classes = BREAST_CANCER_NUM_CLASSES
        else:
            assert self._features is not None and self._labels is not None
            x = self._features.float() if not self._features.is_floating_point() else self._features
            y = self._labels.long()
            x_train, y_train, x_test, y_test = self._split(x, y)
            num_classes = int(y.max()) + 1

        n_train = int(y_train.shape[0])
        if self.num_clients > n_train:
            raise ValueError(
                f"num_clients={self.num_clients} is larger than the number of training "
                f"examples ({n_train}) of dataset {self.dataset!r}; every client needs at "
                "least one example"
            )
        if self.partition == "iid":
            parts = iid_partition(n_train, self.num_clients, seed=self.seed)
        else:
            parts = dirichlet_partition(
                y_train.numpy(),
                self.num_clients,
                self.concentration,
                seed=self.seed,
                min_size=self.min_client_size,
            )

        self.num_classes = num_classes
        self.input_shape = tuple(int(s) for s in x_train.shape[1:])
        self.client_indices = parts
        self.client_datasets = [
            TensorDataset(x_train[torch.from_numpy(idx)], y_train[torch.from_numpy(idx)])
            for idx in parts
        ]
        self.train_dataset = TensorDataset(x_train, y_train)
        self.test_dataset = TensorDataset(x_test, y_test)

    # ---------------------------------------------------------------- loaders
    @property
    def client_sizes(self) -> list[int]:
        """Number of training examples of each client (after :meth:`setup`)."""
        return [len(d) for d in self.client_datasets]

    def train_dataloader(self) -> DataLoader:
        """``rounds_per_epoch`` batches, each an int64 scalar tensor (the round index)."""
        return DataLoader(RoundTicks(self.rounds_per_epoch), batch_size=None, shuffle=False)

    def _eval_loader(self) -> DataLoader:
        if self.test_dataset is None:
            raise RuntimeError("call setup() before asking for evaluation loaders")
        return DataLoader(self.test_dataset, batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        """Held-out split in batches ``(x [b, *input_shape], y [b])``."""
        return self._eval_loader()

    def test_dataloader(self) -> DataLoader:
        """Same as :meth:`val_dataloader` (the held-out split)."""
        return self._eval_loader()
