"""eps_lo: a high-confidence lower bound on epsilon from canary cosines (Andrew et al. 2024 §5.1).

For a threshold tau the test "member iff t > tau" has
    FNR(tau) = P(observed <= tau),  FPR(tau) = P(null > tau),
and any (eps, delta)-DP mechanism forces FPR + e^eps FNR >= 1 - delta and
FNR + e^eps FPR >= 1 - delta. With upper confidence bounds FNR_hi, FPR_hi:
    eps_lo(tau) = max(log((1 - delta - FPR_hi)/FNR_hi), log((1 - delta - FNR_hi)/FPR_hi)),
floored at 0. FNR_hi is the one-sided Jeffreys bound Beta(fn + 1/2, k - fn + 1/2).ppf(1 - alpha)
on the observed count fn = #{observed <= tau}. FPR is the exact null survival function of
docs/methods/canaries.md, A1 (final model, ``dim`` given) or the Jeffreys bound on #{unobserved > tau} (all
iterates, ``unobserved`` given).

Two ways of choosing tau:

* ``threshold="max"`` (Andrew et al. 2024 §5.1, docs/methods/canaries.md, A6 as written): the maximum of eps_lo(tau) over
  every candidate tau (the observed values, plus the unobserved values when given). The
  per-threshold bounds hold at 1 - alpha each, but their maximum is selected on the same data,
  so the nominal confidence is not guaranteed. Measured (1000 simulated Gaussian mechanisms,
  dim 1e4, delta 1e-5, alpha 0.05, final model): the bound exceeds the true eps in 3% of runs
  at true eps 2 (k = 500) but in 7% at eps 1, 13% at eps 0.5 and 22% at eps 0.25; see
  tests/estimators/test_estimators_lower_bound.py for the full table.
* ``threshold="heldout"``: observed (and unobserved) are split at random into two halves
  (``numpy.random.default_rng(seed)``); tau maximises eps_lo on the first half and the bound is
  evaluated with the second half's counts at that single tau. The second half is independent
  of tau, so the 1 - alpha guarantee of the interval applies (up to Jeffreys' approximate
  coverage). Uses half the data, so it is smaller.

All iterates: each direction of eps_lo uses both FNR_hi and FPR_hi, so with alpha applied to
each bound the union bound gives only 1 - 2 alpha; Andrew et al. 2024 and docs/methods/canaries.md, A6 use alpha for each,
and so does this module.

Finiteness: with the exact null, eps_lo has no log(k) cap (FPR may be tiny); thresholds are
clipped to the largest double below 1 so log FPR stays finite, which caps eps_lo at
-log sf(1 - 2^-53; dim) (about 18 * dim, astronomically large). The result is always finite.

Runtime: one sort per sample and searchsorted over the candidate thresholds, O(k log k); the
Jeffreys quantiles and the null's tail are evaluated exactly only at a grid of about 2 10^4
thresholds and at those whose upper bound (from the monotonicity of both rates in tau) can
reach the best of them (:meth:`_Side.best`), so k = 10^7 takes seconds; the result is the one
the full evaluation gives, bit for bit.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betaincinv

from ..validation import check_alpha, check_choice, check_delta, check_seed
from .canary_epsilon import _threat_inputs
from .cosine_null import logsf_unchecked
from .gaussian import log_sub
from .result import AuditResult

#: The source of eps_lo, in every result.
SOURCE = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical Privacy "
          "Estimation for Federated Learning, ICLR 2024, §5.1 (Clopper-Pearson intervals on "
          "FPR and FNR)")

__all__ = ["estimate_epsilon_lower_bound_from_cosines"]

Threshold = Literal["max", "heldout"]

_T_MAX = float(np.nextafter(1.0, 0.0))


def _log_jeffreys_upper(count: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(log U, log(1 - U)), U = Beta(count + 1/2, n - count + 1/2).ppf(1 - alpha) (docs/methods/canaries.md, A6).

    1 - U is computed as Beta(n - count + 1/2, count + 1/2).ppf(alpha), without cancellation.
    Evaluated once per distinct count (never as a table over all 0..n).
    """
    uniq, inv = np.unique(np.asarray(count, dtype=np.intp), return_inverse=True)
    c = uniq.astype(float)
    u = betaincinv(c + 0.5, n - c + 0.5, 1.0 - alpha)
    one_m_u = betaincinv(n - c + 0.5, c + 0.5, alpha)
    with np.errstate(divide="ignore"):
        lu, l1mu = np.log(u), np.log(one_m_u)
    shape = np.shape(count)
    return lu[inv].reshape(shape), l1mu[inv].reshape(shape)


def _bracket_grid(n: int, dense: int = 2048, geometric: int = 8192) -> np.ndarray:
    """Sorted indices 0..n-1: every index near both ends, geometrically spaced in between."""
    if n <= 2 * dense + 2 * geometric:
        return np.arange(n)
    steps = np.unique(np.geomspace(dense, n - 1, geometric).astype(np.int64))
    head = np.arange(dense)
    return np.unique(np.concatenate([head, steps, n - 1 - head, n - 1 - steps]))


class _Side:
    """Counts and error-rate bounds of one sample (observed or null) at arbitrary taus."""

    def __init__(
        self,
        obs: np.ndarray,
        dim: int | None,
        unobs: np.ndarray | None,
        alpha: float,
    ) -> None:
        self.obs = np.sort(obs)
        self.k = self.obs.size
        self.dim = dim
        self.unobs = None if unobs is None else np.sort(unobs)
        self.m = 0 if unobs is None else unobs.size
        self.alpha = alpha

    def candidates(self) -> np.ndarray:
        t = self.obs if self.unobs is None else np.concatenate([self.obs, self.unobs])
        return np.unique(t)

    def bound(self, taus: np.ndarray, delta: float) -> dict[str, np.ndarray]:
        """eps_lo(tau) for each tau, with the rates behind it (vectorised)."""
        taus = np.minimum(np.asarray(taus, dtype=float), _T_MAX)
        fn = np.searchsorted(self.obs, taus, side="right")
        log_fnr_hi, log_1m_fnr_hi = _log_jeffreys_upper(fn, self.k, self.alpha)
        if self.unobs is None:
            assert self.dim is not None
            fp = None
            log_fpr_hi = logsf_unchecked(taus, self.dim)  # exact: no confidence bound needed
            log_1m_fpr_hi = logsf_unchecked(-taus, self.dim)
        else:
            fp = self.m - np.searchsorted(self.unobs, taus, side="right")
            log_fpr_hi, log_1m_fpr_hi = _log_jeffreys_upper(fp, self.m, self.alpha)
        log_delta = math.log(delta)
        e1 = log_sub(log_1m_fpr_hi, log_delta) - log_fnr_hi  # FPR + e^eps FNR >= 1 - delta
        e2 = log_sub(log_1m_fnr_hi, log_delta) - log_fpr_hi  # FNR + e^eps FPR >= 1 - delta
        eps = np.maximum(np.maximum(e1, e2), 0.0)
        out = {
            "tau": taus,
            "eps": eps,
            "e_fnr_denominator": e1,
            "e_fpr_denominator": e2,
            "fn": fn,
            "log_fnr_hi": log_fnr_hi,
            "log_fpr_hi": log_fpr_hi,
            "log_1m_fnr_hi": log_1m_fnr_hi,
            "log_1m_fpr_hi": log_1m_fpr_hi,
        }
        if fp is not None:
            out["fp"] = fp
        return out

    def best(self, taus: np.ndarray, delta: float) -> tuple[int, dict[str, np.ndarray]]:
        """(i, bound at taus[i]) for the first i maximising eps_lo over the sorted ``taus``.

        The same i and values as ``bound(taus)`` in full, without evaluating every tau: as tau
        grows FNR_hi grows and FPR_hi shrinks, so the exact rates at a grid of taus (every one
        near both ends, geometric in between) bound eps_lo(tau) from above between grid points.
        Only the taus whose bound reaches the best grid value are then evaluated exactly.
        """
        n = int(np.size(taus))
        grid = _bracket_grid(n)
        if grid.size == n:
            res = self.bound(taus, delta)
            i = int(np.argmax(res["eps"]))
            return i, {key: val[i : i + 1] for key, val in res.items()}
        at = self.bound(taus[grid], delta)
        j = int(np.argmax(at["eps"]))
        top, i_top = float(at["eps"][j]), int(grid[j])
        # between grid points a and a + 1 the bound is constant: FNR_hi >= its value at a,
        # FPR_hi >= its value at a + 1 (and the complements below theirs)
        log_delta = math.log(delta)
        ub = np.maximum(
            log_sub(at["log_1m_fpr_hi"][1:], log_delta) - at["log_fnr_hi"][:-1],
            log_sub(at["log_1m_fnr_hi"][:-1], log_delta) - at["log_fpr_hi"][1:],
        )
        # eps_lo = max(e1, e2, 0) beats the grid's best (or ties it before i_top; top = 0 puts
        # i_top at 0) only inside an interval whose bound reaches top; the slack covers
        # rounding in the (mathematically monotone) rates
        open_ = np.flatnonzero(ub >= top - 1e-9 * (1.0 + top))
        starts, stops = grid[open_] + 1, grid[open_ + 1]
        pieces = [np.arange(st, sp) for st, sp in zip(starts, stops, strict=True) if sp > st]
        keep = np.unique(np.concatenate([*pieces, np.array([i_top])]))
        res = self.bound(taus[keep], delta)
        i = int(np.argmax(res["eps"]))
        return int(keep[i]), {key: val[i : i + 1] for key, val in res.items()}


def _pick(res: dict[str, np.ndarray], i: int) -> dict[str, float | int | None]:
    e1 = float(res["e_fnr_denominator"][i])
    e2 = float(res["e_fpr_denominator"][i])
    return {
        "tau": float(res["tau"][i]),
        "fnr_hi": float(np.exp(res["log_fnr_hi"][i])),
        "fpr_hi": float(np.exp(res["log_fpr_hi"][i])),
        "log_fpr_hi": float(res["log_fpr_hi"][i]),
        "fn": int(res["fn"][i]),
        "fp": int(res["fp"][i]) if "fp" in res else None,
        "direction": "fnr_in_denominator" if e1 >= e2 else "fpr_in_denominator",
    }


def estimate_epsilon_lower_bound_from_cosines(
    observed: ArrayLike,
    delta: float,
    *,
    dim: int | None = None,
    unobserved: ArrayLike | None = None,
    alpha: float = 0.05,
    threshold: Threshold = "max",
    seed: int = 0,
) -> AuditResult:
    """eps_lo (Andrew et al. 2024 §5.1; see the module docstring), the threshold chosen by
    "max" (the paper's maximum over thresholds) or "heldout".

    Args:
        observed: shape (k,), cosines in [-1, 1] of the inserted canaries; k >= 1 ("max") or
            k >= 2 ("heldout").
        delta: delta in (0, 1).
        dim: model dimension d >= 2 (final model: FPR from the exact null) -- exactly one of
            dim / unobserved.
        unobserved: shape (k',), k' >= 1 ("max") or >= 2 ("heldout") (all iterates: FPR from a
            Jeffreys bound).
        alpha: 1 - confidence of each per-threshold bound, in (0, 1).
        threshold: "max" (max over all candidate thresholds, Andrew et al. 2024 §5.1) or "heldout"
            (tau chosen on a random half, bound computed on the other half).
        seed: seed of the split (heldout only).

    Returns:
        AuditResult with value = lower = eps_lo (nats, finite, >= 0), upper None, counts["n"] = k,
        method "eps_lo_max" / "eps_lo_heldout", threat_model, delta, confidence = 1 - alpha,
        details: tau, fnr_hi, fpr_hi, log_fpr_hi (fpr_hi can underflow to 0.0 while its log
        stays finite), fn, fp (all iterates), direction, n_thresholds, alpha, and for heldout
        the sizes of the two halves and the bound on the selection half.

    Raises:
        ValueError: both or neither of dim / unobserved; empty input, NaN/inf, |cos| > 1, not
            1-D or not floating-point (as :func:`estimate_epsilon_from_cosines`);
            delta or alpha not in (0, 1); dim < 2; threshold not in
            {"max", "heldout"}; seed not a non-negative integer; too few values to split.

    Source: Andrew et al. 2024 §5.1; docs/methods/canaries.md, A6.
    """
    check_choice(threshold, "threshold", ("max", "heldout"))
    sd = check_seed(seed)
    min_size = 1 if threshold == "max" else 2
    obs, d, unobs = _threat_inputs(observed, dim, unobserved, min_size)
    dl = check_delta(delta)
    a = check_alpha(alpha)
    threat = "final_model" if d is not None else "all_iterates"

    if threshold == "max":
        side = _Side(obs, d, unobs, a)
        taus = side.candidates()
        _, res = side.best(taus, dl)
        value = float(res["eps"][0])
        extras: dict = {"n_thresholds": int(taus.size), **_pick(res, 0)}
    else:
        rng = np.random.default_rng(sd)
        po = rng.permutation(obs.size)
        h = obs.size // 2
        obs_a, obs_b = obs[po[:h]], obs[po[h:]]
        un_a = un_b = None
        if unobs is not None:
            pu = rng.permutation(unobs.size)
            hu = unobs.size // 2
            un_a, un_b = unobs[pu[:hu]], unobs[pu[hu:]]
        sel = _Side(obs_a, d, un_a, a)
        taus = sel.candidates()
        i, res_a = sel.best(taus, dl)
        tau = taus[i]
        ev = _Side(obs_b, d, un_b, a)
        res_b = ev.bound(np.array([tau]), dl)
        value = float(res_b["eps"][0])
        extras = {
            "n_thresholds": int(taus.size),
            **_pick(res_b, 0),
            "selection_bound": float(res_a["eps"][0]),
            "k_select": int(obs_a.size),
            "k_evaluate": int(obs_b.size),
            "k_unobserved_select": None if un_a is None else int(un_a.size),
            "k_unobserved_evaluate": None if un_b is None else int(un_b.size),
            "seed": sd,
        }
    extras["alpha"] = a
    extras["dim"] = d
    extras["k_unobserved"] = None if unobs is None else int(unobs.size)
    return AuditResult(
        value=value,
        lower=value,
        upper=None,
        alpha=a,
        delta=dl,
        method=f"eps_lo_{threshold}",
        source=SOURCE,
        counts={"n": int(obs.size)},
        details={**extras, "threat_model": threat},
    )
