"""Label-DP lower bounds of one DP-SGD step from the last-layer label attack (Yuan et al. 2022).

Setting (Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks with Strong DP-SGD Lower
Bounds for Label Privacy", §3 eq. (1), Alg. 2, App. A.3): a classifier whose last layer is
linear, Z_r = W x_r + b, on top of the last hidden activations x_r, with one sigmoid logit
(log-loss) or K softmax outputs (cross-entropy). The whole per-example gradient at label k is
g_r(k); its restriction to the last layer (weights and bias) is kappa e_r(k) x~_r^T with
x~_r = [x_r, 1] and e_r(k) = p_r - k (sigmoid) or p_r - e_k (softmax). Opacus clips the whole
gradient with c_r = min(1, C / ||g_r||) (norm over ALL parameters), sums, adds N(0, sigma^2 C^2 I)
and divides by the expected batch size N_e:

    G~ = G_0 + xi,   G_0 = (1/N_e) sum_r c_r kappa e_r(y_r) x~_r^T,   xi ~ N(0, s^2 I),  s = sigma C / N_e.

The attack statistic of row r is [(Cm^T Cm)^{-1} Cm^T G~^T]_r (Cm = [x~_1 ... x~_N]), Gaussian
with mean m_r = c_r kappa e_r(y_r) / N_e and sd s sqrt(v_r), v_r = [(Cm^T Cm)^{-1}]_rr; the
attack outputs the sign (sigmoid: y = 1 iff the statistic is < 0; Yuan et al. Alg. 1 and 3) or
the argmin (softmax). Under D1[r, y'] (r's label replaced by y') only row r's clipped gradient
changes, with its own clip factor c'_r(y') = min(1, C / ||g_r(y')||). For a sigmoid logit the
flipped whole gradient is k_r g_r with k_r = (p_r - 1 + y_r) / (p_r - y_r) < 0, so its norm and
clip factor follow from ``grad_norms`` in closed form (Alg. 2, :func:`flipped_clip_factors`);
with K classes they are an input (``flipped_grad_norms``).

One computation for every K. The binary model is the two-class case of the K-class bound
(:mod:`.kclass`: probabilities (1 - p, p), scale kappa / sqrt 2), so :func:`label_dp_lower_bound`
runs the same code for both; with one competitor the attack's success probability is the closed
form Phi(.) of Alg. 2 (:mod:`.attack`), and the tests check the binary values against the
paper's closed forms, autograd and a Monte Carlo of the attack.

Bounds (all in nats, at the given delta; :class:`LabelDPBounds`):

* ``epsilon_lower_bound``: the event test of the attack (Yuan et al. 2022 eq. (3) and Alg. 2;
  docs/methods/label_dp_multiclass.md eq. (5)): P_0[r] and P_1[r, y'], both the probability that
  the attack outputs the D0 label y_r, LB[r] = max_{y'} log((P_0[r] - delta) / P_1[r, y']),
  evaluated in the log domain (P_1 underflowing to 0 gives a large finite LB, never inf or NaN).
  Where P_0[r] <= delta the event bound is vacuous and LB[r] = -inf (documented choice: "no
  information", distinct from a computed value of 0; LB[r] may also be a finite negative
  number, the attack then being worse than chance). The batch bound max(0, max_r LB[r]) is
  always finite.
* ``epsilon_pair_optimal_test``: the statistic has the same covariance under D0 and D1[r, y'],
  so the best test on it is the equal-variance Gaussian pair with
  mu_r = ||m_r - m'_r|| / (s sqrt(v_r)) (max over y'); its epsilon
  (:func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon` with sensitivity mu_r, Balle &
  Wang 2018) is >= LB[r] because the event test is one test on that pair.
* ``epsilon_pair_layer``: the exact pair for the observed layer, N(G_0, s^2 I) vs
  N(G_1[r], s^2 I), mu = ||G_1[r] - G_0|| / s = ||c'_r e_r(y') - c_r e_r(y_r)|| kappa ||x~_r||
  / (sigma C) (max over y'). >= the optimal-test value because v_r ||x~_r||^2 >= 1 (projection
  on a subspace).
* ``epsilon_pair_all_params``: mu = (min(||g_r||, C) + min(max_{y' != y_r} ||g_r(y')||, C)) /
  (sigma C), the triangle inequality on ||c'_r g_r(y') - c_r g_r||. For a sigmoid logit the two
  gradients are antiparallel, so it is the exact pair for all parameters
  (|c'_r k_r - c_r| ||g_r|| / (sigma C)); with K classes the direction of g_r(y') is not an
  input and it is an upper bound on the exact pair (with an unknown norm, C stands for it),
  still <= 2 / sigma. >= the layer value (the layer is a sub-vector of all parameters).
* ``epsilon_single_step``: single-step replace-one bound (Gaussian mechanism): the Gaussian with
  mu = 2 / sigma (two clipped gradients of norm <= C differ by <= 2C). Every other bound is <= it.

Scope: ONE release of one step on a batch the adversary knows (no amplification). Opacus'
accountants amplify by sampling, so for short runs their epsilon can be BELOW these values:
compare with ``epsilon_single_step``, the upper bound of this observation.

Scaled losses. When the loss is multiplied by kappa > 0 before the backward pass (Lightning
divides it by ``accumulate_grad_batches``), Opacus clips kappa g_r: pass the norms of those
gradients and ``grad_scale=kappa``; then c_r = min(1, C / (kappa ||g_r||)) and every mean and
layer mu carries kappa. The all-parameter mu is unchanged in form (its norms already carry kappa).

N_e cancels from every z-score and mu; it only scales the reported means and ``noise_std``.
Opacus clips by min(1, C / (||g|| + 1e-6)); here min(1, C/||g||) (relative difference ~1e-6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from audit_callbacks.names import (
    EPSILON_LOWER_BOUND,
    EPSILON_PAIR_ALL_PARAMS,
    EPSILON_PAIR_LAYER,
    EPSILON_PAIR_OPTIMAL_TEST,
    EPSILON_SINGLE_STEP,
    EXPECTED_ATTACK_ACCURACY,
)
from audit_callbacks.validation import (
    check_delta,
    check_flag,
    check_optional_count,
    check_positive,
    to_numpy,
)

from ..gaussian import gaussian_epsilon, gaussian_epsilon_array
from ..result import AuditResult
from .inputs import (
    GRAD_NORM_RTOL,
    as_features,
    as_vector,
    binary_labels,
    check_binary_probs,
    check_grad_norms,
    class_labels,
    clip_factors,
    design_matrix,
    resolve_gram_inverse_diag,
    softmax_probs,
    whole_grad_norms,
)
from .kclass import SIGMOID_SCALE, batch_bound, pair_bounds, sigmoid_as_two_classes

__all__ = ["LabelDPBounds", "LabelDPDetail", "flipped_clip_factors", "label_dp_lower_bound"]

SOURCE_BINARY = ("Yuan, Xue, Wang & Shen (2022), Deep Gradient Attacks with Strong DP-SGD Lower Bounds for "
                 "Label Privacy, §3 eq. (3), Alg. 2 (P_0, P_1, LB)")
SOURCE_KCLASS = (SOURCE_BINARY + "; K classes: docs/methods/label_dp_multiclass.md eq. (3)-(5)")
SOURCE_PAIR = ("Balle & Wang (2018), Improving the Gaussian Mechanism for Differential Privacy, Thm. 8 "
               "(the Gaussian pair); docs/methods/label_dp.md B9")
SOURCE_SINGLE_STEP = ("Balle & Wang (2018), Thm. 8: the Gaussian mechanism with sensitivity 2C, "
                      "mu = 2 / noise_multiplier (replace one label, one step, no amplification)")


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only float64 (or int64) view; every array passed here is computed in this module,
    so no caller's array is frozen."""
    a = np.asarray(a).view()
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class LabelDPDetail:
    """The per-example arrays behind a :class:`LabelDPBounds` (read-only; N examples).

    Every array is [N] float64 except ``worst_labels`` ([N] int64) and the statistic means
    ([N, L], L the outputs of the attacked layer: 1 for a sigmoid logit, K for softmax). The
    batch values of :class:`LabelDPBounds` are the maxima over r of the arrays of the same name.

    Attributes:
        p0: P_0[r], probability that the attack outputs y_r on D0 (Yuan et al. 2022 Alg. 2);
            NaN where not evaluated (``p0_for_all=False``).
        p1: P_1[r], probability that it outputs y_r on D1[r, worst_labels[r]]; may be 0.0 by
            underflow, ``log_p1`` stays finite; NaN where the pair was not evaluated.
        log_p0, log_p1: natural logs of p0, p1.
        epsilon_lower_bound: LB[r] = log((P_0 - delta) / P_1) in nats; -inf where P_0 <= delta
            (vacuous) or the pair was not evaluated, otherwise finite (possibly negative).
        worst_labels: the replacement label y' != y_r behind LB[r] (1 - y_r for a sigmoid).
        mu_pair_optimal_test, mu_pair_layer, mu_pair_all_params: the mu of the three Gaussian
            pairs (module docstring); ``epsilon_pair_*``: their epsilons (computed on first
            access, one vectorised root finding each).
        statistic_mean0, statistic_mean1: m_r and m'_r (at ``worst_labels``), the means of the
            attack statistic under D0 and D1 (gradient units / example), [N, L].
        statistic_std: s sqrt(v_r), its standard deviation.
        gram_inv_diag: v_r = [(Cm^T Cm)^{-1}]_rr (1 / feature units^2).
        clip_factors: c_r = min(1, C / ||g_r||).
        flipped_grad_norms: ||g_r(y')|| at ``worst_labels`` (inf where unknown).
        flipped_clip_factors: c'_r at ``worst_labels`` (with unknown norms: the maximiser of P1
            over the clip-factor grid).
        noise_std: s = sigma C / N_e, the sd of the noise on the mean gradient.
        num_classes: K (2 for a sigmoid logit).
        delta: the delta of every epsilon.
    """

    p0: np.ndarray
    p1: np.ndarray
    log_p0: np.ndarray
    log_p1: np.ndarray
    epsilon_lower_bound: np.ndarray
    worst_labels: np.ndarray
    mu_pair_optimal_test: np.ndarray
    mu_pair_layer: np.ndarray
    mu_pair_all_params: np.ndarray
    statistic_mean0: np.ndarray
    statistic_mean1: np.ndarray
    statistic_std: np.ndarray
    gram_inv_diag: np.ndarray
    clip_factors: np.ndarray
    flipped_grad_norms: np.ndarray
    flipped_clip_factors: np.ndarray
    noise_std: float
    num_classes: int
    delta: float

    # Per-example Gaussian-pair epsilons: one vectorised root finding each, on first access (a
    # callback that logs only the batch maxima, computed with one root each, never pays for them).
    @functools.cached_property
    def epsilon_pair_optimal_test(self) -> np.ndarray:
        """[N] epsilon of the equal-variance pair with ``mu_pair_optimal_test``."""
        return _readonly(gaussian_epsilon_array(self.mu_pair_optimal_test, self.delta))

    @functools.cached_property
    def epsilon_pair_layer(self) -> np.ndarray:
        """[N] exact pair epsilon for the observed layer."""
        return _readonly(gaussian_epsilon_array(self.mu_pair_layer, self.delta))

    @functools.cached_property
    def epsilon_pair_all_params(self) -> np.ndarray:
        """[N] pair epsilon for all parameters (exact for a sigmoid logit, see the module)."""
        return _readonly(gaussian_epsilon_array(self.mu_pair_all_params, self.delta))


@dataclass(frozen=True, eq=False)
class LabelDPBounds:
    """Result of :func:`label_dp_lower_bound`: the step's bounds, each an :class:`AuditResult`
    (nats at ``delta``; ``alpha`` is None: the probabilities are exact, not estimated), and the
    per-example arrays in ``detail``. Its shape does not depend on K.

    Attributes:
        epsilon_lower_bound: the attack's event test, max(0, max_r LB[r]) (finite, >= 0);
            ``counts``: n, num_classes; ``details``: best_index (the example behind the value,
            -1 when no LB[r] is finite), noise_multiplier, max_grad_norm, expected_batch_size,
            grad_scale.
        epsilon_pair_optimal_test, epsilon_pair_layer, epsilon_pair_all_params: the Gaussian-pair
            epsilons of the same observation (max over examples; ``details["mu"]`` their mu), in
            that order each >= the one before.
        epsilon_single_step: the upper bound of the step, the Gaussian with mu = 2 / sigma.
        expected_attack_accuracy: mean_r P_0[r], the attack's expected accuracy on this batch
            (None when P_0 was not evaluated for every row).
        detail: :class:`LabelDPDetail`.
    """

    epsilon_lower_bound: AuditResult
    epsilon_pair_optimal_test: AuditResult
    epsilon_pair_layer: AuditResult
    epsilon_pair_all_params: AuditResult
    epsilon_single_step: AuditResult
    expected_attack_accuracy: AuditResult | None
    detail: LabelDPDetail

    def results(self) -> dict[str, AuditResult]:
        """The step's numbers by name (the names of ``audit_callbacks.names``, family ``label_dp``)."""
        out = {
            EPSILON_LOWER_BOUND: self.epsilon_lower_bound,
            EPSILON_PAIR_OPTIMAL_TEST: self.epsilon_pair_optimal_test,
            EPSILON_PAIR_LAYER: self.epsilon_pair_layer,
            EPSILON_PAIR_ALL_PARAMS: self.epsilon_pair_all_params,
            EPSILON_SINGLE_STEP: self.epsilon_single_step,
        }
        if self.expected_attack_accuracy is not None:
            out[EXPECTED_ATTACK_ACCURACY] = self.expected_attack_accuracy
        return out


# --------------------------------------------------------------------------------------------
# The flipped label's gradient norm
# --------------------------------------------------------------------------------------------


def _flip_ratio(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|k_r| = |(p_r - 1 + y_r) / (p_r - y_r)|: ||g_r(1 - y_r)|| / ||g_r(y_r)|| for a sigmoid."""
    return np.abs((p - 1.0 + y) / (p - y))


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
    p = as_vector(probs, "probs", to_numpy(probs, "probs").reshape(-1).shape[0])
    n = p.shape[0]
    y = binary_labels(labels, n)
    g = as_vector(grad_norms, "grad_norms", n)
    c_max = check_positive(max_grad_norm, "max_grad_norm")
    check_binary_probs(p)
    if (g < 0).any():
        raise ValueError("grad_norms must be >= 0")
    gf = _flip_ratio(p, y) * g
    return clip_factors(g, c_max), gf, clip_factors(gf, c_max)


class _LazyFlippedNorms:
    """K classes with ``flipped_grad_norms`` a callable ``(rows, labels) -> norms``: an estimate
    of every ||g_r(k)|| to rank the pairs (the whole gradient scaled like its last-layer part),
    replaced by the callable's exact norms for the pairs evaluated (:meth:`exact_clip`)."""

    def __init__(self, fn: Callable[[np.ndarray, np.ndarray], ArrayLike], g: np.ndarray, y: np.ndarray,
                 size: np.ndarray, layer_part: np.ndarray, c_max: float) -> None:
        n = g.shape[0]
        own = size[np.arange(n), y]
        self.norms = np.maximum(g[:, None] * size / np.where(own > 0, own, np.inf)[:, None], layer_part)
        self.norms[np.arange(n), y] = g
        self._fn, self._layer_part, self._c_max = fn, layer_part, c_max

    def exact_clip(self, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
        norms = np.asarray(self._fn(rows, labels), dtype=float).reshape(-1)
        if norms.shape != rows.shape or not np.isfinite(norms).all() or (
                norms < self._layer_part[rows, labels] * (1.0 - GRAD_NORM_RTOL)).any():
            raise ValueError("flipped_grad_norms(rows, labels) must return finite norms, one per pair, >= the "
                             "last-layer part kappa ||p - e_k|| ||[x, 1]||")
        self.norms[rows, labels] = norms
        return clip_factors(norms, self._c_max)


def _kclass_flipped_norms(
    given: object, g: np.ndarray, y: np.ndarray, size: np.ndarray, layer_part: np.ndarray, c_max: float,
) -> tuple[np.ndarray | None, _LazyFlippedNorms | None]:
    """([N, K] whole-gradient norms at every label or None (unknown), the lazy source or None)."""
    if given is None:
        return None, None
    if callable(given):
        lazy = _LazyFlippedNorms(given, g, y, size, layer_part, c_max)
        return lazy.norms, lazy
    gf = to_numpy(given, "flipped_grad_norms")
    if gf.dtype == bool or not np.issubdtype(gf.dtype, np.number):
        raise ValueError(f"flipped_grad_norms must be a real array, got dtype {gf.dtype}")
    gf = gf.astype(float)
    if gf.shape != layer_part.shape:
        raise ValueError(f"flipped_grad_norms must have shape [{layer_part.shape[0]}, {layer_part.shape[1]}], "
                         f"got {gf.shape}")
    if not np.isfinite(gf).all() or (gf < layer_part * (1.0 - GRAD_NORM_RTOL)).any():
        raise ValueError(
            "flipped_grad_norms must be finite and >= the last-layer part kappa ||p - e_k|| "
            "||[x, 1]|| of the gradient at each label k (whole per-example gradient norms)"
        )
    return gf, None


# --------------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _single_step_epsilon(sigma: float, delta: float) -> float:
    """One step, replace-one label: the Gaussian mechanism with sensitivity 2 / sigma (cached:
    a training run asks for the same (sigma, delta) at every step)."""
    return float(gaussian_epsilon(sigma, delta, sensitivity=2.0))


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
    flipped_grad_norms: ArrayLike | Callable[[np.ndarray, np.ndarray], ArrayLike] | None = None,
    max_pairs: int | None = None,
    p0_for_all: bool = True,
) -> LabelDPBounds:
    """Label-DP lower bounds for one DP-SGD step (Yuan, Xue, Wang & Shen 2022, Alg. 2).

    Last-layer threat model: the adversary sees the privatized mean gradient of the last linear
    layer (weights and bias) and the layer's inputs, and runs the attack of
    :func:`audit_callbacks.attacks.label_reconstruction.reconstruct_labels`. The form follows
    the shape of ``probs``: [N] for one sigmoid logit (Yuan et al.'s binary setting), [N, K]
    for K softmax outputs (this project's extension, docs/methods/label_dp_multiclass.md: the
    statistic is a K-vector, the attack its argmin, P0 and P1 the integral of eq. (3)). Both run
    the K-class computation, the sigmoid as K = 2 (module docstring); the tests check that a
    sigmoid equals a two-output softmax at clip norm sqrt(2) C example by example.

    Args:
        features: [N, p] inputs of the attacked last linear layer (the last hidden activations),
            WITHOUT a column of ones: with ``bias=True`` (default; Opacus' ``nn.Linear`` has a
            bias) the function appends it.
        probs: [N] sigmoid outputs p_r strictly inside (0, 1), or [N, K] softmax probabilities
            (rows summing to 1).
        labels: [N] observed labels y_r (D0): in {0, 1} for a sigmoid, integers in 0..K-1.
        grad_norms: [N] norms of the whole per-example gradient over ALL trainable parameters,
            before clipping (what Opacus clips). Must be >= the layer part kappa ||e_r(y_r)||
            ||x~_r|| up to a 1e-4 relative slack; this catches layer-only or post-clip norms.
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
            of :func:`~audit_callbacks.estimators.label_dp.inputs.last_layer_gram_inverse_diag`.
        grad_scale: kappa > 0 when the per-example gradients Opacus clips are kappa times the
            gradient of the example's loss (Lightning divides the loss by
            ``accumulate_grad_batches``, so kappa = 1 / accumulate_grad_batches there);
            ``grad_norms`` are the norms of those scaled gradients. See the module docstring.
            Default 1.
        flipped_grad_norms: K classes only (a sigmoid's follow from ``grad_norms``, Alg. 2):
            [N, K] norms of the whole per-example gradient (scaled by kappa, before clipping)
            had example r carried label k, each >= its last-layer part kappa ||p_r - e_k||
            ||x~_r||; or a callable (rows, labels) -> norms asked only for the evaluated pairs
            (with ``max_pairs``: the ranking then uses ||g_r|| ||p_r - e_k|| / ||p_r - e_{y_r}||);
            None: unknown, P1 is maximised over c' in [0, 1] on a 41-point grid (conservative).
        max_pairs, p0_for_all: K classes: evaluate the integrals (P1) only for the
            ``max_pairs`` pairs (r, y') with the largest closed-form upper bound on LB (valid,
            <= exhaustive; P1 NaN, LB -inf elsewhere), and P0 of every row or (False) of theirs.
            A sigmoid logit has one pair per example in closed form: every pair is evaluated.

    Returns:
        :class:`LabelDPBounds`: the batch ``epsilon_lower_bound`` (finite, >= 0), the
        Gaussian-pair epsilons and the single-step bound as :class:`AuditResult`, and the
        per-example arrays in ``detail``. No NaN (but see ``max_pairs``).

    Raises:
        ValueError: shapes or values invalid (see above); N > p (+1 with bias) or a
            rank-deficient Gram matrix of the features (use a smaller batch or a wider layer);
            grad_norms smaller than the layer part of the gradient; ``bias`` or ``p0_for_all``
            not a bool; ``max_pairs`` neither None nor an integer >= 1.

    Source: Yuan et al. 2022 Alg. 2 and App. A.3 (P_0, P_1, LB); docs/methods/label_dp_multiclass.md.
    """
    x, eps = as_features(features, "features")
    n = x.shape[0]
    p_in = to_numpy(probs, "probs")
    kclass = p_in.ndim == 2 and p_in.shape[1] >= 2
    if not kclass and flipped_grad_norms is not None:
        raise ValueError("flipped_grad_norms is for K-class probs [N, K] only (binary: computed from grad_norms)")
    c_max = check_positive(max_grad_norm, "max_grad_norm")
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    n_e = check_positive(expected_batch_size, "expected_batch_size")
    d = check_delta(delta)
    kappa = check_positive(grad_scale, "grad_scale")
    bias = check_flag(bias, "bias")
    max_pairs = check_optional_count(max_pairs, "max_pairs", minimum=1)
    p0_for_all = check_flag(p0_for_all, "p0_for_all")
    xt = design_matrix(x, bias)
    xnorm = np.linalg.norm(xt, axis=1)
    lazy = None
    if kclass:
        p2 = softmax_probs(p_in, n)
        k = p2.shape[1]
        y = class_labels(labels, n, k)
        g = whole_grad_norms(grad_norms, n)
        size = np.linalg.norm(p2[:, None, :] - np.eye(k)[None], axis=2)  # ||p_r - e_k||, [N, K]
        layer_part = kappa * size * xnorm[:, None]
        check_grad_norms(g, layer_part[np.arange(n), y], "kappa ||p - e_y|| ||[x, 1]||")
        gf, lazy = _kclass_flipped_norms(flipped_grad_norms, g, y, size, layer_part, c_max)
        scale, method, source = kappa, "label_dp_argmin_test", SOURCE_KCLASS
    else:
        p = as_vector(probs, "probs", n)
        check_binary_probs(p)
        yb = binary_labels(labels, n)
        g = whole_grad_norms(grad_norms, n)
        check_grad_norms(g, kappa * np.abs(p - yb) * xnorm, "kappa |p - y| ||[x, 1]||")
        y = yb.astype(np.int64)
        p2 = sigmoid_as_two_classes(p)
        gf = np.where(np.arange(2)[None, :] == y[:, None], g[:, None], (_flip_ratio(p, yb) * g)[:, None])
        scale, method, source = kappa * SIGMOID_SCALE, "label_dp_sign_test", SOURCE_BINARY
        max_pairs, p0_for_all = None, True
    v = resolve_gram_inverse_diag(gram_inv_diag, xt, eps)
    clip = clip_factors(g, c_max)
    s = sigma * c_max / n_e
    sd = s * np.sqrt(v)
    pairs = pair_bounds(probs=p2, y=y, clip=clip, flip_clip=None if gf is None else clip_factors(gf, c_max),
                        scale=scale, sd=sd, n_e=n_e, delta=d, max_pairs=max_pairs, p0_for_all=p0_for_all,
                        exact_clip=None if lazy is None else lazy.exact_clip)
    rows = np.arange(n)
    worst = pairs.worst_labels
    if gf is None:  # unknown: the all-parameter pair takes the largest possible clipped norm, C
        g_flip = g_flip_max = np.full(n, np.inf)
    else:
        g_flip = gf[rows, worst]
        g_flip_max = np.where(np.arange(gf.shape[1])[None, :] == y[:, None], -np.inf, gf).max(axis=1)
    mu_opt = pairs.mu_pair_optimal_test
    mu_layer = pairs.mean_shift_max * xnorm / (sigma * c_max)
    mu_all = (np.minimum(g, c_max) + np.minimum(g_flip_max, c_max)) / (sigma * c_max)
    m0, m1 = pairs.statistic_mean0, pairs.statistic_mean1
    if not kclass:  # the sigmoid's scalar statistic t = sqrt(2) a[1] (kclass module docstring)
        m0, m1 = m0[:, 1:] / SIGMOID_SCALE, m1[:, 1:] / SIGMOID_SCALE
    lb = pairs.epsilon_lower_bound
    batch, best = batch_bound(lb)
    ro = _readonly
    detail = LabelDPDetail(
        p0=ro(pairs.p0), p1=ro(pairs.p1), log_p0=ro(pairs.log_p0), log_p1=ro(pairs.log_p1),
        epsilon_lower_bound=ro(lb), worst_labels=ro(worst), mu_pair_optimal_test=ro(mu_opt),
        mu_pair_layer=ro(mu_layer), mu_pair_all_params=ro(mu_all), statistic_mean0=ro(m0),
        statistic_mean1=ro(m1), statistic_std=ro(sd), gram_inv_diag=ro(v), clip_factors=ro(clip),
        flipped_grad_norms=ro(g_flip), flipped_clip_factors=ro(pairs.flipped_clip_factors),
        noise_std=float(s), num_classes=int(p2.shape[1]), delta=d,
    )
    counts = {"n": n, "num_classes": int(p2.shape[1])}
    setting = {"noise_multiplier": sigma, "max_grad_norm": c_max, "expected_batch_size": n_e, "grad_scale": kappa}

    def pair(name: str, mu: np.ndarray) -> AuditResult:
        # epsilon is increasing in mu: the batch maximum needs one root
        top = float(mu.max())
        return AuditResult(value=float(gaussian_epsilon(1.0, d, sensitivity=top)), delta=d,
                           method=f"gaussian_pair_{name}", source=SOURCE_PAIR, counts=counts,
                           details={"mu": top, "best_index": int(np.argmax(mu))})

    p0 = detail.p0
    return LabelDPBounds(
        epsilon_lower_bound=AuditResult(value=batch, delta=d, method=method, source=source, counts=counts,
                                        details={"best_index": best, **setting}),
        epsilon_pair_optimal_test=pair("optimal_test", mu_opt),
        epsilon_pair_layer=pair("layer", mu_layer),
        epsilon_pair_all_params=pair("all_params", mu_all),
        epsilon_single_step=AuditResult(value=_single_step_epsilon(sigma, d), delta=d,
                                        method="gaussian_mechanism_single_step", source=SOURCE_SINGLE_STEP,
                                        details={"mu": 2.0 / sigma}),
        expected_attack_accuracy=AuditResult(value=float(np.mean(p0)), method="mean_p0", source=source,
                                             counts=counts) if np.isfinite(p0).all() else None,
        detail=detail,
    )
