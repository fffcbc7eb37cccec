"""K-class label-DP lower bound (docs/methods/label_dp_multiclass.md): quadrature, the binary
closed form at K = 2, a Monte Carlo of the actual attack, and the single-step upper bound."""

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from audit_callbacks.attacks.label_reconstruction import factorize_layer
from audit_callbacks.estimators.label_dp import label_dp_lower_bound
from audit_callbacks.estimators.label_dp.attack import log_prob_argmin


def _instance(rng, n=24, p=40, k=5, temp=2.0):
    x = rng.normal(size=(n, p))
    logits = rng.normal(size=(n, k)) * temp
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    y = rng.integers(0, k, size=n)
    xn = np.linalg.norm(np.c_[x, np.ones(n)], axis=1)
    layer = np.linalg.norm(probs[:, None, :] - np.eye(k)[None], axis=2) * xn[:, None]  # [N, K]
    flipped = layer * rng.uniform(1.0, 3.0, size=(n, k))  # whole-gradient norms at each label
    return x, probs, y, flipped[np.arange(n), y], flipped


def test_quadrature_matches_scipy_quad_to_1e_8():
    rng = np.random.default_rng(1)
    rows = [rng.normal(0, s, size=k) for s in (0.5, 2.0, 6.0) for k in (1, 3, 9)]
    rows += [np.array([-8.0, -9.0, -7.5]), np.array([25.0, 30.0]), np.full(9, -3.0)]
    for d in rows:
        def logf(z, d=d):
            return stats.norm.logpdf(z) + stats.norm.logcdf(d + z).sum()
        zs = np.linspace(-40, 40, 8001)
        zm = zs[np.argmax(stats.norm.logpdf(zs) + stats.norm.logcdf(d[None, :] + zs[:, None]).sum(1))]
        ref = integrate.quad(lambda z, d=d: np.exp(logf(z)), zm - 12, zm + 12, points=[zm],
                             epsabs=0, epsrel=1e-12, limit=400)[0]
        got = float(np.exp(log_prob_argmin(d[None, :]))[0])
        assert got == pytest.approx(ref, rel=1e-8), d


def test_k2_equals_the_binary_closed_form():
    """Softmax with two logits: the statistics differ by twice the binary statistic, so K = 2 at
    clip norm sqrt(2) C (softmax gradients are sqrt(2) times the sigmoid ones) equals the binary
    bound at C, example by example."""
    rng = np.random.default_rng(2)
    n, p = 20, 40
    x = rng.normal(size=(n, p))
    pb = 1 / (1 + np.exp(-2 * rng.normal(size=n)))
    y = (rng.random(n) < 0.5).astype(int)
    g = np.abs(pb - y) * np.linalg.norm(np.c_[x, np.ones(n)], axis=1) * rng.uniform(1, 3, n)
    k = np.abs((pb - 1 + y) / (pb - y))
    gf = np.where(np.arange(2)[None, :] == y[:, None], g[:, None], (k * g)[:, None])
    for sigma in (0.1, 0.3, 1.0):
        b = label_dp_lower_bound(x, pb, y, g, max_grad_norm=1.0, noise_multiplier=sigma,
                                 expected_batch_size=n, delta=1e-5)
        m = label_dp_lower_bound(x, np.c_[1 - pb, pb], y, np.sqrt(2) * g, flipped_grad_norms=np.sqrt(2) * gf,
                                 max_grad_norm=np.sqrt(2), noise_multiplier=sigma, expected_batch_size=n,
                                 delta=1e-5)
        np.testing.assert_allclose(m.detail.log_p0, b.detail.log_p0, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(m.detail.log_p1, b.detail.log_p1, rtol=1e-8, atol=1e-10)
        assert m.epsilon_lower_bound.value == pytest.approx(b.epsilon_lower_bound.value, rel=1e-8)
        assert m.detail.num_classes == 2 and (m.detail.worst_labels == 1 - y).all()


def test_p0_p1_match_a_monte_carlo_of_the_attack():
    """Simulate DP-SGD's noisy mean last-layer gradient, run the attack (argmin of the solved
    statistic) and count how often it outputs y_r: under D0 (P0) and with row r's label replaced
    by the worst y' with its own clip factor (P1). Within 4 standard errors."""
    rng = np.random.default_rng(3)
    x, probs, y, g, gf = _instance(rng, n=16, p=30, k=4, temp=1.5)
    n, k = probs.shape
    c_max, sigma, n_e = 1.0, 0.3, float(n)
    res = label_dp_lower_bound(x, probs, y, g, flipped_grad_norms=gf, max_grad_norm=c_max,
                               noise_multiplier=sigma, expected_batch_size=n_e, delta=1e-5)
    xt = np.c_[x, np.ones(n)]
    f = factorize_layer(torch.as_tensor(x))
    clip = np.minimum(1.0, c_max / g)
    coef0 = clip[:, None] * (probs - np.eye(k)[y])  # [N, K]
    reps, s = 4000, sigma * c_max / n_e
    gen = torch.Generator().manual_seed(0)

    def hit_rate(coef, r):
        mean = (xt.T @ coef) / n_e  # [d, K] noise-free mean gradient (transposed)
        noise = torch.randn(reps, *mean.shape, generator=gen, dtype=torch.float64) * s
        rhs = (torch.as_tensor(mean)[None] + noise).permute(1, 0, 2).reshape(mean.shape[0], -1)
        a = n * f.solve(rhs).reshape(n, reps, k)  # the attack statistic of every draw
        return float((a[r].argmin(dim=1) == int(y[r])).double().mean())

    checked = 0
    for r in np.argsort(-res.detail.epsilon_lower_bound)[:3].tolist() + [int(np.argmin(res.detail.p0))]:
        p_hat0 = hit_rate(coef0, r)
        coef1 = coef0.copy()
        yp = int(res.detail.worst_labels[r])
        coef1[r] = np.minimum(1.0, c_max / gf[r, yp]) * (probs[r] - np.eye(k)[yp])
        p_hat1 = hit_rate(coef1, r)
        for est, exact in ((p_hat0, res.detail.p0[r]), (p_hat1, res.detail.p1[r])):
            se = max(np.sqrt(exact * (1 - exact) / reps), 1.0 / reps)
            assert abs(est - exact) <= 4 * se, (r, est, exact)
        checked += 0.02 < res.detail.p1[r] < 0.98
    assert checked >= 1  # at least one P1 in the informative range


@pytest.mark.parametrize("sigma", [0.05, 0.5, 1.0, 2.0])
def test_never_above_the_single_step_bound_and_the_b9_order(sigma):
    rng = np.random.default_rng(4)
    for _ in range(3):
        x, probs, y, g, gf = _instance(rng, n=30, p=50, k=10, temp=3.0)
        for flipped in (gf, None):
            res = label_dp_lower_bound(x, probs, y, g, flipped_grad_norms=flipped, max_grad_norm=1.0,
                                       noise_multiplier=sigma, expected_batch_size=30, delta=1e-5)
            order = [res.epsilon_lower_bound.value, res.epsilon_pair_optimal_test.value, res.epsilon_pair_layer.value,
                     res.epsilon_pair_all_params.value, res.epsilon_single_step.value]
            assert all(a <= b * (1 + 1e-9) + 1e-12 for a, b in zip(order, order[1:], strict=False)), order
            assert np.isfinite(res.detail.log_p1).all() and res.detail.epsilon_lower_bound.shape == (30,)
            assert res.detail.p0.shape == res.detail.p1.shape == (30,) and res.detail.worst_labels.shape == (30,)
            assert (res.detail.worst_labels != y).all()


def test_unknown_clip_factors_give_a_smaller_bound():
    """Without flipped_grad_norms P1 is maximised over the clip factor: never a larger bound
    (up to the 41-point grid) than with the true norms."""
    rng = np.random.default_rng(5)
    x, probs, y, g, gf = _instance(rng, n=20, p=40, k=6)
    kw = dict(max_grad_norm=1.0, noise_multiplier=0.1, expected_batch_size=20, delta=1e-5)
    exact = label_dp_lower_bound(x, probs, y, g, flipped_grad_norms=gf, **kw)
    conservative = label_dp_lower_bound(x, probs, y, g, **kw)
    assert conservative.epsilon_lower_bound.value <= exact.epsilon_lower_bound.value * 1.01 + 1e-9
    assert 0 < exact.epsilon_lower_bound.value


@pytest.mark.parametrize("change,match", [
    (dict(labels=np.full(20, 6)), "labels must be integers in 0..5"),
    (dict(labels=np.full(20, 0.5)), "labels must be integers"),
    (dict(probs=np.full((20, 6), 0.2)), "sum to 1"),
    (dict(probs=np.full((19, 6), 1 / 6)), r"probs must have shape \[20, K\]"),
    (dict(flipped_grad_norms=np.ones((20, 5))), r"flipped_grad_norms must have shape \[20, 6\]"),
    (dict(flipped_grad_norms=np.zeros((20, 6))), "flipped_grad_norms must be finite and >="),
    (dict(grad_norms=np.zeros(20)), "grad_norms"),
])
def test_invalid_multiclass_inputs_raise(change, match):
    rng = np.random.default_rng(6)
    x, probs, y, g, gf = _instance(rng, n=20, p=40, k=6)
    args = dict(features=x, probs=probs, labels=y, grad_norms=g, flipped_grad_norms=gf)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        label_dp_lower_bound(**args, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=20,
                             delta=1e-5)


def test_ranked_evaluation_gives_the_batch_bound():
    """max_pairs (what the callback uses, 16) evaluates only the pairs ranked first by the
    closed-form upper bound on LB: never above the exhaustive values (each is a valid bound),
    and equal to the exhaustive batch bound on these instances."""
    rng = np.random.default_rng(7)
    for sigma in (0.05, 0.3, 1.0, 3.0):
        for _ in range(3):
            x, probs, y, g, gf = _instance(rng, n=30, p=50, k=10, temp=3.0)
            kw = dict(flipped_grad_norms=gf, max_grad_norm=1.0, noise_multiplier=sigma, expected_batch_size=30,
                      delta=1e-5)
            full = label_dp_lower_bound(x, probs, y, g, **kw)
            fast = label_dp_lower_bound(x, probs, y, g, max_pairs=16, **kw)
            assert fast.epsilon_lower_bound.value == pytest.approx(full.epsilon_lower_bound.value, rel=1e-12), sigma
            assert (fast.detail.epsilon_lower_bound <= full.detail.epsilon_lower_bound + 1e-12).all()
            np.testing.assert_array_equal(fast.detail.p0, full.detail.p0)
            few = label_dp_lower_bound(x, probs, y, g, max_pairs=16, p0_for_all=False, **kw)
            assert few.epsilon_lower_bound.value == fast.epsilon_lower_bound.value and np.isnan(few.detail.p0).any()
            assert few.expected_attack_accuracy is None and fast.expected_attack_accuracy is not None
            # the norms asked lazily, for the evaluated pairs only (what the callback does)
            asked = []
            lazy = dict(kw, flipped_grad_norms=lambda r, k, asked=asked, gf=gf: asked.append(len(r)) or gf[r, k])
            every = label_dp_lower_bound(x, probs, y, g, **lazy)
            assert every.epsilon_lower_bound.value == full.epsilon_lower_bound.value and asked == [30 * 9]
            asked.clear()
            ranked = label_dp_lower_bound(x, probs, y, g, max_pairs=16, **lazy)
            assert ranked.epsilon_lower_bound.value <= full.epsilon_lower_bound.value + 1e-12 and asked == [64]
            assert ranked.epsilon_lower_bound.value >= 0.9 * full.epsilon_lower_bound.value
        # without flipped norms (P1 maximised over the clip factor): the same ranking
        kw.pop("flipped_grad_norms")
        full = label_dp_lower_bound(x, probs, y, g, **kw)
        fast = label_dp_lower_bound(x, probs, y, g, max_pairs=16, **kw)
        assert fast.epsilon_lower_bound.value <= full.epsilon_lower_bound.value + 1e-12
        assert fast.epsilon_lower_bound.value >= 0.9 * full.epsilon_lower_bound.value, sigma


def test_the_result_has_the_same_shape_for_every_k():
    """One result type for a sigmoid and for K classes: the same AuditResult fields, per-example
    arrays [N] (statistic means [N, L], L the layer's outputs), worst labels for both."""
    rng = np.random.default_rng(8)
    x, probs, y, g, gf = _instance(rng, n=12, p=30, k=4)
    kw = dict(max_grad_norm=1.0, noise_multiplier=0.5, expected_batch_size=12, delta=1e-5)
    multi = label_dp_lower_bound(x, probs, y, g, flipped_grad_norms=gf, **kw)
    pb = 1 / (1 + np.exp(-rng.normal(size=12)))
    yb = (rng.random(12) < 0.5).astype(int)
    gb = np.abs(pb - yb) * np.linalg.norm(np.c_[x, np.ones(12)], axis=1) * 2.0
    binary = label_dp_lower_bound(x, pb, yb, gb, **kw)
    assert list(multi.results()) == list(binary.results())
    for res, k, outputs in ((multi, 4, 4), (binary, 2, 1)):
        d = res.detail
        assert d.num_classes == k and res.epsilon_lower_bound.counts == {"n": 12, "num_classes": k}
        for name in ("p0", "p1", "epsilon_lower_bound", "worst_labels", "mu_pair_layer", "epsilon_pair_layer",
                     "clip_factors", "flipped_clip_factors", "statistic_std"):
            assert getattr(d, name).shape == (12,), name
        assert d.statistic_mean0.shape == d.statistic_mean1.shape == (12, outputs)
    assert (binary.detail.worst_labels == 1 - yb).all()
