"""Empirical eps0 test of Matsumoto et al. (Alg. 2, METHODS C2-C3) and the five crafting adversaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from audit_callbacks.attacks import (
    ADVERSARIES,
    LDPTestResult,
    benign_pair,
    collusion_pair,
    craft_pair,
    dummy_pair,
    gradient_flip_pair,
    label_flip_pair,
    ldp_epsilon_test,
    ldp_sgd_error_rates,
    ldp_sgd_test_epsilon,
    ldp_test_statistics,
    measurable_ceiling,
    paper_measurable_ceiling,
    supports_fast_path,
)
from audit_callbacks.estimators import AuditResult
from audit_callbacks.estimators.shuffle import epsilon_from_counts

# --------------------------------------------------------------------------------------------
# A private reference LDP-SGD (METHODS C1), independent of audit_callbacks.mechanisms
# --------------------------------------------------------------------------------------------


class RefLDPSGD:
    """Straight transcription of METHODS C1 (one row at a time would be too slow: batched)."""

    name = "ldp_sgd"
    per_coordinate = False

    def __init__(self, epsilon0: float, clip_norm: float) -> None:
        self.epsilon0 = float(epsilon0)
        self.clip_norm = float(clip_norm)

    def epsilon_for_dim(self, d: int) -> float:
        return self.epsilon0

    def randomize(self, g: torch.Tensor, generator: torch.Generator | None = None):
        L = self.clip_norm
        norm = g.norm(dim=1, keepdim=True)
        x = g * torch.clamp(L / norm, max=1.0)
        xn = x.norm(dim=1, keepdim=True)
        keep = torch.rand(xn.shape, generator=generator, dtype=g.dtype) < 0.5 + xn / (2 * L)
        z = torch.where(keep, 1.0, -1.0).to(g.dtype) * L * x / xn
        v = torch.randn(g.shape, generator=generator, dtype=g.dtype)
        v = v / v.norm(dim=1, keepdim=True)
        sgn = torch.where((z * v).sum(dim=1, keepdim=True) >= 0, 1.0, -1.0).to(g.dtype)
        p = math.exp(self.epsilon0) / (1 + math.exp(self.epsilon0))
        rr = torch.where(torch.rand(xn.shape, generator=generator, dtype=g.dtype) < p, 1.0, -1.0)
        return rr.to(g.dtype) * sgn * v


def _package_ldpsgd():
    """The package's LDP-SGD randomizer: an import error fails the test (no reference stands in)."""
    from audit_callbacks.mechanisms import LDPSGD

    return LDPSGD


def make_ldpsgd(epsilon0: float, clip_norm: float = 1.0):
    return _package_ldpsgd()(epsilon0, clip_norm)


MECH_KINDS = ["reference", "package"]


def mech_of_kind(kind: str, epsilon0: float, clip_norm: float = 1.0):
    if kind == "reference":
        return RefLDPSGD(epsilon0, clip_norm)
    return _package_ldpsgd()(epsilon0, clip_norm)


class Identity:
    """A 'mechanism' without privacy: the test must be perfect (capped point estimate)."""

    name = "identity"

    def randomize(self, x, generator=None):
        return x.clone()


class GaussianNoise:
    name = "gaussian_stub"

    def __init__(self, sigma: float) -> None:
        self.sigma = sigma

    def randomize(self, x, generator=None):
        return x + self.sigma * torch.randn(x.shape, generator=generator, dtype=x.dtype)


def _sd_eps(eps0: float, trials: int) -> float:
    """Delta-method sd of eq. 3 at FPR = FNR = 1/(1 + e^eps0) with trials/2 per rate."""
    p = 1.0 / (1.0 + math.exp(eps0))
    return math.sqrt(p * (1 - p) / (trials / 2)) / (p * (1 - p))


# --------------------------------------------------------------------------------------------
# Ceiling (METHODS C2; Matsumoto et al. §4.1)
# --------------------------------------------------------------------------------------------


def test_paper_ceiling_numbers():
    # Matsumoto et al. §4.1: "the lower confidence limit of p is 0.99632 ... eps0 5.6"; 10^6 -> 12.5
    assert round(paper_measurable_ceiling(1000), 1) == 5.6
    assert round(paper_measurable_ceiling(10**6), 1) == 12.5
    p_lo = 0.025 ** (1 / 1000)
    assert round(p_lo, 5) == 0.99632
    assert paper_measurable_ceiling(1000) == pytest.approx(math.log(p_lo / (1 - p_lo)), rel=1e-12)


def test_rates_bound_ceiling_numbers():
    # the per-rate bound actually reported (alpha/2 per rate, trials/2 per rate) tops out lower
    assert measurable_ceiling(1000) == pytest.approx(4.9056, abs=1e-4)
    assert measurable_ceiling(10**6) == pytest.approx(11.8170, abs=1e-4)
    assert measurable_ceiling(1) == 0.0
    # it is exactly the lower bound of a perfect game
    ce = epsilon_from_counts(500, 0, 0, 500, 0.05)
    assert ce.epsilon_lower_bound == pytest.approx(measurable_ceiling(1000), rel=1e-12)
    assert ce.ceiling == pytest.approx(measurable_ceiling(1000), rel=1e-12)


def test_perfect_mechanism_is_capped_at_ceiling():
    g1 = torch.tensor([1.0, 0.0, 0.0])
    g2 = torch.tensor([0.0, 1.0, 0.0])
    r = ldp_epsilon_test(Identity(), g1, g2, trials=1000, seed=3)
    assert r.method == "batched"
    assert r.fp == 0 and r.fn == 0 and r.fpr == 0.0 and r.fnr == 0.0
    assert r.epsilon_capped and r.epsilon == r.ceiling
    assert r.epsilon_lower_bound == pytest.approx(r.ceiling)
    assert math.isinf(r.epsilon_upper_bound)
    # the realised split (not exactly 500/500) sets the ceiling
    assert r.ceiling == pytest.approx(
        epsilon_from_counts(r.tp, 0, 0, r.tn).epsilon_lower_bound, rel=1e-12
    )
    est = r.to_estimate()
    assert isinstance(est, AuditResult) and est.upper is None and est.confidence == pytest.approx(0.95)
    assert est.details["paper_ceiling"] == pytest.approx(paper_measurable_ceiling(1000))


# --------------------------------------------------------------------------------------------
# Dummy adversary reaches eps0 (Matsumoto et al. Fig. 4; their workshop version, Table 1)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps0", [0.5, 1.0, 2.0, 4.0])
def test_dummy_reaches_eps0(eps0):
    mech = make_ldpsgd(eps0, 1.0)
    pair = dummy_pair(1000, 1.0)
    trials = 10**6
    r = ldp_epsilon_test(mech, pair.g1, pair.g2, trials=trials, seed=11)
    assert r.method == "fast"
    assert r.expected_epsilon == pytest.approx(eps0, abs=1e-5)  # float32 |g1| ~ L
    assert r.claimed_epsilon == pytest.approx(eps0)
    assert r.epsilon_lower_bound <= eps0 <= r.epsilon_upper_bound
    assert abs(r.epsilon - eps0) < 4 * _sd_eps(eps0, trials)
    # accuracy matches 001 Table 1 (dummy row: 62.2, 73.2, 88.2, 98.2 %)
    acc = (r.tp + r.tn) / trials
    assert acc == pytest.approx({0.5: 0.622, 1.0: 0.732, 2.0: 0.882, 4.0: 0.982}[eps0], abs=2e-3)


def test_fast_path_ignores_dimension_for_counts():
    # the guess is scale-free: same seed, same counts whatever d (C3: S only rescales)
    mech = make_ldpsgd(1.0)
    a = ldp_epsilon_test(mech, *dummy_pair(10, 1.0).as_tuple(), trials=5000, seed=5)
    b = ldp_epsilon_test(mech, *dummy_pair(10**6, 1.0).as_tuple(), trials=5000, seed=5)
    assert a.counts == b.counts


# --------------------------------------------------------------------------------------------
# Coverage by repetition
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps0", [1.0, 2.0])
def test_lower_bound_coverage_dummy(eps0):
    mech = make_ldpsgd(eps0)
    g1, g2 = dummy_pair(100, 1.0).as_tuple()
    reps = 300
    lows, highs = [], []
    for seed in range(reps):
        r = ldp_epsilon_test(mech, g1, g2, trials=2000, seed=1000 + seed)
        lows.append(r.epsilon_lower_bound)
        highs.append(r.epsilon_upper_bound)
    over = int(np.sum(np.asarray(lows) > eps0))
    under = int(np.sum(np.asarray(highs) < eps0))
    slack = int(stats.binom.ppf(0.999, reps, 0.05))  # 5% + binomial slack
    assert over <= slack, (over, reps)
    assert under <= slack, (under, reps)
    # the union bound makes each side conservative: expect well below 5%
    assert over / reps < 0.05 and under / reps < 0.05


def test_lower_bound_coverage_short_gradient_flip():
    # |g| = 0.5 L: the game's own eq.-3 value is below eps0; the bounds must cover it
    eps0 = 2.0
    mech = make_ldpsgd(eps0)
    g1 = torch.full((50,), 0.5 / math.sqrt(50), dtype=torch.float64)
    target = ldp_sgd_test_epsilon(eps0, 1.0, g1, -g1)
    assert target == pytest.approx(2 * math.atanh(math.tanh(eps0 / 2) * 0.5), rel=1e-12)
    reps = 300
    res = [ldp_epsilon_test(mech, g1, -g1, trials=2000, seed=s) for s in range(reps)]
    over = sum(r.epsilon_lower_bound > target for r in res)
    under = sum(r.epsilon_upper_bound < target for r in res)
    slack = int(stats.binom.ppf(0.999, reps, 0.05))
    assert over <= slack and under <= slack, (over, under)


# --------------------------------------------------------------------------------------------
# Fast vs batched: same distribution
# --------------------------------------------------------------------------------------------


def _general_pair(d: int, seed: int, n1: float, n2: float):
    gen = torch.Generator().manual_seed(seed)
    g1 = torch.randn(d, generator=gen, dtype=torch.float64)
    g2 = torch.randn(d, generator=gen, dtype=torch.float64) - 0.5 * g1  # obtuse-ish angle
    return g1 * (n1 / g1.norm()), g2 * (n2 / g2.norm())


PAIRS = {
    "dummy": lambda: dummy_pair(20, 1.0, dtype=torch.float64).as_tuple(),
    "flip_short": lambda: (
        torch.full((20,), 0.1, dtype=torch.float64),
        torch.full((20,), -0.1, dtype=torch.float64),
    ),
    "general": lambda: _general_pair(20, 7, 0.6, 2.5),
}


@pytest.mark.parametrize("kind", MECH_KINDS)
@pytest.mark.parametrize("pair_name", list(PAIRS))
def test_fast_and_batched_agree(kind, pair_name):
    eps0 = 1.5
    mech = mech_of_kind(kind, eps0)
    g1, g2 = PAIRS[pair_name]()
    n = 20_000
    bf, sf = ldp_test_statistics(mech, g1, g2, trials=n, seed=1, path="fast")
    bb, sb = ldp_test_statistics(mech, g1, g2, trials=n, seed=2, path="batched")
    # the released statistic cos(out, g1) - cos(out, g2), per b and pooled
    assert stats.ks_2samp(sf, sb).pvalue > 1e-3
    for b in (1, 2):
        assert stats.ks_2samp(sf[bf == b], sb[bb == b]).pvalue > 1e-3
    # the counts: 2 x 4 contingency table (TN, FP, FN, TP)
    rf = ldp_epsilon_test(mech, g1, g2, trials=n, seed=1, path="fast")
    rb = ldp_epsilon_test(mech, g1, g2, trials=n, seed=2, path="batched")
    table = np.array([[rf.tn, rf.fp, rf.fn, rf.tp], [rb.tn, rb.fp, rb.fn, rb.tp]])
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # both agree with the closed form
    fpr, fnr = ldp_sgd_error_rates(eps0, 1.0, g1, g2)
    for r in (rf, rb):
        for obs, exp, m in ((r.fpr, fpr, r.fp + r.tn), (r.fnr, fnr, r.fn + r.tp)):
            assert abs(obs - exp) < 4.5 * math.sqrt(exp * (1 - exp) / m)


def test_statistics_match_counts_and_are_seeded():
    mech = make_ldpsgd(1.0)
    g1, g2 = _general_pair(30, 3, 1.0, 1.0)
    b, s = ldp_test_statistics(mech, g1, g2, trials=3000, seed=9)
    r = ldp_epsilon_test(mech, g1, g2, trials=3000, seed=9)
    assert r.tn == int(np.sum((b == 1) & (s >= 0))) and r.fn == int(np.sum((b == 2) & (s >= 0)))
    assert np.all(np.abs(s) <= 2 + 1e-12)
    r2 = ldp_epsilon_test(mech, g1, g2, trials=3000, seed=9)
    assert r.counts == r2.counts
    rb1 = ldp_epsilon_test(mech, g1, g2, trials=300, seed=4, path="batched", batch_size=64)
    rb2 = ldp_epsilon_test(mech, g1, g2, trials=300, seed=4, path="batched", batch_size=64)
    assert rb1.counts == rb2.counts


# --------------------------------------------------------------------------------------------
# Gradient flip: reaches eps0 iff |g| >= L (closed form)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0.05, 0.3, 1.0, 3.0])
def test_gradient_flip_against_closed_form(ratio):
    eps0, L, d, n = 4.0, 1.0, 500, 400_000
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(d, generator=gen, dtype=torch.float64)
    g = g * (ratio * L / g.norm())
    mech = make_ldpsgd(eps0, L)
    r = ldp_epsilon_test(mech, g, -g, trials=n, seed=21, alpha=1e-3)
    expected = 2 * math.atanh(math.tanh(eps0 / 2) * min(ratio, 1.0))
    assert r.expected_epsilon == pytest.approx(expected, rel=1e-9)
    fpr, fnr = ldp_sgd_error_rates(eps0, L, g, -g)
    assert fpr == fnr == pytest.approx(0.5 - 0.5 * math.tanh(eps0 / 2) * min(ratio, 1.0))
    assert abs(r.fpr - fpr) < 4.5 * math.sqrt(fpr * (1 - fpr) / (r.fp + r.tn))
    assert r.epsilon_lower_bound <= expected <= r.epsilon_upper_bound + 1e-12
    if ratio >= 1.0:
        assert r.epsilon_lower_bound <= eps0 <= r.epsilon_upper_bound
    else:  # falls short of eps0: z's sign randomisation
        assert r.epsilon_upper_bound < eps0


def test_closed_form_general_angle():
    # phi = pi/2, norms >= L: FPR = FNR = 1/2 - tanh(eps0/2)/4
    g1 = torch.tensor([2.0, 0.0, 0.0, 0.0])
    g2 = torch.tensor([0.0, 3.0, 0.0, 0.0])
    fpr, fnr = ldp_sgd_error_rates(1.0, 1.0, g1, g2)
    assert fpr == pytest.approx(0.5 - math.tanh(0.5) / 4) and fnr == pytest.approx(fpr)
    r = ldp_epsilon_test(make_ldpsgd(1.0), g1, g2, trials=200_000, seed=2)
    assert abs(r.fpr - fpr) < 4.5 * math.sqrt(fpr * (1 - fpr) / (r.fp + r.tn))


# --------------------------------------------------------------------------------------------
# Path selection, other mechanisms, results
# --------------------------------------------------------------------------------------------


def test_path_selection():
    g1, g2 = dummy_pair(10, 1.0).as_tuple()
    assert supports_fast_path(RefLDPSGD(1.0, 1.0))
    assert not supports_fast_path(GaussianNoise(1.0))
    assert ldp_epsilon_test(GaussianNoise(0.5), g1, g2, trials=200).method == "batched"
    assert (
        ldp_epsilon_test(RefLDPSGD(1.0, 1.0), g1, g2, trials=200, path="batched").method
        == "batched"
    )
    cls = _package_ldpsgd()
    assert supports_fast_path(cls(1.0, 1.0))

    class Overridden(cls):
        def randomize(self, x, generator=None):
            return x.clone()

    assert not supports_fast_path(Overridden(1.0, 1.0))
    r = ldp_epsilon_test(Overridden(1.0, 1.0), g1, g2, trials=500)
    assert r.method == "batched" and r.epsilon_capped  # its own (broken) code is tested
    with pytest.raises(ValueError, match="fast"):
        ldp_epsilon_test(GaussianNoise(1.0), g1, g2, trials=10, path="fast")
    with pytest.raises(ValueError, match="path"):
        ldp_epsilon_test(RefLDPSGD(1.0, 1.0), g1, g2, trials=10, path="exact")
    with pytest.raises(TypeError):
        ldp_epsilon_test(object(), g1, g2, trials=10)


def test_gaussian_stub_batched_is_sensible():
    # Gaussian mechanism with sensitivity |g1 - g2| = 2 and sigma = 2: the cosine test is the
    # optimal linear test here, FPR = FNR = Phi(-|g1 - g2| / (2 sigma)) = Phi(-0.5)
    g1, g2 = dummy_pair(8, 1.0, dtype=torch.float64).as_tuple()
    r = ldp_epsilon_test(GaussianNoise(2.0), g1, g2, trials=20_000, seed=0)
    p = stats.norm.cdf(-0.5)
    assert abs(r.fpr - p) < 4.5 * math.sqrt(p * (1 - p) / (r.fp + r.tn))
    assert r.claimed_epsilon is None and r.expected_epsilon is None


def test_result_and_estimate_fields():
    mech = make_ldpsgd(1.0)
    r = ldp_epsilon_test(mech, *dummy_pair(10, 1.0).as_tuple(), trials=4000, seed=0)
    assert isinstance(r, LDPTestResult)
    assert r.trials == 4000 == sum(r.counts.values())
    assert r.fpr == r.fp / (r.fp + r.tn) and r.fnr == r.fn / (r.fn + r.tp)
    assert 0 <= r.epsilon_lower_bound <= r.epsilon <= r.epsilon_upper_bound
    assert r.alpha == 0.05 and r.dim == 10
    est = r.to_estimate()
    assert est.value == r.epsilon and est.lower == r.epsilon_lower_bound
    assert est.upper == r.epsilon_upper_bound and est.confidence == pytest.approx(0.9)
    assert est.details["lower_confidence"] == 0.95 and est.details["threat_model"] == "local"
    assert est.method == "ldp_test_fast" and est.counts["n"] == 4000
    with pytest.raises(AttributeError):
        r.epsilon = 1.0  # frozen


def test_single_trial_is_finite():
    r = ldp_epsilon_test(make_ldpsgd(1.0), *dummy_pair(5, 1.0).as_tuple(), trials=1)
    assert r.epsilon == 0.0 and r.epsilon_lower_bound == 0.0 and (r.fpr is None or r.fnr is None)
    assert r.ceiling == 0.0
    r.to_estimate()


@pytest.mark.parametrize(
    "g1, g2, trials, kwargs, match",
    [
        ([1.0, 0.0], [-1.0, 0.0], 0, {}, "trials"),
        ([1.0, 0.0], [-1.0, 0.0], 2.5, {}, "trials"),
        ([1.0, 0.0], [-1.0, 0.0], 10, {"alpha": 0.0}, "alpha"),
        ([1.0, 2.0], [1.0, 2.0], 10, {}, "identical"),
        ([1.0, 2.0], [2.0, 4.0], 10, {}, "same direction"),
        ([1.0, 0.0], [-1.0, 0.0, 0.0], 10, {}, "shape"),
        ([1.0, float("nan")], [-1.0, 0.0], 10, {}, "NaN"),
        ([1.0, 0.0], [float("inf"), 0.0], 10, {}, "NaN"),
        ([0.0, 0.0], [-1.0, 0.0], 10, {}, "non-zero"),
        ([], [], 10, {}, "empty"),
        ([1.0, 0.0], [-1.0, 0.0], 10, {"batch_size": 0, "path": "batched"}, "batch_size"),
    ],
)
def test_bad_inputs(g1, g2, trials, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ldp_epsilon_test(
            RefLDPSGD(1.0, 1.0), torch.tensor(g1), torch.tensor(g2), trials=trials, **kwargs
        )


def test_numpy_inputs_and_mechanism_shape_check():
    r = ldp_epsilon_test(RefLDPSGD(1.0, 1.0), np.ones(4), -np.ones(4), trials=100)
    assert r.dim == 4

    class Bad:
        name = "bad"

        def randomize(self, x, generator=None):
            return x[:, :1]

    with pytest.raises(ValueError, match="shape"):
        ldp_epsilon_test(Bad(), np.ones(4), -np.ones(4), trials=10)

    class Nan:
        name = "nan"

        def randomize(self, x, generator=None):
            return x * float("nan")

    with pytest.raises(ValueError, match="NaN"):
        ldp_epsilon_test(Nan(), np.ones(4), -np.ones(4), trials=10)


# --------------------------------------------------------------------------------------------
# Adversaries (Matsumoto et al. Table 2)
# --------------------------------------------------------------------------------------------


def _toy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x = torch.randn(60, 6)
    y = torch.arange(60) % 3
    loss = torch.nn.functional.cross_entropy
    n_params = sum(p.numel() for p in model.parameters())
    return model, loss, x, y, n_params


def test_adversaries_shapes_and_norms():
    model, loss, x, y, P = _toy()
    before = [p.detach().clone() for p in model.parameters()]
    pairs = {
        "benign": benign_pair(model, loss, x, y, rng=0),
        "label_flip": label_flip_pair(model, loss, x, y, num_classes=3, rng=0),
        "gradient_flip": gradient_flip_pair(model, loss, x, y, rng=0),
        "collusion": collusion_pair(model, loss, x, y, target_label=0, steps=50, lr=0.5, rng=0),
        "dummy": dummy_pair(P, 1.0),
    }
    for name, pair in pairs.items():
        assert pair.name == name
        assert pair.g1.shape == pair.g2.shape == (P,)
        assert pair.norm_g1 == pytest.approx(float(pair.g1.double().norm()))
        assert pair.norm_g2 == pytest.approx(float(pair.g2.double().norm()))
        assert -1 - 1e-9 <= pair.cosine <= 1 + 1e-9
    for name in ("gradient_flip", "collusion", "dummy"):
        assert torch.equal(pairs[name].g2, -pairs[name].g1)
        assert pairs[name].cosine == pytest.approx(-1.0)
    assert pairs["dummy"].norm_g1 == pytest.approx(1.0, rel=1e-6)
    lf = pairs["label_flip"].details
    assert lf["label1"] != lf["label2"] and lf["label1"] == int(y[lf["index"]])
    assert pairs["benign"].details["index1"] != pairs["benign"].details["index2"]
    col = pairs["collusion"].details
    assert col["label"] != 0 and col["train_loss_end"] < col["train_loss_start"]
    # the server's single-label model makes the client's gradient large (Matsumoto et al. §4.4)
    assert pairs["collusion"].norm_g1 > pairs["gradient_flip"].norm_g1
    # the model is untouched
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_adversary_gradients_are_exact():
    model, loss, x, y, _ = _toy()
    pair = gradient_flip_pair(model, loss, x, y, rng=1)
    i = pair.details["index"]
    model.zero_grad()
    loss(model(x[i : i + 1]), y[i : i + 1]).backward()
    ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(pair.g1, ref)


def test_craft_pair_and_registry():
    assert set(ADVERSARIES) == {"benign", "label_flip", "gradient_flip", "collusion", "dummy"}
    pair = craft_pair("dummy", 16, 2.0)
    assert pair.norm_g1 == pytest.approx(2.0, rel=1e-6)
    model, loss, x, y, _ = _toy()
    assert craft_pair("benign", model, loss, x, y, rng=3).name == "benign"
    with pytest.raises(ValueError, match="unknown adversary"):
        craft_pair("nope")
    with pytest.raises(ValueError):
        dummy_pair(0, 1.0)
    with pytest.raises(ValueError):
        collusion_pair(model, loss, x, y, target_label=7)
    with pytest.raises(ValueError):
        benign_pair(model, loss, x[:1], y[:1])


def test_adversaries_end_to_end_ordering():
    # against LDP-SGD at eps0 = 4 the flipped pairs beat the benign one (Matsumoto et al. Fig. 4);
    # each test is compared with its closed form
    model, loss, x, y, _ = _toy()
    eps0 = 4.0
    mech = make_ldpsgd(eps0, 1.0)
    out = {}
    for name, pair in {
        "benign": benign_pair(model, loss, x, y, rng=0),
        "gradient_flip": gradient_flip_pair(model, loss, x, y, rng=0),
        "dummy": dummy_pair(100, 1.0),
    }.items():
        r = ldp_epsilon_test(mech, pair.g1, pair.g2, trials=100_000, seed=0, alpha=1e-3)
        assert r.epsilon_lower_bound <= r.expected_epsilon <= r.epsilon_upper_bound
        out[name] = r.expected_epsilon
    assert out["benign"] < out["gradient_flip"] <= out["dummy"] == pytest.approx(eps0)
