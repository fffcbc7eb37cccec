"""FederatedLabelAttack: label reconstruction from FedSGD client updates in DPFedAvg (digits)."""

import json

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


def _run(tmp_path, noise, rounds=6, attack_noise=None, local_batch=1000):
    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=rounds, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(200, 200)), clients_per_round=5, noise_multiplier=noise,
                      clip_norm=1.0, local_lr=0.5, local_epochs=1, local_batch_size=local_batch,
                      sampling="shuffle", seed=0, delta=1e-5)
    attack = FederatedLabelAttack(noise_multiplier=attack_noise)
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
