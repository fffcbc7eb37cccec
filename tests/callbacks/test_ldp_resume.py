"""Resuming the local-DP callbacks: a checkpoint of another audit is refused, naming the setting;
the update-norm count survives a resume; the inference audit's docstring says it restarts."""

import json

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import audit_callbacks.callbacks.ldp_audit as ldp_audit_module
import audit_callbacks.callbacks.ldp_inference as ldp_inference_module
from audit_callbacks.callbacks.ldp_audit import (
    LDPAudit,
    check_resume_settings,
    randomizer_id,
)
from audit_callbacks.mechanisms import TwoPoint
from tests._federated import fit
from tests.callbacks.test_ldp_callbacks import make

ADVERSARIES = ("dummy",)


def two_point(epsilon=3.0):
    return TwoPoint(epsilon, center=0.0, radius=0.2)


def audit(**changed):
    kwargs = {"trials": 500, "alpha": 0.05, "every_n_rounds": 2, "adversaries": ADVERSARIES, "seed": 5}
    return LDPAudit(**{**kwargs, **changed})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A run of 2 rounds (one audit) of ``audit()`` on ``two_point(3.0)``, checkpointed."""
    root = tmp_path_factory.mktemp("ldp_resume")
    dm, module = make(two_point(), seed=3)
    ckpt = ModelCheckpoint(dirpath=str(root / "ckpt"), save_last=True, every_n_train_steps=2)
    fit(dm, module, [audit(), ckpt], 2, root / "first", logger=False)
    return root / "ckpt" / "last.ckpt"


@pytest.mark.parametrize(("changed", "randomizer", "setting", "saved", "given"), [
    ({"seed": 6}, two_point(), "seed", "5", "6"),  # another state key: Lightning skipped it
    ({"seed": None}, two_point(), "seed", "5", "None"),
    ({"adversaries": ("dummy", "benign")}, two_point(), "adversaries", "['dummy']", "['dummy', 'benign']"),
    ({"alpha": 0.5}, two_point(), "alpha", "0.05", "0.5"),  # the same key: mixed silently
    ({"trials": 200}, two_point(), "trials", "500", "200"),
    ({}, two_point(1.0), "randomizer", "epsilon_per_coordinate=3.0", "epsilon_per_coordinate=1.0"),
])
def test_a_resume_into_another_audit_is_refused_naming_the_setting(
        checkpoint, tmp_path, changed, randomizer, setting, saved, given):
    dm, module = make(randomizer, seed=3)
    resumed = audit(**changed)
    with pytest.raises(ValueError, match=rf"the checkpoint's audit has {setting}=") as err:
        fit(dm, module, [resumed], 4, tmp_path, logger=False, ckpt_path=str(checkpoint))
    message = str(err.value)
    assert saved in message and given in message, message
    assert message.index(saved) < message.index("this one") < message.rindex(given)
    assert resumed.audits == 0 and resumed.exact is None  # nothing of the old audit was taken


def test_a_resume_with_the_same_settings_goes_on_from_the_checkpoint(checkpoint, tmp_path):
    dm, module = make(two_point(), seed=3)
    resumed = audit()
    fit(dm, module, [resumed], 4, tmp_path, logger=False, ckpt_path=str(checkpoint))
    assert [(r["round"], r["audit"]) for r in resumed.history] == [(2, 1), (4, 2)]
    assert resumed.exact["epsilon_exact_per_coordinate"] == pytest.approx(3.0)
    saved = torch.load(str(checkpoint), weights_only=False)["callbacks"]
    (state,) = [v for k, v in saved.items() if k.startswith("LDPAudit")]
    assert state["settings"] == {"seed": 5, "adversaries": ["dummy"], "alpha": 0.05, "trials": 500,
                                 "randomizer": randomizer_id(two_point())}


def test_check_resume_settings_skips_what_one_side_lacks_and_names_what_differs():
    mine = audit().settings()
    assert mine["randomizer"] is None  # before setup
    check_resume_settings({}, mine)  # a checkpoint saved before settings were kept
    check_resume_settings({**mine, "randomizer": "TwoPoint(...)"}, mine)
    check_resume_settings({**mine, "adversaries": ("dummy",)}, mine)  # a tuple reads as the list
    with pytest.raises(ValueError, match=r"alpha=0\.1, this one 0\.05"):
        check_resume_settings({**mine, "alpha": 0.1}, mine)

    class Plain:
        pass

    first, second = Plain(), Plain()
    assert randomizer_id(first) == randomizer_id(second)  # no memory address
    assert randomizer_id(two_point(3.0)) != randomizer_id(two_point(1.0))


def test_the_withheld_share_says_how_many_updates_were_seen_also_after_a_resume(tmp_path):
    """5 real clients a round, fewer than MIN_CLIENTS_PUBLISHED = 100 updates in all: no share is
    published, and the summary says why with the real count (also across a resume)."""
    assert ldp_audit_module.MIN_CLIENTS_PUBLISHED == 100
    dm, module = make(two_point(), seed=3, per_round=5)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_train_steps=2)
    fit(dm, module, [audit(), ckpt], 2, tmp_path / "a", logger=False)
    dm, module = make(two_point(), seed=3, per_round=5)
    resumed = audit()
    fit(dm, module, [resumed], 4, tmp_path / "b", logger=False,
        ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    summary = json.load(open(resumed.summary_path, encoding="utf-8"))
    reason = "fewer than 100 client updates (20 seen): not published"
    assert summary["results"]["client_updates_at_clip"] == {"status": f"skipped: {reason}"}
    norms = summary["client_update_norms"]
    assert (norms["count"], norms["seen"], norms["status"]) == (0, 20, reason)
    assert norms["client_updates_at_clip"] is None and norms["mean"] is None
    assert resumed.updates_seen == 20 and resumed.update_norms["count"] == 10  # 10 before the resume


def test_the_inference_audit_says_a_resume_restarts_the_attack():
    """Its state_dict holds the logged records only (the target stays in memory): the module's
    docstring must not promise a resumed run the numbers of an uninterrupted one."""
    doc = " ".join(ldp_inference_module.__doc__.split())
    assert "ends with the same numbers" not in doc
    assert "restarts the attack" in doc
    assert "restarts" in " ".join(ldp_inference_module.LDPInferenceAudit.state_dict.__doc__.split())
