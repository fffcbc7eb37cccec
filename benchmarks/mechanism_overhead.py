"""What the checks of the mechanism add to an audited fit: ABBA pairs of the realistic federated
scenario audited with and without them, and the checks' own time.

The scenario is ``canary_overhead.py``'s (1): a wide CNN (d = 125,626) on digits, 500 clients, 50
a round, 100 rounds, 1,000 Hadamard canaries, an estimate every 25 rounds. "Without" empties the
registry of checks (``audit_callbacks.canary.base.CHECKS``) for the fit; "with" is the default.
Reported: the wall ratio with / without (median of the pairs, with its sign-test interval), the
checks' own seconds (``NoiseChecks.fold`` per release and ``results`` per estimate, timed on
the instances) as a share of the audited fit and of the audit's own time (its hooks, as
``canary_overhead.py`` times them). Target: the checks add at most 2% to the audited step.

    PYTHONPATH=. python -m benchmarks mechanism_overhead            # 5 pairs, ~4 min on 2 cores
    PYTHONPATH=. python -m benchmarks mechanism_overhead --quick    # a smoke run
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import numpy as np
import torch

from audit_callbacks.canary import base, mechanism
from benchmarks._common import (
    add_accelerator_argument,
    interleaved_pairs,
    machine_info,
    median_interval,
    parser,
    write_json,
)
from benchmarks.canary_overhead import fit_once, quiet, train_config
from datamodules import FederatedDataModule


def _timed_checks() -> tuple[dict[str, float], Any]:
    """Time ``NoiseChecks.fold`` and ``results`` (and the sampler's) on the class; returns the
    totals and an undo."""
    totals = {"fold_s": 0.0, "results_s": 0.0, "folds": 0}
    saved = []
    for cls in (mechanism.NoiseChecks, mechanism.SamplerCheck):
        for attr, key in (("fold", "fold_s"), ("results", "results_s")):
            fn = getattr(cls, attr)
            saved.append((cls, attr, fn))

            def timed(self: Any, *a: Any, _fn: Any = fn, _key: str = key, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return _fn(self, *a, **kw)
                finally:
                    totals[_key] += time.perf_counter() - t
                    totals["folds"] += _key == "fold_s"
            setattr(cls, attr, timed)

    def undo() -> None:
        for cls, attr, fn in saved:
            setattr(cls, attr, fn)
    return totals, undo


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--reps", type=int, default=5, help="ABBA pairs")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--output", default="mechanism_overhead.json")
    add_accelerator_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.reps = 6, 1
    torch.set_num_threads(args.threads)
    quiet()
    cfg = train_config(clients=500, clients_per_round=50, rounds=args.rounds, rounds_per_epoch=25,
                       local_batch_size=1, noise_multiplier=0.3, cnn={"channels": [32, 64], "hidden": 400},
                       accelerator=args.accelerator)
    dm = FederatedDataModule("digits", num_clients=cfg["clients"], rounds_per_epoch=cfg["rounds_per_epoch"],
                             seed=cfg["seed"])
    dm.setup("fit")
    audit = {"num_canaries": 1000, "canaries": "hadamard"}

    with tempfile.TemporaryDirectory() as root:
        def one(variant: str, i: int) -> dict[str, Any]:
            registry = list(base.CHECKS)
            totals, undo = _timed_checks()
            if variant == "baseline":  # the audit without its checks of the mechanism
                base.CHECKS.clear()
            try:
                res = fit_once(dm, cfg, audit, root, f"{variant}_{i}")
            finally:
                base.CHECKS[:] = registry
                undo()
            res.update(checks_fold_s=totals["fold_s"], checks_results_s=totals["results_s"],
                       checks_folds=totals["folds"])
            print(f"  {'without' if variant == 'baseline' else 'with':7s} {i:2d}: fit {res['fit_s']:6.2f} s, "
                  f"audit {res['audit_wall_s']:.2f} s, checks {totals['fold_s'] + totals['results_s']:.3f} s "
                  f"({totals['folds']} folds)", flush=True)
            return res

        warm, runs = interleaved_pairs(one, ["checks"], args.reps, not args.quick)
    pairs = runs["checks"]
    ratios = np.array([a["fit_s"] / b["fit_s"] for b, a in pairs])
    checks = np.array([a["checks_fold_s"] + a["checks_results_s"] for _, a in pairs])
    fits = np.array([a["fit_s"] for _, a in pairs])
    audits = np.array([a["audit_wall_s"] for _, a in pairs])
    folds = np.array([a["checks_folds"] for _, a in pairs])
    out = {
        "benchmark": "mechanism_overhead",
        "scenario": {k: cfg[k] for k in ("clients", "clients_per_round", "rounds", "rounds_per_epoch",
                                         "noise_multiplier", "model")},
        "num_parameters": pairs[0][1]["num_parameters"],
        "pair_ratios": ratios.tolist(),
        "median_ratio": float(np.median(ratios)),
        "median_ratio_interval": median_interval(ratios),
        "checks_s_median": float(np.median(checks)),
        "checks_share_of_fit_median": float(np.median(checks / fits)),
        "checks_share_of_audit_median": float(np.median(checks / audits)),
        "fold_ms_median": float(np.median([1e3 * a["checks_fold_s"] / max(1, a["checks_folds"])
                                           for _, a in pairs])),
        "folds": int(folds[0]),
        "target": "the checks add <= 2% to the audited fit",
        "pairs": [{"without": b, "with": a} for b, a in pairs],
        "machine": machine_info(),
    }
    ci = out["median_ratio_interval"]
    print(f"\nwith / without the checks: {out['median_ratio']:.3f} [{ci['lower']:.3f}, {ci['upper']:.3f}] "
          f"({100 * ci['coverage']:.0f}%); the checks' own time {out['checks_s_median']:.3f} s = "
          f"{100 * out['checks_share_of_fit_median']:.2f}% of the fit, "
          f"{100 * out['checks_share_of_audit_median']:.1f}% of the audit's; a fold "
          f"{out['fold_ms_median']:.3f} ms")
    print(f"wrote {write_json(args.output, out)}")
    return out


if __name__ == "__main__":
    main()
