"""Every canary estimate of one audit, from the cosine statistics (numpy and scipy only).

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024),
Alg. 2 (final model) and Alg. 3 (all iterates); the formulas are in ``docs/methods.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from .canary_epsilon import estimate_epsilon_from_cosines
from .estimate import Estimate
from .lower_bound import estimate_epsilon_lower_bound_from_cosines

__all__ = ["CanaryReport", "canary_report", "cosine_null_pdf"]


@dataclass(frozen=True)
class CanaryReport:
    """One canary audit's numbers at one point of training.

    Attributes:
        estimates: name -> :class:`Estimate` (see :func:`canary_report` for the names).
        skipped: name -> why that estimate is missing (degenerate statistics, too few canaries).
        analytic_epsilon: the analytic epsilon of a canary at ``delta`` (None: infinite, or
            unknown); ``analytic_epsilons`` holds the accountant's alternatives (DP-SGD: RDP, PRV).
        max_participations: the most rounds (steps) any canary took part in.
        num_canaries_participated: observed canaries that took part at least once.
        statistics: the cosines: ``final_observed`` / ``all_observed`` ``[participated]``,
            ``final_unobserved`` / ``all_unobserved`` ``[k']`` (float64).
        progress: rounds (DP-FedAvg) or logical steps (DP-SGD) when it was computed.
    """

    estimates: dict[str, Estimate]
    skipped: dict[str, str]
    analytic_epsilon: float | None = None
    analytic_epsilons: dict[str, float | None] = field(default_factory=dict)
    max_participations: int = 0
    num_canaries_participated: int = 0
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    progress: int = 0

    def value(self, name: str) -> float | None:
        """The value of estimate ``name``, or None when it was skipped."""
        est = self.estimates.get(name)
        return None if est is None else est.value


def cosine_null_pdf(t: ArrayLike, dim: int) -> np.ndarray:
    """Density of the cosine of a uniform random unit vector with a fixed one in d dimensions:
    (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2) (Andrew et al., ICLR 2024, §3)."""
    a = (dim - 1) / 2
    return 0.5 * stats.beta.pdf((np.asarray(t, dtype=float) + 1.0) / 2.0, a, a)


def _safe(fn: Any, *args: Any, **kwargs: Any) -> tuple[Estimate | None, str | None]:
    try:
        return fn(*args, **kwargs), None
    except ValueError as err:  # degenerate statistics (e.g. zero variance): skip, say why
        return None, str(err)


def canary_report(
    observed_final: ArrayLike,
    delta: float,
    *,
    dim: int,
    observed_all: ArrayLike | None = None,
    unobserved_all: ArrayLike | None = None,
    unobserved_final: ArrayLike | None = None,
    alpha: float = 0.05,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Estimates for both threat models.

    Args:
        observed_final: ``[k]`` cosines ``cos(c_j, theta_T - theta_0)`` of canaries that took part.
        delta: the target delta.
        dim: d, the number of model parameters: the final-model null is the exact law of the
            cosine of a uniform random direction, (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2).
        observed_all, unobserved_all: ``[k]`` and ``[k']`` max-over-rounds cosines (A5);
            the all-iterates estimates are skipped when either is missing or has < 2 entries.
        unobserved_final: ``[k']`` final-model cosines of canaries never inserted: when given,
            the final-model null is this empirical sample instead of the exact law (Hadamard
            canaries, whose cosines do not follow the Beta law exactly).
        alpha: the lower bounds hold with confidence 1 - alpha.
        bootstrap: resamples for the point estimates' percentile intervals (0: none).
        seed: seed of the bootstrap and of the held-out split.

    Returns:
        ``{"estimates": {name: Estimate}, "skipped": {name: reason}}`` with names
        ``final_model`` (unequal-variance Gaussian fit, Andrew et al.), ``final_model_equal_variance``,
        ``final_model_lower_bound`` (max over thresholds), ``final_model_lower_bound_heldout``
        and the same four with ``all_iterates``. A name is absent when its statistics are
        degenerate; ``skipped`` says why. No value is NaN or infinite.
    """
    estimates: dict[str, Estimate] = {}
    skipped: dict[str, str] = {}
    conf = 1.0 - alpha

    def add(name: str, threat: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        est, why = _safe(fn, *args, **kwargs)
        if est is None:
            skipped[name] = why or "skipped"
        else:
            estimates[name] = replace(est, threat_model=threat)

    sets: list[tuple[str, dict[str, Any]]] = []
    if unobserved_final is None:
        sets.append(("final_model", {"observed": observed_final, "dim": dim}))
    elif np.size(unobserved_final) >= 2:
        sets.append(("final_model", {"observed": observed_final, "unobserved": unobserved_final}))
    else:
        skipped["final_model"] = "the empirical null needs at least 2 unobserved canaries"
    if observed_all is not None and unobserved_all is not None:
        if np.size(observed_all) >= 2 and np.size(unobserved_all) >= 2:
            sets.append(("all_iterates", {"observed": observed_all, "unobserved": unobserved_all}))
        else:
            skipped["all_iterates"] = "fewer than 2 observed or unobserved canaries"
    else:
        skipped["all_iterates"] = "no unobserved canaries or no rounds yet"

    for prefix, inputs in sets:
        obs = inputs["observed"]
        side = {k: v for k, v in inputs.items() if k != "observed"}
        add(prefix, prefix, estimate_epsilon_from_cosines, obs, delta, fit="unequal",
            bootstrap=bootstrap, confidence=conf, seed=seed, **side)
        add(f"{prefix}_equal_variance", prefix, estimate_epsilon_from_cosines, obs, delta,
            fit="equal", bootstrap=bootstrap, confidence=conf, seed=seed, **side)
        add(f"{prefix}_lower_bound", prefix, estimate_epsilon_lower_bound_from_cosines, obs,
            delta, alpha=alpha, threshold="max", **side)
        add(f"{prefix}_lower_bound_heldout", prefix, estimate_epsilon_lower_bound_from_cosines,
            obs, delta, alpha=alpha, threshold="heldout", seed=seed, **side)
    return {"estimates": estimates, "skipped": skipped}
