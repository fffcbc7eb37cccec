import math
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.federated import REAL_CLIENT, DPFedAvg, FederatedAuditHooks
from audit_callbacks.federated.clipping import clip_updates_


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

    class Spy(FederatedAuditHooks, pl.Callback):
        def on_federated_client_updates(self, trainer, pl_module, fl_round):
            seen.append(torch.linalg.vector_norm(fl_round.updates, dim=1))

        def on_federated_round_end(self, trainer, pl_module, fl_round):
            seen.append(torch.linalg.vector_norm(fl_round.model_delta))

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

    class Spy(FederatedAuditHooks, pl.Callback):
        def on_federated_round_end(self, trainer, pl_module, fl_round):
            deltas.append(fl_round.model_delta.clone())

    trainer(1, [Spy()]).fit(module, datamodule=Ticks(clients))
    sd = deltas[0].std().item()
    expected = 2.0 * 0.5 / 5
    # d = 20100 draws: relative sd of the sample sd is about 1/sqrt(2d) = 0.5%
    assert sd == pytest.approx(expected, rel=0.03)


class Virtual(FederatedAuditHooks, pl.Callback):
    """Owner of ``count`` virtual clients whose update is 10 * ones, written one row at a time;
    also an audit callback that checks the clipped rows."""

    def __init__(self, count, schedule=None):
        self.count, self.schedule = count, schedule
        self.calls = []
        self.cohorts = []

    def setup(self, trainer, pl_module, stage):
        pl_module.register_virtual_clients(self, self.count, name="v", schedule=self.schedule)

    def client_updates(self, fl_round, indices, clip_norm, out):
        for row, index in enumerate(indices.tolist()):
            self.calls.append((index, fl_round.index))
            out[row] = 10.0  # clipped by the module

    def on_federated_round_start(self, trainer, pl_module, fl_round):
        self.cohorts.append(fl_round.cohort)

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        updates = fl_round.updates
        assert updates.shape == (fl_round.row_ids.size, pl_module.num_parameters)
        assert torch.all(torch.linalg.vector_norm(updates, dim=1) <= pl_module.clip_norm * (1 + 1e-5))


def test_virtual_clients_are_sampled_like_real_ones():
    clients = make_clients(n_clients=10)
    cb = Virtual(10)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=1.0, sampling="uniform", seed=0)
    trainer(300, [cb]).fit(module, datamodule=Ticks(clients))
    part = module.participations()
    assert part.shape == (20,) and part.sum() == 300 * 4
    # real and virtual clients have the same inclusion probability 4/20: the real ones' joins
    # a round are hypergeometric (4 of 20, 10 real: variance 4 (1/2)(1/2)(16/19)) and the
    # virtual ones' are the rest, so the difference of the means has sd 2 sqrt(300 v) / 10
    real, virt = part[:10].mean(), part[10:].mean()
    assert abs(real - virt) < 4 * 2 * math.sqrt(300 * 4 * 0.25 * 16 / 19) / 10
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
            warnings.warn("the worker's own warning", UserWarning, stacklevel=1)
            return {"loss": loss}

    worker = Lit()
    module = DPFedAvg(worker, clients_per_round=2, noise_multiplier=0.0, clip_norm=10.0)
    before = module.flat_parameters()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's own: once per location
        trainer(2).fit(module, datamodule=Ticks(make_clients(3)))
    assert not torch.equal(before, module.flat_parameters())
    # the worker's own warning shown once (it was hidden), Lightning's "self.log outside a
    # Trainer" never (the worker's log is a no-op while a client trains)
    messages = [str(w.message) for w in seen]
    assert messages.count("the worker's own warning") == 1, messages
    assert not any("self.log" in m for m in messages), messages
    assert "log" not in vars(worker) and "log_dict" not in vars(worker)  # its own methods again


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

    class Spy(FederatedAuditHooks, pl.Callback):
        def __init__(self):
            self.rows = []

        def on_federated_randomized_updates(self, trainer, pl_module, fl_round):
            assert fl_round.randomizer is pl_module.randomizer
            self.rows.append(fl_round.released.shape)

    def run(randomizer, callbacks=()):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=2, noise_multiplier=0.0, seed=1,
                          randomizer=randomizer)
        trainer(3, callbacks).fit(module, datamodule=Ticks(make_clients(4)))
        return module.flat_parameters()

    spy = Spy()
    with pytest.warns(UserWarning, match="no central Gaussian noise.*local randomizer") as local:
        with_randomizer = run(Doubler(), [spy])
    with pytest.warns(UserWarning, match="no DP noise") as central:
        assert torch.allclose(with_randomizer, run(None), atol=1e-6)
    # once each; the local-DP run is not told it has no DP at all
    assert sum("noise_multiplier = 0" in str(w.message) for w in local) == 1
    assert not any("no DP noise" in str(w.message) for w in local)
    assert sum("noise_multiplier = 0" in str(w.message) for w in central) == 1
    assert spy.rows == [torch.Size([2, 15])] * 3
    for bad in (object(), 3):
        with pytest.raises(ValueError, match="randomizer"):
            DPFedAvg(nn.Linear(4, 3), randomizer=bad)


class SumOwner(pl.Callback):
    """Virtual clients whose update is 10 * ones; gives rows, or with ``sums`` (registered with
    ``gives_sum=True``) their clipped sum where nobody needs the rows."""

    def __init__(self, count, sums=True, value=10.0, size=None):
        self.count, self.value, self.size, self.sums = count, value, size, sums
        self.given = {"sum": 0, "rows": 0}

    def setup(self, trainer, pl_module, stage):
        self.d = pl_module.num_parameters
        pl_module.register_virtual_clients(self, self.count, name="v", gives_sum=self.sums)

    def client_updates(self, fl_round, indices, clip_norm, out):
        self.given["rows"] += 1
        out.fill_(self.value)

    def client_update_sum(self, fl_round, indices, clip_norm):
        self.given["sum"] += 1
        rows = torch.full((len(indices), self.size or self.d), self.value)
        clip_updates_(rows, clip_norm)
        return rows.sum(0)


class OneRowAtATime(SumOwner):
    """The same clients, each row written on its own (as one client at a time would give it)."""

    def client_updates(self, fl_round, indices, clip_norm, out):
        for row in range(len(indices)):
            self.given["rows"] += 1
            out[row] = torch.full((self.d,), self.value)


def test_an_owner_may_give_the_sum_of_its_clipped_updates():
    def run(owner, *more):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.5, seed=3,
                          reproducible_noise=True)
        trainer(8, [owner, *more]).fit(module, datamodule=Ticks(make_clients(6)))
        return module.flat_parameters()

    by_sum, by_rows, by_row = SumOwner(6), SumOwner(6, sums=False), OneRowAtATime(6, sums=False)
    assert torch.equal(run(by_sum), run(by_rows))
    assert torch.equal(run(by_row), run(by_rows))  # the three ways give the same bits
    assert by_sum.given["sum"] > 0 and by_sum.given["rows"] == 0 and by_rows.given["sum"] == 0
    assert by_row.given["rows"] > by_rows.given["rows"] > 0

    class Observer(FederatedAuditHooks, pl.Callback):  # needs the rows: the owner gives rows
        def on_federated_client_updates(self, trainer, pl_module, fl_round):
            pass

    observed = SumOwner(6)
    assert torch.equal(run(observed, Observer()), run(by_rows))
    assert observed.given["sum"] == 0 and observed.given["rows"] > 0

    for bad in (SumOwner(6, value=float("nan")), SumOwner(6, size=5)):
        with pytest.raises(ValueError, match="not a finite vector of 15 entries"):
            run(bad)


def test_canary_sums_follow_a_float64_model(tmp_path):
    # a model converted to float64 before it is wrapped: Lightning's pl_module.dtype still says
    # float32, but the update rows are float64; CanaryAudit's sums must be float64 too and
    # train the model its rows train (up to the canaries' own float32 rounding: the Hadamard
    # sum is one transform, not the sum of the rows)
    from audit_callbacks.callbacks import CanaryAudit

    class Rows(FederatedAuditHooks, pl.Callback):  # needs the rows: the canaries are given as rows
        rows = 0

        def on_federated_client_updates(self, trainer, pl_module, fl_round):
            assert fl_round.updates.dtype == torch.float64 and not fl_round.summed
            self.rows += fl_round.rows_of(fl_round.owners[0]).size

    clients = [TensorDataset(ds.tensors[0].double(), ds.tensors[1]) for ds in make_clients(n_clients=8)]
    models = {}
    for name, extra in (("sums", []), ("rows", [Rows()])):
        torch.manual_seed(0)
        module = DPFedAvg(nn.Linear(4, 3).double(), clients_per_round=4, noise_multiplier=0.5, seed=1,
                          reproducible_noise=True)
        assert module.dtype == torch.float32 and module.flat_parameters().dtype == torch.float64
        audit = CanaryAudit(num_canaries=6, log_figures=False, log_histograms=False)
        trainer(6, [audit, *extra], default_root_dir=str(tmp_path / name)).fit(module, datamodule=Ticks(clients))
        assert audit.auditor.participations.sum() > 0
        models[name] = module.flat_parameters()
        if extra:
            assert extra[0].rows == int(audit.auditor.participations.sum()) > 0
    assert models["sums"].dtype == torch.float64
    assert torch.allclose(models["sums"], models["rows"], rtol=0, atol=1e-6)


# ------------------------------------------------------------------ the round as stages
class Staged(DPFedAvg):
    """Records each stage as it runs (``log`` is shared with the hooks)."""

    def __init__(self, *args, log, **kwargs):
        super().__init__(*args, **kwargs)
        self.stage_log = log

    def _sample(self, round_idx):
        self.stage_log.append("sample")
        return super()._sample(round_idx)

    def _train_clients(self, fl_round, **kw):
        self.stage_log.append("local_train")
        return super()._train_clients(fl_round, **kw)

    def _clip(self, fl_round):
        self.stage_log.append("clip")
        return super()._clip(fl_round)

    def _randomize(self, fl_round):
        self.stage_log.append("randomize")
        return super()._randomize(fl_round)

    def _aggregate(self, fl_round):
        self.stage_log.append("aggregate")
        return super()._aggregate(fl_round)

    def _server_step(self, fl_round):
        self.stage_log.append("server_step")
        return super()._server_step(fl_round)


class Halver:
    """A local randomizer that releases x / 2; the server's debias doubles it back."""

    def randomize(self, x, generator=None):
        return x / 2

    def debias(self, y):
        return y * 2


class HookLog(FederatedAuditHooks, pl.Callback):
    def __init__(self, log):
        self.events = log
        self.rounds = []

    def on_federated_round_start(self, trainer, pl_module, fl_round):
        self.events.append("on_round_start")
        self.rounds.append(fl_round)

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        self.events.append("on_client_updates")
        self.rounds.append(fl_round)

    def on_federated_randomized_updates(self, trainer, pl_module, fl_round):
        self.events.append("on_randomized_updates")
        self.rounds.append(fl_round)

    def on_federated_round_end(self, trainer, pl_module, fl_round):
        self.events.append("on_round_end")
        self.rounds.append(fl_round)


@pytest.mark.parametrize("randomizer", [None, Halver()], ids=["central", "local"])
def test_a_round_runs_its_stages_in_order_with_the_hooks_between(randomizer):
    log = []
    module = Staged(nn.Linear(4, 3), clients_per_round=3, noise_multiplier=0.5, randomizer=randomizer,
                    log=log)
    hooks = HookLog(log)
    trainer(2, [hooks]).fit(module, datamodule=Ticks(make_clients(5)))
    one = ["sample", "on_round_start", "local_train", "clip", "on_client_updates", "randomize",
           *(["on_randomized_updates"] if randomizer else []), "aggregate", "server_step", "on_round_end"]
    assert log == one * 2
    # each stage's record carries what the stages so far produced
    start, clipped, *rest = hooks.rounds[:len(hooks.rounds) // 2]
    end = rest[-1]
    assert start.updates is None and start.model_delta is None and start.index == 1
    assert clipped.updates.shape == (3, 15) and clipped.average is None
    assert torch.all(torch.linalg.vector_norm(clipped.updates, dim=1) <= 1.0 + 1e-6)
    assert (randomizer is None) == (end.released is None) == (end.randomizer is None)
    assert end.updates is clipped.updates and end.theta is start.theta
    assert torch.equal(end.model_delta, hooks.rounds[-1].theta - start.theta)  # round 2 starts there
    assert end.average.shape == (15,) and end.index == 1


class Owner(pl.Callback):
    """Virtual clients whose row j is j + 1 in every entry (small: no clipping at C = 1e3)."""

    def __init__(self, count, schedule=None, name="v"):
        self.count, self.schedule, self.name = count, schedule, name

    def setup(self, trainer, pl_module, stage):
        pl_module.register_virtual_clients(self, self.count, name=self.name, schedule=self.schedule)

    def client_updates(self, fl_round, indices, clip_norm, out):
        out.copy_(torch.as_tensor(indices + 1, dtype=out.dtype)[:, None].expand_as(out))


def test_the_round_record_names_every_client_by_integer_ids_and_every_row_by_owner():
    log = []
    hooks = HookLog(log)
    owners = [Owner(6, name="a"), Owner(3, schedule=lambda r: [0, 2], name="b")]
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=5, noise_multiplier=0.0, clip_norm=1e3)
    trainer(4, [*owners, hooks]).fit(module, datamodule=Ticks(make_clients(8)))
    seen_virtual = 0
    for fl_round in hooks.rounds:
        if fl_round.updates is None or fl_round.model_delta is not None:
            continue
        cohort = fl_round.cohort
        assert fl_round.owners == ("a", "b")
        for ids in (cohort.real_ids, *cohort.virtual_ids.values(), cohort.population_ids,
                    fl_round.row_owner, fl_round.row_ids):
            assert ids.dtype == np.int64 and ids.ndim == 1 and not ids.flags.writeable
        assert cohort.virtual_ids["b"].tolist() == [0, 2]  # scheduled: every round
        assert cohort.size == cohort.real_ids.size + sum(v.size for v in cohort.virtual_ids.values())
        assert cohort.size == 5 + 2 and cohort.divisor == 5
        assert set(cohort.real_ids.tolist()) <= set(range(8))
        n_real, n_a = cohort.real_ids.size, cohort.virtual_ids["a"].size
        # real clients' rows first, then each owner's, in registration order
        assert fl_round.row_owner.tolist() == [REAL_CLIENT] * n_real + [0] * n_a + [1] * 2
        assert fl_round.real_rows.tolist() == list(range(n_real))
        assert np.array_equal(fl_round.row_ids[fl_round.real_rows], cohort.real_ids)
        for k, name in enumerate(("a", "b")):
            rows = fl_round.rows_of(name)
            assert np.array_equal(fl_round.row_ids[rows], cohort.virtual_ids[name])
            assert np.array_equal(rows, np.flatnonzero(fl_round.row_owner == k))
            expected = torch.as_tensor(cohort.virtual_ids[name] + 1, dtype=torch.float32)
            assert torch.equal(fl_round.updates[torch.as_tensor(rows)][:, 0], expected)
        seen_virtual += n_a
    assert seen_virtual > 0
    with pytest.raises(KeyError, match="registered owner"):
        hooks.rounds[0].rows_of("nobody")
    assert module.participations().shape == (8 + 6 + 3,)


def test_a_callback_without_the_hooks_base_is_not_called():
    class Lookalike(pl.Callback):  # the hook names, but not a FederatedAuditHooks
        def on_federated_round_start(self, *args):
            raise AssertionError("called")

        def on_federated_client_updates(self, *args):
            raise AssertionError("called")

        def on_federated_round_end(self, *args):
            raise AssertionError("called")

    owner = SumOwner(6)
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.5)
    trainer(4, [owner, Lookalike()]).fit(module, datamodule=Ticks(make_clients(6)))
    assert module.round == 4
    # nor does it make the owners give rows: nobody needs them
    assert owner.given["sum"] > 0 and owner.given["rows"] == 0


def test_owners_are_checked_at_registration():
    module = DPFedAvg(nn.Linear(4, 3))
    with pytest.raises(TypeError, match="VirtualClientOwner"):
        module.register_virtual_clients(object(), 3, name="x")
    with pytest.raises(TypeError, match="client_update_sum"):
        module.register_virtual_clients(Owner(3), 3, name="x", gives_sum=True)
    assert module.register_virtual_clients(SumOwner(3), 3, name="x", gives_sum=True) == "x"


def test_a_non_finite_row_names_its_client():
    owner = Owner(4)
    owner.client_updates = lambda fl_round, indices, clip_norm, out: out.fill_(float("inf"))
    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=1, sampling="shuffle")
    with pytest.raises(ValueError, match=r"non-finite update from .*virtual client \d of 'v'"):
        trainer(8, [owner]).fit(module, datamodule=Ticks(make_clients(1)))


def test_without_num_classes_it_warns_once_and_says_how_to_fix_it():
    """No silent gap when accuracy cannot be computed."""
    class NoClasses(Ticks):
        def __init__(self, clients):
            super().__init__(clients)
            del self.num_classes

    module = DPFedAvg(nn.Linear(4, 3), clients_per_round=3, noise_multiplier=0.0, clip_norm=1.0)
    with pytest.warns(UserWarning, match=r"num_classes=") as record:
        trainer(2).fit(module, datamodule=NoClasses(make_clients()))
    assert sum("number of classes is unknown" in str(w.message) for w in record) == 1
    with_classes = DPFedAvg(nn.Linear(4, 3), clients_per_round=3, noise_multiplier=0.0, clip_norm=1.0)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(1).fit(with_classes, datamodule=Ticks(make_clients()))
    assert not any("number of classes is unknown" in str(w.message) for w in caught)
