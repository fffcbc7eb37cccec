"""Which layer the label callbacks attack (the nn.Linear whose output is the model's output,
whatever the order the layers were registered in), reduced-precision gradients, and a disabled
label callback that stays silent."""

import json
import os

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy

from audit_callbacks.attacks.label_gradients import gradient_scale
from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.callbacks.label_step import HeadProbe
from datamodules.central import CentralDataModule
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG|Optimal "
                                        "order|val_dataloader|logging interval).*")


class _Net(nn.Module):
    """body -> proj -> head (one logit), registered in ``order``; ``tied``: one more hidden layer
    sharing proj's weight, registered after the head; ``sliced``: a two-wide head of which the
    model returns one column (no nn.Linear's output is the model's output). Same weights
    whatever the order (made in one order, then registered)."""

    def __init__(self, order=("body", "proj", "head"), tied=False, sliced=False):
        super().__init__()
        torch.manual_seed(0)
        made = {"body": nn.Linear(30, 64), "proj": nn.Linear(64, 64), "head": nn.Linear(64, 2 if sliced else 1)}
        for name in order:
            setattr(self, name, made[name])
        self.tie = None
        if tied:
            self.tie = nn.Linear(64, 64)
            self.tie.weight = self.proj.weight
        self.sliced = sliced

    def forward(self, x):
        h = torch.relu(self.proj(torch.relu(self.body(x))))
        if self.tie is not None:
            h = torch.relu(self.tie(h))
        z = self.head(h)
        return z[:, :1] if self.sliced else z


def _fit(tmp_path, callbacks, net, *, noise=0.0, logger=False, precision="32-true"):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0, sampling_seed=0)
    module = DPSGDClassifier(net, lr=0.3, noise_multiplier=noise, max_grad_norm=1.0, noise_seed=0)
    log = TensorBoardLogger(str(tmp_path), name="run", version=0) if logger else False
    trainer = pl.Trainer(max_epochs=1, logger=log, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1, limit_val_batches=0, precision=precision,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return trainer


def _label_scalars(tmp_path):
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return {t for t in acc.Tags()["scalars"] if t.startswith("label")}


# ---------------------------------------------------------------------------- the head


def _probe(model, x, *, loss=None):
    probe = HeadProbe(model)
    probe.begin()
    out = model(x)
    if loss is not None:
        loss(out.squeeze(-1), torch.zeros(x.shape[0]))  # 0-dimensional: not the model's output
    found = probe.resolve()
    probe.remove()
    return found


def test_the_probe_finds_the_layer_whose_output_is_the_model_output():
    x = torch.randn(5, 30)
    for net in (_Net(), _Net(order=("head", "body", "proj")), _Net(tied=True)):
        head, previous, order = _probe(net, x)
        assert head is net.head
        assert previous is (net.tie if net.tie is not None else net.proj)
        assert order[0] is net.body and order[-1] is net.head
    net = nn.Sequential(_Net(order=("head", "proj", "body")), nn.ReLU())  # element-wise after the head
    assert _probe(net, x)[0] is net[0].head
    loss = nn.BCEWithLogitsLoss()  # a loss module called after the model is passed over
    holder = nn.ModuleDict({"net": _Net(order=("head", "body", "proj")), "loss": loss})
    assert _probe(holder["net"], x, loss=loss)[0] is holder["net"].head
    class _Dict(nn.Module):  # {"logits": ...}, as Hugging Face's ModelOutput
        def __init__(self):
            super().__init__()
            self.net = _Net(order=("head", "body", "proj"))

        def forward(self, x):
            return {"logits": self.net(x), "hidden": self.net.body(x)}

    net = _Dict()
    assert _probe(net, x)[0] is net.net.head
    why = _probe(_Net(sliced=True), x)
    assert isinstance(why, str) and "no nn.Linear layer's output is the model's output" in why


@pytest.mark.parametrize("order,tied", [(("head", "body", "proj"), False), (("body", "proj", "head"), True)])
def test_noise_free_attack_is_exact_whatever_the_registration_order(tmp_path, order, tied):
    """Head registered first, or a weight-tied nn.Linear registered after it: the last
    registered nn.Linear is a hidden layer, which the attack used to attack (accuracy 0.0)."""
    attack = LabelReconstructionAttack()
    _fit(tmp_path, [attack], _Net(order=order, tied=tied))
    assert attack.layer is not None and attack.layer.out_features == 1
    assert attack.disabled_reason is None and len(attack.history) >= 5
    assert attack.accuracy == 1.0


def test_the_bound_of_a_head_first_model_is_the_head_last_ones(tmp_path):
    """Same weights, head registered first or last: the first step (before any update) gives
    the same bound; it used to disable itself (unsupported_loss) on the hidden layer."""
    first, last = LabelDPLowerBound(summary_filename=None), LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path / "a", [first], _Net(order=("head", "body", "proj")), noise=1.0)
    _fit(tmp_path / "b", [last], _Net(), noise=1.0)
    assert first.disabled_reason is None and first.attacked_steps == first.considered > 0
    assert first.records[0]["epsilon_lower_bound"] == pytest.approx(last.records[0]["epsilon_lower_bound"], rel=1e-6)


def test_no_linear_output_is_the_model_output_steps_aside_silently(tmp_path):
    attack, bound = LabelReconstructionAttack(), LabelDPLowerBound()
    with pytest.warns(UserWarning, match="unsupported_model"):
        trainer = _fit(tmp_path, [attack, bound], _Net(sliced=True), noise=1.0, logger=True)
    assert trainer.state.finished
    for cb in (attack, bound):
        assert cb.disabled_reason == "unsupported_model" and cb.attacked_steps == 0
        with open(cb.summary_path, encoding="utf-8") as fh:
            assert json.load(fh)["disabled_reason"] == "unsupported_model"
    assert _label_scalars(tmp_path) == set()


# ---------------------------------------------------------------------------- disabled: silent


class _ReluLogit(nn.Module):
    """A logit followed by ReLU: the gradients are not kappa (p - y) x (unsupported loss)."""

    def __init__(self):
        super().__init__()
        self.net = _Net()

    def forward(self, x):
        return torch.relu(self.net(x))


def test_a_callback_that_disabled_itself_logs_no_number(tmp_path):
    bound = LabelDPLowerBound()
    with pytest.warns(UserWarning, match="unsupported_loss"):
        _fit(tmp_path, [bound], _ReluLogit(), noise=1.0, logger=True)
    assert bound.disabled_reason == "unsupported_loss" and bound.skips["unsupported_loss"] == 1
    assert _label_scalars(tmp_path) == set()  # was: attacked_fraction, skip_reason, epsilon_accountant
    with open(bound.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["disabled_reason"] == "unsupported_loss"
    for key in ("epsilon_single_step", "epsilon_accountant", "epsilon_lower_bound_max"):
        assert summary[key] is None and summary["results"][key]["status"].startswith("skipped: disabled")


# ---------------------------------------------------------------------------- reduced precision


def test_kappa_is_read_from_bfloat16_gradients():
    """Per-example bias gradients kappa (p - y) rounded to bfloat16 (bf16-mixed: the loss in
    float32, its gradient cast at the autocast boundary) still give kappa; the 1e-3 float32
    tolerance refused them. Label smoothing (0.3) is still refused in bfloat16."""
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 64)
    y = (rng.random(64) < 0.5).astype(float)
    a = p - y
    grads = torch.tensor(0.7 * a)[:, None]
    assert gradient_scale(a, grads.float()) == pytest.approx(0.7, rel=1e-6)  # float32 as before
    rounded = grads.to(torch.bfloat16)
    assert float(np.max(np.abs(rounded.double().numpy()[:, 0] / (0.7 * a) - 1))) > 1e-3  # beyond the old tolerance
    assert gradient_scale(a, rounded) == pytest.approx(0.7, rel=torch.finfo(torch.bfloat16).eps)
    smoothed = p - (y * 0.7 + 0.15)
    assert gradient_scale(a, torch.tensor(0.7 * smoothed)[:, None].to(torch.bfloat16)) is None


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_the_bound_runs_under_bf16_and_agrees_with_float32(tmp_path, precision):
    """The first step (same weights, same batch) under bf16 gives float32's bound to bf16's
    accuracy; the callback used to disable itself (unsupported_loss) at that step."""
    low, ref = LabelDPLowerBound(summary_filename=None), LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path / "a", [low], _Net(), noise=1.0, precision=precision)
    _fit(tmp_path / "b", [ref], _Net(), noise=1.0)
    assert low.disabled_reason is None and low.attacked_steps == low.considered > 0
    assert low.records[0]["epsilon_lower_bound"] == pytest.approx(ref.records[0]["epsilon_lower_bound"], rel=0.05)


class _Softmax(nn.Module):
    """64 -> 64 -> 64 -> 10 ReLU MLP, head registered first (same weights as registered last)."""

    def __init__(self, head_first):
        super().__init__()
        torch.manual_seed(0)
        made = {"body": nn.Linear(64, 64), "proj": nn.Linear(64, 64), "head": nn.Linear(64, 10)}
        for name in (("head", "body", "proj") if head_first else ("body", "proj", "head")):
            setattr(self, name, made[name])

    def forward(self, x):
        return self.head(torch.relu(self.proj(torch.relu(self.body(x)))))


def test_softmax_head_first_gets_the_exact_flipped_norms(tmp_path):
    """K classes: the ghost layers are back-propagated in the order they run, so a head
    registered first still gets the exact clip factors of a replaced label."""
    bounds = []
    for head_first in (True, False):
        pl.seed_everything(0, verbose=False)
        dm = CentralDataModule("digits", batch_size=32, poisson=True, seed=0, sampling_seed=0)
        module = DPSGDClassifier(_Softmax(head_first), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0, noise_seed=0)
        bound = LabelDPLowerBound(summary_filename=None, every_n_steps=10)
        pl.Trainer(max_epochs=1, logger=False, callbacks=[bound], enable_progress_bar=False, limit_train_batches=3,
                   enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                   limit_val_batches=0, default_root_dir=str(tmp_path)).fit(module, datamodule=dm)
        bounds.append(bound)
    first, last = bounds
    assert first.disabled_reason is None and first.num_classes == 10 and first.records
    assert first.flipped_norms == last.flipped_norms == "exact (ReLU MLP back-propagation)"
    assert first.records[0]["epsilon_lower_bound"] == pytest.approx(last.records[0]["epsilon_lower_bound"], rel=1e-6)


@pytest.mark.parametrize("sliced", [False, True])
def test_the_module_reads_binary_or_multiclass_from_the_logits_not_the_last_layer(tmp_path, sliced):
    """One logit with the head registered first (the last registered nn.Linear has 64 outputs),
    and two logits of which the model returns one: a sigmoid and log-loss, binary accuracy.
    Ten logits with a 1-wide layer registered last: softmax cross-entropy over 10 classes."""
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0, sampling_seed=0)
    module = DPSGDClassifier(_Net(order=("head", "body", "proj"), sliced=sliced), lr=0.3,
                             noise_multiplier=1.0, noise_seed=0)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, limit_train_batches=2, limit_val_batches=2,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    assert module.binary is True and isinstance(module.val_acc, BinaryAccuracy)
    assert 0.0 <= float(trainer.callback_metrics["val/accuracy"]) <= 1.0

    class _Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.gate = nn.Linear(64, 10), nn.Linear(64, 1)

        def forward(self, x):
            return self.head(x) * torch.sigmoid(self.gate(x))

    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("digits", batch_size=32, poisson=True, seed=0, sampling_seed=0)
    module = DPSGDClassifier(_Wide(), lr=0.3, noise_multiplier=1.0, noise_seed=0)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, limit_train_batches=2, limit_val_batches=2,
                         default_root_dir=str(tmp_path / "wide"))
    trainer.fit(module, datamodule=dm)
    assert module.binary is False and isinstance(module.val_acc, MulticlassAccuracy)
    assert module.val_acc.num_classes == 10
