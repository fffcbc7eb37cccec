"""FederatedLabelAttack: label reconstruction from FedSGD client updates in DPFedAvg (digits)."""

import json
import re

import numpy as np
import pytest
import torch

from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
from audit_callbacks.estimators.label_dp import argmin_attack_success_probability
from audit_callbacks.federated import DPFedAvg
from datamodules import FederatedDataModule
from models import MLP
from tests._federated import fit

pytestmark = pytest.mark.filterwarnings("ignore:.*(does not have many workers|secure RNG).*")


def _run(tmp_path, noise, rounds=6, attack_noise=None, local_batch=1000, randomizer=None,
         clients_per_round=5, min_examples=100):
    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=rounds, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(200, 200)), clients_per_round=clients_per_round,
                      noise_multiplier=noise, clip_norm=1.0, local_lr=0.5, local_epochs=1,
                      local_batch_size=local_batch, sampling="shuffle", seed=0, delta=1e-5,
                      randomizer=randomizer)
    attack = FederatedLabelAttack(noise_multiplier=attack_noise, min_examples=min_examples)
    fit(dm, module, [attack], rounds, tmp_path)
    return attack


def test_noise_free_fedsgd_updates_give_every_label(tmp_path):
    attack = _run(tmp_path, noise=0.0)
    assert len(attack.history) == 6 * 5 and len(attack.rounds) == 6
    assert all(h["accuracy"] == 1.0 for h in attack.history)
    summary = json.load(open(attack.summary_path))
    assert summary["accuracy"] == 1.0 and summary["skipped"] == {}


def test_central_noise_lowers_accuracy_as_the_integral_predicts(tmp_path):
    """With the release's noise on a client's update the attack's accuracy falls, to the mean of
    P(argmin = y_r) (docs/methods/label_dp_multiclass.md eq. (3)) within 4 standard errors."""
    attack = _run(tmp_path, noise=0.0, attack_noise=0.003, rounds=8)
    noised = np.array([h["accuracy_noised"] for h in attack.history])
    expected = np.array([h["expected_accuracy_noised"] for h in attack.history])
    sizes = np.array([h["examples"] for h in attack.history])
    assert all(h["accuracy"] == 1.0 for h in attack.history)  # the server's own view stays exact
    assert 0.2 < expected.mean() < 0.9  # a real fall, not a degenerate one
    se = np.sqrt(np.sum(expected * (1 - expected) / sizes)) / len(expected)
    assert abs(noised.mean() - expected.mean()) <= 4 * se + 1e-3, (noised.mean(), expected.mean(), se)


def test_the_per_client_bound_is_logged_every_round_below_the_single_round_bound(tmp_path):
    """The label-DP lower bound of the release of one client's update (central noise z C on the
    sum, the others' updates known): every round in TensorBoard, between 0 and the one-round
    Gaussian upper bound (mu = 2 / z); it is the max over the round's clients; resume keeps it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from audit_callbacks.estimators.gaussian import gaussian_epsilon

    attack = _run(tmp_path, noise=0.0, attack_noise=0.003, rounds=4)
    upper = gaussian_epsilon(0.003, 1e-5, sensitivity=2.0)
    per_client = [h["epsilon_lower_bound"] for h in attack.history]
    assert len(per_client) == 4 * 5 and all(0 <= v <= upper for v in per_client)
    # the replaced label's clip factor is computed exactly, so the bound passes the log K ceiling
    # of the conservative form (2.30 for 10 classes)
    assert max(per_client) > np.log(10)
    acc = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = [e.value for e in acc.Scalars("fl_label_attack/epsilon_lower_bound")]
    assert len(logged) == 4
    for r, value in zip(attack.rounds, logged, strict=True):
        clients = [h["epsilon_lower_bound"] for h in attack.history if h["round"] == r["round"]]
        assert value == pytest.approx(max(clients), rel=1e-6)
    assert acc.Scalars("fl_label_attack/epsilon_lower_bound_max")[-1].value == pytest.approx(max(per_client), rel=1e-6)
    assert acc.Scalars("fl_label_attack/epsilon_single_round")[-1].value == pytest.approx(upper, rel=1e-6)
    summary = json.load(open(attack.summary_path))
    assert summary["epsilon_lower_bound_max"] == pytest.approx(max(per_client))
    assert summary["epsilon_single_round"] == pytest.approx(upper)
    assert summary["flipped_clip_factors"].startswith("exact")
    again = FederatedLabelAttack()
    again.load_state_dict(attack.state_dict())
    # the checkpoint keeps no real client's id or dataset size (issue 26)
    assert again.history == [] and again.running_max == attack.running_max
    assert again.attacked_clients == attack.attacked_clients == len(attack.history)
    assert again.published == attack.published and again.accuracy == attack.accuracy
    assert "history" not in summary and all("client" not in r and "examples" not in r for r in summary["rounds"])
    assert torch.equal(again._gen.get_state(), attack._gen.get_state())


def test_a_local_randomizer_skips_the_noised_attack_and_the_bound_with_a_reason(tmp_path):
    from audit_callbacks.mechanisms import GaussianRandomizer

    with pytest.warns(UserWarning, match="randomize their updates locally"):
        attack = _run(tmp_path, noise=0.5, rounds=2, randomizer=GaussianRandomizer(1.0, 1.0, 1e-5))
    assert attack.skips["local_randomizer"] == 2
    assert all("epsilon_lower_bound" not in h and "accuracy_noised" not in h for h in attack.history)


def test_more_than_one_local_step_is_skipped_with_a_reason(tmp_path):
    with pytest.warns(UserWarning, match="one local step"):
        attack = _run(tmp_path, noise=0.0, rounds=2, local_batch=8)
    assert attack.history == [] and attack.skips["not_fedsgd"] == 10


def test_binary_success_probability_matches_the_sign_attack():
    """The sigmoid form used for binary models: P(a_r + noise < 0 | y = 1) = Phi(-m / sd)."""
    from scipy.stats import norm

    m, sd = np.array([-0.3, 0.2]), np.array([0.5, 0.1])
    means = np.stack([np.zeros(2), m], axis=1)
    got = argmin_attack_success_probability(means, np.array([1, 0]), sd / np.sqrt(2))
    np.testing.assert_allclose(got, [norm.cdf(0.3 / 0.5), norm.cdf(0.2 / 0.1)], rtol=1e-9)


def test_a_sigmoid_logit_model_is_attacked_and_bounded(tmp_path):
    """Breast cancer, one sigmoid logit with log-loss: every label noise-free, the bound with the
    exact clip factor of the replaced label, and P0 that the noised attack's accuracy averages."""
    import torch.nn.functional as F

    dm = FederatedDataModule("breast_cancer", num_clients=20, rounds_per_epoch=6, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(30, 1, hidden=(64,)), clients_per_round=5, noise_multiplier=0.0, clip_norm=1.0,
                      local_lr=0.5, local_epochs=1, local_batch_size=1000, sampling="shuffle", seed=0,
                      delta=1e-5, loss_fn=lambda z, y: F.binary_cross_entropy_with_logits(z.reshape(-1), y.float()))
    attack = FederatedLabelAttack(noise_multiplier=0.01)
    fit(dm, module, [attack], 6, tmp_path)
    assert len(attack.history) == 30 and all(h["accuracy"] == 1.0 for h in attack.history)
    summary = json.load(open(attack.summary_path))
    assert summary["flipped_clip_factors"].startswith("exact") and summary["skipped"] == {}
    bounds = [h["epsilon_lower_bound"] for h in attack.history]
    assert 0 < max(bounds) <= summary["epsilon_single_round"]
    noised = np.array([h["accuracy_noised"] for h in attack.history])
    expected = np.array([h["expected_accuracy_noised"] for h in attack.history])
    sizes = np.array([h["examples"] for h in attack.history])
    assert 0.55 < expected.mean() < 0.99
    se = np.sqrt(np.sum(expected * (1 - expected) / sizes)) / len(expected)
    assert abs(noised.mean() - expected.mean()) <= 4 * se + 1e-3, (noised.mean(), expected.mean(), se)


class _ProbeClip(FederatedLabelAttack):
    """Keeps, for the first attacked client of each round, c' of a few pairs next to the clip
    factor of DPFedAvg's own local update recomputed with that label replaced."""

    checks: list

    def on_federated_client_updates(self, trainer, pl_module, fl_round):
        self._ids = fl_round.row_ids[fl_round.real_rows].tolist()
        return super().on_federated_client_updates(trainer, pl_module, fl_round)

    def _flipped_clip(self, trainer, pl_module, x, y, update, c, lr, c_norm):
        fn = super()._flipped_clip(trainer, pl_module, x, y, update, c, lr, c_norm)
        if fn is None or len(self.checks) >= 12:
            return fn
        cid = next(c for c in self._ids if torch.equal(pl_module.client_data(c)[0], x))
        rows = np.array([0, 1, 2])
        labels = (y[:3].numpy() + 3) % 10
        got = fn(rows, labels)
        orig, flat = pl_module._client_data, pl_module.flat_parameters()
        for i, r in enumerate(rows):
            y2 = y.clone()
            y2[r] = int(labels[i])
            pl_module._client_data = lambda j, y2=y2: (x, y2) if j == cid else orig(j)
            try:
                raw, _ = pl_module._local_update(cid, flat)  # the client's unclipped update
            finally:
                pl_module._client_data = orig
            self.checks.append((float(got[i]), min(1.0, c_norm / float(raw.norm())), c))
        return fn


def test_the_replaced_labels_clip_factor_is_that_of_the_recomputed_update(tmp_path):
    """A clip norm small enough that every update is clipped (c < 1): c' from eq. (7) equals
    the clip factor of DPFedAvg's own local update rerun with the label replaced."""
    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=3, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(200, 200)), clients_per_round=5, noise_multiplier=0.0, clip_norm=0.05,
                      local_lr=0.5, local_epochs=1, local_batch_size=1000, sampling="shuffle", seed=0, delta=1e-5)
    probe = _ProbeClip(noise_multiplier=0.003)
    probe.checks = []
    fit(dm, module, [probe], 3, tmp_path)
    got, want, c = np.array(probe.checks).T
    assert len(got) == 12 and c.max() < 0.9 and want.max() < 0.9  # clipping is active on both sides
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert max(h["epsilon_lower_bound"] for h in probe.history) > 0


def test_a_batchnorm_model_gets_the_conservative_bound_and_training_is_untouched(tmp_path):
    """BatchNorm couples a batch's examples, so per-example gradients alone cannot give c': the
    bound falls back to the conservative form (at most log K) and the run's model equals the run
    without the callback (the attack's forwards restore the running statistics and the RNG)."""
    from torch import nn

    def run(callbacks):
        dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=3, seed=0)
        dm.setup("fit")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))
        module = DPFedAvg(model, clients_per_round=4, noise_multiplier=0.0, clip_norm=1.0, local_lr=0.5,
                          local_epochs=1, local_batch_size=1000, sampling="shuffle", seed=0, delta=1e-5,
                          reproducible_noise=True)
        fit(dm, module, callbacks, 3, tmp_path, logger=False)
        return module

    with pytest.warns(UserWarning, match="BatchNorm"):
        attack = FederatedLabelAttack(noise_multiplier=0.003)
        audited = run([attack])
    plain = run([])
    assert attack.flipped_clip.startswith("unknown")
    bounds = [h["epsilon_lower_bound"] for h in attack.history]
    assert len(bounds) == 12 and max(bounds) <= np.log(10) + 1e-9
    torch.testing.assert_close(audited.flat_parameters(), plain.flat_parameters(), rtol=0, atol=0)
    for a, b in zip(audited.model.buffers(), plain.model.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_accuracies_are_published_only_over_blocks_of_examples(tmp_path):
    """One client a round: a round's accuracy would be that client's; the accuracies reach the
    logger, the summary's rounds and the checkpoint only over blocks of min_examples attacked
    examples (the running mean over every attacked example)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    attack = _run(tmp_path, noise=0.0, attack_noise=0.003, rounds=6, clients_per_round=1,
                  min_examples=60)
    per_client = [h["examples"] for h in attack.history]
    acc = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = acc.Scalars("fl_label_attack/accuracy") if "fl_label_attack/accuracy" in acc.Tags()["scalars"] else []
    # each logged value covers at least 60 more examples than the one before
    blocks, seen, last = [], 0.0, 0.0
    for n in per_client:
        seen += n
        if seen - last >= 60:
            blocks.append(seen)
            last = seen
    assert len(logged) == len(blocks) >= 1
    summary = json.load(open(attack.summary_path))
    with_accuracy = [r for r in summary["rounds"] if "accuracy" in r]
    assert len(with_accuracy) == len(blocks) < len(summary["rounds"])
    assert attack.published["attacked_examples"] == blocks[-1]
    correct = sum(h["accuracy"] * h["examples"] for h in attack.history)
    if attack.published["attacked_examples"] == sum(per_client):
        assert summary["accuracy"] == pytest.approx(correct / sum(per_client))


@pytest.mark.parametrize("value", [0, 1.5, True, "100"])
def test_min_examples_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="min_examples"):
        FederatedLabelAttack(min_examples=value)


def test_the_logit_layer_is_found_whatever_the_registration_order(tmp_path):
    """The attacked layer is the nn.Linear whose output is the model's output: with the head
    registered before the hidden layers (the last registered one is a 200-wide hidden layer),
    the noise-free attack still recovers every label; a model whose output no nn.Linear gives
    steps aside, warned once, and attacks nothing."""

    class HeadFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(200, 10)
            self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 200), torch.nn.ReLU())

        def forward(self, x):
            return self.head(self.body(x))

    class NoLinearOut(HeadFirst):
        def forward(self, x):
            z = self.head(self.body(x))
            return torch.cat([z, -z], dim=1)  # 20 outputs: no nn.Linear gives them

    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=3, seed=0)
    dm.setup("fit")
    for net, attacked in ((HeadFirst(), True), (NoLinearOut(), False)):
        torch.manual_seed(0)
        module = DPFedAvg(net, clients_per_round=5, noise_multiplier=0.0, clip_norm=1.0, local_lr=0.5,
                          local_epochs=1, local_batch_size=1000, sampling="shuffle", seed=0, delta=1e-5)
        attack = FederatedLabelAttack(min_examples=10)
        if attacked:
            fit(dm, module, [attack], 3, tmp_path / "a")
            assert len(attack.history) == 15 and all(h["accuracy"] == 1.0 for h in attack.history)
        else:
            with pytest.warns(UserWarning, match="logits are an nn.Linear layer's output") as caught:
                fit(dm, module, [attack], 3, tmp_path / "b")
            assert sum("logits are an nn.Linear" in str(w.message) for w in caught) == 1
            assert attack.history == [] and attack.attacked_clients == 0


def test_the_summary_says_which_attacked_clients_the_accuracies_cover(tmp_path):
    """A checkpoint keeps only the published sums, so a resume drops the examples attacked after
    its last block: ``attacked_clients`` still counts their clients (40 against 1,077 examples
    after a resume, 40 against 1,437 uninterrupted), so the summary says how many of them the
    accuracies cover and how many a resume dropped (client counts only)."""
    attack = _run(tmp_path, noise=0.0, attack_noise=0.003, rounds=3, min_examples=300)
    # the blocks end at rounds' ends: replay them from the in-memory rows
    seen = published = clients = covered = 0
    for r in sorted({h["round"] for h in attack.history}):
        rows = [h for h in attack.history if h["round"] == r]
        seen, clients = seen + sum(h["examples"] for h in rows), clients + len(rows)
        if seen - published >= 300:
            published, covered = int(seen), clients
    assert 0 < covered < clients == attack.attacked_clients == 15  # the last round's block is open
    summary = attack.summary()
    entry = summary["results"]["accuracy"]
    assert summary["attacked_clients"] == 15 and entry["status"] == "ok"
    assert entry["counts"] == {"n": covered, "attacked_examples": published, "attacked_clients": 15,
                               "clients_dropped_at_resume": 0}
    resumed = FederatedLabelAttack(min_examples=300)
    resumed.load_state_dict(attack.state_dict())
    after = resumed.summary()
    entry = after["results"]["accuracy"]
    assert after["attacked_clients"] == 15 and entry["value"] == summary["results"]["accuracy"]["value"]
    assert entry["counts"] == {"n": covered, "attacked_examples": published, "attacked_clients": 15,
                               "clients_dropped_at_resume": 15 - covered}
    assert entry["status"].startswith(f"covers {covered} of the 15 attacked clients: the examples of "
                                      f"{15 - covered} attacked before a resume")
    # no example count of the dropped clients (their dataset sizes) in the counts or the status
    numbers = {*entry["counts"].values(), *(int(t) for t in re.findall(r"\d+", entry["status"]))}
    assert int(seen - published) not in numbers
