"""LabelReconstructionAttack and LabelDPLowerBound on a real Lightning + Opacus run (paper 004)."""

import json
import math
import os
import re

import lightning.pytorch as pl
import numpy as np
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.label_dp import extrapolation_factor
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


def _fit(tmp_path, callbacks, *, dataset="breast_cancer", noise=1.0, hidden=(64, 64), epochs=2, batch=32,
         logger=False, accumulate=1, classes=1, poisson=True, log_every=1):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule(dataset, batch_size=batch, poisson=poisson, seed=0,
                           sampling_seed=0)  # reproducible batches: runs are compared
    inputs = 30 if dataset == "breast_cancer" else 64
    module = DPSGDClassifier(MLP(inputs, classes, hidden=hidden), lr=0.3, noise_multiplier=noise,
                             max_grad_norm=1.0, noise_seed=0)
    log = TensorBoardLogger(str(tmp_path), name="run", version=0) if logger else False
    trainer = pl.Trainer(max_epochs=epochs, logger=log, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=log_every, accumulate_grad_batches=accumulate, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return module


@pytest.mark.parametrize("dataset,classes", [("breast_cancer", 1), ("digits", 10)])
def test_noise_free_reconstruction_is_exact_through_the_callback(tmp_path, dataset, classes):
    attack = LabelReconstructionAttack()
    _fit(tmp_path, [attack], dataset=dataset, classes=classes, noise=0.0, epochs=1)
    assert len(attack.history) >= 5
    assert attack.accuracy == 1.0 and all(a == 1.0 for _, a, _ in attack.history)


def test_gradient_accumulation_attacks_the_logical_batch(tmp_path):
    attack = LabelReconstructionAttack()
    _fit(tmp_path, [attack], noise=0.0, epochs=1, batch=16, accumulate=2, poisson=False)
    sizes = [n for _, _, n in attack.history]
    assert attack.accuracy == 1.0 and max(sizes) == 32  # two physical batches of 16 per step


def test_gradient_accumulation_with_the_default_steps_logs_only_after_optimizer_steps(tmp_path):
    """accumulate_grad_batches=2, log_every_n_steps=3: the attacked steps are the logged ones
    (and the epoch's last), each with its whole logical batch; the batch that only accumulates
    writes nothing (its values would be the previous step's)."""
    attack = LabelReconstructionAttack()
    _fit(tmp_path, [attack], noise=0.0, epochs=1, batch=16, accumulate=2, poisson=False, logger=True, log_every=3)
    steps = [s for s, _, _ in attack.history]
    last = attack.steps
    assert steps == [s for s in range(1, last + 1) if s % 3 == 0 or s == last] and len(steps) >= 4
    assert all(n == 32 for _, _, n in attack.history[:-1]) and attack.accuracy == 1.0
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    assert "label_attack/accuracy_batch" not in acc.Tags()["scalars"]  # no per-step oracle (issue 26)


def test_bounds_tags_and_attack_accuracy_match_the_closed_form(tmp_path):
    attack, bound = LabelReconstructionAttack(), LabelDPLowerBound(delta=1e-5, second_last=True)
    module = _fit(tmp_path, [attack, bound], noise=1.0, epochs=3, logger=True)
    recs = bound.records
    assert len(recs) == len(attack.history) == bound.steps >= 20
    single = gaussian_epsilon(1.0, 1e-5, sensitivity=2.0)
    lbs = [r["epsilon_lower_bound"] for r in recs]
    for r in recs:
        assert r["epsilon_single_step"] == pytest.approx(single)
        order = [r["epsilon_lower_bound"], r["epsilon_pair_optimal_test"],
                 r["epsilon_pair_layer"], r["epsilon_pair_all_params"], single]
        assert all(a <= b * (1 + 1e-9) + 1e-12 for a, b in zip(order, order[1:], strict=False)), order
        assert r.get("epsilon_lower_bound_second_last", 0.0) <= single
    assert bound.running_max == max(lbs)
    n_e = round(bound.optimizer.expected_batch_size)
    exp = float(np.mean(lbs)) * extrapolation_factor(len(recs), n_e)
    assert recs[-1]["epsilon_lower_bound_extrapolated"] == pytest.approx(exp, rel=1e-9)
    assert bound.epsilon_accountant == pytest.approx(module.privacy_engine.get_epsilon(1e-5))
    # TensorBoard: every bound on the chart, finite
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    want = {"label_dp/epsilon_lower_bound", "label_dp/epsilon_lower_bound_max",
            "label_dp/epsilon_lower_bound_extrapolated", "label_dp/epsilon_single_step", "label_dp/epsilon_accountant",
            "label_dp/epsilon_lower_bound_second_last", "label_dp/epsilon_lower_bound_second_last_max",
            "label_attack/accuracy", "val/accuracy"}
    assert want <= set(acc.Tags()["scalars"]), set(acc.Tags()["scalars"])
    for tag in want:
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    summary = json.load(open(bound.summary_path))
    assert summary["epsilon_lower_bound_max"] == bound.running_max
    summary = json.load(open(attack.summary_path))
    assert summary["accuracy"] == pytest.approx(attack.published_accuracy)
    assert attack.attacked_examples - 100 < summary["accuracy_examples"] <= attack.attacked_examples


def test_running_accuracy_is_the_example_weighted_mean(tmp_path):
    attack = LabelReconstructionAttack(every_n_steps=2)
    _fit(tmp_path, [attack], noise=2.0, epochs=2)
    steps = [s for s, _, _ in attack.history]
    assert steps == list(range(1, attack.steps + 1, 2))
    total = sum(n for _, _, n in attack.history)
    assert attack.accuracy == pytest.approx(sum(a * n for _, a, n in attack.history) / total)
    assert 0.3 < attack.accuracy < 1.0  # noisy: neither exact nor meaningless


def test_bad_input_is_reported(tmp_path):
    """Issue 18 changed this deliberately: a callback that cannot audit warns once and steps
    aside (it used to raise at fit start); a 10-class model is now audited."""
    with pytest.warns(UserWarning, match="larger than"):
        attack = LabelReconstructionAttack()
        _fit(tmp_path, [attack], hidden=(8, 8), batch=64, epochs=1)
    assert attack.history == []
    assert attack.skips["batch_wider_than_layer"] == attack.considered > 0
    with open(attack.summary_path, encoding="utf-8") as fh:  # "not attacked", never an accuracy
        summary = json.load(fh)
    assert summary["status"].startswith("not attacked") and summary["accuracy"] is None
    bound = LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path, [bound], dataset="digits", classes=10, epochs=1)
    assert bound.disabled_reason is None and len(bound.records) == bound.steps > 0
    with pytest.warns(UserWarning, match="noise_multiplier is 0"):
        bound = LabelDPLowerBound(summary_filename=None)
        _fit(tmp_path, [bound], noise=0.0, epochs=1)
    assert bound.disabled_reason == "no_noise" and bound.records == []
    pl.seed_everything(0, verbose=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(8,)), dp=False)
    attack = LabelReconstructionAttack()
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[attack],
                         enable_progress_bar=False, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="make_private"):
        trainer.fit(module, datamodule=CentralDataModule(poisson=False))
    assert attack.disabled_reason == "no_dp_optimizer" and trainer.state.finished


def test_the_two_callbacks_factorize_once_per_step_and_match_solo_runs(tmp_path, monkeypatch):
    """Run together, the attack and the bound share one QR of the last layer per step (and the
    per-example norms) and give exactly what each gives alone."""
    from audit_callbacks.callbacks import label_step

    calls = []
    real = label_step.factorize_layer
    monkeypatch.setattr(label_step, "factorize_layer", lambda *a, **k: calls.append(1) or real(*a, **k))
    attack, bound = LabelReconstructionAttack(summary_filename=None), LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path, [attack, bound], epochs=1)
    assert bound.steps == attack.steps >= 10 and len(calls) == bound.steps
    calls.clear()
    solo_bound = LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path, [solo_bound], epochs=1)
    solo_attack = LabelReconstructionAttack(summary_filename=None)
    _fit(tmp_path, [solo_attack], epochs=1)
    assert len(calls) == solo_bound.steps + solo_attack.steps
    assert solo_bound.records == bound.records
    assert solo_attack.history == attack.history


@pytest.mark.parametrize("accumulate", [1, 2])
def test_ghost_norms_equal_the_per_example_gradient_norms(tmp_path, monkeypatch, accumulate):
    """On an all-Linear MLP the bound reads ||b_i||^2 (||a_i||^2 + 1) per layer instead of the
    [N, k, p] per-example gradients: equal to the norms of Opacus' grad_sample at every step
    (also over two accumulated batches), and the bounds equal those of the direct path."""
    from audit_callbacks.attacks.label_gradients import per_example_grad_norms
    from audit_callbacks.callbacks import label_dp

    seen = []
    real = label_dp.LabelDPLowerBound._norms

    def spy(self, opt, data):
        got = real(self, opt, data)
        seen.append((got, per_example_grad_norms(opt.grad_samples)))
        return got

    monkeypatch.setattr(label_dp.LabelDPLowerBound, "_norms", spy)
    ghost = LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path, [ghost], epochs=1, batch=16, accumulate=accumulate, poisson=accumulate == 1)
    assert len(ghost._ghost) == 3 and len(seen) == ghost.steps == len(ghost.records) >= 10  # no step skipped
    for got, full in seen:
        assert got is not None and got.shape == full.shape
        np.testing.assert_allclose(got, full, rtol=2e-5)
    monkeypatch.setattr(label_dp, "ghost_layers", lambda module, params: {})
    direct = LabelDPLowerBound(summary_filename=None)
    _fit(tmp_path, [direct], epochs=1, batch=16, accumulate=accumulate, poisson=accumulate == 1)
    assert len(direct.records) == len(ghost.records) == direct.steps
    for a, b in zip(direct.records, ghost.records, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-9), k


def test_ghost_norms_only_for_models_made_of_biased_linear_layers():
    from torch import nn

    from audit_callbacks.attacks.label_gradients import ghost_layers

    def _ghost_layers(model, opt):
        return ghost_layers(model, opt.params)

    class Opt:  # what ghost_layers reads of a DPOptimizer
        def __init__(self, model):
            self.params = [p for p in model.parameters() if p.requires_grad]

    mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(_ghost_layers(mlp, Opt(mlp))) == 2
    no_bias = nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 1))
    assert _ghost_layers(no_bias, Opt(no_bias)) == {}
    conv = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 1))
    assert _ghost_layers(conv, Opt(conv)) == {}
    norm = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 1))
    assert _ghost_layers(norm, Opt(norm)) == {}
    frozen = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    frozen[0].weight.requires_grad_(False)
    assert _ghost_layers(frozen, Opt(frozen)) == {}  # the first bias trains without its weight


@pytest.mark.parametrize("every_n_steps", [None, 1])
def test_per_step_scalars_follow_log_every_n_steps(tmp_path, every_n_steps):
    """Like self.log(on_step=True): a scalar every log_every_n_steps steps. By default the
    callbacks compute on exactly those steps (as DeviceStatsMonitor does); with every_n_steps=1
    every step is in the records (and the summary), and the logged values are the latest."""
    attack = LabelReconstructionAttack(every_n_steps=every_n_steps)
    bound = LabelDPLowerBound(every_n_steps=every_n_steps)
    _fit(tmp_path, [attack, bound], epochs=1, logger=True, log_every=4)
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("label_dp/epsilon_lower_bound")]
    assert bound.steps >= 12 and bound.steps % 4  # the epoch's last step is off the interval
    expected = [s for s in range(1, bound.steps + 1) if s % 4 == 0]
    # and the epoch's last step: attacked and logged by default; with every_n_steps, its
    # values flushed at train end (the summary's numbers reach TensorBoard)
    expected.append(bound.steps)
    assert steps == expected
    logged = [e.step for e in acc.Scalars("label_attack/accuracy")]
    assert logged and set(logged) <= set(steps)  # from the first complete block of 100 examples on
    if every_n_steps is None:
        assert [int(r["step"]) for r in bound.records] == steps
        assert [h[0] for h in attack.history] == steps
        assert bound.considered == attack.considered == len(steps)
    else:
        assert len(bound.records) == bound.steps == bound.considered
    by_step = {int(r["step"]): r["epsilon_lower_bound"] for r in bound.records}
    for e in acc.Scalars("label_dp/epsilon_lower_bound"):
        assert e.value == pytest.approx(by_step[e.step], rel=1e-6)


def test_loss_scale_is_read_from_the_logit_layer():
    """kappa = per-example bias gradient / (p - y), whatever the batch: also when every |p - y|
    is tiny (a well-fitted batch), and None when the rows disagree (not log-loss)."""
    import torch
    from torch import nn

    from audit_callbacks.attacks.label_gradients import gradient_scale

    def _gradient_scale(opt, layer, a, x):
        return gradient_scale(a, opt.grad_samples[1])

    layer = nn.Linear(3, 1)

    class Opt:
        def __init__(self, bias_grads):
            self.params = [layer.weight, layer.bias]
            self.grad_samples = [torch.zeros(len(bias_grads), 1, 3), torch.tensor(bias_grads)[:, None]]

    x = torch.ones(3, 3, dtype=torch.float64)
    a = np.array([0.4, -0.3, 0.2])
    assert _gradient_scale(Opt((0.5 * a).tolist()), layer, a, x) == pytest.approx(0.5, rel=1e-6)
    tiny = np.array([2e-5, -4e-5, 1e-5])
    assert _gradient_scale(Opt((0.25 * tiny).tolist()), layer, tiny, x) == pytest.approx(0.25, rel=1e-5)
    assert _gradient_scale(Opt([0.4, -0.6, 0.2]), layer, a, x) is None  # row 2 has twice the scale


def test_every_logged_tag_record_and_summary_key_is_in_the_name_table(tmp_path):
    """One name per quantity: each TensorBoard tag of the label callbacks is ``names.tag(family,
    name)``, the records and summaries use the same names as keys, and the Custom Scalars layout
    draws exactly the registered (anchored) tags."""
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs_meta

    from audit_callbacks import names

    attack, bound = LabelReconstructionAttack(), LabelDPLowerBound(second_last=True)
    _fit(tmp_path, [attack, bound], epochs=1, logger=True)
    registered = {q.tag for q in names.QUANTITIES}
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"),
                           size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    logged = {t for t in acc.Tags()["scalars"] if t.split("/")[0] in ("label_dp", "label_attack")}
    assert logged <= registered, logged - registered
    assert {q.tag for q in names.family("label_dp")} - logged <= {"label_dp/warnings"}  # all drawn
    for r in bound.records:
        assert set(r) - {"step"} <= set(names.names("label_dp")), set(r)
    summary = json.load(open(bound.summary_path))
    assert "source" in summary and "paper" not in summary
    assert {k for k in summary if k.startswith("epsilon")} <= set(names.names("label_dp"))
    attack_summary = json.load(open(attack.summary_path))
    assert "source" in attack_summary and "paper" not in attack_summary
    assert "history" not in attack_summary and "count_history" not in attack_summary
    layout = layout_pb2.Layout()
    for event in acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG):
        layout.MergeFromString(event.tensor_proto.string_val[0])
    drawn = {t for cat in layout.category for c in cat.chart for t in c.multiline.tag if t.startswith("^label")}
    assert drawn and drawn == {f"^{re.escape(q.tag)}$" for q in names.QUANTITIES
                               if q.family in ("label_dp", "label_attack") and q.chart is not None}


@pytest.mark.parametrize("bound_first", [True, False])
@pytest.mark.parametrize("reason", ["unsupported_loss", "no_noise", "no_dp_optimizer", "unsupported_model"])
def test_a_disabled_callback_never_stops_the_fit_in_either_order(tmp_path, bound_first, reason):
    """Issue 27 item 5: whatever disables a label callback (a logit layer followed by ReLU, as in
    Lightning's own example, at a step; no noise or no DPOptimizer at fit start), and in either
    order of the two callbacks, the disabled hook is really gone and the fit ends."""
    import torch

    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=reason != "no_dp_optimizer", seed=0)
    model = MLP(30, 1, hidden=(64, 64))
    if reason == "unsupported_loss":
        model = torch.nn.Sequential(model, torch.nn.ReLU())
    if reason == "unsupported_model":  # no nn.Linear layer at all: a convolution over the features
        model = torch.nn.Sequential(torch.nn.Unflatten(1, (1, 30)), torch.nn.Conv1d(1, 1, 30),
                                    torch.nn.Flatten())
    module = DPSGDClassifier(model, lr=0.3, noise_multiplier=0.0 if reason == "no_noise" else 1.0,
                             max_grad_norm=1.0, noise_seed=0, dp=reason != "no_dp_optimizer")
    bound, attack = LabelDPLowerBound(summary_filename=None), LabelReconstructionAttack(summary_filename=None)
    callbacks = [bound, attack] if bound_first else [attack, bound]
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1, default_root_dir=str(tmp_path))
    with pytest.warns(UserWarning):
        trainer.fit(module, datamodule=dm)
    assert trainer.state.finished
    assert bound.disabled_reason == reason
    if reason in ("no_dp_optimizer", "unsupported_model"):  # both callbacks step aside
        assert attack.disabled_reason == reason
        # no class count claimed for a model it never attacked (it said 2 and chance 1/2)
        assert attack.report_section()[1]["num_classes"] is None
    else:  # the other callback went on attacking
        assert attack.disabled_reason is None and attack.attacked_steps > 0


def test_an_empty_poisson_batch_is_skipped_with_a_reason(tmp_path):
    """Opacus' DPDataLoader yields batches of size 0 (probability (1 - q)^n per step): each
    considered one is counted as ``empty_batch`` in the summary and the fit goes on (it used to
    stop with a RuntimeError from reshaping the [0, p] activations, issue 26)."""
    import torch
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(40, 8)
    ds = TensorDataset(x, (x[:, 0] > 0).long())

    class Tiny(pl.LightningDataModule):
        def train_dataloader(self):  # q = 2/40: about a third of the batches are empty
            return DPDataLoader.from_data_loader(DataLoader(ds, batch_size=2),
                                                 generator=torch.Generator().manual_seed(1))

    sizes = [len(b[1]) for b in Tiny().train_dataloader()]
    assert 0 in sizes and max(sizes) > 0
    module = DPSGDClassifier(MLP(8, 1, hidden=(16,)), noise_multiplier=1.0)
    attack = LabelReconstructionAttack(every_n_steps=1)
    bound = LabelDPLowerBound(every_n_steps=1)
    log = TensorBoardLogger(str(tmp_path), name="run", version=0)
    trainer = pl.Trainer(max_epochs=1, logger=log, callbacks=[attack, bound], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0)
    with pytest.warns(UserWarning, match="empty_batch"):
        trainer.fit(module, datamodule=Tiny())
    empty = sizes.count(0)
    for cb in (attack, bound):
        assert cb.skips["empty_batch"] == empty and cb.considered == len(sizes)
        with open(cb.summary_path, encoding="utf-8") as fh:
            assert json.load(fh)["skipped"]["empty_batch"] == empty
    assert attack.attacked_steps > 0


def test_the_last_attacked_values_reach_tensorboard_off_the_logging_interval(tmp_path):
    """every_n_steps set and the Trainer's log_every_n_steps not dividing the steps: the last
    attacked step's values are flushed at train end, so TensorBoard's last value is the
    summary's (before, the extrapolated bound read 0.4082 there and 0.4025 in the summary)."""
    import json as _json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    bound = LabelDPLowerBound(every_n_steps=1)
    attack = LabelReconstructionAttack(every_n_steps=1, min_examples=50)
    _fit(tmp_path, [attack, bound], noise=1.0, epochs=2, logger=True, log_every=7)
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    summary = _json.load(open(bound.summary_path))
    for key in ("epsilon_lower_bound_max", "epsilon_lower_bound_extrapolated"):
        assert acc.Scalars(f"label_dp/{key}")[-1].value == pytest.approx(summary[key], rel=1e-6)
    attack_summary = _json.load(open(attack.summary_path))
    assert acc.Scalars("label_attack/accuracy")[-1].value == pytest.approx(attack_summary["accuracy"], rel=1e-6)


def test_labels_that_are_not_one_index_per_example_skip_the_step_never_the_fit(tmp_path):
    """One-hot targets from label_fn ([N, K], as cross_entropy accepts) were flattened into
    N K labels and the step hook raised out of optimizer.step(); now each such step is skipped
    (bad_labels, warned once) and a label_fn that fails on a batch disables the audit."""
    import warnings as _warnings

    import torch.nn.functional as F

    def onehot(batch):
        return F.one_hot(batch[1].long(), 10)

    bound = LabelDPLowerBound(label_fn=onehot)
    attack = LabelReconstructionAttack(label_fn=onehot)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        _fit(tmp_path, [attack, bound], dataset="digits", classes=10, epochs=1)
    for cb in (bound, attack):
        assert cb.skips["bad_labels"] > 0
        said = [w for w in caught if f"{type(cb).__name__}: step skipped (bad_labels)" in str(w.message)]
        assert len(said) == 1

    def broken(batch):
        raise KeyError("labels")

    bound = LabelDPLowerBound(label_fn=broken)
    _fit(tmp_path / "b", [bound], dataset="digits", classes=10, epochs=1)
    assert bound.disabled_reason == "bad_labels"


def test_label_dp_accountant_epsilon_covers_a_resumed_and_a_repeated_fit(tmp_path):
    """A resumed fit's ``PrivacyEngine`` starts with an empty accountant: ``epsilon_accountant``
    covered only the steps after the checkpoint (5.41 at 48 steps, the 24-step value). The
    callback checkpoints the history and puts it back (warned once), as CanaryAudit does; a
    repeated fit with the same callback object carries it too."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from opacus.accountants import RDPAccountant

    def fit(cb, epochs, ckpt=None):
        module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), noise_multiplier=1.0, max_grad_norm=1.0,
                                 accountant="rdp")
        trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[cb, ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)],
                             default_root_dir=str(tmp_path))
        trainer.fit(module, datamodule=CentralDataModule("breast_cancer", batch_size=64), ckpt_path=ckpt)
        return trainer, module

    def rdp(history):
        acc = RDPAccountant()
        acc.history = list(history)
        return acc.get_epsilon(1e-5)

    _, first = fit(LabelDPLowerBound(delta=1e-5), 2)
    per_fit = list(first.privacy_engine.accountant.history)
    resumed_cb = LabelDPLowerBound(delta=1e-5)
    with pytest.warns(UserWarning, match="earlier steps were put back"):
        trainer, resumed = fit(resumed_cb, 4, str(tmp_path / "ckpt" / "last.ckpt"))
    steps = sum(h[2] for h in resumed.privacy_engine.accountant.history)
    assert steps == trainer.global_step == 2 * sum(h[2] for h in per_fit)
    assert resumed_cb.epsilon_accountant == pytest.approx(rdp([(h[0], h[1], steps) for h in per_fit[:1]]), rel=1e-9)
    repeated_cb = LabelDPLowerBound(delta=1e-5)
    fit(repeated_cb, 2)
    _, again = fit(repeated_cb, 2)  # the same callback, a new PrivacyEngine, no checkpoint
    assert repeated_cb.epsilon_accountant == pytest.approx(rdp(again.privacy_engine.accountant.history), rel=1e-12)
    assert sum(h[2] for h in again.privacy_engine.accountant.history) == 2 * sum(h[2] for h in per_fit)
