"""Tests for audit_callbacks.mechanisms: local-DP client randomizers and the exact audit."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from scipy import stats

from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.mechanisms import (
    GRR,
    LDPSGD,
    BrokenStaircase,
    GaussianRandomizer,
    LocalRandomizer,
    Staircase,
    TwoPoint,
    exact_epsilon,
    exact_epsilon_witness,
    reference_group_sizes,
    sphere_sign_constant,
    staircase_alphas,
    staircase_group_sizes,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_mean(samples: torch.Tensor, target: torch.Tensor, z: float = 5.0) -> None:
    """Column means of ``samples [N, d]`` within z Monte Carlo standard errors of ``target``."""
    samples = samples.to(torch.float64)
    mean = samples.mean(dim=0)
    se = samples.std(dim=0) / math.sqrt(samples.shape[0])
    zscore = (mean - target.to(torch.float64)).abs() / se.clamp(min=1e-300)
    assert float(zscore.max()) < z, (mean, target, se)


def _assert_frequencies(mech, x_value: float, n: int, seed: int) -> None:
    """Chi-square test: outputs of randomize() at one input against output_distribution()."""
    values, probs = mech.output_distribution(torch.tensor([x_value], dtype=torch.float64))
    x = torch.full((n, 1), x_value, dtype=torch.float64)
    y = mech.randomize(x, generator=_gen(seed)).reshape(-1)
    idx = torch.searchsorted(values, y).clamp(max=values.numel() - 1)
    assert torch.equal(values[idx], y), "randomize() produced a value outside output_distribution()"
    counts = torch.bincount(idx, minlength=values.numel()).to(torch.float64)
    expected = probs[0] * n
    support = expected > 0
    assert float(counts[~support].sum()) == 0.0
    _, pvalue = stats.chisquare(counts[support].numpy(), expected[support].numpy())
    assert pvalue > 1e-4, pvalue


# ----------------------------------------------------------------------------------- LDP-SGD
@pytest.mark.parametrize(
    ("d", "expected"), [(1, 1.0), (2, 2 / math.pi), (3, 0.5), (4, 4 / (3 * math.pi))]
)
def test_sphere_sign_constant_closed_forms(d, expected):
    assert sphere_sign_constant(d) == pytest.approx(expected, rel=1e-12)


def test_sphere_sign_constant_large_d():
    d = 10**6
    assert sphere_sign_constant(d) == pytest.approx(math.sqrt(2 / (math.pi * d)), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldpsgd_outputs_unit_vectors(dtype):
    mech = LDPSGD(1.0, clip_norm=0.7)
    x = torch.randn(256, 9, generator=_gen(0), dtype=dtype) * 3
    x[0] = 0.0
    y = mech.randomize(x, generator=_gen(1))
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.allclose(
        torch.linalg.vector_norm(y, dim=1), torch.ones(256, dtype=dtype), atol=1e-6
    )
    assert mech.per_coordinate is False and mech.epsilon_per_coordinate is None
    assert mech.epsilon_for_dim(1) == mech.epsilon_for_dim(10**6) == mech.epsilon0 == 1.0


def test_ldpsgd_reproducible_with_generator():
    mech = LDPSGD(2.0, 1.0)
    x = torch.randn(32, 5, generator=_gen(0))
    assert torch.equal(mech.randomize(x, _gen(7)), mech.randomize(x, _gen(7)))


@pytest.mark.parametrize("d", [5, 50])
def test_ldpsgd_debias_is_unbiased(d):
    clip = 1.5
    mech = LDPSGD(2.0, clip_norm=clip)
    g = torch.randn(3, d, generator=_gen(d), dtype=torch.float64)
    g[0] *= 0.6 * clip / torch.linalg.vector_norm(g[0])  # inside the ball
    g[1] *= 4.0 * clip / torch.linalg.vector_norm(g[1])  # clipped
    g[2] = 0.0
    target = mech.project(g)
    assert torch.linalg.vector_norm(target[1]) == pytest.approx(clip)
    n = 40_000
    for row in range(3):
        x = target[row].expand(n, d)
        est = mech.debias(mech.randomize(x, generator=_gen(100 + row)))
        _assert_mean(est, target[row])
        assert torch.allclose(mech.aggregate(est[:10] / mech.debias_scale(d)), est[:10].mean(0))


@pytest.mark.parametrize("norm_fraction", [1.0, 0.3])
def test_ldpsgd_side_probability(norm_fraction):
    """P(<output, x> > 0) = a p + (1 - a)(1 - p), a = 1/2 + ||x||/(2L), p = e^eps/(1 + e^eps)."""
    eps, clip, d, n = 1.5, 2.0, 6, 40_000
    mech = LDPSGD(eps, clip)
    x = torch.zeros(n, d, dtype=torch.float64)
    x[:, 0] = norm_fraction * clip
    y = mech.randomize(x, generator=_gen(3))
    a = 0.5 + norm_fraction / 2
    p = math.exp(eps) / (1 + math.exp(eps))
    expected = a * p + (1 - a) * (1 - p)
    observed = float((y[:, 0] > 0).double().mean())
    assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / n)


# --------------------------------------------------------------------------------- two-point
def test_two_point_output_values_exact():
    eps, c, r = 1.0, 0.2, 0.5
    mech = TwoPoint(eps, center=c, radius=r)
    big = r * (math.exp(eps) + 1) / (math.exp(eps) - 1)
    y = mech.randomize(torch.linspace(-2, 2, 400, dtype=torch.float64).reshape(40, 10), _gen(0))
    assert set(y.unique().tolist()) <= {mech.outputs[0], mech.outputs[1]}
    assert mech.outputs[0] == pytest.approx(c - big, rel=1e-14)
    assert mech.outputs[1] == pytest.approx(c + big, rel=1e-14)


def test_two_point_distribution_matches_eq1():
    eps, c, r = 0.8, -0.1, 0.3
    mech = TwoPoint(eps, c, r)
    w = torch.tensor([c - r, c - r / 2, c, c + 0.25 * r, c + r, c + 7 * r], dtype=torch.float64)
    _, probs = mech.output_distribution(w)
    wc = w.clamp(c - r, c + r)
    e = math.exp(eps)
    p_high = ((wc - c) * (e - 1) + r * (e + 1)) / (2 * r * (e + 1))
    assert torch.allclose(probs[:, 1], p_high, atol=1e-15)
    assert torch.allclose(probs.sum(1), torch.ones(6, dtype=torch.float64), atol=1e-15)


@pytest.mark.parametrize("w", [-1.0, -0.4, 0.0, 0.9, 3.0])
def test_two_point_unbiased(w):
    mech = TwoPoint(1.0, center=0.0, radius=1.0)
    n = 100_000
    y = mech.randomize(torch.full((n, 2), w, dtype=torch.float64), _gen(11))
    _assert_mean(mech.debias(y), torch.full((2,), max(-1.0, min(1.0, w)), dtype=torch.float64))


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0, 8.0])
def test_two_point_exact_epsilon(eps):
    mech = TwoPoint(eps, center=0.3, radius=2.0)
    assert exact_epsilon(mech) == pytest.approx(eps, abs=1e-9)
    assert exact_epsilon(mech, torch.linspace(-5, 5, 101)) == pytest.approx(eps, abs=1e-9)


def test_two_point_frequencies():
    mech = TwoPoint(1.2, 0.0, 1.0)
    for k, w in enumerate([-1.0, 0.35]):
        _assert_frequencies(mech, w, 20_000, seed=20 + k)


# --------------------------------------------------------------------------------- staircase
STAIRCASE_CASES = [
    # epsilon, center, radius, precision, groups, delta_d
    (0.5, 0.0, 1.0, 1, 2, None),
    (1.0, 0.0, 1.0, 1, 4, None),
    (1.0, 0.0, 1.0, 1, 4, 2),
    (2.0, 0.0, 1.0, 1, 3, 0),
    (2.0, 0.5, 0.3, 1, 3, 1.0),
    (3.0, 0.0, 1.0, 2, 10, 3),
    (5.0, 0.0, 1.0, 2, 4, None),
    (1.0, 0.0, 0.075, 3, 5, 5),  # c = 0, r = 0.075 as in 002 Fig. 2 (p, m, delta_d ours)
]


def test_staircase_group_sizes():
    assert staircase_group_sizes(21, 3, 2) == (5, 7, 9)  # integral progression is kept
    for d, m, delta in [(21, 4, 1), (151, 5, 5), (2001, 10, 13), (31, 7, 0.5), (11, 2, 0)]:
        sizes = staircase_group_sizes(d, m, delta)
        assert sum(sizes) == d and min(sizes) >= 1
        g1 = d / m - (m - 1) * delta / 2
        for j, n in enumerate(sizes):
            assert abs(n - (g1 + j * delta)) < 1
    with pytest.raises(ValueError, match="G_1"):
        staircase_group_sizes(21, 4, 3.5)  # eq. 5 maximum 2 * 21 / 12 = 3.5
    with pytest.raises(ValueError):
        staircase_group_sizes(21, 4, -1)


@pytest.mark.parametrize("case", STAIRCASE_CASES)
def test_staircase_rows_and_ratio(case):
    eps, c, r, p, m, dd = case
    mech = Staircase(eps, c, r, p, m, dd)
    probs = mech.transition_matrix()
    d = mech.domain_size
    assert probs.shape == (d, d)
    assert torch.allclose(probs.sum(1), torch.ones(d, dtype=torch.float64), atol=1e-12)
    assert abs(math.log(float(probs.max() / probs.min())) - eps) < 1e-12
    alphas = mech.alphas
    assert abs(math.log(float(alphas[0] / alphas[-1])) - eps) < 1e-12
    steps = alphas[:-1] - alphas[1:]
    assert torch.allclose(steps, steps[0].expand_as(steps), rtol=1e-9)  # constant Delta_w
    # every row holds alpha_j exactly n_j times
    expected = torch.repeat_interleave(alphas, torch.tensor(mech.group_sizes)).sort().values
    assert torch.equal(probs.sort(dim=1).values, expected.expand(d, d))


@pytest.mark.parametrize("case", STAIRCASE_CASES)
def test_staircase_exact_epsilon(case):
    eps, c, r, p, m, dd = case
    mech = Staircase(eps, c, r, p, m, dd)
    assert exact_epsilon(mech) == pytest.approx(eps, abs=1e-9)
    assert mech.epsilon_for_dim(7) == pytest.approx(7 * eps)


def test_staircase_groups_by_distance():
    mech = Staircase(1.0, 0.0, 1.0, 1, groups=4, delta_d=2)
    d = mech.domain_size
    i = torch.arange(d).reshape(-1, 1)
    k = torch.arange(d).reshape(1, -1)
    rank = mech.rank(i, k)
    assert torch.equal(rank.sort(dim=1).values, torch.arange(d).expand(d, d))  # permutation
    group = mech.group_of(i, k)
    dist = (k - i).abs()
    for row in range(d):
        for j in range(mech.groups - 1):
            assert dist[row][group[row] == j].max() <= dist[row][group[row] == j + 1].min()
        # ties: of two values at the same distance, the left one has the smaller rank
        for t in range(1, min(row, d - 1 - row) + 1):
            assert rank[row, row - t] + 1 == rank[row, row + t]
    # the centre input (index 10) with n_1 = 2: G_1 = itself and its left neighbour
    assert mech.group_sizes == (2, 5, 6, 8)
    assert set(torch.nonzero(group[10] == 0).reshape(-1).tolist()) == {9, 10}
    # an edge input: the groups run to the right only
    assert torch.equal(
        group[0], torch.repeat_interleave(torch.arange(4), torch.tensor([2, 5, 6, 8]))
    )


def test_staircase_identical_laws_only_at_the_edges():
    for case in STAIRCASE_CASES[:7]:
        mech = Staircase(*case)
        probs = mech.transition_matrix()
        left, right = mech.identical_input_blocks
        d = mech.domain_size
        distinct = torch.unique(probs, dim=0).shape[0]
        assert distinct == d - (left - 1) - (right - 1)
        assert torch.equal(probs[:left], probs[0].expand(left, d))
        assert torch.equal(probs[d - right :], probs[-1].expand(right, d))


@pytest.mark.parametrize("x_value", [-1.0, -0.9, 0.0, 0.37, 1.0])
def test_staircase_frequencies(x_value):
    mech = Staircase(1.0, 0.0, 1.0, 1, groups=4, delta_d=1)
    _assert_frequencies(mech, x_value, 20_000, seed=int(100 * x_value) + 500)


def test_staircase_frequencies_stochastic_rounding():
    mech = Staircase(1.0, 0.0, 1.0, 1, groups=4, rounding="stochastic")
    _assert_frequencies(mech, 0.33, 20_000, seed=5)


@pytest.mark.parametrize("case", STAIRCASE_CASES[:7])
def test_staircase_debias_exact_bias(case):
    eps, c, r, p, m, dd = case
    mech = Staircase(eps, c, r, p, m, dd)
    bias = mech.debias_bias
    left, right = mech.identical_input_blocks
    d = mech.domain_size
    probs = mech.transition_matrix()
    assert torch.equal(probs[:left], probs[0].expand(left, d))  # edge inputs share one law
    step = 10.0**-p
    assert float(bias[:left].abs().max()) <= (left - 1) / 2 * step + 1e-9
    assert float(bias[d - right :].abs().max()) <= (right - 1) / 2 * step + 1e-9
    assert float(bias[left : d - right].abs().max()) < 1e-9  # exactly unbiased between blocks
    # the debias table reproduces these numbers through the public API
    values, _ = mech.output_distribution()
    g = mech.debias(values.reshape(1, -1)).reshape(-1)
    assert torch.allclose(probs @ g - mech.grid, bias, atol=1e-12)


def test_staircase_debias_monte_carlo_and_aggregate():
    mech = Staircase(2.0, 0.0, 1.0, 1, groups=4, delta_d=1)
    x = torch.tensor([[0.3, -0.6, 0.0]], dtype=torch.float64).expand(60_000, 3)
    y = mech.randomize(x, _gen(8))
    est = mech.debias(y)
    _assert_mean(est, x[0])
    assert torch.allclose(mech.aggregate(y), est.mean(0))
    biased = Staircase(2.0, 0.0, 1.0, 1, groups=4, delta_d=1, debias_method="none")
    assert torch.equal(biased.debias(y), y)


def test_staircase_stochastic_rounding_is_unbiased_off_grid():
    mech = Staircase(1.0, 0.0, 1.0, 1, groups=4, delta_d=2, rounding="stochastic")
    xs = torch.tensor([-0.43, 0.05, 0.61], dtype=torch.float64)
    values, probs = mech.output_distribution(xs)
    g = mech.debias(values.reshape(1, -1)).reshape(-1)
    assert torch.allclose(probs @ g, xs, atol=1e-9)
    assert exact_epsilon(mech, torch.linspace(-1.2, 1.2, 97)) == pytest.approx(1.0, abs=1e-9)


def test_staircase_large_domain_sampling_and_debias_limit():
    mech = Staircase(1.0, 0.0, 1.0, precision=4, groups=8)  # D = 20001
    x = torch.linspace(-1, 1, 200, dtype=torch.float32).reshape(20, 10)
    y = mech.randomize(x, _gen(1))
    assert y.dtype == torch.float32 and bool(((y >= -1) & (y <= 1)).all())
    with pytest.raises(ValueError, match="max_debias_domain"):
        mech.debias(y)
    assert torch.equal(Staircase(1.0, 0.0, 1.0, 4, 8, debias_method="none").debias(y), y)


def test_staircase_debias_rejects_off_grid_values():
    mech = Staircase(1.0, 0.0, 1.0, 1, groups=4)
    with pytest.raises(ValueError, match="grid"):
        mech.debias(torch.tensor([[0.05]]))
    with pytest.raises(ValueError, match="grid"):
        mech.debias(torch.tensor([[1.5]]))


def test_staircase_alphas_normalise_any_sizes():
    for sizes in [(1, 1), (3, 9, 2), (4, 5, 5, 7)]:
        a = staircase_alphas(1.3, sizes)
        assert float((a * torch.tensor(sizes, dtype=torch.float64)).sum()) == pytest.approx(
            1, abs=1e-14
        )
        assert float(a[0] / a[-1]) == pytest.approx(math.exp(1.3), rel=1e-13)


# --------------------------------------------------------------------------------------- GRR
@pytest.mark.parametrize("eps", [0.5, 2.0, 6.0])
def test_grr_exact_epsilon_and_rows(eps):
    mech = GRR(eps, center=0.3, radius=0.5, precision=1)
    assert mech.domain_size == 11
    values, probs = mech.output_distribution()
    assert torch.allclose(values, torch.linspace(-0.2, 0.8, 11, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(probs.sum(1), torch.ones(11, dtype=torch.float64), atol=1e-14)
    assert exact_epsilon(mech) == pytest.approx(eps, abs=1e-9)


def test_grr_frequencies():
    mech = GRR(1.0, 0.0, 1.0, 1)
    for k, w in enumerate([-1.0, 0.2, 0.93]):
        _assert_frequencies(mech, w, 20_000, seed=40 + k)


def test_grr_debias_unbiased():
    mech = GRR(2.0, center=0.3, radius=0.5, precision=1)
    values, probs = mech.output_distribution()
    g = mech.debias(values.reshape(1, -1)).reshape(-1)
    assert torch.allclose(probs @ g, mech.grid, atol=1e-12)  # exact, every grid input
    x = torch.tensor([[-0.2, 0.3, 0.7]], dtype=torch.float64).expand(50_000, 3)
    _assert_mean(mech.debias(mech.randomize(x, _gen(2))), x[0])
    stoch = GRR(2.0, center=0.3, radius=0.5, precision=1, rounding="stochastic")
    xs = torch.tensor([-0.17, 0.333, 0.79], dtype=torch.float64)
    values, probs = stoch.output_distribution(xs)
    assert torch.allclose(probs @ stoch.debias(values.reshape(1, -1)).reshape(-1), xs, atol=1e-12)


# ---------------------------------------------------------------------------- broken variant
def _reference_interval_law(i: int, sizes, masses, d: int) -> dict[int, float]:
    """Scalar restatement of the reference code's interval sampler, in half-step units."""
    lo, hi = 0, 2 * (d - 1)
    law: dict[int, float] = defaultdict(float)

    def extend(left, right, n, hit_l, hit_r):
        if not hit_r and not hit_l:
            return left - n, right + n
        if hit_r:
            return left - 2 * n, right
        return left, right + 2 * n

    for idx, n in enumerate(sizes):
        cur_l = cur_r = 2 * i
        hit_l = hit_r = False
        for g in range(idx):
            tl, tr = extend(cur_l, cur_r, sizes[g], hit_l, hit_r)
            if tl <= lo:
                tr, tl, hit_l = tr + (lo - tl), lo, True
            if tr >= hi:
                tl, tr, hit_r = tl - (tr - hi), hi, True
            cur_l, cur_r = tl, tr
        tl, tr = extend(cur_l, cur_r, n, hit_l, hit_r)
        if tl < lo:
            tr, tl = tr + (lo - tl), lo
        if tr > hi:
            tl, tr = tl - (tr - hi), hi
        size_l = int((cur_l - tl) / 2)
        for pos in range(n):
            h = cur_r + 2 * (pos - size_l) if pos > size_l else tl + 2 * pos
            law[h] += float(masses[idx]) / n
    return law


@pytest.mark.parametrize(
    ("radius", "precision", "groups", "delta_d"), [(1.0, 1, 4, 1), (1.5, 1, 3, 2), (0.075, 3, 5, 5)]
)
def test_broken_interval_matches_scalar_restatement(radius, precision, groups, delta_d):
    mech = BrokenStaircase(1.0, 0.0, radius, precision, groups, delta_d, defect="interval")
    values, probs = mech.output_distribution()
    half = torch.round((values - mech.grid[0]) * 2 * 10**precision).to(torch.int64)
    for i in range(mech.domain_size):
        law = _reference_interval_law(i, mech.group_sizes, mech.group_masses, mech.domain_size)
        row = torch.zeros_like(probs[i])
        for h, p in law.items():
            row[int(torch.nonzero(half == h))] += p
        assert torch.allclose(row, probs[i], atol=1e-15)


def test_broken_interval_is_not_ldp_at_all():
    # c = 0, r = 0.075 as in 002 Fig. 2; p = 3 (D = 151), m = 5, delta_d = 5 (ours)
    mech = BrokenStaircase(1.0, 0.0, 0.075, 3, groups=5, delta_d=5)
    assert mech.group_sizes == (21, 25, 30, 35, 40) and sum(mech.group_sizes) == 151
    audit = exact_epsilon_witness(mech)
    assert audit.epsilon == math.inf and audit.epsilon > mech.epsilon
    probs = mech.output_distribution()[1]
    assert torch.allclose(probs.sum(1), torch.ones(151, dtype=torch.float64), atol=1e-12)
    # the correct mechanism with the same parameters passes
    assert exact_epsilon(Staircase(1.0, 0.0, 0.075, 3, 5, 5)) == pytest.approx(1.0, abs=1e-9)


def test_broken_interval_frequencies():
    mech = BrokenStaircase(1.0, 0.0, 1.0, 1, groups=4, delta_d=1)
    for k, w in enumerate([-1.0, 0.1]):
        _assert_frequencies(mech, w, 20_000, seed=60 + k)


def test_broken_sorted_defect():
    assert reference_group_sizes(151, 4, 4) == (32, 35, 39, 43)  # sums to 149 < 151
    mech = BrokenStaircase(1.0, 0.0, 0.075, 3, groups=4, delta_d=4, defect="sorted")
    assert exact_epsilon(mech) == math.inf
    _assert_frequencies(mech, -0.075, 20_000, seed=70)
    # sizes summing to exactly D: this path is then the correct mechanism (left-first ties)
    ok = BrokenStaircase(1.0, 0.0, 0.075, 3, groups=5, delta_d=5, defect="sorted")
    assert exact_epsilon(ok) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="IndexError"):
        BrokenStaircase(1.0, 0.0, 1.0, 1, groups=3, delta_d=0, defect="sorted")  # sizes 8, 7, 7


def test_broken_per_group_defect():
    mech = BrokenStaircase(1.0, 0.0, 1.0, 1, groups=4, delta_d=2, defect="per_group")
    n = mech.group_sizes
    assert exact_epsilon(mech) == pytest.approx(1.0 + math.log(n[-1] / n[0]), abs=1e-9)
    assert exact_epsilon(mech) > mech.epsilon
    _assert_frequencies(mech, 0.4, 20_000, seed=80)


# ---------------------------------------------------------------------------------- Gaussian
def test_gaussian_randomizer():
    z, clip, delta = 1.3, 0.5, 1e-5
    mech = GaussianRandomizer(z, clip, delta)
    assert mech.epsilon0 == pytest.approx(gaussian_epsilon(z, delta, sensitivity=2.0))
    assert mech.epsilon0 > gaussian_epsilon(z, delta)
    assert mech.delta == delta and mech.per_coordinate is False
    assert mech.epsilon_for_dim(1000) == mech.epsilon0
    n, d = 50_000, 4
    x = torch.zeros(n, d, dtype=torch.float64)
    x[:, 0] = 10.0  # clipped to norm 0.5
    y = mech.randomize(x, _gen(3))
    _assert_mean(mech.debias(y), torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64))
    sd = y.std(dim=0)
    assert torch.allclose(sd, torch.full((d,), z * clip, dtype=torch.float64), rtol=0.02)
    assert torch.allclose(mech.aggregate(y), y.mean(0))


# ------------------------------------------------------------------- interface and arguments
def test_interface_and_dim():
    mechs = [
        LDPSGD(1.0, 1.0),
        TwoPoint(1.0),
        Staircase(1.0),
        GRR(1.0),
        BrokenStaircase(1.0),
        GaussianRandomizer(1.0, 1.0, 1e-5),
    ]
    x = torch.randn(4, 3, generator=_gen(0))
    for mech in mechs:
        assert isinstance(mech, LocalRandomizer)
        assert isinstance(mech.name, str) and repr(mech)
        y = mech.randomize(x, _gen(1))
        assert y.shape == x.shape and y.dtype == x.dtype
        assert mech.aggregate(y).shape == (3,)
    two = TwoPoint(0.5, dim=3)
    assert two.epsilon0 == pytest.approx(1.5) and two.epsilon_per_coordinate == 0.5
    assert TwoPoint(0.5).epsilon0 == 0.5 and TwoPoint(0.5).epsilon_for_dim(4) == 2.0
    with pytest.raises(ValueError, match="dim=3"):
        two.randomize(torch.zeros(2, 4))


def test_exact_epsilon_chunking_and_witness():
    mech = Staircase(1.5, 0.0, 1.0, 1, groups=4, delta_d=1)
    full = exact_epsilon_witness(mech)
    tiny = exact_epsilon_witness(mech, chunk_elements=50)
    assert full == tiny and full.epsilon == pytest.approx(1.5, abs=1e-9)
    values, probs = mech.output_distribution(torch.tensor([full.x_high, full.x_low]))
    j = int(torch.nonzero(values == full.y))
    assert math.log(probs[0, j] / probs[1, j]) == pytest.approx(full.epsilon, abs=1e-12)
    assert exact_epsilon(mech, [0.0]) == 0.0
    assert exact_epsilon(GRR(1.0), np.array([0.0, 0.1])) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    "build",
    [
        lambda: LDPSGD(0.0, 1.0),
        lambda: LDPSGD(-1.0, 1.0),
        lambda: LDPSGD(math.inf, 1.0),
        lambda: LDPSGD(math.nan, 1.0),
        lambda: LDPSGD(1.0, 0.0),
        lambda: TwoPoint(1.0, radius=-1.0),
        lambda: TwoPoint(1.0, center=math.inf),
        lambda: TwoPoint(1e4),
        lambda: TwoPoint(1.0, dim=0),
        lambda: GRR(1.0, radius=0.01, precision=1),  # rounds to 0
        lambda: GRR(1.0, precision=-1),
        lambda: GRR(1.0, precision=1.5),
        lambda: GRR(1.0, rounding="up"),
        lambda: Staircase(1.0, groups=1),
        lambda: Staircase(1.0, groups=22),  # D = 21
        lambda: Staircase(1.0, groups=4, delta_d=-1),
        lambda: Staircase(1.0, groups=4, delta_d=3.0),
        lambda: Staircase(1.0, debias_method="exact"),
        lambda: BrokenStaircase(1.0, defect="typo"),
        lambda: GaussianRandomizer(0.0, 1.0, 1e-5),
        lambda: GaussianRandomizer(1.0, 1.0, 0.0),
        lambda: GaussianRandomizer(1.0, 1.0, 1.0),
        lambda: GaussianRandomizer(1.0, -1.0, 1e-5),
    ],
)
def test_bad_arguments(build):
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(5),
        torch.zeros(2, 3, dtype=torch.int64),
        torch.tensor([[0.0, math.nan]]),
        torch.tensor([[math.inf, 0.0]]),
        torch.zeros(0, 3),
        [[0.0, 1.0]],
    ],
)
def test_bad_inputs(x):
    for mech in [
        LDPSGD(1.0, 1.0),
        TwoPoint(1.0),
        Staircase(1.0),
        GRR(1.0),
        GaussianRandomizer(1.0, 1.0, 1e-5),
    ]:
        with pytest.raises(ValueError):
            mech.randomize(x)


# ------------------------------------------------------------------ shared staircase pieces
def test_staircase_alphas_domain_size_and_reference_normalisation():
    sizes = staircase_group_sizes(151, 5, 5)
    assert torch.equal(staircase_alphas(1.0, sizes, 151), staircase_alphas(1.0, sizes))
    # the reference code's sizes (sum 149 != D = 151), eq. 8 with the true D: per-value ratio
    # still e^eps, total mass below 1 (BrokenStaircase adds the rest to group 1)
    ref = reference_group_sizes(151, 4, 4)
    a = staircase_alphas(1.0, ref, 151)
    k, m = math.e, 4
    weighted = sum((j - 1) * n for j, n in enumerate(ref, start=1))
    alpha_min = (m - 1) / ((m - 1) * 151 * k - (k - 1) * weighted)
    expected = [alpha_min + (m - j) * alpha_min * (k - 1) / (m - 1) for j in range(1, m + 1)]
    assert torch.allclose(a, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)
    assert float(a[0] / a[-1]) == pytest.approx(math.e, rel=1e-14)
    assert float((a * torch.tensor(ref, dtype=torch.float64)).sum()) < 1.0
    with pytest.raises(ValueError):
        staircase_alphas(1.0, ref, 0)


def test_grr_probabilities():
    mech = GRR(1.3, 0.0, 0.5, 1)  # D = 11
    p, q = mech.keep_probability, mech.other_probability
    assert p / q == pytest.approx(math.exp(1.3), rel=1e-14)
    assert p + (mech.domain_size - 1) * q == pytest.approx(1.0, abs=1e-15)


def test_broken_staircase_shares_the_group_sampler():
    # the sorted defect with the reference's sizes equal to ours (m = 2, D = 41: 21 + 20) is the
    # correct mechanism: the same seeded draws give the same outputs
    ok = BrokenStaircase(1.0, 0.0, 2.0, 1, groups=2, delta_d=0, defect="sorted")
    good = Staircase(1.0, 0.0, 2.0, 1, 2, 0)
    assert ok.group_sizes == good.group_sizes == (21, 20)
    x = torch.linspace(-2.5, 2.5, 40).reshape(4, 10)
    assert torch.equal(ok.randomize(x, _gen(3)), good.randomize(x, _gen(3)))
    assert torch.allclose(ok.group_masses, good.group_masses, rtol=1e-13, atol=0)
