"""The mechanism checks' estimators: false-alarm rate on correct mechanisms (by repetition, at
the boundary of the null where the law is exact), power against the closed form, the planted
bug classes (missing, short and reused noise; fixed-size batches; a wrong rate), bad input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from audit_callbacks.estimators.mechanism_checks import (
    noise_energy_check,
    noise_energy_power,
    sampler_check,
)

SEGMENTS = [(0, 200), (200, 210), (210, 400)]  # three "parameter tensors", one tiny
NAMES = ["conv.weight", "fc.bias", "fc.weight"]


def _energies(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per segment: sums of squares of the releases (F1) and of their differences (F2), and
    their degrees of freedom."""
    d = np.diff(r, axis=0)
    e1 = np.array([(r[:, a:b] ** 2).sum() for a, b in SEGMENTS])
    e2 = np.array([(d[:, a:b] ** 2).sum() for a, b in SEGMENTS])
    k1 = np.array([(b - a) * r.shape[0] for a, b in SEGMENTS])
    k2 = np.array([(b - a) * d.shape[0] for a, b in SEGMENTS])
    return e1, k1, e2, k2


def _training(rng, steps, s, *, reuse=False, missing=None, scale=1.0, momentum=0.0):
    """Releases g_t + n_t of a toy training: gradients that follow the previous release (a
    model that moves with its noise, with momentum) plus Gaussian noise."""
    dim = SEGMENTS[-1][1]
    g = rng.normal(scale=0.3 * s, size=dim)
    fixed = rng.normal(scale=s * scale, size=dim)
    out, prev = [], np.zeros(dim)
    for _ in range(steps):
        g = 0.9 * g + momentum * prev + rng.normal(scale=0.05 * s, size=dim)
        n = fixed.copy() if reuse else rng.normal(scale=s * scale, size=dim)
        if missing is not None:
            n[missing[0]:missing[1]] = 0.0
        prev = g + n
        out.append(prev)
    return np.array(out)


def _rejected(result) -> bool:
    return bool(result.details["rejected"])


def test_noise_scale_false_alarm_rate_at_the_boundary():
    """Pure noise (no gradient: the boundary of H0, where chi2 is exact): rejected in about
    alpha of the runs (Bonferroni over 3 groups: 1 - (1 - alpha/3)^3), within binomial limits."""
    rng = np.random.default_rng(1)
    s, alpha, runs = 1.7, 0.1, 600
    hits = 0
    for _ in range(runs):
        e1, k1, _, _ = _energies(rng.normal(scale=s, size=(5, 400)))
        hits += _rejected(noise_energy_check(e1, k1, s, alpha=alpha, groups=NAMES))
    expected = 1 - (1 - alpha / 3) ** 3
    lo, hi = stats.binom.ppf([0.0005, 0.9995], runs, expected)
    assert lo <= hits <= hi, (hits, expected * runs)


def test_fresh_noise_false_alarm_rate_at_the_boundary():
    """The fresh-noise law is exact when the change of the gradient cancels the previous
    release (r_t = r_{t-1} + n_t, a random walk): rejected in about alpha of the runs."""
    rng = np.random.default_rng(2)
    s, alpha, runs = 0.8, 0.1, 600
    hits = 0
    for _ in range(runs):
        r = np.cumsum(rng.normal(scale=s, size=(6, 400)), axis=0)
        _, _, e2, k2 = _energies(r)
        hits += _rejected(noise_energy_check(e2, k2, s, alpha=alpha, check="fresh_noise"))
    expected = 1 - (1 - alpha / 3) ** 3
    lo, hi = stats.binom.ppf([0.0005, 0.9995], runs, expected)
    assert lo <= hits <= hi, (hits, expected * runs)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_correct_trainings_are_not_flagged(momentum):
    """Gradients (correlated across steps, with momentum) only add energy: 0 rejections in 200
    runs at alpha = 0.05 for both checks (a rate above alpha would give ~10)."""
    rng = np.random.default_rng(3)
    s = 1.0
    hits = [0, 0]
    for _ in range(200):
        e1, k1, e2, k2 = _energies(_training(rng, 8, s, momentum=momentum))
        hits[0] += _rejected(noise_energy_check(e1, k1, s, groups=NAMES))
        hits[1] += _rejected(noise_energy_check(e2, k2, s, check="fresh_noise", groups=NAMES))
    assert hits[0] <= stats.binom.ppf(0.999, 200, 0.05) and hits[1] <= stats.binom.ppf(0.999, 200, 0.05)
    assert hits[1] <= 2  # the differences carry ~2 s^2 against a bound of s^2: far from it


def test_reused_noise_is_caught_by_fresh_noise():
    """The same noise vector every release: its scale is the claimed one (F1 is not built to
    see it), the differences hold only the gradients' change (F2 ratio far below 1, rejected
    in 20/20 seeds)."""
    caught = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        e1, k1, e2, k2 = _energies(_training(rng, 8, 1.0, reuse=True))
        res = noise_energy_check(e2, k2, 1.0, check="fresh_noise", groups=NAMES)
        caught += _rejected(res)
        assert res.value < 0.1
    assert caught == 20


def test_a_tensor_without_noise_is_named():
    """Noise missing on the 10 coordinates of ``fc.bias`` only: both checks reject and name it
    (the other 390 coordinates have their noise)."""
    for seed in range(20):
        rng = np.random.default_rng(200 + seed)
        e1, k1, e2, k2 = _energies(_training(rng, 8, 1.0, missing=SEGMENTS[1]))
        for res in (noise_energy_check(e1, k1, 1.0, groups=NAMES),
                    noise_energy_check(e2, k2, 1.0, check="fresh_noise", groups=NAMES)):
            assert _rejected(res) and res.details["group"] == "fc.bias", res.details


def test_short_noise_is_caught_by_noise_scale():
    """Noise at sigma/2 (variance a quarter of the claim): F1 rejects in 20/20 seeds."""
    for seed in range(20):
        rng = np.random.default_rng(300 + seed)
        e1, k1, _, _ = _energies(_training(rng, 8, 1.0, scale=0.5))
        assert _rejected(noise_energy_check(e1, k1, 1.0, groups=NAMES))


def test_power_matches_its_closed_form():
    """Noise with a variance of 0.9 of the claim and no gradient, 2,000 coordinates: the
    rejection rate over 800 runs matches noise_energy_power within binomial limits."""
    rng = np.random.default_rng(4)
    dof, ratio, alpha, runs = 2000, 0.9, 0.05, 800
    power = noise_energy_power(dof, ratio, alpha=alpha)
    assert 0.5 < power < 0.999
    hits = sum(_rejected(noise_energy_check((rng.normal(scale=np.sqrt(ratio), size=dof) ** 2).sum(),
                                            dof, 1.0, alpha=alpha)) for _ in range(runs))
    lo, hi = stats.binom.ppf([0.0005, 0.9995], runs, power)
    assert lo <= hits <= hi, (hits, power * runs)
    assert noise_energy_power(dof, 1.0, alpha=alpha) == pytest.approx(alpha)
    assert noise_energy_power(dof, 0.5, alpha=alpha, groups=10) > 0.9999


def test_the_result_reports_its_numbers():
    res = noise_energy_check([200.0, 5.0], [200, 10], 1.0, groups=["a", "b"])
    assert res.value == pytest.approx(0.5)
    assert res.details["group"] == "b"
    assert res.details["ratios"] == {"a": 1.0, "b": 0.5}
    p = 2 * stats.chi2.cdf(5.0, 10)
    assert res.details["p_value"] == pytest.approx(p)
    assert res.details["threshold"] == pytest.approx(stats.chi2.ppf(0.025, 10) / 10)
    assert res.counts == {"dof": 210, "groups": 2}


# ------------------------------------------------------------------------------ the sampler
@pytest.mark.parametrize("population, rate", [(60_000, 256 / 60_000), (50, 0.04)])
def test_sampler_false_alarm_rate_on_poisson_batches(population, rate):
    """Binomial(N, q) batch sizes (Opacus' Poisson sampler) rejected in at most alpha of 600
    runs of 40 steps (N q = 256 and N q = 2: the dispersion's chi2 approximation holds)."""
    rng = np.random.default_rng(5)
    alpha, runs = 0.1, 600
    hits = sum(_rejected(sampler_check(rng.binomial(population, rate, size=40), population, rate,
                                       alpha=alpha)) for _ in range(runs))
    assert hits <= stats.binom.ppf(0.9995, runs, alpha), hits


@pytest.mark.parametrize("population, rate, steps", [(100, 0.01, 100), (1000, 0.002, 500)])
def test_sampler_dispersion_keeps_its_level_at_small_expected_sizes(population, rate, steps):
    """At N q = 1-2 the dispersion D is far from chi2(T) (variance T (2 + 1/v - 6/N), not 2T):
    against chi2(T) its p-value fell below alpha / 3 = 0.0167 in 4.4% of runs at N q = 1,
    T = 100 (2.6x the level); the scaled chi-square keeps it (1.4%). 1,500 runs each."""
    rng = np.random.default_rng(8)
    runs, level = 1500, 0.05 / 3
    sizes = rng.binomial(population, rate, size=(runs, steps))
    hits = sum(sampler_check(b, population, rate, alpha=0.05).details["p_value_dispersion"] <= level
               for b in sizes)
    assert hits <= stats.binom.ppf(0.999, runs, level), hits


def test_sampler_catches_fixed_size_shuffled_batches():
    """DataLoader(shuffle=True, batch_size=64) over 1,000 examples under a Poisson accountant
    at q = 0.064: 15 batches of 64 and one of 40 each epoch, rejected within one epoch."""
    sizes = [64] * 15 + [40]
    res = sampler_check(sizes, 1000, 0.064)
    assert _rejected(res)
    assert res.details["sampling"] == "fixed-size batches of 64"
    assert res.details["p_value_repeats"] < 1e-10
    # the short last batch alone makes the spread look plausible: the repeats test catches it
    assert res.details["p_value_dispersion"] > 0.05
    # within 4 steps of a second configuration (batch 256 of 60,000 at q = 256/60,000)
    assert _rejected(sampler_check([256] * 4, 60_000, 256 / 60_000))


@pytest.mark.parametrize("population, batch, epochs", [(1500, 64, 3), (1400, 64, 4), (1000, 64, 2)])
def test_a_multi_epoch_fixed_size_loader_is_labelled_fixed(population, batch, epochs):
    """A shuffled fixed-size loader ends every epoch with one short batch (N mod B): over
    several epochs every size is B or that one smaller size, once per epoch of ceil(N / B)
    steps. Labelled by the docstring's rule, not "all but one batch is B"."""
    per_epoch = [batch] * (population // batch) + [population % batch]
    for sizes in (per_epoch * epochs, per_epoch[3:] + per_epoch * (epochs - 1) + per_epoch[:3]):
        res = sampler_check(sizes, population, batch / population)
        assert res.details["sampling"] == f"fixed-size batches of {batch}", sizes
        assert _rejected(res) and "repeats" in res.details["rejected_by"]
    # drop_last: B alone
    assert sampler_check([batch] * 10, population, batch / population).details["sampling"] == (
        f"fixed-size batches of {batch}")


@pytest.mark.parametrize("population, batch, k, epochs", [(455, 32, 3, 3), (1500, 64, 2, 2), (1000, 50, 4, 3)])
def test_a_fixed_size_loader_under_gradient_accumulation_is_labelled_by_its_batches(population, batch, k,
                                                                                     epochs):
    """k accumulated batches a step: a step's size is Binomial(N k, q) under Poisson; a
    fixed-size loader gives steps of k B and one short step an epoch (the group holding the
    short batch), ceil(N / (k B)) steps an epoch. 455 examples, 32 a batch, 3 a step: 96 in 4
    steps and 71 in 1, each epoch (Lightning's accumulate_grad_batches=3), labelled by the
    batches, where the steps' population N k made the epoch look like one short step in 15."""
    batches = [batch] * (population // batch) + ([population % batch] if population % batch else [])
    steps = [sum(batches[i:i + k]) for i in range(0, len(batches), k) if len(batches[i:i + k]) == k]
    sizes = steps * epochs
    res = sampler_check(sizes, population * k, batch / population, batches_per_step=k)
    assert res.details["sampling"] == f"fixed-size batches of {batch}, {k} accumulated a step", sizes
    assert _rejected(res)
    # the same sizes, read as one batch a step from N k examples: an epoch too long for the
    # short steps seen (the label only; the tests and their p-values are the same)
    plain = sampler_check(sizes, population * k, batch / population)
    assert plain.details["sampling"] == ("variable" if len(set(sizes)) > 1 else f"fixed-size batches of {batch * k}")
    assert {t: plain.details[f"p_value_{t}"] for t in ("total", "dispersion", "repeats")} == {
        t: res.details[f"p_value_{t}"] for t in ("total", "dispersion", "repeats")}


@pytest.mark.parametrize("sizes, population", [
    ([64] * 22 + [28] * 2, 1500),      # two short batches in one epoch's 24 steps
    ([64] * 20 + [28, 40], 1500),      # two sizes below B
    ([60] * 20 + [64], 1500),          # the odd size above the common one
    ([10] * 20 + [9], 10),             # B = N: one batch is the epoch, none is short
    ([0] * 20 + [1], 1500),            # empty batches are no batch size
])
def test_other_size_patterns_are_labelled_variable(sizes, population):
    assert sampler_check(sizes, population, 0.04).details["sampling"] == "variable"


def test_the_result_names_the_tests_that_rejected():
    """``rejected_by`` lists the tests at or below alpha / 3, in the order total, dispersion,
    repeats; empty when the check passes."""
    q = 64 / 1500
    # a spread of Binomial(1500, q)'s size (variance 52.8 against 61.3) but 64 in 16 of 36 steps
    res = sampler_check([64] * 16 + [53, 75, 56, 72, 60, 68, 58, 70, 49, 79] * 2, 1500, q)
    assert res.details["rejected_by"] == ["repeats"] and res.details["sampling"] == "variable"
    assert res.details["p_value_dispersion"] > 0.05 and res.details["p_value_total"] > 0.05
    doubled = sampler_check(np.random.default_rng(6).binomial(5000, 0.02, size=30), 5000, 0.01)
    assert doubled.details["rejected_by"][0] == "total"
    d = doubled.details
    assert d["rejected_by"] == [t for t in ("total", "dispersion", "repeats")
                                if d[f"p_value_{t}"] <= doubled.alpha / 3]
    fine = sampler_check(np.random.default_rng(7).binomial(1500, q, size=50), 1500, q)
    assert fine.details["rejected_by"] == [] and not _rejected(fine)


def test_sampler_catches_a_doubled_rate():
    rng = np.random.default_rng(6)
    for _ in range(20):
        assert _rejected(sampler_check(rng.binomial(5000, 0.02, size=30), 5000, 0.01))


@pytest.mark.parametrize("kwargs, name", [
    ({"energy": [1.0, -1.0], "dof": [1, 1]}, "energy"),
    ({"energy": [1.0], "dof": [1, 2]}, "dof"),
    ({"energy": [1.0], "dof": [0.5]}, "dof"),
    ({"energy": [np.nan], "dof": [1]}, "energy"),
    ({"energy": [1.0], "dof": [1], "noise_std": 0.0}, "noise_std"),
    ({"energy": [1.0], "dof": [1], "alpha": 1.5}, "alpha"),
    ({"energy": [1.0], "dof": [1], "check": "scale"}, "check"),
    ({"energy": [1.0, 2.0], "dof": [1, 1], "groups": ["a"]}, "groups"),
])
def test_noise_check_bad_input(kwargs, name):
    kwargs = {"noise_std": 1.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        noise_energy_check(kwargs.pop("energy"), kwargs.pop("dof"), kwargs.pop("noise_std"), **kwargs)


@pytest.mark.parametrize("args, name", [
    (([3], 10, 0.1), "batch_sizes"),
    (([3, -1], 10, 0.1), "batch_sizes"),
    (([3, 2.5], 10, 0.1), "batch_sizes"),
    (([3, 11], 10, 0.1), "batch_sizes"),
    (([3, 4], 0, 0.1), "population"),
    (([3, 4], 10, 1.0), "sample_rate"),
    (([3, 4], 10, float("nan")), "sample_rate"),
    (([3, 4], 10, 0.1, 0), "batches_per_step"),
    (([3, 4], 10, 0.1, 3), "batches_per_step"),
    (([3, 4], 10, 0.1, 2.0), "batches_per_step"),
    (([3, 4], 10, 0.1, True), "batches_per_step"),
])
def test_sampler_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        sampler_check(*args[:3], **({"batches_per_step": args[3]} if len(args) > 3 else {}))


def test_the_reported_ratio_is_the_named_groups() -> None:
    """The value is the ratio of the group the result names (smallest p-value), not the
    smallest ratio: a 1-entry bias at 0.09 (p ~ 0.24) beside a weight at 0.9x over 100k
    coordinates (p ~ 0)."""
    res = noise_energy_check([90_000.0, 0.09], [100_000, 1], 1.0, groups=["weight", "bias"])
    assert res.details["group"] == "weight" and res.details["rejected"]
    assert res.value == pytest.approx(0.9)
    assert res.details["ratios"]["bias"] == pytest.approx(0.09)
