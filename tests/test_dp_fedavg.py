import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.federated import DPFedAvg


class Ticks(pl.LightningDataModule):
    """Minimal federated datamodule: clients and a round clock."""

    def __init__(self, clients, rounds_per_epoch=5, num_classes=3):
        super().__init__()
        self.client_datasets = clients
        self.rounds_per_epoch = rounds_per_epoch
        self.num_classes = num_classes

    def train_dataloader(self):
        return DataLoader(list(range(self.rounds_per_epoch)), batch_size=None)


def make_clients(n_clients=6, n=12, p=4, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [TensorDataset(torch.randn(n, p, generator=g), torch.randint(0, classes, (n,), generator=g))
            for _ in range(n_clients)]


def trainer(steps, callbacks=(), **kw):
    return pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
                      accelerator="cpu", **kw)


def test_one_round_equals_manual_fedavg():
    torch.manual_seed(0)
    clients = make_clients(n_clients=3)
    model = nn.Linear(4, 3)
    theta0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    module = DPFedAvg(model, clients_per_round=3, noise_multiplier=0.0, clip_norm=1e6,
                      local_epochs=1, local_lr=0.1, local_batch_size=100, server_lr=1.0,
                      server_momentum=0.0, sampling="uniform")
    trainer(1).fit(module, datamodule=Ticks(clients))
    # manual: every client takes one full-batch gradient step from theta0
    expected = torch.zeros_like(theta0)
    for ds in clients:
        ref = nn.Linear(4, 3)
        torch.nn.utils.vector_to_parameters(theta0, ref.parameters())
        loss = nn.functional.cross_entropy(ref(ds.tensors[0]), ds.tensors[1])
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        expected += -0.1 * torch.cat([g.reshape(-1) for g in grads])
    theta1 = module.flat_parameters()
    assert torch.allclose(theta1 - theta0, expected / 3, atol=1e-6)
    assert module.round == 1


def test_clipping_bounds_the_model_delta():
    clients = make_clients(n_clients=4)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.0, clip_norm=1e-3,
                      local_lr=1.0, server_lr=1.0, server_momentum=0.0)
    seen = []

    class Spy(pl.Callback):
        def on_federated_client_updates(self, trainer, pl_module, round_idx, ids, updates):
            seen.append(torch.linalg.vector_norm(updates, dim=1))

        def on_federated_round_end(self, trainer, pl_module, round_idx, delta):
            seen.append(torch.linalg.vector_norm(delta))

    trainer(1, [Spy()]).fit(module, datamodule=Ticks(clients))
    assert torch.all(seen[0] <= 1e-3 * (1 + 1e-5))
    assert seen[1] <= 1e-3 * (1 + 1e-5)  # average of 4 clipped updates


def test_noise_scale_is_z_c_over_m():
    # local_lr = 0: every update is zero, so the model delta is pure noise N(0, (zC/m)^2)
    clients = make_clients(n_clients=5)
    model = nn.Linear(200, 100)
    clients = [TensorDataset(torch.randn(4, 200), torch.randint(0, 3, (4,))) for _ in range(5)]
    module = DPFedAvg(model, clients_per_round=5, noise_multiplier=2.0, clip_norm=0.5,
                      local_lr=0.0, server_lr=1.0, server_momentum=0.0)
    deltas = []

    class Spy(pl.Callback):
        def on_federated_round_end(self, trainer, pl_module, round_idx, delta):
            deltas.append(delta.clone())

    trainer(1, [Spy()]).fit(module, datamodule=Ticks(clients))
    sd = deltas[0].std().item()
    expected = 2.0 * 0.5 / 5
    # d = 20100 draws: relative sd of the sample sd is about 1/sqrt(2d) = 0.5%
    assert sd == pytest.approx(expected, rel=0.03)


class Virtual(pl.Callback):
    def __init__(self, count, schedule=None):
        self.count, self.schedule = count, schedule
        self.calls = []
        self.cohorts = []

    def setup(self, trainer, pl_module, stage):
        pl_module.register_virtual_clients(self, self.count, name="v", schedule=self.schedule)

    def federated_client_update(self, trainer, pl_module, index, round_idx, clip_norm):
        self.calls.append((index, round_idx))
        return torch.ones(pl_module.num_parameters) * 10.0  # clipped by the module

    def on_federated_round_start(self, trainer, pl_module, round_idx, cohort):
        self.cohorts.append(cohort)

    def on_federated_client_updates(self, trainer, pl_module, round_idx, ids, updates):
        assert updates.shape == (len(ids), pl_module.num_parameters)
        assert torch.all(torch.linalg.vector_norm(updates, dim=1) <= pl_module.clip_norm * (1 + 1e-5))


def test_virtual_clients_are_sampled_like_real_ones():
    clients = make_clients(n_clients=10)
    cb = Virtual(10)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=1.0, sampling="uniform")
    trainer(300, [cb]).fit(module, datamodule=Ticks(clients))
    part = module.participations()
    assert part.shape == (20,) and part.sum() == 300 * 4
    # real and virtual clients have the same inclusion probability 4/20
    real, virt = part[:10].mean(), part[10:].mean()
    assert abs(real - virt) < 4 * math.sqrt(300 * 0.2 * 0.8 / 10)
    assert len(cb.calls) == part[10:].sum()
    assert all(c.size == 4 and c.divisor == 4 for c in cb.cohorts)


def test_scheduled_virtual_clients_join_their_rounds():
    clients = make_clients(n_clients=5)
    cb = Virtual(2, schedule=lambda r: [0, 1] if r % 2 == 0 else [])
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=2, noise_multiplier=1.0)
    trainer(6, [cb]).fit(module, datamodule=Ticks(clients))
    assert sorted(cb.calls) == sorted((j, r) for r in (2, 4, 6) for j in (0, 1))
    assert [c.size for c in cb.cohorts] == [2, 4, 2, 4, 2, 4]


def test_analytic_epsilon_uses_participations():
    clients = make_clients(n_clients=4)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.8, delta=1e-5,
                      sampling="shuffle")
    trainer(3).fit(module, datamodule=Ticks(clients))
    assert module.participations().tolist() == [3, 3, 3, 3]
    assert module.analytic_epsilon() == pytest.approx(gaussian_epsilon(0.8, 1e-5, compositions=3))
    assert DPFedAvg(nn.Linear(2, 2), noise_multiplier=0.0).analytic_epsilon(3) == math.inf


def test_lightning_module_as_client_model():
    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 3)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("inner", loss)
            return {"loss": loss}

    module = DPFedAvg(Lit(), clients_per_round=2, noise_multiplier=0.0, clip_norm=10.0)
    before = module.flat_parameters()
    trainer(2).fit(module, datamodule=Ticks(make_clients(3)))
    assert not torch.equal(before, module.flat_parameters())


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="smaller than the cohort"):
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=5)
        trainer(1).fit(module, datamodule=Ticks(make_clients(3)))
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPFedAvg(nn.Linear(4, 3), noise_multiplier=-1)
    with pytest.raises(ValueError, match="clip_norm"):
        DPFedAvg(nn.Linear(4, 3), clip_norm=0)
    bad = [TensorDataset(torch.full((4, 4), float("nan")), torch.zeros(4, dtype=torch.long))]
    with pytest.raises(ValueError, match="non-finite update"):
        trainer(1).fit(DPFedAvg(nn.Linear(4, 3), clients_per_round=1), datamodule=Ticks(bad))


def test_seeded_runs_are_reproducible():
    def run():
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=2, noise_multiplier=0.5, seed=7,
                          reproducible_noise=True)
        trainer(4).fit(module, datamodule=Ticks(make_clients(5)))
        return module.flat_parameters()

    assert torch.equal(run(), run())
    assert np.isfinite(run().numpy()).all()


def test_local_randomizer_plugin_is_debiased_by_the_server():
    class Doubler:
        """Releases 2x; the server's debias halves it, so training equals the plain run."""

        def __init__(self):
            self.released = []

        def randomize(self, x, generator=None):
            assert isinstance(generator, torch.Generator)
            return 2 * x

        def debias(self, y):
            return y / 2

    class Spy(pl.Callback):
        def __init__(self):
            self.rows = []

        def on_federated_randomized_updates(self, trainer, pl_module, round_idx, ids, released):
            self.rows.append(released.shape)

    def run(randomizer, callbacks=()):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=2, noise_multiplier=0.0, seed=1,
                          randomizer=randomizer)
        trainer(3, callbacks).fit(module, datamodule=Ticks(make_clients(4)))
        return module.flat_parameters()

    spy = Spy()
    assert torch.allclose(run(Doubler(), [spy]), run(None), atol=1e-6)
    assert spy.rows == [torch.Size([2, 15])] * 3
    with pytest.raises(TypeError, match="randomizer"):
        DPFedAvg(nn.Linear(4, 3), randomizer=object())


class SumOwner(pl.Callback):
    """Virtual clients whose update is 10 * ones; gives rows, or with ``sums`` their clipped sum."""

    def __init__(self, count, sums=True, value=10.0, size=None):
        self.count, self.value, self.size = count, value, size
        self.given = {"sum": 0, "rows": 0}
        if not sums:
            self.federated_client_update_sum = None

    def setup(self, trainer, pl_module, stage):
        pl_module.register_virtual_clients(self, self.count, name="v")

    def federated_client_updates(self, trainer, pl_module, indices, round_idx, clip_norm, out):
        self.given["rows"] += 1
        out.fill_(self.value)

    def federated_client_update_sum(self, trainer, pl_module, indices, round_idx, clip_norm):
        from audit_callbacks.federated.clipping import clip_updates_

        self.given["sum"] += 1
        rows = torch.full((len(indices), self.size or pl_module.num_parameters), self.value)
        clip_updates_(rows, clip_norm)
        return rows.sum(0)


def test_an_owner_may_give_the_sum_of_its_clipped_updates():
    def run(owner, *more):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.5, seed=3,
                          reproducible_noise=True)
        trainer(8, [owner, *more]).fit(module, datamodule=Ticks(make_clients(6)))
        return module.flat_parameters()

    by_sum, by_rows = SumOwner(6), SumOwner(6, sums=False)
    assert torch.equal(run(by_sum), run(by_rows))
    assert by_sum.given["sum"] > 0 and by_sum.given["rows"] == 0 and by_rows.given["sum"] == 0

    class Observer(pl.Callback):  # needs the rows: the owner is asked for rows, same model
        def on_federated_client_updates(self, trainer, pl_module, round_idx, ids, updates):
            pass

    observed = SumOwner(6)
    assert torch.equal(run(observed, Observer()), run(by_rows))
    assert observed.given["sum"] == 0 and observed.given["rows"] > 0

    for bad in (SumOwner(6, value=float("nan")), SumOwner(6, size=5)):
        with pytest.raises(ValueError, match="not a finite vector of 15 entries"):
            run(bad)


def test_canary_sums_follow_a_float64_model(tmp_path):
    # a model converted to float64 before it is wrapped: Lightning's pl_module.dtype still says
    # float32, but the update rows are float64; CanaryAudit's sums must be float64 too (the
    # same bits as its rows, which the module clips in float64)
    from audit_callbacks.callbacks import CanaryAudit

    class Rows(CanaryAudit):
        federated_client_update_sum = None

    clients = [TensorDataset(ds.tensors[0].double(), ds.tensors[1]) for ds in make_clients(n_clients=8)]
    models = {}
    for cls in (CanaryAudit, Rows):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3).double(), clients_per_round=4, noise_multiplier=0.5, seed=1,
                          reproducible_noise=True)
        assert module.dtype == torch.float32 and module.flat_parameters().dtype == torch.float64
        audit = cls(num_canaries=6, log_figures=False, log_histograms=False)
        trainer(6, [audit], default_root_dir=str(tmp_path / cls.__name__)).fit(module, datamodule=Ticks(clients))
        assert audit.participations.sum() > 0
        models[cls.__name__] = module.flat_parameters()
    assert torch.equal(models["CanaryAudit"], models["Rows"])
