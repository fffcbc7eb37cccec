"""The shipped examples' batches and cohorts replay from no integer of their artifacts: every
integer of the summaries and ``hparams.yaml`` an example writes (and small offsets of it), tried
as the seed of the same draws, regenerates none of the DP-SGD example's Poisson batches and
none of the DP-FedAvg example's cohorts. Positive controls: the documented reproducible mode
(``sampling_seed``) replays from the seed its artifacts log. The examples' DP noise has its own
test (tests/examples/test_noise_replay.py)."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import pytest
import torch
import yaml
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from audit_callbacks.federated.sampling import CohortSampler
from datamodules.central import CentralDataModule
from tests.examples.test_noise_replay import _example, _ints

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


class BatchTap:
    """Every Poisson batch Opacus' sampler draws, per sampler: ``(num_samples, rate, indices)``
    (``num_samples`` includes the audit's canaries where they ride on the sampler, so a replay
    gets the most favourable setting)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_sampler: dict[int, list[tuple[int, float, list[int]]]] = {}
        original = UniformWithReplacementSampler.__iter__

        def tapped(sampler):
            for batch in original(sampler):
                self.by_sampler.setdefault(id(sampler), []).append(
                    (int(sampler.num_samples), float(sampler.sample_rate), list(batch)))
                yield batch

        monkeypatch.setattr(UniformWithReplacementSampler, "__iter__", tapped)


def _batches_replayed(batches, seed: int) -> int:
    """How many of one sampler's ``batches`` a generator seeded with ``seed`` redraws (Opacus'
    draw: ``torch.rand(num_samples) < rate``, in order), with or without the one int64 a
    ``DataLoader`` iterator first takes from the loader's generator (its worker base seed)."""
    return max(_redrawn(batches, seed, base_seed) for base_seed in (False, True))


def _redrawn(batches, seed: int, base_seed: bool) -> int:
    gen = torch.Generator().manual_seed(seed)
    if base_seed:
        torch.empty((), dtype=torch.int64).random_(generator=gen)
    hits = 0
    for n, rate, indices in batches:
        mask = torch.rand(n, generator=gen) < rate
        hits += mask.nonzero(as_tuple=False).reshape(-1).tolist() == indices
    return hits


def _artifact_ints(folder: str, summaries=()) -> set[int]:
    seeds: set[int] = set()
    paths = list(summaries) + glob.glob(os.path.join(folder, "**", "*.json"), recursive=True)
    for path in sorted(set(paths)):
        with open(path, encoding="utf-8") as fh:
            _ints(json.load(fh), seeds)
    for path in glob.glob(os.path.join(folder, "**", "hparams.yaml"), recursive=True):
        with open(path, encoding="utf-8") as fh:
            _ints(yaml.safe_load(fh), seeds)
    return {s + off for s in seeds for off in range(4) if 0 <= s + off < 2**63}


def _best(groups, seeds) -> int:
    return max((_batches_replayed(batches, s) for batches in groups for s in seeds), default=0)


def test_the_dpsgd_examples_batches_replay_from_no_integer_of_its_artifacts(tmp_path, monkeypatch):
    example = _example()
    tap = BatchTap(monkeypatch)
    args = example.parse_args(["--quick", "--out", str(tmp_path)])
    run = example.audited_run(args)
    groups = list(tap.by_sampler.values())
    assert sum(len(g) for g in groups) >= 3
    seeds = _artifact_ints(str(tmp_path), run["summaries"])
    assert args.seed in seeds  # the split's and canaries' seed is logged, by design
    assert _best(groups, seeds) == 0
    with open(run["summaries"][0], encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["inputs"]["claim_sampling"].startswith("secret Poisson batches")


def test_positive_control_reproducible_batches_replay_from_their_logged_seed(monkeypatch):
    tap = BatchTap(monkeypatch)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0, sampling_seed=11)
    dm.setup("fit")
    for _, _ in zip(range(5), dm.train_dataloader(), strict=False):
        pass
    (batches,) = tap.by_sampler.values()
    seeds = _ints(dict(dm.hparams), set())
    assert _best([batches], seeds) == len(batches) == 5


def _federated(tmp_path, monkeypatch, *extra):
    spec = importlib.util.spec_from_file_location("federated_canary_audit_replay",
                                                  os.path.join(EXAMPLES, "federated_canary_audit.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cohorts: list[tuple[int, int, str, list[int]]] = []
    original = CohortSampler.sample

    def tapped(self):
        ids = original(self)
        cohorts.append((self.population, self.cohort_size, self.rule, ids.tolist()))
        return ids

    monkeypatch.setattr(CohortSampler, "sample", tapped)
    summary = module.main(["--rounds", "6", "--rounds-per-epoch", "3", "--clients", "40",
                           "--clients-per-round", "5", "--model", "mlp", "--canaries", "10",
                           "--log-dir", str(tmp_path), *extra])
    monkeypatch.undo()  # the replays below sample unobserved
    return cohorts, summary


def _cohorts_replayed(cohorts, seed: int) -> int:
    population, m, rule, _ = cohorts[0]
    sampler = CohortSampler(population, m, rule, seed=seed)
    return sum(sampler.sample().tolist() == ids for _, _, _, ids in cohorts)


def test_the_federated_examples_cohorts_replay_from_no_integer_of_its_artifacts(tmp_path, monkeypatch):
    cohorts, summary = _federated(tmp_path, monkeypatch)
    assert len(cohorts) >= 6
    seeds = _artifact_ints(str(tmp_path))
    assert 0 in seeds  # --seed 0: the partition's and canaries' seed is logged, by design
    assert max(_cohorts_replayed(cohorts, s) for s in seeds) == 0
    assert summary["inputs"]["claim_sampling"].startswith("known rounds:")
    assert "secret: drawn from OS entropy" in summary["inputs"]["claim_sampling"]


def test_positive_control_reproducible_cohorts_replay_from_their_logged_seed():
    from audit_callbacks.federated import DPFedAvg
    from models import MLP

    module = DPFedAvg(MLP(64, 10), clients_per_round=5, sampling="shuffle", sampling_seed=9)
    seeds = _ints(dict(module.hparams_initial), set())
    sampler = CohortSampler(50, 5, "shuffle", seed=9)
    cohorts = [(50, 5, "shuffle", sampler.sample().tolist()) for _ in range(6)]
    assert max(_cohorts_replayed(cohorts, s) for s in seeds) == 6


def test_the_flower_example_seeds_no_global_generator():
    """examples/flower_canary_audit.py: Flower's FedAvg draws its cohorts from Python's
    ``random`` and the DP wrapper its noise from numpy's global generator, both seeded from OS
    entropy at start-up; the example must seed neither (nor draw the clients' local batches from
    a logged integer)."""
    with open(os.path.join(EXAMPLES, "flower_canary_audit.py"), encoding="utf-8") as fh:
        code = fh.read()
    for call in ("random.seed(", "np.random.seed(", "numpy.random.seed("):
        assert call not in code, call
    assert "os.urandom" in code  # the clients' local batches
