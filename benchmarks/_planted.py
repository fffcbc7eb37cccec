"""What a planted-bug case returns (``planted_opacus.py``, ``planted_fedavg.py``,
``planted_flower.py``; the driver is ``planted_bugs.py``). Not part of the library."""

from __future__ import annotations

import time
from typing import Any

from audit_callbacks.auditing.html_report import verdict

THREAT_MODELS = ("final_model", "all_iterates")
ESTIMATES = ("epsilon_all_iterates", "epsilon_all_iterates_matched", "epsilon_all_iterates_max_cosine",
             "epsilon_final_model")
BOUNDS = ("epsilon_lower_bound_all_iterates", "epsilon_lower_bound_final_model")


def case_result(summary: dict[str, Any], *, seed: int, start: float, **extra: Any) -> dict[str, Any]:
    """One run's JSON-able result from its audit summary: the verdict word of each threat model
    (``verdict(summary, threat_model)``), the analytic epsilon and last-iterate reference, every
    estimate with its interval and status, the valid lower bounds, the canaries that took part,
    the seconds since ``start`` (``time.perf_counter()``), and ``extra``."""
    est = summary["estimates"]
    return {
        "seed": seed,
        **extra,
        "verdicts": {tm: verdict(summary, tm)[0] for tm in THREAT_MODELS},
        "verdict_mechanism": summary.get("verdict_mechanism"),
        "verdict_mechanism_sentence": summary.get("verdict_mechanism_sentence"),
        "noise_replayable": bool(((summary.get("inputs") or {}).get("noise_source") or {}).get("replayable")),
        "epsilon_analytic": summary.get("epsilon_analytic"),
        "epsilon_last_iterate_heuristic": summary.get("epsilon_last_iterate_heuristic"),
        "estimates": {k: {f: est.get(k, {}).get(f) for f in ("value", "lower", "upper", "status")}
                      for k in ESTIMATES},
        "lower_bounds": {k: est.get(k, {}).get("value") for k in BOUNDS},
        "max_participations": summary.get("max_participations"),
        "num_canaries_participated": summary.get("num_canaries_participated"),
        "seconds": time.perf_counter() - start,
    }
