"""Can the audit say no? Planted implementation bugs against correct runs, 20 seeds each.

Each case is one small training run with ``CanaryAudit`` (or ``OpacusCanaryAudit`` /
``CanaryStrategy``) attached, once correct and once with a bug the accountant does not know
about (issue 25):

* ``opacus_clip_2c``: per-example gradients clipped at 2C, noise and accountant at C;
* ``opacus_noise_half``: noise at sigma / 2, accountant at sigma;
* ``opacus_sampling_2q``: the training loader samples at 2q, ``make_private`` was told q;
* ``fedavg_clip_2c``: DP-FedAvg clips client updates at 2C, noise at z C;
* ``flower_clip_2c``: a Flower server-side DP wrapper clips at 2C and adds noise for C;

the classes the checks of the mechanism meet (``docs/methods/mechanism_checks.md``): noise reused
across steps or rounds (``*_reused_noise``), a layer, bias or integer buffer without noise
(``*_layer_without_noise``, ``fedavg_bias_without_noise``, ``flower_int_buffer_noise_cast``),
shuffled batches under Poisson accounting (``*_shuffled_batches``) and noise from a publicly
seeded generator (``opacus_seeded_global_generator``); and ``*_correct`` the set-ups without a
bug, in several configurations each. A run is *flagged* when any verdict (a threat model's or
the checks of the mechanism') is ``suspicious``, ``violation`` or ``unproven``, or the summary
says the noise is replayable from a public seed; see ``docs/methods/verdicts.md``. Target (issue 25): every bug flagged in >= 95% of its seeds,
correct runs in <= 5%. Rates carry exact (Clopper-Pearson) 95% intervals. A false-alarm rate
near 5% cannot be told from 10% with 20 runs (a calibrated 95% interval lies wholly above a
correct claim 2.5% of the time, and then 2 or more of 20 runs are flagged with probability
0.09), so the correct set-ups run ``--correct-seeds`` (default 60) seeds; the rate over their
first 20 is reported beside it (``first_20``).

The cases live in ``planted_opacus.py``, ``planted_lightning.py``, ``planted_fedavg.py`` and
``planted_flower.py``
(``CASES: name -> run(seed) -> dict``). Writes ``results/planted_bugs.json``.

    python benchmarks/planted_bugs.py                 # 20 seeds per bug, 60 per correct set-up
    python benchmarks/planted_bugs.py --seeds 2 --cases opacus_correct opacus_clip_2c
"""

from __future__ import annotations

import time
from typing import Any

from scipy.stats import binomtest

from benchmarks._common import (
    add_accelerator_argument,
    git_state,
    machine_info,
    parser,
    write_json,
)

FLAGS = ("suspicious", "violation", "unproven")
#: the words of the threat models' verdicts counted before the checks of the mechanism existed
#: (reported beside the new definition as ``threat_model_flagged``; a failed noise check is also
#: each threat model's ``violation``)
CANARY_FLAGS = ("suspicious", "violation")


def all_cases() -> dict[str, Any]:
    """Every case of the three set-ups, by name."""
    from benchmarks import planted_fedavg, planted_flower, planted_lightning, planted_opacus

    return {**planted_opacus.CASES, **planted_lightning.CASES, **planted_fedavg.CASES,
            **planted_flower.CASES}


def rate(count: int, n: int) -> dict[str, float]:
    """``count / n`` with its exact (Clopper-Pearson) 95% interval."""
    ci = binomtest(count, n).proportion_ci(0.95, method="exact")
    return {"count": count, "n": n, "rate": count / n, "lower": float(ci.low), "upper": float(ci.high)}


def summarise(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates of ``suspicious``, ``violation`` and flagged (either) over the runs of one case."""
    n = len(runs)
    words = [[*r["verdicts"].values(), r.get("verdict_mechanism")] for r in runs]
    planted = not name.endswith("_correct")
    flagged = sum(any(w in FLAGS for w in ws) or bool(r.get("noise_replayable"))
                  for ws, r in zip(words, runs, strict=True))
    out = {
        "planted_bug": planted,
        "suspicious": rate(sum("suspicious" in ws for ws in words), n),
        "violation": rate(sum("violation" in ws for ws in words), n),
        "unproven": rate(sum("unproven" in ws for ws in words), n),
        "mechanism_flagged": rate(sum(r.get("verdict_mechanism") in FLAGS for r in runs), n),
        "noise_replayable": rate(sum(bool(r.get("noise_replayable")) for r in runs), n),
        "threat_model_flagged": rate(sum(any(w in CANARY_FLAGS for w in r["verdicts"].values())
                                        for r in runs), n),
        "flagged": rate(flagged, n),
        "target": ">= 0.95 flagged" if planted else "<= 0.05 flagged",
    }
    out["meets_target"] = (flagged / n >= 0.95) if planted else (flagged / n <= 0.05)
    if not planted and n > 20:
        out["first_20"] = summarise(name, runs[:20])["flagged"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, summary=True)
    p.add_argument("--seeds", type=int, default=20, help="seeds per planted bug (default 20)")
    p.add_argument("--correct-seeds", type=int, default=60,
                        help="seeds per correct set-up (default 60)")
    p.add_argument("--cases", nargs="*", default=None, help="a subset of the cases")
    p.add_argument("--output", default="planted_bugs.json", help="results file name")
    add_accelerator_argument(p)  # the DP-FedAvg and Lightning cases' Trainer; the others run plain loops on the CPU
    args = p.parse_args(argv)
    if args.seeds < 1 or args.correct_seeds < 1:
        p.error("--seeds and --correct-seeds must be >= 1")
    cases = all_cases()
    names = args.cases or list(cases)
    unknown = sorted(set(names) - set(cases))
    if unknown:
        p.error(f"unknown cases {unknown}; known: {sorted(cases)}")

    results: dict[str, Any] = {}
    print(f"{'case':<22} {'n':>3} {'suspicious':>11} {'violation':>10} {'flagged':>8}  95% interval   target  s/run")
    for name in names:
        seeds = args.correct_seeds if name.endswith("_correct") else args.seeds
        start = time.perf_counter()
        runs = [cases[name](seed, args.accelerator) if name.startswith(("fedavg_", "lightning_"))
                else cases[name](seed)
                for seed in range(seeds)]
        seconds = (time.perf_counter() - start) / seeds
        res = results[name] = {**summarise(name, runs), "seconds_per_run": seconds, "runs": runs}
        f = res["flagged"]
        print(f"{name:<22} {f['n']:>3} {res['suspicious']['rate']:>11.2f} {res['violation']['rate']:>10.2f} "
              f"{f['rate']:>8.2f}  [{f['lower']:.2f}, {f['upper']:.2f}]  "
              f"{'ok  ' if res['meets_target'] else 'MISS'}  {seconds:5.1f}")
    payload = {
        "benchmark": "planted_bugs",
        "question": "does the audit flag planted clipping, noise and sampling bugs, reused or "
                    "missing noise, shuffled batches under Poisson accounting and a seeded noise "
                    "generator?",
        "flagged_when": "any verdict (a threat model's or the checks of the mechanism') is "
                        "'suspicious', 'violation' or 'unproven', or the summary says the noise is "
                        "replayable from a public seed (docs/methods/verdicts.md, "
                        "docs/methods/mechanism_checks.md); the claim is the analytic epsilon; "
                        "threat_model_flagged: a threat model's suspicious or violation (the old definition; "
                        "a failed noise check is also each threat model's violation)",
        "seeds_per_planted_bug": args.seeds,
        "seeds_per_correct_setup": args.correct_seeds,
        "accelerator": args.accelerator,
        "cases": results,
        "all_meet_target": all(r["meets_target"] for r in results.values()),
        "machine": machine_info(),
        "git": git_state(),
    }
    path = write_json(args.output, payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
