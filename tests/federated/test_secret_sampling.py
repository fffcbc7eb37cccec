"""Secret sampling by default: nobody holding a run's logs or checkpoint replays its batches or
cohorts; the reproducible mode replays exactly and says so in the hyper-parameters it logs.

An attacker's candidates: every integer in the datamodule's and module's hparams, the logged
``hparams.yaml``, the checkpoint's federated state, and every seed below 256 (the constant
defaults a library might use). The positive controls (reproducible mode) show that the replay
code finds the seed when there is one to find.
"""

from __future__ import annotations

import os
import warnings

import lightning.pytorch as pl
import numpy as np
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader

from audit_callbacks.federated import CohortSampler, DPFedAvg, FederatedAuditHooks
from audit_callbacks.federated.sampling import SECRET_SAMPLING, sampling_mark
from datamodules import FederatedDataModule
from datamodules.central import CentralDataModule
from models import MLP

MARK = "the claim assumes secret batches and does not hold for anyone holding the logs"


def _integers(obj, out=None):
    """Every integer (and integral float) anywhere inside ``obj`` (dicts, lists, tensors)."""
    out = set() if out is None else out
    if isinstance(obj, bool):
        return out
    if isinstance(obj, int | np.integer):
        if 0 <= int(obj) < 2**63:
            out.add(int(obj))
    elif isinstance(obj, float) and obj.is_integer() and 0 <= obj < 2**63:
        out.add(int(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _integers(k, out)
            _integers(v, out)
    elif isinstance(obj, list | tuple | set):
        for v in obj:
            _integers(v, out)
    elif isinstance(obj, torch.Tensor) and obj.numel() < 10_000 and not obj.is_floating_point():
        _integers(obj.flatten().tolist(), out)
    elif isinstance(obj, str):
        for word in obj.replace(":", " ").split():
            if word.isdigit():
                out.add(int(word))
    return out


# ------------------------------------------------------------------ central (DP-SGD) batches
def _batches(loader):
    return [x.clone() for x, _ in loader]


def _replay_central(dm: CentralDataModule, seed: int):
    """The loader CentralDataModule builds, with its generator seeded from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    base = DataLoader(dm.train_set, batch_size=dm.batch_size, shuffle=False, generator=gen)
    return _batches(DPDataLoader.from_data_loader(base, generator=gen))


def _same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_central_batches_replay_from_no_logged_integer_by_default():
    dm = CentralDataModule("breast_cancer", batch_size=64)  # every default
    dm.setup("fit")
    seen = _batches(dm.train_dataloader())
    candidates = _integers(dict(dm.hparams_initial)) | _integers(
        {k: v for k, v in vars(dm).items() if not k.startswith("_")}) | set(range(256))
    assert 0 in candidates and dm.seed in candidates
    assert [n for n in candidates if _same(_replay_central(dm, n), seen)] == []
    assert dm.hparams_initial["batch_sampling"] == SECRET_SAMPLING
    assert dm.hparams_initial["sampling_seed"] is None
    # a fresh secret generator for every loader (and so after a resume): other batches
    assert not _same(_batches(dm.train_dataloader()), seen)


def test_central_reproducible_mode_replays_exactly_and_is_marked():
    dm = CentralDataModule("breast_cancer", batch_size=64, seed=3, sampling_seed=11)
    dm.setup("fit")
    seen = _batches(dm.train_dataloader())
    assert _same(_replay_central(dm, 11), seen)
    assert _same(_batches(dm.train_dataloader()), seen)
    mark = dm.hparams_initial["batch_sampling"]
    assert mark == sampling_mark(11)
    assert mark == f"reproducible from seed 11: {MARK}"
    # the public split seed drives the split only: another split seed, the same batch indices
    other = CentralDataModule("breast_cancer", batch_size=64, seed=4, sampling_seed=11)
    other.setup("fit")
    sizes = [len(b) for b in seen]
    assert [len(b) for b in _batches(other.train_dataloader())] == sizes


# ------------------------------------------------------------------ DP-FedAvg cohorts
class _Cohorts(FederatedAuditHooks, pl.Callback):
    def __init__(self):
        self.cohorts = []

    def on_federated_round_start(self, trainer, pl_module, fl_round):
        self.cohorts.append(fl_round.cohort.population_ids.copy())


def _fedavg_run(tmp_path, steps=6, **kwargs):
    dm = FederatedDataModule("digits", num_clients=30, rounds_per_epoch=3, seed=0)
    module = DPFedAvg(MLP(64, 10, hidden=(8,)), clients_per_round=5, noise_multiplier=1.0,
                      local_batch_size=16, sampling="uniform", **kwargs)
    tap = _Cohorts()
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, logger=CSVLogger(str(tmp_path), name="run", version=0),
                         callbacks=[tap, ckpt], accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    with open(os.path.join(str(tmp_path), "run", "version_0", "hparams.yaml"), encoding="utf-8") as fh:
        hparams = yaml.safe_load(fh)
    state = torch.load(str(tmp_path / "ckpt" / "last.ckpt"), weights_only=False)["dp_fedavg"]
    return module, tap.cohorts, hparams, state


def _replay_cohorts(n, population, m, rounds):
    sampler = CohortSampler(population, m, "uniform", seed=n)
    return [sampler.sample() for _ in range(rounds)]


def _matches(replayed, seen):
    return sum(np.array_equal(a, b) for a, b in zip(replayed, seen, strict=True))


def test_fedavg_cohorts_replay_from_no_logged_integer_or_checkpoint_by_default(tmp_path):
    module, seen, hparams, state = _fedavg_run(tmp_path)
    assert len(seen) == 6
    candidates = (_integers(hparams) | _integers(dict(module.hparams_initial)) | _integers(state)
                  | set(range(256)))
    assert 0 in candidates and 30 in candidates
    hits = [n for n in candidates if _matches(_replay_cohorts(n, 30, 5, 6), seen) > 1]
    assert hits == []
    assert hparams["cohort_sampling"] == SECRET_SAMPLING and hparams["sampling_seed"] is None
    assert "seed" not in module.hparams_initial
    # the checkpoint holds no generator that would predict the next cohorts
    assert "rng" not in state["sampler"] and "queue" not in state["sampler"]
    assert "local_gen" not in state and "noise_gen" not in state


def test_fedavg_secret_sampling_resumes_with_fresh_draws(tmp_path):
    module, seen, _, _ = _fedavg_run(tmp_path / "a", steps=3)
    dm = FederatedDataModule("digits", num_clients=30, rounds_per_epoch=3, seed=0)
    resumed = DPFedAvg(MLP(64, 10, hidden=(8,)), clients_per_round=5, noise_multiplier=1.0,
                       local_batch_size=16, sampling="uniform")
    tap = _Cohorts()
    trainer = pl.Trainer(max_steps=6, max_epochs=-1, logger=False, callbacks=[tap], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(resumed, datamodule=dm, ckpt_path=str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    assert resumed.round == 6 and len(tap.cohorts) == 3
    assert int(resumed.participations().sum()) == 6 * 5  # 3 restored rounds + 3 new ones
    assert all(c.size == 5 for c in tap.cohorts)


def test_fedavg_reproducible_mode_replays_exactly_and_is_marked(tmp_path):
    module, seen, hparams, state = _fedavg_run(tmp_path, sampling_seed=17)
    assert _matches(_replay_cohorts(17, 30, 5, 6), seen) == 6
    assert hparams["cohort_sampling"] == f"reproducible from seed 17: {MARK}"
    assert hparams["sampling_seed"] == 17
    assert "rng" in state["sampler"] and "local_gen" in state
    # the former argument name means the same
    assert DPFedAvg(MLP(64, 10), seed=17).hparams_initial["cohort_sampling"] == hparams["cohort_sampling"]
    # reproducible noise is a reproducible run throughout (sampling from seed 0 if none given)
    assert DPFedAvg(MLP(64, 10), reproducible_noise=True).hparams_initial["sampling_seed"] == 0


def test_cohort_sampler_is_secret_without_a_seed():
    a, b = CohortSampler(100, 10), CohortSampler(100, 10)
    assert not all(np.array_equal(a.sample(), b.sample()) for _ in range(3))
    assert "rng" not in a.state_dict() and not a.reproducible
    seeded = CohortSampler(100, 10, seed=4)
    copy = CohortSampler(100, 10, seed=99)
    copy.load_state_dict(seeded.state_dict())
    assert np.array_equal(copy.sample(), seeded.sample())
    fresh = CohortSampler(100, 10)
    fresh.load_state_dict(seeded.state_dict())  # a secret sampler keeps its own generator
    assert not fresh.reproducible
