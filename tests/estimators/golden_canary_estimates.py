"""The seeded score sets of ``test_canary_estimates_golden.py`` and the canonical form of
:func:`~audit_callbacks.estimators.canary_report.canary_estimates`' output compared there, and
the DP-FedAvg plans (:func:`~audit_callbacks.estimators.planner.plan_audit`, the claim per
simulated run) compared the same way.

Run as a script to write ``golden/canary_estimates.json`` from the code as it stands
(every float as ``float.hex``, so the comparison is bit for bit)::

    PYTHONPATH=. python tests/estimators/golden_canary_estimates.py
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from audit_callbacks.estimators.canary_report import canary_estimates
from audit_callbacks.estimators.planner import plan_audit
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.estimators.score_auditor import CanaryScoreAuditor

PATH = os.path.join(os.path.dirname(__file__), "golden", "canary_estimates.json")


def cases() -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """``{name: (args, kwargs)}`` of ``canary_estimates``: Hadamard-like sets (many more
    unobserved than observed), Gaussian canaries with the exact null, a matched statistic given
    as scores and as an auditor, logged points and the fit end's bootstrap."""
    out: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    for seed, (k, kk, shift) in enumerate([(300, 6000, 4.0), (200, 4000, 1.5), (120, 1500, 0.4)]):
        rng = np.random.default_rng(seed)
        fin = (rng.normal(shift, 1.0, k) * 1e-3, rng.normal(0.0, 1.0, kk) * 1e-3)
        cos = (rng.normal(0.8 * shift, 1.0, k) * 1e-3, rng.normal(0.0, 1.0, kk) * 1e-3)
        mat = (rng.normal(1.3 * shift, 1.0, k), rng.standard_t(8, kk))
        est = AuditResult(value=0.5 + seed, method="matched", delta=1e-6)
        out[f"matched_scores_{seed}"] = ((fin, 1e-6), dict(max_cosine=cos, matched=(mat, est),
                                                           index=seed + 1, seed=seed))
        out[f"matched_auditor_{seed}"] = ((fin, 1e-6), dict(
            max_cosine=cos, matched=(CanaryScoreAuditor(*mat), est), bootstrap=25, seed=seed))
        out[f"no_matched_{seed}"] = ((fin, 1e-5), dict(max_cosine=cos, index=2 * seed + 1))
        out[f"final_only_{seed}"] = ((fin, 1e-5), dict(bootstrap=10, seed=seed + 3))
    dim = 5000
    rng = np.random.default_rng(7)
    g = (rng.normal(3.0, 1.0, 150) / math.sqrt(dim), rng.normal(0.0, 1.0, 150) / math.sqrt(dim))
    out["gaussian_exact_null"] = ((g, 1e-5), dict(dim=dim, bootstrap=15, index=3))
    return out


def canonical(value: Any) -> Any:
    """JSON-ready form of results: floats as ``float.hex`` (NaN and inf as their names)."""
    if isinstance(value, AuditResult):
        return {f: canonical(getattr(value, f)) for f in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (bool, type(None), str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value).hex()
    raise TypeError(f"no canonical form for {type(value).__name__}")


def plan_cases() -> dict[str, dict[str, Any]]:
    """``{name: kwargs}`` of ``plan_audit`` for DP-FedAvg's all iterates without a claim (each
    simulated run against the analytic epsilon at its own most participations)."""
    return {f"plan_fedavg_{i}": dict(num_canaries=k, num_unobserved=ku, dim=1 << 16, steps=t,
                                     sample_rate=q, noise_multiplier=z, delta=1e-6,
                                     training="dpfedavg", search_bugs=False, seed=i)
            for i, (k, ku, t, q, z) in enumerate([(1000, 64536, 100, 0.1, 0.3),
                                                   (200, 5000, 40, 0.05, 1.0)])}


def plan_canonical(kwargs: dict[str, Any]) -> Any:
    """A plan's fields in canonical form."""
    plan = plan_audit(**kwargs)
    return {f: canonical(getattr(plan, f)) for f in plan.__dataclass_fields__}


def compute() -> dict[str, Any]:
    """Every case's ``canary_estimates`` output and every plan, in canonical form."""
    out = {name: canonical(canary_estimates(*args, **kwargs))
           for name, (args, kwargs) in cases().items()}
    out.update({name: plan_canonical(kwargs) for name, kwargs in plan_cases().items()})
    return out


if __name__ == "__main__":
    with open(PATH, "w", encoding="utf-8") as fh:
        json.dump(compute(), fh, indent=0, sort_keys=True)
        fh.write("\n")
    print(PATH)
