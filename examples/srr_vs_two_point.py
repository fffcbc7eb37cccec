"""Per-weight LDP randomizers in federated training: SRR vs two-point vs GRR (Varun et al. 2024).

    python examples/srr_vs_two_point.py            # eps 1..5, about 2 minutes on 2 cores
    python examples/srr_vs_two_point.py --quick    # a few seconds (smoke test)
    python examples/srr_vs_two_point.py --accelerator gpu   # training on a CUDA GPU (default: auto)

Three questions, one CSV each, and one PNG (``--out``, default ``runs/srr_vs_two_point``):

1. Accuracy (``training.csv``). DP-FedAvg trains multinomial logistic regression (d = 650
   weights) on sklearn's digits; every client's update is randomized weight by weight before the
   server aggregates it (``DPFedAvg(randomizer=...)``, no central noise). All randomizers share one
   domain [c - r, c + r] (c = 0, r = ``--radius``, about the 99.9th percentile of |update
   coordinate| in a noise-free run) and the grid ones one grid (precision ``--precision``:
   D = 2 r 10^p + 1 = 401 values by default; 002 §6.2 found p = 4 best):

   * ``two_point``: LDP-FL (002 eq. 1; docs/methods/ldp.md, C5), unbiased, server averages the outputs;
   * ``srr``: staircase randomized response (002 §4.3-4.4; docs/methods/ldp.md, C6), m = ``--groups``, server
     applies the mechanism's unbiased debiasing table before averaging (``Staircase.debias``);
   * ``srr_plain``: the same randomizer, but the server averages the raw outputs as 002's server
     does (biased towards c: a shrunken, nonlinear update);
   * ``grr``: generalized randomized response on the same grid (002 §6.3's baseline), server
     applies the exact affine inverse.

   The grid mechanisms round a clipped weight to the grid stochastically (unbiased; a mixture of
   two grid inputs, so eps is unchanged); with nearest rounding most update coordinates, far
   smaller than the grid step at coarse precision, would be rounded to c. A noise-free run gives
   the reference accuracy. Paper 002's anchors (SRR-FL: MNIST 96.2% at eps = 5, 94.3% at eps = 3,
   noise-free 97.9%, GRR 10-20%) are for MNIST with a bigger model; here compare the ordering.

2. The LDP-FL inference attack (002 §3.1; ``LDPFLInferenceAttack``) on the randomized updates
   of each run. The server keeps every round's released rows and predicts, per weight, the mean
   of what the clients fed the randomizer (their clipped updates: the target). How it applies
   beyond two-point: eq. 2 is "invert the mean of the releases with the mechanism's own
   unbiased estimator"; for any mechanism with a per-value unbiased estimator g (two-point:
   identity; GRR: its affine inverse; SRR: its debiasing table) the server averages g(released)
   instead (``attack_error``). ``attack_error_naive`` averages the raw releases (identity
   inversion: eq. 2 for two-point, what a server that ignores the mechanism gets for SRR/GRR).
   Errors are |prediction - target| / (2r), averaged over the d weights; ``trivial_error`` is
   the error of predicting c for every weight (knowing nothing). The attack's error is set by
   the variance of g(y) (error ~ sd / sqrt(reports)), the same variance that costs accuracy.

3. The whole-update epsilon an audit measures (``audit.csv``). Each weight is eps-LDP; an
   update of d weights randomized independently is d eps-LDP by basic composition, and that is
   exact for a product mechanism under pure DP (the worst input pair and output can be taken in
   every coordinate at once: inputs c + r and c - r in every weight, the output that attains the
   per-weight maximum ratio in every weight). Per randomizer, eps and d in ``--dims``:

   * ``exact_per_coordinate``: ``exact_epsilon`` of the deployed mechanism (enumeration of the
     largest log-ratio of output probabilities over all grid inputs and outputs);
   * ``exact_whole`` = d x ``exact_per_coordinate``; ``claimed_whole`` = ``epsilon_for_dim(d)``;
   * the empirical whole-vector test (Matsumoto et al. Alg. 2, ``ldp_epsilon_test``) with the dummy pair
     for this domain, g1 = (c + r, ..., c + r), g2 = (c - r, ..., c - r), ``--trials`` trials:
     its estimate, 95% lower bound and ceiling; and ``population_epsilon``, the exact value the
     test converges to (eq. 3 at the exact FPR/FNR of its cosine guess, whose sign is the sign of
     the sum of the d released values: a d-fold convolution of one weight's output law).

   The cosine guess is a majority vote: it sees far less than d eps (for GRR on 401 values
   hardly anything even at d = 1), and whatever the test, a lower bound from K trials cannot
   exceed the ceiling (about log K). Only the enumeration certifies the claim. The test runs on
   an integer-valued twin of each mechanism (grid mechanisms: precision 0, radius (D - 1)/2, the
   same D, groups and step, hence the same law over grid indices, checked; two-point: radius
   tanh(eps/2), outputs exactly +-1), so that the sums of released values, and the ties at 0 that
   the guess resolves to "1", are exact in floating point; the cosine statistic is
   scale-invariant, so the test is the same as on the deployed mechanism.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _cli

import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _cli import add_accelerator_argument, trainer_kwargs  # noqa: E402

from audit_callbacks.attacks import LDPFLInferenceAttack, ldp_epsilon_test  # noqa: E402
from audit_callbacks.estimators import epsilon_from_error_rates  # noqa: E402
from audit_callbacks.federated import DPFedAvg, FederatedAuditHooks  # noqa: E402
from audit_callbacks.mechanisms import (  # noqa: E402
    GRR,
    PerCoordinateRandomizer,
    Staircase,
    TwoPoint,
    exact_epsilon,
)
from datamodules import FederatedDataModule  # noqa: E402
from models import build_model  # noqa: E402

MECHANISMS = ("two_point", "srr", "srr_plain", "grr")
AUDITED = ("two_point", "srr", "grr")  # srr_plain releases exactly what srr releases
TRAINING_FIELDS = (
    "mechanism", "epsilon", "seed", "accuracy", "rounds", "clients_per_round", "d",
    "claimed_whole_update_epsilon", "clipped_fraction", "attack_error", "attack_error_median",
    "attack_error_naive", "trivial_error", "attack_confidence", "fit_seconds",
)
AUDIT_FIELDS = (
    "mechanism", "epsilon", "d", "exact_per_coordinate", "exact_whole", "claimed_whole",
    "trials", "tp", "fn", "fp", "tn", "test_epsilon", "test_lower_bound", "test_upper_bound",
    "ceiling", "population_fpr", "population_fnr", "population_epsilon",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0, 5.0],
                   help="per-weight epsilon values")
    p.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    p.add_argument("--radius", type=float, default=0.02, help="r: the domain is [-r, r] per weight")
    p.add_argument("--precision", type=int, default=4, help="p: grid step 10^-p (SRR, GRR)")
    p.add_argument("--groups", type=int, default=4, help="m: SRR's number of groups")
    p.add_argument("--rounds", type=int, default=40, help="federated rounds per run")
    p.add_argument("--clients", type=int, default=100, help="real clients")
    p.add_argument("--clients-per-round", type=int, default=50)
    p.add_argument("--hidden", type=int, nargs="*", default=[],
                   help="MLP hidden widths (default none: logistic regression, d = 650)")
    p.add_argument("--local-lr", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0, help="DP-FedAvg's L2 clip of an update")
    p.add_argument("--server-lr", type=float, default=1.0)
    p.add_argument("--server-momentum", type=float, default=0.9)
    p.add_argument("--dims", type=int, nargs="+", default=[1, 4, 16],
                   help="d of the whole-vector test (1 or a power of 4 keeps its sums exact)")
    p.add_argument("--trials", type=int, default=20_000, help="trials of each whole-vector test")
    p.add_argument("--seeds", type=int, default=1, help="training runs per (mechanism, eps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("runs", "srr_vs_two_point"), help="output directory")
    p.add_argument("--quick", action="store_true", help="tiny configuration (seconds; smoke test)")
    add_accelerator_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.epsilons = [1.0, 5.0]
        args.rounds, args.clients, args.clients_per_round = 6, 20, 10
        args.dims, args.trials = [1, 4], 2000
    for k in ("rounds", "clients", "clients_per_round", "trials", "seeds"):
        if getattr(args, k) < 1:
            raise SystemExit(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    for d in args.dims:
        if d < 1 or (d != 1 and round(math.sqrt(d)) ** 2 != d) or (d & (d - 1)):
            raise SystemExit(f"--dims: {d} is not 1 or a power of 4 (the test's sums would be inexact)")
    return args


# ---------------------------------------------------------------------------------- randomizers
def make_randomizer(name: str, eps: float, args: argparse.Namespace) -> PerCoordinateRandomizer:
    """The deployed per-weight randomizer ``name`` at per-weight epsilon ``eps`` (domain [-r, r])."""
    if name == "two_point":
        return TwoPoint(eps, 0.0, args.radius)
    if name in ("srr", "srr_plain"):
        return Staircase(eps, 0.0, args.radius, args.precision, args.groups, rounding="stochastic",
                         debias_method="unbiased" if name == "srr" else "none")
    if name == "grr":
        return GRR(eps, 0.0, args.radius, args.precision, rounding="stochastic")
    raise ValueError(f"unknown mechanism {name!r}")


def integer_twin(mech: PerCoordinateRandomizer) -> tuple[PerCoordinateRandomizer, float]:
    """(twin with integer-valued outputs and the same law, an input value beyond its domain end).

    Grid mechanisms: precision 0, radius (D - 1)/2, same D (and groups/step for SRR): the same
    transition matrix over grid indices (checked). Two-point: radius tanh(eps/2), so that the
    outputs are exactly +-1; inputs at either domain end have the same law whatever r.
    """
    eps = mech.epsilon_per_coordinate
    if isinstance(mech, TwoPoint):
        twin: PerCoordinateRandomizer = TwoPoint(eps, 0.0, math.tanh(eps / 2.0))
        assert twin.outputs == (-1.0, 1.0)
        return twin, 1.0
    half = (mech.domain_size - 1) // 2
    if isinstance(mech, Staircase):
        twin = Staircase(eps, 0.0, half, 0, mech.groups, mech.delta_d)
    elif isinstance(mech, GRR):
        twin = GRR(eps, 0.0, half, 0)
    else:
        raise TypeError(f"no integer twin for {type(mech).__name__}")
    if not torch.equal(twin.transition_matrix(), mech.transition_matrix()):
        raise AssertionError(f"the integer twin of {mech!r} has another law")
    return twin, float(half)


def sum_sign_rates(twin: PerCoordinateRandomizer, d: int, s: float) -> tuple[float, float]:
    """Exact (FPR, FNR) of the cosine guess for the pair g1 = s 1_d, g2 = -s 1_d (Matsumoto et al. eq. 4).

    cos(y, g1) - cos(y, g2) has the sign of sum(y) (0 for a tie, guessed "1"), so with
    b = 1 <-> g1: FPR = P(sum(y) < 0 | g1), FNR = P(sum(y) >= 0 | g2); the law of sum(y) is the
    d-fold convolution of one weight's output law (integer-valued for the twins).
    """
    values, probs = twin.output_distribution(torch.tensor([s, -s], dtype=torch.float64))
    ints = np.rint(values.numpy()).astype(np.int64)
    if not np.array_equal(ints, values.numpy()):
        raise ValueError("the twin's outputs are not integers")
    lo = int(ints.min())
    rates = []
    for row, below in ((probs[0].numpy(), True), (probs[1].numpy(), False)):
        base = np.zeros(int(ints.max()) - lo + 1)
        np.add.at(base, ints - lo, row)
        pmf = np.ones(1)
        for _ in range(d):
            pmf = np.convolve(pmf, base)
        total = d * lo + np.arange(pmf.size)  # support of sum(y)
        rates.append(float(pmf[total < 0].sum() if below else pmf[total >= 0].sum()))
    return min(rates[0], 1.0), min(rates[1], 1.0)


def whole_update_audit(name: str, eps: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per d in ``args.dims``: exact per-weight and whole-update epsilon, empirical test."""
    mech = make_randomizer(name, eps, args)
    exact = float(exact_epsilon(mech))
    twin, s = integer_twin(mech)
    rows = []
    for d in args.dims:
        g1 = torch.full((d,), s, dtype=torch.float64)
        res = ldp_epsilon_test(twin, g1, -g1, trials=args.trials, seed=args.seed + d)
        fpr, fnr = sum_sign_rates(twin, d, s)
        rows.append({
            "mechanism": name, "epsilon": eps, "d": d, "exact_per_coordinate": exact,
            "exact_whole": d * exact, "claimed_whole": float(mech.epsilon_for_dim(d)),
            "trials": res.trials, "tp": res.tp, "fn": res.fn, "fp": res.fp, "tn": res.tn,
            "test_epsilon": res.epsilon, "test_lower_bound": res.epsilon_lower_bound,
            "test_upper_bound": res.epsilon_upper_bound, "ceiling": res.ceiling,
            "population_fpr": fpr, "population_fnr": fnr,
            "population_epsilon": float(epsilon_from_error_rates(fpr, fnr)),
        })
    return rows


# ------------------------------------------------------------------------------------ training
class InferenceAttackOnReleases(FederatedAuditHooks, pl.Callback):
    """Runs the LDP-FL inference attack (002 §3.1) on every round's released rows.

    ``attack`` is fed the per-value unbiased estimate ``estimator.debias(released)`` (the
    attacker knows the mechanism; ``estimator`` is the randomizer itself, or for ``srr_plain``,
    whose server skips debiasing, the same staircase with its unbiased table), ``naive`` the raw
    releases (identity inversion); the target is the mean, over all rounds and clients, of
    ``randomizer.project(clipped update)``: what the unbiased estimate estimates.
    """

    def __init__(
        self, randomizer: PerCoordinateRandomizer, estimator: PerCoordinateRandomizer, center: float,
        radius: float, seed: int,
    ) -> None:
        self.randomizer, self.estimator = randomizer, estimator
        self.attack = LDPFLInferenceAttack(center, radius, seed=seed)
        self.naive = LDPFLInferenceAttack(center, radius, seed=seed)
        self.center, self.radius = center, radius
        self._target_sum: np.ndarray | None = None
        self._count = 0
        self._clipped = 0
        self._entries = 0

    def on_federated_client_updates(self, trainer, pl_module, fl_round) -> None:  # noqa: ANN001
        updates = fl_round.updates
        x = self.randomizer.project(updates).to(torch.float64)
        s = x.sum(0).cpu().numpy()
        self._target_sum = s if self._target_sum is None else self._target_sum + s
        self._count += updates.shape[0]
        self._clipped += int(((updates - self.center).abs() > self.radius).sum())
        self._entries += updates.numel()

    def on_federated_randomized_updates(self, trainer, pl_module, fl_round) -> None:  # noqa: ANN001
        released = fl_round.released
        self.attack.observe(self.estimator.debias(released).to(torch.float64).cpu().numpy())
        self.naive.observe(released.to(torch.float64).cpu().numpy())

    def summary(self) -> dict[str, float]:
        assert self._target_sum is not None
        target = self._target_sum / self._count
        pred = self.attack.predict(target)
        naive = self.naive.predict(target)
        assert pred.error is not None and naive.error is not None and pred.confidence is not None
        return {
            "attack_error": float(pred.error.mean()),
            "attack_error_median": float(np.median(pred.error)),
            "attack_error_naive": float(naive.error.mean()),
            "trivial_error": float(np.mean(np.abs(target - self.center)) / (2.0 * self.radius)),
            "attack_confidence": float(pred.confidence.mean()),
            "clipped_fraction": self._clipped / self._entries,
        }


def train_one(name: str | None, eps: float | None, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One DP-FedAvg run (``name=None``: noise-free reference). Returns a ``training.csv`` row."""
    pl.seed_everything(seed, verbose=False)
    dm = FederatedDataModule("digits", num_clients=args.clients, rounds_per_epoch=args.rounds, seed=seed)
    dm.setup("fit")
    model = build_model("mlp", dm.input_shape, dm.num_classes, hidden=tuple(args.hidden))
    mech = None if name is None else make_randomizer(name, float(eps), args)
    module = DPFedAvg(
        model, clients_per_round=args.clients_per_round, noise_multiplier=0.0, clip_norm=args.clip_norm,
        local_epochs=1, local_lr=args.local_lr, local_batch_size=8, server_lr=args.server_lr,
        server_momentum=args.server_momentum, randomizer=mech,
    )
    callbacks = []
    if mech is not None:
        estimator = make_randomizer("srr", float(eps), args) if name == "srr_plain" else mech
        callbacks.append(InferenceAttackOnReleases(mech, estimator, 0.0, args.radius, seed))
    trainer = pl.Trainer(
        max_steps=args.rounds, max_epochs=-1, logger=False, callbacks=callbacks, **trainer_kwargs(args.accelerator),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)  # one epoch of `rounds` rounds, validated at its end
    row: dict[str, Any] = {
        "mechanism": name or "none", "epsilon": eps, "seed": seed,
        "accuracy": float(trainer.callback_metrics["val/accuracy"]), "rounds": args.rounds,
        "clients_per_round": args.clients_per_round, "d": module.num_parameters,
        "claimed_whole_update_epsilon": None if mech is None else mech.epsilon_for_dim(module.num_parameters),
        "fit_seconds": time.perf_counter() - start,
    }
    if callbacks:
        row.update(callbacks[0].summary())
    return row


# -------------------------------------------------------------------------------------- output
def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""  # not applicable, or infinite (an upper bound with zero errors): never written as inf/nan
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(rows: list[dict[str, Any]], fields: tuple[str, ...], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in fields})


def _mean_by(rows: list[dict[str, Any]], name: str, key: str, epsilons: list[float]) -> list[float]:
    return [float(np.mean([r[key] for r in rows if r["mechanism"] == name and r["epsilon"] == e]))
            for e in epsilons]


def plot(training: list[dict[str, Any]], audit: list[dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    eps = sorted({r["epsilon"] for r in training if r["epsilon"] is not None})
    names = [n for n in args.mechanisms]
    colors = {"two_point": "C0", "srr": "C1", "srr_plain": "C2", "grr": "C3"}
    fig = Figure(figsize=(15, 4.4))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    ref = [r["accuracy"] for r in training if r["mechanism"] == "none"]
    for n in names:
        ax1.plot(eps, _mean_by(training, n, "accuracy", eps), "o-", color=colors[n], label=n)
    if ref:
        ax1.axhline(float(np.mean(ref)), color="k", ls="--", lw=1, label="noise-free")
    ax1.set(xlabel="per-weight epsilon", ylabel="validation accuracy", ylim=(0, 1),
            title=f"DP-FedAvg on digits, {args.rounds} rounds")
    ax1.legend(fontsize=8)
    for n in names:
        ax2.plot(eps, [100 * v for v in _mean_by(training, n, "attack_error", eps)], "o-", color=colors[n], label=n)
        if n in ("srr_plain", "grr"):
            ax2.plot(eps, [100 * v for v in _mean_by(training, n, "attack_error_naive", eps)], "x:",
                     color=colors[n], label=f"{n} (naive mean)")
    trivial = [r["trivial_error"] for r in training if r["mechanism"] != "none"]
    ax2.axhline(100 * float(np.mean(trivial)), color="gray", ls="--", lw=1, label="predict c (trivial)")
    ax2.set(xlabel="per-weight epsilon", ylabel="mean |w_hat - w| / 2r  (%)", yscale="log",
            title="LDP-FL inference attack (002 §3.1)")
    ax2.legend(fontsize=7)
    e_plot = sorted({r["epsilon"] for r in audit})[len({r["epsilon"] for r in audit}) // 2]
    dims = sorted({r["d"] for r in audit})
    sel = [r for r in audit if r["epsilon"] == e_plot]
    ax3.plot(dims, [d * e_plot for d in dims], "k-", lw=2, label="exact = claimed (d eps)")
    for n in AUDITED:
        rr = sorted((r for r in sel if r["mechanism"] == n), key=lambda r: r["d"])
        if not rr:
            continue
        ax3.plot([r["d"] for r in rr], [max(r["population_epsilon"], 1e-3) for r in rr], "--", color=colors[n],
                 label=f"{n}: cosine test, exact value")
        ax3.plot([r["d"] for r in rr], [max(r["test_lower_bound"], 1e-3) for r in rr], "o", color=colors[n],
                 label=f"{n}: 95% lower bound")
    ax3.axhline(sel[0]["ceiling"], color="gray", ls=":", lw=1, label=f"ceiling ({args.trials} trials)")
    ax3.set(xscale="log", yscale="log", xlabel="d (weights in the released vector)", ylabel="epsilon",
            title=f"whole-update epsilon at per-weight eps = {e_plot:g}")
    ax3.set_xticks(dims, [str(d) for d in dims])
    ax3.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # small models: one thread is fastest and avoids oversubscription
    quiet = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*LeafSpec.*")
            training = []
            for seed in range(args.seed, args.seed + args.seeds):
                training.append(train_one(None, None, seed, args))
                for name in args.mechanisms:
                    for eps in args.epsilons:
                        training.append(train_one(name, eps, seed, args))
                        r = training[-1]
                        print(f"  {name:<10} eps={eps:<4g} seed={seed} acc={r['accuracy']:.3f} "
                              f"attack={100 * r['attack_error']:.2f}% ({r['fit_seconds']:.1f} s)", flush=True)
    finally:
        for lg, lvl in zip(quiet, levels, strict=True):
            lg.setLevel(lvl)
    audit = [row for name in AUDITED if name in args.mechanisms or name == "srr" and "srr_plain" in args.mechanisms
             for eps in args.epsilons for row in whole_update_audit(name, eps, args)]
    paths = {k: os.path.join(args.out, f) for k, f in
             (("training", "training.csv"), ("audit", "audit.csv"), ("figure", "srr_vs_two_point.png"))}
    write_csv(training, TRAINING_FIELDS, paths["training"])
    write_csv(audit, AUDIT_FIELDS, paths["audit"])
    plot(training, audit, args, paths["figure"])

    ref = float(np.mean([r["accuracy"] for r in training if r["mechanism"] == "none"]))
    d = training[0]["d"]
    print(f"\nDP-FedAvg on digits: {args.rounds} rounds, {args.clients_per_round} of {args.clients} clients "
          f"per round, d = {d}, domain [-{args.radius:g}, {args.radius:g}], grid p = {args.precision} "
          f"(D = {int(round(2 * args.radius * 10 ** args.precision)) + 1}); noise-free accuracy {ref:.3f}")
    print("  accuracy / attack error (debiased mean; naive mean) / trivial error, per epsilon:")
    for name in args.mechanisms:
        cells = [f"{_mean_by(training, name, 'accuracy', [e])[0]:.3f}/"
                 f"{100 * _mean_by(training, name, 'attack_error', [e])[0]:.2f}%;"
                 f"{100 * _mean_by(training, name, 'attack_error_naive', [e])[0]:.2f}%" for e in args.epsilons]
        print(f"  {name:<10} " + "  ".join(f"eps={e:g}: {c}" for e, c in zip(args.epsilons, cells, strict=True)))
    trivial = float(np.mean([r["trivial_error"] for r in training if r["mechanism"] != "none"]))
    print(f"  predicting c for every weight: {100 * trivial:.2f}%; whole-update claim per round: d x eps = "
          + ", ".join(f"{d * e:g}" for e in args.epsilons))
    print(f"\n  whole-update audit ({args.trials} trials per test; exact = d x exact per weight):")
    print(f"  {'mechanism':<10} {'eps':>4} {'d':>3} {'exact/wt':>9} {'exact':>7} {'test':>7} {'95% lb':>7} "
          f"{'test->':>7} {'ceiling':>7}")
    for r in audit:
        print(f"  {r['mechanism']:<10} {r['epsilon']:>4g} {r['d']:>3} {r['exact_per_coordinate']:>9.4f} "
              f"{r['exact_whole']:>7.3f} {r['test_epsilon']:>7.3f} {r['test_lower_bound']:>7.3f} "
              f"{r['population_epsilon']:>7.3f} {r['ceiling']:>7.3f}")
    print(f"\n({time.perf_counter() - start:.0f} s)  CSV: {paths['training']}, {paths['audit']}  PNG: {paths['figure']}")
    return {"training": training, "audit": audit, "paths": paths, "args": vars(args)}


if __name__ == "__main__":
    main()
