"""The canary audits' quantities (family ``audit``: ``CanaryAudit``, ``CanaryStrategy``).

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024).
"""

from __future__ import annotations

from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {"audit": "privacy audit (canaries)"}

_THREAT_MODELS = {"final_model": "final model", "all_iterates": "all iterates"}


def _quantities() -> list[Quantity]:
    out: list[Quantity] = []
    for tm, words in _THREAT_MODELS.items():
        chart = f"epsilon ({words})"
        out += [
            Quantity("audit", f"epsilon_{tm}", chart,
                     f"empirical epsilon, {words} adversary: the equal-variance two-Gaussian "
                     "fit of the canary scores (the headline estimate)"),
            Quantity("audit", f"epsilon_{tm}_unequal_fit", None,
                     f"empirical epsilon, {words}: Andrew et al.'s unequal-variance fit "
                     "(biased upward at small epsilon; a comparison, not the headline)"),
            Quantity("audit", f"epsilon_lower_bound_{tm}", chart,
                     f"valid (1 - alpha) lower bound on epsilon, {words}: Clopper-Pearson on "
                     "FPR and FNR with a Bonferroni correction over thresholds"),
            Quantity("audit", f"epsilon_gdp_lower_bound_{tm}", chart,
                     f"parametric (1 - alpha) lower bound, {words}, assuming Gaussian scores "
                     "of equal variance (Gaussian DP)"),
        ]
    out += [
        Quantity("audit", "epsilon_analytic", "epsilon (analytic)",
                 "the analytic epsilon of a canary at delta: the run's accountant (DP-SGD) or "
                 "the Gaussian mechanism composed over the most-sampled canary's rounds"),
        Quantity("audit", "epsilon_analytic_rdp", "epsilon (analytic)",
                 "Opacus' RDP accountant on the run's history (DP-SGD)"),
        Quantity("audit", "epsilon_analytic_prv", "epsilon (analytic)",
                 "Opacus' PRV accountant on the run's history (DP-SGD)"),
        Quantity("audit", "num_canaries_participated", "canaries",
                 "observed canaries that took part at least once"),
    ]
    return out


QUANTITIES: list[Quantity] = _quantities()
