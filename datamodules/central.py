"""A LightningDataModule for central (non-federated) training on the offline sklearn data sets."""

from __future__ import annotations

import lightning as L
import torch
from opacus.data_loader import DPDataLoader
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.federated.sampling import entropy_seed, sampling_mark
from audit_callbacks.validation import check_count, check_flag, check_probability, check_seed

from .breast_cancer import BREAST_CANCER_NUM_CLASSES, load_breast_cancer_tensors, zscore
from .digits import DIGITS_NUM_CLASSES, load_digits_tensors

__all__ = ["CentralDataModule"]

_SETS = {"breast_cancer": BREAST_CANCER_NUM_CLASSES, "digits": DIGITS_NUM_CLASSES}


class CentralDataModule(L.LightningDataModule):
    """Train/validation split of breast cancer (569 x 30, binary) or digits (1797 x 64, 10 classes).

    Features are z-scored with training-split statistics; the split is stratified and seeded.

    The split is public (its ``seed`` is logged); the training batches are secret by default:
    their generator is seeded from OS entropy, a fresh one for every ``train_dataloader()``
    (and so after a resume: Poisson batches are i.i.d. across steps, so a resumed run samples
    from the same law), never logged and never checkpointed. DP-SGD's accountant amplifies by
    this secrecy. ``sampling_seed=N`` makes the batches reproducible (tests, debugging) and
    the hyper-parameters Lightning logs say so: ``batch_sampling: "reproducible from seed N:
    the claim assumes secret batches and does not hold for anyone holding the logs"``.

    Args:
        dataset: "breast_cancer" or "digits".
        batch_size: the (expected) training batch size.
        poisson: if True the training loader is Opacus' ``DPDataLoader`` (Poisson sampling with
            rate ``batch_size / N``, the sampling DP-SGD's accountant assumes); else a shuffled
            (``shuffle=True``) or ordered loader of fixed-size batches.
        shuffle: shuffle the fixed-size batches (``poisson=False`` only).
        val_fraction: share held out for validation.
        seed: the (public) seed of the train/validation split; it never drives the batches.
        eval_batch_size: batch size of the validation loader.
        sampling_seed: None (default): secret batches; an integer: reproducible batches from it
            (the claim then does not hold for anyone holding the logs, see above).
    """

    def __init__(
        self, dataset: str = "breast_cancer", *, batch_size: int = 64, poisson: bool = True,
        shuffle: bool = True, val_fraction: float = 0.2, seed: int = 0, eval_batch_size: int = 512,
        sampling_seed: int | None = None,
    ) -> None:
        super().__init__()
        if dataset not in _SETS:
            raise ValueError(f"dataset must be one of {sorted(_SETS)}, got {dataset!r}")
        self.dataset = dataset
        self.num_classes = _SETS[dataset]
        self.batch_size = check_count(batch_size, "batch_size", minimum=1)
        self.poisson = check_flag(poisson, "poisson")
        self.shuffle = check_flag(shuffle, "shuffle")
        self.val_fraction = check_probability(val_fraction, "val_fraction")
        self.seed = check_seed(seed, "seed")
        self.eval_batch_size = check_count(eval_batch_size, "eval_batch_size", minimum=1)
        self.sampling_seed = None if sampling_seed is None else check_seed(sampling_seed, "sampling_seed")
        # what Lightning logs (hparams.yaml, checkpoints): the split and the sampling's mode; the
        # batch size stays out (the audits' summaries carry the sampling rate, and a key named
        # batch_size is what the artifact scan looks for as a per-step record)
        self.save_hyperparameters({
            "dataset": dataset, "poisson": self.poisson, "shuffle": self.shuffle,
            "val_fraction": self.val_fraction, "seed": self.seed, "sampling_seed": self.sampling_seed,
            "batch_sampling": sampling_mark(self.sampling_seed),
        })
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    @property
    def num_features(self) -> int:
        return 30 if self.dataset == "breast_cancer" else 64

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.dataset == "breast_cancer":
            x, y = load_breast_cancer_tensors(standardize=False)
        else:
            x, y = load_digits_tensors(flatten=True)
        idx = torch.arange(len(y))
        tr, va = train_test_split(idx.numpy(), test_size=self.val_fraction, stratify=y.numpy(),
                                  random_state=self.seed)
        x_tr, x_va = zscore(x[tr], x[va])
        self.train_set = TensorDataset(x_tr, y[tr])
        self.val_set = TensorDataset(x_va, y[va])

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None
        gen = torch.Generator().manual_seed(
            entropy_seed() % 2**63 if self.sampling_seed is None else self.sampling_seed
        )
        base = DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle and not self.poisson,
                          generator=gen)
        if self.poisson:
            return DPDataLoader.from_data_loader(base, generator=gen)
        return base

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        return DataLoader(self.val_set, batch_size=self.eval_batch_size)
