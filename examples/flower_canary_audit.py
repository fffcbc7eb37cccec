"""Flower simulation of DP-FedAvg on scikit-learn digits with a one-shot canary audit.

    python examples/flower_canary_audit.py            # 200 clients, 50 rounds (under 5 min)
    python examples/flower_canary_audit.py --quick    # 200 clients, 10 rounds (under 1 min)

A ``ServerApp`` runs Flower's ``FedAvg`` inside Flower's central-DP wrapper with server-side
fixed clipping (``DifferentialPrivacyServerSideFixedClipping``), wrapped by
:class:`audit_callbacks.flower.CanaryStrategy`, which adds canary clients sampled like the
real ones (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning",
ICLR 2024). The ``ClientApp`` trains a small torch MLP with local SGD on its digits shard
(``FederatedDataModule("digits", num_clients=...)``). Flower's simulation runtime
(``flwr.simulation.run_simulation``, Ray backend, bound to 127.0.0.1) runs the clients.
TensorBoard event files (``audit/epsilon_*``, ``val/accuracy``) and ``audit_summary.json`` go
to ``--log-dir`` (view with ``tensorboard --logdir runs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.simulation import run_simulation  # noqa: E402

from audit_callbacks.flower import CanaryStrategy, evaluate_accuracy, local_sgd  # noqa: E402
from datamodules import FederatedDataModule  # noqa: E402
from models import MLP  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 rounds (under a minute)")
    p.add_argument("--clients", type=int, default=200, help="real clients (SuperNodes)")
    p.add_argument("--canaries", type=int, default=100, help="observed canary clients k")
    p.add_argument("--clients-per-round", type=int, default=30,
                   help="m: cohort of real + canary clients; fraction_train = m / (N + k)")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--noise-multiplier", type=float, default=0.5, help="z")
    p.add_argument("--clip-norm", type=float, default=1.0, help="C")
    p.add_argument("--local-lr", type=float, default=0.1)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default="runs/flower_canary_audit")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 10)
    return args


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return MLP(64, 10, hidden=(32,))


def client_reply(arrays: ArrayRecord, x: torch.Tensor, y: torch.Tensor, *, lr: float, epochs: int
                 ) -> RecordDict:
    """One client's round: local SGD from the global ``arrays`` on its shard ``(x, y)``, with
    the batches shuffled by a secret (OS-entropy) generator. The reply holds the new model and
    ``num-examples`` 1 (the equal weights DP-FedAvg's noise calibration assumes), nothing else:
    the local training loss is an un-noised statistic of the client's data, which Flower would
    aggregate over the cohort and print every round, outside the DP guarantee."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))  # secret
    new, _ = local_sgd(make_model(), arrays, x, y, epochs=epochs, lr=lr, batch_size=8, generator=gen)
    return RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 1})})


def make_client_app(shards: list[tuple[torch.Tensor, torch.Tensor]], args: argparse.Namespace
                    ) -> ClientApp:
    """Node ``partition-id`` holds ``shards[partition-id]`` and answers with
    :func:`client_reply`."""
    app = ClientApp()
    lr, epochs = args.local_lr, args.local_epochs

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        pid = int(context.node_config["partition-id"])
        return Message(client_reply(msg.content["arrays"], *shards[pid], lr=lr, epochs=epochs), reply_to=msg)

    return app


def make_server_app(test: tuple[torch.Tensor, torch.Tensor], args: argparse.Namespace,
                    out: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        n, k, m = args.clients, args.canaries, args.clients_per_round
        # min_train_nodes: floor((n + k) * m / (n + k)) is m - 1 for some m in floating point
        fedavg = FedAvg(fraction_train=m / (n + k), min_train_nodes=m, fraction_evaluate=0.0,
                        min_available_nodes=n)
        dp = DifferentialPrivacyServerSideFixedClipping(fedavg, args.noise_multiplier,
                                                         args.clip_norm, m)
        strategy = CanaryStrategy(dp, num_canaries=k, delta=args.delta, seed=args.seed,
                                  every_n_rounds=max(1, args.rounds // 6), log_dir=args.log_dir)
        model = make_model()

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            loss, acc = evaluate_accuracy(model, arrays, *test)
            return MetricRecord({"loss": loss, "accuracy": acc})

        start = time.perf_counter()
        result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=args.rounds,
                                evaluate_fn=evaluate)
        out.update(seconds=time.perf_counter() - start, summary_path=strategy.summary_path,
                   accuracy=evaluate(args.rounds, result.arrays)["accuracy"],
                   wrapper_seconds=sum(strategy.backend.wrapper_seconds.values()))

    return app


def estimate_row(name: str, entry: Mapping[str, Any] | None) -> str:
    """One line of the printed table: the summary's value with its interval, followed by its
    status where that is not ``ok`` (``too few canaries (k = 19)``, ``stale: from step N``: the
    number is the summary's, to be read with that caveat); ``-`` and the reason where the
    summary holds no number (``skipped: <reason>``)."""
    e = entry or {}
    status = str(e.get("status", "not in the summary"))
    value = e.get("value")
    if value is None:
        return f"  {name:<40} {'-':>10}  ({status})"
    lo, hi = e.get("lower"), e.get("upper")
    ci = f"  [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
    note = "" if status == "ok" else f"  ({status})"
    return f"  {name:<40} {float(value):>10.3f}{ci}{note}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    dm = FederatedDataModule("digits", num_clients=args.clients, seed=args.seed)
    dm.setup("fit")
    shards = [(ds.tensors[0], ds.tensors[1]) for ds in dm.client_datasets]
    test = (dm.test_dataset.tensors[0], dm.test_dataset.tensors[1])
    out: dict[str, Any] = {}
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": 2, "include_dashboard": False,
                             "_node_ip_address": "127.0.0.1", "log_to_driver": False}}
    start = time.perf_counter()
    run_simulation(make_server_app(test, args, out), make_client_app(shards, args),
                   num_supernodes=args.clients, backend_config=backend)
    if not out.get("summary_path"):
        raise RuntimeError("the ServerApp did not finish; see Flower's log above")
    with open(out["summary_path"], encoding="utf-8") as fh:
        summary = json.load(fh)
    est = summary["results"] or {}

    def row(name: str, key: str) -> str:
        return estimate_row(name, est.get(key))

    print()
    print(f"Flower DP-FedAvg on digits: {args.rounds} rounds, {args.clients} clients + "
          f"{summary['inputs']['num_canaries']} canary clients, cohort "
          f"{summary['inputs'].get('clients_per_round')}, z = {args.noise_multiplier}, "
          f"C = {args.clip_norm}, d = {summary['inputs']['dim']} "
          f"({time.perf_counter() - start:.0f} s in all, strategy {out['seconds']:.0f} s, "
          f"canary wrapper {out['wrapper_seconds']:.1f} s)")
    print(f"  test accuracy {out['accuracy']:.3f}; {summary.get('num_canaries_participated', 0)} "
          f"canaries took part (at most {summary.get('max_participations', 0)} times each)")
    print(f"  epsilon at delta = {args.delta:g} (intervals: 95% bootstrap)")
    for tm, label in (("final_model", "final model"), ("all_iterates", "all iterates")):
        print(row(f"{label} (equal-variance fit)", f"epsilon_{tm}"))
        print(row(f"{label}, 95% lower bound", f"epsilon_lower_bound_{tm}"))
        print(row("  (parametric, Gaussian scores)", f"epsilon_gdp_lower_bound_{tm}"))
    analytic = summary.get("epsilon_analytic")
    print(f"  {'analytic (rounds known)':<40} {analytic if analytic is None else round(analytic, 3)!s:>10}")
    print(f"  TensorBoard: tensorboard --logdir {args.log_dir}; summary: {out['summary_path']}")
    return {"summary": summary, **out}


if __name__ == "__main__":
    main()
