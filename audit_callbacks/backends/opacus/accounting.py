"""The analytic epsilon of a DP-SGD canary from the accountant's history: RDP (Mironov et al.,
2019) and PRV (Gopi et al., NeurIPS 2021) through Opacus' own accountants.

The PRV epsilon beside a run's own accountant (:func:`analytic_epsilons`) has a cost bound: its
discretization grid holds ``2 L / mesh`` points, with L the domain's RDP bound (growing with
epsilon) and the mesh ``eps_error / sqrt(T log(12 / delta_error) / 2)`` (shrinking with the
steps T), about 80 bytes and a few nanoseconds of FFT per point. Past ``max_prv_points``
(default :data:`PRV_MAX_POINTS`) the PRV epsilon is skipped, with a status
(:func:`prv_epsilon_status`), and the RDP one stands; below it the number is Opacus' own, bit
for bit. After each PRV computation the FFT plans it left in scipy's plan cache (up to 16 plans
of the grid's length, ~80 MB each at 3,000 steps) are evicted, so memory stays flat over
periodic estimates."""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import functools
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from opacus.accountants import IAccountant, PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV
from opacus.accountants.analysis.prv import domain as prv_domain
from scipy import fft as sp_fft

#: The largest PRV discretization grid :func:`analytic_epsilons` computes (points; ~80 bytes
#: each at the peak, ~330 MiB and a few seconds at this size). A DP-SGD run at q = 0.125,
#: z = 1 passes it after ~4,500 steps (epsilon ~ 90); runs of a few epochs at epsilon < 10 stay
#: far below (~5 * 10^5 points at 10^4 steps, q = 0.01).
PRV_MAX_POINTS = 2**22


@functools.lru_cache(maxsize=64)
def _rdp_one_step(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    out = rdp_analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders))
    out.setflags(write=False)
    return out


def rdp_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Opacus ``RDPAccountant(history).get_epsilon(delta)``, bit for bit, at a fraction of the cost.

    RDP composes additively and Opacus computes ``compute_rdp(q, sigma, steps) = steps *
    rdp(q, sigma)``; the per-step vector over the accountant's default orders (the expensive
    part: fractional orders are series sums, ~0.3 s) is cached per ``(q, sigma)``, so logging
    the accountant's epsilon every epoch costs microseconds after the first call.

    Args:
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]`` (Opacus' ``history``).
        delta: target delta in (0, 1).

    Returns:
        epsilon (0.0 for an empty history, as Opacus).
    """
    if not history:
        return 0.0
    orders = tuple(RDPAccountant.DEFAULT_ALPHAS)
    rdp = sum([_rdp_one_step(float(q), float(nm), orders) * steps for nm, q, steps in history])
    eps, _ = rdp_analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


class _CachedRDPAccountant(RDPAccountant):
    """Opacus' ``RDPAccountant`` whose ``get_epsilon`` at the default orders goes through the
    cached :func:`rdp_epsilon` (the same number, bit for bit); other orders: Opacus' own."""

    def get_epsilon(self, delta: float, alphas: Any = None, **kwargs: Any) -> float:
        if alphas is None:
            return rdp_epsilon(self.history, delta)
        return super().get_epsilon(delta, alphas, **kwargs)


_PRV_DOMAIN_LOCK = threading.RLock()


def _prv_epsilon(accountant: IAccountant, delta: float) -> float:
    """``accountant.get_epsilon(delta=delta)`` of a ``PRVAccountant``, unchanged, except that
    the two RDP epsilons Opacus' ``compute_safe_domain_size`` takes to size the PRV's domain
    (Gopi et al. 2021, Remark 5.6) go through the cached :func:`rdp_epsilon`: equal bit for
    bit, and 43-52 -> 17-26 ms at the histories of a 1-3 epoch CIFAR-sized run (the per-step
    RDP over Opacus' default orders is a series sum for the fractional ones, which Opacus
    recomputes at every call). The domain module's ``RDPAccountant`` name is swapped for the
    duration of the call, under a (re-entrant) lock, and put back even when the accountant
    raises; a concurrent PRV computation elsewhere would see the cached subclass, whose
    answers are Opacus' own. The FFT plans the computation cached are evicted afterwards
    (:func:`_release_fft_plans`)."""
    with _PRV_DOMAIN_LOCK:
        own = prv_domain.RDPAccountant
        prv_domain.RDPAccountant = _CachedRDPAccountant
        try:
            return float(accountant.get_epsilon(delta=delta))
        finally:
            prv_domain.RDPAccountant = own
            _release_fft_plans()


def _load_malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def _release_fft_plans() -> None:
    """Evict the large FFT plans a PRV computation leaves behind.

    scipy's pocketfft keeps the 16 most recent plans per kind (``rfft``/``irfft`` of float64 share
    one cache); a plan for a grid length with a large prime factor (Bluestein) holds several
    complex arrays of twice the grid's length, ~80 MB at a 3,000-step history, and a growing
    history asks for a new length at every estimate: RSS grew by ~0.9 GiB over ten estimates
    up to 3,000 steps. Sixteen tiny transforms push them out; glibc's ``malloc_trim`` then hands
    the freed pages back (where there is one). Microseconds."""
    for n in range(2, 2 + 2 * 17, 2):
        sp_fft.irfft(sp_fft.rfft(np.zeros(n)), n)
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def prv_grid_points(history: Sequence[tuple[float, float, int]], delta: float,
                    eps_error: float = 0.01) -> int:
    """The number of points of the grid Opacus' ``PRVAccountant.get_epsilon(delta)`` would
    discretize ``history`` on (its ``_get_domain``, the domain's RDP bound through the cached
    :func:`rdp_epsilon`), without discretizing: milliseconds. 0 for an empty history.

    Raises:
        ValueError, RuntimeError, OverflowError: where Opacus' own domain computation does.
    """
    if not history:
        return 0
    history = [tuple(h) for h in history]
    prvs = [PoissonSubsampledGaussianPRV(float(q), float(nm)) for nm, q, _ in history]
    with _PRV_DOMAIN_LOCK:
        own = prv_domain.RDPAccountant
        prv_domain.RDPAccountant = _CachedRDPAccountant
        try:
            domain = PRVAccountant()._get_domain(
                prvs=prvs, num_self_compositions=[int(s) for _, _, s in history],
                eps_error=eps_error, delta_error=delta / 1000,
            )
        finally:
            prv_domain.RDPAccountant = own
    return int(domain.size)


def prv_epsilon_status(history: Sequence[tuple[float, float, int]], delta: float,
                       max_prv_points: int | None = PRV_MAX_POINTS) -> str:
    """``"ok"`` where :func:`analytic_epsilons` computes the PRV epsilon of ``history`` at
    ``delta``, else ``"skipped: ..."`` naming the grid's size and the bound (or the reason the
    domain cannot be sized). ``max_prv_points=None``: no bound."""
    if not history:
        return "skipped: no steps yet"
    try:
        points = prv_grid_points(history, delta)
    except (ValueError, RuntimeError, OverflowError, ZeroDivisionError, FloatingPointError) as err:
        return f"skipped: the PRV domain cannot be sized ({err})"
    if max_prv_points is not None and points > max_prv_points:
        steps = sum(int(s) for _, _, s in history)
        return (f"skipped: the PRV grid of {steps} steps would hold {points} points, over the "
                f"bound of {max_prv_points} (memory ~{math.ceil(points * 80 / 2**20)} MiB): the "
                "RDP epsilon stands")
    return "ok"


def accountant_epsilon(accountant: IAccountant | None, delta: float) -> float | None:
    """The accountant's epsilon at ``delta`` (None if unknown or not finite); RDP accountants
    go through the cached :func:`rdp_epsilon`, Opacus' PRV accountant through
    :func:`_prv_epsilon` (its domain's RDP bound cached), others through ``get_epsilon``."""
    if accountant is None or not getattr(accountant, "history", None):
        return None
    try:
        if type(accountant) is RDPAccountant:
            eps = rdp_epsilon(accountant.history, delta)
        elif type(accountant) is PRVAccountant:
            eps = _prv_epsilon(accountant, delta)
        else:
            eps = float(accountant.get_epsilon(delta=delta))
    except (ValueError, RuntimeError, OverflowError, ZeroDivisionError, FloatingPointError):
        return None
    return eps if np.isfinite(eps) else None


def run_claim(accountant: IAccountant | None, history: Sequence[tuple[float, float, int]],
              delta: float) -> tuple[dict[str, float | None], float | None]:
    """A DP-SGD run's claim: the epsilon ``accountant``'s kind gives for ``history``, with
    :func:`analytic_epsilons` beside it; the one function behind both the run's claim
    (``OpacusBackend.analytic``) and the audit plan's (``audit_callbacks.auditing.plan``), so
    the two cannot differ.

    The run's own accountant's epsilon is computed whatever its cost (the PRV epsilon has no
    cost bound for a PRV run; beside an RDP run it has :data:`PRV_MAX_POINTS`). Opacus' RDP and
    PRV accountants: the matching value of :func:`analytic_epsilons`; another accountant: a copy
    of it holding ``history`` (:func:`accountant_epsilon`); none, or no value: the RDP epsilon.

    Args:
        accountant: the run's accountant (only its kind and, for other kinds, a copy are used).
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]`` (Opacus' ``history``).
        delta: target delta in (0, 1).

    Returns:
        ``(analytic_epsilons(history, ...), claim)``; the claim None only where the RDP
        epsilon is.
    """
    bound = None if isinstance(accountant, PRVAccountant) else PRV_MAX_POINTS
    out = analytic_epsilons(history, delta, max_prv_points=bound)
    same = {RDPAccountant: "rdp", PRVAccountant: "prv"}.get(type(accountant))
    own = out[same] if same is not None else None
    if same is None and accountant is not None and history:
        shadow = copy.copy(accountant)
        shadow.history = [tuple(h) for h in history]
        own = accountant_epsilon(shadow, delta)
    return out, (out["rdp"] if own is None else own)


def analytic_epsilons(history: Sequence[tuple[float, float, int]], delta: float, *,
                      max_prv_points: int | None = PRV_MAX_POINTS) -> dict[str, float | None]:
    """Epsilon of a DP-SGD run from its accountant history, with Opacus' RDP and PRV accountants.

    Args:
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]`` as kept by Opacus'
            accountants (``accountant.history``).
        delta: target delta in (0, 1).
        max_prv_points: the cost bound of the PRV epsilon: past a grid of this many points
            (:func:`prv_grid_points`) it is skipped (None, with :func:`prv_epsilon_status`
            saying why); None: no bound.

    Returns:
        ``{"rdp": eps, "prv": eps}``; None where the accountant cannot answer (no steps yet, or
        the PRV accountant's numerical domain is exceeded) or the PRV grid is over the bound.
        Computed once per history, delta and bound (cached): a report and the summary at fit end
        ask for the same history.

    Source: Opacus' ``RDPAccountant`` and ``PRVAccountant`` (epsilon(delta) after t steps at rate q).
    """
    if not history:
        return {"rdp": None, "prv": None}
    bound = None if max_prv_points is None else int(max_prv_points)
    rdp, prv = _analytic_epsilons(tuple(tuple(h) for h in history), float(delta), bound)
    return {"rdp": rdp, "prv": prv}


@functools.lru_cache(maxsize=32)
def _analytic_epsilons(history: tuple[tuple[float, float, int], ...], delta: float,
                       max_prv_points: int | None = PRV_MAX_POINTS) -> tuple[float | None, float | None]:
    """(RDP, PRV) epsilons of ``history`` at ``delta``, cached: the PRV accountant's epsilon
    costs ~0.2-3 s, and a report and the summary at fit end ask for the same history. The PRV
    one is None past ``max_prv_points`` (see :func:`prv_epsilon_status`)."""
    out = []
    for cls in (RDPAccountant, PRVAccountant):
        if cls is PRVAccountant and prv_epsilon_status(history, delta, max_prv_points) != "ok":
            out.append(None)
            continue
        acc = cls()
        acc.history = list(history)
        out.append(accountant_epsilon(acc, delta))
    return out[0], out[1]
