"""Attacks (torch, no Lightning): the empirical eps0 test of local randomizers and its crafting
adversaries (Matsumoto et al. Alg. 2 and Table 2; docs/methods/ldp.md, C2-C3), and the inference attack on LDP-FL's
two-point mechanism (Varun et al. 2024 §3.1; docs/methods/ldp.md, C5).

The shuffle-model references and the error-count statistics are numpy-only and live in
:mod:`audit_callbacks.estimators.shuffle`.
"""

from .adversaries import (
    ADVERSARIES,
    CraftedPair,
    benign_pair,
    collusion_pair,
    craft_pair,
    dummy_pair,
    flat_gradient,
    gradient_flip_pair,
    label_flip_pair,
)
from .label_reconstruction import (
    LayerFactorization,
    SignAmbiguousLabels,
    craft_malicious_features,
    factorize_layer,
    label_attack_statistic,
    reconstruct_labels,
    reconstruct_labels_malicious_input_layer,
    reconstruct_labels_second_last_layer,
)
from .ldp_fl_inference import InferencePrediction, LDPFLInferenceAttack, two_point_prediction
from .ldp_test import (
    LDPTestResult,
    PairGeometry,
    ldp_epsilon_test,
    ldp_sgd_error_rates,
    ldp_sgd_test_epsilon,
    ldp_test_statistics,
    measurable_ceiling,
    paper_measurable_ceiling,
    supports_fast_path,
)

__all__ = [
    "ADVERSARIES",
    "benign_pair",
    "collusion_pair",
    "craft_malicious_features",
    "craft_pair",
    "CraftedPair",
    "dummy_pair",
    "factorize_layer",
    "flat_gradient",
    "gradient_flip_pair",
    "InferencePrediction",
    "label_attack_statistic",
    "label_flip_pair",
    "LayerFactorization",
    "ldp_epsilon_test",
    "ldp_sgd_error_rates",
    "ldp_sgd_test_epsilon",
    "ldp_test_statistics",
    "LDPFLInferenceAttack",
    "LDPTestResult",
    "measurable_ceiling",
    "PairGeometry",
    "paper_measurable_ceiling",
    "reconstruct_labels",
    "reconstruct_labels_malicious_input_layer",
    "reconstruct_labels_second_last_layer",
    "SignAmbiguousLabels",
    "supports_fast_path",
    "two_point_prediction",
]
