"""Bad input to every public estimator, attack and mechanism (issue 16, items 6 and 7).

One table: each case calls a public function with one argument spoilt (NaN, inf, empty, wrong
shape, wrong dtype, a tensor that requires grad, delta / alpha at and beyond their limits) and
states the outcome: a ``ValueError`` whose message names that argument, or a finite answer (no
NaN anywhere, no inf except where documented). ``test_table_covers_the_public_api`` fails when a
public name of ``audit_callbacks.estimators``, ``.attacks`` or ``.mechanisms`` has no case
(the label-DP and score-auditor functions are out of scope: others are rewriting them).
"""

from __future__ import annotations

import dataclasses
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
from audit_callbacks.mechanisms import (
    GRR,
    LDPSGD,
    BrokenStaircase,
    GaussianRandomizer,
    Staircase,
    TwoPoint,
)

ERR, FIN, INF = "error", "finite", "inf"  # INF: math.inf, where documented
EXCLUDED = {
    # result types (their fields are checked on construction)
    "LabelDPBounds", "LayerFactorization", "SignAmbiguousLabels", "ClientLabelDPBound",
    # a result type (its fields are checked finite on construction, tests/test_score_auditor.py)
    "ScoreAuditResult",
    # abstract bases (their methods are covered through the concrete mechanisms)
    "LocalRandomizer", "PerCoordinateRandomizer", "GridRandomizer",
}

RNG = np.random.default_rng(0)
COS = 0.01 + 0.01 * RNG.standard_normal(40)  # observed canary cosines
NULL = 0.01 * RNG.standard_normal(40)  # unobserved canary cosines


def _arrays(base: np.ndarray) -> dict[str, Any]:
    """Spoilt versions of a float vector (and the harmless tensor forms of it)."""
    nan = base.copy()
    nan[1] = np.nan
    inf = base.copy()
    inf[0] = np.inf
    return {
        "nan": nan, "inf": inf, "empty": base[:0], "2d": np.stack([base, base]),
        "bool": base > 0, "int": np.round(base * 100).astype(np.int64),
        "complex": base.astype(complex), "object": base.astype(object), "str": "0.1",
        "bf16": torch.tensor(base).to(torch.bfloat16),
        "f16": base.astype(np.float16), "grad": torch.tensor(base, requires_grad=True),
    }


STAT_ARRAY = {  # a float statistic: only float input, any float dtype/tensor
    "nan": ERR, "inf": ERR, "empty": ERR, "2d": ERR, "bool": ERR, "int": ERR, "complex": ERR,
    "object": ERR, "str": ERR, "bf16": FIN, "f16": FIN, "grad": FIN,
}


def _scalars(good: float) -> dict[str, Any]:
    return {
        "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "bool": True, "complex": 1j,
        "str": "0.5", "none": None, "array": np.array([good, good]),
        "grad": torch.tensor(good, dtype=torch.float64, requires_grad=True),
        "bf16": torch.tensor(good).to(torch.bfloat16), "np": np.float32(good),
    }


SCALAR = {  # any real scalar argument: these always behave the same
    "nan": ERR, "inf": ERR, "-inf": ERR, "bool": ERR, "complex": ERR, "str": ERR, "none": ERR,
    "array": ERR, "grad": FIN, "bf16": FIN, "np": FIN,
}
DELTA = {**SCALAR, "0": ERR, "1": ERR, "neg": ERR, "2": ERR, "1e-300": FIN}
LIMITS = {"0": 0.0, "1": 1.0, "neg": -0.5, "2": 2.0, "1e-300": 1e-300}

CASES: list[tuple[str, str, Callable[[], Any], str, str]] = []  # (id, public name, thunk, ...)


def add(name: str, fn: Callable[..., Any], kwargs: dict[str, Any], arg: str,
        table: dict[str, str], values: dict[str, Any] | None = None) -> None:
    """One case per kind in ``table``: fn(**kwargs) with kwargs[arg] spoilt that way."""
    if values is None:
        good = kwargs.get(arg, 1.0)
        values = {**_scalars(float(good)), **LIMITS} if np.ndim(good) == 0 else _arrays(good)
    for kind, expect in table.items():
        kw = {**kwargs, arg: values[kind]}
        CASES.append((f"{name}-{arg}-{kind}", name, lambda fn=fn, kw=kw: fn(**kw), arg, expect))


def add_one(name: str, thunk: Callable[[], Any], arg: str, expect: str, kind: str) -> None:
    CASES.append((f"{name}-{arg}-{kind}", name, thunk, arg, expect))


def pos(**over: str) -> dict[str, str]:
    """A scalar that must be > 0 (0 and negatives rejected, 1 and 2 fine)."""
    return {**SCALAR, "0": ERR, "neg": ERR, "1": FIN, "2": FIN, "1e-300": FIN, **over}


ALPHA = {**DELTA, "1e-300": FIN}
PROB01 = {**SCALAR, "0": FIN, "1": FIN, "neg": ERR, "2": ERR, "1e-300": FIN}  # in [0, 1]
COUNT = {"nan": ERR, "inf": ERR, "bool": ERR, "complex": ERR, "str": ERR, "none": ERR,
         "array": ERR, "neg": ERR, "half": ERR}
COUNT_VALUES = {"nan": math.nan, "inf": math.inf, "bool": True, "complex": 1j, "str": "3",
                "none": None, "array": np.array([3, 3]), "neg": -3, "half": 2.5}

# ------------------------------------------------------------------------------ estimators
es = estimators
for nm in ("clopper_pearson_interval", "clopper_pearson_upper", "clopper_pearson_lower",
           "jeffreys_interval", "jeffreys_upper", "jeffreys_lower"):
    f = getattr(es, nm)
    add(nm, f, {"k": 3, "n": 10, "alpha": 0.05}, "alpha", ALPHA)
    add(nm, f, {"k": 3, "n": 10, "alpha": 0.05}, "n", COUNT, COUNT_VALUES)
    add(nm, f, {"k": 3, "n": 10, "alpha": 0.05}, "k",
        {**COUNT, "big": ERR, "bf16": ERR, "grad": FIN,
         "array": ERR if nm.endswith("interval") else FIN},
        {**COUNT_VALUES, "big": 11, "bf16": torch.tensor(3.5).to(torch.bfloat16),
         "grad": torch.tensor(3.0, requires_grad=True)})
for nm in ("cosine_null_cdf", "cosine_null_sf", "cosine_null_logsf", "cosine_null_logcdf"):
    f = getattr(es, nm)
    add(nm, f, {"t": COS, "dim": 100}, "t",  # thresholds: any shape, integers too
        {**STAT_ARRAY, "int": FIN, "empty": FIN, "2d": FIN},
        {**_arrays(COS), "int": np.array([0, 0, 0])})
    add(nm, f, {"t": 0.1, "dim": 100}, "dim", {**COUNT, "one": ERR},
        {**COUNT_VALUES, "one": 1})
add("cosine_null_sample", es.cosine_null_sample, {"rng": 0, "dim": 10, "size": 5}, "rng",
    {"str": ERR, "none": FIN, "float": ERR, "gen": FIN},
    {"str": "seed", "none": None, "float": 0.5, "gen": np.random.default_rng(1)})
add("cosine_null_sample", es.cosine_null_sample, {"rng": 0, "dim": 10, "size": 5}, "size",
    {"neg": ERR, "str": ERR, "nan": ERR, "tuple": FIN},
    {"neg": -1, "str": "5", "nan": math.nan, "tuple": (2, 3)})
add("cosine_null_sample", es.cosine_null_sample, {"rng": 0, "dim": 10, "size": 5}, "dim",
    COUNT, COUNT_VALUES)

for nm, min_k in (("epsilon_from_cosines", 2), ("estimate_epsilon_from_cosines", 2),
                  ("epsilon_lower_bound_from_cosines", 1),
                  ("estimate_epsilon_lower_bound_from_cosines", 1)):
    f = getattr(es, nm)
    for threat in ({"dim": 10**4}, {"unobserved": NULL}):
        base = {"observed": COS, "delta": 1e-5, **threat}
        if "lower_bound" in nm:
            base["alpha"] = 0.05
        add(nm, f, base, "observed", STAT_ARRAY)
        add(nm, f, base, "delta", DELTA)
        if "unobserved" in threat:
            add(nm, f, base, "unobserved", STAT_ARRAY)
        else:
            add(nm, f, base, "dim", COUNT, COUNT_VALUES)
        if "lower_bound" in nm:
            add(nm, f, base, "alpha", ALPHA)
    add(nm, f, {"observed": COS[:1], "delta": 1e-5, "dim": 100}, "observed",
        {"one": ERR if min_k == 2 else FIN}, {"one": COS[:1]})
add("estimate_epsilon_from_cosines", es.estimate_epsilon_from_cosines,
    {"observed": COS, "delta": 1e-5, "dim": 100, "bootstrap": 20}, "confidence", ALPHA,
    {**_scalars(0.9), **LIMITS})
add("estimate_epsilon_from_cosines", es.estimate_epsilon_from_cosines,
    {"observed": COS, "delta": 1e-5, "dim": 100}, "bootstrap", COUNT, COUNT_VALUES)

add("epsilon_from_error_rates", es.epsilon_from_error_rates,
    {"fpr": 0.1, "fnr": 0.2, "delta": 0.0}, "fpr", {**PROB01, "0": INF})
add("epsilon_from_error_rates", es.epsilon_from_error_rates,
    {"fpr": 0.1, "fnr": 0.2, "delta": 0.0}, "fnr", {**PROB01, "0": INF})
add("epsilon_from_error_rates", es.epsilon_from_error_rates,
    {"fpr": 0.1, "fnr": 0.2, "delta": 0.1}, "delta", {**DELTA, "0": FIN})
RATES = np.array([0.1, 0.2, 0.3])
add("epsilon_from_error_rates_array", es.epsilon_from_error_rates_array,
    {"fpr": RATES, "fnr": RATES, "delta": 0.0}, "fpr",
    {**STAT_ARRAY, "2d": FIN, "int": FIN}, {**_arrays(RATES), "int": np.array([1, 1, 1])})
add("epsilon_from_error_rates_array", es.epsilon_from_error_rates_array,
    {"fpr": RATES, "fnr": RATES, "delta": 0.0}, "fnr", {"nan": ERR, "bool": ERR, "grad": FIN})

add("gaussian_delta", es.gaussian_delta, {"epsilon": 1.0, "mu": 1.0}, "epsilon",
    {**SCALAR, "0": FIN, "neg": ERR, "1": FIN, "1e-300": FIN})
add("gaussian_delta", es.gaussian_delta, {"epsilon": 1.0, "mu": 1.0}, "mu", pos(**{"0": FIN}))
add("gaussian_epsilon", es.gaussian_epsilon, {"noise_multiplier": 1.0, "delta": 1e-5},
    "noise_multiplier", pos(**{"1e-300": ERR}))  # mu = 1e300: delta(eps) not representable
add("gaussian_epsilon", es.gaussian_epsilon, {"noise_multiplier": 1.0, "delta": 1e-5},
    "delta", DELTA)
add("gaussian_epsilon", es.gaussian_epsilon, {"noise_multiplier": 1.0, "delta": 1e-5},
    "sensitivity", pos(**{"0": FIN}))
add("gaussian_epsilon", es.gaussian_epsilon, {"noise_multiplier": 1.0, "delta": 1e-5},
    "compositions", COUNT, COUNT_VALUES)
add("gaussian_epsilon_array", es.gaussian_epsilon_array, {"mu": RATES, "delta": 1e-5}, "mu",
    {**STAT_ARRAY, "int": FIN, "empty": FIN, "2d": FIN})
add("gaussian_epsilon_array", es.gaussian_epsilon_array, {"mu": RATES, "delta": 1e-5},
    "delta", DELTA)
add("gaussian_mu", es.gaussian_mu, {"noise_multiplier": 1.0}, "noise_multiplier", pos())
add("gaussian_mu", es.gaussian_mu, {"noise_multiplier": 1.0}, "compositions", COUNT,
    COUNT_VALUES)
G2 = {"mu_observed": 0.02, "sigma_observed": 0.01, "mu_null": 0.0, "sigma_null": 0.01}
add("epsilon_two_gaussians", es.epsilon_two_gaussians, {**G2, "delta": 1e-5}, "delta", DELTA)
add("epsilon_two_gaussians", es.epsilon_two_gaussians, {**G2, "delta": 1e-5},
    "sigma_observed", pos(**{"1e-300": ERR, "1": FIN}))
add("epsilon_two_gaussians", es.epsilon_two_gaussians, {**G2, "delta": 1e-5}, "mu_null",
    {**SCALAR, "neg": FIN})
add("two_gaussians_delta", es.two_gaussians_delta, {**G2, "epsilon": 1.0}, "epsilon",
    {**SCALAR, "0": FIN, "neg": ERR})
add("two_gaussians_delta", es.two_gaussians_delta, {**G2, "epsilon": 1.0}, "sigma_null",
    pos(**{"1e-300": ERR}))
add("Estimate", es.Estimate, {"value": 1.0}, "value", {**SCALAR, "neg": FIN})

add("min_clients_for_shuffling", es.min_clients_for_shuffling,
    {"epsilon0": 1.0, "delta": 1e-6}, "epsilon0", pos(**{"1e-300": FIN}))
add("min_clients_for_shuffling", es.min_clients_for_shuffling,
    {"epsilon0": 1.0, "delta": 1e-6}, "delta", DELTA)
add("shuffle_amplification_bound", es.shuffle_amplification_bound,
    {"epsilon0": 1.0, "n": 1000, "delta": 1e-6}, "delta", {**DELTA, "1e-300": ERR})  # n too small
add("shuffle_amplification_bound", es.shuffle_amplification_bound,
    {"epsilon0": 1.0, "n": 1000, "delta": 1e-6}, "n", COUNT, COUNT_VALUES)
add("shuffle_dummy_exact_epsilon", es.shuffle_dummy_exact_epsilon,
    {"epsilon0": 1.0, "n": 50, "delta": 1e-6}, "delta", DELTA)
add("shuffle_dummy_exact_epsilon", es.shuffle_dummy_exact_epsilon,
    {"epsilon0": 1.0, "n": 50, "delta": 1e-6}, "epsilon0", pos(**{"1e-300": FIN}))
add("shuffle_test", es.shuffle_test, {"epsilon0": 1.0, "n": 50, "trials": 100}, "alpha",
    ALPHA, {**_scalars(0.05), **LIMITS})
add("shuffle_test", es.shuffle_test, {"epsilon0": 1.0, "n": 50, "trials": 100}, "trials",
    COUNT, COUNT_VALUES)
add("shuffle_test", es.shuffle_test, {"epsilon0": 1.0, "n": 50, "trials": 100}, "seed",
    {"str": ERR, "neg": ERR}, {"str": "x", "neg": -1})

# the canary score auditor: any scores, every method's alpha and delta
def _audit(in_scores=COS, out_scores=NULL, method="epsilon_estimate", **kw):
    return getattr(es.CanaryScoreAuditor(in_scores, out_scores), method)(**kw)


for side in ("in_scores", "out_scores"):
    add("CanaryScoreAuditor", _audit, {"in_scores": COS, "out_scores": NULL, "delta": 1e-5}, side,
        {**STAT_ARRAY, "int": FIN})  # any scores: integer scores (counts) are scores too
add("CanaryScoreAuditor", _audit, {"delta": 1e-5}, "delta", DELTA)
for method in ("epsilon_lower_bound", "epsilon_one_run"):  # delta = 0 allowed
    add("CanaryScoreAuditor", _audit, {"method": method, "alpha": 0.05, "delta": 1e-5}, "delta",
        {**DELTA, "0": FIN})
for method in ("epsilon_lower_bound", "epsilon_gdp_lower_bound", "epsilon_one_run_fdp"):
    add("CanaryScoreAuditor", _audit, {"method": method, "alpha": 0.05, "delta": 1e-5}, "alpha", ALPHA)


# --------------------------------------------------------------------- mechanisms
ROWS = torch.tensor([[0.3, -0.2, 0.5], [0.1, 0.0, -0.4]], dtype=torch.float64)


def _rows_values() -> dict[str, Any]:
    nan = ROWS.clone()
    nan[0, 0] = math.nan
    return {
        "nan": nan, "inf": ROWS * math.inf, "empty": ROWS[:0], "1d": ROWS[0],
        "bool": ROWS > 0, "int": ROWS.to(torch.int64), "complex": ROWS.to(torch.complex64),
        "numpy": ROWS.numpy(), "bf16": ROWS.to(torch.bfloat16), "f16": ROWS.to(torch.float16),
        "grad": ROWS.clone().requires_grad_(True),
    }


ROWS_TABLE = {"nan": ERR, "inf": ERR, "empty": ERR, "1d": ERR, "bool": ERR, "int": ERR,
              "complex": ERR, "numpy": ERR, "bf16": FIN, "f16": FIN, "grad": FIN}
MECHS: dict[str, tuple[type, dict[str, Any], str]] = {
    "LDPSGD": (LDPSGD, {"epsilon0": 1.0, "clip_norm": 1.0}, "epsilon0"),
    "TwoPoint": (TwoPoint, {"epsilon_per_coordinate": 1.0}, "epsilon_per_coordinate"),
    "GRR": (GRR, {"epsilon_per_coordinate": 1.0}, "epsilon_per_coordinate"),
    "Staircase": (Staircase, {"epsilon_per_coordinate": 1.0}, "epsilon_per_coordinate"),
    "BrokenStaircase": (BrokenStaircase, {"epsilon_per_coordinate": 1.0, "defect": "per_group"},
                        "epsilon_per_coordinate"),
    "GaussianRandomizer": (GaussianRandomizer,
                           {"noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-5}, "delta"),
}
for nm, (cls, kw, eps_arg) in MECHS.items():
    add(nm, cls, kw, eps_arg, DELTA if eps_arg == "delta" else pos(**{"1e-300": FIN}))
    mech = cls(**kw)
    add(nm, lambda x, m=mech: m.randomize(x, generator=torch.Generator().manual_seed(0)), {
        "x": ROWS}, "x", ROWS_TABLE, _rows_values())
    add(nm, mech.project, {"x": ROWS}, "x", ROWS_TABLE, _rows_values())
    add(nm, mech.debias, {"y": ROWS}, "y",
        {k: v for k, v in ROWS_TABLE.items() if v == ERR}, _rows_values())
    add(nm, mech.epsilon_for_dim, {"d": 3}, "d", COUNT, COUNT_VALUES)
add("LDPSGD", LDPSGD, {"epsilon0": 1.0, "clip_norm": 1.0}, "clip_norm", pos())
add("TwoPoint", TwoPoint, {"epsilon_per_coordinate": 1.0}, "radius", pos(), {**_scalars(1.0), **LIMITS})
add("TwoPoint", TwoPoint, {"epsilon_per_coordinate": 1.0}, "center", {**SCALAR, "neg": FIN},
    {**_scalars(0.0), **LIMITS})
add("GRR", GRR, {"epsilon_per_coordinate": 1.0}, "precision", COUNT, COUNT_VALUES)
add("GaussianRandomizer", GaussianRandomizer,
    {"noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-5}, "noise_multiplier",
    pos(**{"1e-300": ERR}))
for nm, f in (("exact_epsilon", mechanisms.exact_epsilon),
              ("exact_epsilon_witness", mechanisms.exact_epsilon_witness)):
    add(nm, f, {"mechanism": TwoPoint(1.0), "inputs": np.array([-1.0, 1.0])}, "inputs",
        {**STAT_ARRAY, "int": FIN, "2d": FIN})
    add(nm, f, {"mechanism": TwoPoint(1.0)}, "mechanism",
        {"ldpsgd": ERR, "gaussian": ERR, "none": ERR, "str": ERR},
        {"ldpsgd": LDPSGD(1.0, 1.0), "gaussian": GaussianRandomizer(1.0, 1.0, 1e-5),
         "none": None, "str": "two_point"})
add("ExactAudit", mechanisms.ExactAudit, {"epsilon": 1.0, "x_high": 1.0, "x_low": 0.0,
                                          "y": 1.0}, "epsilon", {"np": FIN}, {"np": 1.0})
add("sphere_sign_constant", mechanisms.sphere_sign_constant, {"d": 3}, "d", COUNT,
    COUNT_VALUES)
for nm in ("staircase_group_sizes", "reference_group_sizes"):
    f = getattr(mechanisms, nm)
    add(nm, f, {"domain_size": 21, "groups": 4, "delta_d": 1.0}, "delta_d",
        {**SCALAR, "neg": ERR, "0": FIN})
    add(nm, f, {"domain_size": 21, "groups": 4, "delta_d": 1.0}, "groups", COUNT, COUNT_VALUES)
add("staircase_max_delta", mechanisms.staircase_max_delta, {"domain_size": 21, "groups": 4},
    "domain_size", COUNT, COUNT_VALUES)
add("staircase_alphas", mechanisms.staircase_alphas, {"epsilon": 1.0, "sizes": (5, 5, 6)},
    "epsilon", pos(**{"1e-300": FIN}))
add("staircase_alphas", mechanisms.staircase_alphas, {"epsilon": 1.0, "sizes": (5, 5, 6)},
    "sizes", {"empty": ERR, "zero": ERR, "float": ERR, "one": ERR},
    {"empty": (), "zero": (5, 0, 6), "float": (5.5, 5, 6), "one": (5,)})

# label-DP bounds (Yuan et al. 2022) and the multi-class argmin attack
LN, LD = 6, 8
LX = RNG.standard_normal((LN, LD))
LP = RNG.uniform(0.2, 0.8, LN)
LY = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
LG = 10.0 + RNG.uniform(0.0, 1.0, LN)  # whole-gradient norms above the layer part
LABEL = {"features": LX, "probs": LP, "labels": LY, "grad_norms": LG, "max_grad_norm": 1.0,
         "noise_multiplier": 1.0, "expected_batch_size": 6.0, "delta": 1e-5}
for arg in ("features", "probs"):
    add("label_dp_lower_bound", es.label_dp_lower_bound, LABEL, arg,
        {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "complex": ERR, "object": ERR,
         "str": ERR, "bf16": FIN, "grad": FIN})
add("label_dp_lower_bound", es.label_dp_lower_bound, LABEL, "delta", {**DELTA, "1e-300": FIN})
add("label_dp_lower_bound", es.label_dp_lower_bound, LABEL, "noise_multiplier",
    pos(**{"1e-300": ERR}))  # mu = 2 / 1e-300: no representable epsilon, named
add("label_dp_lower_bound", es.label_dp_lower_bound, LABEL, "max_grad_norm",
    {**SCALAR, "0": ERR, "neg": ERR})
AM = {"means": RNG.standard_normal((LN, 3)), "labels": np.array([0, 1, 2, 0, 1, 2]),
      "sd": np.ones(LN)}
add("argmin_attack_success_probability", es.argmin_attack_success_probability, AM, "means",
    {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "complex": ERR, "str": ERR, "bf16": FIN,
     "grad": FIN})
add("argmin_attack_success_probability", es.argmin_attack_success_probability, AM, "sd",
    {"nan": ERR, "inf": ERR, "bool": ERR, "complex": ERR, "str": ERR, "grad": FIN})
CL = {"probs": np.full((LN, 3), 1 / 3), "labels": np.array([0, 1, 2, 0, 1, 2]), "gram_inv_diag": np.full(LN, 0.5),
      "update_scale": 0.1, "local_lr": 0.5, "noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-5}
for arg in ("probs", "gram_inv_diag"):
    add("client_update_label_dp_lower_bound", es.client_update_label_dp_lower_bound, CL, arg,
        {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "complex": ERR, "object": ERR, "str": ERR,
         "grad": FIN})
for arg in ("update_scale", "noise_multiplier", "clip_norm"):
    add("client_update_label_dp_lower_bound", es.client_update_label_dp_lower_bound, CL, arg,
        pos(**{"update_scale": {"1": ERR, "2": ERR},  # <= local_lr
               "noise_multiplier": {"1e-300": ERR}, "clip_norm": {"1e-300": ERR}}.get(arg, {})))  # mu = 2 / 1e-300: not representable
add("client_update_label_dp_lower_bound", es.client_update_label_dp_lower_bound, CL, "delta", DELTA)
for nm in ("extrapolate_lower_bound", "extrapolation_factor"):
    kw = {"num_batches": 10, "batch_size": 5, **({"lb_one_batch": 1.0} if nm.startswith("extrapolate") else {})}
    add(nm, getattr(es, nm), kw, "num_batches", COUNT, COUNT_VALUES)
    add(nm, getattr(es, nm), kw, "batch_size", COUNT, COUNT_VALUES)
add("extrapolate_lower_bound", es.extrapolate_lower_bound,
    {"lb_one_batch": 1.0, "num_batches": 10, "batch_size": 5}, "lb_one_batch",
    {**SCALAR, "neg": ERR, "0": FIN})
FL = {"probs": LP, "labels": LY, "grad_norms": LG, "max_grad_norm": 1.0}
for arg in ("probs", "grad_norms"):
    add("flipped_clip_factors", es.flipped_clip_factors, FL, arg,
        {"nan": ERR, "inf": ERR, "bool": ERR, "complex": ERR, "str": ERR, "grad": FIN})
add("flipped_clip_factors", es.flipped_clip_factors, FL, "max_grad_norm", pos())
add("last_layer_gram_inverse_diag", es.last_layer_gram_inverse_diag, {"features": LX}, "features",
    {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "complex": ERR, "object": ERR, "str": ERR,
     "bf16": FIN, "grad": FIN})

# ------------------------------------------------------------------------- attacks
G1 = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
G2V = -G1.flip(0)
for nm, f, extra in (("ldp_epsilon_test", attacks.ldp_epsilon_test, {"trials": 200}),
                     ("ldp_test_statistics", attacks.ldp_test_statistics, {"trials": 50})):
    for mech in (LDPSGD(1.0, 1.0), TwoPoint(0.5)):
        base = {"mechanism": mech, "g1": G1.numpy(), "g2": G2V.numpy(), **extra}
        tag = type(mech).__name__
        add(f"{nm}", f, base, "g1", {**STAT_ARRAY, "int": FIN, "2d": ERR},
            {**_arrays(G1.numpy()), "2d": np.ones((2, 4))})
        if tag == "LDPSGD":
            add(nm, f, base, "g2", {"nan": ERR, "bool": ERR, "bf16": FIN, "grad": FIN},
                _arrays(G2V.numpy()))
            add(nm, f, base, "trials", COUNT, COUNT_VALUES)
            add(nm, f, base, "path", {"bad": ERR}, {"bad": "slow"})
            add(nm, f, base, "batch_size", {"zero": ERR, "float": ERR},
                {"zero": 0, "float": 1.5})
            add(nm, f, base, "seed", {"str": ERR, "neg": ERR, "float": ERR},
                {"str": "x", "neg": -1, "float": 0.5})
            add(nm, f, base, "mechanism", {"none": ERR, "str": ERR}, {"none": None, "str": "x"})
            if nm == "ldp_epsilon_test":
                add(nm, f, base, "alpha", ALPHA, {**_scalars(0.05), **LIMITS})
for nm in ("ldp_sgd_error_rates", "ldp_sgd_test_epsilon"):
    f = getattr(attacks, nm)
    base = {"epsilon0": 1.0, "clip_norm": 1.0, "g1": G1, "g2": G2V}
    add(nm, f, base, "epsilon0", pos())
    add(nm, f, base, "clip_norm", pos())
    add(nm, f, base, "g1", {**STAT_ARRAY, "int": FIN, "2d": ERR},
        {**_arrays(G1.numpy()), "2d": np.ones((2, 4))})
add("measurable_ceiling", attacks.measurable_ceiling, {"trials": 1000}, "trials", COUNT,
    COUNT_VALUES)
add("measurable_ceiling", attacks.measurable_ceiling, {"trials": 1000, "alpha": 0.05}, "alpha",
    ALPHA, {**_scalars(0.05), **LIMITS})
add("paper_measurable_ceiling", attacks.paper_measurable_ceiling, {"trials": 1000}, "trials",
    COUNT, COUNT_VALUES)
add("paper_measurable_ceiling", attacks.paper_measurable_ceiling,
    {"trials": 1000, "alpha": 0.05}, "alpha", ALPHA, {**_scalars(0.05), **LIMITS})
add_one("supports_fast_path", lambda: float(attacks.supports_fast_path(None)), "mechanism",
        FIN, "none")
add_one("PairGeometry", lambda: attacks.PairGeometry(3, 1.0, 1.0, 0.0, 1.0, False).angle,
        "dim", FIN, "ok")
add_one("LDPTestResult", lambda: attacks.ldp_epsilon_test(
    LDPSGD(1.0, 1.0), G1, G2V, trials=10).to_estimate().value, "result", FIN, "ok")

torch.manual_seed(0)
MODEL = torch.nn.Linear(4, 3)
XS = torch.randn(6, 4)
YS = torch.tensor([0, 1, 2, 0, 1, 2])


def _data_values(xs: torch.Tensor = XS) -> dict[str, Any]:
    nan = xs.clone()
    nan[0, 0] = math.nan
    return {"nan": nan, "inf": xs * math.inf, "empty": xs[:0], "bool": xs > 0,
            "int": xs.to(torch.int64), "numpy": xs.numpy(), "bf16": xs.to(torch.bfloat16),
            "grad": xs.clone().requires_grad_(True), "rows": xs[:5]}


X_TABLE = {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "int": ERR, "numpy": ERR,
           "bf16": FIN, "grad": FIN, "rows": ERR}
Y_VALUES = {"float": YS.float(), "bool": YS > 0, "neg": -YS - 1, "big": YS + 7, "rows": YS[:5],
            "2d": YS[:, None], "numpy": YS.numpy()}
Y_TABLE = {"float": ERR, "bool": ERR, "neg": ERR, "big": ERR, "rows": ERR, "2d": ERR,
           "numpy": ERR}
PAIRS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "benign_pair": (adversaries.benign_pair, {}),
    "label_flip_pair": (adversaries.label_flip_pair, {"num_classes": 3}),
    "gradient_flip_pair": (adversaries.gradient_flip_pair, {}),
    "collusion_pair": (adversaries.collusion_pair, {"target_label": 0, "steps": 2}),
}
for nm, (f, extra) in PAIRS.items():
    base = {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS, "y": YS, **extra}
    add(nm, f, base, "x", X_TABLE, _data_values())
    add(nm, f, base, "y", Y_TABLE, Y_VALUES)
    add(nm, f, base, "rng", {"str": ERR, "float": ERR, "gen": FIN},
        {"str": "seed", "float": 0.5, "gen": np.random.default_rng(1)})
    add("craft_pair", lambda nm=nm, **kw: attacks.craft_pair(nm[: -len("_pair")], **kw), base,
        "x", {"nan": ERR}, _data_values())
add("label_flip_pair", adversaries.label_flip_pair,
    {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS, "y": YS, "num_classes": 3},
    "num_classes", {**COUNT, "one": ERR, "small": ERR},
    {**COUNT_VALUES, "one": 1, "small": 2})
add("collusion_pair", adversaries.collusion_pair,
    {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS, "y": YS, "target_label": 0},
    "lr", pos(**{"1": FIN, "2": FIN}), {**_scalars(0.1), **LIMITS})
add("collusion_pair", adversaries.collusion_pair,
    {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS, "y": YS, "target_label": 0},
    "steps", COUNT, COUNT_VALUES)
add("flat_gradient", adversaries.flat_gradient,
    {"model": MODEL, "loss_fn": F.cross_entropy, "x": XS[:1], "y": YS[:1]}, "x",
    {"nan": ERR, "bool": ERR, "int": ERR, "bf16": FIN, "grad": FIN}, _data_values(XS[:1]))
add("dummy_pair", adversaries.dummy_pair, {"dim": 5, "clip_norm": 1.0}, "dim", COUNT,
    COUNT_VALUES)
add("dummy_pair", adversaries.dummy_pair, {"dim": 5, "clip_norm": 1.0}, "clip_norm",
    pos(**{"1e-300": ERR}))  # 1e-300 / sqrt(5) underflows float32: g1 would be 0
add("dummy_pair", adversaries.dummy_pair, {"dim": 5, "clip_norm": 1.0}, "dtype",
    {"int": ERR, "bool": ERR, "str": ERR}, {"int": torch.int64, "bool": torch.bool, "str": "x"})
add("craft_pair", attacks.craft_pair, {"name": "dummy", "dim": 5, "clip_norm": 1.0}, "name",
    {"bad": ERR}, {"bad": "nope"})
add_one("CraftedPair", lambda: attacks.dummy_pair(4, 1.0).as_tuple(), "pair", FIN, "ok")
add_one("ADVERSARIES", lambda: attacks.ADVERSARIES["dummy"](4, 1.0).cosine, "dummy", FIN, "ok")

add("two_point_prediction", ldp_fl_inference.two_point_prediction,
    {"p": RATES, "epsilon": 1.0, "center": 0.0, "radius": 1.0}, "epsilon", pos())
add("two_point_prediction", ldp_fl_inference.two_point_prediction,
    {"p": RATES, "epsilon": 1.0, "center": 0.0, "radius": 1.0}, "p",
    {**STAT_ARRAY, "int": FIN, "2d": FIN, "empty": FIN, "big": ERR},
    {**_arrays(RATES), "big": RATES + 1.0, "int": np.array([0, 1, 1])})
add("two_point_prediction", ldp_fl_inference.two_point_prediction,
    {"p": RATES, "epsilon": 1.0, "center": 0.0, "radius": 1.0}, "radius", pos(),
    {**_scalars(1.0), **LIMITS})
add("LDPFLInferenceAttack", attacks.LDPFLInferenceAttack, {"center": 0.0, "radius": 1.0},
    "radius", pos(), {**_scalars(1.0), **LIMITS})
add("LDPFLInferenceAttack", attacks.LDPFLInferenceAttack, {"center": 0.0, "radius": 1.0},
    "seed", {"str": ERR}, {"str": "x"})
add("LDPFLInferenceAttack", lambda released: attacks.LDPFLInferenceAttack().observe(released),
    {"released": RATES}, "released", {**STAT_ARRAY, "int": FIN, "2d": FIN})


def _predict(target: Any) -> Any:
    att = attacks.LDPFLInferenceAttack()
    att.observe(RATES)
    att.observe(RATES[::-1].copy())
    return att.predict(target)


add("InferencePrediction", _predict, {"target": np.zeros(1)}, "target",
    {"nan": ERR, "inf": ERR, "bool": ERR, "2d": ERR, "grad": FIN, "bf16": FIN, "long": ERR},
    {**_arrays(np.zeros(2)), "2d": np.zeros((2, 1)), "long": np.zeros(3),
     "grad": torch.zeros(1, requires_grad=True), "bf16": torch.zeros(1, dtype=torch.bfloat16)})


# label reconstruction (torch)
TX, TW, TB = torch.randn(LN, 10), torch.randn(3, 10), torch.randn(3)


def _spoil(t: torch.Tensor) -> dict[str, Any]:
    nan = t.clone()
    nan.view(-1)[0] = float("nan")
    inf = t.clone()
    inf.view(-1)[0] = float("inf")
    return {"nan": nan, "inf": inf, "empty": t[:0], "bool": t > 0,
            "bf16": t.to(torch.bfloat16), "grad": t.clone().requires_grad_(True)}


TORCH_ARRAY = {"nan": ERR, "inf": ERR, "empty": ERR, "bool": ERR, "bf16": FIN, "grad": FIN}
for nm in ("reconstruct_labels", "label_attack_statistic"):
    f = getattr(attacks, nm)
    add(nm, f, {"features": TX, "weight_grad": TW, "bias_grad": TB}, "features", TORCH_ARRAY,
        _spoil(TX))
    add(nm, f, {"features": TX, "weight_grad": TW, "bias_grad": TB}, "weight_grad",
        {k: v for k, v in TORCH_ARRAY.items() if k != "empty"}, _spoil(TW))
add("factorize_layer", attacks.factorize_layer, {"features": TX}, "features", TORCH_ARRAY, _spoil(TX))
add("craft_malicious_features", attacks.craft_malicious_features,
    {"first_layer_weight": torch.randn(4, 10), "batch_size": 3}, "first_layer_weight",
    {"nan": ERR, "inf": ERR, "bool": ERR}, _spoil(torch.randn(4, 10)))
add("craft_malicious_features", attacks.craft_malicious_features,
    {"first_layer_weight": torch.randn(4, 10), "batch_size": 3}, "batch_size", COUNT, COUNT_VALUES)
UG = torch.randn(10)
add("reconstruct_labels_malicious_input_layer", attacks.reconstruct_labels_malicious_input_layer,
    {"features": TX, "unit_weight_grad": UG}, "features", TORCH_ARRAY, _spoil(TX))
add("reconstruct_labels_malicious_input_layer", attacks.reconstruct_labels_malicious_input_layer,
    {"features": TX, "unit_weight_grad": UG}, "unit_weight_grad",
    {"nan": ERR, "inf": ERR, "bool": ERR, "bf16": FIN, "grad": FIN}, _spoil(UG))
add("reconstruct_labels_second_last_layer", attacks.reconstruct_labels_second_last_layer,
    {"inputs": TX, "unit_weight_grad": UG, "pre_activations": torch.randn(LN)}, "inputs",
    TORCH_ARRAY, _spoil(TX))


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


@pytest.mark.parametrize(("thunk", "arg", "expect"), [c[2:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input(thunk: Callable[[], Any], arg: str, expect: str) -> None:
    if expect == ERR:
        with pytest.raises(ValueError, match=rf"\b{arg}\b"):
            thunk()
    elif expect == INF:
        assert thunk() == math.inf
    else:
        _assert_finite(thunk())


def test_table_covers_the_public_api() -> None:
    public = set(estimators.__all__) | set(attacks.__all__) | set(mechanisms.__all__)
    covered = {c[1] for c in CASES}
    assert not (public - EXCLUDED) - covered, "public names without a bad-input case"
    assert len(CASES) > 600
    # every module the brief names exports only what its package re-exports
    for mod in (adversaries, ldp_test, ldp_fl_inference):
        assert set(mod.__all__) <= set(attacks.__all__)
    assert {"epsilon_from_counts", "confusion_counts"} <= set(error_rates.__all__)
    assert "shuffle_test" in shuffle.__all__


# ------------------------------------------------------------ the cases issue 16 listed
def test_issue16_tensor_cosines_are_converted() -> None:
    want = estimators.epsilon_from_cosines(COS, 1e-5, dim=10**4)
    grad = torch.tensor(COS, requires_grad=True)
    assert estimators.epsilon_from_cosines(grad, 1e-5, dim=10**4) == want
    bf16 = torch.tensor(COS).to(torch.bfloat16)
    rounded = torch.tensor(COS).to(torch.bfloat16).double().numpy()
    assert estimators.epsilon_from_cosines(bf16, 1e-5, dim=10**4) == (
        estimators.epsilon_from_cosines(rounded, 1e-5, dim=10**4)
    )
    assert estimators.estimate_epsilon_lower_bound_from_cosines(
        grad, 1e-5, dim=10**4
    ).value == estimators.epsilon_lower_bound_from_cosines(COS, 1e-5, dim=10**4)


def test_issue16_boolean_cosines_are_rejected() -> None:
    with pytest.raises(ValueError, match="observed must hold floating-point numbers"):
        estimators.epsilon_from_cosines(COS > 0, 1e-5, dim=10**4)  # was epsilon 35028


def test_issue16_tiny_delta_converges_or_names_the_input() -> None:
    eps = estimators.epsilon_from_cosines(COS, 1e-300, dim=10**4)
    assert math.isfinite(eps) and eps > estimators.epsilon_from_cosines(COS, 1e-5, dim=10**4)
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
        mechanisms.exact_epsilon(LDPSGD(1.0, 1.0))  # AttributeError before


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
        attacks.ldp_epsilon_test(LDPSGD(1.0, 1.0), g1, g2, trials=20, path=path)
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


def test_the_old_epsilon_keyword_of_per_coordinate_randomizers_is_deprecated():
    # one name per quantity: epsilon_per_coordinate (one coordinate), epsilon0 (a whole row)
    with pytest.warns(DeprecationWarning, match="epsilon_per_coordinate"):
        old = TwoPoint(epsilon=2.0, dim=3)
    new = TwoPoint(epsilon_per_coordinate=2.0, dim=3)
    assert old.epsilon_per_coordinate == new.epsilon_per_coordinate == 2.0
    assert new.epsilon0 == 6.0  # the whole row's budget, by composition
    with pytest.warns(DeprecationWarning):
        assert Staircase(epsilon=1.0).epsilon_per_coordinate == 1.0
    with pytest.raises(ValueError, match="epsilon"):
        TwoPoint(epsilon=1.0, epsilon_per_coordinate=1.0)
