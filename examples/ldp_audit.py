"""Federated training on digits under LDP-SGD, audited by the five adversaries of Matsumoto et al..

    python examples/ldp_audit.py               # eps0 in {0.5, 1, 2, 4}, about a minute on 2 cores
    python examples/ldp_audit.py --quick       # a few seconds (smoke test)
    python examples/ldp_audit.py --accelerator gpu    # on a CUDA GPU (default: auto)

For each eps0, DP-FedAvg trains multinomial logistic regression on sklearn's digits (clients
hold shards of the training split). Each client computes its full-batch gradient (one local step
at learning rate 1), which LDP-SGD (docs/methods/ldp.md, C1) randomizes before the server debiases and averages
it. ``LDPAudit`` runs the empirical epsilon-0 test (Matsumoto et al. Alg. 2; docs/methods/ldp.md, C2, exact fast path
C3) every ``--audit-every`` rounds for the benign, label-flip, gradient-flip, collusion and dummy
adversaries (Table 2), against the run's own randomizer and global model.

Written to ``--out`` (default ``runs/ldp_audit``):

* ``ldp_audit.csv``: one row per eps0, audit and adversary (estimate, 95% lower bound, upper
  bound, L, counts), the columns named as ``LDPAudit``'s records and tags (``epsilon0``,
  ``epsilon0_lower_bound``...);
* ``ldp_audit.png``: the estimates per adversary and eps0 (like Matsumoto et al. Figure 4 / 001 Table 1)
  and the share of the real clients' updates clipped to L;
* one TensorBoard run and ``ldp_audit_summary.json`` per eps0 (``tensorboard --logdir runs``).

It prints the issue's checks: (1) the dummy and collusion adversaries reach eps0 (eps0 inside the
interval of every audit); (2) gradient flip reaches eps0 in the audits where |g1| >= L, and the
smaller closed-form value 2 artanh(tanh(eps0/2) |g1|/L) where |g1| < L; (3) every audit's interval
holds the closed-form value of its pair (Matsumoto et al. §3.1; derived in attacks/ldp_test.py), for every
adversary; (4) the correct randomizer is never flagged. The checks read the crafted pairs' norms
and closed-form values from ``LDPAudit.history`` in memory: they are values of real examples, so
no file holds them (docs/security.md), and the audit draws its client from secret OS entropy. The intervals of (1)-(3) are Bonferroni
corrected over all checked audits, so all of them hold together with probability >= 95%.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _cli

import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _cli import add_accelerator_argument, trainer_kwargs  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

from audit_callbacks.callbacks.ldp_audit import (  # noqa: E402
    ADVERSARY_NAMES,
    BrokenRandomizerWarning,
    LDPAudit,
)
from audit_callbacks.estimators.shuffle import epsilon_from_counts  # noqa: E402
from audit_callbacks.federated import DPFedAvg  # noqa: E402
from audit_callbacks.mechanisms import LDPSGD  # noqa: E402
from datamodules import FederatedDataModule  # noqa: E402
from models import build_model  # noqa: E402

CSV_FIELDS = (
    "epsilon0_claimed", "round", "adversary", "epsilon0", "epsilon0_lower_bound",
    "epsilon0_upper_bound", "ceiling", "clip_norm", "tp", "fn", "fp", "tn", "trials",
    "flagged",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0], help="eps0 values")
    p.add_argument("--clip-norm", type=float, default=1.0, help="L, LDP-SGD's (and DP-FedAvg's) clip norm")
    p.add_argument("--rounds", type=int, default=100, help="federated rounds per eps0")
    p.add_argument("--audit-every", type=int, default=25, help="rounds between audits (and at the end)")
    p.add_argument("--trials", type=int, default=10_000, help="trials per adversary and audit")
    p.add_argument("--clients", type=int, default=300, help="real clients")
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--server-lr", type=float, default=0.2)
    p.add_argument("--alpha", type=float, default=0.05, help="1 - confidence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("runs", "ldp_audit"), help="output directory")
    p.add_argument("--quick", action="store_true", help="tiny configuration (seconds; smoke test)")
    add_accelerator_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.audit_every, args.trials = 4, 2, 2000
        args.clients, args.clients_per_round = 40, 10
    return args


def train_one(eps0: float, args: argparse.Namespace) -> dict:
    """Train under LDP-SGD(eps0, L) with an LDPAudit; returns its records, accuracy and time."""
    pl.seed_everything(args.seed, verbose=False)
    dm = FederatedDataModule("digits", num_clients=args.clients, rounds_per_epoch=args.rounds, seed=args.seed)
    dm.setup("fit")
    model = build_model("mlp", dm.input_shape, dm.num_classes, hidden=())  # logistic regression
    module = DPFedAvg(
        model,
        clients_per_round=args.clients_per_round,
        noise_multiplier=0.0,  # local DP only: LDP-SGD is the privacy mechanism
        clip_norm=args.clip_norm,
        local_epochs=1,
        local_lr=1.0,
        local_batch_size=10**6,  # one full-batch step: the update is minus the client's gradient
        server_lr=args.server_lr,
        server_momentum=0.0,
        sampling="uniform",
        randomizer=LDPSGD(eps0, args.clip_norm),  # cohorts: secret (OS entropy)
    )
    # no seed: the audited client, examples and trials are secret (a seed would publish them)
    audit = LDPAudit(trials=args.trials, alpha=args.alpha, every_n_rounds=args.audit_every)
    logger = TensorBoardLogger(args.out, name=f"eps0_{eps0:g}", version=0)
    trainer = pl.Trainer(
        max_steps=args.rounds, max_epochs=-1, logger=logger, callbacks=[audit], **trainer_kwargs(args.accelerator),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, log_every_n_steps=max(1, args.rounds // 20),
    )
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BrokenRandomizerWarning)
        trainer.fit(module, datamodule=dm)
    elapsed = time.perf_counter() - start
    acc = trainer.callback_metrics.get("val/accuracy")
    return {
        "epsilon0_claimed": eps0,
        "records": audit.history,
        "flags": audit.flags,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, BrokenRandomizerWarning)],
        "accuracy": None if acc is None else float(acc),
        "update_norms": audit.audit_summary(module)["client_update_norms"],
        "dim": module.num_parameters,
        "elapsed_s": elapsed,
        "summary_path": audit.summary_path,
    }


def _interval(rec: dict, alpha: float) -> tuple[float, float]:
    ce = epsilon_from_counts(rec["tp"], rec["fn"], rec["fp"], rec["tn"], alpha)
    return ce.epsilon_lower_bound, ce.epsilon_upper_bound


def run_checks(results: list[dict], alpha: float) -> dict:
    """The issue's checks, with Bonferroni-corrected intervals over all checked audits."""
    records = [r for res in results for r in res["records"]]
    n = max(1, len(records))
    a = alpha / n  # each interval end at a/2: all intervals hold together w.p. >= 1 - alpha
    rel = 1e-9
    out: dict[str, list[str]] = {"reach": [], "gradient_flip": [], "closed_form": [], "flags": []}
    for res in results:
        eps0 = res["epsilon0_claimed"]
        for rec in res["records"]:
            lo, hi = _interval(rec, a)
            expected = rec["epsilon0_expected"]
            tag = f"eps0={eps0:g} round {rec['round']} {rec['adversary']}"
            inside = expected is not None and lo <= expected * (1 + rel) and expected <= hi * (1 + rel)
            if not inside:
                out["closed_form"].append(f"{tag}: closed form {expected} outside [{lo:.3f}, {hi:.3f}]")
            at_clip = rec["norm_g1"] >= rec["clip_norm"]
            if rec["adversary"] in ("dummy", "collusion"):
                if not at_clip or not lo <= eps0 <= hi:
                    out["reach"].append(f"{tag}: |g1| = {rec['norm_g1']:.3g}, eps0 not in [{lo:.3f}, {hi:.3f}]")
            if rec["adversary"] == "gradient_flip":
                if at_clip and not lo <= eps0 <= hi:
                    out["gradient_flip"].append(f"{tag}: |g1| >= L but eps0 not in [{lo:.3f}, {hi:.3f}]")
                if not at_clip and not (expected < eps0 and inside):
                    out["gradient_flip"].append(f"{tag}: |g1| < L, closed form {expected} not reached")
        if res["flags"] or res["warnings"]:
            out["flags"].append(f"eps0={eps0:g}: {res['flags']}")
    out["bonferroni_alpha"] = a  # type: ignore[assignment]
    out["audits_checked"] = n  # type: ignore[assignment]
    return out


def write_csv(results: list[dict], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for res in results:
            for rec in res["records"]:
                row = {k: rec.get(k) for k in CSV_FIELDS}
                writer.writerow(row)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    ax, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    eps = [res["epsilon0_claimed"] for res in results]
    x = np.arange(len(eps))
    width = 0.8 / len(ADVERSARY_NAMES)
    for j, name in enumerate(ADVERSARY_NAMES):
        means, los, his = [], [], []
        for res in results:
            recs = [r for r in res["records"] if r["adversary"] == name]
            vals = [r["epsilon0"] for r in recs]
            means.append(np.mean(vals) if vals else np.nan)
            los.append(min(r["epsilon0_lower_bound"] for r in recs) if recs else np.nan)
            his.append(max(vals) if vals else np.nan)
        means = np.asarray(means)
        err = np.vstack([means - np.asarray(los), np.asarray(his) - means])
        ax.bar(x + (j - 2) * width, means, width, yerr=err, capsize=2, label=name.replace("_", " "))
    for i, e in enumerate(eps):
        ax.hlines(e, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1,
                  label="claimed eps0" if i == 0 else None)
    ax.set_xticks(x, [f"{e:g}" for e in eps])
    ax.set_xlabel("claimed eps0 (LDP-SGD)")
    ax.set_ylabel("empirical eps0 (mean over audits)")
    ax.set_title("LDP audit on digits (bars: min 95% lower bound .. max estimate)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    # aggregates over every real client update of the run; no crafted pair's norm (a real
    # example's value) is drawn
    shares = [res["update_norms"]["client_updates_at_clip"] for res in results]
    ax2.bar(x, [np.nan if v is None else v for v in shares], 0.6, color="tab:gray")
    ax2.set_xticks(x, [f"{e:g}" for e in eps])
    ax2.set_ylim(0, 1)
    ax2.set_xlabel("claimed eps0 (LDP-SGD)")
    ax2.set_ylabel("share of client updates clipped to L")
    ax2.set_title("real clients' updates at the clip norm (all rounds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    results = [train_one(float(e), args) for e in args.epsilons]
    csv_path = os.path.join(args.out, "ldp_audit.csv")
    png_path = os.path.join(args.out, "ldp_audit.png")
    write_csv(results, csv_path)
    plot(results, png_path)
    checks = run_checks(results, args.alpha)

    print(f"\nLDP-SGD on digits: {args.rounds} rounds, {args.clients} clients, {args.clients_per_round} "
          f"per round, L = {args.clip_norm}, d = {results[0]['dim']}, {args.trials} trials per "
          f"adversary and audit ({time.perf_counter() - start:.0f} s in all)")
    head = "  eps0  acc   " + "".join(f"{n:>15}" for n in ADVERSARY_NAMES)
    print("  empirical eps0, mean over audits [smallest 95% lower bound]")
    print(head)
    for res in results:
        cells = []
        for name in ADVERSARY_NAMES:
            recs = [r for r in res["records"] if r["adversary"] == name]
            if recs:
                m = np.mean([r["epsilon0"] for r in recs])
                lo = min(r["epsilon0_lower_bound"] for r in recs)
                cells.append(f"{m:>7.2f} [{lo:>4.2f}]")
            else:
                cells.append(f"{'-':>15}")
        acc = res["accuracy"]
        print(f"  {res['epsilon0_claimed']:>4g}  {acc if acc is None else f'{acc:.2f}'}  " + "".join(f"{c:>15}" for c in cells))
    print("  real client updates clipped to L (all rounds; no crafted pair's norm is shown):")
    for res in results:
        un = res["update_norms"]
        share = un["client_updates_at_clip"]
        if share is None:  # withheld below the audit's block of clients, or none seen
            print(f"    eps0={res['epsilon0_claimed']:g}: {un['status']}")
        else:
            print(f"    eps0={res['epsilon0_claimed']:g}: {share:.0%} of {un['count']} updates "
                  f"(published; {un['seen']} seen)")

    print(f"  checks ({checks['audits_checked']} audits, Bonferroni: each interval at "
          f"{1 - checks['bonferroni_alpha']:.5f}):")
    labels = {
        "reach": "dummy and collusion reach eps0 (eps0 within every interval, |g1| >= L)",
        "gradient_flip": "gradient flip reaches eps0 when |g1| >= L (and its closed form when < L)",
        "closed_form": "every adversary's interval holds the closed-form value of its pair",
        "flags": "the correct randomizer is never flagged",
    }
    ok = True
    for key, text in labels.items():
        failures = checks[key]
        ok &= not failures
        print(f"    [{'PASS' if not failures else 'FAIL'}] {text}")
        for f in failures[:5]:
            print(f"        {f}")
    print(f"\nCSV: {csv_path}\nPNG: {png_path}\nTensorBoard: tensorboard --logdir {args.out}")
    return {"results": results, "checks": checks, "ok": ok, "csv": csv_path, "png": png_path}


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
