"""Cost of ``CanaryStrategy`` in a Flower round: time in the wrapper against the round's wall time.

    PYTHONPATH=. .venv/bin/python benchmarks/flower_overhead.py            # ~3 min on 2 CPUs
    PYTHONPATH=. .venv/bin/python benchmarks/flower_overhead.py --quick    # smoke test

Every run is Flower's own ``Strategy.start`` loop (FedAvg sampling, the server-side fixed-clipping
DP wrapper, FedAvg aggregation) on an in-process grid (``audit_callbacks.flower.LocalGrid``):
no transport, no Ray, so a round's wall time is the clients' local training plus the server's
work, and the wrapper's share is an UPPER bound of its share in a real deployment (where
transport adds seconds a round: flwr 1.41's HTTP grid polls every 3 s).

Per scenario, two runs from the same seeds, in ABBA order over ``--repeats`` pairs:

* baseline: ``DifferentialPrivacyServerSideFixedClipping(FedAvg(fraction_train=q))`` over the N
  real nodes;
* audited: ``CanaryStrategy`` around the same, with k canary clients; the fraction is the same
  q, so each real node is sampled at the same rate and the real clients' work is the same.

Reported per round: ``wrapper_s`` (``FlowerBackend.wrapper_seconds``: the time in the wrapper's
own code, the wrapped strategy's calls excluded: sampling split, reply checks, making the
canary replies, folding the delta into the statistics, and the estimate every
``every_n_rounds`` rounds), the audited round's wall time, their ratio, and the slowdown of the
audited run against the baseline (which also counts Flower clipping and averaging the canary
replies). The last round (the final estimate with a 200-resample bootstrap and the summary) is
reported separately. Scenarios: digits MLPs with d = 2,410 and d = 38,410 (real local SGD), and
a synthetic model with d = 1,000,000 whose clients take one cheap step (the wrapper's worst
case relative to the clients' work).

Then the example's Flower simulation (``examples/flower_canary_audit.py``, Ray backend,
``--simulation-rounds`` rounds) reports the wrapper's share of a real runtime's strategy time.

Output: a table on stdout and ``benchmarks/results/flower_overhead.json`` (with Flower's
version).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from importlib import metadata
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

from audit_callbacks.flower import CanaryStrategy, LocalGrid, local_sgd
from benchmarks._common import (
    load_example,
    machine_info,
    parser,
    write_json,
)


def _digits_handler(hidden: int, n: int, seed: int):
    from datamodules import FederatedDataModule
    from models import MLP

    dm = FederatedDataModule("digits", num_clients=n, seed=seed)
    dm.setup("fit")
    data = [(ds.tensors[0], ds.tensors[1]) for ds in dm.client_datasets]
    torch.manual_seed(seed)
    model, worker = MLP(64, 10, hidden=(hidden,)), MLP(64, 10, hidden=(hidden,))
    gen = torch.Generator().manual_seed(seed)

    def handler(msg, i):
        arrays, loss = local_sgd(worker, msg.content["arrays"], *data[i], lr=0.1, batch_size=8,
                                 generator=gen)
        return RecordDict({"arrays": arrays,
                           "metrics": MetricRecord({"num-examples": 1, "loss": loss})})

    return ArrayRecord(model.state_dict()), handler


def _synthetic_handler(dim: int, seed: int):
    rng = np.random.default_rng(seed)
    init = ArrayRecord({"w": Array(rng.normal(0, 0.01, dim).astype(np.float32))})

    def handler(msg, i):
        w = msg.content["arrays"]["w"].numpy()
        step = np.random.default_rng(i).normal(0, 0.01, dim).astype(np.float32)
        return RecordDict({"arrays": ArrayRecord({"w": Array(w + step)}),
                           "metrics": MetricRecord({"num-examples": 1})})

    return init, handler


def run_once(scenario: dict[str, Any], audited: bool, seed: int) -> dict[str, Any]:
    n, k, q, rounds = scenario["n"], scenario["k"], scenario["q"], scenario["rounds"]
    if scenario["model"] == "digits":
        init, handler = _digits_handler(scenario["hidden"], n, seed)
    else:
        init, handler = _synthetic_handler(scenario["dim"], seed)
    population = n + (k if audited else 0)
    m = max(int(population * q), 1)
    strategy: Any = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=q, fraction_evaluate=0.0, min_available_nodes=n), 0.5, 1.0, m)
    if audited:
        strategy = CanaryStrategy(strategy, num_canaries=k, every_n_rounds=5, log_dir=None,
                                  seed=seed, bootstrap=200)
    random.seed(seed)
    np.random.seed(seed)
    walls: list[float] = []
    original = strategy.aggregate_train

    def timed_configure(*args: Any, **kwargs: Any) -> Any:
        walls.append(time.perf_counter())
        return configure(*args, **kwargs)

    configure = strategy.configure_train
    strategy.configure_train = timed_configure  # round wall time: configure to configure
    start = time.perf_counter()
    strategy.start(LocalGrid(n, handler), init, num_rounds=rounds)
    end = time.perf_counter()
    walls.append(end)
    strategy.aggregate_train = original
    round_walls = np.diff(walls)
    out: dict[str, Any] = {"total_s": end - start, "round_wall_s": round_walls.tolist(),
                           "cohort": m}
    if audited:
        out["wrapper_s"] = [strategy.backend.wrapper_seconds.get(r, 0.0) for r in range(1, rounds + 1)]
        out["d"] = strategy.backend.layout.dim
        out["k_unobserved"] = strategy.auditor.num_unobserved
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, quick="")
    p.add_argument("--repeats", type=int, default=2, help="ABBA pairs per scenario")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-simulation", action="store_true", help="skip the Ray simulation run")
    p.add_argument("--simulation-rounds", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = 6 if args.quick else 25
    scenarios = [
        {"name": "digits_mlp32", "model": "digits", "hidden": 32, "n": 200, "k": 100, "q": 0.1,
         "rounds": rounds},
        {"name": "digits_mlp512", "model": "digits", "hidden": 512, "n": 200, "k": 100, "q": 0.1,
         "rounds": rounds},
        {"name": "synthetic_d1e6", "model": "synthetic", "dim": 1_000_000, "n": 50, "k": 100,
         "q": 0.1, "rounds": max(4, rounds // 3)},
    ]
    if args.quick:
        scenarios = scenarios[:1]
    results = []
    for sc in scenarios:
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "audited": []}
        order = []
        for _ in range(args.repeats):
            order += [False, True, True, False]
        for audited in order[: 2 * args.repeats]:
            runs["audited" if audited else "baseline"].append(run_once(sc, audited, seed=0))
        last = sc["rounds"] - 1
        wrap = [w for r in runs["audited"] for w in r["wrapper_s"][:last]]
        wall = [w for r in runs["audited"] for w in r["round_wall_s"][:last]]
        base = [w for r in runs["baseline"] for w in r["round_wall_s"][:last]]
        ratio = [a / b for a, b in zip(wrap, wall, strict=True)]
        row = {
            **sc, "d": runs["audited"][0]["d"], "k_unobserved": runs["audited"][0]["k_unobserved"],
            "cohort_audited": runs["audited"][0]["cohort"],
            "cohort_baseline": runs["baseline"][0]["cohort"],
            "wrapper_s_per_round_median": statistics.median(wrap),
            "wrapper_s_per_round_mean": statistics.fmean(wrap),
            "round_wall_s_median": statistics.median(wall),
            "baseline_round_wall_s_median": statistics.median(base),
            "wrapper_share_of_round_median": statistics.median(ratio),
            "slowdown_vs_baseline_median": statistics.median(wall) / statistics.median(base),
            "final_round_wrapper_s": [r["wrapper_s"][last] for r in runs["audited"]],
            "final_round_wall_s": [r["round_wall_s"][last] for r in runs["audited"]],
            "total_s": {k: [r["total_s"] for r in v] for k, v in runs.items()},
        }
        results.append(row)
        print(f"{sc['name']:<16} d={row['d']:>9,}  wrapper {1e3 * row['wrapper_s_per_round_median']:7.1f} ms"
              f"  round {1e3 * row['round_wall_s_median']:8.1f} ms"
              f"  share {100 * row['wrapper_share_of_round_median']:5.1f}%"
              f"  slowdown x{row['slowdown_vs_baseline_median']:.2f}"
              f"  (baseline round {1e3 * row['baseline_round_wall_s_median']:.1f} ms;"
              f" final round {max(row['final_round_wrapper_s']):.2f} s in the wrapper)", flush=True)
    simulation = None
    if not args.quick and not args.no_simulation:
        # the example's Flower simulation (Ray): the wrapper's share of a real runtime's round
        example = load_example("flower_canary_audit")

        with tempfile.TemporaryDirectory() as tmp:
            res = example.main(["--rounds", str(args.simulation_rounds), "--log-dir", tmp])
        simulation = {
            "what": "examples/flower_canary_audit.py (run_simulation, Ray, 2 actors): 200 "
                    "clients + 100 canaries, cohort 30, MLP d = 2,410",
            "rounds": args.simulation_rounds,
            "strategy_seconds": res["seconds"],
            "wrapper_seconds": res["wrapper_seconds"],
            "wrapper_share": res["wrapper_seconds"] / res["seconds"],
        }
        print(f"simulation: {args.simulation_rounds} rounds in {res['seconds']:.1f} s, "
              f"{res['wrapper_seconds']:.2f} s in the wrapper "
              f"({100 * simulation['wrapper_share']:.2f}%)", flush=True)
    payload = {
        "benchmark": "flower_overhead",
        "flwr": metadata.version("flwr"),
        "grid": "LocalGrid (in-process; no transport: the wrapper's share is an upper bound)",
        "noise_multiplier": 0.5, "clip_norm": 1.0, "every_n_rounds": 5, "bootstrap": 200,
        "quick": args.quick, "repeats": args.repeats,
        "machine": machine_info(),
        "scenarios": results,
        "simulation": simulation,
    }
    if not args.quick:
        path = write_json("flower_overhead.json", payload)
        print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
