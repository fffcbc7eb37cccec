"""The canary audits' quantities (family ``audit``: ``CanaryAudit``, ``CanaryStrategy``).

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024).
"""

from __future__ import annotations

from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {"audit": "privacy audit (canaries)"}

def _quantities() -> list[Quantity]:
    final, allit, ratio = "final model: estimate, bound, reference", \
        "all iterates: estimate, bound, reference", "estimate / reference"
    verdict = "verdict (0 consistent, 1 suspicious, 2 violation)"
    return [
        Quantity("audit", "epsilon_final_model", final,
                 "empirical epsilon, final-model adversary: the equal-variance two-Gaussian fit "
                 "of cos(c_j, theta_T - theta_0) (Andrew et al. 2024, §3.2)"),
        Quantity("audit", "epsilon_final_model_unequal_fit", None,
                 "Andrew et al.'s unequal-variance fit of the same cosines (biased upward at "
                 "small epsilon; a comparison)"),
        Quantity("audit", "epsilon_lower_bound_final_model", final,
                 "a valid (1 - alpha) lower bound on the final-model epsilon (Clopper-Pearson or "
                 "the f-DP one-run bound, each at alpha / 2); the maximum of the logged series is "
                 "itself a valid bound (alpha spent over the logged points)"),
        Quantity("audit", "epsilon_gdp_lower_bound_final_model", None,
                 "parametric (1 - alpha) lower bound assuming Gaussian scores of equal variance; "
                 "logged only where its goodness-of-fit test passes"),
        Quantity("audit", "epsilon_last_iterate_heuristic", final,
                 "the final-model reference: epsilon of the last iterate alone (Steinke et al., "
                 "The Last Iterate Advantage, ICLR 2025), a heuristic, not a bound"),
        Quantity("audit", "epsilon_all_iterates", allit,
                 "empirical epsilon, all-iterates adversary: the larger of the matched "
                 "statistic's estimate and the final-model one"),
        Quantity("audit", "epsilon_all_iterates_matched", allit,
                 "the estimate of the statistic matched to the analytic epsilon's adversary "
                 "(known rounds: DP-FedAvg, Flower; steps unknown: DP-SGD)"),
        Quantity("audit", "epsilon_all_iterates_max_cosine", None,
                 "Andrew et al.'s max over rounds of the cosine (Alg. 3), a comparison"),
        Quantity("audit", "epsilon_lower_bound_all_iterates", allit,
                 "a valid (1 - alpha) lower bound on the all-iterates epsilon from the matched "
                 "statistic's scores (Clopper-Pearson or the f-DP one-run bound, each at "
                 "alpha / 2), spent over the logged points like the final model's"),
        Quantity("audit", "epsilon_gdp_lower_bound_all_iterates", None,
                 "parametric (1 - alpha) lower bound on the matched scores; logged only where "
                 "its goodness-of-fit test passes"),
        Quantity("audit", "epsilon_analytic", allit,
                 "the all-iterates reference: the analytic epsilon of a canary at delta (the "
                 "run's accountant for DP-SGD; the Gaussian mechanism composed over the "
                 "most-sampled canary's rounds for DP-FedAvg and Flower)"),
        Quantity("audit", "epsilon_analytic_rdp", "epsilon (analytic, DP-SGD accountants)",
                 "Opacus' RDP accountant on the run's history (DP-SGD)"),
        Quantity("audit", "epsilon_analytic_prv", "epsilon (analytic, DP-SGD accountants)",
                 "Opacus' PRV accountant on the run's history (DP-SGD)"),
        Quantity("audit", "epsilon_ratio_final_model", ratio,
                 "epsilon_final_model / epsilon_last_iterate_heuristic (near 1: the audit sees "
                 "what the heuristic predicts; well above: a leak beyond it)"),
        Quantity("audit", "epsilon_ratio_all_iterates", ratio,
                 "epsilon_all_iterates / epsilon_analytic (near 1: the run is as private as "
                 "claimed and the audit is tight; above 1: a privacy violation)"),
        Quantity("audit", "num_canaries_participated", "canaries",
                 "observed canaries that took part at least once"),
        Quantity("audit", "verdict_final_model", verdict,
                 "the final-model verdict against the claimed (analytic) epsilon: 0 consistent, "
                 "2 violation (the valid lower bound epsilon_lower_bound_final_model exceeds the "
                 "claim); not logged when unchecked (no finite claim or no estimate). The summary "
                 "holds the word and verdict_final_model_sentence (docs/methods/verdicts.md)"),
        Quantity("audit", "verdict_all_iterates", verdict,
                 "the all-iterates verdict against the claimed (analytic) epsilon: 0 consistent, "
                 "1 suspicious (the estimate's interval lies above the claim), 2 violation (the "
                 "valid lower bound epsilon_lower_bound_all_iterates exceeds it); not logged when "
                 "unchecked. The summary holds the word and verdict_all_iterates_sentence"),
    ]


QUANTITIES: list[Quantity] = _quantities()
