"""The canary audits' quantities (family ``audit``: ``CanaryAudit``, ``CanaryStrategy``).

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024).
"""

from __future__ import annotations

from ._keys import (
    BATCH_SIZE_VARIANCE_RATIO,
    EPSILON_ALL_ITERATES,
    EPSILON_ALL_ITERATES_MATCHED,
    EPSILON_ALL_ITERATES_MAX_COSINE,
    EPSILON_ANALYTIC,
    EPSILON_ANALYTIC_PRV,
    EPSILON_ANALYTIC_RDP,
    EPSILON_FINAL_MODEL,
    EPSILON_FINAL_MODEL_UNEQUAL_FIT,
    EPSILON_GDP_LOWER_BOUND_ALL_ITERATES,
    EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED,
    EPSILON_GDP_LOWER_BOUND_FINAL_MODEL,
    EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED,
    EPSILON_LAST_ITERATE_HEURISTIC,
    EPSILON_LOWER_BOUND_ALL_ITERATES,
    EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED,
    EPSILON_LOWER_BOUND_FINAL_MODEL,
    EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED,
    EPSILON_RATIO_ALL_ITERATES,
    EPSILON_RATIO_FINAL_MODEL,
    FAMILY_AUDIT,
    FRESH_NOISE_RATIO,
    NOISE_SCALE_RATIO,
    NUM_CANARIES_PARTICIPATED,
    VERDICT_ALL_ITERATES,
    VERDICT_FINAL_MODEL,
    VERDICT_MECHANISM,
)
from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS", "SOURCES"]

#: family -> its section title in the Custom Scalars tab.
SECTIONS: dict[str, str] = {FAMILY_AUDIT: "privacy audit (canaries)"}

#: family -> the work its quantities come from (the table in docs/tags.md cites it).
SOURCES: dict[str, str] = {
    FAMILY_AUDIT: "Andrew, Kairouz, Oh, Oprea, McMahan & Suriyakumar, \"One-shot Empirical Privacy "
                  "Estimation for Federated Learning\", ICLR 2024 (§3-5); docs/methods/canaries.md",
}

def _quantities() -> list[Quantity]:
    # One kind of number a chart: TensorBoard's Custom Scalars colour a line by its run only
    # (every tag of one run is drawn in the run's colour, told apart by its marker), so lines
    # that overlap (an estimate and the statistic it is, two verdict codes, three check ratios)
    # get charts of their own; an estimate shares its chart only with the reference it is read
    # against.
    final, allit = "final model: estimate and its reference (last-iterate heuristic)", \
        "all iterates: estimate and the claim (analytic epsilon)"
    final_bound, allit_bound = "final model: valid lower bound", "all iterates: valid lower bound"
    final_ratio, allit_ratio = "final model: estimate / reference", "all iterates: estimate / claim"
    codes = "(0 consistent, 1 suspicious or unproven, 2 violation)"
    checks = "(about 1 or more for the claimed mechanism)"
    return [
        Quantity(FAMILY_AUDIT, EPSILON_FINAL_MODEL, final,
                 "empirical epsilon, final-model adversary: the equal-variance two-Gaussian fit "
                 "of cos(c_j, theta_T - theta_0) (Andrew et al. 2024, §3.2)"),
        Quantity(FAMILY_AUDIT, EPSILON_FINAL_MODEL_UNEQUAL_FIT, None,
                 "Andrew et al.'s unequal-variance fit of the same cosines (biased upward at "
                 "small epsilon; a comparison)"),
        Quantity(FAMILY_AUDIT, EPSILON_LOWER_BOUND_FINAL_MODEL, final_bound,
                 "a valid (1 - alpha) lower bound on the final-model epsilon (Clopper-Pearson or "
                 "the f-DP one-run bound, each at alpha / 2), at fit end at plain alpha (the "
                 "summary's); the series logged during training is "
                 "epsilon_lower_bound_final_model_watched"),
        Quantity(FAMILY_AUDIT, EPSILON_GDP_LOWER_BOUND_FINAL_MODEL, None,
                 "parametric (1 - alpha) lower bound assuming Gaussian scores of equal variance; "
                 "logged only where its goodness-of-fit test passes"),
        Quantity(FAMILY_AUDIT, EPSILON_LAST_ITERATE_HEURISTIC, final,
                 "the final-model reference: epsilon of the last iterate alone (Steinke et al., "
                 "The Last Iterate Advantage, ICLR 2025), a heuristic, not a bound"),
        Quantity(FAMILY_AUDIT, EPSILON_ALL_ITERATES, allit,
                 "empirical epsilon, all-iterates adversary: the larger of the matched "
                 "statistic's estimate (without one: Andrew et al.'s max-cosine one) and the "
                 "final-model one; details.statistic names it"),
        Quantity(FAMILY_AUDIT, EPSILON_ALL_ITERATES_MATCHED, None,
                 "the estimate of the statistic matched to the analytic epsilon's adversary "
                 "(known rounds: DP-FedAvg, Flower; steps unknown: DP-SGD)"),
        Quantity(FAMILY_AUDIT, EPSILON_ALL_ITERATES_MAX_COSINE, None,
                 "Andrew et al.'s max over rounds of the cosine (Alg. 3): a comparison, and a "
                 "candidate of epsilon_all_iterates where no matched statistic exists"),
        Quantity(FAMILY_AUDIT, EPSILON_LOWER_BOUND_ALL_ITERATES, allit_bound,
                 "a valid (1 - alpha) lower bound on the all-iterates epsilon from the matched "
                 "statistic's scores (Clopper-Pearson or the f-DP one-run bound, each at "
                 "alpha / 2), at fit end at plain alpha (the summary's); the series logged during "
                 "training is epsilon_lower_bound_all_iterates_watched"),
        Quantity(FAMILY_AUDIT, EPSILON_GDP_LOWER_BOUND_ALL_ITERATES, None,
                 "parametric (1 - alpha) lower bound on the matched scores; logged only where "
                 "its goodness-of-fit test passes"),
        Quantity(FAMILY_AUDIT, EPSILON_ANALYTIC, allit,
                 "the all-iterates reference: the analytic epsilon of a canary at delta (the "
                 "run's accountant for DP-SGD; the Gaussian mechanism composed over the "
                 "most-sampled canary's rounds for DP-FedAvg and Flower)"),
        Quantity(FAMILY_AUDIT, EPSILON_ANALYTIC_RDP, "claim: RDP accountant (DP-SGD)",
                 "Opacus' RDP accountant on the run's history (DP-SGD)"),
        Quantity(FAMILY_AUDIT, EPSILON_ANALYTIC_PRV, "claim: PRV accountant (DP-SGD)",
                 "Opacus' PRV accountant on the run's history (DP-SGD)"),
        Quantity(FAMILY_AUDIT, EPSILON_RATIO_FINAL_MODEL, final_ratio,
                 "epsilon_final_model / epsilon_last_iterate_heuristic (near 1: the audit sees "
                 "what the heuristic predicts; well above: a leak beyond it)"),
        Quantity(FAMILY_AUDIT, EPSILON_RATIO_ALL_ITERATES, allit_ratio,
                 "epsilon_all_iterates / epsilon_analytic (near 1: the run is as private as "
                 "claimed and the audit is tight; above 1: a privacy violation)"),
        Quantity(FAMILY_AUDIT, NUM_CANARIES_PARTICIPATED, "canaries",
                 "observed canaries that took part at least once"),
        Quantity(FAMILY_AUDIT, VERDICT_FINAL_MODEL, f"final model: verdict {codes}",
                 "the final-model verdict against the claimed (analytic) epsilon: 0 consistent, "
                 "2 violation (the valid lower bound epsilon_lower_bound_final_model exceeds the "
                 "claim); not logged when unchecked (no finite claim or no estimate). The summary "
                 "holds the word and verdict_final_model_sentence (docs/methods/verdicts.md)"),
        Quantity(FAMILY_AUDIT, VERDICT_ALL_ITERATES, f"all iterates: verdict {codes}",
                 "the all-iterates verdict against the claimed (analytic) epsilon: 0 consistent, "
                 "1 suspicious (the estimate's interval lies above the claim), 2 violation (the "
                 "valid lower bound epsilon_lower_bound_all_iterates exceeds it); not logged when "
                 "unchecked. The summary holds the word and verdict_all_iterates_sentence"),
        Quantity(FAMILY_AUDIT, NOISE_SCALE_RATIO, f"mechanism check: noise scale {checks}",
                 "the releases' energy over the claimed noise's, sum ||r_t||^2 / (m T s^2), on the "
                 "parameter tensor whose chi-square lower-tail p-value is smallest (the one a "
                 "verdict names): about 1 or more with the claimed noise (a tensor of few "
                 "entries varies more); flagged, noise missing or short, when that test rejects "
                 "(below the summary's details.threshold; docs/methods/mechanism_checks.md F1, F3)"),
        Quantity(FAMILY_AUDIT, FRESH_NOISE_RATIO, "mechanism check: fresh noise (about 2 with fresh noise)",
                 "the energy of consecutive releases' differences over the claimed noise's, on "
                 "the tensor whose chi-square lower-tail p-value is smallest: about 2 with fresh "
                 "noise, near 0 when the noise repeats; flagged when that test of 'at least 1' "
                 "rejects (below the summary's details.threshold; "
                 "docs/methods/mechanism_checks.md F2)"),
        Quantity(FAMILY_AUDIT, BATCH_SIZE_VARIANCE_RATIO, "mechanism check: batch-size variance (about 1 for Poisson batches)",
                 "the variance of the steps' real batch sizes over Binomial(N, q)'s N q (1 - q): "
                 "about 1 under the Poisson sampling the accountant assumes, about 0 for "
                 "fixed-size shuffled batches (docs/methods/mechanism_checks.md F4)"),
        Quantity(FAMILY_AUDIT, VERDICT_MECHANISM, f"mechanism checks: verdict {codes}",
                 "the checks of the mechanism: 0 consistent, 1 unproven (the loader is not the "
                 "sampler the accountant assumes), 2 violation (the noise is missing, short or "
                 "repeated on some tensor); noise replayable from a public seed is said in "
                 "verdict_mechanism_sentence, not in the word; the summary holds both"),
        Quantity(FAMILY_AUDIT, EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED, final_bound,
                 "the watched series of the final-model valid bound, logged during training: "
                 "each point at the level spent for it, so the series' maximum is a valid "
                 "(1 - alpha) bound; epsilon_lower_bound_final_model is the fit-end bound at "
                 "plain alpha (the summary's and the report's)"),
        Quantity(FAMILY_AUDIT, EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED, allit_bound,
                 "the watched series of the all-iterates valid bound, each point at the level "
                 "spent for it (the series' maximum is valid); epsilon_lower_bound_all_iterates "
                 "is the fit-end bound at plain alpha (the summary's and the report's)"),
        Quantity(FAMILY_AUDIT, EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED, None,
                 "the watched series of the final-model parametric bound, each point at the "
                 "level spent for it"),
        Quantity(FAMILY_AUDIT, EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED, None,
                 "the watched series of the all-iterates parametric bound, each point at the "
                 "level spent for it"),
    ]


QUANTITIES: list[Quantity] = _quantities()
