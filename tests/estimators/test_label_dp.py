"""Label-DP lower bounds (Yuan et al. 2022 Alg. 2, App. A.3; METHODS B7-B10).

Every closed form is checked against something independent: autograd per-example gradients of
a real model on sklearn's breast cancer data (flipped-label norms, clip factors, layer and
all-parameter gradient changes), a seeded Monte Carlo of the DP-SGD noise that runs the actual
attack (P_0, P_1), numpy's explicit inverse (the Gram diagonal), scipy's normal CDF, the
two-Gaussian epsilon of Andrew et al. (2024) and the Opacus RDP accountant (the single-step bound), and a
Monte Carlo of exponential maxima (the extrapolation theorem).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from audit_callbacks.attacks.label_reconstruction import label_attack_statistic, reconstruct_labels
from audit_callbacks.estimators import epsilon_two_gaussians, gaussian_epsilon
from audit_callbacks.estimators.label_dp import (
    LabelDPBounds,
    extrapolate_lower_bound,
    extrapolation_factor,
    flipped_clip_factors,
    label_dp_lower_bound,
    last_layer_gram_inverse_diag,
)
from audit_callbacks.estimators.result import AuditResult
from datamodules import load_breast_cancer_tensors
from models import MLP

DELTA = 1e-5


# --------------------------------------------------------------------------------------------
# A real model, per-example gradients by autograd
# --------------------------------------------------------------------------------------------


def _per_example_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Per-example gradients of the log-loss for every parameter (torch.func), float64."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(prm, xi, yi):
        logit = functional_call(model, prm, (xi.unsqueeze(0),))[0, 0]
        return F.binary_cross_entropy_with_logits(logit, yi)

    return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)


def _norms(per: dict) -> torch.Tensor:
    return torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in per.values()))


class Batch:
    """Breast cancer batch through a float64 MLP(30 -> 32 -> 16 -> 1), trained a few steps."""

    def __init__(self, n: int = 8, seed: int = 0, train_steps: int = 5) -> None:
        x_all, y_all = load_breast_cancer_tensors()
        torch.manual_seed(seed)
        model = MLP(30, 1, hidden=(32, 16)).double()
        x_all = x_all.double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(train_steps):
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(model(x_all)[:, 0], y_all.double()).backward()
            opt.step()
        idx = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(seed))[:n]
        self.model = model
        self.x = x_all[idx]
        self.y = y_all[idx].double()
        with torch.no_grad():
            self.features = model.net[:-1](self.x)  # last hidden activations [n, 16]
            self.probs = torch.sigmoid(model(self.x)[:, 0])
        self.per = _per_example_grads(model, self.x, self.y)
        self.norms = _norms(self.per)
        self.per_flip = _per_example_grads(model, self.x, 1.0 - self.y)
        self.norms_flip = _norms(self.per_flip)
        self.layer_keys = ("net.5.weight", "net.5.bias")

    def clip(self, norms: torch.Tensor, c: float) -> torch.Tensor:
        return torch.clamp(c / norms, max=1.0)

    def clipped_layer_mean(self, c: float, n_e: float, flip_row: int | None = None):
        """Mean clipped gradient of the last layer (weight [1, 16], bias [1]) by autograd."""
        cf = self.clip(self.norms, c)
        w = self.per[self.layer_keys[0]] * cf[:, None, None]
        b = self.per[self.layer_keys[1]] * cf[:, None]
        if flip_row is not None:
            cf1 = self.clip(self.norms_flip, c)
            w = w.clone()
            b = b.clone()
            w[flip_row] = self.per_flip[self.layer_keys[0]][flip_row] * cf1[flip_row]
            b[flip_row] = self.per_flip[self.layer_keys[1]][flip_row] * cf1[flip_row]
        return w.sum(0) / n_e, b.sum(0) / n_e

    def bound(self, c: float, sigma: float, n_e: float, delta: float = DELTA) -> LabelDPBounds:
        return label_dp_lower_bound(
            self.features.numpy(),
            self.probs.numpy(),
            self.y.numpy(),
            self.norms.numpy(),
            max_grad_norm=c,
            noise_multiplier=sigma,
            expected_batch_size=n_e,
            delta=delta,
        )


@pytest.fixture(scope="module")
def batch() -> Batch:
    return Batch()


def _clip_norm(b: Batch) -> float:
    """A clip norm that clips about half the examples (observed or flipped)."""
    return float(torch.median(torch.cat([b.norms, b.norms_flip])))


# --------------------------------------------------------------------------------------------
# Closed forms against autograd
# --------------------------------------------------------------------------------------------


def test_flipped_clip_factor_matches_autograd_recomputation(batch):
    c = _clip_norm(batch)
    clip, flipped_norms, flipped_clip = flipped_clip_factors(
        batch.probs.numpy(), batch.y.numpy(), batch.norms.numpy(), c
    )
    np.testing.assert_allclose(flipped_norms, batch.norms_flip.numpy(), rtol=1e-10)
    np.testing.assert_allclose(flipped_clip, batch.clip(batch.norms_flip, c).numpy(), rtol=1e-10)
    np.testing.assert_allclose(clip, batch.clip(batch.norms, c).numpy(), rtol=1e-12)
    assert (clip < 1).any() and (flipped_clip < 1).any() and (flipped_clip == 1).any()
    res = batch.bound(c, sigma=1.0, n_e=len(batch.y))
    np.testing.assert_allclose(res.detail.flipped_clip_factors, flipped_clip, rtol=1e-12)
    np.testing.assert_allclose(res.detail.clip_factors, clip, rtol=1e-12)


def test_mu_of_every_pair_matches_autograd_gradient_changes(batch):
    c, sigma, n_e = _clip_norm(batch), 0.8, 10.0
    res = batch.bound(c, sigma, n_e)
    s = sigma * c / n_e
    cf0 = batch.clip(batch.norms, c)
    cf1 = batch.clip(batch.norms_flip, c)
    g0w, g0b = batch.clipped_layer_mean(c, n_e)
    for r in range(len(batch.y)):
        # all parameters: || g-bar_r(flipped) - g-bar_r || / (sigma C)
        diff = torch.sqrt(
            sum(
                (batch.per_flip[k][r] * cf1[r] - batch.per[k][r] * cf0[r]).pow(2).sum()
                for k in batch.per
            )
        )
        assert res.detail.mu_pair_all_params[r] == pytest.approx(float(diff) / (sigma * c), rel=1e-9)
        # observed layer: || G_1[r] - G_0 || / s with both means from autograd
        g1w, g1b = batch.clipped_layer_mean(c, n_e, flip_row=r)
        layer = torch.sqrt((g1w - g0w).pow(2).sum() + (g1b - g0b).pow(2).sum())
        assert res.detail.mu_pair_layer[r] == pytest.approx(float(layer) / s, rel=1e-9)


def test_statistic_means_are_the_projection_of_autograd_mean_gradients(batch):
    """Alg. 2: R^T (C^T C)^{-1} C^T G-bar, with G-bar from autograd, and the c_r a_r / N_e form."""
    c, sigma, n_e = _clip_norm(batch), 0.8, 12.0
    res = batch.bound(c, sigma, n_e)
    xt = np.c_[batch.features.numpy(), np.ones(len(batch.y))]
    pinv = np.linalg.inv(xt @ xt.T) @ xt  # explicit reference, fine at this size
    g0w, g0b = batch.clipped_layer_mean(c, n_e)
    g0 = np.r_[g0w.numpy()[0], g0b.numpy()]
    np.testing.assert_allclose(res.detail.statistic_mean0[:, 0], pinv @ g0, rtol=1e-7, atol=1e-12)
    a = batch.probs.numpy() - batch.y.numpy()
    np.testing.assert_allclose(res.detail.statistic_mean0[:, 0], res.detail.clip_factors * a / n_e, rtol=1e-7)
    for r in range(len(batch.y)):
        g1w, g1b = batch.clipped_layer_mean(c, n_e, flip_row=r)
        g1 = np.r_[g1w.numpy()[0], g1b.numpy()]
        assert res.detail.statistic_mean1[r, 0] == pytest.approx((pinv @ g1)[r], rel=1e-7)
    np.testing.assert_allclose(res.detail.gram_inv_diag, np.diag(np.linalg.inv(xt @ xt.T)), rtol=1e-8)
    np.testing.assert_allclose(
        last_layer_gram_inverse_diag(batch.features.numpy()), res.detail.gram_inv_diag
    )
    np.testing.assert_allclose(res.detail.statistic_std, sigma * c / n_e * np.sqrt(res.detail.gram_inv_diag))
    # P_0 by scipy directly: Phi(|c_r a_r| / (sigma C sqrt(v_r)))
    z0 = res.detail.clip_factors * np.abs(a) / (sigma * c * np.sqrt(res.detail.gram_inv_diag))
    np.testing.assert_allclose(res.detail.p0, stats.norm.cdf(z0), rtol=1e-12)
    assert res.detail.noise_std == pytest.approx(sigma * c / n_e)


# --------------------------------------------------------------------------------------------
# P_0, P_1 against a Monte Carlo of the noise running the actual attack
# --------------------------------------------------------------------------------------------


def test_p0_p1_match_monte_carlo_of_the_attack(batch):
    """Simulate G~ = G-bar + xi (xi ~ N(0, s^2 I), G-bar by autograd) and run the attack.

    P_0[r]: share of draws on D0 where ``reconstruct_labels`` outputs y_r (one call per draw).
    P_1[r]: same with label r flipped (G-bar_1[r] by autograd); all draws of one r go through
    ``label_attack_statistic`` at once as the columns of a [trials, p] gradient, with the
    binary rule y = 1 iff statistic < 0. Expected batch size != N, as with Poisson sampling.
    """
    c = _clip_norm(batch)
    n = len(batch.y)
    n_e = 10.0
    # noise so that the z-scores are O(1): sigma = median |c a| / (C sqrt(v))
    v = last_layer_gram_inverse_diag(batch.features.numpy())
    cf = batch.clip(batch.norms, c).numpy()
    a = batch.probs.numpy() - batch.y.numpy()
    sigma = float(np.median(cf * np.abs(a) / (c * np.sqrt(v))))
    res = batch.bound(c, sigma, n_e)
    assert 0.55 < res.detail.p0.min() and res.detail.p0.max() < 0.999  # informative, not saturated
    s = sigma * c / n_e
    trials = 1500
    gen = torch.Generator().manual_seed(123)
    y = batch.y.long()

    gw, gb = batch.clipped_layer_mean(c, n_e)
    noise_w = torch.randn((trials, *gw.shape), generator=gen, dtype=torch.float64) * s
    noise_b = torch.randn((trials, *gb.shape), generator=gen, dtype=torch.float64) * s
    p0_mc = np.zeros(n)
    for t in range(trials):
        p0_mc += (reconstruct_labels(batch.features, gw + noise_w[t], gb + noise_b[t]) == y).numpy()
    p0_mc /= trials

    p1_mc = np.zeros(n)
    for r in range(n):
        gw1, gb1 = batch.clipped_layer_mean(c, n_e, flip_row=r)
        draws_w = gw1 + torch.randn((trials, gw1.shape[1]), generator=gen, dtype=torch.float64) * s
        draws_b = gb1 + torch.randn(trials, generator=gen, dtype=torch.float64) * s
        stat, _ = label_attack_statistic(batch.features, draws_w, draws_b)  # [n, trials]
        p1_mc[r] = float(((stat[r] < 0).long() == y[r]).double().mean())

    for p_cf, p_mc in ((res.detail.p0, p0_mc), (res.detail.p1, p1_mc)):
        se = np.sqrt(p_cf * (1 - p_cf) / trials)
        assert np.all(np.abs(p_mc - p_cf) <= 4 * se + 1e-12), (p_cf, p_mc)
    assert np.all(res.detail.p1 < 0.5) and np.all(res.detail.p0 > 0.5)


# --------------------------------------------------------------------------------------------
# Order of the bounds (METHODS B9) and the analytic upper bound
# --------------------------------------------------------------------------------------------


def _random_instance(rng: np.random.Generator):
    n = int(rng.integers(1, 9))
    p = int(rng.integers(n, n + 10))
    x = np.maximum(rng.normal(size=(n, p)) * rng.uniform(0.2, 3.0), 0.0)
    x[:, 0] += 0.1  # keep rows non-zero
    probs = rng.uniform(0.01, 0.99, n)
    labels = rng.integers(0, 2, n)
    layer = np.abs(probs - labels) * np.linalg.norm(np.c_[x, np.ones(n)], axis=1)
    norms = layer * (1.0 + rng.exponential(rng.uniform(0.1, 5.0), n))
    kw = dict(
        max_grad_norm=float(rng.uniform(0.05, 3.0)),
        noise_multiplier=float(np.exp(rng.uniform(np.log(0.05), np.log(5.0)))),
        expected_batch_size=float(n * rng.uniform(0.5, 2.0)),
        delta=float(10 ** rng.uniform(-8, -2)),
    )
    return (x, probs, labels, norms), kw


def test_precomputed_gram_diagonal_gives_the_same_bounds(batch):
    """gram_inv_diag from the attack's torch factorisation (what the callbacks share) gives the
    bounds of the numpy path; a non-positive or wrongly shaped diagonal, or a batch wider than
    the layer, is refused."""
    from audit_callbacks.attacks.label_reconstruction import factorize_layer

    c = _clip_norm(batch)
    ref = batch.bound(c, 1.0, 40.0)
    v = factorize_layer(batch.features).gram_inv_diag.numpy()
    got = label_dp_lower_bound(batch.features.numpy(), batch.probs.numpy(), batch.y.numpy(), batch.norms.numpy(),
                               max_grad_norm=c, noise_multiplier=1.0, expected_batch_size=40.0, delta=DELTA,
                               gram_inv_diag=v)
    np.testing.assert_allclose(got.detail.gram_inv_diag, ref.detail.gram_inv_diag, rtol=1e-9)
    np.testing.assert_allclose(got.detail.epsilon_lower_bound, ref.detail.epsilon_lower_bound, rtol=1e-7)
    assert got.epsilon_lower_bound.value == pytest.approx(ref.epsilon_lower_bound.value, rel=1e-7)
    assert got.epsilon_pair_all_params.value == pytest.approx(ref.epsilon_pair_all_params.value, rel=1e-12)
    args = (batch.features.numpy(), batch.probs.numpy(), batch.y.numpy(), batch.norms.numpy())
    kw = dict(max_grad_norm=c, noise_multiplier=1.0, expected_batch_size=40.0, delta=DELTA)
    with pytest.raises(ValueError, match="gram_inv_diag must be > 0"):
        label_dp_lower_bound(*args, gram_inv_diag=-v, **kw)
    with pytest.raises(ValueError, match="gram_inv_diag must have shape"):
        label_dp_lower_bound(*args, gram_inv_diag=v[:-1], **kw)
    with pytest.raises(ValueError, match="NaN"):
        label_dp_lower_bound(*args, gram_inv_diag=np.where(np.arange(len(v)) == 0, np.nan, v), **kw)
    narrow = np.ones((3, 1))
    with pytest.raises(ValueError, match="at most 2"):
        label_dp_lower_bound(narrow, np.full(3, 0.5), np.zeros(3), np.ones(3), gram_inv_diag=np.ones(3), **kw)


@pytest.mark.parametrize("kappa", [0.5, 0.25, 3.0])
def test_a_scaled_loss_is_the_unscaled_mechanism_at_clip_norm_c_over_kappa(batch, kappa):
    """Opacus on kappa * loss releases kappa * (sum_r min(1, (C/kappa)/||g_r||) g_r + N(0, sigma^2
    (C/kappa)^2)): a positive multiple of the unscaled mechanism with clip norm C / kappa and the
    same sigma, so every probability and epsilon must be equal (Lightning's gradient
    accumulation is kappa = 1 / accumulate_grad_batches)."""
    c = kappa * _clip_norm(batch)  # clips about half of the scaled gradients
    args = (batch.features.numpy(), batch.probs.numpy(), batch.y.numpy())
    kw = dict(noise_multiplier=0.8, expected_batch_size=40.0, delta=DELTA)
    scaled = label_dp_lower_bound(*args, kappa * batch.norms.numpy(), max_grad_norm=c, grad_scale=kappa, **kw)
    plain = label_dp_lower_bound(*args, batch.norms.numpy(), max_grad_norm=c / kappa, **kw)
    assert 0 < scaled.detail.clip_factors.min() < 1  # some examples clipped: kappa matters
    for name in ("log_p0", "log_p1", "mu_pair_optimal_test", "mu_pair_layer", "mu_pair_all_params"):
        np.testing.assert_allclose(getattr(scaled.detail, name), getattr(plain.detail, name), rtol=1e-9, err_msg=name)
    assert scaled.epsilon_lower_bound.value == pytest.approx(plain.epsilon_lower_bound.value, rel=1e-9)
    wrong = label_dp_lower_bound(*args, kappa * batch.norms.numpy(), max_grad_norm=c, **kw) if kappa > 1 else None
    if wrong is not None:  # ignoring kappa misstates the bound
        assert abs(wrong.epsilon_lower_bound.value - plain.epsilon_lower_bound.value) > 1e-3
    with pytest.raises(ValueError, match="grad_scale"):
        label_dp_lower_bound(*args, batch.norms.numpy(), max_grad_norm=c, grad_scale=0.0, **kw)
    with pytest.raises(ValueError, match="smaller than"):  # norms of unscaled gradients, kappa > 1 claimed
        label_dp_lower_bound(*args, batch.norms.numpy(), max_grad_norm=c, grad_scale=3.0, **kw)


def test_b9_order_on_random_instances():
    rng = np.random.default_rng(2024)
    tol = 1e-9
    strict_seen = 0
    for _ in range(60):
        args, kw = _random_instance(rng)
        res = label_dp_lower_bound(*args, **kw)
        lb = res.detail.epsilon_lower_bound
        finite = np.isfinite(lb)
        assert np.all(lb[finite] <= res.detail.epsilon_pair_optimal_test[finite] * (1 + tol) + tol)
        assert np.all(res.detail.epsilon_pair_optimal_test <= res.detail.epsilon_pair_layer * (1 + tol) + tol)
        assert np.all(res.detail.epsilon_pair_layer <= res.detail.epsilon_pair_all_params * (1 + tol) + tol)
        assert np.all(res.detail.epsilon_pair_all_params <= res.epsilon_single_step.value * (1 + tol) + tol)
        assert np.all(res.detail.mu_pair_optimal_test <= res.detail.mu_pair_layer * (1 + tol))
        assert np.all(res.detail.mu_pair_all_params <= 2.0 / kw["noise_multiplier"] * (1 + tol))
        assert res.epsilon_lower_bound.value <= res.epsilon_pair_optimal_test.value * (1 + tol) + tol
        assert res.epsilon_single_step.value == pytest.approx(
            gaussian_epsilon(kw["noise_multiplier"], kw["delta"], sensitivity=2.0)
        )
        for arr in (res.detail.p0, res.detail.p1, res.detail.log_p0, res.detail.log_p1, res.detail.epsilon_pair_optimal_test):
            assert not np.any(np.isnan(arr))
        assert math.isfinite(res.epsilon_lower_bound.value) and res.epsilon_lower_bound.value >= 0
        strict_seen += int(np.any(res.detail.epsilon_pair_optimal_test < res.detail.epsilon_pair_layer - 1e-6))
    assert strict_seen > 10  # the chain is not trivially equal


def test_optimal_test_equals_two_gaussians_epsilon(batch):
    """Equal-variance pair through the paper-003 general two-Gaussian epsilon (independent code)."""
    c = _clip_norm(batch)
    res = batch.bound(c, sigma=1.5, n_e=8.0)
    for r in range(3):
        ref = epsilon_two_gaussians(
            res.detail.statistic_mean1[r, 0] / res.detail.statistic_std[r],
            1.0,
            res.detail.statistic_mean0[r, 0] / res.detail.statistic_std[r],
            1.0,
            DELTA,
        )
        assert res.detail.epsilon_pair_optimal_test[r] == pytest.approx(ref, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.0])
def test_lower_bound_never_exceeds_analytic_upper_bound(batch, sigma):
    from opacus.accountants import RDPAccountant

    c = _clip_norm(batch)
    res = batch.bound(c, sigma, n_e=len(batch.y))
    acc = RDPAccountant()
    acc.history = [(sigma / 2.0, 1.0, 1)]  # one unsampled step, sensitivity 2C
    rdp_eps = acc.get_epsilon(DELTA)
    assert res.epsilon_single_step.value <= rdp_eps  # the exact Gaussian is below the RDP conversion
    assert res.epsilon_lower_bound.value <= res.epsilon_pair_all_params.value <= res.epsilon_single_step.value * (1 + 1e-12)
    assert np.all(res.detail.epsilon_lower_bound <= res.epsilon_single_step.value)


def test_small_noise_gives_a_non_vacuous_bound_and_it_grows_as_noise_shrinks(batch):
    c = _clip_norm(batch)
    values = [batch.bound(c, sigma, n_e=8.0).epsilon_lower_bound.value for sigma in (2.0, 0.5, 0.1)]
    assert values[0] < values[1] < values[2]
    assert values[1] > 0.1


# --------------------------------------------------------------------------------------------
# Numerical edge cases: underflow, vacuous events, no NaN
# --------------------------------------------------------------------------------------------


def test_p1_underflow_keeps_everything_finite(batch):
    c = _clip_norm(batch)
    res = batch.bound(c, sigma=1e-4, n_e=8.0)
    assert np.any(res.detail.p1 == 0.0)  # underflows in linear space
    assert np.all(np.isfinite(res.detail.log_p1)) and np.all(np.isfinite(res.detail.epsilon_lower_bound))
    # LB = log P0 - log P1 ~ z1^2 / 2: huge but finite and below the analytic bound
    assert 1e3 < res.epsilon_lower_bound.value <= res.epsilon_pair_optimal_test.value <= res.epsilon_single_step.value
    results = res.results()  # every scalar of the step is an AuditResult with a finite value
    assert all(isinstance(r, AuditResult) for r in results.values())
    assert results["epsilon_lower_bound"] is res.epsilon_lower_bound and res.epsilon_lower_bound.delta == DELTA
    assert all(math.isfinite(r.value) for r in results.values())


def test_vacuous_events_give_minus_inf_and_a_zero_batch_bound():
    # tiny |p - y| and large noise: P_0 ~ 1/2 + tiny; delta close to 1 makes every P_0 <= delta
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    res = label_dp_lower_bound(
        x,
        [0.4, 0.6],
        [1, 0],
        [1.0, 1.0],
        max_grad_norm=1.0,
        noise_multiplier=100.0,
        expected_batch_size=2,
        delta=0.9,
    )
    assert np.all(res.detail.p0 <= 0.9)
    assert np.all(res.detail.epsilon_lower_bound == -np.inf)
    assert res.epsilon_lower_bound.value == 0.0 and res.epsilon_lower_bound.details["best_index"] == -1
    assert not np.any(np.isnan(res.detail.epsilon_lower_bound))
    # with a small delta the same instance gives finite (here negative-or-small) values
    res2 = label_dp_lower_bound(
        x,
        [0.4, 0.6],
        [1, 0],
        [1.0, 1.0],
        max_grad_norm=1.0,
        noise_multiplier=100.0,
        expected_batch_size=2,
        delta=1e-6,
    )
    assert np.all(np.isfinite(res2.detail.epsilon_lower_bound)) and res2.epsilon_lower_bound.value >= 0.0


def test_expected_batch_size_cancels(batch):
    c = _clip_norm(batch)
    a = batch.bound(c, 0.7, n_e=8.0)
    b = batch.bound(c, 0.7, n_e=37.5)
    np.testing.assert_allclose(a.detail.epsilon_lower_bound, b.detail.epsilon_lower_bound, rtol=1e-10)
    np.testing.assert_allclose(a.detail.epsilon_pair_layer, b.detail.epsilon_pair_layer, rtol=1e-10)
    assert b.detail.noise_std == pytest.approx(a.detail.noise_std * 8.0 / 37.5)


def test_bias_false_uses_the_features_as_given():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 3))
    kw = dict(max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=3, delta=1e-5)
    res = label_dp_lower_bound(x, [0.2, 0.7, 0.5], [0, 1, 1], [5.0, 5.0, 5.0], bias=False, **kw)
    np.testing.assert_allclose(res.detail.gram_inv_diag, np.diag(np.linalg.inv(x @ x.T)), rtol=1e-9)
    with pytest.raises(ValueError, match="at most 3 examples"):
        label_dp_lower_bound(
            np.r_[x, x[:1] + 1], [0.2, 0.7, 0.5, 0.5], [0, 1, 1, 0], [5.0] * 4, bias=False, **kw
        )


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(probs=[0.0, 0.5]), "strictly inside"),
        (dict(probs=[0.5, 1.0]), "strictly inside"),
        (dict(labels=[0, 2]), "binary"),
        (dict(grad_norms=[0.01, 1.0]), "whole per-example gradient"),
        (dict(grad_norms=[-1.0, 1.0]), ">= 0"),
        (dict(features=[[np.nan, 1.0], [0.0, 1.0]]), "NaN"),
        (
            dict(
                features=[[1.0, 2.0], [2.0, 4.0], [3.0, 1.0], [1.0, 1.0]],
                probs=[0.5] * 4,
                labels=[0] * 4,
                grad_norms=[10.0] * 4,
            ),
            "wider layer",
        ),
        (dict(features=[[1.0, 2.0], [1.0, 2.0]]), "rank deficient"),
        (dict(probs=[0.5]), "shape"),
        (dict(delta=0.0), "delta"),
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
        (dict(expected_batch_size=0), "expected_batch_size"),
    ],
)
def test_invalid_inputs_raise(change, match):
    kw = dict(
        features=[[1.0, 0.0], [0.0, 1.0]],
        probs=[0.3, 0.6],
        labels=[1, 0],
        grad_norms=[2.0, 2.0],
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        expected_batch_size=2,
        delta=1e-5,
    )
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        label_dp_lower_bound(**kw)


# --------------------------------------------------------------------------------------------
# Extrapolation (METHODS B10, Yuan et al. 2022 A.3.1 / A.4.2)
# --------------------------------------------------------------------------------------------


def test_paper_extrapolation_factors_and_the_batch_size_they_imply():
    assert round(extrapolation_factor(15, 50), 2) == 1.69
    assert round(extrapolation_factor(80, 50), 2) == 2.12
    # invert f = 1 + log M / log N over the rounding interval of each printed factor
    for m, f in ((15, 1.69), (80, 2.12)):
        n_lo = math.exp(math.log(m) / (f + 0.005 - 1))
        n_hi = math.exp(math.log(m) / (f - 0.005 - 1))
        assert n_lo <= 50 <= n_hi
    assert not any(round(extrapolation_factor(80, n), 2) == 2.12 for n in (32, 64, 100, 128))
    assert extrapolation_factor(1, 50) == 1.0
    # the paper's bank data: 0.033 (1 batch) -> predicted 0.070 at 80 batches; measured 0.091
    predicted = extrapolate_lower_bound(0.033, 80, 50)
    assert predicted == pytest.approx(0.033 * 2.1201, rel=1e-4)
    assert 0.091 / predicted == pytest.approx(1.30, abs=0.01)  # the measurement is 30% above


def test_exact_factor_matches_monte_carlo_of_exponential_maxima():
    """E[max of n i.i.d. Exp] = H_n / lambda: the exact ratio holds, the log form is biased."""
    rng = np.random.default_rng(7)
    reps, n = 40000, 50
    for m in (15, 80):
        # max of k exponentials by inversion of its CDF (1 - e^-x)^k
        mx1 = -np.log1p(-(rng.random(reps) ** (1.0 / n)))
        mxm = -np.log1p(-(rng.random(reps) ** (1.0 / (m * n))))
        ratio = mxm.mean() / mx1.mean()
        # delta-method standard error of the ratio of two independent means
        se = ratio * math.sqrt(
            mxm.var() / reps / mxm.mean() ** 2 + mx1.var() / reps / mx1.mean() ** 2
        )
        exact = extrapolation_factor(m, n, exact=True)
        assert abs(ratio - exact) < 4 * se
        assert abs(ratio - extrapolation_factor(m, n)) > 10 * se
    assert extrapolation_factor(15, 50, exact=True) == pytest.approx(1.5998, abs=1e-4)


@pytest.mark.parametrize(
    "args, match",
    [
        ((-0.1, 2, 50), ">= 0"),
        ((float("nan"), 2, 50), "finite"),
        ((0.1, 0, 50), ">= 1"),
        ((0.1, 2, 1), ">= 2"),
        ((0.1, 2.5, 50), "integer"),
    ],
)
def test_extrapolation_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        extrapolate_lower_bound(*args)
