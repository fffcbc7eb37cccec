import json
import math
import os
import warnings
from importlib import metadata

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from audit_callbacks import names
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.federated import Cohort, DPFedAvg, FederatedAuditHooks, FederatedRound
from datamodules import FederatedDataModule
from models import MLP
from tests._federated import digits_dpfedavg, fit

EXPECTED_TAGS = {
    "audit/epsilon_final_model",
    "audit/epsilon_lower_bound_final_model",
    "audit/epsilon_all_iterates",
    "audit/epsilon_lower_bound_all_iterates",
    "audit/epsilon_gdp_lower_bound_final_model",
    "audit/epsilon_gdp_lower_bound_all_iterates",
    "audit/epsilon_analytic",
    "audit/num_canaries_participated",
    "val/accuracy",
    "privacy/epsilon_analytic",
}


def make(noise=0.5, seed=0, clients=40, per_round=10, rounds_per_epoch=4):
    dm = FederatedDataModule("digits", num_clients=clients, rounds_per_epoch=rounds_per_epoch, seed=seed)
    dm.setup("fit")
    torch.manual_seed(seed)
    module = DPFedAvg(MLP(64, 10, hidden=(32,)), clients_per_round=per_round, noise_multiplier=noise,
                      clip_norm=1.0, local_lr=0.1, local_batch_size=8, sampling="shuffle", seed=seed, reproducible_noise=True,
                      delta=1e-5)
    return dm, module


def test_end_to_end_tensorboard_tags_and_summary(tmp_path):
    dm, module = make()
    audit = CanaryAudit(30, 30, seed=1)
    fit(dm, module, [audit], 12, tmp_path)
    run_dir = os.path.join(str(tmp_path), "run", "version_0")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert EXPECTED_TAGS <= set(tags["scalars"]), set(tags["scalars"])
    assert {"audit/cosine_final_observed", "audit/cosine_final_unobserved",
            "audit/cosine_all_observed", "audit/cosine_all_unobserved"} <= set(tags["histograms"])
    assert "audit/cosine_density_final_model" in tags["images"]
    # the custom-scalars layout is stored as a summary of the custom_scalars plugin
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs_meta
    layout_events = acc.Tensors(cs_meta.CONFIG_SUMMARY_TAG)
    layout = layout_pb2.Layout()
    layout.ParseFromString(layout_events[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    # one kind of number a chart (a run's lines share its colour): each estimate with its
    # reference, the valid bounds and the ratios on charts of their own
    assert charts["final model: estimate and its reference (last-iterate heuristic)"] == [
        "^audit/epsilon_final_model$", "^audit/epsilon_last_iterate_heuristic$"]
    assert charts["all iterates: estimate and the claim (analytic epsilon)"] == [
        "^audit/epsilon_all_iterates$", "^audit/epsilon_analytic$"]
    assert charts["final model: valid lower bound"] == [
        "^audit/epsilon_lower_bound_final_model$", "^audit/epsilon_lower_bound_final_model_watched$"]
    assert charts["all iterates: valid lower bound"] == [
        "^audit/epsilon_lower_bound_all_iterates$", "^audit/epsilon_lower_bound_all_iterates_watched$"]
    assert charts["final model: estimate / reference"] == ["^audit/epsilon_ratio_final_model$"]
    assert charts["all iterates: estimate / claim"] == ["^audit/epsilon_ratio_all_iterates$"]
    assert not any("accountant" in title for title in charts)  # DP-FedAvg: no RDP/PRV
    assert charts["accuracy"] == [r"^val.*acc.*$"]
    # logged once per validation epoch (3) and at fit end
    final_events = acc.Scalars("audit/epsilon_final_model")
    assert len(final_events) >= 3
    for tag in EXPECTED_TAGS:
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag))
    # every lower bound stays below the analytic epsilon
    analytic = {e.step: e.value for e in acc.Scalars("audit/epsilon_analytic")}
    for tag in ("audit/epsilon_lower_bound_final_model", "audit/epsilon_lower_bound_all_iterates",
                "audit/epsilon_gdp_lower_bound_final_model", "audit/epsilon_gdp_lower_bound_all_iterates"):
        for e in acc.Scalars(tag):
            assert e.value <= analytic[e.step] + 1e-9

    with open(os.path.join(run_dir, "audit_summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["inputs"]["num_canaries"] == 30 and summary["inputs"]["dim"] == module.num_parameters
    for key in ("epsilon_final_model", "epsilon_final_model_unequal_fit",
                "epsilon_lower_bound_final_model", "epsilon_all_iterates",
                "epsilon_all_iterates_matched", "epsilon_all_iterates_max_cosine",
                "epsilon_lower_bound_all_iterates"):
        assert summary["estimates"][key]["status"] == "ok", key
        assert math.isfinite(summary["estimates"][key]["value"]), key
    for key in ("epsilon_gdp_lower_bound_final_model", "epsilon_gdp_lower_bound_all_iterates"):
        status = summary["estimates"][key]["status"]  # logged only where its fit test passes
        assert status == "ok" or status.startswith("skipped: rejected: goodness-of-fit"), status
    assert summary["epsilon_last_iterate_heuristic"] > 0 and summary["epsilon_ratio_all_iterates"] > 0
    assert summary["tags"]["epsilon_final_model"] == "audit/epsilon_final_model"
    _walk_the_name_table(tags["scalars"], summary)
    # one number per name: TensorBoard's last value of every summary number is the summary's
    # (the fit-end report, at plain alpha); the watched series of the bounds (each point at the
    # level spent for it) has names of its own
    for name, entry in summary["estimates"].items():
        if entry.get("value") is not None:
            assert acc.Scalars(f"audit/{name}")[-1].value == pytest.approx(entry["value"], rel=1e-6), name
    for tm in ("final_model", "all_iterates"):
        plain = acc.Scalars(f"audit/epsilon_lower_bound_{tm}")
        watched = acc.Scalars(f"audit/epsilon_lower_bound_{tm}_watched")
        assert len(plain) == 1 and len(watched) >= 3, (len(plain), len(watched))
    assert summary["versions"]["torch"] == metadata.version("torch")
    assert summary["epsilon_analytic"] > 0


def _walk_the_name_table(scalar_tags, summary):
    """Every scalar the run logged is a quantity of the name table (Lightning adds ``_step`` /
    ``_epoch`` to a metric logged both ways); the summary's names and tags are the table's."""
    registered = {q.tag for q in names.QUANTITIES}
    for tag in set(scalar_tags) - {"hp_metric", "epoch"}:  # Lightning's own scalars
        base = tag.removesuffix("_step").removesuffix("_epoch")
        assert tag in registered or base in registered, tag
    assert summary["tags"] == {q.name: q.tag for q in names.family("audit")}
    audit_names = set(names.names("audit"))
    assert set(summary["estimates"]) <= audit_names
    for key in ("epsilon_analytic", "epsilon_analytic_rdp", "epsilon_analytic_prv",
                "num_canaries_participated"):
        assert key in summary and key in audit_names


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_resume_gives_the_same_estimate(tmp_path, kind):
    dm, module = make(seed=3)
    full = CanaryAudit(20, 20, seed=5, canaries=kind)
    fit(dm, module, [full], 8, tmp_path / "a", logger=False)
    expected = full.last_report.estimates
    if kind == "gaussian":  # no known-rounds statistic: it would regenerate every canary a round
        assert full.auditor.matched is None
        assert full.last_report.skipped["epsilon_all_iterates_matched"].startswith("Gaussian canaries")

    dm, module = make(seed=3)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_train_steps=4)
    first = CanaryAudit(20, 20, seed=5, canaries=kind)
    fit(dm, module, [first, ckpt], 4, tmp_path / "b", logger=False)
    dm, module = make(seed=3)
    second = CanaryAudit(20, 20, seed=5, canaries=kind)
    fit(dm, module, [second, ModelCheckpoint(dirpath=str(tmp_path / "ckpt2"))], 8, tmp_path / "c",
        logger=False, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    got = second.last_report.estimates
    assert set(got) == set(expected)
    for key in expected:
        assert got[key].value == expected[key].value, key
    assert np.array_equal(second.auditor.participations, full.auditor.participations)


def test_repeated_presentations_schedule(tmp_path):
    dm, module = make(clients=20, per_round=5)
    audit = CanaryAudit(10, 10, repeats=3, seed=2)
    fit(dm, module, [audit], 9, tmp_path, logger=False)
    assert audit.auditor.participations.tolist() == [3] * 10
    assert audit.last_report.max_participations == 3


def test_estimate_tracks_the_noise(tmp_path):
    # Loud noise: observed canaries look like the null, and the lower bound is ~0.
    dm, module = make(noise=50.0, seed=4)
    loud = CanaryAudit(40, 40, seed=0)
    fit(dm, module, [loud], 8, tmp_path / "loud", logger=False)
    # Clipping only: the canaries stand out.
    dm, module = make(noise=0.0, seed=4)
    quiet = CanaryAudit(40, 40, seed=0)
    fit(dm, module, [quiet], 8, tmp_path / "quiet", logger=False)
    e_loud, e_quiet = loud.last_report.estimates, quiet.last_report.estimates
    assert e_loud["epsilon_lower_bound_final_model"].value < 0.5
    assert e_quiet["epsilon_lower_bound_final_model"].value > 1.0
    assert e_quiet["epsilon_lower_bound_all_iterates"].value > 1.0
    assert e_quiet["epsilon_final_model"].value > e_loud["epsilon_final_model"].value


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="num_canaries"):
        CanaryAudit(0)
    with pytest.raises(ValueError, match="delta"):
        CanaryAudit(10, delta=0.0)

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

    # a training it cannot audit: warned once (saying what it needs), the fit goes on, nothing
    # is logged and no summary (nor a number) is written
    audit, plain = CanaryAudit(5), Plain()
    with pytest.warns(UserWarning, match="CanaryAudit disabled .*DPFedAvg.*make_private") as caught:
        trainer = fit(None, plain, [audit], 2, tmp_path / "plain")
    assert sum("CanaryAudit disabled" in str(w.message) for w in caught) == 1
    assert trainer.global_step == 2 and audit.disabled_reason == "no_dp_optimizer"
    assert not trainer.logged_metrics and audit.auditor is None and audit.summary_path is None
    files = [f for _, _, fs in os.walk(tmp_path / "plain") for f in fs]
    assert not [f for f in files if f.endswith((".json", ".html", ".md"))]
    events = EventAccumulator(str(tmp_path / "plain" / "run" / "version_0"))
    events.Reload()
    tag = f"{names.FAMILY_AUDIT}/{names.WARNINGS}"
    assert not [t for t in events.Tags()["scalars"] if t.startswith(f"{names.FAMILY_AUDIT}/")]
    assert f"{tag}/text_summary" in events.Tags()["tensors"]  # why, as TensorBoard text

    dm, _ = make(clients=10, per_round=5)
    tiny = DPFedAvg(nn.Linear(1, 1, bias=False), clients_per_round=2)
    with pytest.raises(ValueError, match="d >= 2"):
        fit(dm, tiny, [CanaryAudit(5)], 1, tmp_path, logger=False)


@pytest.mark.parametrize(("canaries", "expect"), [
    (None, "20 canary clients are a large share of the population next to the 20 real clients, "
           "so about 50% of every cohort"),
    (30, "30 canary clients outnumber the 20 real clients, so about 60% of every cohort"),
])
def test_canaries_crowding_real_clients_out_of_cohorts_warn_with_the_fix(tmp_path, canaries, expect):
    dm, module = make(clients=20, per_round=5)
    with pytest.warns(UserWarning) as record:
        fit(dm, module, [CanaryAudit(canaries, 4, log_figures=False)], 2, tmp_path, logger=False)
    text = " ".join(str(w.message) for w in record if "canary clients" in str(w.message))
    assert expect in text
    # 5 real clients a round from a population of 20 real + k canaries: ceil(5 (20 + k) / 20)
    assert f"set clients_per_round={math.ceil(5 * (20 + (canaries or 20)) / 20)}" in text
    # a few canaries (10% of the population at most): no warning
    dm, module = make(clients=20, per_round=5)
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        fit(dm, module, [CanaryAudit(2, 2, log_figures=False)], 2, tmp_path, logger=False)
    assert not [w for w in quiet if "canary clients" in str(w.message)]


def test_no_logger_warns_and_still_writes_summary(tmp_path):
    dm, module = make(clients=20, per_round=5)
    audit = CanaryAudit(10, 10)
    with pytest.warns(UserWarning, match="no logger"):
        fit(dm, module, [audit], 4, tmp_path, logger=False)
    # a run without a logger writes into a fresh versioned folder: a second run does not
    # overwrite the first
    first = os.path.join(str(tmp_path), "audit", "version_0", "audit_summary.json")
    assert audit.summary_path == first and os.path.exists(first)
    dm, module = make(clients=20, per_round=5)
    again = CanaryAudit(10, 10)
    fit(dm, module, [again], 4, tmp_path, logger=False)
    assert again.summary_path == os.path.join(str(tmp_path), "audit", "version_1", "audit_summary.json")
    assert not [f for f in os.listdir(os.path.dirname(first)) if f.startswith(".tmp")]


def test_nan_delta_is_skipped_with_a_warning(tmp_path):
    dm, module = make(clients=20, per_round=5)
    audit = CanaryAudit(10, 10)
    fit(dm, module, [audit], 4, tmp_path, logger=False)
    seen = audit.auditor.stats.rounds_seen
    bad = torch.full((module.num_parameters,), float("nan"))
    nobody = Cohort(real_ids=[], virtual_ids={}, population_ids=[], divisor=5)
    fl_round = FederatedRound(5, nobody, theta=module.flat_parameters(), clip_norm=module.clip_norm,
                              model_delta=bad)
    audit.on_federated_round_end(None, module, fl_round)  # no host read per round
    assert audit.auditor.stats.rounds_skipped == 1 and audit.auditor.stats.rounds_seen == seen
    with pytest.warns(UserWarning, match="round 5 produced a model delta with NaN or inf"):
        report = audit.compute()  # the warning comes at estimate time
    for est in report.estimates.values():
        assert math.isfinite(est.value)


def test_fit_end_after_a_validation_logs_each_histogram_once(tmp_path):
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    audit = CanaryAudit(30, 30, seed=1)
    fit(dm, module, [audit], 8, tmp_path)  # validations at rounds 4 and 8, fit end at 8
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"),
                           size_guidance={"histograms": 0, "images": 0})
    acc.Reload()
    for tag in ("audit/cosine_final_observed", "audit/cosine_final_unobserved",
                "audit/cosine_all_observed", "audit/cosine_all_unobserved"):
        assert [e.step for e in acc.Histograms(tag)] == [4, 8], tag
    for tag in ("audit/cosine_density_final_model", "audit/cosine_density_all_iterates"):
        images = acc.Images(tag)
        assert [e.step for e in images] == [8] and images[0].width > 0, tag


class _Observer(FederatedAuditHooks, pl.Callback):
    """Needs the clipped rows of every round: the module then asks owners for rows, not sums."""

    rows = 0

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        assert not fl_round.summed
        self.rows += sum(fl_round.rows_of(name).size for name in fl_round.owners)


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_canary_sums_and_rows_train_the_same_model(tmp_path, kind):
    models = {}
    for name, extra in (("sum", []), ("rows", [_Observer()])):
        dm, module = make(clients=20, per_round=8, seed=1)
        audit = CanaryAudit(10, 10, canaries=kind, log_figures=False)
        fit(dm, module, [audit, *extra], 6, tmp_path, logger=False, name=name)
        models[name] = module.flat_parameters()
        if extra:
            assert extra[0].rows == int(audit.auditor.participations.sum()) > 0
    assert torch.allclose(models["sum"], models["rows"], atol=1e-5)


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_validate_and_test_with_a_checkpoint_after_fit(tmp_path, kind):
    dm, module = make(seed=2)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val/accuracy", mode="max")
    audit = CanaryAudit(20, 20, canaries=kind, log_figures=False)
    trainer = fit(dm, module, [audit, ckpt], 8, tmp_path)
    fitted = audit.last_report
    trainer.validate(module, datamodule=dm, ckpt_path="best")
    trainer.test(module, datamodule=dm, ckpt_path=ckpt.best_model_path)
    assert audit.last_report is fitted  # validate and test leave the fit's audit alone


def test_both_kinds_track_the_noise_and_agree(tmp_path):
    out = {}
    for kind in ("hadamard", "gaussian"):
        for noise in (0.0, 50.0):
            dm, module = make(noise=noise, seed=4)
            audit = CanaryAudit(40, 40, canaries=kind, seed=0)
            fit(dm, module, [audit], 8, tmp_path / f"{kind}{noise}", logger=False)
            out[kind, noise] = audit.last_report
    for kind in ("hadamard", "gaussian"):
        assert out[kind, 0.0].value("epsilon_lower_bound_final_model") > 1.0, kind
        assert out[kind, 50.0].value("epsilon_lower_bound_final_model") < 0.5, kind
    # both kinds see the same participations (sampling does not depend on the kind)
    quiet_h, quiet_g = out["hadamard", 0.0], out["gaussian", 0.0]
    assert quiet_h.max_participations == quiet_g.max_participations
    assert quiet_h.epsilon_analytic == quiet_g.epsilon_analytic
