"""Coverage and tightness of CanaryScoreAuditor's bounds on the Gaussian mechanism.

    PYTHONPATH=. .venv/bin/python benchmarks/lower_bounds.py              # full run, ~minutes
    PYTHONPATH=. .venv/bin/python benchmarks/lower_bounds.py --quick      # smoke test

Scores (``--scores cosine``, the default): each canary c_j (uniform on the unit sphere of R^d,
d = 10^4) gets its own release rho_j = b_j c_j + sigma z_j, z_j ~ N(0, I_d), b_j = 1 for the k
inserted ("in") and 0 for the k' held-out ("out") canaries; the score is t_j = cos(c_j, rho_j).
With g = c_j . z_j ~ N(0, 1) and an independent chi^2_{d-1} for the rest of z_j,
t_j = (b_j + sigma g) / sqrt((b_j + sigma g)^2 + sigma^2 chi^2_{d-1}) exactly, so no d-vector
is ever drawn. Out-scores follow the exact cosine null; sqrt(d) t_j is close to N(b_j/sigma, 1).
The mechanism (sensitivity 1, noise sigma) is (1/sigma)-GDP; sigma is set so that its tight
epsilon at delta is the true epsilon (Balle & Wang 2018), the number every bound must not exceed.
``--scores gaussian`` uses in ~ N(1/sigma, 1), out ~ N(0, 1) directly.

Every data set is audited by the five 95% lower bounds (Clopper-Pearson with Bonferroni and with
a split threshold, one-run binomial, one-run f-DP, parametric GDP) and the two point estimates.
Coverage: the share of data sets whose bound exceeds the true epsilon (must be <= 5% + slack).
Tightness: means over the same data sets, beside the reference numbers of jax_privacy's
auditing module on the same setting (d = 1e4, k = k' = 1000, delta = 1e-6, alpha = 0.05).

The one-run bounds of all data sets are computed in one vectorised pass through the same private
routines the methods call (checked against the method on the first data set of each epsilon).

Output: a table on stdout and ``benchmarks/results/lower_bounds.json``.

``--valid`` runs instead the coverage study of the valid bounds of issue 24
(:mod:`audit_callbacks.estimators.valid_bounds`; ~10 min on one core), written to
``benchmarks/results/valid_bounds.json``:

    PYTHONPATH=. .venv/bin/python benchmarks/lower_bounds.py --valid             # full
    PYTHONPATH=. .venv/bin/python benchmarks/lower_bounds.py --valid --quick     # smoke test

Gaussian mechanism in ~ N(mu, 1), out ~ N(0, 1), mu in {1, 2, 4}, k = k' in {500, 1000},
true epsilon eps_GDP(mu, delta), delta = 1e-5, alpha = 0.05, ``--sets`` data sets (default 1000
here). Per setting: (a) the tightest valid bound (``tightest_valid_lower_bound``) at alpha on
all scores; (b) the maximum over J = 10 checkpoints (the first k i / 10 scores of each group,
i = 1..10) of ``watched_lower_bound`` at alpha / (i (i + 1)), and at alpha / 10 (known
horizon); (c) the naive maximum of plain (1 - alpha) tightest bounds and of plain (1 - alpha)
parametric GDP bounds over the same checkpoints, and the GDP maximum with the spent levels;
(d) the GDP bound's fit gate (default level 0.01) on the Gaussian scores and on a mixture
(in ~ N(4, 1) for 30% of the canaries, N(0.5, 1) for the rest). Also the one-run bound with the
emulated fair-coin pool on randomized response (pure eps-DP, eps in {1, 2, 4}, delta = 0),
where that bound is nearly tight, and with ``inclusion="coins"`` beside it. Each exceed count
is compared with the upper 99.9% binomial quantile at 5%.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from scipy import stats
from scipy.optimize import brentq

from audit_callbacks.estimators import CanaryScoreAuditor, gaussian_epsilon, gaussian_epsilon_array
from audit_callbacks.estimators.one_run import fdp_mu, guess_counts, one_run_epsilon
from audit_callbacks.estimators.valid_bounds import METHODS, spent_alpha, valid_bound_values
from benchmarks._common import (
    machine_info,
    parser,
    write_json,
)

# jax_privacy auditing on identical arrays (50 data sets), and the parametric GDP bound's
# reference simulation (300 data sets); None where no number was given.
REFERENCE = {
    "one_run_fdp": {0.5: None, 1.0: 0.186, 4.0: 1.65, 8.0: 3.52},
    "one_run": {0.5: None, 1.0: 0.135, 4.0: 1.20, 8.0: 2.46},
    "cp_bonferroni": {0.5: None, 1.0: 0.073, 4.0: 1.08, 8.0: 2.38},
    "gdp": {0.5: 0.21, 1.0: 0.65, 4.0: 3.58, 8.0: 7.49},
}
GDP_TARGET = {1.0: 0.6, 4.0: 3.5, 8.0: 7.4}
BOUNDS = ("cp_bonferroni", "cp_split", "one_run", "one_run_fdp", "gdp")
ESTIMATES = ("estimate_equal", "estimate_unequal")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, quick="20 data sets, eps 1 and 8", output="JSON name in benchmarks/results/")
    p.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 4.0, 8.0])
    p.add_argument("--sets", type=int, default=300, help="data sets per epsilon")
    p.add_argument("--k", type=int, default=1000, help="in- and out-canaries each")
    p.add_argument("--dim", type=int, default=10_000)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--scores", choices=("cosine", "gaussian"), default="cosine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--valid", action="store_true",
                   help="coverage of the valid bounds (issue 24) instead of the comparison")
    p.add_argument("--mus", type=float, nargs="+", default=[1.0, 2.0, 4.0],
                   help="--valid: Gaussian shifts")
    p.add_argument("--ks", type=int, nargs="+", default=[500, 1000], help="--valid: k = k'")
    p.add_argument("--checkpoints", type=int, default=10, help="--valid: J")
    a = p.parse_args(argv)
    if a.output is None:
        a.output = ("valid_bounds" if a.valid else "lower_bounds") + (
            "_quick.json" if a.quick else ".json")
    return a


def sigma_for(eps: float, delta: float) -> float:
    """Noise sigma (sensitivity 1) whose Gaussian mechanism has tight epsilon ``eps``."""
    return brentq(lambda s: gaussian_epsilon(s, delta) - eps, 1e-3, 1e3, xtol=1e-12)


def draw(rng: np.random.Generator, member: float, sigma: float, k: int, dim: int,
         kind: str) -> np.ndarray:
    g = rng.standard_normal(k)
    if kind == "gaussian":
        return member / sigma + g
    a = member + sigma * g
    return a / np.sqrt(a * a + sigma * sigma * rng.chisquare(dim - 1, k))


def one_run_batch(sets: list, alpha: float, delta: float, fdp: bool, chunk: int = 25
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(eps per data set, guesses of the best rule) for the one-run bounds, vectorised."""
    eps_all, guesses = [], []
    for start in range(0, len(sets), chunk):
        part = sets[start:start + chunk]
        lanes = [guess_counts(x, y, 0)[:2] for x, y in part]
        c = lanes[0][0].size
        n = np.concatenate([lane[0] for lane in lanes])
        v = np.concatenate([lane[1] for lane in lanes])
        m = np.full(n.size, float(part[0][0].size + part[0][1].size))
        lv = np.full(n.size, alpha / c)
        val = fdp_mu(n, v, m, lv) if fdp else one_run_epsilon(n, v, m, lv, delta)
        val = val.reshape(len(part), c)
        best = np.argmax(val, axis=1)
        top = val[np.arange(len(part)), best]
        if fdp:
            top = gaussian_epsilon_array(top, delta)
        eps_all.append(top)
        guesses.append(n.reshape(len(part), c)[np.arange(len(part)), best])
    return np.concatenate(eps_all), np.concatenate(guesses)


def run_eps(eps: float, a: argparse.Namespace) -> dict:
    sigma = sigma_for(eps, a.delta)
    rng = np.random.default_rng([a.seed, int(round(eps * 1000))])
    sets = [(draw(rng, 1.0, sigma, a.k, a.dim, a.scores), draw(rng, 0.0, sigma, a.k, a.dim,
                                                              a.scores)) for _ in range(a.sets)]
    vals: dict[str, np.ndarray] = {}
    secs: dict[str, float] = {}
    gof = []

    def timed(name: str, fn) -> None:  # noqa: ANN001 - a small local helper
        t0 = time.perf_counter()
        vals[name] = np.asarray(fn(), dtype=float)
        secs[name] = time.perf_counter() - t0

    aud = [CanaryScoreAuditor(x, y) for x, y in sets]
    timed("cp_bonferroni", lambda: [u.epsilon_lower_bound(a.alpha, a.delta).value for u in aud])
    timed("cp_split", lambda: [u.epsilon_lower_bound(a.alpha, a.delta, "split", seed=i).value
                               for i, u in enumerate(aud)])
    timed("one_run", lambda: one_run_batch(sets, a.alpha, a.delta, False)[0])
    timed("one_run_fdp", lambda: one_run_batch(sets, a.alpha, a.delta, True)[0])

    def gdp() -> list[float]:
        out = []
        for u in aud:
            r = u.epsilon_gdp_lower_bound(a.alpha, a.delta)
            gof.append(r.details["gof_pvalue"])
            out.append(r.value)
        return out

    timed("gdp", gdp)
    timed("estimate_equal", lambda: [u.epsilon_estimate(a.delta, "equal").value for u in aud])
    timed("estimate_unequal", lambda: [u.epsilon_estimate(a.delta, "unequal").value
                                       for u in aud])
    # the batched one-run path equals the methods on the first data set
    check = {"one_run": aud[0].epsilon_one_run(a.alpha, a.delta).value,
             "one_run_fdp": aud[0].epsilon_one_run_fdp(a.alpha, a.delta).value}
    for name, v in check.items():
        if not np.isclose(v, vals[name][0], rtol=1e-6, atol=1e-9):
            raise RuntimeError(f"batched {name} {vals[name][0]} != method {v}")

    n = a.sets
    allowed = int(stats.binom.ppf(0.99, n, a.alpha))
    res: dict = {"true_epsilon": eps, "sigma": sigma, "mu": 1.0 / sigma, "sets": n,
                 "allowed_exceed_count_99pct": allowed, "seconds": secs, "bounds": {},
                 "estimates": {}}
    for name in BOUNDS:
        x = vals[name]
        ref = REFERENCE.get(name, {}).get(eps)
        exceed = int(np.sum(x > eps))
        res["bounds"][name] = {
            "mean": float(x.mean()), "sd": float(x.std(ddof=1)), "exceed_count": exceed,
            "exceed_rate": exceed / n, "coverage_ok": exceed <= allowed,
            "reference": ref, "ratio_to_reference": None if not ref else float(x.mean() / ref),
        }
    for name in ESTIMATES:
        x = vals[name]
        res["estimates"][name] = {"mean": float(x.mean()), "sd": float(x.std(ddof=1)),
                                  "relative_bias": float(x.mean() / eps - 1.0)}
    res["gdp_gof_pvalue_median"] = float(np.median(gof))
    res["gdp_gof_pvalue_below_0.05"] = float(np.mean(np.array(gof) < 0.05))
    return res


# --------------------------------------------------------------------------------------------
# --valid: coverage of the valid bounds (issue 24)
# --------------------------------------------------------------------------------------------


def _rate(x: np.ndarray, truth: float, allowed: int) -> dict:
    c = int(np.sum(x > truth))
    return {"exceed_count": c, "exceed_rate": c / x.size, "coverage_ok": c <= allowed,
            "mean": float(x.mean()), "ratio_to_truth": float(x.mean() / truth)}


def run_valid_setting(mu: float, k: int, a: argparse.Namespace) -> dict:
    delta, alpha, n, jj = 1e-5, a.alpha, a.sets, a.checkpoints
    truth = float(gaussian_epsilon_array(np.array([mu]), delta)[0])
    rng = np.random.default_rng([a.seed, 24, int(mu * 100), k])
    x, y = rng.normal(mu, 1.0, (n, k)), rng.normal(0.0, 1.0, (n, k))
    allowed = int(stats.binom.ppf(0.999, n, 0.05))
    t0 = time.perf_counter()
    sets = list(zip(x, y, strict=True))
    # all three methods: the scores are a Gaussian (mu-GDP) pair, where the f-DP bound holds
    full = valid_bound_values(sets, alpha=alpha, delta=delta, methods=METHODS)
    coins = valid_bound_values(sets, alpha=alpha, delta=delta, inclusion="coins",
                               methods=METHODS).max(axis=1)
    cps = [k * (i + 1) // jj for i in range(jj)]
    watched, horizon, naive = (np.zeros((n, jj)) for _ in range(3))
    gdp_naive, gdp_spent = np.zeros((n, jj)), np.zeros((n, jj))
    for i, c in enumerate(cps, start=1):
        part = list(zip(x[:, :c], y[:, :c], strict=True))
        watched[:, i - 1] = valid_bound_values(part, alpha=spent_alpha(alpha, i), delta=delta,
                                               methods=METHODS).max(axis=1)
        horizon[:, i - 1] = valid_bound_values(part, alpha=alpha / jj, delta=delta,
                                               methods=METHODS).max(axis=1)
        naive[:, i - 1] = valid_bound_values(part, alpha=alpha, delta=delta,
                                             methods=METHODS).max(axis=1)
        for s_, (xi, yi) in enumerate(part):
            aud = CanaryScoreAuditor(xi, yi)
            gdp_naive[s_, i - 1] = aud.epsilon_gdp_lower_bound(alpha, delta, gof_level=0.0).value
            gdp_spent[s_, i - 1] = aud.epsilon_gdp_lower_bound(
                spent_alpha(alpha, i), delta, gof_level=0.0).value
    gate_gauss = np.mean([CanaryScoreAuditor(xi, yi).epsilon_gdp_lower_bound(alpha, delta)
                          .status == "ok" for xi, yi in sets])
    leak = rng.random((n, k)) < 0.3
    xm = rng.normal(np.where(leak, 4.0, 0.5), 1.0)
    gate_mix = np.mean([CanaryScoreAuditor(xi, yi).epsilon_gdp_lower_bound(alpha, delta)
                        .status.startswith("rejected") for xi, yi in zip(xm, y, strict=True)])
    best = full.max(axis=1)
    return {
        "mu": mu, "k": k, "true_epsilon": truth, "sets": n, "checkpoints": cps,
        "allowed_exceed_count_999": allowed,
        "a_tightest_valid": {**_rate(best, truth, allowed),
                             "per_method_mean": dict(zip(METHODS, full.mean(axis=0).tolist(),
                                                         strict=True)),
                             "wins": dict(zip(METHODS, np.bincount(full.argmax(axis=1),
                                                                   minlength=3).tolist(),
                                              strict=True)),
                             "inclusion_coins": _rate(coins, truth, allowed)},
        "b_watched_series_max": _rate(watched.max(axis=1), truth, allowed),
        "b_horizon_series_max": _rate(horizon.max(axis=1), truth, allowed),
        "b_watched_last_point_mean": float(watched[:, -1].mean()),
        "c_naive_max_tightest": _rate(naive.max(axis=1), truth, allowed),
        "c_gdp_last_point": _rate(gdp_naive[:, -1], truth, allowed),
        "c_gdp_naive_max": _rate(gdp_naive.max(axis=1), truth, allowed),
        "c_gdp_spent_max": _rate(gdp_spent.max(axis=1), truth, allowed),
        "d_gate_pass_rate_gaussian": float(gate_gauss),
        "d_gate_reject_rate_mixture": float(gate_mix),
        "seconds": time.perf_counter() - t0,
    }


def run_rr(eps: float, k: int, a: argparse.Namespace) -> dict:
    p = math.exp(eps) / (1.0 + math.exp(eps))
    rng = np.random.default_rng([a.seed, 25, int(eps * 100), k])
    x = (rng.random((a.sets, k)) < p).astype(float)
    y = (rng.random((a.sets, k)) >= p).astype(float)
    allowed = int(stats.binom.ppf(0.999, a.sets, 0.05))
    out = {"epsilon": eps, "k": k, "sets": a.sets, "allowed_exceed_count_999": allowed}
    for inc in ("fixed", "coins"):
        v = valid_bound_values(list(zip(x, y, strict=True)), alpha=a.alpha, delta=0.0,
                               methods=("one_run",), inclusion=inc)[:, 0]
        out[inc] = _rate(v, eps, allowed)
    return out


def main_valid(a: argparse.Namespace) -> int:
    if a.quick:
        a.sets, a.mus, a.ks = 60, [2.0], [500]
    t0 = time.perf_counter()
    rows = [run_valid_setting(mu, k, a) for k in a.ks for mu in a.mus]
    rr = [run_rr(e, k, a) for k in a.ks for e in (1.0, 2.0, 4.0)]
    total = time.perf_counter() - t0
    print(f"valid bounds: sets={a.sets} alpha={a.alpha} delta=1e-5 J={a.checkpoints} "
          f"({total:.0f} s); exceed % (mean bound)")
    cols = ("a_tightest_valid", "b_watched_series_max", "b_horizon_series_max",
            "c_naive_max_tightest", "c_gdp_last_point", "c_gdp_naive_max", "c_gdp_spent_max")
    print(f"{'k':>5} {'mu':>4} {'eps':>6} " + " ".join(f"{c[:18]:>20}" for c in cols)
          + "  gate ok / mix rej")
    for r in rows:
        cells = [f"{100 * r[c]['exceed_rate']:5.1f}% ({r[c]['mean']:6.3f})" for c in cols]
        print(f"{r['k']:>5} {r['mu']:>4.0f} {r['true_epsilon']:6.2f} "
              + " ".join(f"{c:>20}" for c in cells)
              + f"  {r['d_gate_pass_rate_gaussian']:.3f} / {r['d_gate_reject_rate_mixture']:.3f}")
    for r in rr:
        print(f"randomized response k={r['k']} eps={r['epsilon']}: one-run fixed pool "
              f"{100 * r['fixed']['exceed_rate']:.1f}% ({r['fixed']['mean']:.3f}), coins "
              f"{100 * r['coins']['exceed_rate']:.1f}% ({r['coins']['mean']:.3f})")
    payload = {
        "description": "Coverage of the valid lower bounds (issue 24): tightest valid bound, "
                       "the maximum of a watched series, the naive maximum, the GDP gate "
                       "(see the script docstring).",
        "config": {k: v for k, v in vars(a).items() if k != "output"},
        "total_seconds": total,
        "gaussian": rows,
        "randomized_response": rr,
        "machine": machine_info(),
    }
    print("wrote", write_json(a.output, payload))
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.valid:
        if "--sets" not in (argv if argv is not None else sys.argv[1:]):
            a.sets = 1000
        return main_valid(a)
    if a.quick:
        a.sets, a.eps = 20, [1.0, 8.0]
    t0 = time.perf_counter()
    rows = [run_eps(e, a) for e in a.eps]
    total = time.perf_counter() - t0
    print(f"scores={a.scores} d={a.dim} k=k'={a.k} delta={a.delta} alpha={a.alpha} "
          f"sets={a.sets} ({total:.0f} s)")
    print(f"{'bound':<16}" + "".join(f"{'eps=' + str(r['true_epsilon']):>26}" for r in rows))
    print(f"{'':<16}" + "".join(f"{'mean  ref  exceed%':>26}" for _ in rows))
    for name in BOUNDS:
        cells = []
        for r in rows:
            b = r["bounds"][name]
            ref = "-" if b["reference"] is None else f"{b['reference']:.3f}"
            cells.append(f"{b['mean']:8.3f} {ref:>6} {100 * b['exceed_rate']:6.1f}%"
                         f"{'' if b['coverage_ok'] else '!'}")
        print(f"{name:<16}" + "".join(f"{c:>26}" for c in cells))
    for name in ESTIMATES:
        cells = [f"{r['estimates'][name]['mean']:8.3f} bias {100 * r['estimates'][name]['relative_bias']:+5.1f}%"
                 for r in rows]
        print(f"{name:<16}" + "".join(f"{c:>26}" for c in cells))
    payload = {
        "description": "Coverage and tightness of CanaryScoreAuditor's 95% lower bounds and "
                       "estimates on the Gaussian mechanism (see the script docstring).",
        "config": {k: v for k, v in vars(a).items() if k != "output"},
        "reference_source": "jax_privacy auditing module (CanaryScoreAuditor) on identical "
                            "settings, 50 data sets; GDP row: an independent 300-set simulation",
        "gdp_targets": GDP_TARGET,
        "total_seconds": total,
        "results": rows,
        "machine": machine_info(),
    }
    print("wrote", write_json(a.output, payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
