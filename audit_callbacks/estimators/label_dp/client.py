"""Label-DP lower bound of one client's update in one round of DP-FedAvg with FedSGD clients.

Setting: a client holds n examples and takes ONE local SGD step on all of them (FedSGD), so its
update is Delta = -lr c mean_r grad L_r, with one clip factor c = min(1, C / ||Delta_raw||) for
the whole update (McMahan et al. 2018, DP-FedAvg). The server releases the cohort's sum of
clipped updates plus N(0, (z C)^2 I). The adversary of DP knows every other client's update,
the global model and this client's features, so it sees Delta + N(0, (z C)^2 I) and runs the
last-layer label attack of Yuan, Xue, Wang & Shen (2022), "Deep Gradient Attacks with Strong
DP-SGD Lower Bounds for Label Privacy", §3 eq. (1), Alg. 1 and 3, on the last layer's part
(K classes: the argmin attack of docs/methods/label_dp_multiclass.md).

The statistic of example r is a_r = n [(Cm^T Cm)^{-1} Cm^T (-Delta_last)^T]_r (Cm = rows
[x_r, 1], ``gram_inv_diag`` v_r = [(Cm^T Cm)^{-1}]_rr). Under D0 (the observed labels)

    a_r ~ N(s (p_r - e_{y_r}), tau_r^2 I_K),   s = lr c,   tau_r = n z C sqrt(v_r),          (6)

and under D1 (row r's label replaced by y') its mean is s' (p_r - e_{y'}) with s' = lr c' and
c' in (0, 1] the clip factor of the changed update, c' = min(1, C / ||Delta_raw - (lr / n) D||)
with D = grad_theta (L_r(y') - L_r(y_r)) (eq. (7), ``flipped_clip_factors``; without them P1
is maximised over c' on the grid of docs/methods/label_dp_multiclass.md, the conservative form).
The model's p_r does not depend on r's label. P0, P1 and LB[r] = max_{y'} log((P0 - delta) / P1)
are eq. (3)-(5) there (:func:`~.kclass.pair_bounds`) with the clip factor c shared by every row.
A sigmoid logit (``probs`` [n], labels in {0, 1}) is the case K = 2 of :mod:`.kclass`
(probabilities (1 - p, p), scale lr / sqrt 2).

Without the replaced update's clip factors the bound cannot pass log K (log 2 for a sigmoid
logit): c' -> 0 removes the label signal from the replaced update, so P1 >= 1/K.

Upper bound of the same release (one round, replace-one label of one client, no amplification):
the Gaussian mechanism with sensitivity 2C and noise z C, mu = 2 / z.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from audit_callbacks.validation import (
    as_float_array,
    check_delta,
    check_optional_count,
    check_positive,
)

from ..gaussian import gaussian_epsilon
from ..result import AuditResult
from .inputs import class_labels, softmax_probs
from .kclass import SIGMOID_SCALE, ExactClip, batch_bound, pair_bounds, sigmoid_as_two_classes

__all__ = ["ClientLabelDPBound", "ClientLabelDPDetail", "client_update_label_dp_lower_bound"]

SOURCE = ("Yuan, Xue, Wang & Shen (2022), Deep Gradient Attacks with Strong DP-SGD Lower Bounds for Label "
          "Privacy, §3 eq. (1)-(3), Alg. 1 and 3; docs/methods/label_dp_multiclass.md eq. (3)-(7) (a FedSGD "
          "client's update in DP-FedAvg, McMahan et al. 2018)")
SOURCE_SINGLE_ROUND = ("Balle & Wang (2018), Thm. 8: the Gaussian mechanism with sensitivity 2C and noise z C, "
                       "mu = 2 / z (one round, one label of one client, no amplification)")


@dataclass(frozen=True, eq=False)
class ClientLabelDPDetail:
    """The per-example arrays behind a :class:`ClientLabelDPBound` ([n] each).

    Attributes:
        p0: P(the attack recovers y_r) on the release (the expected attack accuracy per example).
        p1: P(the attack outputs y_r) had r carried ``worst_labels[r]`` (NaN: not evaluated).
        worst_labels: int64, the replacement label y' of LB[r].
        epsilon_lower_bound: LB[r] in nats (-inf where P0 <= delta or the pair was not evaluated).
    """

    p0: np.ndarray
    p1: np.ndarray
    worst_labels: np.ndarray
    epsilon_lower_bound: np.ndarray


@dataclass(frozen=True, eq=False)
class ClientLabelDPBound:
    """Result of :func:`client_update_label_dp_lower_bound` (nats at ``delta``).

    Attributes:
        epsilon_lower_bound: max(0, max_r LB[r]), the client's bound; ``counts``: n,
            num_classes; ``details``: best_index, noise_multiplier, clip_norm.
        epsilon_single_round: the upper bound of the round for one label, mu = 2 / z.
        expected_attack_accuracy: mean_r P0[r], the attack's expected accuracy on the release.
        detail: :class:`ClientLabelDPDetail`.
    """

    epsilon_lower_bound: AuditResult
    epsilon_single_round: AuditResult
    expected_attack_accuracy: AuditResult
    detail: ClientLabelDPDetail


def client_update_label_dp_lower_bound(
    probs: ArrayLike, labels: ArrayLike, gram_inv_diag: ArrayLike, *, update_scale: float, local_lr: float,
    noise_multiplier: float, clip_norm: float, delta: float, max_pairs: int | None = 16,
    flipped_clip_factors: ArrayLike | Callable[[np.ndarray, np.ndarray], ArrayLike] | None = None,
) -> ClientLabelDPBound:
    """Label-DP lower bound of one FedSGD client's update in a DP-FedAvg release.

    The argmin (K classes) or sign (sigmoid) attack of Yuan, Xue, Wang & Shen (2022) §3 eq. (1),
    Alg. 1 and 3 on the client's last-layer update; P0, P1 and LB are eq. (3)-(5) of
    docs/methods/label_dp_multiclass.md with the statistic of eq. (6) there and the replaced
    label's clip factor of eq. (7) (module docstring). Epsilons are in nats at ``delta``.

    Args:
        probs: [n, K] softmax probabilities (K >= 2) or [n] sigmoid probabilities of the
            client's examples under the round's global model.
        labels: [n] labels in 0..K-1 (or {0, 1}).
        gram_inv_diag: [n] v_r = [(Cm^T Cm)^{-1}]_rr of the last layer's inputs [x_r, 1]
            (``factorize_layer(features).gram_inv_diag``), > 0.
        update_scale: s = lr c > 0, read from the noise-free statistic (a_r = s (p_r - e_{y_r})).
        local_lr: the clients' learning rate lr >= s (up to 1e-3 relative: c = min(1, s / lr)).
        noise_multiplier: z > 0 of the release (noise std z C on the sum, in the units of the
            update).
        clip_norm: C > 0, the L2 clip norm of a client's whole update (DPFedAvg's ``clip_norm``).
        delta: delta of every epsilon, in (0, 1).
        max_pairs: evaluate the integrals for this many (example, label) pairs, ranked by a
            closed-form upper bound (None: every pair); any choice gives a valid lower bound.
        flipped_clip_factors: c'(r, y') in (0, 1], the clip factor of the update had example r
            carried label y' (column y_r: any value in (0, 1], unused): [n, K] ([n, 2] for a
            sigmoid logit), or a callable ``(rows [P], labels [P]) -> [P]`` asked only for the
            pairs evaluated (the ranking then assumes c' = c); None: unknown, the conservative
            form (at most log K).

    Returns:
        :class:`ClientLabelDPBound`: the client's ``epsilon_lower_bound``, the one-round upper
        bound ``epsilon_single_round`` (mu = 2 / z) and the expected attack accuracy as
        :class:`AuditResult`, and per-example ``p0``, ``p1``, ``epsilon_lower_bound`` [n] in
        ``detail``.

    Raises:
        ValueError: naming the argument: shapes, labels out of range, probabilities not in
        [0, 1] or not summing to 1, a scale, noise or delta out of range, s > lr, ``max_pairs``
        neither None nor an integer >= 1,
        ``flipped_clip_factors`` outside (0, 1], an update far larger than the clip norm.
    """
    z = check_positive(noise_multiplier, "noise_multiplier")
    c_max = check_positive(clip_norm, "clip_norm")
    lr = check_positive(local_lr, "local_lr")
    s = check_positive(update_scale, "update_scale")
    delta = check_delta(delta)
    max_pairs = check_optional_count(max_pairs, "max_pairs", minimum=1)
    single_round = float(gaussian_epsilon(z, delta, sensitivity=2.0))  # raises where mu = 2 / z overflows
    if s > lr * (1 + 1e-3):
        raise ValueError(f"update_scale = {s:.6g} exceeds local_lr = {lr:.6g}: the update is not -lr c mean "
                         "gradient with c <= 1 (a loss summed over examples, or another optimizer)")
    p = as_float_array(probs, "probs")
    if p.ndim not in (1, 2) or p.shape[0] < 1 or not np.isfinite(p).all():
        raise ValueError(f"probs must be a finite [n] or [n, K] array, got shape {p.shape}")
    n = p.shape[0]
    binary = p.ndim == 1
    if binary:
        if (p < 0).any() or (p > 1).any():
            raise ValueError("probs must lie in [0, 1] (sigmoid probabilities)")
        p = sigmoid_as_two_classes(p)
    p = softmax_probs(p, n)
    y = class_labels(labels, n, p.shape[1])
    v = as_float_array(gram_inv_diag, "gram_inv_diag", allow_int=True).reshape(-1)
    if v.shape != (n,) or not np.isfinite(v).all() or (v <= 0).any():
        raise ValueError(f"gram_inv_diag must be [{n}] finite values > 0, got shape {v.shape}")
    tau = n * z * c_max * np.sqrt(v)
    if s / float(tau.min()) > 1e12:  # standardised gaps beyond any quadrature (and any sane input)
        raise ValueError(f"update_scale / (n noise_multiplier clip_norm sqrt(gram_inv_diag)) = "
                         f"{s / float(tau.min()):.3g} is too large: the update is far larger than the clip norm")
    c = min(1.0, s / lr)
    flip, exact = _flipped(flipped_clip_factors, n, p.shape[1], c)
    pairs = pair_bounds(probs=p, y=y, clip=np.full(n, c), flip_clip=flip, scale=lr * SIGMOID_SCALE if binary else lr,
                        sd=tau, n_e=1.0, delta=delta, max_pairs=max_pairs, p0_for_all=True, exact_clip=exact)
    lb = pairs.epsilon_lower_bound
    value, best = batch_bound(lb)
    counts = {"n": n, "num_classes": int(p.shape[1])}
    p0 = pairs.p0
    return ClientLabelDPBound(
        epsilon_lower_bound=AuditResult(
            value=value, delta=delta, method="label_dp_sign_test" if binary else "label_dp_argmin_test",
            source=SOURCE, counts=counts,
            details={"best_index": best, "noise_multiplier": z, "clip_norm": c_max}),
        epsilon_single_round=AuditResult(value=single_round, delta=delta, method="gaussian_mechanism_single_round",
                                         source=SOURCE_SINGLE_ROUND, details={"mu": 2.0 / z}),
        expected_attack_accuracy=AuditResult(value=float(np.mean(p0)), method="mean_p0", source=SOURCE,
                                             counts=counts),
        detail=ClientLabelDPDetail(p0=p0, p1=pairs.p1, worst_labels=pairs.worst_labels, epsilon_lower_bound=lb),
    )


def _check_clip(c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if c.shape != shape or not np.isfinite(c).all() or (c <= 0).any() or (c > 1).any():
        raise ValueError(f"flipped_clip_factors must be {list(shape)} clip factors in (0, 1], got shape {c.shape}")
    return c


def _flipped(given: object, n: int, k: int, c: float) -> tuple[np.ndarray | None, ExactClip | None]:
    """(flip_clip [n, K] or None, exact_clip callable or None) for :func:`~.kclass.pair_bounds`."""
    if given is None:
        return None, None
    if callable(given):
        def exact(rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
            return _check_clip(as_float_array(given(rows, labels), "flipped_clip_factors").reshape(-1), rows.shape)

        return np.full((n, k), c), exact
    return _check_clip(as_float_array(given, "flipped_clip_factors"), (n, k)), None
