"""The empirical epsilon0 test of a local randomizer (Matsumoto et al. Alg. 2, docs/methods/ldp.md, C2 / C3).

Game (Matsumoto et al. §4.1-4.3, Alg. 2): for each of K trials draw b in {1, 2} uniformly, release
M(g_b), guess 1 iff cos(M(g_b), g1) >= cos(M(g_b), g2) (eq. 4). Counts (Alg. 2): TN = b = 1
guessed 1, FP = b = 1 guessed 2, TP = b = 2 guessed 2, FN = b = 2 guessed 1; FPR = FP/(FP + TN),
FNR = FN/(FN + TP); eps_hat = max(log((1 - FPR)/FNR), log((1 - FNR)/FPR)) (eq. 3).
The statistics (point estimate capped at the ceiling when a rate is 0, the one-sided (1 - alpha)
lower bound from Clopper-Pearson upper bounds at alpha/2 per rate, the upper bound and the
ceiling) are computed by :func:`audit_callbacks.estimators.error_rates.epsilon_from_counts`,
whose module docstring states exactly how (and why the ceiling is 4.91 / 11.82 for 10^3 / 10^6 trials, not
the 5.6 / 12.5 of Matsumoto et al. §4.1, which :func:`paper_measurable_ceiling` reproduces).

Two paths, identical in distribution (tests/attacks/test_ldp_test.py checks it with KS and chi-square
tests):

* ``"batched"`` (any :class:`LocalRandomizer`): rows g_b stacked in batches [B, d], randomized
  by ``mechanism.randomize(rows, generator)`` (torch), both cosines computed per row. O(d) per
  trial.
* ``"fast"`` (LDP-SGD only, docs/methods/ldp.md, C3): the guess depends on the uniform direction v of
  LDP-SGD (C1) only through its coordinates in an orthonormal basis (e1, e2) of span(g1, g2)
  (Gram-Schmidt: e1 = u1 = g1/|g1|, e2 = (u2 - c u1)/s, c = <u1, u2>, s = |u2 - c u1|). They are
  (Z1, Z2)/sqrt(Z1^2 + Z2^2 + S), Z_i ~ N(0, 1), S ~ chi2(d - 2). When g2 = -k g1 (k > 0: the
  gradient-flip, collusion and dummy pairs) the span is one-dimensional: V1 = Z1/sqrt(Z1^2 + S),
  S ~ chi2(d - 1). With r_b = min(|g_b|, L) the LDP-SGD steps become
  sigma = +1 w.p. 1/2 + r_b/(2L) (z = sigma L u_b), rho = +1 w.p. e^eps0/(1 + e^eps0) (the
  randomized-response flip), output direction s v with s = rho sigma sgn<u_b, v>, and the
  released statistic cos(out, g1) - cos(out, g2) = s (<v, u1> - <v, u2>) =
  s ((1 - c) V1 - s V2). O(1) per trial, numpy, vectorised over chunks of trials. (The sign of
  the statistic does not depend on S, so the counts would not need it; S is drawn so that the
  statistic itself has the exact distribution.) Pairs with s <= 1e-9 are treated as exactly
  collinear (angle error below 1e-9 rad).

``path="auto"`` uses the fast path when the mechanism is LDP-SGD with the reference randomize:
an instance of ``audit_callbacks.mechanisms.LDPSGD`` whose class does not override
``randomize``, or (when that class is not importable, or for stand-ins) any object whose
``name == "ldp_sgd"`` with finite positive ``epsilon0`` and ``clip_norm`` attributes. Anything
else uses the batched path. A subclass that overrides ``randomize`` is therefore tested through
its own code.

Closed form for LDP-SGD (derived here, checked against both paths in the tests): with phi the
angle between g1 and g2 and t = tanh(eps0/2) (= 2p - 1),
    FPR = 1/2 - t (r1/L) phi/(2 pi),   FNR = 1/2 - t (r2/L) phi/(2 pi),
independent of d (P(sgn<a, v> = sgn<b, v>) = 1 - angle(a, b)/pi for uniform v). For the dummy
pair (r = L, phi = pi) FPR = FNR = 1/(1 + e^eps0) and eq. 3 equals eps0 (Matsumoto et al. Prop. 3.1);
for gradient flip with |g| < L it is 2 artanh(tanh(eps0/2) |g|/L) < eps0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from audit_callbacks.estimators import AuditResult, epsilon_from_error_rates
from audit_callbacks.estimators.error_rates import (
    GameStatistics,
    confusion_counts,
    epsilon_from_counts,
    measurable_ceiling,
    paper_measurable_ceiling,
)
from audit_callbacks.validation import (
    check_alpha,
    check_choice,
    check_count,
    check_optional_count,
    check_positive,
    check_seed,
    to_numpy,
)

__all__ = [
    "LDPTestResult",
    "PairGeometry",
    "ldp_epsilon_test",
    "ldp_sgd_error_rates",
    "ldp_sgd_test_epsilon",
    "ldp_test_statistics",
    "measurable_ceiling",
    "paper_measurable_ceiling",
    "supports_fast_path",
]

Path = Literal["auto", "fast", "batched"]

_COLLINEAR_TOL = 1e-9
_DEFAULT_CHUNK = 1 << 20
_BATCH_ELEMENTS = 1 << 24  # default batch: about 2^24 entries per [B, d] tensor


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairGeometry:
    """Geometry of (g1, g2) that the fast path and the closed form need (float64).

    Attributes:
        dim: d, number of entries of each vector.
        norm_g1, norm_g2: Euclidean norms (> 0).
        cosine: c = <u1, u2>, in [-1, 1].
        sine: |u2 - c u1| (the Gram-Schmidt residual), 0 when collinear.
        collinear: sine <= 1e-9 (then g2 = -k g1 with k > 0; positive collinearity is rejected).
    """

    dim: int
    norm_g1: float
    norm_g2: float
    cosine: float
    sine: float
    collinear: bool

    @property
    def angle(self) -> float:
        """phi in [0, pi], the angle between g1 and g2 (radians)."""
        return math.pi if self.collinear else math.atan2(self.sine, self.cosine)


class MechanismError(ValueError, TypeError):
    """A ``mechanism`` that cannot be run (a ValueError; also a TypeError, as it was before)."""


def _as_flat_tensor(g: Any, name: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """g as a flat floating tensor, without copying float32/float64 input (a tensor keeps its
    device; requires_grad is dropped; float16/bfloat16 and integers become float32)."""
    if isinstance(g, torch.Tensor):
        t = g.detach()
    else:
        arr = to_numpy(g, name)
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"{name} must be a tensor or array of real numbers, got {arr.dtype}")
        t = torch.from_numpy(arr if arr.dtype.kind == "f" else arr.astype(np.float32))
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {t.dtype}")
    if not t.is_floating_point() or t.dtype in (torch.float16, torch.bfloat16):
        t = t.to(torch.float32)
    return t.reshape(-1), tuple(t.shape)


_BLOCK = 1 << 21  # elements per float64 block of the geometry passes (16 MiB)


def _blocks(t1: torch.Tensor, t2: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, t1.numel(), _BLOCK):
        yield (
            t1[start : start + _BLOCK].to(torch.float64, copy=True),  # scaled in place below
            t2[start : start + _BLOCK].to(torch.float64, copy=True),
        )


def _geometry(t1: torch.Tensor, t2: torch.Tensor) -> tuple[float, float, float, float, bool]:
    """(|g1|, |g2|, c, s, identical) in float64 by blocks: no full-length copy of either input.

    Three passes: max |entry| (and the finiteness and equality checks), the scaled sums of
    squares and the dot product, then the Gram-Schmidt residual s = |u2 - c u1|.
    """
    m1 = m2 = 0.0
    identical = True
    for name, t in (("g1", t1), ("g2", t2)):
        for start in range(0, t.numel(), _BLOCK):
            if not bool(torch.isfinite(t[start : start + _BLOCK]).all()):
                raise ValueError(f"{name} contains NaN or inf")
    for b1, b2 in _blocks(t1, t2):
        m1 = max(m1, float(b1.abs().max()))
        m2 = max(m2, float(b2.abs().max()))
        identical = identical and bool(torch.equal(b1, b2))
    if m1 == 0.0 or m2 == 0.0:
        return m1, m2, 0.0, 0.0, identical
    s11 = s22 = s12 = 0.0
    for b1, b2 in _blocks(t1, t2):
        b1.div_(m1)
        b2.div_(m2)
        s11 += float(b1 @ b1)
        s22 += float(b2 @ b2)
        s12 += float(b1 @ b2)
    r1, r2 = math.sqrt(s11), math.sqrt(s22)
    c = min(1.0, max(-1.0, s12 / (r1 * r2)))
    n1, n2 = m1 * r1, m2 * r2
    res = 0.0
    for b1, b2 in _blocks(t1, t2):
        b2.div_(n2).sub_(b1.div_(n1), alpha=c)
        res += float(b2 @ b2)
    return n1, n2, c, math.sqrt(res), identical


def _check_pair(g1: Any, g2: Any) -> tuple[torch.Tensor, torch.Tensor, PairGeometry]:
    (t1, shape1), (t2, shape2) = _as_flat_tensor(g1, "g1"), _as_flat_tensor(g2, "g2")
    if shape1 != shape2:
        raise ValueError(f"g1 and g2 must have the same shape, got {shape1} and {shape2}")
    if t1.numel() == 0:
        raise ValueError("g1 and g2 are empty")
    if t1.dtype != t2.dtype:
        dt = torch.promote_types(t1.dtype, t2.dtype)
        t1, t2 = t1.to(dt), t2.to(dt)
    if t1.device != t2.device:
        raise ValueError(f"g1 and g2 are on different devices: {t1.device} and {t2.device}")
    n1, n2, c, s, identical = _geometry(t1, t2)
    if n1 == 0.0 or n2 == 0.0:
        raise ValueError(
            "g1 and g2 must be non-zero (LDP-SGD normalises x/|x|; the cosine "
            "of a zero vector is undefined)"
        )
    if identical:
        raise ValueError("g1 == g2: the two inputs are identical, there is nothing to distinguish")
    collinear = s <= _COLLINEAR_TOL
    if collinear and c > 0:
        raise ValueError(
            "g1 and g2 point in the same direction: cos(out, g1) = cos(out, g2) for "
            "every output, so the cosine test of eq. 4 cannot distinguish them"
        )
    if collinear:
        c, s = -1.0, 0.0
    geom = PairGeometry(
        dim=int(t1.numel()), norm_g1=n1, norm_g2=n2, cosine=c, sine=s, collinear=collinear
    )
    return t1, t2, geom


# --------------------------------------------------------------------------------------------
# Fast path (LDP-SGD, docs/methods/ldp.md, C3)
# --------------------------------------------------------------------------------------------


def _ldp_sgd_params(mechanism: Any) -> tuple[float, float] | None:
    eps0 = getattr(mechanism, "epsilon0", None)
    clip = getattr(mechanism, "clip_norm", None)
    try:
        e, c = float(eps0), float(clip)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(e) and e > 0 and math.isfinite(c) and c > 0):
        return None
    return e, c


def supports_fast_path(mechanism: Any) -> bool:
    """Whether ``path="auto"`` runs the exact O(1) LDP-SGD simulation for ``mechanism``.

    True for an ``audit_callbacks.mechanisms.LDPSGD`` instance whose class keeps LDPSGD's own
    ``randomize`` (a subclass overriding it is tested through its code), or, for objects that are
    not LDPSGD instances, ``name == "ldp_sgd"``; in both cases ``epsilon0`` and ``clip_norm`` must
    be finite and > 0.
    """
    try:
        from audit_callbacks.mechanisms import LDPSGD  # lazy: written alongside this module
    except ImportError:
        LDPSGD = None  # noqa: N806
    if LDPSGD is not None and isinstance(mechanism, LDPSGD):
        if getattr(type(mechanism), "randomize", None) is not LDPSGD.randomize:
            return False
    elif getattr(mechanism, "name", None) != "ldp_sgd":
        return False
    return _ldp_sgd_params(mechanism) is not None


def _p_rr(epsilon0: float) -> float:
    return 1.0 / (1.0 + math.exp(-epsilon0))


def _fast_chunks(
    geom: PairGeometry, epsilon0: float, clip_norm: float, trials: int, seed: int, chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (b_is_2 [m] bool, statistic [m] float64) per chunk; statistic = cos1 - cos2."""
    # two independent streams: S (whose gamma sampler consumes a d-dependent number of draws)
    # has its own, so the guesses (which do not depend on S) are the same for every d
    main_ss, aux_ss = np.random.SeedSequence(seed).spawn(2)
    rng, rng_s = np.random.default_rng(main_ss), np.random.default_rng(aux_ss)
    p = _p_rr(epsilon0)
    q1 = 0.5 + min(geom.norm_g1, clip_norm) / (2.0 * clip_norm)
    q2 = 0.5 + min(geom.norm_g2, clip_norm) / (2.0 * clip_norm)
    c, s, d = geom.cosine, geom.sine, geom.dim
    done = 0
    while done < trials:
        m = min(chunk, trials - done)
        b2 = rng.random(m) < 0.5
        z1 = rng.standard_normal(m)
        if geom.collinear:
            rest = rng_s.chisquare(d - 1, m) if d > 1 else np.zeros(m)
            v1 = z1 / np.sqrt(z1 * z1 + rest)
            proj_b = np.where(b2, -v1, v1)  # <u_b, v>, u2 = -u1
            diff = 2.0 * v1  # <v, u1 - u2>
        else:
            z2 = rng.standard_normal(m)
            rest = rng_s.chisquare(d - 2, m) if d > 2 else np.zeros(m)
            r = np.sqrt(z1 * z1 + z2 * z2 + rest)
            v1, v2 = z1 / r, z2 / r
            proj2 = c * v1 + s * v2
            proj_b = np.where(b2, proj2, v1)
            diff = v1 - proj2
        sigma = np.where(rng.random(m) < np.where(b2, q2, q1), 1.0, -1.0)
        rho = np.where(rng.random(m) < p, 1.0, -1.0)
        sign = np.where(proj_b >= 0.0, 1.0, -1.0)
        yield b2, sigma * rho * sign * diff
        done += m


# --------------------------------------------------------------------------------------------
# Batched path (any LocalRandomizer)
# --------------------------------------------------------------------------------------------


def _batched_chunks(
    mechanism: Any, t1: torch.Tensor, t2: torch.Tensor, trials: int, seed: int, batch: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    device = t1.device
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    d = t1.numel()
    units: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    done = 0
    while done < trials:
        m = min(batch, trials - done)
        b2 = torch.rand(m, generator=gen, device=device) < 0.5
        rows = torch.where(b2[:, None], t2[None, :], t1[None, :])
        with torch.no_grad():
            out = mechanism.randomize(rows, generator=gen)
        del rows
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, d):
            raise ValueError(
                f"mechanism.randomize returned shape "
                f"{getattr(out, 'shape', type(out))}, expected {(m, d)}"
            )
        if not out.is_floating_point():
            out = out.to(t1.dtype)
        if units is None or units[0].dtype != out.dtype:
            # the inputs themselves when the dtypes agree (no [d, 2] copy); cos = <out, g>/|g|
            v1, v2 = (t if t.dtype == out.dtype else t.to(out.dtype) for t in (t1, t2))
            units = (v1, v2, torch.stack([v1.norm(), v2.norm()]))
        norm_out = torch.linalg.vector_norm(out, dim=1)  # inf/NaN iff a row has inf/NaN
        if not bool(torch.isfinite(norm_out).all()):
            raise ValueError("mechanism.randomize returned NaN or inf")
        dots = torch.stack([out @ units[0], out @ units[1]], dim=1) / units[2]
        cos = dots / norm_out.clamp_min(torch.finfo(out.dtype).tiny)[:, None]
        del out, dots
        yield b2.cpu().numpy(), (cos[:, 0] - cos[:, 1]).to("cpu", torch.float64).numpy()
        done += m


def _default_batch(d: int) -> int:
    return int(max(1, min(4096, _BATCH_ELEMENTS // max(d, 1))))


def _resolve_path(mechanism: Any, path: str) -> str:
    check_choice(path, "path", ("auto", "fast", "batched"))
    if path == "auto" and supports_fast_path(mechanism):
        return "fast"
    if path == "fast":
        if _ldp_sgd_params(mechanism) is None:
            raise ValueError(
                "path='fast' simulates LDP-SGD exactly and needs a mechanism with "
                "finite positive epsilon0 and clip_norm attributes"
            )
        return "fast"
    if not callable(getattr(mechanism, "randomize", None)):
        raise MechanismError(
            f"mechanism must have randomize(x, generator) for the batched path, got "
            f"{type(mechanism).__name__}"
        )
    return "batched"


def _chunks(
    mechanism: Any,
    t1: torch.Tensor,
    t2: torch.Tensor,
    geom: PairGeometry,
    trials: int,
    seed: int,
    method: str,
    batch_size: int | None,
    chunk_size: int,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    if method == "fast":
        params = _ldp_sgd_params(mechanism)
        assert params is not None
        return _fast_chunks(geom, params[0], params[1], trials, seed, chunk_size)
    batch = _default_batch(geom.dim) if batch_size is None else batch_size
    return _batched_chunks(mechanism, t1, t2, trials, seed, batch)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LDPTestResult(GameStatistics):
    """Outcome of :func:`ldp_epsilon_test` (Matsumoto et al. Alg. 2; docs/methods/ldp.md, C2).

    Attributes:
        tp, fn, fp, tn: counts (TP = b = 2 guessed 2, FN = b = 2 guessed 1, FP = b = 1 guessed
            2, TN = b = 1 guessed 1).
        fpr, fnr: FP/(FP + TN), FN/(FN + TP); ``None`` if that group had no trial.
        epsilon: eq. 3 point estimate (nats); when a rate is 0 it is infinite and reported as
            ``ceiling`` with ``epsilon_capped = True``; never NaN or inf.
        epsilon_capped: see ``epsilon``.
        epsilon_lower_bound: one-sided (1 - alpha) lower bound on the mechanism's epsilon
            (Clopper-Pearson upper bounds on FPR and FNR at alpha/2 each, union bound).
        epsilon_upper_bound: one-sided (1 - alpha) upper bound on this game's eq.-3 value (not on
            the mechanism's epsilon); ``math.inf`` when FP = 0 or FN = 0.
        ceiling: the largest lower bound these group sizes allow (zero errors).
        trials: K.
        alpha: significance level.
        method: ``"fast"`` or ``"batched"``.
        mechanism: the mechanism's ``name`` (or class name).
        claimed_epsilon: ``mechanism.epsilon_for_dim(dim)`` when available (else its
            ``epsilon0``, else ``None``): what the mechanism claims for one whole-row release.
        expected_epsilon: eq. 3 at the closed-form LDP-SGD rates (:func:`ldp_sgd_error_rates`)
            when the mechanism is LDP-SGD, else ``None``.
        dim, norm_g1, norm_g2, cosine_g1_g2: geometry of the pair.
        seed: the seed used; elapsed_s: wall time of the trials (seconds).
    """

    trials: int
    alpha: float
    method: str
    mechanism: str
    claimed_epsilon: float | None
    expected_epsilon: float | None
    dim: int
    norm_g1: float
    norm_g2: float
    cosine_g1_g2: float
    seed: int
    elapsed_s: float

    @property
    def trials_per_second(self) -> float:
        return self.trials / self.elapsed_s if self.elapsed_s > 0 else math.inf

    def to_estimate(self) -> AuditResult:
        """As an :class:`~audit_callbacks.estimators.AuditResult` (threat model ``"local"``,
        delta 0).

        ``value`` = ``epsilon``; ``lower`` = ``epsilon_lower_bound``; ``upper`` =
        ``epsilon_upper_bound`` or ``None`` when infinite. Each end is a one-sided (1 - alpha)
        bound, so the result's ``alpha`` is 2 alpha (alpha when ``upper`` is ``None``);
        ``details["lower_confidence"]`` = 1 - alpha. The other fields go to ``details``.
        """
        return self._game_estimate(
            n=self.trials,
            alpha=self.alpha,
            method=f"ldp_test_{self.method}",
            threat_model="local",
            source="Matsumoto et al., the empirical epsilon0 test of a local randomizer, §4.1-4.3, "
                   "Alg. 2, eq. (3)",
            paper_ceiling=paper_measurable_ceiling(self.trials, self.alpha),
        )


def ldp_sgd_error_rates(epsilon0: float, clip_norm: float, g1: Any, g2: Any) -> tuple[float, float]:
    """Closed-form (FPR, FNR) of the cosine test of eq. 4 against LDP-SGD (docs/methods/ldp.md, C1).

    FPR = 1/2 - tanh(eps0/2) (min(|g1|, L)/L) phi/(2 pi), FNR likewise with g2, phi = angle
    between g1 and g2 (module docstring). Independent of d.

    Args:
        epsilon0: > 0 (nats). clip_norm: L > 0.
        g1, g2: [d] tensors/arrays (same shape, finite, non-zero, not positively collinear).

    Raises:
        ValueError: epsilon0 or clip_norm not finite > 0; g1, g2 as :func:`ldp_epsilon_test`.
    """
    e = check_positive(epsilon0, "epsilon0")
    L = check_positive(clip_norm, "clip_norm")
    _, _, geom = _check_pair(g1, g2)
    return _closed_form_rates(geom, e, L)


def _closed_form_rates(geom: PairGeometry, e: float, L: float) -> tuple[float, float]:
    t = math.tanh(e / 2.0) * geom.angle / (2.0 * math.pi)
    return (0.5 - t * min(geom.norm_g1, L) / L, 0.5 - t * min(geom.norm_g2, L) / L)


def ldp_sgd_test_epsilon(epsilon0: float, clip_norm: float, g1: Any, g2: Any) -> float:
    """eq. 3 of Matsumoto et al. at the closed-form rates of :func:`ldp_sgd_error_rates` (nats).

    What the test converges to for this pair against LDP-SGD: eps0 for the dummy pair (and any
    g2 = -k g1 with |g1|, |g2| >= L), 2 artanh(tanh(eps0/2) |g|/L) for gradient flip with
    |g| < L.

    Raises:
        ValueError: as :func:`ldp_sgd_error_rates`.
    """
    fpr, fnr = ldp_sgd_error_rates(epsilon0, clip_norm, g1, g2)
    return float(epsilon_from_error_rates(fpr, fnr))


def _mechanism_name(mechanism: Any) -> str:
    name = getattr(mechanism, "name", None)
    return str(name) if name is not None else type(mechanism).__name__


def _claimed_epsilon(mechanism: Any, d: int) -> float | None:
    fn = getattr(mechanism, "epsilon_for_dim", None)
    try:
        v = float(fn(d)) if callable(fn) else float(mechanism.epsilon0)
    except Exception:  # noqa: BLE001 - optional metadata only
        return None
    return v


def ldp_test_statistics(
    mechanism: Any,
    g1: Any,
    g2: Any,
    *,
    trials: int,
    seed: int = 0,
    path: Path = "auto",
    batch_size: int | None = None,
    chunk_size: int = _DEFAULT_CHUNK,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-trial (b, cos(out, g1) - cos(out, g2)) of the game, for diagnostics and tests.

    Same randomness as :func:`ldp_epsilon_test` with the same arguments (the guess is 1 iff the
    statistic is >= 0).

    Returns:
        (b [trials] int8 in {1, 2}, statistic [trials] float64 in [-2, 2]).

    Raises:
        as :func:`ldp_epsilon_test`.
    """
    k = check_count(trials, "trials", minimum=1)
    sd = check_seed(seed)
    t1, t2, geom = _check_pair(g1, g2)
    method = _resolve_path(mechanism, path)
    bs = check_optional_count(batch_size, "batch_size", minimum=1)
    cs = check_count(chunk_size, "chunk_size", minimum=1)
    bs_list, st_list = [], []
    for b2, stat in _chunks(mechanism, t1, t2, geom, k, sd, method, bs, cs):
        bs_list.append(np.where(b2, 2, 1).astype(np.int8))
        st_list.append(stat)
    return np.concatenate(bs_list), np.concatenate(st_list)


def ldp_epsilon_test(
    mechanism: Any,
    g1: Any,
    g2: Any,
    *,
    trials: int,
    alpha: float = 0.05,
    seed: int = 0,
    batch_size: int | None = None,
    path: Path = "auto",
    chunk_size: int = _DEFAULT_CHUNK,
) -> LDPTestResult:
    """Empirical epsilon0 of a local randomizer from K trials of the game of Matsumoto et al. Alg. 2.

    Args:
        mechanism: a ``LocalRandomizer`` (``randomize(x [B, d], generator) -> [B, d]``); for the
            fast path, LDP-SGD with ``epsilon0`` and ``clip_norm`` (see module docstring).
        g1, g2: the crafted pair, tensors or arrays of the same shape (flattened to [d]); finite,
            non-zero, not identical and not pointing in the same direction.
        trials: K >= 1.
        alpha: in (0, 1); the lower bound is one-sided 1 - alpha (alpha/2 per rate).
        seed: seeds ``numpy.random.SeedSequence`` (fast path) or a ``torch.Generator`` on the
            device of g1 (batched path: b and the mechanism's randomness).
        batch_size: rows per ``randomize`` call on the batched path (default: about 2^24 / d,
            at most 4096).
        path: ``"auto"`` (fast for LDP-SGD, else batched), ``"fast"`` or ``"batched"``.
        chunk_size: trials per vectorised chunk on the fast path.

    Returns:
        :class:`LDPTestResult` (``to_estimate()`` for an :class:`~audit_callbacks.estimators.AuditResult`).

    Memory: g1 and g2 are used in place (float32 stays float32; float16/bfloat16 and integer
    input become float32, tensors keep their device); the geometry is computed in float64
    blocks of 2^21 entries, so the test itself adds no full-length copy of either input (the
    batched path holds one [B, d] batch of rows and the mechanism's own working memory).

    Raises:
        ValueError: trials < 1 or not an integer, alpha not in (0, 1), seed not a non-negative
            integer, shape mismatch, empty, NaN/inf, boolean or complex, zero, identical or
            positively collinear g1/g2, ``path`` unknown, ``path="fast"`` without LDP-SGD
            parameters, a mechanism returning the wrong shape or NaN, ``mechanism`` without a
            callable ``randomize`` on the batched path (:class:`MechanismError`, also a
            TypeError).

    Source: Matsumoto et al. Alg. 2, eqs. 3-4, §4.1; docs/methods/ldp.md, C2-C3.
    """
    k = check_count(trials, "trials", minimum=1)
    a = check_alpha(alpha)
    sd = check_seed(seed)
    t1, t2, geom = _check_pair(g1, g2)
    method = _resolve_path(mechanism, path)
    bs = check_optional_count(batch_size, "batch_size", minimum=1)
    cs = check_count(chunk_size, "chunk_size", minimum=1)
    tally = np.zeros(4, dtype=np.int64)  # tp, fn, fp, tn
    start = time.perf_counter()
    for b2, stat in _chunks(mechanism, t1, t2, geom, k, sd, method, bs, cs):
        tally += confusion_counts(b2, stat < 0.0)  # guess 1 iff the statistic is >= 0 (eq. 4)
    elapsed = time.perf_counter() - start
    ce = epsilon_from_counts(*(int(c) for c in tally), a)
    params = _ldp_sgd_params(mechanism) if supports_fast_path(mechanism) else None
    expected = (
        float(epsilon_from_error_rates(*_closed_form_rates(geom, *params)))
        if params is not None
        else None
    )
    return LDPTestResult(
        **ce.game_fields(),
        trials=k,
        alpha=a,
        method=method,
        mechanism=_mechanism_name(mechanism),
        claimed_epsilon=_claimed_epsilon(mechanism, geom.dim),
        expected_epsilon=expected,
        dim=geom.dim,
        norm_g1=geom.norm_g1,
        norm_g2=geom.norm_g2,
        cosine_g1_g2=geom.cosine,
        seed=sd,
        elapsed_s=elapsed,
    )
