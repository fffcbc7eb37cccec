"""Label-DP lower bounds for one DP-SGD step from the last-layer label attack (Yuan et al. 2022).

Setting (Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks with Strong DP-SGD Lower
Bounds for Label Privacy", §3 eq. (1), Alg. 2, App. A.3): a binary classifier with one
sigmoid logit Z_r = w . x_r + b on top of the last hidden activations x_r; log-loss. The whole
per-example gradient is g_r = (p_r - y_r) dZ_r/dtheta, and its restriction to the last layer
(weights and bias) is (p_r - y_r) x~_r with x~_r = [x_r, 1]. Opacus clips it with
c_r = min(1, C / ||g_r||) (norm over ALL parameters), sums, adds N(0, sigma^2 C^2 I)
and divides by the expected batch size N_e:

    G~ = G_0 + xi,   G_0 = (1/N_e) sum_r c_r (p_r - y_r) x~_r,   xi ~ N(0, s^2 I),  s = sigma C / N_e.

The attack statistic of row r is t_r = [(Cm^T Cm)^{-1} Cm^T G~]_r (Cm = [x~_1 ... x~_N]); the
attack outputs y = 1 iff t_r < 0 (Yuan et al. 2022 Alg. 1 and 3). t_r ~ N(m_r, s^2 v_r) with v_r =
[(Cm^T Cm)^{-1}]_rr (noise) and m_r = c_r (p_r - y_r) / N_e. Under D1[r] (label r flipped) only row
r's clipped gradient changes; for a binary logit the flipped whole gradient is
k_r g_r with k_r = (p_r - 1 + y_r) / (p_r - y_r) < 0, so its norm |k_r| ||g_r|| and clip factor
c'_r = min(1, C / (|k_r| ||g_r||)) follow from ``grad_norms`` in closed form (Alg. 2), and
m'_r = c'_r (p_r - 1 + y_r) / N_e.

Bounds returned by :func:`label_dp_lower_bound` (all in nats, at the given delta):

* The sign test (Yuan et al. 2022 Alg. 2): P_0[r] = Phi((-1)^y_r m_r / (s sqrt(v_r))),
  P_1[r] = Phi((-1)^y_r m'_r / (s sqrt(v_r))), both the probability that the attack outputs the
  D0 label y_r; LB[r] = log((P_0[r] - delta) / P_1[r]). Evaluated in the log domain with
  :func:`scipy.special.log_ndtr`, so P_1 underflowing to 0 gives a large finite LB, never inf
  or NaN. Where P_0[r] <= delta the event bound is vacuous and LB[r] = -inf (documented
  choice: "no information", distinct from a computed value of 0; LB[r] may also be a finite
  negative number, the attack then being worse than chance). The batch bound
  ``epsilon_lower_bound`` = max(0, max_r LB[r]) is always finite.
* Gaussian-pair, optimal test on the same statistic: t_r has the same variance under D0 and D1[r], so the
  best test on it is the equal-variance Gaussian pair with mu_r = |m_r - m'_r| / (s sqrt(v_r));
  eps = :func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon` with sensitivity mu_r
  (Balle & Wang 2018). >= LB[r] because the sign test is one test on that pair.
* Gaussian-pair, exact pair for the observed layer: the whole layer gradient is N(G_0, s^2 I) vs
  N(G_1[r], s^2 I), mu = ||G_1[r] - G_0|| / s = |c'_r a'_r - c_r a_r| ||x~_r|| / (sigma C).
  >= the optimal-test value because v_r ||x~_r||^2 >= 1 (projection on a subspace).
* Gaussian-pair, exact pair for all parameters: mu = ||g-bar_r(flipped) - g-bar_r||_all / (sigma C) =
  |c'_r k_r - c_r| ||g_r|| / (sigma C) = (min(|k_r| ||g_r||, C) + min(||g_r||, C)) / (sigma C).
  >= the layer value because the layer is a sub-vector of all parameters.
* Single-step replace-one bound (Gaussian mechanism): the Gaussian with mu = 2 / sigma (two clipped
  gradients of norm <= C differ by <= 2C). Every other bound is <= it.

Scope: ONE release of one step on a batch the adversary knows (no amplification). Opacus'
accountants amplify by sampling, so for short runs their epsilon can be BELOW these values:
compare with :attr:`LabelDPBounds.single_step_epsilon`, the upper bound of this observation.

Scaled losses. When the loss is multiplied by kappa > 0 before the backward pass (Lightning
divides it by ``accumulate_grad_batches``), Opacus clips kappa g_r: pass the norms of those
gradients and ``grad_scale=kappa``; then c_r = min(1, C / (kappa ||g_r||)) and every mean and
layer mu carries kappa (m_r = c_r kappa (p_r - y_r) / N_e). The all-parameter mu is unchanged
in form (its norms already carry kappa).

N_e cancels from every z-score and mu; it only scales the reported means and ``noise_std``.
Opacus clips by min(1, C / (||g|| + 1e-6)); here min(1, C/||g||) (relative difference ~1e-6).

Extrapolation to M batches (Yuan et al. 2022 App. A.3.1): if the per-example bounds are
i.i.d. exponential, E[max of n] = H_n / lambda (H_n the n-th harmonic number), so
E[LB(M)] / E[LB(1)] = H_{MN} / H_N ~ 1 + log M / log N (the paper's approximation
H_n ~ log n). Its factors 1.69 (15 batches) and 2.12 (80) imply N = 50; its measured growths
(2.76 at 80 batches, about 1.11 at 15) show the theorem is a rough guide only.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import solve_triangular
from scipy.special import digamma, log_ndtr

from ._validation import (
    as_float_array,
    check_count,
    check_delta,
    check_positive_finite,
    check_real_finite,
    to_numpy,
)
from .estimate import Estimate
from .gaussian import _epsilon_of_mu, gaussian_epsilon, gaussian_epsilon_array

__all__ = [
    "LabelDPBounds", "argmin_attack_success_probability", "extrapolate_lower_bound",
    "extrapolation_factor", "flipped_clip_factors", "label_dp_lower_bound",
    "last_layer_gram_inverse_diag",
]

_GRAD_NORM_RTOL = 1e-4  # slack for float32 gradient norms in the ||g_r|| >= |a_r| ||x~_r|| check


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only float64 view (every array passed here is computed inside this module, so
    no caller's array is frozen)."""
    a = np.asarray(a, dtype=float).view()
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class LabelDPBounds:
    """Result of :func:`label_dp_lower_bound` (arrays are read-only, float64, shape [N]).

    Attributes:
        p0: P_0[r], probability that the attack outputs y_r on D0 (Yuan et al. 2022 Alg. 2).
        p1: P_1[r], probability that it outputs y_r on D1[r] (label r flipped); may be 0.0 by
            underflow, ``log_p1`` stays finite.
        log_p0, log_p1: natural logs of p0, p1 (finite).
        lower_bound: LB[r] = log((P_0 - delta) / P_1) in nats; -inf where P_0 <= delta
            (vacuous), otherwise finite (possibly negative).
        epsilon_lower_bound: the batch bound max(0, max_r LB[r]), finite, >= 0.
        best_index: argmax_r LB[r] (the example behind ``epsilon_lower_bound``), -1 when no
            LB[r] is finite.
        optimal_test_mu, optimal_test_epsilon: Gaussian-pair Delta_r = |m_r - m'_r| / sd_r and its
            Gaussian-pair epsilon; ``optimal_test_epsilon_max`` their max.
        layer_pair_mu, layer_pair_epsilon, layer_pair_epsilon_max: Gaussian-pair exact pair for the
            observed layer, Delta = ||G_1[r] - G_0|| / s.
        all_params_pair_mu, all_params_pair_epsilon, all_params_pair_epsilon_max: Gaussian-pair exact
            pair for all parameters.
        single_step_epsilon: the Gaussian with Delta = 2 / sigma (replace-one label, one step).
        statistic_mean0, statistic_mean1: m_r, m'_r, means of the attack statistic t_r under
            D0 and D1[r] (gradient units / example).
        statistic_std: s sqrt(v_r), its standard deviation.
        gram_inv_diag: v_r = [(Cm^T Cm)^{-1}]_rr (1 / feature units^2).
        clip_factors: c_r = min(1, C / ||g_r||).
        flipped_grad_norms: |k_r| ||g_r||, the whole-gradient norm at the flipped label.
        flipped_clip_factors: c'_r = min(1, C / (|k_r| ||g_r||)).
        noise_std: s = sigma C / N_e, sd of the noise on the mean gradient.
        delta, noise_multiplier, max_grad_norm, expected_batch_size, n: the inputs (n = N).
        num_classes: K (2 for the binary sigmoid form).
        worst_labels: K classes only: [N] the replacement label y' != y_r that maximises
            LB[r]; ``p1``, ``lower_bound``, ``statistic_mean1`` ([N, K]), ``flipped_grad_norms``
            and ``flipped_clip_factors`` are at that label. None for the binary form.

    K classes (``probs`` [N, K]): ``statistic_mean0`` is [N, K]; ``optimal_test_mu`` and
    ``layer_pair_mu`` are maxima over y'; ``all_params_pair_mu`` is the triangle-inequality
    value (min(||g_r||, C) + min(max_y' ||g_r(y')||, C)) / (sigma C), an upper bound on the exact
    all-parameter pair (the flipped gradient's direction is not an input), still <= 2 / sigma.
    """

    p0: np.ndarray
    p1: np.ndarray
    log_p0: np.ndarray
    log_p1: np.ndarray
    lower_bound: np.ndarray
    epsilon_lower_bound: float
    best_index: int
    optimal_test_mu: np.ndarray
    optimal_test_epsilon_max: float
    layer_pair_mu: np.ndarray
    layer_pair_epsilon_max: float
    all_params_pair_mu: np.ndarray
    all_params_pair_epsilon_max: float
    single_step_epsilon: float
    statistic_mean0: np.ndarray
    statistic_mean1: np.ndarray
    statistic_std: np.ndarray
    gram_inv_diag: np.ndarray
    clip_factors: np.ndarray
    flipped_grad_norms: np.ndarray
    flipped_clip_factors: np.ndarray
    noise_std: float
    delta: float
    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: float
    n: int
    num_classes: int = 2
    worst_labels: np.ndarray | None = None

    # Per-example Gaussian-pair epsilons: one vectorised root finding each, on first access (a callback
    # that logs only the batch maxima, computed with one root each, never pays for them).
    @functools.cached_property
    def optimal_test_epsilon(self) -> np.ndarray:
        """[N] epsilon of the equal-variance pair with ``optimal_test_mu`` (Gaussian-pair)."""
        return _readonly(_pair_epsilons(self.optimal_test_mu, self.delta))

    @functools.cached_property
    def layer_pair_epsilon(self) -> np.ndarray:
        """[N] exact pair epsilon for the observed layer (Gaussian-pair)."""
        return _readonly(_pair_epsilons(self.layer_pair_mu, self.delta))

    @functools.cached_property
    def all_params_pair_epsilon(self) -> np.ndarray:
        """[N] exact pair epsilon for all parameters (Gaussian-pair)."""
        return _readonly(_pair_epsilons(self.all_params_pair_mu, self.delta))

    def to_estimate(self, threat_model: str = "single_step_last_layer") -> Estimate:
        """The batch sign-test bound as an :class:`Estimate` (value = ``epsilon_lower_bound``).

        ``extras`` carries the Gaussian-pair maxima and the single-step upper bound (all finite floats).
        """
        return Estimate(
            value=self.epsilon_lower_bound,
            n=self.n,
            method="label_dp_sign_test",
            threat_model=threat_model,
            delta=self.delta,
            extras={
                "optimal_test_epsilon": self.optimal_test_epsilon_max,
                "layer_pair_epsilon": self.layer_pair_epsilon_max,
                "all_params_pair_epsilon": self.all_params_pair_epsilon_max,
                "single_step_epsilon": self.single_step_epsilon,
                "best_index": self.best_index,
            },
        )


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _as_2d(x: ArrayLike, name: str) -> tuple[np.ndarray, float]:
    """Float64 copy of a finite 2-D array and the machine eps of its original dtype."""
    raw = to_numpy(x, name)
    if raw.dtype == bool or not np.issubdtype(raw.dtype, np.number):
        raise ValueError(f"{name} must be a real array, got dtype {raw.dtype}")
    if np.issubdtype(raw.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real-valued")
    eps = float(np.finfo(raw.dtype).eps) if np.issubdtype(raw.dtype, np.floating) else 2.0**-52
    arr = raw.astype(float, copy=False)  # only read
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [N, p], got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr, max(eps, 2.0**-52)


def _as_1d(x: ArrayLike, name: str, n: int) -> np.ndarray:
    arr = to_numpy(x, name)
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must be a real array, got dtype {arr.dtype}")
    arr = arr.astype(float).reshape(-1) if arr.ndim <= 1 else arr.astype(float)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape [{n}] (one per row of features), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _check_grad_norms(g: np.ndarray, layer_part: np.ndarray, formula: str) -> None:
    """Raise ``ValueError`` when a whole-gradient norm is below its last-layer part [N]."""
    if (bad := g < layer_part * (1.0 - _GRAD_NORM_RTOL)).any():
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"grad_norms[{r}] = {g[r]:.6g} is smaller than the norm of that example's last-layer "
            f"gradient {formula} = {layer_part[r]:.6g} (kappa = grad_scale): pass the norm of the "
            "whole per-example gradient over all parameters, before clipping")


def _design(features: np.ndarray, bias: bool) -> np.ndarray:
    """x~_r = [x_r, 1] (bias) or x_r; shape [N, d]."""
    if bias:
        return np.concatenate([features, np.ones((features.shape[0], 1))], axis=1)
    return features


def _gram_inv_diag(xt: np.ndarray, eps: float) -> np.ndarray:
    """diag((Cm^T Cm)^{-1}) [N], with Cm = xt^T.

    Via the R of the thin QR Cm = Q R (R upper triangular N x N, Q never formed):
    (Cm^T Cm)^{-1} = R^{-1} R^{-T}, so the diagonal is the row sums of (R^{-1})^2 -- no Gram
    matrix is formed (its condition number is the square of Cm's). Raises ValueError when
    N > d or Cm is numerically rank deficient (smallest |R_rr| <= max(N, d) * eps * largest,
    eps = the machine epsilon of the input dtype; the SVD test of the same form agrees on
    every case in the tests, at a fraction of the cost).
    """
    n, d = xt.shape
    if n > d:
        raise ValueError(
            f"the batch has N = {n} examples but the attacked layer has only d = {d} "
            "coefficients per logit (inputs, plus 1 for the bias), so (Cm^T Cm) is singular: "
            f"use a batch of at most {d} examples or a wider layer"
        )
    r = np.linalg.qr(xt.T, mode="r")  # Cm = xt^T [d, N] = Q [d, N] R [N, N]
    rd = np.abs(np.diag(r))
    tol = max(n, d) * eps * (float(rd.max()) if rd.size else 0.0)
    if rd.size == 0 or float(rd.min()) <= tol or float(rd.max()) == 0.0:
        raise ValueError(
            "the Gram matrix Cm^T Cm of the layer inputs is rank deficient (smallest |R_rr| "
            f"{float(rd.min()) if rd.size else 0.0:.3g} vs tolerance {tol:.3g}): duplicate examples, "
            "or ReLU units that are zero for the whole batch, which lower the usable width "
            "below the batch size; use a smaller batch or a wider layer"
        )
    r_inv = solve_triangular(r, np.eye(n))
    return np.sum(r_inv * r_inv, axis=1)


def last_layer_gram_inverse_diag(features: ArrayLike, *, bias: bool = True) -> np.ndarray:
    """v_r = [(Cm^T Cm)^{-1}]_rr for the last-layer attack (Yuan et al. 2022 Alg. 2), numpy only.

    Args:
        features: [N, p] inputs of the attacked linear layer (last hidden activations).
        bias: append a column of ones (the layer has a bias), default True.

    Returns:
        float64 [N], > 0 (1 / feature units^2). The attack statistic of row r has noise
        variance s^2 v_r.

    Raises:
        ValueError: non-finite or non-2-D input; N > p (+1 with bias) or a rank-deficient Gram
            matrix (use a smaller batch or a wider layer).

    Source: Yuan et al. 2022 Alg. 2 (R^T (C^T C)^{-1} R).
    """
    x, eps = _as_2d(features, "features")
    return _gram_inv_diag(_design(x, bool(bias)), eps)


def flipped_clip_factors(
    probs: ArrayLike, labels: ArrayLike, grad_norms: ArrayLike, max_grad_norm: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clip factors at the observed and at the flipped label, from whole-gradient norms (Alg. 2).

    For a binary logit, g_r(1 - y_r) = k_r g_r(y_r) with k_r = (p_r - 1 + y_r) / (p_r - y_r),
    so ||g_r(1 - y_r)|| = |k_r| ||g_r(y_r)||.

    Args:
        probs: [N] sigmoid outputs p_r, strictly inside (0, 1).
        labels: [N] observed labels in {0, 1}.
        grad_norms: [N] norms ||g_r|| of the whole per-example gradient (all parameters,
            before clipping), >= 0.
        max_grad_norm: C > 0.

    Returns:
        ``(clip, flipped_norms, flipped_clip)``, float64 [N] each: c_r = min(1, C/||g_r||),
        |k_r| ||g_r|| and c'_r = min(1, C / (|k_r| ||g_r||)) (1 where a norm is 0).

    Raises:
        ValueError: shapes differ, probs outside (0, 1), labels not in {0, 1}, negative or
            non-finite norms, C <= 0.

    Source: Yuan et al. 2022 Alg. 2 step "re-calculate g-bar_0(x[r]) with D1[r]".
    """
    p = _as_1d(probs, "probs", to_numpy(probs, "probs").reshape(-1).shape[0])
    n = p.shape[0]
    y = _check_labels(labels, n)
    g = _as_1d(grad_norms, "grad_norms", n)
    c_max = check_positive_finite(max_grad_norm, "max_grad_norm")
    _check_probs(p)
    if (g < 0).any():
        raise ValueError("grad_norms must be >= 0")
    k = np.abs((p - 1.0 + y) / (p - y))
    gf = k * g
    return _clip(g, c_max), gf, _clip(gf, c_max)


def _clip(norms: np.ndarray, c_max: float) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(norms > c_max, c_max / np.where(norms > 0, norms, 1.0), 1.0)


def _check_labels(labels: ArrayLike, n: int) -> np.ndarray:
    raw = to_numpy(labels, "labels")
    y = _as_1d(raw.astype(float) if raw.dtype == bool else raw, "labels", n)
    if not ((y == 0.0) | (y == 1.0)).all():
        raise ValueError("labels must be binary, every value 0 or 1")
    return y


def _check_probs(p: np.ndarray) -> None:
    if (p <= 0.0).any() or (p >= 1.0).any():
        raise ValueError(
            "probs must lie strictly inside (0, 1): at p_r = y_r the observed gradient is 0 and "
            "the flipped-label gradient norm cannot be recovered from grad_norms (compute the "
            "sigmoid in float64 from the logits to avoid saturation)"
        )


def _check_expected_batch(x: Any) -> float:
    return check_positive_finite(x, "expected_batch_size")


@functools.lru_cache(maxsize=256)
def _single_step_epsilon(sigma: float, delta: float) -> float:
    """One step, replace-one label: the Gaussian mechanism with sensitivity 2 / sigma (cached:
    a training run asks for the same (sigma, delta) at every step)."""
    return float(gaussian_epsilon(sigma, delta, sensitivity=2.0))


def _pair_epsilons(mu: np.ndarray, delta: float) -> np.ndarray:
    """gaussian_epsilon(1, delta, sensitivity=mu_r) for each r (mu-GDP pair epsilon), vectorised."""
    return gaussian_epsilon_array(mu, delta)


# --------------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------------


def label_dp_lower_bound(
    features: ArrayLike,
    probs: ArrayLike,
    labels: ArrayLike,
    grad_norms: ArrayLike,
    *,
    max_grad_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    delta: float,
    bias: bool = True,
    gram_inv_diag: ArrayLike | None = None,
    grad_scale: float = 1.0,
    flipped_grad_norms: ArrayLike | None = None,
    max_pairs: int | None = None,
    p0_for_all: bool = True,
) -> LabelDPBounds:
    """Label-DP lower bounds for one DP-SGD step (Yuan, Xue, Wang & Shen 2022, Alg. 2).

    Two forms, chosen by the shape of ``probs``:

    * K classes, softmax last layer (``probs`` [N, K], ``labels`` in 0..K-1; this project's
      extension, derived in docs/methods/label_dp_multiclass.md): the attack statistic of row r
      is the K-vector a_r = N_e [(Cm^T Cm)^{-1} Cm^T G~^T]_r ~ N(c_r kappa (p_r - e_{y_r}),
      tau_r^2 I_K) with tau_r = sigma C sqrt(v_r) (eq. (2) there); the attack outputs
      argmin_k a_r[k]. P0[r] = P(argmin = y_r) and P1[r] = P(argmin = y_r) with row r's label
      replaced by y' (its own clip factor c'_r(y')) are the one-dimensional integrals
      integral phi(z) prod_{k != y} Phi((m_k - m_y) / tau_r + z) dz (eq. (3)), computed by a
      log-domain trapezoid rule accurate to 1e-8 relative; LB[r] = max_{y'} log((P0 - delta) /
      P1) (eq. (5)). ``flipped_grad_norms`` gives ||g_r(k)|| (the replaced label's clip
      factor); without it P1 is maximised over c' in [0, 1] on a 41-point grid (conservative).
      K = 2 equals the binary form (tests/test_label_dp_multiclass.py).
    * Binary single-logit model (``probs`` [N], the form below).

    Binary single-logit model, last-layer threat model: the adversary sees the privatized mean
    gradient of the last linear layer (weights and bias) and the layer's inputs, and runs the
    attack of :func:`audit_callbacks.attacks.label_reconstruction.reconstruct_labels`.
    See the module docstring for every formula.

    Args:
        features: [N, p] inputs of the attacked last linear layer (the last hidden activations),
            WITHOUT a column of ones: with ``bias=True`` (default; Opacus' ``nn.Linear`` has a
            bias) the function appends it.
        probs: [N] sigmoid outputs p_r, strictly inside (0, 1).
        labels: [N] observed labels y_r in {0, 1} (D0).
        grad_norms: [N] norms of the whole per-example gradient over ALL trainable parameters,
            before clipping (what Opacus clips). Must be >= |p_r - y_r| ||x~_r|| (the layer
            part), up to a 1e-4 relative slack; this catches layer-only or post-clip norms.
        max_grad_norm: C > 0 (Opacus ``max_grad_norm``).
        noise_multiplier: sigma > 0 (Opacus ``noise_multiplier``).
        expected_batch_size: N_e > 0, the divisor Opacus applies (equal to N for a fixed batch);
            it cancels from every probability and epsilon.
        delta: delta in (0, 1).
        bias: whether the attacked layer has a bias (append 1 to ``features``).
        gram_inv_diag: [N] v_r = [(Cm^T Cm)^{-1}]_rr when already computed for these features
            (e.g. ``factorize_layer(features).gram_inv_diag`` of
            :mod:`audit_callbacks.attacks.label_reconstruction`, which the label callbacks share
            with the attack); finite and > 0. None (default): computed here with the rank check
            of :func:`last_layer_gram_inverse_diag`.
        grad_scale: kappa > 0 when the per-example gradients Opacus clips are kappa times the
            gradient of the example's log-loss (Lightning divides the loss by
            ``accumulate_grad_batches``, so kappa = 1 / accumulate_grad_batches there);
            ``grad_norms`` are the norms of those scaled gradients. See the module docstring.
            Default 1.
        flipped_grad_norms: K classes only: [N, K] norms of the whole per-example gradient
            (scaled by kappa, before clipping) had example r carried label k, each >= its
            last-layer part kappa ||p_r - e_k|| ||x~_r||; or a callable (rows, labels) -> norms
            asked only for the evaluated pairs (with ``max_pairs``: the ranking then uses
            ||g_r|| ||p_r - e_k|| / ||p_r - e_{y_r}||); None: unknown (see above).
        max_pairs, p0_for_all: K classes: evaluate the integrals (P1) only for the
            ``max_pairs`` pairs (r, y') with the largest closed-form upper bound on LB (valid,
            <= exhaustive; P1 NaN, LB -inf elsewhere), and P0 of every row or (False) of theirs.

    Returns:
        :class:`LabelDPBounds`: per-example ``p0``, ``p1``, ``lower_bound`` [N], the batch
        ``epsilon_lower_bound`` (finite, >= 0) and the Gaussian-pair bounds. No NaN (but see max_pairs).

    Raises:
        ValueError: shapes or values invalid (see above); N > p (+1 with bias) or a
            rank-deficient Gram matrix of the features (use a smaller batch or a wider layer);
            grad_norms smaller than the layer part of the gradient.

    Source: Yuan et al. 2022 Alg. 2 and App. A.3 (P_0, P_1, LB).
    """
    x, eps = _as_2d(features, "features")
    n = x.shape[0]
    p_in = to_numpy(probs, "probs")
    if p_in.ndim == 2 and p_in.shape[1] >= 2:
        from ._label_dp_multiclass import multiclass_lower_bound

        if p_in.dtype == bool or not np.issubdtype(p_in.dtype, np.number):
            raise ValueError(f"probs must be a real array, got dtype {p_in.dtype}")
        return multiclass_lower_bound(  # type: ignore[return-value]
            x, eps, p_in.astype(float), labels, grad_norms, flipped_grad_norms,
            c_max=check_positive_finite(max_grad_norm, "max_grad_norm"),
            sigma=check_positive_finite(noise_multiplier, "noise_multiplier"),
            n_e=_check_expected_batch(expected_batch_size), delta=check_delta(delta), bias=bool(bias),
            gram_inv_diag=gram_inv_diag, scale=check_positive_finite(grad_scale, "grad_scale"),
            max_pairs=max_pairs, p0_for_all=bool(p0_for_all))
    if flipped_grad_norms is not None:
        raise ValueError("flipped_grad_norms is for K-class probs [N, K] only (binary: computed from grad_norms)")
    p = _as_1d(probs, "probs", n)
    _check_probs(p)
    y = _check_labels(labels, n)
    g = _as_1d(grad_norms, "grad_norms", n)
    if (g < 0).any():
        raise ValueError("grad_norms must be >= 0")
    c_max = check_positive_finite(max_grad_norm, "max_grad_norm")
    sigma = check_positive_finite(noise_multiplier, "noise_multiplier")
    n_e = _check_expected_batch(expected_batch_size)
    d = check_delta(delta)

    scale = check_positive_finite(grad_scale, "grad_scale")
    xt = _design(x, bool(bias))
    xnorm = np.linalg.norm(xt, axis=1)
    a = p - y  # p_r - y_r, nonzero
    a_flip = p - 1.0 + y
    layer_part = scale * np.abs(a) * xnorm
    _check_grad_norms(g, layer_part, "kappa |p - y| ||[x, 1]||")

    if gram_inv_diag is None:
        v = _gram_inv_diag(xt, eps)
    else:
        v = _as_1d(gram_inv_diag, "gram_inv_diag", n)
        if xt.shape[1] < n:
            _gram_inv_diag(xt, eps)  # raises the N > d error
        if (v <= 0).any():
            raise ValueError("gram_inv_diag must be > 0 (diagonal of the inverse of a positive definite matrix)")
    clip = _clip(g, c_max)
    k = np.abs(a_flip / a)
    g_flip = k * g
    clip_flip = _clip(g_flip, c_max)

    s = sigma * c_max / n_e
    coef0 = clip * scale * a  # clipped kappa (p - y) of row r on D0
    coef1 = clip_flip * scale * a_flip  # ... on D1[r]
    # Alg. 2: m0 = R^T (C^T C)^{-1} C^T G_0 with G_0 = C coef0 / N_e, i.e. exactly coef0 / N_e
    # ((C^T C)^{-1} C^T C = I: the noise-free statistic of row r is its own clipped p - y);
    # under D1[r] only row r's coefficient changes (Alg. 2 step 3).
    m0 = coef0 / n_e
    m1 = coef1 / n_e
    sd = s * np.sqrt(v)
    sign = np.where(y == 1.0, -1.0, 1.0)
    z0 = sign * m0 / sd
    z1 = sign * m1 / sd
    log_p0 = log_ndtr(z0)
    log_p1 = log_ndtr(z1)
    p0 = np.exp(log_p0)
    p1 = np.exp(log_p1)
    ok = p0 > d
    with np.errstate(divide="ignore", invalid="ignore"):
        log_num = log_p0 + np.log1p(-d * np.exp(-log_p0))
    lb = np.where(ok, log_num - log_p1, -np.inf)
    if ok.any():
        best = int(np.argmax(np.where(ok, lb, -np.inf)))
        batch = float(max(0.0, lb[best]))
    else:
        best, batch = -1, 0.0

    mu_opt = np.abs(m1 - m0) / sd
    mu_layer = np.abs(coef1 - coef0) * xnorm / (sigma * c_max)
    mu_all = np.abs(clip_flip * (-k) - clip) * g / (sigma * c_max)
    # epsilon is increasing in mu: the batch maxima need one root each (the per-example arrays
    # are computed on first access, see LabelDPBounds)
    eps_max = [_epsilon_of_mu(float(m.max()), d) for m in (mu_opt, mu_layer, mu_all)]
    eps_single = _single_step_epsilon(sigma, d)

    for name, arr in (("P_0", log_p0), ("P_1", log_p1), ("mu", mu_all), ("mu", mu_opt)):
        if not np.isfinite(arr).all():  # pragma: no cover - guarded by the checks above
            raise ValueError(f"non-finite {name} (features or gradients too extreme)")

    return LabelDPBounds(
        p0=_readonly(p0),
        p1=_readonly(p1),
        log_p0=_readonly(log_p0),
        log_p1=_readonly(log_p1),
        lower_bound=_readonly(lb),
        epsilon_lower_bound=batch,
        best_index=best,
        optimal_test_mu=_readonly(mu_opt),
        optimal_test_epsilon_max=float(eps_max[0]),
        layer_pair_mu=_readonly(mu_layer),
        layer_pair_epsilon_max=float(eps_max[1]),
        all_params_pair_mu=_readonly(mu_all),
        all_params_pair_epsilon_max=float(eps_max[2]),
        single_step_epsilon=float(eps_single),
        statistic_mean0=_readonly(m0),
        statistic_mean1=_readonly(m1),
        statistic_std=_readonly(sd),
        gram_inv_diag=_readonly(v),
        clip_factors=_readonly(clip),
        flipped_grad_norms=_readonly(g_flip),
        flipped_clip_factors=_readonly(clip_flip),
        noise_std=float(s),
        delta=d,
        noise_multiplier=sigma,
        max_grad_norm=c_max,
        expected_batch_size=n_e,
        n=n,
    )


# --------------------------------------------------------------------------------------------
# Extrapolation (Yuan et al. 2022 App. A.3.1)
# --------------------------------------------------------------------------------------------


def _check_int(x: Any, name: str, minimum: int) -> int:
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and not float(x).is_integer():
        raise ValueError(f"{name} must be an integer, got {x!r}")
    return check_count(x, name, minimum)


def _harmonic(n: int) -> float:
    """H_n = psi(n + 1) + Euler's gamma."""
    return float(digamma(n + 1.0) + np.euler_gamma)


def extrapolation_factor(num_batches: int, batch_size: int, *, exact: bool = False) -> float:
    """E[LB over M batches] / E[LB of one batch] for i.i.d. exponential per-example bounds.

    Args:
        num_batches: M >= 1.
        batch_size: N >= 2 (log N must be > 0).
        exact: False (default): the paper's 1 + log M / log N; True: the exact ratio of
            expected maxima H_{MN} / H_N (harmonic numbers), which the paper approximates with
            H_n ~ log n (its proof, eq. 9-11). For N = 50: 1.69 vs 1.60 at M = 15 and 2.12 vs
            1.97 at M = 80.

    Returns:
        The factor, >= 1 (dimensionless).

    Raises:
        ValueError: M < 1 or N < 2 or either not an integer.

    Source: Yuan et al. 2022 App. A.3.1 (Extrapolation Theorem) and A.4.2.
    """
    m = _check_int(num_batches, "num_batches", 1)
    n = _check_int(batch_size, "batch_size", 2)
    if exact:
        return _harmonic(m * n) / _harmonic(n)
    return 1.0 + math.log(m) / math.log(n)


def extrapolate_lower_bound(
    lb_one_batch: float, num_batches: int, batch_size: int, *, exact: bool = False
) -> float:
    """Predicted lower bound over M batches from one batch's: factor * LB (Yuan et al. 2022 App. A.3.1).

    Args:
        lb_one_batch: the one-batch bound (e.g. ``LabelDPBounds.epsilon_lower_bound``),
            finite, >= 0 (nats).
        num_batches: M >= 1.
        batch_size: N >= 2.
        exact: use H_{MN} / H_N instead of 1 + log M / log N (see
            :func:`extrapolation_factor`).

    Returns:
        (1 + log M / log N) * LB (nats), finite, >= 0. A prediction under the paper's i.i.d.
        exponential model, not a bound: the paper's own data do not follow it closely
        (0.033 -> 0.091 measured vs 0.070 predicted at M = 80, N = 50).

    Raises:
        ValueError: LB negative or not finite; M, N invalid.

    Source: Yuan et al. 2022 App. A.3.1.
    """
    lb = check_real_finite(lb_one_batch, "lb_one_batch")
    if lb < 0:
        raise ValueError(f"lb_one_batch must be >= 0, got {lb_one_batch!r}")
    return lb * extrapolation_factor(num_batches, batch_size, exact=exact)


def argmin_attack_success_probability(means: ArrayLike, labels: ArrayLike, sd: ArrayLike) -> np.ndarray:
    """P(argmin_k a_r[k] = labels[r]) for a_r ~ N(means[r], sd_r^2 I_K), one per row.

    The success probability of the K-class last-layer label attack (docs/methods/
    label_dp_multiclass.md eq. (3)): the one-dimensional integral
    integral phi(z) prod_{k != y} Phi((m_k - m_y) / sd + z) dz, by quadrature (1e-8 relative).

    Args:
        means: [M, K] means of the attack statistic (K >= 2). labels: [M] integers in 0..K-1.
        sd: [M] (or scalar) standard deviations, > 0.

    Returns:
        float64 [M] probabilities.

    Raises:
        ValueError: shapes inconsistent, labels out of range, sd <= 0, NaN/inf.
    """
    from ._label_dp_multiclass import attack_success_log_prob

    m = as_float_array(means, "means")
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 2 or not np.isfinite(m).all():
        raise ValueError(f"means must be a finite [M, K] array with K >= 2, got shape {m.shape}")
    y = to_numpy(labels, "labels").reshape(-1)
    if y.shape[0] != m.shape[0] or (y != np.round(y)).any() or (y < 0).any() or (y >= m.shape[1]).any():
        raise ValueError(f"labels must be [{m.shape[0]}] integers in 0..{m.shape[1] - 1}")
    s = np.broadcast_to(as_float_array(sd, "sd", allow_int=True), (m.shape[0],))
    if not np.isfinite(s).all() or (s <= 0).any():
        raise ValueError("sd must be finite and > 0")
    return np.exp(attack_success_log_prob(m, y.astype(np.int64), s))
