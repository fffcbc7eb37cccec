"""client_update_label_dp_lower_bound: one FedSGD client's update in a DP-FedAvg release."""

import numpy as np
import pytest
import torch

from audit_callbacks.attacks.label_reconstruction import factorize_layer, reconstruct_labels
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.label_dp_client import client_update_label_dp_lower_bound


def _client(k: int, n: int = 12, p: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.normal(size=(n, p)), 0.0) + 0.05
    if k == 1:
        probs = 1 / (1 + np.exp(-rng.normal(size=n)))
        y = rng.integers(0, 2, n)
        err = (probs - y)[:, None]
    else:
        logits = rng.normal(size=(n, k))
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        y = rng.integers(0, k, n)
        err = probs - np.eye(k)[y]
    return x, probs, y, err


@pytest.mark.parametrize("k", [1, 10])
def test_p0_is_the_success_rate_of_the_attack_on_noised_updates(k):
    """Monte Carlo of the release: -Delta = s mean_r err_r [x_r, 1]^T plus N(0, (z C)^2) on every
    entry, attacked with reconstruct_labels; per-example success within 4 standard errors of P0."""
    x, probs, y, err = _client(k)
    n = x.shape[0]
    lr, c, z, clip = 0.5, 0.6, 0.1, 1.0
    s = lr * c
    g = s * err.T @ np.hstack([x, np.ones((n, 1))]) / n  # [K, p + 1]
    xt = torch.tensor(x)
    f = factorize_layer(xt, bias=True)
    res = client_update_label_dp_lower_bound(probs, y, f.gram_inv_diag, update_scale=s, local_lr=lr,
                                             noise_multiplier=z, clip_norm=clip, delta=1e-5)
    assert 0.05 < res.p0.mean() < 0.95  # a regime where the attack sometimes fails
    gen = torch.Generator().manual_seed(1)
    trials = 3000
    hits = np.zeros(n)
    for _ in range(trials):
        noisy = torch.tensor(g) + torch.randn(g.shape, generator=gen, dtype=torch.float64) * (z * clip)
        pred = reconstruct_labels(xt, noisy[:, :-1], noisy[:, -1], factorization=f).numpy()
        hits += pred == y
    rate = hits / trials
    se = np.sqrt(res.p0 * (1 - res.p0) / trials) + 1e-4
    assert np.all(np.abs(rate - res.p0) <= 4 * se), np.max(np.abs(rate - res.p0) / se)


@pytest.mark.parametrize("k", [1, 10])
def test_bound_is_below_the_single_round_bound_and_falls_with_noise(k):
    x, probs, y, _ = _client(k, seed=3)
    v = factorize_layer(torch.tensor(x), bias=True).gram_inv_diag
    kw = dict(update_scale=0.5, local_lr=0.5, clip_norm=1.0, delta=1e-5)
    values = []
    for z in (0.0005, 0.01, 0.1, 1.0, 100.0):
        res = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=z, **kw)
        assert 0 <= res.epsilon_lower_bound <= res.epsilon_single_round
        assert res.epsilon_single_round == pytest.approx(gaussian_epsilon(z, 1e-5, sensitivity=2.0))
        values.append(res.epsilon_lower_bound)
    # without the replaced update's clip factor c' (-> 0) the bound cannot pass log K: P1 >= 1/K
    assert values[0] == pytest.approx(np.log(max(k, 2)), rel=1e-4)
    assert values[-1] < 1e-2 and values == sorted(values, reverse=True)
    exhaustive = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=0.002, max_pairs=None, **kw)
    ranked = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=0.002, **kw)
    assert ranked.epsilon_lower_bound <= exhaustive.epsilon_lower_bound + 1e-12


@pytest.mark.parametrize(
    ("change", "name"),
    [({"update_scale": 0.0}, "update_scale"), ({"update_scale": 0.9}, "update_scale"),
     ({"noise_multiplier": 0.0}, "noise_multiplier"), ({"clip_norm": float("nan")}, "clip_norm"),
     ({"delta": 1.0}, "delta"), ({"local_lr": -1.0}, "local_lr"),
     ({"gram_inv_diag": np.zeros(12)}, "gram_inv_diag"), ({"labels": np.full(12, 10)}, "labels"),
     ({"probs": np.full((12, 10), 0.5)}, "probs")],
)
def test_bad_input_names_the_argument(change, name):
    x, probs, y, _ = _client(10)
    v = factorize_layer(torch.tensor(x), bias=True).gram_inv_diag
    kw = dict(probs=probs, labels=y, gram_inv_diag=v, update_scale=0.5, local_lr=0.5, noise_multiplier=1.0,
              clip_norm=1.0, delta=1e-5)
    kw.update(change)
    with pytest.raises(ValueError, match=name):
        client_update_label_dp_lower_bound(**kw)
