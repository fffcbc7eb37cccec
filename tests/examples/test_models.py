"""Tests of the reference models: shapes, Opacus compatibility, and that they learn digits."""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from sklearn.model_selection import train_test_split
from torch import nn

from datamodules import load_digits_tensors
from models import MLP, SmallCNN, build_model, num_parameters


@pytest.fixture(scope="module")
def digits_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = load_digits_tensors()
    tr, te = train_test_split(range(len(y)), test_size=0.2, stratify=y.numpy(), random_state=0)
    tr, te = torch.tensor(sorted(tr)), torch.tensor(sorted(te))
    return x[tr], y[tr], x[te], y[te]


def test_mlp_shapes() -> None:
    model = MLP(64, 10)
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    assert model(torch.zeros(5, 64)).shape == (5, 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 200), (200, 200), (200, 10)]
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2
    logreg = MLP(30, 2, hidden=())
    assert logreg(torch.zeros(3, 30)).shape == (3, 2) and num_parameters(logreg) == 62
    with pytest.raises(ValueError):
        MLP(0, 10)


@pytest.mark.parametrize(
    "channels,size,classes", [(1, 8, 10), (1, 28, 10), (1, 28, 47), (3, 32, 10), (1, 9, 4)]
)
@pytest.mark.parametrize("group_norm", [False, True])
def test_small_cnn_shapes(channels: int, size: int, classes: int, group_norm: bool) -> None:
    model = SmallCNN(channels, classes, image_size=size, group_norm=group_norm)
    assert model(torch.zeros(4, channels, size, size)).shape == (4, classes)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_small_cnn_size_on_digits() -> None:
    assert 10_000 <= num_parameters(SmallCNN(1, 10, image_size=8)) <= 30_000
    assert SmallCNN(1, 10, image_size=(8, 12))(torch.zeros(2, 1, 8, 12)).shape == (2, 10)
    with pytest.raises(ValueError, match="at least 4x4"):
        SmallCNN(1, 10, image_size=3)


def test_build_model() -> None:
    mlp = build_model("mlp", (1, 8, 8), 10)
    assert isinstance(mlp, MLP) and mlp.in_features == 64
    cnn = build_model("cnn", (1, 28, 28), 10, group_norm=True)
    assert isinstance(cnn, SmallCNN) and cnn(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="C, H, W"):
        build_model("cnn", (30,), 2)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", (1, 8, 8), 10)


@pytest.mark.parametrize(
    "model",
    [MLP(64, 10), SmallCNN(1, 10, 8), SmallCNN(1, 10, 28, group_norm=True), SmallCNN(3, 10, 32)],
    ids=["mlp", "cnn8", "cnn28-gn", "cnn32"],
)
def test_models_pass_opacus_validation(model: nn.Module) -> None:
    assert ModuleValidator.validate(model, strict=False) == []
    ModuleValidator.validate(model, strict=True)  # raises if anything is unsupported


def test_opacus_validator_catches_batchnorm() -> None:
    bad = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
    assert ModuleValidator.validate(bad, strict=False) != []


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_per_example_gradients_match(model_name: str) -> None:
    """Opacus per-example gradients sum to the ordinary batch gradient."""
    torch.manual_seed(0)
    kwargs = {"group_norm": True} if model_name == "cnn" else {}
    model = build_model(model_name, (1, 8, 8), 10, **kwargs)
    gsm = GradSampleModule(model, loss_reduction="sum")
    x, y = torch.rand(6, 1, 8, 8), torch.arange(6)
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    for p in model.parameters():
        assert p.grad_sample.shape == (6, *p.shape)
        torch.testing.assert_close(p.grad_sample.sum(0), p.grad, atol=1e-5, rtol=1e-4)


@pytest.fixture
def one_thread():
    """Tiny matmuls gain nothing from threads, and on a busy machine intra-op threads
    contend badly (10-30x slower); train on one thread, then restore the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train_and_score(
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    steps: int,
    lr: float,
) -> float:
    x_train, y_train, x_test, y_test = data
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(y_train), (64,), generator=g)
        loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(x_test).argmax(1) == y_test).float().mean())


def test_mlp_learns_digits(digits_split, one_thread) -> None:
    torch.manual_seed(0)
    acc = _train_and_score(MLP(64, 10), digits_split, steps=300, lr=0.05)
    assert acc > 0.90, acc


def test_small_cnn_learns_digits(digits_split, one_thread) -> None:
    torch.manual_seed(0)
    acc = _train_and_score(SmallCNN(1, 10, 8), digits_split, steps=300, lr=0.05)
    assert acc > 0.90, acc


@pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG|dirpath).*")
def test_dpsgd_classifier_logs_no_training_loss(tmp_path, one_thread) -> None:
    """``DPSGDClassifier`` logs no training loss (the epoch mean of the un-noised losses over
    the secret batches is not covered by the DP guarantee): its logged tags are the held-out
    ``val/loss`` and ``val/accuracy`` and the accountant's ``privacy/epsilon``, nothing else."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from models.dpsgd import DPSGDClassifier

    torch.manual_seed(0)
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)
    module = DPSGDClassifier(MLP(6, 3, hidden=(8,)), lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0)
    trainer = pl.Trainer(max_epochs=2, logger=CSVLogger(str(tmp_path), name="run"), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         log_every_n_steps=1)
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    with open(tmp_path / "run" / "version_0" / "metrics.csv", encoding="utf-8") as fh:
        columns = set(fh.readline().strip().split(","))
    assert {"val/loss", "val/accuracy", "privacy/epsilon"} <= columns
    assert columns - {"epoch", "step"} == {"val/loss", "val/accuracy", "privacy/epsilon"}
    assert not [k for k in trainer.callback_metrics if k.startswith("train")]
