"""CanaryAudit on Opacus DP-SGD (METHODS A7): gradient canaries before the noise, the accountant
left intact, make_private in configure_optimizers, BatchMemoryManager, resume."""

import json
import math
import os

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from audit_callbacks import names
from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
from audit_callbacks.backends.opacus.optimizer import (
    chain_step_hook,
    find_accountant,
    unchain_step_hook,
)
from audit_callbacks.callbacks import CanaryAudit
from audit_callbacks.canary.vectors import CanarySet
from datamodules.breast_cancer import load_breast_cancer_tensors
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*")


def _private(model, x, y, batch_size, noise=0.0, clip=1.0, poisson=False):
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                             noise_multiplier=noise, max_grad_norm=clip,
                                             poisson_sampling=poisson)
    return engine, model, opt, loader


def test_canaries_reach_the_clipped_sum_as_clipped_examples_before_noise():
    torch.manual_seed(0)
    x, y = load_breast_cancer_tensors()
    x, y = x[:16], y[:16].float()
    net = nn.Sequential(nn.Linear(30, 4), nn.ReLU(), nn.Linear(4, 1))
    ref = [p.detach().clone() for p in net.parameters()]
    engine, model, opt, _ = _private(net, x, y, batch_size=16, clip=0.7)
    dim = sum(p.numel() for p in net.parameters())
    cs = CanarySet(3, dim, 10)
    inj = GradientCanaryInjector(opt, cs, 6, sample_rate=0.5, seed=11)
    loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
    loss.backward()
    opt.step()
    # direct recomputation: per-example gradients, clipped over all parameters, summed
    total = torch.zeros(dim)
    for i in range(16):
        clone = nn.Sequential(nn.Linear(30, 4), nn.ReLU(), nn.Linear(4, 1))
        for p, r in zip(clone.parameters(), ref, strict=True):
            p.data.copy_(r)
        li = nn.functional.binary_cross_entropy_with_logits(clone(x[i:i + 1]).squeeze(-1), y[i:i + 1])
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(li, list(clone.parameters()))])
        total += g * min(1.0, 0.7 / (float(g.norm()) + 1e-6))
    joined = inj.joined(0, 0.5)
    assert 0 < joined.size < 6
    total += 0.7 * sum(cs.canary(int(j)) for j in joined)
    expected = total / opt.expected_batch_size
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    assert torch.allclose(got, expected, atol=1e-5)
    assert inj.steps == 1 and inj.participations[joined].tolist() == [1] * joined.size
    assert engine.accountant.history == [(0.0, 1.0, 1)]  # the accountant still counted the step
    inj.detach()
    assert "add_noise" not in opt.__dict__


def test_one_injection_per_logical_step_with_batch_memory_manager():
    torch.manual_seed(1)
    x, y = load_breast_cancer_tensors()
    net = nn.Sequential(nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 1))
    engine, model, opt, loader = _private(net, x, y.float(), batch_size=64, noise=1.0, poisson=True)
    dim = sum(p.numel() for p in net.parameters())
    acc, rate = find_accountant(opt)
    assert acc is engine.accountant and rate == pytest.approx(1 / len(loader))
    inj = GradientCanaryInjector(opt, CanarySet(0, dim, 20), 20, sample_rate=rate, seed=0)
    seen = []
    hook = chain_step_hook(opt, lambda o: seen.append(float(o.params[0].grad.norm())))
    physical = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        for xb, yb in mem:
            physical += 1
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(-1), yb).backward()
            opt.step()
    steps = sum(h[2] for h in engine.accountant.history)
    assert inj.steps == steps == len(seen) == len(loader)
    assert physical > steps  # several physical batches per logical step
    assert find_accountant(opt)[0] is engine.accountant  # found through the chained hook
    unchain_step_hook(opt, hook)
    assert opt.step_hook is not hook and find_accountant(opt)[0] is engine.accountant


def _fit(tmp_path, callbacks, *, epochs=3, seed=0, noise=1.0, name="run", poisson=True, ckpt_path=None,
         logger=True, accountant="rdp"):
    pl.seed_everything(seed, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=poisson, shuffle=False, seed=seed)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16, 16)), lr=0.5, noise_multiplier=noise,
                             max_grad_norm=1.0, noise_seed=seed, accountant=accountant)
    log = TensorBoardLogger(str(tmp_path), name=name, version=0) if logger else False
    trainer = pl.Trainer(max_epochs=epochs, logger=log, callbacks=callbacks, accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                         num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, module


def test_a_prv_accountant_is_computed_once_per_history(tmp_path, monkeypatch):
    """The run's own accountant is Opacus' PRV one (``make_private``'s default): its epsilon is
    the claim and also ``epsilon_analytic_prv``, computed once per history and delta (a PRV
    epsilon costs ~0.3 s, and every estimate asks for it), not twice, and equal to the
    accountant's own ``get_epsilon``."""
    audit = CanaryAudit(60, 60, seed=2, bootstrap=0, log_figures=False, log_histograms=False)
    _, module = _fit(tmp_path, [audit], epochs=1, logger=False, accountant="prv")
    acc = module.privacy_engine.accountant
    assert type(acc).__name__ == "PRVAccountant"
    original, calls = type(acc).get_epsilon, []

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(acc), "get_epsilon", counting)
    out = audit.backend.analytic(0.5e-5)  # a delta no estimate asked for: nothing cached
    again = audit.backend.analytic(0.5e-5)
    assert len(calls) == 1 and out == again
    assert out["epsilon_analytic"] == out["epsilon_analytic_prv"] == original(acc, delta=0.5e-5)


def test_lightning_make_private_tags_accountant_and_join_rate(tmp_path):
    _, plain = _fit(tmp_path, [], name="plain", logger=False)
    audit = CanaryAudit(150, 150, seed=2, bootstrap=20)
    trainer, module = _fit(tmp_path, [audit])
    # the accountant is untouched: same history, same epsilon as the run without the callback
    assert module.privacy_engine.accountant.history == plain.privacy_engine.accountant.history
    eps = module.privacy_engine.get_epsilon(1e-5)
    assert eps == plain.privacy_engine.get_epsilon(1e-5)
    report = audit.last_report
    assert report.epsilon_analytic == pytest.approx(eps)
    assert report.epsilon_analytic_prv is not None and 0 < report.epsilon_analytic_prv < eps * 1.2
    # canaries join at the example's rate: participations ~ Binomial(steps, q) per canary
    steps, q = audit.backend.injector.steps, audit.backend.injector.sample_rate
    assert steps == sum(h[2] for h in module.privacy_engine.accountant.history)
    mean, sd = steps * q, math.sqrt(steps * q * (1 - q) / 150)
    assert abs(audit.auditor.participations.mean() - mean) < 4 * sd
    # TensorBoard: the estimates, bounds and both analytic epsilons, finite
    acc = EventAccumulator(os.path.join(str(tmp_path), "run", "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    want = {"audit/epsilon_final_model", "audit/epsilon_lower_bound_final_model", "audit/epsilon_all_iterates",
            "audit/epsilon_lower_bound_all_iterates", "audit/epsilon_analytic", "audit/epsilon_analytic_rdp",
            "audit/epsilon_analytic_prv", "audit/num_canaries_participated", "val/accuracy"}
    assert want <= set(acc.Tags()["scalars"])
    registered = {q.tag for q in names.QUANTITIES}  # every audit tag is in the name table
    assert {t for t in acc.Tags()["scalars"] if t.startswith("audit/")} <= registered
    for tag in want:
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    summary = json.load(open(audit.summary_path))
    assert summary["inputs"]["training"] == "Opacus DP-SGD"
    # the canaries enter before clipping; the DPDataLoader's own sampler draws them from the
    # second epoch on (the first epoch's iterator was made in configure_optimizers, before the
    # audit attached: its batches' canary draws were made by the audit at the sampler's rate)
    assert summary["inputs"]["canary_insertion"] == "before clipping"
    assert summary["inputs"]["canary_sampling"] == "training loader (Opacus UniformWithReplacementSampler)"
    per_epoch = steps // 3
    assert summary["inputs"]["canary_draws_by_audit"] == per_epoch
    assert summary["inputs"]["loader_batches_drawn"] == steps - per_epoch
    assert type(trainer.train_dataloader.batch_sampler).__name__ == "UniformWithReplacementSampler"  # restored
    assert summary["inputs"]["steps"] == steps and summary["inputs"]["accountant"] == "RDPAccountant"
    assert summary["epsilon_analytic_rdp"] == pytest.approx(eps)
    for est in report.estimates.values():
        assert est is None or (math.isfinite(est.value) and est.value <= 50)


def test_estimate_separates_loud_from_quiet_noise(tmp_path):
    loud = CanaryAudit(150, 150, seed=0, bootstrap=0)
    _fit(tmp_path, [loud], noise=30.0, logger=False, name="loud")
    quiet = CanaryAudit(150, 150, seed=0, bootstrap=0)
    _fit(tmp_path, [quiet], noise=0.3, logger=False, name="quiet")
    # all steps seen: the canary steps stand out at sigma 0.3 (analytic ~66), not at sigma 30
    lo_loud = loud.last_report.estimates["epsilon_lower_bound_all_iterates"].value
    lo_quiet = quiet.last_report.estimates["epsilon_lower_bound_all_iterates"].value
    # the f-DP one-run bound on the steps-unknown scores (k = k' = 150); in this d = 785 model the
    # real gradients' projections on the canaries add noise comparable to sigma = 0.3
    assert lo_loud < 0.1 < 0.5 < lo_quiet
    gdp = quiet.last_report.estimates.get("epsilon_gdp_lower_bound_all_iterates")
    if gdp is None:  # the steps-unknown scores are heavy-tailed: the Gaussian fit is rejected
        assert quiet.last_report.skipped["epsilon_gdp_lower_bound_all_iterates"].startswith("rejected")
    else:
        assert 1.5 < gdp.value <= quiet.last_report.epsilon_analytic
    assert lo_quiet <= quiet.last_report.epsilon_analytic
    assert loud.last_report.estimates["epsilon_lower_bound_final_model"].value <= loud.last_report.epsilon_analytic


def test_resume_gives_the_same_estimate(tmp_path):
    # Deterministic training (fixed batches, no noise) so the two runs follow the same path.
    full = CanaryAudit(40, 40, seed=5, bootstrap=0)
    _fit(tmp_path / "a", [full], epochs=4, noise=0.0, poisson=False, logger=False)
    first = CanaryAudit(40, 40, seed=5, bootstrap=0)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    _fit(tmp_path / "b", [first, ckpt], epochs=2, noise=0.0, poisson=False, logger=False)
    second = CanaryAudit(40, 40, seed=5, bootstrap=0)
    _fit(tmp_path / "c", [second, ModelCheckpoint(dirpath=str(tmp_path / "ckpt2"))], epochs=4, noise=0.0,
         poisson=False, logger=False, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert second.backend.injector.steps == full.backend.injector.steps
    assert np.array_equal(second.auditor.participations, full.auditor.participations)
    for key, est in full.last_report.estimates.items():
        got = second.last_report.estimates[key]
        assert (est is None) == (got is None), key
        if est is not None:
            assert got.value == pytest.approx(est.value, rel=1e-6, abs=1e-9), key


def test_a_resumed_fit_plans_the_runs_own_steps(tmp_path):
    """A fit resumed from a checkpoint plans the steps of the whole run (Lightning's
    ``estimated_stepping_batches`` already counts the epochs before the checkpoint), not those
    steps twice; a repeated fit without a checkpoint adds the steps taken before it."""
    first = CanaryAudit(40, 40, seed=5, bootstrap=0, log_figures=False, log_histograms=False)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    _fit(tmp_path / "b", [first, ckpt], epochs=2, logger=False)
    assert first.auditor.plan is not None and first.auditor.plan.steps == first.backend.injector.steps
    second = CanaryAudit(40, 40, seed=5, bootstrap=0, log_figures=False, log_histograms=False)
    _fit(tmp_path / "c", [second, ModelCheckpoint(dirpath=str(tmp_path / "ckpt2"))], epochs=4, logger=False,
         ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    steps = second.backend.injector.steps
    assert steps == 2 * first.backend.injector.steps
    assert second.auditor.plan.steps == steps
    assert second.auditor.last_summary[names.PLAN_STEPS] == steps


def test_no_dp_optimizer_steps_aside_and_a_bad_argument_is_a_value_error(tmp_path):
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(8,)), dp=False)
    audit = CanaryAudit(10)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="CanaryAudit disabled \\(no_dp_optimizer\\).*make_private"):
        trainer.fit(module, datamodule=dm)  # training goes on without the audit
    assert trainer.global_step > 0 and audit.disabled_reason == "no_dp_optimizer"
    assert audit.summary_path is None and audit.last_report is None
    assert not [k for k in trainer.logged_metrics if k.startswith(f"{names.FAMILY_AUDIT}/")]  # the module's own only
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith((".json", ".html", ".md"))]
    with pytest.raises(ValueError, match="num_canaries"):
        CanaryAudit(-1)
    with pytest.raises(ValueError, match="repeats"):
        pl.Trainer(max_epochs=1, logger=False, callbacks=[CanaryAudit(10, repeats=2)], enable_progress_bar=False,
                   enable_checkpointing=False).fit(module, datamodule=dm)


def test_cached_rdp_epsilon_equals_the_opacus_accountant():
    from opacus.accountants import RDPAccountant

    from audit_callbacks.backends.opacus.accounting import accountant_epsilon, rdp_epsilon

    for history in ([(1.0, 64 / 455, 32)], [(0.5, 0.01, 1000), (2.0, 0.2, 7)], [(30.0, 0.5, 3)]):
        acc = RDPAccountant()
        acc.history = list(history)
        assert rdp_epsilon(history, 1e-5) == acc.get_epsilon(1e-5)
        assert accountant_epsilon(acc, 1e-6) == acc.get_epsilon(1e-6)
    assert accountant_epsilon(RDPAccountant(), 1e-5) is None and rdp_epsilon([], 1e-5) == 0.0


def test_prv_epsilon_with_the_cached_domain_bound_equals_opacus_and_restores_the_module(monkeypatch):
    """The PRV accountant's epsilon through ``accountant_epsilon`` (its domain's RDP bound
    cached) is Opacus' own, bit for bit; Opacus' domain module gets its ``RDPAccountant`` back,
    even when the accountant raises."""
    from opacus.accountants import PRVAccountant, RDPAccountant
    from opacus.accountants import prv as prv_module
    from opacus.accountants.analysis.prv import domain

    from audit_callbacks.backends.opacus.accounting import accountant_epsilon

    seen = []
    real = domain.compute_safe_domain_size

    def spy(*args, **kwargs):
        seen.append(domain.RDPAccountant)
        return real(*args, **kwargs)

    for history in ([(1.0, 256 / 18000, 213)], [(0.8, 0.01, 500), (1.2, 0.02, 100)], [(2.0, 0.2, 7)]):
        acc = PRVAccountant()
        acc.history = list(history)
        expected = acc.get_epsilon(delta=1e-5)  # Opacus as it is
        monkeypatch.setattr(prv_module, "compute_safe_domain_size", spy)  # the name prv.py calls
        assert accountant_epsilon(acc, 1e-5) == expected
        monkeypatch.setattr(prv_module, "compute_safe_domain_size", real)
        assert domain.RDPAccountant is RDPAccountant
    assert len(seen) == 3 and all(c is not RDPAccountant and issubclass(c, RDPAccountant) for c in seen)

    def broken(self, *args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(PRVAccountant, "_get_dprv", broken)
    acc = PRVAccountant()
    acc.history = [(1.0, 0.01, 10)]
    assert accountant_epsilon(acc, 1e-5) is None  # the accountant's failure: no epsilon, nothing raised
    assert domain.RDPAccountant is RDPAccountant


def test_lightning_gradient_accumulation_charges_canaries_like_the_accountant(tmp_path):
    # accumulate_grad_batches=2: one logical step per two batches; the accountant is charged
    # q * accumulated_iterations, and so are the canaries' joins.
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0)
    audit = CanaryAudit(400, 0, bootstrap=0)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=2,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    history = module.privacy_engine.accountant.history
    assert audit.backend.injector.steps == sum(s for _, _, s in history)
    expected = sum(s * q for _, q, s in history)  # mean joins per canary
    var = sum(s * q * (1 - q) for _, q, s in history) / 400
    assert abs(audit.auditor.participations.mean() - expected) < 4 * math.sqrt(var)
    assert max(q for _, q, _ in history) == pytest.approx(2 * audit.backend.injector.sample_rate)


def test_the_sampler_check_names_the_loaders_batches_under_gradient_accumulation(tmp_path):
    # 455 examples in shuffled batches of 32, 3 a step: steps of 96 and one of 71 an epoch,
    # rejected against Poisson and named by the loader's batches (not "variable")
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, noise_seed=0)
    audit = CanaryAudit(100, 0, bootstrap=0, log_figures=False)
    pl.Trainer(max_epochs=3, logger=False, callbacks=[audit], enable_progress_bar=False,
               enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=3,
               default_root_dir=str(tmp_path)).fit(module, datamodule=dm)
    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    check = summary["results"]["batch_size_variance_ratio"]
    assert check["counts"] == {"batches": 15, "population": 3 * 455, "total": 3 * 455}
    assert check["details"]["sampling"] == "fixed-size batches of 32, 3 accumulated a step"
    assert summary["verdict_mechanism"] == "unproven"
    assert "the loader draws fixed-size batches of 32, 3 accumulated a step; rejected by" in (
        summary["verdict_mechanism_sentence"])


@pytest.mark.parametrize("kind", ["hadamard", "gaussian"])
def test_accountant_untouched_and_validate_after_fit_with_every_callback(tmp_path, kind):
    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack

    _, plain = _fit(tmp_path, [], name="plain", logger=False, epochs=2)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val/accuracy", mode="max")
    audit = CanaryAudit(100, canaries=kind, bootstrap=0)
    callbacks = [audit, LabelReconstructionAttack(), LabelDPLowerBound(), ckpt]
    trainer, module = _fit(tmp_path, callbacks, epochs=2)
    assert module.privacy_engine.accountant.history == plain.privacy_engine.accountant.history
    assert audit.last_report.epsilon_analytic == pytest.approx(module.privacy_engine.get_epsilon(1e-5))
    fitted = audit.last_report
    trainer.validate(module, datamodule=trainer.datamodule, ckpt_path="best")
    assert audit.last_report is fitted


def test_no_headline_number_exceeds_the_accountant_by_more_than_its_interval(tmp_path):
    audit = CanaryAudit(200, bootstrap=100)
    trainer, module = _fit(tmp_path, [audit], noise=1.0, logger=False)
    report = audit.last_report
    eps = report.epsilon_analytic
    assert eps == pytest.approx(module.privacy_engine.get_epsilon(1e-5))
    for tm in ("final_model", "all_iterates"):
        est = report.estimates[f"epsilon_{tm}"]
        assert est.lower <= eps, (tm, est.value, est.lower, eps)
        for bound in (f"epsilon_lower_bound_{tm}", f"epsilon_gdp_lower_bound_{tm}"):
            if report.value(bound) is None:  # a GDP bound whose fit test rejects is not given
                assert report.skipped[bound].startswith("rejected"), report.skipped[bound]
                continue
            assert report.value(bound) <= eps, (bound, report.value(bound), eps)


def test_the_plan_under_gradient_accumulation_is_at_the_accumulated_rate(tmp_path):
    # accumulate_grad_batches=2: the plan (at fit start, before any step: Lightning's setting;
    # read again at fit end: the mean batches of the steps taken) puts the canaries and the claim
    # at q * batches, as the injector and Opacus' accountant hook do; at q alone it expected
    # ratios far below a correct run's ([0.03, 0.32] against 0.45-0.63 at 4 batches a step)
    from opacus.accountants import RDPAccountant

    from audit_callbacks.auditing.plan import plan_settings

    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, accountant="rdp")
    audit = CanaryAudit(100, 100, bootstrap=0, log_figures=False, log_histograms=False)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=2,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    q, plan = audit.backend.injector.sample_rate, audit.auditor.plan
    acc = RDPAccountant()
    acc.history = [(1.0, 2 * q, plan.steps)]
    assert plan.reference_epsilon == pytest.approx(acc.get_epsilon(audit.auditor.delta), rel=1e-9)
    injector = audit.backend.injector
    kwargs, _ = plan_settings(audit.auditor, injector.steps)
    assert 1.5 < injector.batches_total / injector.steps <= 2  # an epoch's last step may take one
    assert kwargs["sample_rate"] == pytest.approx(q * injector.batches_total / injector.steps, rel=1e-12)
    assert kwargs["reference_epsilon"] == pytest.approx(module.privacy_engine.get_epsilon(audit.auditor.delta),
                                                        rel=1e-9)


def test_last_iterate_reference_uses_the_accumulated_rate(tmp_path):
    # accumulate_grad_batches=2: most logical steps are taken at rate 2q; the optimizer holds
    # no accumulated batches when the report is computed, so the reference must come from the
    # steps' own rates (the accountant's history), not from accumulated_iterations at that time.
    from audit_callbacks.estimators.last_iterate import (
        dpsgd_last_iterate_epsilon,
        dpsgd_last_iterate_epsilon_history,
    )

    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=False)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0)
    audit = CanaryAudit(50, 50, bootstrap=0)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=2,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    history = module.privacy_engine.accountant.history
    delta = audit.auditor.delta
    got = audit.last_report.epsilon_last_iterate_heuristic
    assert got == pytest.approx(dpsgd_last_iterate_epsilon_history(history, delta), rel=1e-9)
    steps, q = audit.backend.injector.steps, audit.backend.injector.sample_rate
    assert got > 1.5 * dpsgd_last_iterate_epsilon(steps, q, 1.0, delta)


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_opacus_audit_under_the_trainers_precision(tmp_path, precision):
    """The README's "works with" precisions on Opacus: the audit runs, counts every step, its
    claim is Opacus' own, and a correct run is not a violation."""
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=64, poisson=True, seed=0, sampling_seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0,
                             accountant="rdp", noise_seed=0)  # the same noise every run: a verdict, not a rate
    audit = CanaryAudit(60, 60, bootstrap=0, log_figures=False, log_histograms=False)
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[audit], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, precision=precision,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    summary = audit.auditor.last_summary
    assert audit.disabled_reason is None and audit.backend.injector.steps == trainer.global_step > 0
    assert summary["epsilon_analytic"] == pytest.approx(module.privacy_engine.get_epsilon(audit.auditor.delta))
    assert summary["verdict_mechanism"] != "violation"
