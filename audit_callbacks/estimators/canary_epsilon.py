"""One-shot epsilon estimate from canary cosines: fit Gaussians, compare them (Andrew et al. 2024).

Final model (Alg. 1/2): the observed cosines t_j = cos(c_j, release) are fitted by
N(mean, var) (sample mean, sample variance with ddof=1) and compared with the null N(0, 1/dim)
of docs/methods/canaries.md, A1. All iterates (Alg. 3): the statistics of k' unobserved canaries are fitted by a
Gaussian too and serve as the null. The epsilon of the pair at the target delta is
:func:`~audit_callbacks.estimators.gaussian.epsilon_two_gaussians` (docs/methods/canaries.md, A3).

Source: Andrew et al. 2024 §3 (Alg. 1, Thm 3.3), §4 (Alg. 2), §4.1 (Alg. 3); docs/methods/canaries.md, A2, A4, A5.

Finiteness: the estimate is always finite because both fitted sds must be > 0 (a sample with
zero variance raises ValueError instead: a point mass against a density has infinite epsilon).
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..validation import (
    check_alpha,
    check_choice,
    check_cosines,
    check_count,
    check_delta,
    check_dim,
    check_seed,
)
from .gaussian import (
    _epsilon_standardized_array,
    _epsilon_standardized_scalar,
    _standardize,
    gaussian_epsilon_array,
)
from .result import AuditResult

#: The source of the estimate, in every result.
SOURCE = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical Privacy "
          "Estimation for Federated Learning, ICLR 2024, §3.2, Alg. 1-3, Thm 3.3")

__all__ = ["estimate_epsilon_from_cosines", "share_resamples"]

Fit = Literal["unequal", "equal"]


def _threat_inputs(
    observed: ArrayLike,
    dim: int | None,
    unobserved: ArrayLike | None,
    min_size: int,
) -> tuple[np.ndarray, int | None, np.ndarray | None]:
    """Validate the (observed, dim | unobserved) pair; exactly one of dim, unobserved."""
    if (dim is None) == (unobserved is None):
        raise ValueError(
            "give exactly one of dim (final model: exact cosine null) or unobserved "
            "(all iterates: empirical null from unobserved canaries)"
        )
    obs = check_cosines(observed, "observed", min_size)
    if dim is not None:
        return obs, check_dim(dim), None
    unobs = check_cosines(unobserved, "unobserved", min_size)
    return obs, None, unobs


def _sd(x: np.ndarray, name: str) -> float:
    s = float(np.std(x, ddof=1))
    # identical values can leave a rounding residue of a few ulps: treat that as zero too
    scale = float(np.max(np.abs(x)))
    if not s > 16.0 * np.finfo(float).eps * scale:
        raise ValueError(
            f"{name} has zero sample variance: a point mass against a continuous null has "
            "infinite epsilon, so no finite estimate exists"
        )
    return s


def _fit_pair(
    obs: np.ndarray, dim: int | None, unobs: np.ndarray | None, fit: str
) -> tuple[float, float, float, float]:
    """(mu_observed, sigma_observed, mu_null, sigma_null) under the chosen fit."""
    check_choice(fit, "fit", ("unequal", "equal"))
    if dim is not None:
        mu0, s0 = 0.0, 1.0 / math.sqrt(dim)
    else:
        assert unobs is not None
        mu0, s0 = float(np.mean(unobs)), _sd(unobs, "unobserved")
    mu1 = float(np.mean(obs))
    s1 = s0 if fit == "equal" else _sd(obs, "observed")
    return mu1, s1, mu0, s0


def estimate_epsilon_from_cosines(
    observed: ArrayLike,
    delta: float,
    *,
    dim: int | None = None,
    unobserved: ArrayLike | None = None,
    fit: Fit = "unequal",
    bootstrap: int = 0,
    confidence: float = 0.95,
    seed: int = 0,
) -> AuditResult:
    """One-shot epsilon estimate from canary cosines, with an optional bootstrap interval.

    Final model (``dim`` given): eps(N(mean, var) || N(0, 1/dim); delta) where mean, var are the
    sample mean and variance (ddof=1) of ``observed``. All iterates (``unobserved`` given): the
    null is N(mean', var') fitted the same way to ``unobserved``.

    fit="unequal" (Andrew et al. 2024 Alg. 1-3): observed ~ N(mean, var) (ddof=1).
    fit="equal": the observed sd is fixed to the null's sd (1/sqrt(dim), or the sample sd of
    ``unobserved``); only the mean shift is estimated, i.e. the analytic Gaussian mechanism with
    Delta = |mean - null mean| / null sd. Andrew et al. (2024) Thm 3.3 (d * var -> 1) justifies this; it is
    much less variable than the unequal fit, whose small sd mismatches are amplified at small
    delta. With bootstrap = B > 0, the percentile interval of B resamples (observed, and
    unobserved when given, resampled with replacement by ``numpy.random.default_rng(seed)``;
    each replicate refitted the same way) is returned as [lower, upper]. Replicates whose
    resample has zero variance are dropped and counted in ``extras["bootstrap_dropped"]``.

    Small samples: a sample whose sd is fitted (``observed`` with fit="unequal", ``unobserved``
    always) needs k >= 3 values for a bootstrap. With k = 2 every resample either repeats one
    value (zero variance: dropped) or is the sample itself, so every kept replicate equals the
    point estimate and the "interval" has zero width although nothing about the uncertainty
    was learnt; that case raises ValueError instead of reporting it. (fit="equal" with ``dim``
    fits only the observed mean, and k = 2 resamples do vary: it is allowed.)

    Args:
        observed: shape (k,), k >= 2, cosines in [-1, 1] of the inserted canaries
            (max-over-rounds cosines for all iterates).
        delta: target delta in (0, 1).
        dim: model dimension d >= 2 (final model: the exact null of docs/methods/canaries.md,
            A1) -- exactly one of dim / unobserved.
        unobserved: shape (k',), k' >= 2, statistics of never-inserted canaries (all iterates).
        fit: "unequal" (Andrew et al. 2024 Alg. 1-3) or "equal".
        bootstrap: number of bootstrap resamples B >= 0 (0: no interval).
        confidence: level of the percentile interval, in (0, 1).
        seed: seed of the numpy Generator used for resampling.

    Returns:
        AuditResult with value = eps (nats, finite), lower/upper = bootstrap percentiles (None when
        bootstrap = 0), n = k, method "two_gaussians_unequal" / "two_gaussians_equal",
        threat_model "final_model" / "all_iterates", delta, confidence (None without bootstrap),
        extras: mu_observed, sigma_observed, mu_null, sigma_null (cosine units), shift
        ((mu_obs - mu_null)/sigma_null), sd_ratio (sigma_obs/sigma_null), fit, k_unobserved,
        dim, bootstrap, bootstrap_dropped.

    Raises:
        ValueError: both or neither of dim / unobserved; NaN/inf, |cos| > 1, fewer than 2
            values, not 1-D, or not floating-point (booleans, integers, complex numbers and
            objects are rejected; tensors of any float dtype, with requires_grad, on any
            device, are converted); a sample with zero variance; delta not in (0, 1); dim < 2;
            fit not in {"unequal", "equal"};
            bootstrap not an integer >= 0; confidence not in (0, 1); seed not a non-negative
            integer; every bootstrap replicate degenerate;
            bootstrap > 0 with fewer than 3 values in a sample whose sd is fitted (see above).

    Source: Andrew et al. 2024 §3-4, Thm 3.3; docs/methods/canaries.md, A2-A5.
    """
    obs, d, unobs = _threat_inputs(observed, dim, unobserved, 2)
    dl = check_delta(delta)
    b = check_count(bootstrap, "bootstrap", minimum=0)
    conf = check_alpha(confidence, "confidence")
    sd = check_seed(seed)
    mu1, s1, mu0, s0 = _fit_pair(obs, d, unobs, fit)
    m, r = _standardize(mu1, s1, mu0, s0)
    value = _epsilon_standardized_scalar(m, r, dl)

    lower = upper = None
    dropped = 0
    if b > 0:
        _check_bootstrap_sizes(obs, unobs, fit)
        reps, dropped = _bootstrap_standardized(obs, d, unobs, fit, b, sd)
        if reps[0].size == 0:
            raise ValueError("every bootstrap replicate had zero variance")
        if fit == "equal":  # sd ratio 1: the pair is |shift|-GDP (Balle & Wang closed form)
            eps_b = gaussian_epsilon_array(np.abs(reps[0]), dl)
        else:
            eps_b = _epsilon_standardized_array(reps[0], reps[1], dl)
        q = (1.0 - conf) / 2.0
        lower, upper = (float(v) for v in np.quantile(eps_b, [q, 1.0 - q]))

    return AuditResult(
        value=value,
        lower=lower,
        upper=upper,
        alpha=1.0 - conf if b > 0 else None,
        delta=dl,
        method=f"two_gaussians_{fit}",
        source=SOURCE,
        counts={"n": int(obs.size)},
        details={
            "threat_model": "final_model" if d is not None else "all_iterates",
            "mu_observed": mu1,
            "sigma_observed": s1,
            "mu_null": mu0,
            "sigma_null": s0,
            "shift": m,
            "sd_ratio": r,
            "fit": fit,
            "dim": d,
            "k_unobserved": None if unobs is None else int(unobs.size),
            "bootstrap": b,
            "bootstrap_dropped": dropped,
        },
    )


def _check_bootstrap_sizes(obs: np.ndarray, unobs: np.ndarray | None, fit: str) -> None:
    """A fitted sd needs k >= 3 values to bootstrap (k = 2: every kept resample is the sample)."""
    sizes = [] if fit == "equal" else [("observed", obs.size)]
    if unobs is not None:
        sizes.append(("unobserved", unobs.size))
    for name, size in sizes:
        if size < 3:
            raise ValueError(
                f"bootstrap needs at least 3 {name} values when their sd is fitted, got {size}: "
                "with 2, every resample with a non-zero variance is the sample itself, so the "
                "interval would have zero width"
            )


class _Centred:
    """A sample prepared for resampled moments: the values, their mean and the centred values
    (computed once, however many blocks of resamples use them)."""

    __slots__ = ("x", "centre", "c", "spread")

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.centre = float(x.mean())
        self.c = x - self.centre
        self.spread = float(np.max(np.abs(self.c)))


def _resampled_mean_sd(x: _Centred, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd (ddof 1) of each resample ``x.x[idx[i]]``: ``idx`` ``[b, n]`` int -> two ``[b]``.

    One gather of the centred values and two reductions (sum, sum of squares): about 2.5x
    faster than ``x[idx].mean(1), x[idx].std(1, ddof=1)`` and equal to 1e-12 relative (the
    values are centred at the sample mean first, so the one-pass variance cancels nothing: a
    resample's mean of the centred values is O(sd / sqrt(n))). A resample whose sd comes out
    below 1e-6 of the values' spread (a one-pass residue could hide zero variance there) gets
    the two-pass ``std`` instead, so a degenerate resample is as exactly 0 as before."""
    n = idx.shape[1]
    s = x.c[idx]
    total = s.sum(axis=1)
    squares = np.einsum("ij,ij->i", s, s)
    sd = np.sqrt(np.maximum(squares - total * total / n, 0.0) / (n - 1))
    small = np.flatnonzero(sd <= 1e-6 * x.spread)
    if small.size:
        sd[small] = x.x[idx[small]].std(axis=1, ddof=1)
    return x.centre + total / n, sd


# The last bootstrap's resampled moments, keyed by a digest of its inputs: a report fits the
# same scores twice (fit "equal" and "unequal", same seed), and both fits' replicates come from
# the same resamples; :func:`share_resamples` puts several samples' moments here at once.
# Observationally pure: equal inputs give equal outputs with or without it.
_LAST_RESAMPLES: dict[bytes, tuple[np.ndarray, ...]] = {}
_LAST_LOCK = threading.Lock()
#: Indices of the unobserved sample drawn and reduced at a time (at least one resample; 1 MiB
#: of int64): small enough that the gathered values are summed while they are in the cache
#: (2 cores with 1 MiB of L2 each: 90 ms against 120 ms for blocks of 2^18 and ~160 ms for
#: the ~2M-index chunks, two samples of k' = 100,000, B = 200).
_BLOCK_INDICES = 1 << 17


def _resample_key(obs: np.ndarray, unobs: np.ndarray | None, b: int, seed: int) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    h.update(np.asarray([obs.size, -1 if unobs is None else unobs.size, b, seed], dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(obs, dtype=np.float64).tobytes())
    if unobs is not None:
        h.update(np.ascontiguousarray(unobs, dtype=np.float64).tobytes())
    return h.digest()


Moments = tuple[np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]


def _resample_moments(obs: np.ndarray, unobs: np.ndarray | None, b: int, seed: int) -> Moments:
    """``(mu1, s1, mu0, s0)``, each ``[b]``: mean and sd of b resamples with replacement of the
    observed and (when given) unobserved scores; ``mu0, s0`` None without unobserved scores.
    The kept result when there is one (``_LAST_RESAMPLES``), else :func:`_draw_moments`."""
    key = _resample_key(obs, unobs, b, seed)
    with _LAST_LOCK:
        hit = _LAST_RESAMPLES.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    out = _draw_moments([(obs, unobs)], b, seed)[0]
    with _LAST_LOCK:
        _LAST_RESAMPLES.clear()
        _LAST_RESAMPLES[key] = out
    return out


def share_resamples(
    samples: list[tuple[np.ndarray, np.ndarray | None]], bootstrap: int, seed: int
) -> None:
    """Draw the bootstrap resamples of several (observed, unobserved) samples of equal sizes
    once, and keep every sample's moments for :func:`estimate_epsilon_from_cosines`.

    A canary report bootstraps the final-model cosines and the max cosines with the same
    seed and, as both have k observed and k' unobserved canaries, the same resample indices:
    drawn once, the draw (~40% of the resampling cost at k' = 100,000) is shared. The estimates then
    read the kept moments; their values are those they have alone (the same draws, the same
    arithmetic). Samples whose sizes differ from the first one's are drawn on their own.

    Args:
        samples: ``(observed [k], unobserved [k'] or None)`` pairs of float64 arrays, as
            :func:`estimate_epsilon_from_cosines` will be called with them.
        bootstrap: B >= 1 resamples. seed: the estimates' seed.

    Raises:
        ValueError: bootstrap not an integer >= 1; seed not a non-negative integer.
    """
    b = check_count(bootstrap, "bootstrap", minimum=1)
    sd = check_seed(seed)
    kept: dict[bytes, tuple[np.ndarray, ...]] = {}
    groups: dict[tuple[int, int], list[tuple[bytes, np.ndarray, np.ndarray | None]]] = {}
    for obs, unobs in samples:
        key = _resample_key(obs, unobs, b, sd)
        shape = (obs.size, -1 if unobs is None else unobs.size)
        groups.setdefault(shape, []).append((key, obs, unobs))
    for members in groups.values():
        outs = _draw_moments([(o, u) for _, o, u in members], b, sd)
        kept.update((key, out) for (key, _, _), out in zip(members, outs, strict=True))
    with _LAST_LOCK:
        _LAST_RESAMPLES.clear()
        _LAST_RESAMPLES.update(kept)


#: Above this many unobserved-score draws (resamples x k'), the resampled mean and sd of the
#: unobserved scores come from their joint normal limit (:func:`_normal_limit_mean_sd`) instead
#: of index by index: k' = 100,000 and 200 resamples is 20M draws, ~90 ms of a report's
#: ~130 ms, for a term that carries about k / k' of the interval's variance.
EXACT_UNOBSERVED_DRAWS = 1 << 22


def _normal_limit_mean_sd(x: _Centred, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd (ddof 1) of resamples of ``x`` (size n) from their joint normal limit, one
    per row of the standard normal ``z`` ``[b, 2]``.

    A resample's mean and variance V (ddof 1) are, to first order, jointly normal around
    (mean, m2) with Var(mean) = m2 / n, Cov(mean, V) = m3 / n and Var(V) = (m4 - m2^2) / n
    (m_r: the sample's central moments with divisor n; the delta method, e.g. van der Vaart
    1998, Asymptotic Statistics, §3.3); the pair is drawn through the Cholesky factor of that
    covariance and sd = sqrt(max(V, 0)). A sample without spread gives exactly its mean and
    sd 0, as every index-by-index resample would."""
    n = x.c.size
    c2 = x.c * x.c  # products, not powers: ``c ** 3`` calls pow per element (~20x slower)
    m2, m3, m4 = float(np.mean(c2)), float(np.dot(c2, x.c)) / n, float(np.dot(c2, c2)) / n
    if m2 <= 0.0:
        return np.full(z.shape[0], x.centre), np.zeros(z.shape[0])
    sd_mean = math.sqrt(m2 / n)
    slope = (m3 / n) / sd_mean
    rest = math.sqrt(max((m4 - m2 * m2) / n - slope * slope, 0.0))
    var = m2 + slope * z[:, 0] + rest * z[:, 1]
    return x.centre + sd_mean * z[:, 0], np.sqrt(np.maximum(var, 0.0))


def _draw_moments(
    samples: list[tuple[np.ndarray, np.ndarray | None]], b: int, seed: int,
) -> list[Moments]:
    """:func:`_resample_moments` of samples of equal sizes, from one draw of the indices.

    The indices are drawn from ``numpy.random.default_rng(seed)`` in chunks of rows (at most
    ~2M indices a chunk: the observed sample's ``[rows, k]``, then the unobserved sample's
    ``[rows, k']``, the latter drawn and reduced :data:`_BLOCK_INDICES` at a time, which
    leaves the stream as one draw would): the draws, and so the replicates, are those of
    every earlier version for the same seed; no loop over resamples. Every sample is
    gathered with the same indices.

    Above :data:`EXACT_UNOBSERVED_DRAWS` unobserved draws (b k'), the observed sample is
    still resampled index by index (chunks of ~2M indices), and then the unobserved
    samples' resampled mean and sd are drawn from their joint normal limit
    (:func:`_normal_limit_mean_sd`) with one ``[b, 2]`` standard normal draw that every sample
    shares (so a sample's moments are those it has alone, as with shared indices)."""
    rng = np.random.default_rng(seed)
    k = samples[0][0].size
    unobs0 = samples[0][1]
    kk = 0 if unobs0 is None else unobs0.size
    limit = unobs0 is not None and b * kk > EXACT_UNOBSERVED_DRAWS
    obs_c = [_Centred(o) for o, _ in samples]
    un_c = [None if u is None else _Centred(u) for _, u in samples]
    chunk = max(1, int(2_000_000 // max(k + (0 if limit else kk), 1)))
    block = max(1, _BLOCK_INDICES // max(kk, 1))
    parts: list[list[list[np.ndarray]]] = [[[] for _ in range(4)] for _ in samples]
    done = 0
    while done < b:
        n = min(chunk, b - done)
        idx = rng.integers(0, k, size=(n, k))
        for part, oc in zip(parts, obs_c, strict=True):
            mu1, s1 = _resampled_mean_sd(oc, idx)
            part[0].append(mu1)
            part[1].append(s1)
        if unobs0 is not None and not limit:
            for start in range(0, n, block):
                idx = rng.integers(0, kk, size=(min(block, n - start), kk))
                for part, uc in zip(parts, un_c, strict=True):
                    assert uc is not None
                    mu0, s0 = _resampled_mean_sd(uc, idx)
                    part[2].append(mu0)
                    part[3].append(s0)
        done += n
    if limit:
        z = rng.standard_normal((b, 2))
        for part, uc in zip(parts, un_c, strict=True):
            assert uc is not None
            mu0, s0 = _normal_limit_mean_sd(uc, z)
            part[2].append(mu0)
            part[3].append(s0)
    outs: list[Moments] = []
    for part in parts:
        cols = [np.concatenate(col) if col else None for col in part]
        for arr in cols:
            if arr is not None:
                arr.flags.writeable = False  # shared with the next caller of the same inputs
        outs.append(tuple(cols))  # type: ignore[arg-type]
    return outs


def _bootstrap_standardized(
    obs: np.ndarray,
    dim: int | None,
    unobs: np.ndarray | None,
    fit: str,
    b: int,
    seed: int,
) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """Standardized (shift, sd ratio) of B resampled fits (:func:`_resample_moments`),
    degenerate replicates dropped."""
    mu1, s1, mu0, s0 = _resample_moments(obs, unobs, b, seed)
    if unobs is None:
        assert dim is not None
        mu0 = np.zeros(b)
        s0 = np.full(b, 1.0 / math.sqrt(dim))
    assert mu0 is not None and s0 is not None
    # a replicate with zero variance (up to a rounding residue, as in _sd) is degenerate
    tiny = 16.0 * np.finfo(float).eps
    ok = s0 > 0.0
    if unobs is not None:
        ok &= s0 > tiny * np.max(np.abs(unobs))
    if fit == "equal":
        s1 = s0
    else:
        ok &= s1 > tiny * np.max(np.abs(obs))
    m = (mu1[ok] - mu0[ok]) / s0[ok]
    r = s1[ok] / s0[ok]
    return (m, r), b - m.size
