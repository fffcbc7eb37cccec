"""DP-FedAvg's canary clients go through the module's own clipping (issue 25, part 2).

A canary client's update is ``canary_norm_multiplier * clip_norm * c_j``; DPFedAvg's clip stage
clips it as it clips a real client's update, on both paths (rows in the update matrix, or the
owner's sum through ``DPFedAvg.clip_virtual_updates``). With correct clipping a canary adds
exactly ``clip_norm * c_j`` to the noisy sum; with a planted clipping at 2C it adds twice that.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn

from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import DPFedAvg, FederatedAuditHooks
from audit_callbacks.federated.clipping import clip_updates_
from tests._federated import quick_trainer, tiny_federation

CLIP = 0.5


class Clip2C(DPFedAvg):
    """Planted bug: the module's clipping at 2C (the noise and the accountant still say C)."""

    def clip_updates(self, updates):
        return clip_updates_(updates, 2 * self.clip_norm)


class Stage2C(DPFedAvg):
    """Planted bug in the clip stage itself (not in ``clip_updates``)."""

    def _clip(self, fl_round):
        clip_updates_(fl_round.updates, 2 * self.clip_norm)
        return fl_round


class Alternating(DPFedAvg):
    """Planted bug whose factor changes from round to round: C in odd rounds, 2C in even ones."""

    def clip_updates(self, updates):
        return clip_updates_(updates, self.clip_norm * (1 + self.round % 2))


class Capture(FederatedAuditHooks, pl.Callback):
    """Every round's noisy sum (``average * m``) and its canary clients."""

    def __init__(self, rows=False):
        self.rounds = []
        self.rows = rows
        self.row_norms = []

    def on_federated_round_end(self, trainer, pl_module, fl_round):
        name = fl_round.owners[0]
        self.rounds.append((fl_round.index, fl_round.average * fl_round.cohort.divisor,
                            fl_round.cohort.virtual_ids[name].copy(), name in fl_round.summed))


class RowCapture(Capture):
    """Also needs the clipped rows: the module then asks the canary owner for rows."""

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        rows = fl_round.rows_of(fl_round.owners[0])
        self.row_norms.extend(torch.linalg.vector_norm(fl_round.updates[rows], dim=1).tolist())


def run(cls, kind, rows, rounds=6, randomizer=None, multiplier=10.0):
    """Real clients give zero updates (local_lr = 0) and there is no noise, so the noisy sum is
    the canaries' clipped updates alone."""
    torch.manual_seed(0)
    module = cls(nn.Linear(4, 3), clients_per_round=4, noise_multiplier=0.0, clip_norm=CLIP, local_lr=0.0,
                 seed=3, randomizer=randomizer)
    audit = CanaryAudit(num_canaries=6, num_unobserved=2, canaries=kind, seed=1, log_figures=False,
                        log_histograms=False, canary_norm_multiplier=multiplier)
    capture = RowCapture() if rows else Capture()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quick_trainer(rounds, [audit, capture]).fit(module, datamodule=tiny_federation())
    return audit, capture


def check(audit, capture, factor, summed):
    canaries = audit.auditor.canaries
    seen = 0
    for index, total, ids, was_summed in capture.rounds:
        assert was_summed is (summed and ids.size > 0)
        expected = torch.zeros_like(total) if not ids.size else (
            canaries.batch(ids.tolist()).sum(0).to(total.dtype) * CLIP * factor(index))
        torch.testing.assert_close(total, expected, rtol=0, atol=1e-5)
        seen += ids.size
    assert seen == int(audit.auditor.participations.sum()) > 0


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
@pytest.mark.parametrize("rows", [False, True], ids=["sum", "rows"])
def test_correct_clipping_adds_clip_norm_times_each_canary(kind, rows):
    audit, capture = run(DPFedAvg, kind, rows)
    check(audit, capture, lambda t: 1.0, summed=not rows)
    if rows:  # the rows the module clipped were 10 C before clipping, C after
        assert capture.row_norms and np.allclose(capture.row_norms, CLIP, rtol=1e-5)
    assert audit.auditor.summary()["inputs"]["canary_norm_multiplier"] == 10.0


@pytest.mark.parametrize("cls", [Clip2C, Stage2C])
@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
@pytest.mark.parametrize("rows", [False, True], ids=["sum", "rows"])
def test_a_planted_2c_clipping_doubles_each_canary(cls, kind, rows):
    audit, capture = run(cls, kind, rows)
    check(audit, capture, lambda t: 2.0, summed=not rows)


def test_a_clipping_bug_that_changes_every_round_is_seen_every_round():
    # the Hadamard sum path puts one canary row through the module's clipping each round: no
    # factor cached across rounds hides the rounds at 2C
    audit, capture = run(Alternating, "hadamard", rows=False, rounds=8)
    check(audit, capture, lambda t: 1.0 + (t - 1) % 2, summed=True)


def test_a_clipping_that_is_not_a_scaling_sends_every_canary_row_through_it():
    class CoordinateClip(DPFedAvg):
        """Clips each coordinate to +-C/8: not a scaling of the row."""

        def clip_updates(self, updates):
            norms = torch.linalg.vector_norm(updates, dim=1)
            updates.clamp_(-self.clip_norm / 8, self.clip_norm / 8)
            return norms

    sums, rows = run(CoordinateClip, "hadamard", rows=False), run(CoordinateClip, "hadamard", rows=True)
    for (_, a, ids_a, _), (_, b, ids_b, _) in zip(sums[1].rounds, rows[1].rounds, strict=True):
        assert np.array_equal(ids_a, ids_b)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # both paths: each row clamped


def test_local_dp_clients_clip_canaries_before_their_randomizer():
    class Doubler:
        """Releases 2x the clipped row; the server's debias halves it."""

        def randomize(self, x, generator=None):
            return 2 * x

        def debias(self, y):
            return y / 2

    audit, capture = run(DPFedAvg, "hadamard", rows=True, randomizer=Doubler())
    check(audit, capture, lambda t: 1.0, summed=False)
    assert np.allclose(capture.row_norms, CLIP, rtol=1e-5)


def test_the_multiplier_sets_the_norm_before_clipping():
    # at multiplier 1 a canary is exactly at the clipping norm: the module's clipping leaves it
    audit, capture = run(Stage2C, "hadamard", rows=True, multiplier=1.0)
    check(audit, capture, lambda t: 1.0, summed=False)  # 2C does not clip a row of norm C
    assert np.allclose(capture.row_norms, CLIP, rtol=1e-5)
    with pytest.raises(ValueError, match="canary_norm_multiplier"):
        CanaryAudit(num_canaries=6, canary_norm_multiplier=0.5)
