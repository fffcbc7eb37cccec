"""Paper 003 Table 2: one-shot epsilon of the Gaussian mechanism from k canaries (docs/methods/canaries.md, A2).

    PYTHONPATH=. .venv/bin/python benchmarks/gaussian_one_shot.py            # d = 1e6, 10 seeds
    PYTHONPATH=. .venv/bin/python benchmarks/gaussian_one_shot.py --quick    # smoke test, seconds

One release per seed and noise level, without data: rho = sum_j c_j + N(0, sigma^2 I_d), with k
canaries c_j uniform on the unit sphere of R^d. The statistics t_j = cos(c_j, rho) are fitted by
a Gaussian and compared with the null N(0, 1/d) at delta (Andrew et al. 2024 Alg. 1):

* fit="unequal": observed N(mean, var), the paper's estimator;
* fit="equal": the observed sd fixed to the null's, i.e. the analytic Gaussian mechanism with
  shift sqrt(d) * mean (Andrew et al. 2024 Thm 3.3: d * var -> 1).

For each seed the canary sum is built once (CanarySet(seed, d, k).sum(), canaries regenerated
chunk by chunk, never a k x d matrix) and reused for the three noise levels; the three noise
vectors come from one seeded torch Generator, and the three cosine columns are computed in one
pass over the canaries. Seed 0 also gets a bootstrap percentile interval for both fits.

Output: a table on stdout and ``benchmarks/results/gaussian_one_shot.json`` (or ``--output``),
with machine info, per-seed values, wall times and peak RSS.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch

from audit_callbacks.canary.vectors import CanarySet
from audit_callbacks.estimators import estimate_epsilon_from_cosines, gaussian_epsilon
from benchmarks._common import (
    machine_info,
    parser,
    peak_rss_mb,
    write_json,
)

SIGMAS = (4.22, 1.54, 0.541)  # analytic epsilon 1, 3, 10 at delta = 1e-6 (Andrew et al. 2024 Table 2)

# An independent implementation at d = 2e5, k = 1000, delta = 1e-6, 10 seeds (mean, std).
REFERENCE_D2E5 = {
    "dim": 200_000,
    "num_canaries": 1000,
    "delta": 1e-6,
    "seeds": 10,
    "sigmas": list(SIGMAS),
    "unequal": {"mean": [1.23, 3.29, 10.3], "std": [0.12, 0.17, 0.3]},
    "equal": {"mean": [0.88, 2.86, 9.73], "std": [0.14, 0.16, 0.22]},
}

FITS = ("unequal", "equal")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, quick="smoke test: d = 20000, k = 200, 3 seeds, 200 resamples",
               output="file name under benchmarks/results/ (default gaussian_one_shot.json, "
                      "gaussian_one_shot_quick.json with --quick)")
    p.add_argument("--seeds", type=int, default=10, help="number of seeds (0..seeds-1)")
    p.add_argument("--dim", type=int, default=1_000_000, help="dimension d")
    p.add_argument("--canaries", type=int, default=1000, help="number of canaries k")
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--sigmas", type=float, nargs="+", default=list(SIGMAS),
                   help="noise std of the release (sensitivity 1)")
    p.add_argument("--bootstrap", type=int, default=1000, help="resamples for seed 0's interval")
    p.add_argument("--ideal-reps", type=int, default=300,
                   help="Monte-Carlo repetitions of the idealized model (0: skip)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    if args.quick:
        args.dim, args.canaries, args.seeds, args.bootstrap = 20_000, 200, 3, 200
    if args.output is None:
        args.output = "gaussian_one_shot_quick.json" if args.quick else "gaussian_one_shot.json"
    if args.seeds < 1 or args.dim < 2 or args.canaries < 2:
        p.error("need --seeds >= 1, --dim >= 2, --canaries >= 2")
    return args


def noise_seed(seed: int) -> int:
    """Seed of the noise generator of one seed (independent of the canaries' streams)."""
    state = np.random.SeedSequence([int(seed), 0x6E015E]).generate_state(2, np.uint32)
    return ((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def run_seed(seed: int, args: argparse.Namespace, bootstrap: int) -> dict:
    """One seed: canary sum, one release per sigma, cosines, both fits for each sigma."""
    d, k = args.dim, args.canaries
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    canaries = CanarySet(seed, d, k)
    total = canaries.sum()
    times["canary_sum_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(noise_seed(seed))
    releases = []
    for sigma in args.sigmas:
        rho = torch.randn(d, generator=gen, dtype=torch.float32)
        releases.append(rho.mul_(sigma).add_(total))
    times["noise_s"] = time.perf_counter() - t

    t = time.perf_counter()
    cos = canaries.cosines(releases).numpy()  # [k, len(sigmas)], one pass over the canaries
    times["cosines_s"] = time.perf_counter() - t
    times["release_s"] = time.perf_counter() - t0
    del releases, total

    t = time.perf_counter()
    per_sigma = []
    for m, sigma in enumerate(args.sigmas):
        col = cos[:, m]
        row = {
            "sigma": sigma,
            "sqrt_d_mean": float(math.sqrt(d) * col.mean()),
            "d_var": float(d * col.var(ddof=1)),
        }
        for fit in FITS:
            est = estimate_epsilon_from_cosines(
                col, args.delta, dim=d, fit=fit, bootstrap=bootstrap, seed=seed
            )
            row[fit] = {"epsilon": est.value}
            if bootstrap:
                row[fit]["bootstrap_95"] = [est.lower, est.upper]
                row[fit]["bootstrap_dropped"] = est.details["bootstrap_dropped"]
        per_sigma.append(row)
    times["estimation_s"] = time.perf_counter() - t
    return {"seed": seed, "times": times, "per_sigma": per_sigma}


def ideal_model(args: argparse.Namespace) -> list[dict]:
    """The estimators' spread when t_j ~ N(1/(sigma sqrt d), 1/d) exactly (the d -> inf limit).

    The spread left there comes only from fitting k values, so it is a floor for the spread
    over seeds of any implementation with k canaries.
    """
    d, k = args.dim, args.canaries
    rng = np.random.default_rng(12345)
    out = []
    for sigma in args.sigmas:
        vals: dict[str, list[float]] = {fit: [] for fit in FITS}
        for _ in range(args.ideal_reps):
            t = rng.normal(1.0 / (sigma * math.sqrt(d)), 1.0 / math.sqrt(d), size=k)
            for fit in FITS:
                vals[fit].append(estimate_epsilon_from_cosines(t, args.delta, dim=d, fit=fit).value)
        row = {"sigma": sigma, "reps": args.ideal_reps}
        for fit in FITS:
            v = np.array(vals[fit])
            row[fit] = {"mean": float(v.mean()), "std": float(v.std(ddof=1))}
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    d, k = args.dim, args.canaries
    chunk = CanarySet(0, d, k).chunk_size
    canary_bytes = min(chunk, k) * d * 4
    rss_start = peak_rss_mb()
    analytic = [gaussian_epsilon(s, args.delta) for s in args.sigmas]

    print(f"Gaussian mechanism, one release: d = {d:,}, k = {k}, delta = {args.delta:g}, "
          f"{args.seeds} seeds, torch threads = {torch.get_num_threads()}")
    print(f"canaries regenerated {chunk} at a time: {canary_bytes / 2**20:.1f} MiB of canaries "
          f"in memory (never k x d = {k * d * 4 / 2**30:.2f} GiB)")
    seeds = []
    wall = time.perf_counter()
    for seed in range(args.seeds):
        res = run_seed(seed, args, args.bootstrap if seed == 0 else 0)
        seeds.append(res)
        eps = "  ".join(
            f"{r['unequal']['epsilon']:6.3f}/{r['equal']['epsilon']:6.3f}" for r in res["per_sigma"]
        )
        print(f"  seed {seed:3d}: {res['times']['release_s']:6.1f} s  eps unequal/equal: {eps}",
              flush=True)
    wall = time.perf_counter() - wall

    summary = []
    for m, sigma in enumerate(args.sigmas):
        row = {"sigma": sigma, "analytic_epsilon": analytic[m]}
        for fit in FITS:
            vals = np.array([s["per_sigma"][m][fit]["epsilon"] for s in seeds])
            row[fit] = {
                "mean": float(vals.mean()),
                "std": float(vals.std(ddof=1)) if vals.size > 1 else None,
                "min": float(vals.min()),
                "max": float(vals.max()),
                "seed0_bootstrap_95": seeds[0]["per_sigma"][m][fit].get("bootstrap_95"),
            }
        for key in ("sqrt_d_mean", "d_var"):
            vals = np.array([s["per_sigma"][m][key] for s in seeds])
            row[key] = {"mean": float(vals.mean()), "std": float(vals.std(ddof=1))
                        if vals.size > 1 else None}
        row["sqrt_d_mean"]["theory"] = 1.0 / sigma
        row["d_var"]["theory"] = 1.0
        summary.append(row)

    release_times = np.array([s["times"]["release_s"] for s in seeds])
    est_times = np.array([s["times"]["estimation_s"] for s in seeds])
    rss_end = peak_rss_mb()

    def pm(r: dict) -> str:
        if r["std"] is None:
            return f"{r['mean']:6.2f}"
        return f"{r['mean']:6.2f} +- {r['std']:.2f}"

    def ci(r: dict) -> str:
        b = r["seed0_bootstrap_95"]
        return f"[{b[0]:.2f}, {b[1]:.2f}]" if b else "-"

    print()
    print(f"{'sigma':>6} {'analytic':>8} | {'paper fit (unequal)':>19} {'seed 0 95% CI':>15} | "
          f"{'equal-variance fit':>18} {'seed 0 95% CI':>15}")
    for r in summary:
        print(f"{r['sigma']:6.3f} {r['analytic_epsilon']:8.3f} | {pm(r['unequal']):>19} "
              f"{ci(r['unequal']):>15} | {pm(r['equal']):>18} {ci(r['equal']):>15}")
    if d == REFERENCE_D2E5["dim"] and k == REFERENCE_D2E5["num_canaries"]:
        print("reference (independent implementation, d = 2e5, 10 seeds):")
        for m, r in enumerate(summary):
            ref = REFERENCE_D2E5
            print(f"{r['sigma']:6.3f} {'':8} | {ref['unequal']['mean'][m]:6.2f} +- "
                  f"{ref['unequal']['std'][m]:.2f}{'':>19} | {ref['equal']['mean'][m]:6.2f} +- "
                  f"{ref['equal']['std'][m]:.2f}")
    ideal = ideal_model(args) if args.ideal_reps > 1 else []
    if ideal:
        print(f"ideal model, t_j ~ N(1/(sigma sqrt d), 1/d) exactly ({args.ideal_reps} reps: the "
              "spread due to fitting k values alone):")
        for r in ideal:
            print(f"{r['sigma']:6.3f} {'':8} | {pm(r['unequal']):>19} {'':>15} | "
                  f"{pm(r['equal']):>18}")
    print()
    est_plain = est_times[1:] if est_times.size > 1 else est_times
    n_vec = 2 + len(args.sigmas)
    print(f"wall per seed (canary sum + {len(args.sigmas)} releases + cosines): median "
          f"{np.median(release_times):.1f} s (min {release_times.min():.1f}, max "
          f"{release_times.max():.1f}); estimation {np.median(est_plain):.3f} s per seed "
          f"without bootstrap, {est_times[0]:.2f} s for seed 0 with B = {args.bootstrap}")
    print(f"peak RSS {rss_end:.0f} MiB (after imports {rss_start:.0f} MiB; "
          f"+{rss_end - rss_start:.0f} MiB); theoretical canary chunk memory "
          f"{canary_bytes / 2**20:.1f} MiB (chunk {min(chunk, k)} x d x 4 B); "
          f"{n_vec} vectors of d floats = {n_vec * d * 4 / 2**20:.1f} MiB")

    payload = {
        "benchmark": "gaussian_one_shot",
        "description": "Andrew et al. 2024 Table 2 / docs/methods/canaries.md, A2: one release rho = sum_j c_j + "
                       "N(0, sigma^2 I_d), epsilon from cos(c_j, rho) by the unequal-variance "
                       "(paper) and equal-variance Gaussian fits",
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "config": {
            "dim": d, "num_canaries": k, "delta": args.delta, "sigmas": list(args.sigmas),
            "seeds": args.seeds, "bootstrap_seed0": args.bootstrap, "quick": args.quick,
            "torch_threads": torch.get_num_threads(),
        },
        "summary": summary,
        "reference_d2e5": REFERENCE_D2E5,
        "ideal_model": {
            "description": "t_j drawn i.i.d. from N(1/(sigma sqrt d), 1/d), the d -> infinity "
                           "limit of Andrew et al. 2024 Thm 3.3; mean and std of each fit over reps",
            "per_sigma": ideal,
        },
        "timing": {
            "total_wall_s": wall,
            "release_s_per_seed": release_times.tolist(),
            "release_s_median": float(np.median(release_times)),
            "estimation_s_per_seed": est_times.tolist(),
            "phases_seed_median": {
                key: float(np.median([s["times"][key] for s in seeds]))
                for key in ("canary_sum_s", "noise_s", "cosines_s")
            },
        },
        "memory": {
            "peak_rss_mib": rss_end,
            "peak_rss_after_imports_mib": rss_start,
            "canary_chunk_size": chunk,
            "theoretical_canary_chunk_mib": canary_bytes / 2**20,
            "k_by_d_matrix_would_be_mib": k * d * 4 / 2**20,
        },
        "per_seed": seeds,
    }
    path = write_json(args.output, payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
