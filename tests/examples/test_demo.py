"""``make demo`` (examples/federated_canary_audit.py) at a meaningful privacy level: its claim is
at most epsilon = 10, its printed estimate / claim ratio lies in the range the planner gives a
correct run at its settings, it warns about none of its own settings, and it says why it chose
this level and where the report is. The settings' arithmetic is checked without training; one
slow test runs the demo as ``make demo`` does."""

from __future__ import annotations

import functools
import importlib.util
import math
import re
import warnings
from pathlib import Path

import pytest

from audit_callbacks.backends.fedavg import crowding_warning
from audit_callbacks.estimators.gaussian import gaussian_epsilon

DEMO = Path(__file__).resolve().parents[2] / "examples" / "federated_canary_audit.py"


def _demo():
    spec = importlib.util.spec_from_file_location("federated_canary_audit_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demos_settings_claim_at_most_epsilon_10_without_crowding_canaries():
    """The claim of the defaults before any training: shuffled cohorts put every client and
    canary in T m / (N + k) rounds; the Gaussian mechanism composed over them (the analytic
    epsilon DP-FedAvg's audit reports) is at most 10 at the demo's delta, and the canaries are
    under the share of the population that is warned about."""
    args = _demo().parse_args([])
    k, n, m = args.canaries, args.clients, args.clients_per_round
    rounds_each = math.ceil(args.rounds * m / (n + k))
    claim = gaussian_epsilon(args.noise_multiplier, args.delta, compositions=rounds_each)
    assert claim <= 10, (claim, rounds_each)
    assert args.noise_multiplier >= 1  # not the earlier z = 0.1 (epsilon 649)
    assert crowding_warning(k, n, m) is None


def _ratio_line(out: str) -> tuple[float, float, float]:
    match = re.search(r"estimate / claim ([0-9.]+): (?:inside|OUTSIDE) \[([0-9.]+), ([0-9.]+)\]", out)
    assert match, out
    return tuple(float(g) for g in match.groups())


def _run(demo, tmp_path, capsys, attempt: int):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = demo.main(["--log-dir", str(tmp_path / str(attempt))])
    own = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return summary, capsys.readouterr().out, own


@pytest.mark.slow
def test_why_this_level_is_true_for_any_noise_multiplier():
    """The demo's closing sentence follows the claim's tier and the plan's ceiling (before, it
    said "at most 10" for any claim, 19.4 at z = 1 included)."""
    why = _demo().why_this_level
    assert "at most 10" in why(8.3, 1e-6, 6.93, 10) and "interval can still check" in why(8.3, 1e-6, 6.93, 10)
    assert "above 10" in why(19.4, 1e-6, 6.93, 10) and "at most 10," not in why(19.4, 1e-6, 6.93, 10)
    assert "valid bound can check it" in why(0.9, 1e-6, 6.93, 10) and "at most 1," in why(0.9, 1e-6, 6.93, 10)
    # the comparisons are at the run's participations: 649 at 10, 166 at 2 (--quick)
    assert "z = 0.1 would claim 649 here" in why(8.3, 1e-6, 6.93, 10)
    assert "z = 0.1 would claim 166 here" in why(3.3, 1e-6, 6.93, 2)
    assert "the default z = 2 would claim 8.3 here" in why(19.4, 1e-6, 6.93, 10)


def test_make_demo_claims_at_most_10_reads_its_ratio_in_the_planned_range_and_warns_nothing(
        tmp_path, capsys, caplog, monkeypatch):
    """The demo as ``make demo`` runs it, but for its cohorts and noise: secret there (OS
    entropy), so a correct run's ratio falls outside the planned 95% range 1 time in 20 and
    its valid bound reads "suspicious" about 1 time in 60; seeded here (``sampling_seed=1``,
    ``reproducible_noise=True``), so the test reads one fixed correct run (ratio 1.00)."""
    demo = _demo()
    monkeypatch.setattr(demo, "DPFedAvg", functools.partial(demo.DPFedAvg, sampling_seed=1,
                                                            reproducible_noise=True))
    attempt = 0
    summary, out, own = _run(demo, tmp_path, capsys, attempt)
    assert own == [], own  # no warning about the demo's own settings (nor any other)
    claim = summary["epsilon_analytic"]
    assert claim <= 10
    ratio, low, high = _ratio_line(out)
    assert ratio == pytest.approx(summary["epsilon_ratio_all_iterates"], abs=0.006)
    assert (low, high) == pytest.approx((summary["plan_ratio_low"], summary["plan_ratio_high"]),
                                        abs=0.006)  # the library's plan, made at fit start
    assert low <= ratio <= high, (ratio, low, high)
    accuracy = float(re.search(r"validation accuracy ([0-9.]+)", out).group(1))
    assert accuracy >= 0.8, out  # a useful model at this privacy level (chance: 0.1)
    assert "Why this privacy level" in out and f"epsilon = {claim:.1f}" in out
    assert summary["verdict_all_iterates"] == "consistent"
    (path,) = list((tmp_path / str(attempt)).rglob("audit_report.html"))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("audit report: ")]
    assert said == [f"audit report: {path}"], said  # where the report is, said once (the library)
