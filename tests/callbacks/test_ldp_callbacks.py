import json
import math
import os
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import audit_callbacks.callbacks.ldp_audit as ldp_audit_module
from audit_callbacks.attacks import LDPFLInferenceAttack, measurable_ceiling
from audit_callbacks.callbacks.ldp_audit import (
    ADVERSARY_NAMES,
    BrokenRandomizerWarning,
    LDPAudit,
    familywise_alpha,
    flag_lower_bound,
)
from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.estimators.shuffle import epsilon_from_counts
from audit_callbacks.federated import DPFedAvg, FederatedAuditHooks
from audit_callbacks.mechanisms import LDPSGD, BrokenStaircase, Staircase, TwoPoint
from datamodules import FederatedDataModule
from models import MLP
from tests._federated import fit


def make(randomizer, seed=0, clients=20, per_round=5, rounds_per_epoch=4, local_lr=0.5):
    dm = FederatedDataModule("digits", num_clients=clients, rounds_per_epoch=rounds_per_epoch, seed=seed)
    dm.setup("fit")
    torch.manual_seed(seed)
    module = DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=per_round, noise_multiplier=0.0,
                      clip_norm=1.0, local_lr=local_lr, local_batch_size=64, server_lr=0.1,
                      server_momentum=0.0, seed=seed, randomizer=randomizer, reproducible_noise=True,
                      client_datasets=dm.client_datasets)
    return dm, module


class LyingLDPSGD(LDPSGD):
    """Randomizes with epsilon0 = `real` but claims `claimed` (a broken randomizer)."""

    def __init__(self, claimed, real, clip_norm):
        super().__init__(real, clip_norm)
        self.epsilon0 = claimed

    def randomize(self, x, generator=None):  # overridden: the audit must test this code
        return super().randomize(x, generator)


@pytest.fixture(autouse=True)
def _publish_every_update(monkeypatch):
    """These runs see tens of client updates: publish the update-norm aggregates at every update
    (``test_update_norms_are_published_only_over_blocks_of_clients`` runs the real threshold)."""
    monkeypatch.setattr(ldp_audit_module, "MIN_CLIENTS_PUBLISHED", 1)


def broken_warnings(caught):
    return [w for w in caught if issubclass(w.category, BrokenRandomizerWarning)]


# ------------------------------------------------------------------------------ pure numerics
def test_familywise_alpha_sums_to_alpha_and_flag_bound_matches_the_test():
    total = sum(familywise_alpha(0.05, k, 5) * 5 for k in range(1, 200_001))
    assert total == pytest.approx(0.05 * (1 - 1 / 200_001), rel=1e-9)
    assert familywise_alpha(0.05, 1, 5) == pytest.approx(0.005)
    # delta = 0: the lower bound of the game (epsilon_from_counts, log-domain implementation)
    for counts in [(4800, 200, 150, 4850), (30, 20, 25, 25), (500, 0, 3, 497)]:
        assert flag_lower_bound(*counts, 0.05) == pytest.approx(
            epsilon_from_counts(*counts, 0.05).epsilon_lower_bound, rel=1e-9, abs=1e-12)
    # delta > 0 lowers it; a smaller alpha lowers it
    c = (4800, 200, 150, 4850)
    assert flag_lower_bound(*c, 0.05, delta=0.01) < flag_lower_bound(*c, 0.05)
    assert flag_lower_bound(*c, 0.001) < flag_lower_bound(*c, 0.05)
    assert flag_lower_bound(0, 0, 10, 10, 0.05) == 0.0
    with pytest.raises(ValueError):
        familywise_alpha(0.05, 0, 5)
    with pytest.raises(ValueError):
        flag_lower_bound(-1, 0, 1, 1, 0.05)


# ------------------------------------------------------------------------------ LDPAudit
def test_end_to_end_tags_layout_summary_and_values(tmp_path):
    dm, module = make(LDPSGD(2.0, 1.0))
    audit = LDPAudit(trials=4000, every_n_rounds=3, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(dm, module, [audit], 8, tmp_path)
    assert not broken_warnings(caught)
    run_dir = os.path.join(str(tmp_path), "run", "version_0")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    expected = {"ldp/epsilon0_claimed", "ldp/epsilon0_ceiling", "ldp/clip_norm",
                "ldp/client_updates_at_clip", "val/accuracy"}
    for name in ADVERSARY_NAMES:
        expected |= {f"ldp/epsilon0_{name}", f"ldp/epsilon0_lower_bound_{name}"}
    assert expected <= set(acc.Tags()["scalars"])
    # no real example's gradient norm is logged (issue 37 item 2)
    assert not [t for t in acc.Tags()["scalars"] if "norm_g" in t or "cosine" in t]
    for tag in expected:
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    # audits after rounds 3 and 6, and at fit end (round 8)
    assert [e.step for e in acc.Scalars("ldp/epsilon0_dummy")] == [3, 6, 8]
    assert [r["round"] for r in audit.history if r["adversary"] == "dummy"] == [3, 6, 8]
    # the logged values are the recorded ones, next to the claim and the ceiling
    logged = {e.step: e.value for e in acc.Scalars("ldp/epsilon0_lower_bound_gradient_flip")}
    for rec in audit.history:
        if rec["adversary"] == "gradient_flip":
            assert logged[rec["round"]] == pytest.approx(rec["epsilon0_lower_bound"], rel=1e-6)
    assert {e.value for e in acc.Scalars("ldp/epsilon0_claimed")} == {2.0}
    ceilings = {e.step: e.value for e in acc.Scalars("ldp/epsilon0_ceiling")}
    for rnd, ceiling in ceilings.items():  # the realised splits' (4000 trials: near 6.29)
        recs = [r for r in audit.history if r["round"] == rnd]
        assert ceiling == pytest.approx(max(r["ceiling"] for r in recs), rel=1e-6)
        assert abs(ceiling - measurable_ceiling(4000, 0.05)) < 0.1
    for rec in audit.history:
        assert rec["method"] == "fast"
        assert 0 <= rec["epsilon0_lower_bound"] <= rec["epsilon0"] <= ceilings[rec["round"]] + 1e-5
        if rec["adversary"] in ("dummy", "collusion"):
            assert rec["norm_g1"] >= 1.0 - 1e-6 and rec["epsilon0_expected"] == pytest.approx(2.0)
            assert rec["epsilon0_lower_bound"] <= 2.0 <= rec["epsilon0_upper_bound"]
    # one chart: estimates + lower bounds + claimed eps0 + ceiling; accuracy; norms
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs_meta
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    main = charts["epsilon0 (estimates, lower bounds, claimed)"]
    assert {"^ldp/epsilon0_dummy$", "^ldp/epsilon0_lower_bound_dummy$", "^ldp/epsilon0_claimed$",
            "^ldp/epsilon0_ceiling$"} <= set(main)
    assert charts["accuracy"] == ["^val/accuracy$"]
    assert charts["clip norm"] == ["^ldp/clip_norm$"]

    with open(os.path.join(run_dir, "ldp_audit_summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["flagged"] is False and summary["flags"] == []
    assert summary["inputs"]["epsilon0_claimed"] == 2.0 and summary["inputs"]["dim"] == 650
    assert summary["exact_audit"] is None  # LDP-SGD is not a discrete per-coordinate mechanism
    assert set(summary["adversaries"]) == set(ADVERSARY_NAMES)
    assert summary["adversaries"]["dummy"]["audits"] == 3
    assert len(summary["history"]) == 15
    # each audit's epsilon0 with its bounds is one AuditResult with the record's numbers
    for rec, pub in zip(audit.history, summary["history"], strict=True):
        res = AuditResult(**pub["epsilon0"])
        assert (res.value, res.lower, res.upper) == (
            rec["epsilon0"], rec["epsilon0_lower_bound"], rec["epsilon0_upper_bound"])
        assert res.counts == {k: rec[k] for k in ("tp", "fn", "fp", "tn", "trials")}
        assert res.alpha == 0.05 and res.delta == 0.0 and res.method == "ldp_test_fast"
        assert (res.status == "ok") is (not rec["epsilon0_capped"])
        flag = AuditResult(**pub["epsilon0_lower_bound_familywise"])
        assert (flag.value, flag.alpha) == (rec["epsilon0_lower_bound_familywise"], rec["familywise_alpha"])
    norms = summary["client_update_norms"]
    assert norms["count"] == 8 * 5 and 0 <= norms["client_updates_at_clip"] <= 1 and norms["mean"] <= 1 + 1e-5
    # no real client's id or per-example value leaves the process (issue 16 item 8)
    assert "max" not in norms
    for rec in [*summary["history"], *(a["last"] for a in summary["adversaries"].values())]:
        assert not {"client", "norm_g1", "norm_g2", "cosine_g1_g2", "g1_at_clip"} & set(rec), rec
        if rec["adversary"] != "dummy":  # the closed form and the test seed give the pair's norms
            assert not {"epsilon0_expected", "seed"} & set(rec["epsilon0"]["details"]), rec
    assert not any("norm" in k for a in summary["adversaries"].values() for k in a)
    assert all("client" in rec for rec in audit.history)  # kept in memory for the user


def test_every_logged_tag_summary_key_and_chart_is_in_the_name_table(tmp_path):
    """Walks :mod:`audit_callbacks.names` against what both LDP callbacks write: every scalar of
    families ``ldp`` / ``ldp_inference`` is registered (and every registered one is logged by
    this run, which exercises them all), the records and summaries use the same names with the
    logged numbers, and the Custom Scalars layout draws only registered tags."""
    import re

    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs_meta

    from audit_callbacks import names
    from audit_callbacks.attacks import ADVERSARIES
    from audit_callbacks.callbacks.ldp_inference import INFERENCE_MODES

    families = ("ldp", "ldp_inference")
    assert ADVERSARY_NAMES == tuple(ADVERSARIES)
    dm, module = make(Staircase(2.0, center=0.0, radius=0.5, precision=2, groups=4))
    audit, inf = LDPAudit(trials=200, every_n_rounds=2, seed=4), LDPInferenceAudit(seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(dm, module, [audit, inf], 4, tmp_path)  # audits after rounds 2 and 4; one epoch
    title, section = audit.report_section()  # what the audit report shows of this audit
    assert "epsilon0" in title and section["flagged"] == bool(audit.flags)
    assert {k for k in section if k.startswith("epsilon0_mean_")} == {f"epsilon0_mean_{a}" for a in audit.adversaries}
    run_dir = os.path.join(str(tmp_path), "run", "version_0")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()

    # tags: logged == registered for both families
    registered = {q.tag for q in names.QUANTITIES if q.family in families}
    logged = {t for t in acc.Tags()["scalars"] if t.split("/")[0] in families}
    assert logged <= registered, logged - registered
    assert registered <= logged, registered - logged
    with pytest.raises(KeyError):
        names.tag("ldp", "epsilon0_lo_dummy")
    scalars = {t: {e.step: e.value for e in acc.Scalars(t)} for t in logged}

    # LDPAudit's records: a per-adversary name is the record's key + "_<adversary>"
    for rec in audit.history:
        adv, rnd = rec["adversary"], rec["round"]
        for stem in ("epsilon0", "epsilon0_lower_bound", "norm_g1"):
            name = f"{stem}_{adv}"
            if stem == "norm_g1":  # a real example's value: in memory only, never registered
                assert name not in names.names("ldp")
                continue
            assert scalars[names.tag("ldp", name)][rnd] == pytest.approx(rec[stem], rel=1e-6)
        for name in ("epsilon0_claimed", "clip_norm"):
            assert scalars[names.tag("ldp", name)][rnd] == pytest.approx(rec[name], rel=1e-6)
    # LDPAudit's summary: the same names, the logged numbers
    summary = json.load(open(audit.summary_path, encoding="utf-8"))
    assert summary["source"] and "paper" not in summary
    assert summary["tags"] == {q.name: q.tag for q in names.family("ldp")}
    inputs = summary["inputs"]
    for name in ("epsilon0_claimed", "clip_norm"):
        assert all(v == pytest.approx(inputs[name], rel=1e-6) for v in scalars[names.tag("ldp", name)].values())
    last = max(scalars[names.tag("ldp", "epsilon0_ceiling")])
    assert scalars[names.tag("ldp", "epsilon0_ceiling")][last] == pytest.approx(
        summary["results"]["epsilon0_ceiling"]["value"], rel=1e-6)
    share = summary["client_update_norms"]["client_updates_at_clip"]
    assert scalars[names.tag("ldp", "client_updates_at_clip")][4] == pytest.approx(share, rel=1e-6)
    for pub in summary["history"]:
        res, adv, rnd = AuditResult(**pub["epsilon0"]), pub["adversary"], pub["round"]
        assert scalars[names.tag("ldp", f"epsilon0_{adv}")][rnd] == pytest.approx(res.value, rel=1e-6)
        assert scalars[names.tag("ldp", f"epsilon0_lower_bound_{adv}")][rnd] == pytest.approx(res.lower, rel=1e-6)
        assert res.source == summary["source"]
    exact = summary["exact_audit"]
    for name in ("epsilon_exact_per_coordinate", "epsilon_claimed_per_coordinate"):
        value = exact[name]["value"] if isinstance(exact[name], dict) else exact[name]
        assert scalars[names.tag("ldp", name)][0] == pytest.approx(value, rel=1e-9)
        assert audit.exact[name] == value
    assert AuditResult(**exact["epsilon_exact_per_coordinate"]).value == pytest.approx(2.0, rel=1e-9)

    # LDPInferenceAudit: records and summary keyed by the registered names
    inf_summary = json.load(open(inf.summary_path, encoding="utf-8"))
    assert inf_summary["source"] and "paper" not in inf_summary
    assert inf_summary["tags"] == {q.name: q.tag for q in names.family("ldp_inference")}
    assert {f"error_{m}" for m in INFERENCE_MODES} <= set(names.names("ldp_inference"))
    for h in [*inf.history, *inf_summary["history"], inf_summary["final"]]:
        keys = set(h) - {"round", "rows"}
        assert keys == set(names.names("ldp_inference")), keys
        for name in keys:
            if h[name] is not None:
                assert scalars[names.tag("ldp_inference", name)][h["round"]] == pytest.approx(h[name], rel=1e-6)

    # the layout (read back from the event file) draws registered tags only, each anchored
    layout = layout_pb2.Layout()
    for event in acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG):
        layout.MergeFromString(event.tensor_proto.string_val[0])
    drawn = {t for cat in layout.category for c in cat.chart for t in c.multiline.tag}
    anchored = {f"^{re.escape(q.tag)}$": q for q in names.QUANTITIES}
    assert drawn <= set(anchored), drawn - set(anchored)
    assert {anchored[t].family for t in drawn} == {*families, "val"}
    assert {t for t in drawn if anchored[t].family in families} == {
        t for t, q in anchored.items() if q.family in families and q.chart is not None}
    for t in drawn:  # and each draws a logged scalar
        assert any(re.search(t, x) for x in acc.Tags()["scalars"]), t


def test_correct_randomizer_is_never_flagged_across_many_audits():
    # 300 audits of a correct LDP-SGD, worst-case adversaries: the per-test 95% lower bound
    # exceeds the true eps0 now and then (so flagging on it would flag correct randomizers),
    # the family-wise flag never fires.
    dm, module = make(LDPSGD(1.0, 1.0), clients=10)
    audit = LDPAudit(trials=1000, adversaries=("gradient_flip", "dummy"), every_n_rounds=1, seed=3)
    audit._dim = module.num_parameters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for round_idx in range(1, 301):
            audit.audit(None, module, round_idx)
    assert not broken_warnings(caught) and audit.flags == []
    assert not any(r["flagged"] for r in audit.history)
    exceed = [r["exceeds_claimed_per_test"] for r in audit.history]
    assert 0 < np.mean(exceed) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(exceed))
    # both pairs have |g1| = L and g2 = -g1: the test's value is eps0 (paper 000 Prop. 3.1);
    # pooled over the 300 audits (1.5e5 trials per rate) the interval still holds eps0
    for name in ("gradient_flip", "dummy"):
        recs = [r for r in audit.history if r["adversary"] == name]
        pooled = epsilon_from_counts(*(sum(r[k] for r in recs) for k in ("tp", "fn", "fp", "tn")))
        assert pooled.epsilon_lower_bound <= 1.0 <= pooled.epsilon_upper_bound
        assert pooled.epsilon == pytest.approx(1.0, abs=0.03)


def test_logged_ceiling_is_the_realised_splits_and_no_lower_bound_exceeds_it():
    # each test splits its trials at random; the ceiling of the nominal split (1000 / 1000) is
    # below the lower bound of a zero-error test whose split is uneven, so the logged ceiling
    # must be the zero-error bound of the group sizes the tests actually had
    dm, module = make(LDPSGD(30.0, 1.0), clients=10)
    audit = LDPAudit(trials=2000, adversaries=("gradient_flip", "dummy"), every_n_rounds=1, seed=5)
    logged = {}
    audit.output.bind = lambda trainer: None
    audit.output.scalars = lambda values, step: logged.__setitem__(step, dict(values))
    nominal = measurable_ceiling(2000, 0.05)
    for round_idx in range(1, 9):
        audit.audit(object(), module, round_idx)
    assert sorted(logged) == list(range(1, 9))
    moved = 0
    for round_idx, values in logged.items():
        recs = [r for r in audit.history if r["round"] == round_idx]
        assert len(recs) == 2
        ceiling = values["ldp/epsilon0_ceiling"]
        sizes = [(r["fp"] + r["tn"], r["fn"] + r["tp"]) for r in recs]
        assert all(n1 + n2 == 2000 for n1, n2 in sizes)
        own = max(epsilon_from_counts(n2, 0, 0, n1).epsilon_lower_bound for n1, n2 in sizes)
        assert ceiling == pytest.approx(own, rel=1e-12)
        for r in recs:
            assert values[f"ldp/epsilon0_lower_bound_{r['adversary']}"] <= ceiling + 1e-12
            assert r["epsilon0_lower_bound"] <= ceiling + 1e-12
        moved += abs(ceiling - nominal) > 1e-9
    assert moved  # the splits were uneven: the nominal ceiling would not do
    # the summary's ceiling is the last audit's, the nominal split's in its details
    summary = audit.audit_summary(module)
    assert summary["results"]["epsilon0_ceiling"]["value"] == pytest.approx(logged[8]["ldp/epsilon0_ceiling"])
    assert summary["results"]["epsilon0_ceiling"]["details"]["nominal_split_ceiling"] == pytest.approx(nominal)


def test_broken_ldp_sgd_is_flagged_once_per_adversary(tmp_path):
    dm, module = make(LyingLDPSGD(claimed=0.5, real=4.0, clip_norm=1.0))
    audit = LDPAudit(trials=2000, adversaries=("gradient_flip", "dummy"), every_n_rounds=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(dm, module, [audit], 4, tmp_path, logger=False)
    flagged = broken_warnings(caught)
    assert len(flagged) == 2  # two adversaries, two audits each: warned once per adversary
    assert all("BROKEN RANDOMIZER" in str(w.message) for w in flagged)
    assert {f["adversary"] for f in audit.flags} == {"gradient_flip", "dummy"}
    assert len(audit.flags) == 4
    for rec in audit.history:
        assert rec["method"] == "batched"  # the overriding randomize was tested, not the claim
        assert rec["epsilon0_lower_bound_familywise"] > 0.5 and rec["epsilon0"] > 3.0
    with open(audit.summary_path, encoding="utf-8") as fh:
        assert json.load(fh)["flagged"] is True


def test_exact_audit_flags_the_broken_staircase_only(tmp_path):
    kwargs = dict(center=0.0, radius=0.5, precision=2, groups=4)
    results = {}
    for name, mech in (("correct", Staircase(2.0, **kwargs)),
                       ("broken", BrokenStaircase(2.0, defect="per_group", **kwargs))):
        dm, module = make(mech)
        audit = LDPAudit(trials=200, adversaries=("dummy",), every_n_rounds=2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(dm, module, [audit], 2, tmp_path / name, logger=False)
        results[name] = (audit, broken_warnings(caught))
    good, good_warn = results["correct"]
    assert good.exact["epsilon_exact_per_coordinate"] == pytest.approx(2.0, rel=1e-9)
    assert not good.exact["flagged"] and not good_warn and good.flags == []
    bad, bad_warn = results["broken"]
    # per_group defect: eps + log(n_m / n_1) > eps (mechanisms/staircase.py)
    sizes = bad.exact and BrokenStaircase(2.0, defect="per_group", **kwargs).group_sizes
    assert bad.exact["epsilon_exact_per_coordinate"] == pytest.approx(2.0 + math.log(sizes[-1] / sizes[0]), rel=1e-9)
    assert bad.exact["flagged"] and len(bad_warn) == 1 and "exact audit" in str(bad_warn[0].message)
    # the whole-row cosine test cannot see it: the claim for d = 650 coordinates is 1300
    assert bad.history[0]["epsilon0_claimed"] == pytest.approx(1300.0) and not bad.history[0]["flagged"]


def test_exact_result_is_an_audit_result_or_says_why_not():
    from audit_callbacks.callbacks.ldp_audit import exact_result

    witness = {"x_high": 0.5, "x_low": -0.5, "y": 0.25}
    finite = exact_result({"epsilon_exact_per_coordinate": 2.5, **witness})
    assert AuditResult(**finite) == AuditResult(value=2.5, method="exact_enumeration",
                                                source=finite["source"], details=witness)
    infinite = exact_result({"epsilon_exact_per_coordinate": math.inf, **witness})
    assert infinite == {"status": "infinite: output 0.25 has probability 0 under input -0.5 and "
                                  "not under 0.5", "details": witness}


def test_resume_gives_identical_final_numbers(tmp_path):
    def callbacks():
        return [LDPAudit(trials=2000, every_n_rounds=3, seed=5), LDPInferenceAudit(seed=2)]

    def two_point():
        return TwoPoint(3.0, center=0.0, radius=0.2)

    dm, module = make(two_point(), seed=3)
    full = callbacks()
    fit(dm, module, full, 8, tmp_path / "a", logger=False)

    dm, module = make(two_point(), seed=3)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_train_steps=4)
    fit(dm, module, [*callbacks(), ckpt], 4, tmp_path / "b", logger=False)
    dm, module = make(two_point(), seed=3)
    resumed = callbacks()
    fit(dm, module, [*resumed, ModelCheckpoint(dirpath=str(tmp_path / "ckpt2"))], 8, tmp_path / "c",
        logger=False, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert [r["round"] for r in full[0].history if r["adversary"] == "dummy"] == [3, 6, 8]
    # the checkpoint keeps no client id, norms or cosine (issue 26): the rounds after the resume
    # are whole, the ones before come back without those fields
    private = {"client", "norm_g1", "norm_g2", "cosine_g1_g2", "epsilon0_expected", "seed"}

    def public(rec):
        out = {k: v for k, v in rec.items() if k not in private and k != "results"}
        out["results"] = {n: {**r, "details": {k: v for k, v in r.get("details", {}).items() if k not in private}}
                          for n, r in rec["results"].items()}
        return out

    before = [r for r in resumed[0].history if r["round"] <= 4]
    assert before and all(not (private - {"epsilon0_expected", "seed"}) & set(r) for r in before)
    assert all(not private & set(r) for r in before if r["adversary"] != "dummy")
    assert [public(r) for r in resumed[0].history] == [public(r) for r in full[0].history]
    assert resumed[0].update_norms == full[0].update_norms
    # the inference attack's target (real clients' un-randomized updates) is not checkpointed:
    # the records up to the checkpoint come back, and the attack restarts at the resume
    assert len(full[1].history) == 8 and len(resumed[1].history) == 8
    assert resumed[1].history[:4] == full[1].history[:4]
    per_round = full[1].history[0]["rows"]
    assert [r["rows"] for r in resumed[1].history[4:]] == [per_round * i for i in range(1, 5)]
    state = torch.load(str(tmp_path / "ckpt" / "last.ckpt"), weights_only=False)["callbacks"]
    (inference,) = [v for k, v in state.items() if k.startswith("LDPInferenceAudit")]
    assert set(inference) == {"history"}


def test_update_norms_are_published_only_over_blocks_of_clients(tmp_path, monkeypatch):
    """One client a round: the share of clipped updates and the mean norm reach no tag, summary
    or checkpoint before MIN_CLIENTS_PUBLISHED updates (one value would be that client's, the
    difference of two successive ones too); in memory they cover every update."""
    monkeypatch.setattr(ldp_audit_module, "MIN_CLIENTS_PUBLISHED", 100)
    dm, module = make(TwoPoint(3.0, center=0.0, radius=0.2), per_round=1)
    audit = LDPAudit(trials=1000, every_n_rounds=2, seed=1)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_train_steps=3)
    fit(dm, module, [audit, ckpt], 6, tmp_path)
    assert audit.update_norms["count"] == 6
    summary = json.load(open(audit.summary_path, encoding="utf-8"))
    assert summary["client_update_norms"]["count"] == 0
    assert summary["client_update_norms"]["mean"] is None
    assert summary["client_update_norms"]["client_updates_at_clip"] is None
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    assert "ldp/client_updates_at_clip" not in acc.Tags()["scalars"]
    state = torch.load(str(tmp_path / "ckpt" / "last.ckpt"), weights_only=False)["callbacks"]
    (ldp_state,) = [v for k, v in state.items() if k.startswith("LDPAudit")]
    assert ldp_state["update_norms"]["count"] == 0
    # at the threshold the block is published, and the checkpoint resumes from it
    monkeypatch.setattr(ldp_audit_module, "MIN_CLIENTS_PUBLISHED", 4)
    dm, module = make(TwoPoint(3.0, center=0.0, radius=0.2), per_round=1)
    audit = LDPAudit(trials=1000, every_n_rounds=2, seed=1)
    fit(dm, module, [audit], 6, tmp_path / "b")
    assert audit.published_norms["count"] == 4 and audit.update_norms["count"] == 6
    summary = json.load(open(audit.summary_path, encoding="utf-8"))
    assert summary["client_update_norms"]["count"] == 4


def test_wrong_module_or_no_randomizer_warns_once_and_steps_aside(tmp_path):
    with pytest.raises(ValueError, match="adversaries"):
        LDPAudit(adversaries=("dummy", "nope"))
    with pytest.raises(ValueError, match="trials"):
        LDPAudit(trials=1)
    with pytest.raises(ValueError, match="modes"):
        LDPInferenceAudit(modes=("exact",))

    class Plain(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def training_step(self, batch, idx):
            return self.lin(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)

    def steps_aside(cb, dm, module, reason, needs, folder):
        """One warning saying what the audit needs, the fit runs its steps, nothing written."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = fit(dm, module, [cb], 2, tmp_path / folder, logger=False)
        said = [str(w.message) for w in caught if f"{type(cb).__name__} disabled" in str(w.message)]
        assert len(said) == 1 and needs in said[0] and "training continues" in said[0], said
        assert cb.disabled_reason == reason and trainer.global_step == 2
        assert cb.summary_path is None and not list((tmp_path / folder).rglob("*.json"))

    for i, cls in enumerate((LDPAudit, LDPInferenceAudit)):
        steps_aside(cls(), None, Plain(), "not_dp_fedavg", "DPFedAvg", f"plain{i}")
        dm, module = make(None)
        steps_aside(cls(), dm, module, "no_randomizer", "randomizer", f"none{i}")
    dm, module = make(LDPSGD(1.0, 1.0))
    steps_aside(LDPInferenceAudit(), dm, module, "no_domain", "center", "domain")


# ------------------------------------------------------------------------------ inference
class Spy(FederatedAuditHooks, pl.Callback):
    def __init__(self):
        self.updates, self.released = [], []

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        self.updates.append(fl_round.updates.clone())

    def on_federated_randomized_updates(self, trainer, pl_module, fl_round):
        self.released.append(fl_round.released.clone())


@pytest.mark.parametrize("mech", [TwoPoint(2.0, center=0.0, radius=0.2),
                                  Staircase(2.0, center=0.0, radius=0.2, precision=2, groups=4)],
                         ids=["two_point", "staircase"])
def test_inference_callback_matches_the_attack(tmp_path, mech):
    dm, module = make(mech)
    inf, spy = LDPInferenceAudit(seed=7), Spy()
    fit(dm, module, [inf, spy], 5, tmp_path)
    assert [h["round"] for h in inf.history] == [1, 2, 3, 4, 5]
    for i, mode in enumerate(("debiased", "raw")):
        attack = LDPFLInferenceAttack(mech.center, mech.radius, seed=7 + i)
        seen = []
        for upd, rel in zip(spy.updates, spy.released, strict=True):
            seen.append(mech.project(upd).double().numpy())
            values = mech.debias(rel) if mode == "debiased" else rel
            attack.observe(values.double().numpy())
            pred = attack.predict(target=np.concatenate(seen).mean(0))
        assert np.allclose(pred.error, inf.last[mode].error, rtol=1e-12, atol=1e-15)
        assert np.allclose(pred.confidence, inf.last[mode].confidence, rtol=1e-12)
        assert inf.history[-1][f"error_{mode}"] == pytest.approx(float(np.mean(pred.error)), rel=1e-12)
        assert 0 < inf.history[-1][f"confidence_{mode}"] <= 100
    last = inf.history[-1]
    if isinstance(mech, TwoPoint):  # debias is the identity: eq. 2 either way
        assert last["error_raw"] == last["error_debiased"]
    else:  # SRR: the raw mean is shrunk to the centre, the debiased one is not
        assert last["error_raw"] != last["error_debiased"]
    run_dir = os.path.join(str(tmp_path), "run", "version_0")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"ldp_inference/error_debiased", "ldp_inference/error_raw",
            "ldp_inference/confidence_debiased", "ldp_inference/error_median_raw"} <= tags
    assert [e.step for e in acc.Scalars("ldp_inference/confidence_raw")] == [2, 3, 4, 5]
    assert os.path.exists(os.path.join(run_dir, "ldp_inference_summary.json"))


def test_inference_error_falls_with_epsilon_as_its_sampling_law_says(tmp_path):
    # Eq. 2 is the mean of N two-point outputs c +- B (B = r / tanh(eps / 2)); with inputs w
    # near c its error per coordinate is half-normal: E|err| ~ sqrt(2/pi) B / sqrt(N) / (2r).
    r, n_rounds, per_round = 1.0, 6, 5
    errors = {}
    for eps in (0.5, 4.0):
        dm, module = make(TwoPoint(eps, center=0.0, radius=r))
        inf = LDPInferenceAudit(modes=("debiased",), seed=1)
        fit(dm, module, [inf], n_rounds, tmp_path / str(eps), logger=False)
        errors[eps] = inf.history[-1]["error_debiased"]
        big = r / math.tanh(eps / 2)
        expected = math.sqrt(2 / math.pi) * big / math.sqrt(n_rounds * per_round) / (2 * r)
        # mean over 650 coordinates: relative sd about 0.76 / sqrt(650) = 3%
        assert errors[eps] == pytest.approx(expected, rel=0.12)
    assert errors[4.0] < errors[0.5] / 3
