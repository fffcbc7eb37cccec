"""Resuming the label callbacks from a checkpoint: the settings the results were computed at
are kept (a resume at others is refused, naming the setting), and what the logger and the
summary state (the latest reason code, the class count, the attacked layer, the norms used) is
as the uninterrupted run's."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG|"
                                        "Optimal order|checkpoint|val_dataloader|put back).*")

CHECKPOINT_STEP = 4


def _fit(root, callbacks, *, max_steps, ckpt=None, every=None, delta=1e-5, dataset="digits", log_every=50):
    """A 10-class (digits) or binary (breast_cancer) MLP; ``every``: a checkpoint every that
    many steps. Fixed batches (no shuffle, no Poisson): runs are compared step by step."""
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule(dataset, batch_size=16, poisson=False, shuffle=False, seed=0)
    inputs, classes = (64, 10) if dataset == "digits" else (30, 1)
    module = DPSGDClassifier(MLP(inputs, classes, hidden=(32,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0,
                             noise_seed=0, delta=delta)
    extra = [ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=every, save_top_k=-1)] if every else []
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=1, logger=False, callbacks=[*callbacks, *extra],
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         enable_checkpointing=bool(every), log_every_n_steps=log_every, limit_val_batches=0,
                         default_root_dir=str(root))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
    return trainer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Both callbacks on the 10-class MLP, every step attacked, a checkpoint at step 4: its
    path and the callbacks (``second_last`` asked for, and not used: binary models only)."""
    root = tmp_path_factory.mktemp("label_resume")
    callbacks = [LabelDPLowerBound(every_n_steps=1, delta=1e-5, second_last=True),
                 LabelReconstructionAttack(every_n_steps=1)]
    _fit(root, callbacks, max_steps=CHECKPOINT_STEP, every=CHECKPOINT_STEP)
    (path,) = (root / "ckpt").glob("*.ckpt")
    return path, callbacks


def _state(path, name):
    return torch.load(path, weights_only=False)["callbacks"][name]


@pytest.mark.parametrize("make,setting,saved,given", [
    (lambda: LabelDPLowerBound(every_n_steps=1, delta=0.1, second_last=True), "delta", 1e-5, 0.1),
    (lambda: LabelDPLowerBound(every_n_steps=2, delta=1e-5, second_last=True), "every_n_steps", 1, 2),
    (lambda: LabelDPLowerBound(every_n_steps=None, delta=1e-5, second_last=True), "every_n_steps", 1, None),
    (lambda: LabelDPLowerBound(every_n_steps=1, delta=1e-5), "second_last", True, False),
    (lambda: LabelDPLowerBound(every_n_steps=1, delta=1e-5, second_last=True, min_examples=50), "min_examples",
     100, 50),
    (lambda: LabelReconstructionAttack(every_n_steps=1, min_examples=500), "min_examples", 100, 500),
    (lambda: LabelReconstructionAttack(every_n_steps=3), "every_n_steps", 1, 3),
])
def test_a_resume_at_other_settings_is_refused_naming_the_setting_and_both_values(checkpoint, make, setting,
                                                                                  saved, given):
    """Before, a resume at delta 0.1 of bounds computed at 1e-5 gave a summary stating delta
    0.1 with the 1e-5 maximum; now it is refused before anything is loaded."""
    path, _ = checkpoint
    callback = make()
    state = _state(path, type(callback).__name__)
    with pytest.raises(ValueError, match=rf"{setting}={saved!r}, this one {given!r}"):
        callback.load_state_dict(state)
    assert callback.steps == 0 and callback.attacked_steps == 0  # nothing loaded


def test_the_same_settings_and_an_older_checkpoint_load(checkpoint):
    """A checkpoint saved before the settings were kept (no ``settings``) loads as before."""
    path, (bound, attack) = checkpoint
    same = LabelDPLowerBound(every_n_steps=1, delta=1e-5, second_last=True)
    same.load_state_dict(_state(path, "LabelDPLowerBound"))
    assert same.records == bound.records and same.steps == CHECKPOINT_STEP
    older = {k: v for k, v in _state(path, "LabelDPLowerBound").items() if k != "settings"}
    other = LabelDPLowerBound(every_n_steps=2, delta=0.1, min_examples=7)
    other.load_state_dict(older)
    assert other.records == bound.records
    older = {k: v for k, v in _state(path, "LabelReconstructionAttack").items() if k != "settings"}
    rec = LabelReconstructionAttack(every_n_steps=5, min_examples=500)
    rec.load_state_dict(older)
    assert rec.steps == attack.steps == CHECKPOINT_STEP


def test_a_delta_resolved_from_the_module_is_checked_too(checkpoint, tmp_path):
    """``delta=None`` takes the module's: a module at another delta than the checkpoint's
    bounds is refused at fit start, before a step or a summary."""
    path, _ = checkpoint
    bound = LabelDPLowerBound(every_n_steps=1, second_last=True)
    with pytest.raises(ValueError, match=r"delta=1e-05, this one 0.001"):
        _fit(tmp_path, [bound], max_steps=2 * CHECKPOINT_STEP, ckpt=str(path), delta=1e-3)
    assert bound.summary_path is None
    same = LabelDPLowerBound(every_n_steps=1, second_last=True)  # the module's 1e-5: the checkpoint's
    _fit(tmp_path / "same", [same], max_steps=CHECKPOINT_STEP + 1, ckpt=str(path))
    assert same.summary()["delta"] == 1e-5 and same.steps == CHECKPOINT_STEP + 1


def test_a_resume_that_takes_no_step_states_what_the_checkpoint_measured(checkpoint, tmp_path):
    """Before, a resume with no step left wrote num_classes 1 (of 10), flipped_norms None,
    layer None and the report's num_classes 2 (and second_last as asked, not as used)."""
    path, (bound, attack) = checkpoint
    again = [LabelDPLowerBound(every_n_steps=1, delta=1e-5, second_last=True),
             LabelReconstructionAttack(every_n_steps=1)]
    trainer = _fit(tmp_path, again, max_steps=CHECKPOINT_STEP, ckpt=str(path))
    assert trainer.global_step == CHECKPOINT_STEP and again[0].steps == CHECKPOINT_STEP
    first, resumed = bound.summary(), again[0].summary()
    assert first["num_classes"] == 10 and first["flipped_norms"] is not None and not first["inputs"]["second_last"]
    for key in ("num_classes", "flipped_norms", "inputs", "epsilon_lower_bound_max", "attacked_steps",
                "epsilon_lower_bound_second_last_max"):
        assert resumed[key] == first[key], key
    first, resumed = attack.summary(), again[1].summary()
    assert first["layer"].startswith("Linear(in_features=32, out_features=10")
    assert resumed["layer"] == first["layer"] and resumed["inputs"] == first["inputs"]
    assert again[1].report_section()[1]["num_classes"] == attack.report_section()[1]["num_classes"] == 10


def test_a_resumed_run_logs_the_steps_the_uninterrupted_run_logs(tmp_path):
    """every_n_steps=5, every step logged: the steps after a checkpoint at step 7 and before
    the next considered one (11) were not logged on resume (the latest reason code was lost)."""
    def run(root, *, max_steps, ckpt=None, every=None):
        bound = LabelDPLowerBound(every_n_steps=5, delta=1e-5)
        logged = []
        scalars = bound.output.scalars
        bound.output.scalars = lambda metrics, step: (logged.append((step, dict(metrics))), scalars(metrics, step))
        _fit(root, [bound], max_steps=max_steps, ckpt=ckpt, every=every, dataset="breast_cancer", log_every=1)
        return logged

    full = run(tmp_path / "full", max_steps=12, every=7)
    resumed = run(tmp_path / "resumed", max_steps=12, ckpt=str(next((tmp_path / "full" / "ckpt").glob("*.ckpt"))))
    assert [s for s, _ in resumed] == [s for s, _ in full if s > 7] == list(range(8, 13))
    # until the next attacked step (11) the checkpoint's latest values and coverage; from it on
    # the noise differs (the resumed optimizer draws anew)
    assert resumed[:3] == [(s, m) for s, m in full if 7 < s < 11]
