"""Bad input at every public estimator, attack and mechanism: a smoke table (issue 23, item 6).

What each kind of value does is settled once, by the property tests of the validators
(tests/test_validation.py: NaN, inf, bool, str, None, complex, 2.0 as a count, ...). This table
only checks that each public entry point calls them: one or two spoilt arguments per public
function, each expected to raise a ``ValueError`` whose message names that argument, or to give
a finite answer (no NaN anywhere, no inf except where documented).
``test_every_public_name_has_a_case`` reads the public names of ``audit_callbacks.estimators``,
``.attacks`` and ``.mechanisms`` at run time and fails when one has no case; the label-DP and
score-auditor names (being rewritten elsewhere), result types and abstract bases are exempt.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from audit_callbacks import attacks, estimators, mechanisms
from audit_callbacks.attacks import adversaries, ldp_fl_inference, ldp_test
from audit_callbacks.estimators import error_rates, shuffle

ERR, FIN, INF = "error", "finite", "inf"  # INF: math.inf, where documented

# Public names that need no case here: result types (their fields are checked on construction
# in their own tests) and names in modules that other work is rewriting.
RESULT_TYPES = {"LayerFactorization", "SignAmbiguousLabels", "AuditPlan"}
EXEMPT_MODULES = (
    "audit_callbacks.estimators.label_dp",  # label_dp, label_dp_client, a label_dp/ package
    "audit_callbacks.estimators._label_dp",
    "audit_callbacks.estimators.score_auditor",
    "audit_callbacks.estimators.estimate",  # result types
    "audit_callbacks.estimators.result",
)

RNG = np.random.default_rng(0)
COS = 0.01 + 0.01 * RNG.standard_normal(40)  # observed canary cosines
NULL = 0.01 * RNG.standard_normal(40)  # unobserved canary cosines
RATES = np.array([0.1, 0.2, 0.3])
NAN3 = np.array([0.1, np.nan, 0.3])
G1 = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
G2 = -G1.flip(0)
ROWS = torch.tensor([[0.3, -0.2, 0.5], [0.1, 0.0, -0.4]], dtype=torch.float64)
torch.manual_seed(0)
MODEL = torch.nn.Linear(4, 3)
XS = torch.randn(6, 4)
YS = torch.tensor([0, 1, 2, 0, 1, 2])
TX, TW, TB, UG = torch.randn(6, 10), torch.randn(3, 10), torch.randn(3), torch.randn(10)


def _nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = math.nan
    return t


def _lookup(name: str) -> Any:
    """A public name of the three packages, looked up when the case runs: a name that is no
    longer public fails the case (a moved entry point is renamed here with its uses)."""
    for pkg in (estimators, attacks, mechanisms):
        if name in getattr(pkg, "__all__", ()):
            return getattr(pkg, name)
    pytest.fail(f"{name} is no longer a public name of estimators, attacks or mechanisms")


CASES: list[Any] = []


def case(name: str, arg: str, expect: str, thunk: Callable[[], Any], kind: str = "") -> None:
    """``thunk()`` calls the public ``name`` with ``arg`` spoilt (``kind`` says how)."""
    CASES.append(pytest.param(name, arg, expect, thunk, id=f"{name}-{arg}-{kind or expect}"))


def call(name: str, arg: str, expect: str, kind: str, value: Any, /, **kwargs: Any) -> None:
    """``name(**kwargs, arg=value)``."""
    case(name, arg, expect, lambda: _lookup(name)(**{**kwargs, arg: value}), kind)


# ------------------------------------------------------------------------------ estimators
for nm in ("clopper_pearson_interval", "clopper_pearson_upper", "clopper_pearson_lower",
           "jeffreys_interval", "jeffreys_upper", "jeffreys_lower"):
    call(nm, "alpha", ERR, "one", 1.0, k=3, n=10)
    call(nm, "n", ERR, "float", 10.0, k=3, alpha=0.05)
call("jeffreys_upper", "k", FIN, "grad", torch.tensor(3.0, requires_grad=True), n=10, alpha=0.05)
call("clopper_pearson_interval", "k", ERR, "big", 11, n=10, alpha=0.05)
for nm in ("cosine_null_cdf", "cosine_null_sf", "cosine_null_logsf", "cosine_null_logcdf"):
    call(nm, "dim", ERR, "one", 1, t=COS)
    call(nm, "t", ERR, "nan", NAN3, dim=100)
call("cosine_null_cdf", "dim", ERR, "float", 100.0, t=COS)
call("cosine_null_sample", "rng", ERR, "str", "seed", dim=10, size=5)
call("cosine_null_sample", "size", ERR, "neg", -1, rng=0, dim=10)
call("cosine_null_sample", "rng", FIN, "none", None, dim=10, size=5)
for nm in ("estimate_epsilon_from_cosines", "estimate_epsilon_lower_bound_from_cosines"):
    call(nm, "delta", ERR, "one", 1.0, observed=COS, dim=10**4)
    call(nm, "observed", ERR, "bool", COS > 0, delta=1e-5, dim=10**4)
    call(nm, "unobserved", ERR, "nan", NAN3, observed=COS, delta=1e-5)
call("estimate_epsilon_from_cosines", "observed", FIN, "grad", torch.tensor(COS, requires_grad=True),
     delta=1e-5, dim=10**4)
call("estimate_epsilon_from_cosines", "dim", ERR, "one", 1, observed=COS, delta=1e-5)
call("estimate_epsilon_from_cosines", "bootstrap", ERR, "float", 20.0, observed=COS, delta=1e-5,
     dim=100)
call("estimate_epsilon_from_cosines", "seed", ERR, "bool", True, observed=COS, delta=1e-5,
     dim=100, bootstrap=20)
call("estimate_epsilon_from_cosines", "confidence", ERR, "one", 1.0, observed=COS, delta=1e-5,
     dim=100, bootstrap=20)
call("estimate_epsilon_from_cosines", "fit", ERR, "str", "same", observed=COS, delta=1e-5,
     dim=100)
call("estimate_epsilon_lower_bound_from_cosines", "alpha", ERR, "zero", 0.0, observed=COS, delta=1e-5,
     dim=100)
call("estimate_epsilon_lower_bound_from_cosines", "threshold", ERR, "str", "min", observed=COS,
     delta=1e-5, dim=100)
call("estimate_epsilon_lower_bound_from_cosines", "seed", ERR, "inf", math.inf, observed=COS,
     delta=1e-5, dim=100, threshold="heldout")

call("epsilon_from_error_rates", "fpr", INF, "zero", 0.0, fnr=0.2, delta=0.0)
call("epsilon_from_error_rates", "fnr", ERR, "big", 1.5, fpr=0.1, delta=0.0)
call("epsilon_from_error_rates", "delta", ERR, "nan", math.nan, fpr=0.1, fnr=0.2)
call("epsilon_from_error_rates_array", "fpr", ERR, "bool", RATES > 0.15, fnr=RATES, delta=0.0)
call("epsilon_from_error_rates_array", "fnr", FIN, "grad", torch.tensor(RATES, requires_grad=True),
     fpr=RATES, delta=0.0)
call("gaussian_delta", "epsilon", ERR, "neg", -1.0, mu=1.0)
call("gaussian_delta", "mu", FIN, "zero", 0.0, epsilon=1.0)
call("gaussian_epsilon", "noise_multiplier", ERR, "zero", 0.0, delta=1e-5)
call("gaussian_epsilon", "compositions", ERR, "float", 2.0, noise_multiplier=1.0, delta=1e-5)
call("gaussian_epsilon", "delta", FIN, "tiny", 1e-300, noise_multiplier=1.0)
call("gaussian_epsilon_array", "mu", ERR, "nan", NAN3, delta=1e-5)
call("gaussian_epsilon_array", "delta", ERR, "zero", 0.0, mu=RATES)
call("gaussian_mu", "noise_multiplier", ERR, "str", "1", compositions=1)
call("gaussian_mu", "compositions", ERR, "bool", True, noise_multiplier=1.0)
G2PAIR = {"mu_observed": 0.02, "sigma_observed": 0.01, "mu_null": 0.0, "sigma_null": 0.01}
call("epsilon_two_gaussians", "sigma_observed", ERR, "zero", 0.0,
     **{**G2PAIR, "sigma_observed": None}, delta=1e-5)
call("epsilon_two_gaussians", "delta", ERR, "one", 1.0, **G2PAIR)
call("two_gaussians_delta", "epsilon", ERR, "nan", math.nan, **G2PAIR)
call("two_gaussians_delta", "sigma_null", ERR, "tiny", 1e-300,
     **{**G2PAIR, "sigma_null": None}, epsilon=1.0)

# the shuffle model (issue 26: overflowing epsilon0 and delta = 5e-324 are valid inputs)
call("min_clients_for_shuffling", "epsilon0", FIN, "huge", 800.0, delta=1e-6)
call("min_clients_for_shuffling", "delta", FIN, "5e-324", 5e-324, epsilon0=1.0)
call("min_clients_for_shuffling", "epsilon0", ERR, "zero", 0.0, delta=1e-6)
call("shuffle_amplification_bound", "epsilon0", FIN, "huge", 800.0, n=10**400, delta=1e-6)
call("shuffle_amplification_bound", "delta", FIN, "5e-324", 5e-324, epsilon0=1.0, n=10**5)
call("shuffle_amplification_bound", "n", ERR, "float", 1000.0, epsilon0=1.0, delta=1e-6)
call("shuffle_dummy_exact_epsilon", "epsilon0", FIN, "huge", 800.0, n=50, delta=1e-6)
call("shuffle_dummy_exact_epsilon", "delta", FIN, "5e-324", 5e-324, epsilon0=1.0, n=50)
call("shuffle_dummy_exact_epsilon", "n", ERR, "zero", 0, epsilon0=1.0, delta=1e-6)
call("mixture_gaussian_epsilon", "shifts", ERR, "nan", NAN3, weights=None, delta=1e-5)
call("mixture_gaussian_epsilon", "weights", ERR, "neg", np.array([1.5, -0.5, 0.0]), shifts=RATES, delta=1e-5)
call("mixture_gaussian_epsilon", "shifts", FIN, "grad", torch.tensor(RATES, requires_grad=True), weights=None, delta=1e-5)
call("mixture_gaussian_delta", "epsilon", ERR, "neg", -1.0, shifts=RATES, weights=None)
call("dpsgd_last_iterate_epsilon", "steps", ERR, "float", 10.0, sample_rate=0.1, noise_multiplier=1.0, delta=1e-5)
call("dpsgd_last_iterate_epsilon", "sample_rate", ERR, "zero", 0.0, steps=10, noise_multiplier=1.0, delta=1e-5)
call("fedavg_last_iterate_shifts", "weight_square_sum", ERR, "zero", 0.0, weight_sums=RATES, noise_multiplier=1.0)
call("fedavg_last_iterate_epsilon", "shifts", ERR, "nan", NAN3, delta=1e-5)
call("fedavg_momentum_weights", "server_momentum", ERR, "one", 1.0, rounds=5)
call("tightest_valid_lower_bound", "in_scores", ERR, "nan", np.r_[COS[:-1], np.nan], out_scores=NULL, alpha=0.05, delta=1e-5)
call("tightest_valid_lower_bound", "alpha", ERR, "one", 1.0, in_scores=COS, out_scores=NULL, delta=1e-5)
call("tightest_valid_lower_bound", "in_scores", FIN, "grad", torch.tensor(COS, requires_grad=True), out_scores=NULL, alpha=0.05, delta=1e-5)
call("watched_lower_bound", "index", ERR, "zero", 0, in_scores=COS, out_scores=NULL, alpha=0.05, delta=1e-5)
call("watched_lower_bound", "index", ERR, "float", 1.5, in_scores=COS, out_scores=NULL, alpha=0.05, delta=1e-5)
call("spent_alpha", "index", ERR, "zero", 0, alpha=0.05)
call("spent_alpha", "alpha", ERR, "nan", math.nan, index=1)
call("valid_bound_values", "delta", ERR, "one", 1.0, data_sets=[(COS, NULL)], alpha=0.05)
PLAN = {"num_canaries": 50, "num_unobserved": 50, "dim": 1024, "steps": 20, "sample_rate": 0.1,
        "noise_multiplier": 1.0, "delta": 1e-5, "reference_epsilon": 2.0}
call("plan_audit", "num_canaries", ERR, "float", 2.5, **{k: v for k, v in PLAN.items() if k != "num_canaries"})
call("plan_audit", "sample_rate", ERR, "zero", 0.0, **{k: v for k, v in PLAN.items() if k != "sample_rate"})
call("shuffle_test", "seed", ERR, "bool", True, epsilon0=1.0, n=50, trials=100)
call("shuffle_test", "trials", ERR, "float", 100.0, epsilon0=1.0, n=50)
call("shuffle_test", "alpha", ERR, "one", 1.0, epsilon0=1.0, n=50, trials=100)


# the canary score auditor (exempt from the coverage rule; smoke only)
def _audit(in_scores: Any = COS, out_scores: Any = NULL, method: str = "epsilon_estimate",
           **kw: Any) -> Any:
    return getattr(_lookup("CanaryScoreAuditor")(in_scores, out_scores), method)(**kw)


case("CanaryScoreAuditor", "in_scores", ERR, lambda: _audit(NAN3, delta=1e-5), "nan")
case("CanaryScoreAuditor", "delta", ERR, lambda: _audit(delta=1.0), "one")
case("CanaryScoreAuditor", "alpha", ERR,
     lambda: _audit(method="epsilon_lower_bound", alpha=1.0, delta=1e-5), "one")

# label-DP bounds (exempt from the coverage rule; smoke only)
LN, LD = 6, 8
LX = RNG.standard_normal((LN, LD))
LP = RNG.uniform(0.2, 0.8, LN)
LY = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
LG = 10.0 + RNG.uniform(0.0, 1.0, LN)
LABEL = {"features": LX, "probs": LP, "labels": LY, "grad_norms": LG, "max_grad_norm": 1.0,
         "noise_multiplier": 1.0, "expected_batch_size": 6.0, "delta": 1e-5}
call("label_dp_lower_bound", "delta", ERR, "one", 1.0, **{**LABEL, "delta": None})
call("label_dp_lower_bound", "features", ERR, "nan", np.full((LN, LD), np.nan),
     **{**LABEL, "features": None})
AM = {"means": RNG.standard_normal((LN, 3)), "labels": np.array([0, 1, 2, 0, 1, 2]),
      "sd": np.ones(LN)}
call("argmin_attack_success_probability", "sd", ERR, "nan", np.full(LN, np.nan),
     **{**AM, "sd": None})
CL = {"probs": np.full((LN, 3), 1 / 3), "labels": np.array([0, 1, 2, 0, 1, 2]),
      "gram_inv_diag": np.full(LN, 0.5), "update_scale": 0.1, "local_lr": 0.5,
      "noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-5}
call("client_update_label_dp_lower_bound", "delta", ERR, "one", 1.0, **{**CL, "delta": None})
call("extrapolate_lower_bound", "num_batches", ERR, "float", 2.5, lb_one_batch=1.0,
     batch_size=5)
call("extrapolation_factor", "batch_size", ERR, "bool", True, num_batches=10)
call("flipped_clip_factors", "max_grad_norm", ERR, "zero", 0.0, probs=LP, labels=LY,
     grad_norms=LG)
call("last_layer_gram_inverse_diag", "features", ERR, "nan", np.full((LN, LD), np.nan))

# ------------------------------------------------------------------------------ mechanisms
GEN = torch.Generator().manual_seed(0)
call("LDPSGD", "epsilon0", ERR, "big", 701.0, clip_norm=1.0)
call("LDPSGD", "clip_norm", ERR, "zero", 0.0, epsilon0=1.0)
case("LDPSGD", "x", ERR, lambda: mechanisms.LDPSGD(1.0, 1.0).randomize(ROWS.long()), "int")
case("LDPSGD", "x", FIN, lambda: mechanisms.LDPSGD(1.0, 1.0).randomize(
    ROWS.to(torch.bfloat16), generator=GEN), "bf16")
case("LDPSGD", "d", ERR, lambda: mechanisms.LDPSGD(1.0, 1.0).epsilon_for_dim(2.0), "float")
call("TwoPoint", "epsilon_per_coordinate", ERR, "nan", math.nan)
call("TwoPoint", "radius", ERR, "zero", 0.0, epsilon_per_coordinate=1.0)
call("TwoPoint", "dim", ERR, "float", 3.0, epsilon_per_coordinate=1.0)
case("TwoPoint", "y", ERR, lambda: mechanisms.TwoPoint(1.0).debias(ROWS[0]), "1d")
call("GRR", "precision", ERR, "float", 2.5, epsilon_per_coordinate=1.0)
call("GRR", "rounding", ERR, "str", "up", epsilon_per_coordinate=1.0)
case("GRR", "x", ERR, lambda: mechanisms.GRR(1.0).project(_nan(ROWS)), "nan")
call("Staircase", "epsilon_per_coordinate", ERR, "bool", True)
call("Staircase", "debias_method", ERR, "str", "biased", epsilon_per_coordinate=1.0)
call("BrokenStaircase", "defect", ERR, "str", "none", epsilon_per_coordinate=1.0)
call("GaussianRandomizer", "delta", ERR, "one", 1.0, noise_multiplier=1.0, clip_norm=1.0)
call("GaussianRandomizer", "noise_multiplier", ERR, "tiny", 1e-300, clip_norm=1.0, delta=1e-5)
for nm in ("exact_epsilon", "exact_epsilon_witness"):
    call(nm, "mechanism", ERR, "continuous", mechanisms.LDPSGD(1.0, 1.0))
    call(nm, "inputs", ERR, "nan", NAN3, mechanism=mechanisms.TwoPoint(1.0))
call("exact_epsilon_witness", "chunk_elements", ERR, "zero", 0,
     mechanism=mechanisms.TwoPoint(1.0))
call("ExactAudit", "epsilon", FIN, "ok", 1.0, x_high=1.0, x_low=0.0, y=1.0)
call("sphere_sign_constant", "d", ERR, "zero", 0)
call("sphere_sign_constant", "d", ERR, "float", 3.0)
for nm in ("staircase_group_sizes", "reference_group_sizes"):
    call(nm, "delta_d", ERR, "neg", -1.0, domain_size=21, groups=4)
    call(nm, "groups", ERR, "one", 1, domain_size=21, delta_d=1.0)
call("staircase_max_delta", "domain_size", ERR, "float", 2.5, groups=2)
call("staircase_alphas", "epsilon", ERR, "zero", 0.0, sizes=(5, 5, 6))
call("staircase_alphas", "sizes", ERR, "one", (5,), epsilon=1.0)

# -------------------------------------------------------------------------------- attacks
LDP = {"mechanism": mechanisms.LDPSGD(1.0, 1.0), "g1": G1.numpy(), "g2": G2.numpy()}
call("ldp_epsilon_test", "trials", ERR, "float", 200.0, **LDP)
call("ldp_epsilon_test", "seed", ERR, "bool", True, **LDP, trials=50)
call("ldp_epsilon_test", "path", ERR, "str", "slow", **LDP, trials=50)
call("ldp_epsilon_test", "batch_size", ERR, "zero", 0, **LDP, trials=50)
call("ldp_epsilon_test", "alpha", ERR, "one", 1.0, **LDP, trials=50)
call("ldp_epsilon_test", "g1", ERR, "nan", _nan(G1), **{**LDP, "g1": None}, trials=50)
call("ldp_epsilon_test", "g1", FIN, "bf16", G1.to(torch.bfloat16), **{**LDP, "g1": None},
     trials=50)
call("ldp_test_statistics", "seed", ERR, "inf", math.inf, **LDP, trials=50)
call("ldp_test_statistics", "g2", ERR, "bool", G2.numpy() > 0, **{**LDP, "g2": None},
     trials=50)
call("ldp_test_statistics", "mechanism", ERR, "none", None, g1=G1, g2=G2, trials=50)
call("ldp_sgd_error_rates", "epsilon0", ERR, "zero", 0.0, clip_norm=1.0, g1=G1, g2=G2)
call("ldp_sgd_error_rates", "g1", ERR, "2d", np.ones((2, 4)), epsilon0=1.0, clip_norm=1.0,
     g2=G2)
call("ldp_sgd_test_epsilon", "clip_norm", ERR, "nan", math.nan, epsilon0=1.0, g1=G1, g2=G2)
call("measurable_ceiling", "trials", ERR, "zero", 0)
call("measurable_ceiling", "alpha", ERR, "one", 1.0, trials=1000)
call("paper_measurable_ceiling", "trials", ERR, "bool", True)
call("paper_measurable_ceiling", "alpha", ERR, "nan", math.nan, trials=1000)
case("supports_fast_path", "mechanism", FIN, lambda: float(attacks.supports_fast_path(None)))
case("PairGeometry", "dim", FIN,
     lambda: attacks.PairGeometry(3, 1.0, 1.0, 0.0, 1.0, False).angle)
case("LDPTestResult", "result", FIN, lambda: attacks.ldp_epsilon_test(
    mechanisms.LDPSGD(1.0, 1.0), G1, G2, trials=10).to_estimate().value)

PAIR = {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS, "y": YS}
for nm, extra in (("benign_pair", {}), ("label_flip_pair", {"num_classes": 3}),
                  ("gradient_flip_pair", {}), ("collusion_pair", {"target_label": 0, "steps": 2})):
    call(nm, "x", ERR, "nan", _nan(XS), **{**PAIR, "x": None}, **extra)
    call(nm, "y", ERR, "float", YS.float(), **{**PAIR, "y": None}, **extra)
call("benign_pair", "rng", ERR, "float", 0.5, **PAIR)
call("benign_pair", "x", FIN, "bf16", XS.to(torch.bfloat16), **{**PAIR, "x": None})
call("label_flip_pair", "num_classes", ERR, "one", 1, **PAIR)
call("gradient_flip_pair", "y", ERR, "neg", -YS - 1, **{**PAIR, "y": None})
call("collusion_pair", "lr", ERR, "zero", 0.0, **PAIR, target_label=0)
call("collusion_pair", "steps", ERR, "float", 2.5, **PAIR, target_label=0)
call("flat_gradient", "x", ERR, "int", XS[:1].long(), model=MODEL, loss_fn=F.cross_entropy,
     y=YS[:1])
call("dummy_pair", "dim", ERR, "zero", 0, clip_norm=1.0)
call("dummy_pair", "dtype", ERR, "int", torch.int64, dim=5, clip_norm=1.0)
call("craft_pair", "name", ERR, "unknown", "nope", dim=5, clip_norm=1.0)
call("craft_pair", "x", ERR, "nan", _nan(XS), name="benign", **{**PAIR, "x": None})
case("CraftedPair", "pair", FIN, lambda: attacks.dummy_pair(4, 1.0).as_tuple())
case("ADVERSARIES", "dummy", FIN, lambda: attacks.ADVERSARIES["dummy"](4, 1.0).cosine)

call("two_point_prediction", "epsilon", ERR, "zero", 0.0, p=RATES, center=0.0, radius=1.0)
call("two_point_prediction", "p", ERR, "big", RATES + 1.0, epsilon=1.0, center=0.0, radius=1.0)
call("LDPFLInferenceAttack", "radius", ERR, "zero", 0.0)
call("LDPFLInferenceAttack", "seed", ERR, "bool", True)
case("LDPFLInferenceAttack", "released", ERR,
     lambda: attacks.LDPFLInferenceAttack().observe(NAN3), "nan")


def _predict(target: Any) -> Any:
    att = attacks.LDPFLInferenceAttack()
    att.observe(RATES)
    att.observe(RATES[::-1].copy())
    return att.predict(target)


case("InferencePrediction", "target", ERR, lambda: _predict(np.zeros((3, 1))), "2d")
case("InferencePrediction", "target", FIN, lambda: _predict(torch.zeros(1, requires_grad=True)),
     "grad")

# label reconstruction (torch)
RECON = {"features": TX, "weight_grad": TW, "bias_grad": TB}
for nm in ("reconstruct_labels", "label_attack_statistic"):
    call(nm, "features", ERR, "nan", _nan(TX), **{**RECON, "features": None})
    call(nm, "weight_grad", ERR, "bool", TW > 0, **{**RECON, "weight_grad": None})
call("factorize_layer", "features", ERR, "empty", TX[:0])
call("craft_malicious_features", "batch_size", ERR, "float", 2.5,
     first_layer_weight=torch.randn(4, 10))
call("reconstruct_labels_malicious_input_layer", "unit_weight_grad", ERR, "nan", _nan(UG),
     features=TX)
call("reconstruct_labels_second_last_layer", "inputs", ERR, "nan", _nan(TX),
     unit_weight_grad=UG, pre_activations=torch.randn(6))


# ----------------------------------------------------------------------------- checks
def _assert_finite(obj: Any, where: str = "result") -> None:
    """No NaN anywhere; no inf except a game's documented infinite upper bound."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for fld in dataclasses.fields(obj):
            if fld.name != "epsilon_upper_bound":
                _assert_finite(getattr(obj, fld.name), f"{where}.{fld.name}")
    elif isinstance(obj, dict):
        for key, val in obj.items():
            _assert_finite(val, f"{where}[{key!r}]")
    elif isinstance(obj, (tuple, list)):
        for i, val in enumerate(obj):
            _assert_finite(val, f"{where}[{i}]")
    elif isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            assert bool(torch.isfinite(obj.detach()).all()), where
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind == "f":
            assert np.all(np.isfinite(obj)), where
    elif isinstance(obj, (float, np.floating)):
        assert math.isfinite(obj), f"{where} = {obj}"


@pytest.mark.parametrize(("name", "arg", "expect", "thunk"), CASES)
def test_bad_input(name: str, arg: str, expect: str, thunk: Callable[[], Any]) -> None:
    if expect == ERR:
        with pytest.raises(ValueError, match=rf"\b{arg}\b"):
            thunk()
    elif expect == INF:
        assert thunk() == math.inf
    else:
        _assert_finite(thunk())


def _exempt(name: str, obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return (
        name in RESULT_TYPES
        or module.startswith(EXEMPT_MODULES)
        or (inspect.isclass(obj) and inspect.isabstract(obj))
    )


def test_every_public_name_has_a_case() -> None:
    public = {
        name: getattr(pkg, name)
        for pkg in (estimators, attacks, mechanisms) for name in pkg.__all__
    }
    covered = {p.values[0] for p in CASES}
    missing = sorted(n for n, obj in public.items() if not _exempt(n, obj) and n not in covered)
    assert not missing, f"public names without a bad-input case: {missing}"
    # every module the brief names exports only what its package re-exports
    for mod in (adversaries, ldp_test, ldp_fl_inference):
        assert set(mod.__all__) <= set(attacks.__all__)
    assert {"epsilon_from_counts", "confusion_counts"} <= set(error_rates.__all__)
    assert "shuffle_test" in shuffle.__all__


def test_the_ldp_callbacks_check_their_arguments() -> None:
    from audit_callbacks import callbacks

    bad: list[tuple[Callable[..., Any], str, Any]] = [
        (callbacks.LDPAudit, "trials", 2.5), (callbacks.LDPAudit, "trials", True),
        (callbacks.LDPAudit, "alpha", 1.0), (callbacks.LDPAudit, "every_n_rounds", 1.5),
        (callbacks.LDPAudit, "seed", True), (callbacks.LDPAudit, "seed", math.inf),
        (callbacks.LDPAudit, "exact_audit", None), (callbacks.LDPAudit, "exact_audit", "yes"),
        (callbacks.LDPAudit, "exact_audit", math.nan), (callbacks.LDPAudit, "path", "slow"),
        (callbacks.LDPAudit, "collusion_lr", 0.0), (callbacks.LDPAudit, "batch_size", 0),
        (callbacks.LDPAudit, "num_classes", 1),
        (callbacks.LDPInferenceAudit, "radius", 0.0), (callbacks.LDPInferenceAudit, "center", "0"),
        (callbacks.LDPInferenceAudit, "every_n_rounds", 0),
        (callbacks.LDPInferenceAudit, "seed", -1), (callbacks.LDPInferenceAudit, "seed", True),
        (callbacks.LDPInferenceAudit, "weights", [1.5]), (callbacks.LDPInferenceAudit, "weights", [True]),
    ]
    for cls, arg, value in bad:
        with pytest.raises(ValueError, match=rf"\b{arg}\b.*{value!r}".replace("(", r"\(")):
            cls(**{arg: value})
    assert callbacks.LDPAudit(exact_audit=np.bool_(False)).exact_audit is False


# ------------------------------------------------------------ the cases issue 16 listed
def test_issue16_tensor_cosines_are_converted() -> None:
    want = estimators.estimate_epsilon_from_cosines(COS, 1e-5, dim=10**4).value
    grad = torch.tensor(COS, requires_grad=True)
    assert estimators.estimate_epsilon_from_cosines(grad, 1e-5, dim=10**4).value == want
    bf16 = torch.tensor(COS).to(torch.bfloat16)
    rounded = torch.tensor(COS).to(torch.bfloat16).double().numpy()
    assert estimators.estimate_epsilon_from_cosines(bf16, 1e-5, dim=10**4).value == (
        estimators.estimate_epsilon_from_cosines(rounded, 1e-5, dim=10**4).value
    )
    assert estimators.estimate_epsilon_lower_bound_from_cosines(
        grad, 1e-5, dim=10**4
    ).value == estimators.estimate_epsilon_lower_bound_from_cosines(COS, 1e-5, dim=10**4).value


def test_issue16_boolean_cosines_are_rejected() -> None:
    with pytest.raises(ValueError, match="observed must hold floating-point numbers"):
        estimators.estimate_epsilon_from_cosines(COS > 0, 1e-5, dim=10**4)  # was epsilon 35028


def test_issue16_tiny_delta_converges_or_names_the_input() -> None:
    eps = estimators.estimate_epsilon_from_cosines(COS, 1e-300, dim=10**4).value
    assert math.isfinite(eps) and eps > estimators.estimate_epsilon_from_cosines(COS, 1e-5, dim=10**4).value
    m, s = float(COS.mean()), float(COS.std(ddof=1))
    assert math.isfinite(estimators.epsilon_two_gaussians(m, s, 0.0, 0.01, 1e-300))
    assert estimators.gaussian_epsilon(1.0, 1e-300) == pytest.approx(37.4488479, rel=1e-8)
    with pytest.raises(ValueError, match="noise_multiplier"):
        estimators.gaussian_epsilon(1e-300, 1e-5)  # mu = 1e300: "Failed to converge" before


def test_issue16_cosine_null_sample_without_a_generator() -> None:
    x = estimators.cosine_null_sample(None, 100, 1000)  # a fresh default generator
    assert x.shape == (1000,) and np.all(np.abs(x) <= 1.0)
    assert np.array_equal(estimators.cosine_null_sample(3, 100, 5),
                          estimators.cosine_null_sample(np.random.default_rng(3), 100, 5))
    with pytest.raises(ValueError, match="rng"):
        estimators.cosine_null_sample("3", 100, 5)


def test_issue16_exact_epsilon_of_a_continuous_mechanism() -> None:
    with pytest.raises(ValueError, match="ldp_epsilon_test"):
        mechanisms.exact_epsilon(mechanisms.LDPSGD(1.0, 1.0))  # AttributeError before


def test_issue16_two_point_prediction_at_epsilon_zero() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        ldp_fl_inference.two_point_prediction(0.6, 0.0, 0.0, 1.0)  # NaN before
    # the closed form is eq. 2 itself
    e = math.exp(1.0)
    assert ldp_fl_inference.two_point_prediction(0.6, 1.0, 0.5, 2.0) == pytest.approx(
        0.5 + 2.0 * (e + 1) * 0.2 / (e - 1), rel=1e-14
    )


def test_ldp_epsilon_test_leaves_its_inputs_alone() -> None:
    g1 = np.linspace(0.5, 1.5, 64)
    g2 = -g1[::-1].copy()
    keep1, keep2 = g1.copy(), g2.copy()
    for path in ("fast", "batched"):
        attacks.ldp_epsilon_test(mechanisms.LDPSGD(1.0, 1.0), g1, g2, trials=20, path=path)
    assert np.array_equal(g1, keep1) and np.array_equal(g2, keep2)


def test_ldp_test_geometry_matches_float64_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ldp_test, "_BLOCK", 1000)  # several blocks and a ragged last one
    rng = np.random.default_rng(5)
    g1 = rng.standard_normal(3 * ldp_test._BLOCK + 17).astype(np.float32)
    g2 = (rng.standard_normal(g1.size) - 0.3 * g1).astype(np.float32)
    _, _, geom = ldp_test._check_pair(g1, g2)
    a1, a2 = g1.astype(np.float64), g2.astype(np.float64)
    n1, n2 = np.linalg.norm(a1), np.linalg.norm(a2)
    c = float(np.dot(a1 / n1, a2 / n2))
    assert geom.norm_g1 == pytest.approx(n1, rel=1e-12)
    assert geom.norm_g2 == pytest.approx(n2, rel=1e-12)
    assert geom.cosine == pytest.approx(c, rel=1e-11)
    assert geom.sine == pytest.approx(np.linalg.norm(a2 / n2 - c * a1 / n1), rel=1e-11)


def test_per_coordinate_randomizers_take_one_name_for_their_budget() -> None:
    # one name per quantity: epsilon_per_coordinate (one coordinate), epsilon0 (a whole row);
    # the old keyword epsilon= is gone (the package is unreleased)
    new = mechanisms.TwoPoint(epsilon_per_coordinate=2.0, dim=3)
    assert new.epsilon_per_coordinate == 2.0
    assert new.epsilon0 == 6.0  # the whole row's budget, by composition
    with pytest.raises(TypeError, match="epsilon"):
        mechanisms.TwoPoint(epsilon=2.0, dim=3)  # type: ignore[call-arg]
