"""Paper 000 App. D: cost of the empirical eps0 test (Alg. 2) against LDP-SGD (docs/methods/ldp.md, C2-C4).

    PYTHONPATH=. .venv/bin/python benchmarks/ldp_trials.py            # full run, about a minute
    PYTHONPATH=. .venv/bin/python benchmarks/ldp_trials.py --quick    # smoke test, seconds

1. Fast path (docs/methods/ldp.md, C3, exact O(1) per trial): 10^6 trials of the dummy adversary against
   LDP-SGD at d = 10^6, for eps0 = 4 and 10 (Matsumoto et al. App. D: "about 37 minutes" for 10^6
   trials on an M1 Pro laptop, 2.2 s for 1000). Target: < 5 s.
2. Batched path (any mechanism, O(d) per trial): trials per second at d = 10^5 (a few thousand
   trials) and d = 10^6, with the package's LDPSGD.randomize in batches.
3. The shuffle-model table of Matsumoto et al. Table 3 (docs/methods/ldp.md, C4): the Feldman-McMillan-Talwar bound,
   the exact epsilon of the dummy pair, the population eq.-3 value of the tau test, and the mean
   point estimate of 10 x 1000-trial measurements (the paper's protocol) over 200 repetitions.

Output: a table on stdout and ``benchmarks/results/ldp_trials.json`` (or ``--output``), with
machine info, wall times and peak RSS.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
import torch

from audit_callbacks.attacks import dummy_pair, ldp_epsilon_test
from audit_callbacks.estimators.shuffle import (
    shuffle_amplification_bound,
    shuffle_dummy_exact_epsilon,
    shuffle_dummy_test_rates,
    shuffle_test,
)
from audit_callbacks.mechanisms import LDPSGD
from benchmarks._common import (
    machine_info,
    parser,
    peak_rss_mb,
    write_json,
)

PAPER_ANCHORS = {
    "trials_1000_seconds": 2.2,
    "trials_1e6_seconds": 37 * 60,
    "machine": "Apple M1 Pro laptop, 32 GB (Matsumoto et al. App. D)",
}
TABLE3 = [  # (eps0, n, paper theoretical, paper measured) at delta = 1e-6
    (1.0, 432, 0.67, 0.07),
    (1.0, 1000, 0.48, 0.06),
    (2.0, 974, 0.95, 0.12),
    (2.0, 1000, 0.94, 0.11),
    (4.0, 6454, 1.1, 0.16),
    (4.0, 10000, 0.96, 0.10),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, quick="small sizes, for a smoke test", output="result file name in benchmarks/results")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions of the fast path")
    return p.parse_args(argv)


def _fast(dim: int, trials: int, eps0: float, repeats: int) -> dict:
    mech = LDPSGD(eps0, 1.0)
    t0 = time.perf_counter()
    pair = dummy_pair(dim, 1.0)
    craft_s = time.perf_counter() - t0
    times, res = [], None
    for rep in range(repeats):
        t0 = time.perf_counter()
        res = ldp_epsilon_test(mech, pair.g1, pair.g2, trials=trials, seed=rep, path="fast")
        times.append(time.perf_counter() - t0)
    assert res is not None
    return {
        "path": "fast",
        "dim": dim,
        "trials": trials,
        "epsilon0": eps0,
        "craft_seconds": craft_s,
        "seconds": times,
        "median_seconds": statistics.median(times),
        "trials_per_second": trials / statistics.median(times),
        "epsilon": res.epsilon,
        "epsilon_lower_bound": res.epsilon_lower_bound,
        "epsilon_upper_bound": res.epsilon_upper_bound,
        "epsilon_capped": res.epsilon_capped,
        "ceiling": res.ceiling,
        "counts": res.counts,
    }


def _batched(dim: int, trials: int, eps0: float) -> dict:
    mech = LDPSGD(eps0, 1.0)
    pair = dummy_pair(dim, 1.0)
    ldp_epsilon_test(mech, pair.g1, pair.g2, trials=8, seed=99, path="batched")  # warm-up
    t0 = time.perf_counter()
    res = ldp_epsilon_test(mech, pair.g1, pair.g2, trials=trials, seed=0, path="batched")
    sec = time.perf_counter() - t0
    return {
        "path": "batched",
        "dim": dim,
        "trials": trials,
        "epsilon0": eps0,
        "seconds": sec,
        "trials_per_second": trials / sec,
        "extrapolated_1e6_trials_seconds": 1e6 * sec / trials,
        "batch_size": max(1, min(4096, (1 << 24) // dim)),
        "epsilon": res.epsilon,
        "epsilon_lower_bound": res.epsilon_lower_bound,
        "counts": res.counts,
    }


def _shuffle_table(reps: int) -> list[dict]:
    rows = []
    for eps0, n, paper_theory, paper_measured in TABLE3:
        fpr, fnr = shuffle_dummy_test_rates(eps0, n)
        pop = max(math.log((1 - fpr) / fnr), math.log((1 - fnr) / fpr))
        # the paper's protocol: the mean of 10 measurements of 1000 trials; its distribution
        means = [
            np.mean([shuffle_test(eps0, n, 1000, seed=1000 * r + s).epsilon for s in range(10)])
            for r in range(reps)
        ]
        rows.append(
            {
                "epsilon0": eps0,
                "n": n,
                "delta": 1e-6,
                "bound": shuffle_amplification_bound(eps0, n, 1e-6),
                "paper_bound": paper_theory,
                "exact_epsilon": shuffle_dummy_exact_epsilon(eps0, n, 1e-6),
                "population_test_epsilon": pop,
                "mean_of_10x1000": float(np.mean(means)),
                "sd_of_10x1000": float(np.std(means)),
                "paper_measured": paper_measured,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    fast_dim, fast_trials = (10**4, 10**5) if args.quick else (10**6, 10**6)
    batched_sizes = [(10**4, 500)] if args.quick else [(10**5, 3000), (10**6, 300)]
    wall0 = time.perf_counter()

    fast = [_fast(fast_dim, fast_trials, e, args.repeats) for e in (4.0, 10.0)]
    for r in fast:
        print(
            f"fast     d={r['dim']:>8} trials={r['trials']:>8} eps0={r['epsilon0']:>4}: "
            f"{r['median_seconds']:.3f} s (median of {len(r['seconds'])}), "
            f"{r['trials_per_second']:.3g} trials/s; eps_hat={r['epsilon']:.3f} "
            f"[{r['epsilon_lower_bound']:.3f}, {r['epsilon_upper_bound']:.3f}]"
            f"{' (capped)' if r['epsilon_capped'] else ''}"
        )
    batched = [_batched(d, k, 4.0) for d, k in batched_sizes]
    for r in batched:
        print(
            f"batched  d={r['dim']:>8} trials={r['trials']:>8} eps0={r['epsilon0']:>4}: "
            f"{r['seconds']:.2f} s, {r['trials_per_second']:.1f} trials/s "
            f"(10^6 trials would take {r['extrapolated_1e6_trials_seconds'] / 60:.1f} min)"
        )
    table = _shuffle_table(20 if args.quick else 200)
    print(
        "\nshuffle (delta 1e-6): eps0 n | FMT bound (paper) | exact dummy | population test "
        "| mean 10x1000 +- sd (paper measured)"
    )
    for r in table:
        print(
            f"  {r['epsilon0']:.0f} {r['n']:>6} | {r['bound']:.3f} ({r['paper_bound']}) | "
            f"{r['exact_epsilon']:.3f} | {r['population_test_epsilon']:.3f} | "
            f"{r['mean_of_10x1000']:.3f} +- {r['sd_of_10x1000']:.3f} ({r['paper_measured']})"
        )

    payload = {
        "benchmark": "ldp_trials",
        "description": __doc__.strip().splitlines()[0],
        "quick": args.quick,
        "machine": machine_info(),
        "paper_anchor": PAPER_ANCHORS,
        "fast": fast,
        "batched": batched,
        "shuffle_table3": table,
        "wall_seconds": time.perf_counter() - wall0,
        "peak_rss_mb": peak_rss_mb(),
    }
    name = args.output or ("ldp_trials_quick.json" if args.quick else "ldp_trials.json")
    path = write_json(name, payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
