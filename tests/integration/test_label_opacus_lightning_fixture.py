"""Both label callbacks on the port of Opacus' Lightning MNIST example (digits, batch 64)."""

import json
import os

import numpy as np
import pytest
from pytorch_lightning.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.callbacks.label_base import SKIP_REASONS
from tests.fixtures.opacus_mnist_lightning import main

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(backward hook|does not have many workers|secure RNG|Optimal order|batch_wider).*")


def test_label_callbacks_complete_the_fit_and_log_a_measurement_or_a_reason(tmp_path):
    attack, bound = LabelReconstructionAttack(), LabelDPLowerBound()
    model, trainer = main(max_epochs=1, callbacks=[attack, bound], enable_progress_bar=False,
                          enable_checkpointing=False, log_every_n_steps=1, default_root_dir=str(tmp_path),
                          logger=TensorBoardLogger(str(tmp_path), name="run", version=0))
    assert trainer.state.finished and model.enable_dp
    # fc2 has 32 inputs + 1 bias and the Poisson batches ~64 examples: the per-example system is
    # under-determined, so every considered step is skipped with that reason, and the attack
    # measures the label counts instead
    for cb in (attack, bound):
        assert cb.considered == cb.steps > 10
        assert sum(cb.skips.values()) == cb.considered
        assert set(cb.skips) <= {"batch_wider_than_layer", "empty_batch"}
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"label_attack/count_accuracy", "label_attack/skip_reason", "label_dp/skip_reason",
            "label_dp/attacked_fraction", "epsilon", "test_accuracy"} <= tags, tags
    reasons = acc.Scalars("label_dp/skip_reason")
    assert len(reasons) == bound.steps
    assert {e.value for e in reasons} <= {SKIP_REASONS["batch_wider_than_layer"], SKIP_REASONS["empty_batch"]}
    counts = [e.value for e in acc.Scalars("label_attack/count_accuracy")]
    assert counts and 0.0 <= min(counts) and np.mean(counts) > 0.3  # noisy, informative
    summary = json.load(open(bound.summary_path))
    assert summary["num_classes"] == 10 and summary["skipped"].get("batch_wider_than_layer", 0) > 0
    assert summary["attacked_fraction"] == 0.0


def test_at_the_scripts_own_logging_interval_each_epoch_is_still_measured(tmp_path):
    """The script as a user runs it (Lightning's default log_every_n_steps=50, epochs of ~18
    steps): by default the callbacks attack the logged steps and each epoch's last step, so
    TensorBoard holds a measurement or a reason for every epoch, not an empty chart."""
    attack, bound = LabelReconstructionAttack(), LabelDPLowerBound()
    model, trainer = main(callbacks=[attack, bound], enable_progress_bar=False, enable_checkpointing=False,
                          default_root_dir=str(tmp_path), logger=TensorBoardLogger(str(tmp_path), name="run",
                                                                                  version=0))
    assert trainer.state.finished and trainer.log_every_n_steps == 50 and bound.steps < 50
    for cb in (attack, bound):
        assert cb.considered == 2  # the last step of each of the 2 epochs
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    epoch_ends = [bound.steps // 2, bound.steps]
    assert [e.step for e in acc.Scalars("label_dp/skip_reason")] == epoch_ends
    # ~64 examples a step: the first block of 100 attacked examples is complete at the second
    # epoch's end (no accuracy over fewer examples is logged: issue 26)
    assert [e.step for e in acc.Scalars("label_attack/count_accuracy")] == epoch_ends[1:]
