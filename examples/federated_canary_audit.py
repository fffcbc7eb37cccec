"""DP-FedAvg on scikit-learn digits with a one-shot canary audit (Andrew et al. 2024), end to end.

    python examples/federated_canary_audit.py                       # the demo (make demo)
    python examples/federated_canary_audit.py --noise-multiplier 1  # another claim
    python examples/federated_canary_audit.py --quick               # 10 rounds (smoke test)
    python examples/federated_canary_audit.py --accelerator gpu     # on a CUDA GPU (default: auto)

Trains an MLP (one hidden layer of 200; ``--model cnn`` for a CNN) with DP-FedAvg over
clients holding shards of the digits data, inserts canary clients with ``CanaryAudit``, and
prints the empirical epsilons (final model and all iterates), their 95% lower bounds and the
analytic epsilon (the claim), the estimate / claim ratio against the range a correct run shows
at these settings (``plan_audit``), and where the report is. TensorBoard logs,
``audit_summary.json`` and ``audit_report.html`` go to ``--log-dir`` (view with ``tensorboard
--logdir runs``; set smoothing to 0).

The defaults claim epsilon = 8.3 at delta = 1e-6: noise multiplier 2 over the 10 rounds each
client (and canary) takes part in. An epsilon of at most 10 is the range where a DP guarantee
still means something (Ponomareva et al., "How to DP-fy ML: A Practical Guide to Machine Learning
with Differential Privacy", JAIR 2023). The model still learns at that noise (about 0.9
validation accuracy) because a round averages 310 clipped updates (about 280 real clients, each
holding one or two of the 1,437 training examples), so the noise on the average is small; the
small CNN (``--model cnn``, d = 13,706) reaches about 0.77 at the same claim. 50 rounds take 10 to
20 s on 2 cores. The 150 canaries stay under 10% of the population, so they barely crowd real
clients out of a cohort (more would be warned about).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _cli

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _cli import add_accelerator_argument, trainer_kwargs  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

from audit_callbacks.callbacks import CanaryAudit  # noqa: E402
from audit_callbacks.federated import DPFedAvg  # noqa: E402
from datamodules import FederatedDataModule  # noqa: E402
from models import build_model  # noqa: E402


def plan_range(summary: dict) -> tuple[float, float, float] | None:
    """``(low, high, coverage)``: the estimate / claim range a correct run shows at this run's
    settings, with its probability, as the library planned it (the summary's ``plan_ratio_low``,
    ``plan_ratio_high``, ``plan_coverage``; docs/methods/planner.md). None where the run was not
    planned (``plan_status`` says why)."""
    low, high = summary.get("plan_ratio_low"), summary.get("plan_ratio_high")
    if low is None or high is None:
        return None
    return low, high, summary.get("plan_coverage") or float("nan")


def why_this_level(claim: float, delta: float, ceiling: float | None, participations: int) -> str:
    """Why the demo runs at this privacy level, true for any ``--noise-multiplier`` and run
    length: the claim's tier on Ponomareva et al.'s scale (JAIR 2023: epsilon <= 1 strong, <= 10
    reasonable, above little formal protection) and what can check it (the valid bound only
    below its ceiling); the comparisons are claims at the run's own participations and delta."""
    from audit_callbacks.estimators import gaussian_epsilon

    r = max(1, int(participations))
    if claim <= 1:
        tier = "at most 1, a strong formal guarantee"
    elif claim <= 10:
        tier = "at most 10, where a DP guarantee still means something"
    else:
        tier = (f"above 10, which promises little (the default z = 2 would claim "
                f"{gaussian_epsilon(2.0, delta, compositions=r):.1f} here)")
    check = ("the canaries' valid bound can check it" if ceiling is not None and claim < ceiling
             else "the estimate's interval can still check it (the valid bound's ceiling "
                  f"{ceiling:.2f} is below the claim)" if ceiling is not None
             else "the canaries' estimate can check it")
    return (f"Why this privacy level: the claim is epsilon = {claim:.1f} at delta = {delta:g}, "
            f"{tier} (Ponomareva et al., JAIR 2023; z = 0.1 would claim "
            f"{gaussian_epsilon(0.1, delta, compositions=r):.0f} here, which promises nothing), "
            f"and {check}.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--noise-multiplier", type=float, default=2.0, help="z: noise std / clip norm")
    p.add_argument("--clip-norm", type=float, default=1.0, help="C: L2 bound of a client update")
    p.add_argument("--canaries", type=int, default=150,
                   help="observed canaries (default 150: under 10%% of the population, which keeps "
                        "them from crowding the real clients out of a cohort)")
    p.add_argument("--unobserved", type=int, default=None,
                   help="unobserved canaries (default: Hadamard min(n - k, 100000); Gaussian = canaries)")
    p.add_argument("--kind", choices=["hadamard", "gaussian"], default="hadamard",
                   help="canary kind (see CanaryAudit's canaries argument)")
    p.add_argument("--rounds", type=int, default=50, help="federated rounds")
    p.add_argument("--rounds-per-epoch", type=int, default=10, help="rounds between validations")
    p.add_argument("--clients", type=int, default=1400, help="real clients")
    p.add_argument("--clients-per-round", type=int, default=310)
    p.add_argument("--sampling", choices=["uniform", "shuffle", "poisson"], default="shuffle")
    p.add_argument("--model", choices=["cnn", "mlp"], default="mlp")
    p.add_argument("--hidden", default="200",
                   help="the MLP's hidden widths, comma-separated (default 200: d = 15,010 parameters)")
    p.add_argument("--local-lr", type=float, default=0.5)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--server-lr", type=float, default=1.0)
    p.add_argument("--server-momentum", type=float, default=0.9)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default="runs")
    p.add_argument("--quick", action="store_true",
                   help="at most 10 rounds (seconds; smoke test: a smaller claim, fewer participations)")
    add_accelerator_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 10)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    pl.seed_everything(args.seed, verbose=False)
    torch.set_num_threads(1)  # small models: one thread is fastest and avoids oversubscription
    dm = FederatedDataModule(
        "digits", num_clients=args.clients, rounds_per_epoch=args.rounds_per_epoch, seed=args.seed,
    )
    dm.setup("fit")
    hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    model = build_model(args.model, dm.input_shape, dm.num_classes, **({"hidden": hidden} if args.model == "mlp" else {}))
    module = DPFedAvg(
        model,
        clients_per_round=args.clients_per_round,
        noise_multiplier=args.noise_multiplier,
        clip_norm=args.clip_norm,
        local_epochs=args.local_epochs,
        local_lr=args.local_lr,
        local_batch_size=8,
        server_lr=args.server_lr,
        server_momentum=args.server_momentum,
        sampling=args.sampling,
        delta=args.delta,  # cohorts and local batches: secret (OS entropy, never logged)
    )
    audit = CanaryAudit(args.canaries, args.unobserved, canaries=args.kind, seed=args.seed)
    logger = TensorBoardLogger(args.log_dir, name="federated_canary_audit")
    trainer = pl.Trainer(
        max_steps=args.rounds,
        max_epochs=-1,
        logger=logger,
        callbacks=[audit],
        **trainer_kwargs(args.accelerator),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=5,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    elapsed = time.perf_counter() - start
    result = trainer.validate(module, datamodule=dm, verbose=False)[0]

    with open(audit.summary_path, encoding="utf-8") as fh:
        summary = json.load(fh)
    est = summary["results"] or {}

    def row(name: str, key: str, reference: str | None = None) -> str:
        # the summary's number with its status where not ok ("too few canaries (k = 19)": to be
        # read with that caveat); "-" and the reason only where the summary holds no number
        e = est.get(key) or {}
        status = e.get("status", "not in the summary")
        if e.get("value") is None:
            return f"  {name:<40} {'-':>9}  ({status})"
        lo, hi = e.get("lower"), e.get("upper")
        ci = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
        ref = summary.get(reference) if reference else None
        ratio = f"   {e['value'] / ref:.2f} of the reference" if ref and ref != float("inf") else ""
        note = "" if status == "ok" else f"  ({status})"
        return f"  {name:<40} {e['value']:>9.3f}{ci}{ratio}{note}"

    def value(key: str) -> str:
        v = summary.get(key)
        return "-" if v is None else f"{v:>9.3f}"

    print()
    print(f"DP-FedAvg on digits: {args.rounds} rounds, {args.clients} clients, "
          f"{args.clients_per_round} per round, z = {args.noise_multiplier}, C = {args.clip_norm}, "
          f"d = {module.num_parameters} parameters ({elapsed:.0f} s)")
    print(f"  validation accuracy {result.get('val/accuracy', float('nan')):.3f}; "
          f"{summary.get('num_canaries_participated', 0)} canaries took part "
          f"(at most {summary.get('max_participations', 0)} times each)")
    print(f"  epsilon at delta = {args.delta:g} (intervals: 95% bootstrap)")
    print("  all iterates (the adversary sees every round and knows a canary's rounds)")
    print(row("  estimate  <- the number to read", "epsilon_all_iterates", "epsilon_analytic"))
    print(f"  {'  claim: analytic epsilon':<40} {value('epsilon_analytic')}")
    print(row("  valid 95% lower bound", "epsilon_lower_bound_all_iterates"))
    print(row("  (known-rounds statistic alone)", "epsilon_all_iterates_matched"))
    print(row("  (Andrew et al.'s max cosine)", "epsilon_all_iterates_max_cosine"))
    print("  final model (the adversary sees only the last model)")
    print(row("  estimate", "epsilon_final_model", "epsilon_last_iterate_heuristic"))
    print(f"  {'  reference: last-iterate heuristic':<40} {value('epsilon_last_iterate_heuristic')}")
    print(row("  valid 95% lower bound", "epsilon_lower_bound_final_model"))
    claim, ratio = summary.get("epsilon_analytic"), summary.get("epsilon_ratio_all_iterates")
    planned = plan_range(summary)
    if planned is not None and ratio is not None:
        low, high, coverage = planned
        where = "inside" if low <= ratio <= high else "OUTSIDE"
        print(f"  estimate / claim {ratio:.2f}: {where} [{low:.2f}, {high:.2f}], the range of a correct run "
              f"at these settings ({coverage:.0%}, plan_audit)")
        if where == "OUTSIDE":
            print(f"  (a correct run lands outside it {1 - coverage:.0%} of the time: rerun; outside again, "
                  "and the run or its claim is not what the planner models: docs/methods/planner.md)")
    if claim is not None:
        print(f"\n{why_this_level(claim, args.delta, summary.get('plan_ceiling'), summary.get('max_participations') or 1)}")
    print(f"TensorBoard logs: {logger.log_dir}  (tensorboard --logdir {args.log_dir}; smoothing 0)")
    print(f"Summary: {audit.summary_path}")  # the library printed "audit report: <path>"
    return summary


if __name__ == "__main__":
    main()
