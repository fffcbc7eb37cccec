"""Label reconstruction from aggregated gradients (paper 004 Alg. 1, 3, 4, 5; METHODS B2-B6).

Real data (sklearn's breast cancer, binary; digits, 10 classes) through the repo's MLP, the
gradients from autograd or from Opacus' DPOptimizer (per-example clipping over all parameters,
noise multiplier 0), at random init and after a few training steps. Noise-free, every label of
a batch no larger than the attacked layer must come back exactly.
"""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from audit_callbacks.attacks import label_reconstruction as lr_mod
from audit_callbacks.attacks.label_reconstruction import (
    SignAmbiguousLabels,
    craft_malicious_features,
    factorize_layer,
    label_attack_statistic,
    reconstruct_labels,
    reconstruct_labels_malicious_input_layer,
    reconstruct_labels_second_last_layer,
)
from datamodules import load_breast_cancer_tensors, load_digits_tensors
from models import MLP


def _data(name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    if name == "breast_cancer":
        x, y = load_breast_cancer_tensors(standardize=True)
        return x, y, 1  # one sigmoid logit
    x, y = load_digits_tensors(flatten=True)
    return x, y, 10


def _loss(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.float(), reduction=reduction)
    return F.cross_entropy(logits, y, reduction=reduction)


def _model(
    name: str, seed: int, train_steps: int, hidden=(48, 32)
) -> tuple[MLP, torch.Tensor, torch.Tensor]:
    x, y, k = _data(name)
    torch.manual_seed(seed)
    model = MLP(x.shape[1], k, hidden=hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(train_steps):
        opt.zero_grad()
        _loss(model(x), y).backward()
        opt.step()
    return model, x, y


def _batches(n_total: int, batch: int, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n_total, generator=g)[:batch] for _ in range(count)]


# --------------------------------------------------------------------------------------------
# Last hidden layer, noise-free (Alg. 1 / 3, B4)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["breast_cancer", "digits"])
@pytest.mark.parametrize("train_steps", [0, 10])
def test_noise_free_reconstruction_is_exact(name, train_steps):
    model, x, y = _model(name, seed=1, train_steps=train_steps, hidden=(64, 48))
    last = model.net[-1]
    n = 32  # <= 48 units: at init ~10 of them are zero for a whole batch (dead ReLUs)
    for idx in _batches(len(y), n, 4, seed=train_steps):
        model.zero_grad()
        _loss(model(x[idx]), y[idx]).backward()
        with torch.no_grad():
            feats = model.net[:-1](x[idx])
        labels = reconstruct_labels(feats, last.weight.grad, last.bias.grad)
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert torch.equal(labels, y[idx])


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("name", ["breast_cancer", "digits"])
def test_noise_free_reconstruction_through_opacus_clipping(name):
    """Opacus DPOptimizer, noise 0: clipped per-example gradients summed / expected batch size."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model, x, y = _model(name, seed=2, train_steps=5)
    gsm = GradSampleModule(model)
    last = model.net[-1]
    n = 24
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=0.05,
        expected_batch_size=40,  # != n, as Poisson
    )
    for idx in _batches(len(y), n, 3, seed=5):
        opt.zero_grad()
        _loss(gsm(x[idx]), y[idx]).backward()
        norms = torch.sqrt(
            sum(p.grad_sample.reshape(n, -1).pow(2).sum(1) for p in gsm.parameters())
        )
        assert (norms > 0.05).all()  # every example is clipped, by different factors
        unclipped_w = last.weight.grad.clone()
        opt.pre_step()  # clip, add (zero) noise, divide by the expected batch size
        assert not torch.allclose(
            last.weight.grad, unclipped_w * last.weight.grad.norm() / unclipped_w.norm()
        )
        with torch.no_grad():
            feats = model.net[:-1](x[idx])
        assert torch.equal(reconstruct_labels(feats, last.weight.grad, last.bias.grad), y[idx])


def test_statistic_is_p_minus_y_and_softmax_minus_onehot():
    for name in ("breast_cancer", "digits"):
        model, x, y = _model(name, seed=3, train_steps=0)
        model = model.double()
        idx = _batches(len(y), 20, 1, seed=3)[0]
        xb = x[idx].double()
        model.zero_grad()
        logits = model(xb)
        _loss(logits, y[idx]).backward()
        with torch.no_grad():
            feats = model.net[:-1](xb)
            if name == "breast_cancer":
                expected = torch.sigmoid(logits[:, 0]) - y[idx].double()
            else:
                expected = torch.softmax(logits, 1) - F.one_hot(y[idx], 10).double()
        last = model.net[-1]
        a_hat, diag = label_attack_statistic(feats, last.weight.grad, last.bias.grad)
        assert a_hat.shape == expected.shape
        torch.testing.assert_close(a_hat, expected, rtol=1e-8, atol=1e-10)
        xt = torch.cat([feats, torch.ones(20, 1, dtype=torch.float64)], 1).numpy()
        np.testing.assert_allclose(diag.numpy(), np.diag(np.linalg.inv(xt @ xt.T)), rtol=1e-8)


def test_scale_invariance_and_the_weight_delta_sign():
    """Sum or mean give the same labels; an SGD weight delta must be negated (-lr G)."""
    model, x, y = _model("breast_cancer", seed=4, train_steps=3)
    last = model.net[-1]
    idx = _batches(len(y), 30, 1, seed=4)[0]
    with torch.no_grad():
        feats = model.net[:-1](x[idx])
    before_w, before_b = last.weight.detach().clone(), last.bias.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    _loss(model(x[idx]), y[idx], reduction="sum").backward()
    assert torch.equal(reconstruct_labels(feats, last.weight.grad, last.bias.grad), y[idx])
    opt.step()
    dw, db = last.weight.detach() - before_w, last.bias.detach() - before_b
    assert torch.equal(reconstruct_labels(feats, -dw, -db), y[idx])
    assert torch.equal(reconstruct_labels(feats, dw, db), 1 - y[idx])  # the documented pitfall


def test_one_factorization_serves_the_attack_the_statistic_and_the_gram_diagonal():
    """factorize_layer once, reuse it: identical labels and statistic, the diagonal equals the
    numpy estimator's (what LabelDPLowerBound consumes), and a factorisation of other features
    is refused."""
    from audit_callbacks.estimators.label_dp import last_layer_gram_inverse_diag

    for name in ("breast_cancer", "digits"):
        model, x, y = _model(name, seed=5, train_steps=0)
        idx = _batches(len(y), 24, 1, seed=5)[0]
        model.zero_grad()
        _loss(model(x[idx]), y[idx]).backward()
        with torch.no_grad():
            feats = model.net[:-1](x[idx])
        last = model.net[-1]
        f = factorize_layer(feats, bias=True)
        assert (f.n, f.d, f.has_bias) == (24, feats.shape[1] + 1, True)
        a_ref, d_ref = label_attack_statistic(feats, last.weight.grad, last.bias.grad)
        a_f, d_f = label_attack_statistic(feats, last.weight.grad, last.bias.grad, factorization=f)
        assert torch.equal(a_ref, a_f) and torch.equal(d_ref, d_f)
        assert torch.equal(reconstruct_labels(feats, last.weight.grad, last.bias.grad, factorization=f), y[idx])
        np.testing.assert_allclose(f.gram_inv_diag.numpy(), last_layer_gram_inverse_diag(feats.numpy()), rtol=1e-9)
        with pytest.raises(ValueError, match="factorise these features"):
            reconstruct_labels(feats[:20], last.weight.grad, last.bias.grad, factorization=f)
        with pytest.raises(ValueError, match="bias=True"):
            reconstruct_labels(feats, last.weight.grad, factorization=f)
    with pytest.raises(ValueError, match="at most 3 examples"):
        factorize_layer(torch.eye(4)[:, :2])
    with pytest.raises(ValueError, match="rank deficient"):
        factorize_layer(torch.tensor([[1.0, 2.0, 0.0], [1.0, 2.0, 0.0]]))


# --------------------------------------------------------------------------------------------
# Rank errors
# --------------------------------------------------------------------------------------------


def test_rank_error_when_batch_exceeds_layer_width():
    model, x, y = _model("breast_cancer", seed=0, train_steps=0, hidden=(16, 8))
    last = model.net[-1]
    idx = torch.arange(10)  # 10 > 8 + 1
    model.zero_grad()
    _loss(model(x[idx]), y[idx]).backward()
    with torch.no_grad():
        feats = model.net[:-1](x[idx])
    with pytest.raises(ValueError, match=r"N = 10 .* d = 9 .*smaller batch|wider layer") as err:
        reconstruct_labels(feats, last.weight.grad, last.bias.grad)
    assert "at most 9 examples" in str(err.value) and "wider layer" in str(err.value)
    with pytest.raises(ValueError, match="at most 8 examples"):  # no bias: one column fewer
        reconstruct_labels(feats[:9], last.weight.grad)


def test_rank_error_from_dead_relu_units_on_real_data():
    """Digits, last hidden layer of 32 ReLUs: only ~21 are non-zero on a batch, so 33 fail."""
    model, x, y = _model("digits", seed=1, train_steps=0, hidden=(48, 32))
    last = model.net[-1]
    idx = _batches(len(y), 33, 1, seed=0)[0]
    model.zero_grad()
    _loss(model(x[idx]), y[idx]).backward()
    with torch.no_grad():
        feats = model.net[:-1](x[idx])
    assert int((feats.abs().sum(0) > 0).sum()) < 32
    with pytest.raises(ValueError, match="zero for the whole batch.*wider layer"):
        reconstruct_labels(feats, last.weight.grad, last.bias.grad)


def test_rank_error_for_a_rank_deficient_gram_matrix():
    feats = torch.tensor([[1.0, 2.0, 0.0], [1.0, 2.0, 0.0], [0.0, 1.0, 1.0]])  # duplicate rows
    with pytest.raises(ValueError, match="rank deficient.*smaller batch or a wider layer"):
        reconstruct_labels(feats, torch.ones(1, 3), torch.ones(1))
    nearly = feats.clone()
    nearly[1, 0] += 1e-9  # below float32 resolution relative to the rows
    with pytest.raises(ValueError, match="rank deficient"):
        reconstruct_labels(nearly, torch.ones(1, 3))


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.ones(3), torch.ones(1, 3)), "2-D"),
        ((torch.eye(3), torch.ones(1, 4)), r"shape \[K, 3\]"),
        ((torch.eye(3), torch.ones(2, 3), torch.ones(3)), r"bias_grad must have shape \[2\]"),
        ((torch.tensor([[float("nan"), 1.0, 0.0]]), torch.ones(1, 3)), "NaN"),
        ((torch.eye(3), torch.tensor([[1.0, float("inf"), 0.0]])), "NaN or inf"),
    ],
)
def test_bad_inputs_raise(args, match):
    with pytest.raises(ValueError, match=match):
        label_attack_statistic(*args)


# --------------------------------------------------------------------------------------------
# Second-last layer (Alg. 4, B5)
# --------------------------------------------------------------------------------------------


def _second_last_setup(activation: type[nn.Module], seed: int = 6):
    """Breast cancer batch with 20 negatives and 10 positives (positive rate 1/3 < 0.5)."""
    x, y = load_breast_cancer_tensors()
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(30, 40), activation(), nn.Linear(40, 12), activation(), nn.Linear(12, 1)
    )
    g = torch.Generator().manual_seed(seed)
    neg = torch.nonzero(y == 0)[:, 0]
    pos = torch.nonzero(y == 1)[:, 0]
    idx = torch.cat(
        [
            neg[torch.randperm(len(neg), generator=g)[:20]],
            pos[torch.randperm(len(pos), generator=g)[:10]],
        ]
    )
    xb, yb = x[idx], y[idx]
    model.zero_grad()
    _loss(model(xb), yb).backward()
    with torch.no_grad():
        inputs = model[1](model[0](xb))  # x^{L-1} [30, 40]
        pre = model[2](inputs)  # Z^L [30, 12]
    return model, inputs, pre, yb


def test_second_last_layer_relu_determined_exact_and_undetermined_reported():
    """Every unit J: determined examples 100% correct with the sign of W_J^L known; with the
    prior, 100% whenever the prior holds on the determined examples, and exactly the complement
    when it does not (a unit that is on only for positives: the prior cannot be checked)."""
    model, inputs, pre, y = _second_last_setup(nn.ReLU)
    layer = model[2]
    undetermined_total = prior_held = 0
    for j in range(layer.out_features):
        kw = dict(pre_activations=pre[:, j], unit_bias_grad=layer.bias.grad[j])
        sign = 1 if model[4].weight[0, j] > 0 else -1
        known = reconstruct_labels_second_last_layer(
            inputs, layer.weight.grad[j], output_weight_sign=sign, **kw
        )
        assert isinstance(known, SignAmbiguousLabels) and known.sign_source == "given"
        assert torch.equal(known.undetermined, pre[:, j] <= 0)
        det = ~known.undetermined
        assert torch.equal(known.labels[det], y[det]), j  # 100% of the determined examples
        assert torch.all(known.labels[known.undetermined] == -1)
        assert torch.all(known.statistic[known.undetermined] == 0)
        assert known.num_determined == int(det.sum())
        undetermined_total += int(known.undetermined.sum())

        out = reconstruct_labels_second_last_layer(inputs, layer.weight.grad[j], **kw)
        assert out.sign_source == "prior"
        rate = float(y[det].float().mean()) if det.any() else 0.5
        if rate < 0.5:
            prior_held += 1
            assert torch.equal(out.labels, known.labels), j
            assert out.complemented == (sign < 0) and not out.sign_ambiguous
            wrong = reconstruct_labels_second_last_layer(
                inputs, layer.weight.grad[j], positive_rate_below_half=False, **kw
            )
            assert torch.equal(wrong.labels[det], 1 - y[det])  # the prior stated the wrong way
        elif rate > 0.5:
            assert torch.equal(out.labels[det], 1 - y[det]), j
        else:  # rate exactly 1/2 among the determined, or none determined: reported ambiguous
            assert out.sign_ambiguous and torch.all(out.labels[det] == (out.statistic[det] < 0))
    assert undetermined_total > 0  # ReLU units that are off for some examples exist
    assert prior_held >= layer.out_features // 2


def test_second_last_layer_smooth_activation_and_explicit_derivative():
    model, inputs, pre, y = _second_last_setup(nn.Tanh)
    layer = model[2]
    for j in (0, 5):
        out = reconstruct_labels_second_last_layer(
            inputs, layer.weight.grad[j], pre_activations=pre[:, j], activation="tanh"
        )
        assert not out.undetermined.any() and torch.equal(out.labels, y)
        u = 1 - torch.tanh(pre[:, j]) ** 2
        same = reconstruct_labels_second_last_layer(
            inputs, layer.weight.grad[j], activation_derivative=u
        )
        assert torch.equal(same.labels, y)
    with pytest.raises(ValueError, match="exactly one"):
        reconstruct_labels_second_last_layer(inputs, layer.weight.grad[0])
    with pytest.raises(ValueError, match="activation must be"):
        reconstruct_labels_second_last_layer(
            inputs, layer.weight.grad[0], pre_activations=pre[:, 0], activation="gelu"
        )


def test_second_last_layer_rank_error():
    model, inputs, pre, y = _second_last_setup(nn.Tanh)
    with pytest.raises(ValueError, match="wider layer"):
        reconstruct_labels_second_last_layer(
            inputs[:, :20],
            model[2].weight.grad[0, :20],
            pre_activations=pre[:, 0],
            activation="tanh",
        )


# --------------------------------------------------------------------------------------------
# Malicious input layer (Alg. 5, B6)
# --------------------------------------------------------------------------------------------


def test_malicious_input_layer_worked_example_in_the_docstring():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(lr_mod.reconstruct_labels_malicious_input_layer, globs=vars(lr_mod).copy())
    assert tests and tests[0].examples
    for t in tests:
        runner.run(t)
    assert runner.failures == 0 and runner.tries >= 8


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_malicious_input_layer_is_exact(dtype):
    torch.manual_seed(11)
    p1, p2, n = 40, 5, 35  # N = p1 - p2, the largest batch Alg. 5 allows
    model = nn.Sequential(
        nn.Linear(p1, p2), nn.Tanh(), nn.Linear(p2, 8), nn.Tanh(), nn.Linear(8, 1)
    )
    model = model.to(dtype)
    feats = craft_malicious_features(model[0].weight, n, generator=torch.Generator().manual_seed(3))
    assert feats.shape == (n, p1) and torch.linalg.matrix_rank(feats) == n
    x = feats.to(dtype)
    hidden = model[0](x)
    torch.testing.assert_close(hidden, hidden[:1].expand_as(hidden), rtol=0, atol=1e-4)
    y = torch.zeros(n)
    y[torch.randperm(n, generator=torch.Generator().manual_seed(4))[:12]] = 1.0  # rate 12/35
    model.zero_grad()
    _loss(model(x), y.long()).backward()
    for j in range(p2):
        out = reconstruct_labels_malicious_input_layer(x, model[0].weight.grad[j])
        assert torch.equal(out.labels, y.long()), j
        assert out.num_determined == n
        with_bias = reconstruct_labels_malicious_input_layer(
            x, model[0].weight.grad[j], unit_bias_grad=model[0].bias.grad[j]
        )
        assert torch.equal(with_bias.labels, y.long())


def test_malicious_batch_limit_and_zero_gradient():
    w = torch.randn(5, 12, generator=torch.Generator().manual_seed(0))
    assert craft_malicious_features(w, 7).shape == (7, 12)
    with pytest.raises(ValueError, match=r"N = 8 exceeds .* 12 - 5 = 7"):
        craft_malicious_features(w, 8)
    with pytest.raises(ValueError, match="not in the range"):
        craft_malicious_features(torch.cat([w[:1], w[:1]]), 2, target=torch.tensor([1.0, 2.0]))
    out = reconstruct_labels_malicious_input_layer(torch.eye(3), torch.zeros(3))
    assert out.undetermined.all() and torch.all(out.labels == -1) and out.sign_ambiguous


def test_ill_conditioned_float64_features_use_the_q_solve():
    """Float64 features that pass the rank test with kappa ~ 1e9: the factorisation keeps Q and
    the statistic stays exact (the semi-normal equations alone would lose ~kappa^2 * 1e-16)."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(6, 12))
    base[5] = base[4] + 1e-9 * rng.normal(size=12)  # nearly a duplicate row
    feats = torch.tensor(base)
    f = factorize_layer(feats, bias=False)
    assert f.q is not None
    a = torch.tensor([0.3, -0.6, 0.2, -0.1, 0.45, -0.7], dtype=torch.float64)
    g = (a[:, None] * feats).mean(0, keepdim=True)
    a_hat, _ = label_attack_statistic(feats, g, factorization=f)
    torch.testing.assert_close(a_hat, a, rtol=1e-5, atol=1e-6)
    assert factorize_layer(torch.tensor(rng.normal(size=(6, 12)))).q is None  # well conditioned: R only


def test_finite_check_survives_an_overflowing_sum():
    """The NaN/inf check sums first; huge finite values whose sum overflows still pass, and
    one NaN or inf anywhere is still caught."""
    big = torch.full((3, 4), 1e308, dtype=torch.float64)
    assert not math.isfinite(float(big.sum()))
    lr_mod._check_finite(big, "x")  # no error
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.ones(3, 4)
        t[2, 1] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            lr_mod._check_finite(t, "x")
