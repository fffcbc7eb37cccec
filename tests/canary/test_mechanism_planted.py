"""The mechanism checks on real Opacus and DP-FedAvg trainings: correct set-ups (SGD, momentum,
Adam, BatchMemoryManager; DP-FedAvg with and without server momentum) are not flagged, and each
planted bug class is: noise reused every step or round, a parameter tensor without noise,
shuffled fixed-size batches under Poisson accounting, noise from a publicly seeded generator."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from sklearn.datasets import load_digits

from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit

pytestmark = pytest.mark.filterwarnings("ignore")


def _digits():
    x, y = load_digits(return_X_y=True)
    return torch.utils.data.TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32),
                                          torch.tensor(y, dtype=torch.int64))


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _checks(audit) -> dict:
    """Every mechanism check's result at plain alpha (the summary's statement)."""
    return audit.auditor.mechanism_checks()


def _train(*, optimizer="sgd", steps=30, poisson=True, bmm=False, bug=None, sigma=1.0, seed=0,
           generator="entropy"):
    torch.manual_seed(seed)
    model = _model()
    params = model.parameters()
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=0.1),
           "momentum": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
           "adam": lambda: torch.optim.Adam(params, lr=1e-3)}[optimizer]()
    loader = torch.utils.data.DataLoader(_digits(), batch_size=64, shuffle=not poisson)
    kwargs = {}
    if generator == "entropy":
        # a fixed seed no log holds (above 2^32: not a public seed to the noise-source check),
        # so a correct run's checks are one fixed run's, not a draw at their level
        kwargs["noise_generator"] = torch.Generator().manual_seed((1 << 40) | seed)
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0,
        poisson_sampling=poisson, **kwargs)
    if bug == "reused_noise":  # the noise generator re-seeded before every step
        original = opt.add_noise

        def add_noise():
            opt.generator = torch.Generator().manual_seed(1234)
            original()
        opt.add_noise = add_noise
    elif bug == "missing_noise":  # the output layer's parameters get no noise
        original = opt.add_noise
        last = list(model.parameters())[-2:]

        def add_noise():
            original()
            for p in last:
                p.grad = p.summed_grad.view_as(p).clone()
        opt.add_noise = add_noise
    audit = OpacusCanaryAudit(opt, data_loader=loader, num_canaries=64, seed=seed)
    done = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while done < steps:
            batches = BatchMemoryManager(data_loader=loader, max_physical_batch_size=16,
                                         optimizer=opt) if bmm else None
            with (batches or _nullcontext(loader)) as data:
                for x, y in data:
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    if not bmm or not opt._is_last_step_skipped:
                        done = audit.steps
                    if done >= steps:
                        break
    return audit


class _nullcontext:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("config", [{"optimizer": "sgd"}, {"optimizer": "momentum"},
                                    {"optimizer": "adam"}, {"optimizer": "sgd", "bmm": True}])
def test_correct_opacus_runs_pass_every_check(config):
    checks = _checks(_train(**config))
    assert {"noise_scale_ratio", "fresh_noise_ratio", "batch_size_variance_ratio"} <= set(checks)
    for name, res in checks.items():
        assert not res.details["rejected"], (name, res.details)
    assert checks["noise_scale_ratio"].value > 0.95 and checks["fresh_noise_ratio"].value > 1.5


def test_reused_noise_is_flagged():
    checks = _checks(_train(bug="reused_noise"))
    assert checks["fresh_noise_ratio"].details["rejected"] and checks["fresh_noise_ratio"].value < 0.5


def test_a_layer_without_noise_is_flagged_and_named():
    checks = _checks(_train(bug="missing_noise"))
    for name in ("noise_scale_ratio", "fresh_noise_ratio"):
        assert checks[name].details["rejected"], name
        assert checks[name].details["group"].startswith(("params[2]", "params[3]")), checks[name].details


def test_shuffled_batches_under_poisson_accounting_are_flagged():
    checks = _checks(_train(poisson=False))
    assert checks["batch_size_variance_ratio"].details["rejected"]
    assert checks["batch_size_variance_ratio"].details["sampling"] == "fixed-size batches of 64"
    assert not checks["noise_scale_ratio"].details["rejected"]


def test_noise_from_a_seeded_global_generator_is_named(monkeypatch):
    import lightning

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    lightning.seed_everything(7, verbose=False)
    audit = _train(generator="global", steps=3)
    found = audit.auditor.backend.noise_source
    assert found.replayable and "seed_everything" in found.message
    assert audit.auditor.backend.summary_inputs()["noise_source"]["replayable"] is True


# ----------------------------------------------------------------------------------- DP-FedAvg
def _fedavg(*, bug=None, momentum=0.0, rounds=20, seed=0):
    from audit_callbacks.callbacks import CanaryAudit
    from audit_callbacks.federated import DPFedAvg
    from tests._federated import quick_trainer, tiny_federation

    torch.manual_seed(seed)
    module = DPFedAvg(torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
                      clients_per_round=8, noise_multiplier=1.0, clip_norm=0.5, local_lr=0.1,
                      server_momentum=momentum, seed=seed, reproducible_noise=True)
    if bug == "reused_noise":  # the same noise vector added every round
        fixed = {}
        original = module._noise

        def noise(d, like):
            if "z" not in fixed:
                fixed["z"] = original(d, like).clone()
            return fixed["z"].clone()
        module._noise = noise
    elif bug == "missing_noise":  # the output layer's bias gets no noise
        original = module._noise

        def noise(d, like):
            z = original(d, like)
            z[-3:] = 0.0
            return z
        module._noise = noise
    audit = CanaryAudit(num_canaries=32, canaries="hadamard", seed=1, log_figures=False,
                        log_histograms=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quick_trainer(rounds, [audit]).fit(module, datamodule=tiny_federation(p=20, n_clients=40))
    return audit


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_correct_fedavg_runs_pass_the_noise_checks(momentum):
    checks = _checks(_fedavg(momentum=momentum))
    assert {"noise_scale_ratio", "fresh_noise_ratio"} <= set(checks) and "batch_size_variance_ratio" not in checks
    for name, res in checks.items():
        assert not res.details["rejected"], (name, res.details)


def test_fedavg_noise_reused_every_round_is_flagged():
    checks = _checks(_fedavg(bug="reused_noise"))
    assert checks["fresh_noise_ratio"].details["rejected"]


def test_fedavg_a_tensor_without_noise_is_flagged_and_named():
    checks = _checks(_fedavg(bug="missing_noise"))
    assert checks["noise_scale_ratio"].details["rejected"] and checks["noise_scale_ratio"].details["group"] == "2.bias"


# ------------------------------------------------------------------ the verdict, every view
def test_the_verdict_names_the_failed_check(tmp_path):
    """Reused noise: the report's verdicts, the summary JSON and its TensorBoard code say
    which check failed, on which tensor; training was not stopped."""
    import json

    audit = _train(bug="reused_noise")
    report = audit.report()
    word, sentence = report.mechanism_verdict()
    assert word == "violation" and "repeats" in sentence
    assert report.verdicts()["all_iterates"] == (word, sentence)
    assert report.scalars()["audit/verdict_mechanism"] == 2.0
    audit.write(str(tmp_path))
    path = audit.summary_path
    with open(path, encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["verdict_mechanism"] == "violation"
    assert summary["verdict_all_iterates"] == "violation" and "repeats" in summary["verdict_all_iterates_sentence"]
    assert summary["results"]["fresh_noise_ratio"]["details"]["rejected"] is True
    # TensorBoard's Text tab holds the mechanism's sentence beside the threat models'
    import glob
    import os

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = glob.glob(os.path.join(str(tmp_path), "**", "events.out.tfevents*"), recursive=True)
    texts = set()
    for path in events:
        texts |= set(EventAccumulator(path).Reload().Tags()["tensors"])
    assert "audit/verdict_mechanism_sentence/text_summary" in texts, texts


def test_shuffled_batches_make_the_claim_unproven():
    report = _train(poisson=False).report()
    word, sentence = report.verdicts()["all_iterates"]
    assert word in ("unproven", "violation", "suspicious")
    if word == "unproven":
        assert "fixed-size batches of 64" in sentence and "poisson_sampling=True" in sentence
    assert report.mechanism_verdict()[0] == "unproven"


def test_a_correct_run_reads_consistent():
    report = _train().report()
    assert report.mechanism_verdict()[0] == "consistent"
    assert report.scalars()["audit/verdict_mechanism"] == 0.0


def test_the_report_shows_the_mechanism_verdict(tmp_path):
    import pathlib

    audit = _train(bug="missing_noise")
    audit.write(str(tmp_path))
    html = next(pathlib.Path(tmp_path).rglob("audit_report.html")).read_text()
    md = next(pathlib.Path(tmp_path).rglob("audit_report.md")).read_text()
    assert 'class="verdict violation"><b>checks of the mechanism' in html
    assert "checks of the mechanism**: violation: the noise" in md
