"""Every public entry point of the label attacks, DP-FedAvg and the DP-SGD model checks its
arguments once, with the public validators (issue 23, item 5).

A smoke table: one or two spoilt values per argument, each expected to raise a ``ValueError``
whose message names the argument. What each kind of value does (NaN, inf, bool, str, None,
2.0 as a count...) is settled by the validators' own tests (tests/test_validation.py); this
only checks that each entry point calls them. No training runs.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn


def _public(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported when the case runs (our own modules: a failed import fails)."""
    return getattr(importlib.import_module(module), name)


def _make(module: str, name: str, *args: Any, **base: Any) -> Callable[..., Any]:
    """A factory ``(**kwargs) -> module.name(*args, **base, **kwargs)``."""
    def make(**kwargs: Any) -> Any:
        return _public(module, name)(*args, **{**base, **kwargs})
    return make


CALLBACKS = "audit_callbacks.callbacks"
FED = "audit_callbacks.federated"
ATT = "audit_callbacks.attacks"
LDP = "audit_callbacks.estimators.label_dp"

torch.manual_seed(0)
TX = torch.randn(6, 10, dtype=torch.float64)  # features of an attacked layer
UG = torch.randn(10, dtype=torch.float64)  # one unit's weight gradient
W1 = torch.randn(4, 10, dtype=torch.float64)  # a first layer's weight
RNG = np.random.default_rng(0)
LN, LD = 6, 8
LABEL = {"features": RNG.standard_normal((LN, LD)), "probs": RNG.uniform(0.2, 0.8, LN),
         "labels": np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0]), "grad_norms": 10.0 + RNG.uniform(0.0, 1.0, LN),
         "max_grad_norm": 1.0, "noise_multiplier": 1.0, "expected_batch_size": 6.0, "delta": 1e-5}
CLIENT = {"probs": np.full((LN, 3), 1 / 3), "labels": np.array([0, 1, 2, 0, 1, 2]),
          "gram_inv_diag": np.full(LN, 0.5), "update_scale": 0.1, "local_lr": 0.5,
          "noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-5}
RELU = {"weights": [torch.randn(5, 4), torch.randn(3, 5)], "inputs": [torch.randn(2, 4), torch.rand(2, 5)],
        "probs": torch.full((2, 3), 1 / 3), "labels": torch.tensor([0, 2])}

ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "LabelDPLowerBound": _make(CALLBACKS, "LabelDPLowerBound"),
    "LabelReconstructionAttack": _make(CALLBACKS, "LabelReconstructionAttack"),
    "FederatedLabelAttack": _make(CALLBACKS, "FederatedLabelAttack"),
    "DPFedAvg": _make(FED, "DPFedAvg", nn.Linear(4, 3)),
    "CohortSampler": _make(FED, "CohortSampler", population=10, cohort_size=3),
    "DPSGDClassifier": _make("models.dpsgd", "DPSGDClassifier", nn.Linear(4, 1)),
    "factorize_layer": _make(ATT, "factorize_layer", TX),
    "reconstruct_labels_second_last_layer": _make(
        ATT, "reconstruct_labels_second_last_layer", TX, UG, pre_activations=torch.randn(6)),
    "reconstruct_labels_malicious_input_layer": _make(ATT, "reconstruct_labels_malicious_input_layer", TX, UG),
    "craft_malicious_features": _make(ATT, "craft_malicious_features", W1, batch_size=3),
    "ReluMlpLabelNorms": _make("audit_callbacks.attacks.label_gradients", "ReluMlpLabelNorms", kappa=1.0,
                               **RELU),
    "relu_mlp_label_grad_norms": _make("audit_callbacks.attacks.label_gradients", "relu_mlp_label_grad_norms",
                                       kappa=1.0, **RELU),
    "label_dp_lower_bound": _make(LDP, "label_dp_lower_bound", **LABEL),
    "client_update_label_dp_lower_bound": _make(LDP, "client_update_label_dp_lower_bound", **CLIENT),
    "last_layer_gram_inverse_diag": _make(LDP, "last_layer_gram_inverse_diag", TX),
    "extrapolation_factor": _make(LDP, "extrapolation_factor", 10, 50),
    "argmin_attack_success_probability": _make(
        LDP, "argmin_attack_success_probability", np.array([[0.0, 1.0, 2.0]]), np.array([0]), sd=1.0),
}

COUNT = (2.5, True, "10", None)  # not counts
SEED = (-1, True, math.inf)  # not seeds
FLAG = (None, "yes", math.nan, 1)  # not decisions

BAD: list[tuple[str, str, tuple[Any, ...]]] = [
    # the label callbacks (label_base: every_n_steps, label_fn, observer)
    ("LabelDPLowerBound", "every_n_steps", (0, 1.5, True, "10")),
    ("LabelDPLowerBound", "max_pairs", (0, 2.5, True, "10")),
    ("LabelDPLowerBound", "delta", (0.0, 1.0, math.nan, "1e-5")),
    ("LabelDPLowerBound", "second_last", FLAG),
    ("LabelDPLowerBound", "label_fn", ("batch[1]",)),
    ("LabelDPLowerBound", "observer", ("shared",)),
    ("LabelReconstructionAttack", "every_n_steps", (0, 2.5, False)),
    ("LabelReconstructionAttack", "layer", ("last", nn.Conv1d(1, 1, 1))),
    ("FederatedLabelAttack", "seed", SEED),
    ("FederatedLabelAttack", "noise_multiplier", (-0.1, math.inf, math.nan, True, "1")),
    ("FederatedLabelAttack", "delta", (0.0, 1.0, -1e-5, True)),
    # DP-FedAvg and its sampler
    ("DPFedAvg", "clients_per_round", (0, *COUNT)),
    ("DPFedAvg", "local_epochs", (-1, *COUNT)),
    ("DPFedAvg", "local_batch_size", (0, *COUNT)),
    ("DPFedAvg", "local_lr", (-0.1, math.inf, True, None)),
    ("DPFedAvg", "server_lr", (0.0, -1.0, math.nan, None)),
    ("DPFedAvg", "server_momentum", (1.0, -0.1, math.nan, True)),
    ("DPFedAvg", "noise_multiplier", (-1.0, math.inf, True, None)),
    ("DPFedAvg", "clip_norm", (0.0, math.inf, True, "1")),
    ("DPFedAvg", "delta", (0.0, 1.0, None, True)),
    ("DPFedAvg", "seed", SEED),
    ("DPFedAvg", "sampling_seed", SEED),
    ("DPFedAvg", "reproducible_noise", FLAG),
    ("DPFedAvg", "sampling", ("round-robin", None, "Uniform")),
    ("DPFedAvg", "num_classes", (1, 2.5, True)),
    ("DPFedAvg", "loss_fn", ("cross_entropy",)),
    ("CohortSampler", "population", (-1, 10.0, True, None)),
    ("CohortSampler", "cohort_size", (0, 3.0, True, None)),
    ("CohortSampler", "seed", SEED),  # None: secret sampling (OS entropy)
    ("CohortSampler", "rule", ("round-robin", None)),
    # the DP-SGD model of the examples
    ("DPSGDClassifier", "lr", (0.0, math.nan, True)),
    ("DPSGDClassifier", "noise_multiplier", (-1.0, math.inf)),
    ("DPSGDClassifier", "max_grad_norm", (0.0, None)),
    ("DPSGDClassifier", "delta", (1.0, None)),
    ("DPSGDClassifier", "accountant", ("moments", None)),
    ("DPSGDClassifier", "dp", FLAG),
    ("DPSGDClassifier", "noise_seed", SEED),
    # label attacks
    ("factorize_layer", "bias", FLAG),
    ("reconstruct_labels_second_last_layer", "positive_rate_below_half", FLAG),
    ("reconstruct_labels_second_last_layer", "output_weight_sign", (0, 2, True, "+1", math.nan)),
    ("reconstruct_labels_malicious_input_layer", "positive_rate_below_half", FLAG),
    ("reconstruct_labels_malicious_input_layer", "unit_sign", (0, True, -2.0)),
    ("craft_malicious_features", "batch_size", (0, *COUNT)),
    ("craft_malicious_features", "generator", (0, np.random.default_rng(0))),
    ("ReluMlpLabelNorms", "kappa", (0.0, -1.0, math.nan, True)),
    ("ReluMlpLabelNorms", "dtype", (torch.int64, "float32")),
    ("relu_mlp_label_grad_norms", "rtol", (0.0, math.inf, None)),
    # label-DP estimators
    ("label_dp_lower_bound", "bias", FLAG),
    ("label_dp_lower_bound", "max_pairs", (0, 2.5, True)),
    ("label_dp_lower_bound", "p0_for_all", FLAG),
    ("client_update_label_dp_lower_bound", "max_pairs", (0, 2.5, True)),
    ("last_layer_gram_inverse_diag", "bias", FLAG),
    ("extrapolation_factor", "exact", FLAG),
    ("argmin_attack_success_probability", "sd", (0.0, -1e-300, math.inf, math.nan)),
]

CASES = [pytest.param(entry, arg, value, id=f"{entry}-{arg}-{value!r}")
         for entry, arg, values in BAD for value in values]


@pytest.mark.parametrize(("entry", "arg", "value"), CASES)
def test_a_bad_argument_raises_naming_it(entry: str, arg: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        ENTRY_POINTS[entry](**{arg: value})


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_the_defaults_still_work(entry: str) -> None:
    assert ENTRY_POINTS[entry]() is not None


def test_valid_values_keep_working_in_their_canonical_types() -> None:
    DPFedAvg = _public(FED, "DPFedAvg")  # noqa: N806
    m = DPFedAvg(nn.Linear(4, 3), clients_per_round=np.int64(4), clip_norm=2, local_epochs=0, local_lr=0,
                 server_momentum=0, seed=torch.tensor(3), reproducible_noise=np.bool_(True), num_classes=3,
                 sampling="poisson")
    assert (m.clients_per_round, m.clip_norm, m.local_epochs, m.local_lr, m.seed) == (4, 2.0, 0, 0.0, 3)
    assert type(m.clients_per_round) is int and type(m.seed) is int and m.reproducible_noise is True
    assert m.hparams["clip_norm"] == 2.0 and type(m.hparams["clients_per_round"]) is int  # hparams.yaml
    callbacks = importlib.import_module(CALLBACKS)
    bound = callbacks.LabelDPLowerBound(every_n_steps=np.int64(3), max_pairs=None, second_last=np.bool_(True))
    assert (bound.every_n_steps, bound.max_pairs, bound.second_last) == (3, None, True)
    attack = callbacks.FederatedLabelAttack(noise_multiplier=0, delta=np.float32(1e-5), seed=np.uint8(7))
    assert (attack.noise_multiplier, attack.seed) == (0.0, 7)
    sampler = _public(FED, "CohortSampler")(np.int32(10), 3, "shuffle", seed=np.int64(1))
    assert sampler.sample().shape == (3,)
    recon = _public(ATT, "reconstruct_labels_second_last_layer")
    out = recon(TX, UG, pre_activations=torch.randn(6), output_weight_sign=-1.0)
    assert out.sign_source == "given"


def test_a_vanishing_sd_gives_the_limits_of_the_argmin_attack() -> None:
    """sd -> 0: the attack is almost surely right (issue 23: sd=5e-324 raised 'cannot convert
    float NaN to integer'); 1 / t among t tied smallest means; never NaN."""
    prob = _public(LDP, "argmin_attack_success_probability")
    means = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.5]])
    labels = np.array([0, 1, 2, 0, 0])
    for sd in (5e-324, 1e-300, 1e-12):
        got = prob(means, labels, sd)
        np.testing.assert_allclose(got, [1.0, 0.0, 0.0, 0.5, 1.0], atol=1e-12)
    assert np.all(np.isfinite(prob(np.array([[0.0, 1e-300, 1.0]]), np.array([1]), 5e-324)))


def test_far_apart_means_stay_finite_and_cheap() -> None:
    """Standardised gaps of 1e5 .. 1e300 (small noise): log P is finite or -inf (no NaN), with
    a grid of a few dozen points (the mode's width used to shrink with the gap: 37 GiB)."""
    log_prob = _public("audit_callbacks.estimators.label_dp.attack", "log_prob_argmin")
    d = np.array([[-1e5, 3.0], [-1e8, 3.0], [-1e300, 0.0], [1e300, 1e300], [-math.inf, 0.0], [math.inf, 0.0]])
    got = log_prob(d)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got[:2], [-2.5e9, -2.5e15], rtol=1e-6)  # ~ -d^2 / 4
    assert got[2] == -math.inf and got[3] == 0.0 and got[4] == -math.inf
    assert got[5] == pytest.approx(math.log(0.5))
