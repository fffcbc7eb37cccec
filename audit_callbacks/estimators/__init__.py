"""Pure numpy/scipy estimators: epsilon of Gaussian pairs, the cosine null, canary estimates,
eps_lo lower bounds, binomial confidence intervals and error-rate epsilons.

Input rules (every public function here, and the attacks and mechanisms): a bad argument raises
ValueError naming it, never TypeError/RuntimeError from a conversion, and no function returns
NaN. Tensors are converted by the estimators themselves (any float dtype including bfloat16 and
float16, requires_grad, any device: detached, moved to the CPU, widened to float64); statistics
such as cosines must be floating-point (booleans, integers, complex numbers, objects rejected);
NaN, inf, empty and wrongly shaped input is rejected; deltas must lie in (0, 1) and are resolved
down to 1e-300; a root finder that cannot represent its answer names the input out of range.

Sources: Andrew et al. (ICLR 2024) and docs/methods.md
sections A and D; Balle & Wang (2018) for the analytic Gaussian mechanism.
"""

from .canary_epsilon import estimate_epsilon_from_cosines
from .cosine_null import (
    cosine_null_cdf,
    cosine_null_logcdf,
    cosine_null_logsf,
    cosine_null_sample,
    cosine_null_sf,
)
from .error_rates import epsilon_from_error_rates, epsilon_from_error_rates_array
from .gaussian import (
    epsilon_two_gaussians,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_epsilon_array,
    gaussian_mu,
    two_gaussians_delta,
)
from .intervals import (
    clopper_pearson_interval,
    clopper_pearson_lower,
    clopper_pearson_upper,
    jeffreys_interval,
    jeffreys_lower,
    jeffreys_upper,
)
from .label_dp import (
    ClientLabelDPBound,
    ClientLabelDPDetail,
    LabelDPBounds,
    LabelDPDetail,
    argmin_attack_success_probability,
    client_update_label_dp_lower_bound,
    extrapolate_lower_bound,
    extrapolation_factor,
    flipped_clip_factors,
    label_dp_lower_bound,
    last_layer_gram_inverse_diag,
)
from .last_iterate import (
    dpsgd_last_iterate_epsilon,
    fedavg_last_iterate_epsilon,
    fedavg_last_iterate_shifts,
    fedavg_momentum_weights,
    mixture_gaussian_delta,
    mixture_gaussian_epsilon,
)
from .lower_bound import (
    estimate_epsilon_lower_bound_from_cosines,
)
from .planner import AuditPlan, plan_audit
from .result import AuditResult
from .score_auditor import CanaryScoreAuditor
from .shuffle import (
    min_clients_for_shuffling,
    shuffle_amplification_bound,
    shuffle_dummy_exact_epsilon,
    shuffle_test,
)
from .valid_bounds import (
    spent_alpha,
    tightest_valid_lower_bound,
    valid_bound_values,
    watched_lower_bound,
)

__all__ = [
    "dpsgd_last_iterate_epsilon",
    "fedavg_last_iterate_epsilon",
    "fedavg_last_iterate_shifts",
    "fedavg_momentum_weights",
    "mixture_gaussian_delta",
    "mixture_gaussian_epsilon",
    "AuditResult",
    "CanaryScoreAuditor",
    "clopper_pearson_interval",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "cosine_null_cdf",
    "cosine_null_logcdf",
    "cosine_null_logsf",
    "cosine_null_sample",
    "cosine_null_sf",
    "epsilon_from_error_rates",
    "epsilon_from_error_rates_array",
    "epsilon_two_gaussians",
    "estimate_epsilon_from_cosines",
    "estimate_epsilon_lower_bound_from_cosines",
    "extrapolate_lower_bound",
    "extrapolation_factor",
    "flipped_clip_factors",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_epsilon_array",
    "gaussian_mu",
    "jeffreys_interval",
    "jeffreys_lower",
    "jeffreys_upper",
    "label_dp_lower_bound",
    "LabelDPBounds",
    "LabelDPDetail",
    "ClientLabelDPBound",
    "ClientLabelDPDetail",
    "client_update_label_dp_lower_bound",
    "argmin_attack_success_probability",
    "last_layer_gram_inverse_diag",
    "min_clients_for_shuffling",
    "shuffle_amplification_bound",
    "shuffle_dummy_exact_epsilon",
    "shuffle_test",
    "spent_alpha",
    "tightest_valid_lower_bound",
    "two_gaussians_delta",
    "valid_bound_values",
    "watched_lower_bound",
    "AuditPlan",
    "plan_audit",
]
