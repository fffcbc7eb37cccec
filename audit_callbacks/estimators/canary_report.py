"""Every canary estimate of one audit, from the cosine statistics (numpy and scipy only).

Paper 003 (Andrew et al.) Alg. 2 (final model) and Alg. 3 (all iterates); METHODS A3-A6.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from .canary_epsilon import estimate_epsilon_from_cosines
from .estimate import Estimate
from .lower_bound import estimate_epsilon_lower_bound_from_cosines

__all__ = ["canary_report", "cosine_null_pdf"]


def cosine_null_pdf(t: ArrayLike, dim: int) -> np.ndarray:
    """Density of the cosine null (METHODS A1): (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2)."""
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
    alpha: float = 0.05,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Estimates for both threat models.

    Args:
        observed_final: ``[k]`` cosines ``cos(c_j, theta_T - theta_0)`` of canaries that took part.
        delta: the target delta.
        dim: d, the number of model parameters (the final-model null is exact, METHODS A1).
        observed_all, unobserved_all: ``[k]`` and ``[k']`` max-over-rounds cosines (A5);
            the all-iterates estimates are skipped when either is missing or has < 2 entries.
        alpha: the lower bounds hold with confidence 1 - alpha (A6).
        bootstrap: resamples for the point estimates' percentile intervals (0: none).
        seed: seed of the bootstrap and of the held-out split.

    Returns:
        ``{"estimates": {name: Estimate}, "skipped": {name: reason}}`` with names
        ``final_model`` (Gaussian fit, paper 003), ``final_model_equal_variance``,
        ``final_model_lower_bound`` (max over thresholds, paper), ``final_model_lower_bound_heldout``
        and the same four with ``all_iterates``. A name is absent when its statistics are
        degenerate; ``skipped`` says why. No value is NaN or infinite.
    """
    estimates: dict[str, Estimate] = {}
    skipped: dict[str, str] = {}
    conf = 1.0 - alpha

    def add(name: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        est, why = _safe(fn, *args, **kwargs)
        if est is None:
            skipped[name] = why or "skipped"
        else:
            estimates[name] = est

    sets: list[tuple[str, dict[str, Any]]] = [
        ("final_model", {"observed": observed_final, "dim": dim}),
    ]
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
        add(prefix, estimate_epsilon_from_cosines, obs, delta, fit="unequal",
            bootstrap=bootstrap, confidence=conf, seed=seed, **side)
        add(f"{prefix}_equal_variance", estimate_epsilon_from_cosines, obs, delta, fit="equal",
            bootstrap=bootstrap, confidence=conf, seed=seed, **side)
        add(f"{prefix}_lower_bound", estimate_epsilon_lower_bound_from_cosines, obs, delta,
            alpha=alpha, threshold="max", **side)
        add(f"{prefix}_lower_bound_heldout", estimate_epsilon_lower_bound_from_cosines, obs,
            delta, alpha=alpha, threshold="heldout", seed=seed, **side)
    return {"estimates": estimates, "skipped": skipped}
