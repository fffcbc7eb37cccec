"""The names of the table, each defined once: import these, never spell a name as a literal.

A ``FAMILY_*`` constant is a tag prefix; every other constant is a quantity's ``name`` (its
result field, its summary-JSON key and, after the family, its TensorBoard tag). A name shared by
several families (``accuracy``, ``epsilon_lower_bound``, ``epsilon_analytic``) is one constant.
The local-DP quantities measured once per adversary or attack mode are the ``*_STEM`` constants
followed by ``_<adversary>`` or ``_<mode>`` (:func:`qualified`); the stem is also the key of the
callback's record. A test walks the package and fails on a literal equal to any of these
outside ``audit_callbacks/names/``.
"""

from __future__ import annotations

# -- families (tag prefixes) ----------------------------------------------------------------------
FAMILY_AUDIT = "audit"
FAMILY_LABEL_ATTACK = "label_attack"
FAMILY_LABEL_DP = "label_dp"
FAMILY_FL_LABEL_ATTACK = "fl_label_attack"
FAMILY_LDP = "ldp"
FAMILY_LDP_INFERENCE = "ldp_inference"
FAMILY_FL = "fl"
FAMILY_PRIVACY = "privacy"
FAMILY_VAL = "val"
FAMILY_TEST = "test"

# -- canary audits (family audit) -----------------------------------------------------------------
EPSILON_FINAL_MODEL = "epsilon_final_model"
EPSILON_FINAL_MODEL_UNEQUAL_FIT = "epsilon_final_model_unequal_fit"
EPSILON_LOWER_BOUND_FINAL_MODEL = "epsilon_lower_bound_final_model"
EPSILON_GDP_LOWER_BOUND_FINAL_MODEL = "epsilon_gdp_lower_bound_final_model"
EPSILON_LAST_ITERATE_HEURISTIC = "epsilon_last_iterate_heuristic"
EPSILON_ALL_ITERATES = "epsilon_all_iterates"
EPSILON_ALL_ITERATES_MATCHED = "epsilon_all_iterates_matched"
EPSILON_ALL_ITERATES_MAX_COSINE = "epsilon_all_iterates_max_cosine"
EPSILON_LOWER_BOUND_ALL_ITERATES = "epsilon_lower_bound_all_iterates"
EPSILON_GDP_LOWER_BOUND_ALL_ITERATES = "epsilon_gdp_lower_bound_all_iterates"
EPSILON_ANALYTIC = "epsilon_analytic"
EPSILON_ANALYTIC_RDP = "epsilon_analytic_rdp"
EPSILON_ANALYTIC_PRV = "epsilon_analytic_prv"
#: DP-SGD whose batches are known (replayable from a public seed): the unamplified claim
EPSILON_ANALYTIC_KNOWN_BATCHES = "epsilon_analytic_known_batches"
EPSILON_RATIO_FINAL_MODEL = "epsilon_ratio_final_model"
EPSILON_RATIO_ALL_ITERATES = "epsilon_ratio_all_iterates"
NUM_CANARIES_PARTICIPATED = "num_canaries_participated"
VERDICT_FINAL_MODEL = "verdict_final_model"
VERDICT_ALL_ITERATES = "verdict_all_iterates"
NOISE_SCALE_RATIO = "noise_scale_ratio"
FRESH_NOISE_RATIO = "fresh_noise_ratio"
BATCH_SIZE_VARIANCE_RATIO = "batch_size_variance_ratio"
VERDICT_MECHANISM = "verdict_mechanism"
#: the audit's plan (summary keys, ``audit_callbacks.auditing.plan``)
PLAN_STATUS = "plan_status"
PLAN_CEILING = "plan_ceiling"
PLAN_RATIO_LOW = "plan_ratio_low"
PLAN_RATIO_MEDIAN = "plan_ratio_median"
PLAN_RATIO_HIGH = "plan_ratio_high"
PLAN_COVERAGE = "plan_coverage"
PLAN_REFERENCE = "plan_reference_epsilon"
PLAN_CLIP_FACTOR = "plan_clip_factor"
PLAN_NOISE_FACTOR = "plan_noise_factor"
PLAN_SENTENCE = "plan_sentence"
PLAN_RATIO_READING = "plan_ratio_reading"
PLAN_STEPS = "plan_steps"
#: the watched series' valid bounds (each point at the level spent for it), apart from the
#: fit-end bounds at plain alpha
EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED = "epsilon_lower_bound_all_iterates_watched"
EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED = "epsilon_lower_bound_final_model_watched"
EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED = "epsilon_gdp_lower_bound_all_iterates_watched"
EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED = "epsilon_gdp_lower_bound_final_model_watched"
#: the summary input saying where the audit's delta came from: ``"argument"`` (given to the
#: audit), ``"module"`` (the training's own ``delta`` attribute) or ``"default"``
DELTA_SOURCE = "delta_source"
#: the TensorBoard text of the fit-end numbers (a Markdown table; not a scalar)
FIT_END_NUMBERS = "fit_end_numbers"

# -- label callbacks (label_attack, label_dp, fl_label_attack) ------------------------------------
ACCURACY = "accuracy"
COUNT_ACCURACY = "count_accuracy"
ATTACKED_FRACTION = "attacked_fraction"
SKIP_REASON = "skip_reason"
WARNINGS = "warnings"
EPSILON_LOWER_BOUND = "epsilon_lower_bound"
EPSILON_LOWER_BOUND_MAX = "epsilon_lower_bound_max"
EPSILON_LOWER_BOUND_EXTRAPOLATED = "epsilon_lower_bound_extrapolated"
EPSILON_LOWER_BOUND_SECOND_LAST = "epsilon_lower_bound_second_last"
EPSILON_LOWER_BOUND_SECOND_LAST_MAX = "epsilon_lower_bound_second_last_max"
EPSILON_PAIR_OPTIMAL_TEST = "epsilon_pair_optimal_test"
EPSILON_PAIR_LAYER = "epsilon_pair_layer"
EPSILON_PAIR_ALL_PARAMS = "epsilon_pair_all_params"
EPSILON_SINGLE_STEP = "epsilon_single_step"
EPSILON_ACCOUNTANT = "epsilon_accountant"
EXPECTED_ATTACK_ACCURACY = "expected_attack_accuracy"
ACCURACY_NOISED = "accuracy_noised"
EXPECTED_ACCURACY_NOISED = "expected_accuracy_noised"
ATTACKED_CLIENTS = "attacked_clients"
EPSILON_SINGLE_ROUND = "epsilon_single_round"

# -- local DP (ldp, ldp_inference) ----------------------------------------------------------------
#: per adversary: ``epsilon0_<adversary>``, ``epsilon0_lower_bound_<adversary>``; per attack
#: mode: ``error_<mode>``... (see :func:`qualified`). ``norm_g1`` is the key of a record's crafted
#: |g1| in memory only (a real example's value: no tag, docs/security.md).
EPSILON0_STEM = "epsilon0"
EPSILON0_LOWER_BOUND_STEM = "epsilon0_lower_bound"
NORM_G1_STEM = "norm_g1"
ERROR_STEM = "error"
ERROR_MEDIAN_STEM = "error_median"
ERROR_MAX_STEM = "error_max"
CONFIDENCE_STEM = "confidence"
EPSILON0_CLAIMED = "epsilon0_claimed"
EPSILON0_CEILING = "epsilon0_ceiling"
CLIP_NORM = "clip_norm"
CLIENT_UPDATES_AT_CLIP = "client_updates_at_clip"
EPSILON_EXACT_PER_COORDINATE = "epsilon_exact_per_coordinate"
EPSILON_CLAIMED_PER_COORDINATE = "epsilon_claimed_per_coordinate"

# -- DPFedAvg's own metrics (fl, privacy, val, test) -------------------------------------------
ROUND = "round"
COHORT_SIZE = "cohort_size"
LOSS = "loss"


def qualified(stem: str, suffix: str) -> str:
    """The name of a per-adversary (per-mode) quantity: ``qualified(EPSILON0_STEM, "dummy")`` is
    ``"epsilon0_dummy"``."""
    return f"{stem}_{suffix}"


#: every constant above, by its Python name (the test and ``__all__`` read it).
CONSTANTS: dict[str, str] = {
    k: v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str)}
