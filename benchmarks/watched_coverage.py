"""Coverage of the logged lower bounds through the audit's own report (issue 24, item 3).

A simulated DP-FedAvg mechanism with orthogonal (Hadamard) canaries and known rounds: k observed
canaries join each of T rounds with probability q, k' are never inserted; in units of one
clipped update the canary's projection of round t's noisy average is ``[j in round t] +
N(0, z^2)``. Both threat models' statistics follow exactly:

* all iterates (rounds known): ``t_j = sum_{t in R_j} y_jt / (z sqrt(r_j))``; the truth is the
  Gaussian mechanism composed over the most-sampled canary's rounds;
* final model (server SGD without momentum): ``sum_t y_jt / (z sqrt(T))`` ~ N(r_j / (z sqrt T),
  1); the truth is epsilon_GDP(r_max / (z sqrt T)).

Every data set is audited at J checkpoints (rounds T/J, 2T/J, ..., T) through
:func:`audit_callbacks.estimators.canary_report.canary_estimates` with the point's index, as
``CanaryAudit`` logs them. Reported: how often any point of each logged lower-bound series
exceeds its checkpoint's truth (the maximum of the series is then above the truth), and how
often the plain-alpha (summary) bound does; both must stay within 5% plus binomial slack.

    PYTHONPATH=. python benchmarks/watched_coverage.py [--data-sets 300]

Writes ``benchmarks/results/watched_coverage.json``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy import stats

from audit_callbacks.estimators import AuditResult, gaussian_epsilon_array
from audit_callbacks.estimators.canary_report import canary_estimates
from benchmarks._common import (
    machine_info,
    parser,
    write_json,
)

TAGS = ("epsilon_lower_bound_all_iterates", "epsilon_lower_bound_final_model",
        "epsilon_gdp_lower_bound_all_iterates", "epsilon_gdp_lower_bound_final_model")


def simulate(rng: np.random.Generator, *, k: int, k_un: int, rounds: int, q: float, z: float,
             checkpoints: int, delta: float) -> list[dict[str, float | None]]:
    """One data set: the bounds and truths at each checkpoint."""
    member = rng.random((rounds, k)) < q
    y_in = member + z * rng.standard_normal((rounds, k))
    y_out = z * rng.standard_normal((rounds, k_un))
    out = []
    for i, t in enumerate(np.linspace(rounds / checkpoints, rounds, checkpoints).astype(int), 1):
        r = member[:t].sum(0)
        took = r > 0
        if took.sum() < 2:
            continue
        aligned_in = (y_in[:t] * member[:t]).sum(0)[took] / (z * np.sqrt(r[took]))
        aligned_out = y_out[:t].sum(0) / (z * np.sqrt(t))
        final_in = y_in[:t].sum(0)[took] / (z * np.sqrt(t))
        final_out = aligned_out
        r_max = int(r.max())
        truth_all = float(gaussian_epsilon_array(np.array([np.sqrt(r_max) / z]), delta)[0])
        truth_final = float(gaussian_epsilon_array(np.array([r_max / (z * np.sqrt(t))]), delta)[0])
        point = {"truth_all": truth_all, "truth_final": truth_final}
        dummy = AuditResult(value=0.0)
        for index in (i, None):
            est, _ = canary_estimates((final_in, final_out), delta, max_cosine=None,
                                   matched=((aligned_in, aligned_out), dummy), index=index)
            suffix = "" if index is not None else "_plain"
            for tag in TAGS:
                point[tag + suffix] = est[tag].value if tag in est else None
        out.append(point)
    return out


def exceed_rates(runs: list[list[dict[str, Any]]]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for tag in TAGS:
        truth = "truth_all" if "all_iterates" in tag else "truth_final"
        series = [any((p[tag] or 0.0) > p[truth] for p in run) for run in runs]
        plain = [(run[-1][tag + "_plain"] or 0.0) > run[-1][truth] for run in runs]
        rates[f"{tag}_series_max_exceeds"] = float(np.mean(series))
        rates[f"{tag}_fit_end_plain_exceeds"] = float(np.mean(plain))
    return rates


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--data-sets", type=int, default=300)
    args = p.parse_args(argv)
    settings = [dict(k=200, k_un=1000, rounds=20, q=0.2, z=z, checkpoints=5, delta=1e-5)
                for z in (0.5, 1.0, 2.0)]
    slack = float(stats.binom.ppf(0.999, args.data_sets, 0.05) / args.data_sets)
    results = []
    start = time.perf_counter()
    for i, s in enumerate(settings):
        rng = np.random.default_rng([7, i])
        runs = [simulate(rng, **s) for _ in range(args.data_sets)]
        rates = exceed_rates(runs)
        mean_bound = float(np.mean([run[-1]["epsilon_lower_bound_all_iterates_plain"] or 0 for run in runs]))
        mean_truth = float(np.mean([run[-1]["truth_all"] for run in runs]))
        results.append({**s, **rates, "mean_bound_all_iterates": mean_bound,
                        "mean_truth_all_iterates": mean_truth, "allowed": slack})
        print(f"z = {s['z']}: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))
    payload = {"benchmark": "watched_coverage", "data_sets": args.data_sets,
               "allowed_exceedance": slack, "seconds": time.perf_counter() - start,
               "machine": machine_info(), "settings": results}
    print(f"wrote {write_json('watched_coverage.json', payload)}")
    return payload


if __name__ == "__main__":
    main()
