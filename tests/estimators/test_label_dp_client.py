"""client_update_label_dp_lower_bound: one FedSGD client's update in a DP-FedAvg release."""

import numpy as np
import pytest
import torch

from audit_callbacks.attacks.label_reconstruction import factorize_layer, reconstruct_labels
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.label_dp import client_update_label_dp_lower_bound


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
    assert 0.05 < res.detail.p0.mean() < 0.95  # a regime where the attack sometimes fails
    gen = torch.Generator().manual_seed(1)
    trials = 3000
    hits = np.zeros(n)
    for _ in range(trials):
        noisy = torch.tensor(g) + torch.randn(g.shape, generator=gen, dtype=torch.float64) * (z * clip)
        pred = reconstruct_labels(xt, noisy[:, :-1], noisy[:, -1], factorization=f).numpy()
        hits += pred == y
    rate = hits / trials
    se = np.sqrt(res.detail.p0 * (1 - res.detail.p0) / trials) + 1e-4
    assert np.all(np.abs(rate - res.detail.p0) <= 4 * se), np.max(np.abs(rate - res.detail.p0) / se)
    assert res.expected_attack_accuracy.value == pytest.approx(res.detail.p0.mean())


@pytest.mark.parametrize("k", [1, 10])
def test_bound_is_below_the_single_round_bound_and_falls_with_noise(k):
    x, probs, y, _ = _client(k, seed=3)
    v = factorize_layer(torch.tensor(x), bias=True).gram_inv_diag
    kw = dict(update_scale=0.5, local_lr=0.5, clip_norm=1.0, delta=1e-5)
    values = []
    for z in (0.0005, 0.01, 0.1, 1.0, 100.0):
        res = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=z, **kw)
        assert 0 <= res.epsilon_lower_bound.value <= res.epsilon_single_round.value
        assert res.epsilon_single_round.value == pytest.approx(gaussian_epsilon(z, 1e-5, sensitivity=2.0))
        values.append(res.epsilon_lower_bound.value)
    # without the replaced update's clip factor c' (-> 0) the bound cannot pass log K: P1 >= 1/K
    assert values[0] == pytest.approx(np.log(max(k, 2)), rel=1e-4)
    assert values[-1] < 1e-2 and values == sorted(values, reverse=True)
    exhaustive = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=0.002, max_pairs=None, **kw)
    ranked = client_update_label_dp_lower_bound(probs, y, v, noise_multiplier=0.002, **kw)
    assert ranked.epsilon_lower_bound.value <= exhaustive.epsilon_lower_bound.value + 1e-12


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


@pytest.mark.parametrize("k", [1, 10])
def test_known_flipped_clip_factors_give_p1_of_the_attack_and_a_stronger_bound(k):
    """With c' known the bound leaves the log K ceiling; P1 of the best pair is the attack's
    success rate on releases of the neighbouring update (Monte Carlo, 4 standard errors), and a
    callable asked for the evaluated pairs only gives the same bound as the full array."""
    x, probs, y, err = _client(k, seed=5)
    n = x.shape[0]
    lr, c, clip = 0.5, 0.6, 1.0
    rng = np.random.default_rng(7)
    kk = max(k, 2)
    flip = rng.uniform(0.4, 0.8, size=(n, kk))
    xt = torch.tensor(x)
    f = factorize_layer(xt, bias=True)
    kw = dict(update_scale=lr * c, local_lr=lr, clip_norm=clip, delta=1e-5)
    for z in (0.0005, 0.05):
        known = client_update_label_dp_lower_bound(probs, y, f.gram_inv_diag, noise_multiplier=z,
                                                   flipped_clip_factors=flip, **kw)
        unknown = client_update_label_dp_lower_bound(probs, y, f.gram_inv_diag, noise_multiplier=z, **kw)
        asked = []

        def fn(rows, labels, asked=asked):
            asked.append(len(rows))
            return flip[rows, labels]

        lazy = client_update_label_dp_lower_bound(probs, y, f.gram_inv_diag, noise_multiplier=z,
                                                  flipped_clip_factors=fn, **kw)
        assert known.epsilon_lower_bound.value >= unknown.epsilon_lower_bound.value
        assert lazy.epsilon_lower_bound.value <= known.epsilon_lower_bound.value + 1e-9 and sum(asked) <= 4 * 16
    assert known.epsilon_lower_bound.value > 0
    assert client_update_label_dp_lower_bound(probs, y, f.gram_inv_diag, noise_multiplier=0.0005,
                                              flipped_clip_factors=flip, **kw).epsilon_lower_bound.value > np.log(kk) + 1
    # Monte Carlo of P1 at z = 0.05 for the best example: its label replaced by the worst y'
    lb = known.detail.epsilon_lower_bound
    r = int(np.argmax(np.where(np.isfinite(lb), lb, -np.inf)))
    assert known.epsilon_lower_bound.details["best_index"] == r
    y2 = int(known.detail.worst_labels[r])
    y_alt = y.copy()
    y_alt[r] = y2
    if k == 1:
        err_alt = (probs - y_alt)[:, None]
    else:
        err_alt = probs - np.eye(k)[y_alt]
    cpr = np.full(n, c)
    cpr[:] = flip[r, y2]  # the whole changed update shares its clip factor
    g1 = lr * (cpr[:, None] * err_alt).T @ np.hstack([x, np.ones((n, 1))]) / n
    gen = torch.Generator().manual_seed(2)
    trials, hits = 4000, 0
    for _ in range(trials):
        noisy = torch.tensor(g1) + torch.randn(g1.shape, generator=gen, dtype=torch.float64) * 0.05 * clip
        hits += int(reconstruct_labels(xt, noisy[:, :-1], noisy[:, -1], factorization=f)[r] == y[r])
    se = np.sqrt(known.detail.p1[r] * (1 - known.detail.p1[r]) / trials) + 1e-4
    assert abs(hits / trials - known.detail.p1[r]) <= 4 * se, (hits / trials, known.detail.p1[r])


@pytest.mark.parametrize("k", [1, 3])
def test_label_change_gradients_give_the_changed_update_exactly(k):
    """Delta_raw' = Delta_raw - (lr / n) grad (L_r(y') - L_r(y_r)): the one-step FedSGD update
    recomputed with row r's label replaced (autograd of the mean loss) has that norm."""
    from torch import nn

    from audit_callbacks.attacks.label_gradients import label_change_gradients, mean_loss_gradient

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 7), nn.Tanh(), nn.Linear(7, k))
    x = torch.randn(9, 5)
    y = torch.randint(0, max(k, 2), (9,))
    lr, n = 0.3, 9
    raw = -lr * mean_loss_gradient(model, x, y)
    rows = torch.tensor([0, 4, 8, 4])
    new = (y[rows] + torch.tensor([1, 1, 1, 2])) % max(k, 2)
    d = label_change_gradients(model, x[rows], y[rows], new)
    for i, r in enumerate(rows.tolist()):
        y_alt = y.clone()
        y_alt[r] = new[i]
        want = -lr * mean_loss_gradient(model, x, y_alt)
        got = raw - (lr / n) * d[i]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
