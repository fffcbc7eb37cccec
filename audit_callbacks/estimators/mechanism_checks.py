"""Checks of the DP mechanism itself from its releases (numpy + scipy only).

A release ``r_t`` of a Gaussian mechanism (DP-SGD: the noisy sum right after the noise is added,
before any scaling; DP-FedAvg: the noisy sum of the cohort's clipped updates) is
``g_t + n_t``: ``g_t`` the sum of the clipped contributions, ``n_t ~ N(0, s^2 I_d)`` with
``s = noise_multiplier * clip_norm`` (Opacus' ``noise_multiplier * max_grad_norm``), drawn afresh
for each release and independently of everything before it. Two statistics follow, each exact
whatever the gradients do:

* **noise scale** (F1): over ``m`` coordinates (one parameter tensor's, or orthonormal canary
  directions), ``||r_t||^2 / s^2`` given the past is a noncentral chi-square with ``m`` degrees
  of freedom, which stochastically dominates ``chi2(m)``; summed over releases, the total over
  ``T`` releases dominates ``chi2(m T)``. Noise missing or short pulls the sum below that law's
  lower tail unless the gradients happen to supply the energy.
* **fresh noise** (F2): the difference of consecutive releases ``D_t = r_t - r_{t-1}`` is
  ``(g_t - r_{t-1}) + n_t`` with the first part fixed before ``n_t`` is drawn, so
  ``||D_t||^2 / s^2`` again dominates ``chi2(m)`` given the past, and the sum over ``T - 1``
  differences dominates ``chi2(m (T - 1))``. With fresh noise its mean is about ``2 m`` (twice
  the bound); noise reused from the previous release cancels in ``D_t`` and leaves only the
  change of the gradients, usually far below ``m s^2``.

Both are one-sided lower-tail tests of ``H0: the noise is at least N(0, s^2 I), fresh every
release`` with false-alarm rate at most ``alpha`` (Bonferroni over the groups tested). A third
check tests the **sampler** against the accountant's Poisson assumption: batch (cohort) sizes
of Poisson sampling at rate ``q`` from ``N`` are i.i.d. Binomial(N, q), so their total is
Binomial(N T, q), Fisher's index of dispersion ``sum (B_t - N q)^2 / (N q (1 - q))`` is close
to ``chi2(T)``, and no size repeats much more often than its binomial probability allows;
fixed-size shuffled batches repeat one size and fail within a few steps.

Sources: the chi-square law of a Gaussian vector's squared norm (e.g. Johnson, Kotz &
Balakrishnan, Continuous Univariate Distributions vol. 2, 1995, ch. 29 for the noncentral
case); Fisher's index of dispersion test (Fisher 1950; Cochran, Biometrics 1954, sec. 6); the
bug classes: Annamalai et al., "To Shuffle or not to Shuffle", NDSS 2026; Chua et al., ICML
2024. ``docs/methods/mechanism_checks.md`` states each check's assumptions and power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from ._validation import check_alpha, check_finite_1d, check_positive_finite, check_probability
from .result import AuditResult

__all__ = ["noise_energy_check", "noise_energy_power", "sampler_check"]

_SOURCE_NOISE = ("chi-square lower tail of a Gaussian release's squared norm: "
                 "docs/methods/mechanism_checks.md F1 (noise scale) and F2 (fresh noise)")
_SOURCE_SAMPLER = ("Binomial(N T, q) total, Fisher's index of dispersion (Cochran, Biometrics "
                   "1954, sec. 6) and the most repeated size against Poisson sampling: "
                   "docs/methods/mechanism_checks.md F4")
_CHECKS = ("noise_scale", "fresh_noise")


def _groups(energy: object, dof: object, groups: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    e = check_finite_1d(np.atleast_1d(np.asarray(energy, dtype=np.float64)), "energy")
    k = check_finite_1d(np.atleast_1d(np.asarray(dof, dtype=np.float64)), "dof")
    if e.shape != k.shape:
        raise ValueError(f"energy and dof must have one entry per group, got {e.shape} and {k.shape}")
    if np.any(e < 0):
        raise ValueError("energy must be >= 0 (sums of squares)")
    if np.any(k < 1) or np.any(k != np.round(k)):
        raise ValueError("dof must hold integers >= 1")
    names = [str(i) for i in range(e.size)] if groups is None else [str(g) for g in groups]
    if len(names) != e.size:
        raise ValueError(f"groups must name each of the {e.size} groups, got {len(names)}")
    return e, k, names


def noise_energy_check(
    energy: object, dof: object, noise_std: float, *, alpha: float = 0.05,
    check: str = "noise_scale", groups: Sequence[str] | None = None,
) -> AuditResult:
    """Test that releases carry at least the claimed Gaussian noise (F1) or fresh noise (F2).

    Args:
        energy: ``[m]`` per group (a parameter tensor, or the unobserved canaries' directions),
            the sum of squares over its coordinates and over the releases tested: of the
            releases themselves (``check="noise_scale"``) or of the differences of consecutive
            releases (``check="fresh_noise"``), in the releases' units.
        dof: ``[m]`` integers, the group's coordinates times the number of releases (or of
            differences) summed.
        noise_std: ``s``, the claimed noise standard deviation per coordinate of one release
            (``noise_multiplier * clip_norm``, in the releases' units), > 0.
        alpha: the false-alarm rate of the whole check (Bonferroni over the ``m`` groups).
        check: ``"noise_scale"`` or ``"fresh_noise"``: only names the result.
        groups: ``m`` names for the summary (e.g. parameter tensor names).

    Returns:
        An :class:`AuditResult`: ``value`` the ratio ``energy / (dof s^2)`` of the group with
        the smallest p-value, the one ``details["group"]`` names (about 1 or more for a correct
        mechanism, about 2 for ``fresh_noise``; a group of few coordinates and releases varies
        more; rejected below ``details["threshold"]``), ``alpha``,
        ``details``: ``rejected`` (bool), ``group`` (the group with the smallest p-value),
        ``p_value`` (its p-value, times ``m``, capped at 1), ``threshold`` (the ratio below which
        that group is rejected), and ``ratios`` (each group's ratio, for up to 64 groups).

    Raises:
        ValueError: mismatched or negative ``energy``, ``dof`` not integers >= 1, ``noise_std``
            not positive and finite, ``alpha`` outside (0, 1), an unknown ``check``.
    """
    e, k, names = _groups(energy, dof, groups)
    s = check_positive_finite(noise_std, "noise_std")
    a = check_alpha(alpha)
    if check not in _CHECKS:
        raise ValueError(f"check must be one of {_CHECKS}, got {check!r}")
    m = e.size
    x = e / (s * s)
    ratios = x / k
    logp = stats.chi2.logcdf(x, k)  # lower tail: small when the energy falls short
    worst = int(np.argmin(logp))
    p_adj = float(min(1.0, m * math.exp(float(logp[worst]))))
    level = a / m
    threshold = float(stats.chi2.ppf(level, k[worst]) / k[worst])
    details = {
        "check": check,
        "rejected": bool(p_adj <= a),
        "group": names[worst],
        "p_value": p_adj,
        "threshold": threshold,
        "groups": m,
    }
    if m <= 64:
        details["ratios"] = {n: float(r) for n, r in zip(names, ratios, strict=True)}
    return AuditResult(
        value=float(ratios[worst]), alpha=a, method=f"chi2_lower_tail_{check}", source=_SOURCE_NOISE,
        counts={"dof": int(k.sum()), "groups": m}, details=details,
    )


def noise_energy_power(dof: float, true_ratio: float, *, alpha: float = 0.05, groups: int = 1) -> float:
    """The probability that :func:`noise_energy_check` rejects a group whose energy is
    ``true_ratio * s^2 * chi2(dof)`` (a mechanism whose noise variance is ``true_ratio`` of the
    claim and whose gradients add nothing along the group), at level ``alpha / groups``.

    Raises:
        ValueError: ``dof`` < 1, ``true_ratio`` not positive and finite, bad ``alpha``, ``groups`` < 1.
    """
    k = check_positive_finite(dof, "dof")
    if k < 1:
        raise ValueError(f"dof must be >= 1, got {dof!r}")
    r = check_positive_finite(true_ratio, "true_ratio")
    a = check_alpha(alpha)
    if int(groups) != groups or groups < 1:
        raise ValueError(f"groups must be an integer >= 1, got {groups!r}")
    cut = stats.chi2.ppf(a / groups, k)
    return float(stats.chi2.cdf(cut / r, k))


def _fixed_size(values: np.ndarray, repeats: np.ndarray, size: int, population: int) -> bool:
    """Whether the sizes ``values`` (sorted, distinct; ``repeats`` times each) are those of
    fixed-size batches of ``size`` from ``population`` examples: every batch is ``size`` but a
    short last batch of each epoch, one smaller size occurring at most once per epoch of
    ``ceil(N / size)`` steps (none where ``size`` is N: one batch is the whole epoch)."""
    if size < 1 or values.size > 2:
        return False
    if values.size == 1:
        return True
    if int(values[-1]) != size or size >= population:
        return False  # the short batch is the smaller size; a batch of N leaves none
    steps = int(repeats.sum())
    per_epoch = -(-population // size)  # ceil(N / B) steps an epoch, the last one short
    return int(repeats[0]) <= -(-steps // per_epoch)


def sampler_check(batch_sizes: object, population: int, sample_rate: float, *,
                  alpha: float = 0.05, batches_per_step: int = 1) -> AuditResult:
    """Test observed batch (or cohort) sizes against Poisson sampling at ``sample_rate``.

    Under Poisson sampling each of ``N = population`` examples joins each batch independently
    with probability ``q``: the sizes ``B_1..B_T`` are i.i.d. Binomial(N, q). Three tests, each
    at ``alpha / 3``:

    * the total against Binomial(N T, q) (two-sided, exact): a wrong rate;
    * Fisher's index of dispersion ``D = sum (B_t - N q)^2 / (N q (1 - q))`` (two-sided): a
      wrong spread. ``D / c`` against ``chi2(T / c)``, ``c = (2 + 1/v - 6/N) / 2`` with
      ``v = N q (1 - q)``: the scaled chi-square with D's exact mean T and variance
      ``T (2 + 1/v - 6/N)`` under Binomial(N, q) sizes (Patnaik 1949, Biometrika 36), where
      ``chi2(T)`` (variance 2T) raised false alarms at 1.5-3x the level for small ``N q``;
    * the most repeated size: the probability that some size occurs at least as often as the
      most frequent one, bounded by ``sum_v P[Binomial(T, p_v) >= m]`` with ``p_v`` the
      Binomial(N, q) probability of size ``v`` (the union bound: valid, conservative). Fixed-size
      shuffled batches repeat one size (all but a short last batch of each epoch) and fail it
      within a handful of steps, whatever their last batch does to the dispersion.

    Args:
        batch_sizes: ``[T]`` non-negative integers, T >= 2.
        population: N, the examples (clients) sampled from, integer >= 1.
        sample_rate: q in (0, 1), the accountant's rate.
        alpha: the false-alarm rate of the whole check.
        batches_per_step: k, the loader batches summed into each step (gradient accumulation),
            integer >= 1. Each size is then a sum of k Binomial(N', q) batches of N' examples:
            pass ``population`` = N' k, so a size is Binomial(N' k, q). k sets only the
            ``sampling`` label: an epoch of ``ceil(N' / B)`` steps of B, read as batches of B / k,
            ``"fixed-size batches of 32, 3 accumulated a step"``.

    Returns:
        An :class:`AuditResult`: ``value`` the ratio of the sizes' variance to ``N q (1 - q)``
        (about 1 under Poisson, about 0 for fixed-size batches), ``details``: ``rejected``,
        ``mean``, ``expected_mean``, ``variance``, ``expected_variance``, ``p_value_total``,
        ``p_value_dispersion``, ``p_value_repeats`` (each before the factor 3),
        ``most_repeated_size`` and ``repeats``, ``rejected_by`` (the tests at or below
        ``alpha / 3``, of ``"total"``, ``"dispersion"``, ``"repeats"``: empty when not rejected),
        and ``sampling``: ``"fixed-size batches of B"`` where B, the most repeated size, is
        every size but one smaller size that occurs at most once per epoch (the short last
        batch of a loader without ``drop_last``: an epoch of ``ceil(N / B)`` steps, so at most
        ``ceil(T / ceil(N / B))`` of them in T consecutive steps; N / k examples under
        ``batches_per_step`` k), else ``"variable"``.

    Raises:
        ValueError: sizes not non-negative integers or fewer than 2, a size above ``population``,
            ``population`` < 1, ``sample_rate`` outside (0, 1), bad ``alpha``,
            ``batches_per_step`` not an integer >= 1 that divides ``population``.
    """
    b = check_finite_1d(np.asarray(batch_sizes, dtype=np.float64), "batch_sizes", min_size=2)
    if np.any(b < 0) or np.any(b != np.round(b)):
        raise ValueError("batch_sizes must hold non-negative integers")
    if isinstance(population, bool) or not isinstance(population, (int, np.integer)) or population < 1:
        raise ValueError(f"population must be an integer >= 1, got {population!r}")
    n = int(population)
    if np.any(b > n):
        raise ValueError(f"batch_sizes must not exceed population = {n}")
    q = check_probability(sample_rate, "sample_rate")
    a = check_alpha(alpha)
    if (isinstance(batches_per_step, bool) or not isinstance(batches_per_step, (int, np.integer))
            or batches_per_step < 1 or n % batches_per_step):
        raise ValueError(f"batches_per_step must be an integer >= 1 that divides population = {n}, "
                         f"got {batches_per_step!r}")
    t = b.size
    mu, var = n * q, n * q * (1.0 - q)
    total = int(b.sum())
    p_total = float(stats.binomtest(total, n * t, q).pvalue)
    dispersion = float(((b - mu) ** 2).sum() / var)
    # D = sum (B_t - N q)^2 / v has mean T and variance T (2 + 1/v - 6/N) (the binomial's
    # fourth central moment): D / c ~ chi2(T / c) with c = (2 + 1/v - 6/N) / 2 matches both
    # (Patnaik 1949); chi2(T) alone, variance 2T, gave false alarms at 1.5-3x the level for
    # N q of 1-2 (and c = 0 only for one Bernoulli(1/2) example a step: D = T always)
    c = (2.0 + 1.0 / var - 6.0 / n) / 2.0
    p_disp = 1.0 if c <= 0.0 else float(min(1.0, 2.0 * min(stats.chi2.cdf(dispersion / c, t / c),
                                                          stats.chi2.sf(dispersion / c, t / c))))
    values, repeats = np.unique(b.astype(np.int64), return_counts=True)
    top = int(np.argmax(repeats))
    m = int(repeats[top])
    p_v = stats.binom.pmf(np.arange(n + 1), n, q)
    p_v = p_v[p_v > 0]
    p_rep = float(min(1.0, stats.binom.sf(m - 1, t, p_v).sum()))
    p_values = {"total": p_total, "dispersion": p_disp, "repeats": p_rep}
    rejected_by = [test for test, p in p_values.items() if p <= a / 3]
    size = int(values[top])
    k = int(batches_per_step)
    fixed = size % k == 0 and _fixed_size(values, repeats, size, n // k)
    label = f"fixed-size batches of {size // k}" + (f", {k} accumulated a step" if k > 1 else "")
    details = {
        "rejected": bool(rejected_by), "rejected_by": rejected_by,
        "mean": float(b.mean()), "expected_mean": mu,
        "variance": float(b.var(ddof=1)), "expected_variance": var,
        "p_value_total": p_total, "p_value_dispersion": p_disp, "p_value_repeats": p_rep,
        "most_repeated_size": size, "repeats": m,
        "sampling": label if fixed else "variable",
    }
    return AuditResult(
        value=float(b.var(ddof=1) / var), alpha=a, method="poisson_sampler_test",
        source=_SOURCE_SAMPLER, counts={"batches": t, "population": n, "total": total},
        details=details,
    )
