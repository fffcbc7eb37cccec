"""Label reconstruction from aggregated gradients (Yuan, Xue, Wang & Shen 2022, "Deep Gradient
Attacks with Strong DP-SGD Lower Bounds for Label Privacy").

Key identity (Yuan et al. 2022 eq. 1): for a binary model with logit Z_r, p_r =
sigmoid(Z_r) and log-loss, the batch-mean gradient of ANY weight vector W is

    G = (1/N) Cm a,   Cm = [dZ_1/dW ... dZ_N/dW] (dim(W) x N),   a_r = p_r - y_r,

so a = N (Cm^T Cm)^{-1} Cm^T G whenever Cm has full column rank (N <= dim(W)), and
y_r = 1 iff a_r < 0 (p_r is in (0, 1)). The attacks differ in how the adversary knows Cm:

* last hidden layer (Yuan et al. 2022 Alg. 1 and 3): dZ_r/dW^L = x~_r, the last hidden
  activations with a 1 appended for the bias -> :func:`reconstruct_labels`,
  :func:`label_attack_statistic`. Multi-class softmax (this project's extension,
  docs/methods/label_dp_multiclass.md):
  each row of N (Cm^T Cm)^{-1} Cm^T G^T is s_r - e_{y_r}, whose only negative entry is the true
  class -> argmin.
* second-last layer (Yuan et al. 2022 Alg. 4): for the weights into hidden unit J,
  dZ_r/dW = W_J^L U_r x_r^{L-1}, U_r = A'(Z_J^L[r]); the sign of W_J^L is unknown ->
  :func:`reconstruct_labels_second_last_layer`.
* malicious input layer (Yuan et al. 2022 Alg. 5): crafted features make every hidden
  value equal across the batch -> :func:`craft_malicious_features`,
  :func:`reconstruct_labels_malicious_input_layer`.

Scale and sign conventions. The observed gradient may be the MEAN of the batch (Lightning), the
Opacus privatized gradient (sum of clipped per-example gradients plus noise, divided by the
expected batch size), or a sum: these differ by a positive factor, and DP-SGD clipping multiplies
each a_r by its positive clip factor (Yuan et al. 2022 Alg. 2 step 2), so the SIGNS, and the labels, are unchanged.
A weight DELTA theta_new - theta_old = -lr G has the opposite sign: pass -delta to
:func:`reconstruct_labels` (Yuan et al. 2022 Alg. 1 writes I(... Delta W > 0) for that reason). The
sign-ambiguous attacks (Alg. 4, Alg. 5) accept either, the sign being resolved by the prior anyway.

All linear algebra runs in float64 through the R of a QR factorisation of Cm (no explicit Gram
inverse, Q never formed): Cm^T Cm = R^T R, (Cm^T Cm)^{-1} Cm^T G by the corrected semi-normal
equations (one refinement step), diag((Cm^T Cm)^{-1}) = row norms^2 of R^{-1}
(:class:`LayerFactorization`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from audit_callbacks.validation import check_count, check_flag, check_real

__all__ = [
    "LayerFactorization",
    "SignAmbiguousLabels",
    "craft_malicious_features",
    "factorize_layer",
    "label_attack_statistic",
    "reconstruct_labels",
    "reconstruct_labels_malicious_input_layer",
    "reconstruct_labels_second_last_layer",
]

Activation = Literal["relu", "sigmoid", "tanh", "identity"]


# --------------------------------------------------------------------------------------------
# Inputs and the core solve
# --------------------------------------------------------------------------------------------


def _as_float_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach()
    else:
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be a tensor or array of real numbers") from exc
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {t.dtype}")
    return t


def _eps_of(t: Tensor) -> float:
    """Machine epsilon of the dtype the data came in (float32 activations -> 1.2e-7)."""
    return float(torch.finfo(t.dtype).eps) if t.is_floating_point() else 2.0**-52


def _check_sign(value: Any, name: str) -> int | None:
    """None, or a known sign +1 / -1 as ``int`` (a bool or any other number is refused)."""
    if value is None:
        return None
    v = check_real(value, name)
    if v not in (-1.0, 1.0):
        raise ValueError(f"{name} must be None, +1 or -1, got {value!r}")
    return int(v)


def _check_finite(t: Tensor, name: str) -> None:
    # a sum is finite iff no entry is NaN or inf, unless it overflows: then the exact test
    # (torch.isfinite is ~15x slower than a sum on CPU, and this runs every training step)
    if t.numel() and not math.isfinite(float(t.sum())) and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or inf")


def _design(features: Tensor, with_bias: bool) -> Tensor:
    """x~ = [x, 1] ([N, p + 1]) when the layer has a bias, else x; float64."""
    x = features.to(torch.float64)
    if with_bias:
        x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)
    return x


@dataclass(frozen=True, eq=False)
class LayerFactorization:
    """R factor of the thin QR Cm = Q R of a layer's per-example derivatives, rank-checked.

    Cm = [dZ_1/dW ... dZ_N/dW] = ``design``^T (d x N). It is the expensive part shared by the
    last-layer attack (:func:`reconstruct_labels`, :func:`label_attack_statistic`) and the
    label-DP bounds (:func:`audit_callbacks.estimators.label_dp.label_dp_lower_bound` accepts its
    ``gram_inv_diag``), so callbacks that run both on one DP-SGD step factorise once. Build it
    with :func:`factorize_layer`. Q is never formed: solves use the corrected semi-normal
    equations (R^T R x = Cm^T b, then one refinement step on the residual; Bjorck 1987), whose
    error is that of the QR solve for the condition numbers the rank test lets through.

    Attributes:
        design: [N, d] float64, row r = dZ_r/dW (= x~_r for the last layer).
        r: [N, N] float64, upper triangular, nonzero diagonal (Cm^T Cm = R^T R).
        n: N, the number of examples (rows of ``features``).
        d: d, the number of coefficients (layer inputs, plus 1 with a bias).
        has_bias: whether a column of ones was appended to the features.
        q: [d, N] Q, formed only when Cm is ill-conditioned (kappa(R)^2 * 2^-52 > 1e-8), where
            the semi-normal equations would lose accuracy; None otherwise.

    Source: Yuan et al. 2022 eq. 1 and Alg. 2 (the factor (C^T C)^{-1}).
    """

    design: Tensor
    r: Tensor
    n: int
    d: int
    has_bias: bool
    q: Tensor | None = None

    def _normal_solve(self, y: Tensor) -> Tensor:
        """(R^T R)^{-1} y for y [N, K]."""
        z = torch.linalg.solve_triangular(self.r.T, y, upper=False)
        return torch.linalg.solve_triangular(self.r, z, upper=True)

    def solve(self, rhs: Tensor) -> Tensor:
        """(Cm^T Cm)^{-1} Cm^T rhs: [d, K] float64 -> [N, K] float64 (least squares in Cm)."""
        if self.q is not None:  # ill-conditioned: the Q-based solve
            return torch.linalg.solve_triangular(self.r, self.q.T @ rhs, upper=True)
        coef = self._normal_solve(self.design @ rhs)
        residual = rhs - self.design.T @ coef
        return coef + self._normal_solve(self.design @ residual)

    @functools.cached_property
    def gram_inv_diag(self) -> Tensor:
        """[N] float64, diag((Cm^T Cm)^{-1}) = row norms^2 of R^{-1} (Yuan et al. 2022 Alg. 2), > 0."""
        eye = torch.eye(self.n, dtype=self.r.dtype, device=self.r.device)
        r_inv = torch.linalg.solve_triangular(self.r, eye, upper=True)
        return (r_inv * r_inv).sum(dim=1)


def _factorize(design: Tensor, eps: float, what: str, has_bias: bool) -> LayerFactorization:
    """Thin QR of Cm = design^T ([N, d] float64) with the rank test.

    Raises:
        ValueError: N > d, or Cm numerically rank deficient (smallest |R_rr| <=
            max(N, d) * eps * largest, eps = the machine epsilon of the input dtype; the same
            test as :func:`audit_callbacks.estimators.label_dp.last_layer_gram_inverse_diag`).
    """
    n, d = design.shape
    if n > d:
        raise ValueError(
            f"the batch has N = {n} examples but the attacked layer gives only d = {d} "
            f"equations ({what}), so Cm^T Cm is singular: use a batch of at most {d} examples "
            "or a wider layer"
        )
    r = torch.linalg.qr(design.T, mode="r")[1]  # Cm [d, N] = Q [d, N] R [N, N], Q not formed
    rd = r.diagonal().abs()
    rmax, rmin = float(rd.max()), float(rd.min())
    tol = max(n, d) * eps * rmax
    if rmax == 0.0 or rmin <= tol:
        raise ValueError(
            "the Gram matrix Cm^T Cm of the per-example derivatives is rank deficient "
            f"(smallest |R_rr| {rmin:.3g}, tolerance {tol:.3g}): duplicate "
            "examples, or ReLU units that are zero for the whole batch, which lower the usable "
            "width below the batch size; use a smaller batch or a wider layer"
        )
    q = None
    if (rmax / rmin) ** 2 * 2.0**-52 > 1e-8:
        q, r = torch.linalg.qr(design.T, mode="reduced")
    return LayerFactorization(design=design, r=r, n=n, d=d, has_bias=has_bias, q=q)


def _what(p: int, bias: bool, unit: str = "layer inputs") -> str:
    return f"{p} {unit}" + (" + 1 bias" if bias else "")


def factorize_layer(features: Tensor, *, bias: bool = True) -> LayerFactorization:
    """Factorise the last-layer attack's design once: Cm = [x~_1 ... x~_N] = Q R.

    Args:
        features: [N, p] inputs of the attacked linear layer (any float dtype/device); the rank
            tolerance uses the machine epsilon of their dtype.
        bias: the layer has a bias (append 1 to every row: x~ = [x, 1]), default True.

    Returns:
        :class:`LayerFactorization` (float64, on the device of ``features``); pass it as
        ``factorization=`` to :func:`reconstruct_labels` / :func:`label_attack_statistic`, and
        its ``gram_inv_diag`` to ``label_dp_lower_bound``.

    Raises:
        ValueError: not 2-D, empty, NaN/inf, N > p (+1 with bias) or a rank-deficient Gram
            matrix (use a smaller batch or a wider layer); ``bias`` not a bool.

    Source: Yuan et al. 2022 eq. 1, Alg. 1-3.
    """
    bias = check_flag(bias, "bias")
    x = _check_features(features)
    return _factorize(_design(x, bias), _eps_of(x), _what(x.shape[1], bias), bias)


def _qr_solve(design: Tensor, rhs: Tensor, eps: float, what: str) -> Tensor:
    """(Cm^T Cm)^{-1} Cm^T rhs for Cm = design^T ([N, d] float64), rhs [d, K] -> [N, K]."""
    return _factorize(design, eps, what, has_bias=False).solve(rhs)


def _grad_matrix(
    weight_grad: Tensor, bias_grad: Any, p: int, names: tuple[str, str] = ("weight_grad", "bias_grad"),
) -> Tensor:
    """Stack [W_grad, b_grad] into [K, d] float64 (d = p or p + 1); errors name ``names``."""
    wname, bname = names
    w = _as_float_tensor(weight_grad, wname)
    if w.ndim == 1:
        w = w.unsqueeze(0)
    if w.ndim != 2 or w.shape[1] != p:
        raise ValueError(
            f"{wname} must have shape [K, {p}] (K logits x layer inputs), got "
            f"{tuple(weight_grad.shape) if isinstance(weight_grad, Tensor) else w.shape}"
        )
    _check_finite(w, wname)
    w = w.to(torch.float64)
    if bias_grad is None:
        return w
    b = _as_float_tensor(bias_grad, bname).to(w.device)
    b = b.reshape(-1)
    if b.shape[0] != w.shape[0]:
        raise ValueError(f"{bname} must have shape [{w.shape[0]}], got {tuple(b.shape)}")
    _check_finite(b, bname)
    return torch.cat([w, b.to(torch.float64).unsqueeze(1)], dim=1)


def _check_features(features: Any, name: str = "features") -> Tensor:
    x = _as_float_tensor(features, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [N, p], got shape {tuple(x.shape)}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    _check_finite(x, name)
    return x


# --------------------------------------------------------------------------------------------
# Last hidden layer (Yuan et al. 2022 Alg. 1, 3; multi-class: docs/methods/label_dp_multiclass.md)
# --------------------------------------------------------------------------------------------


def label_attack_statistic(
    features: Tensor, weight_grad: Tensor, bias_grad: Tensor | None = None, *,
    factorization: LayerFactorization | None = None,
) -> tuple[Tensor, Tensor]:
    """The last-layer attack statistic A = N (Cm^T Cm)^{-1} Cm^T G^T and diag((Cm^T Cm)^{-1}).

    Noise-free and unclipped, A[r] = p_r - y_r (binary) or s_r - e_{y_r} (softmax); with
    clipping each row is multiplied by its clip factor (> 0); with the Opacus mean gradient by
    N / expected_batch_size (> 0). With Gaussian noise of sd s per coordinate on G, the noise on
    A[r, k] has variance N^2 s^2 gram_inv_diag[r] (Yuan et al. 2022 Alg. 2) -- what the label-DP bounds of
    :mod:`audit_callbacks.estimators.label_dp` use.

    Args:
        features: [N, p] inputs of the attacked linear layer (per-example last hidden
            activations, the "x" of ``nn.Linear``), any float dtype/device.
        weight_grad: [K, p] gradient of that layer's weight (K = 1: single sigmoid logit;
            K classes: softmax), or [p] for K = 1. A batch mean, sum or Opacus privatized
            gradient; NOT a weight delta (pass -delta).
        bias_grad: [K] gradient of the layer's bias, or None for a layer without bias.
        factorization: :func:`factorize_layer` of these ``features`` (with ``bias`` = whether
            ``bias_grad`` is given), to reuse one factorisation; None factorises here.

    Returns:
        ``(a_hat, gram_inv_diag)``: ``a_hat`` float64 [N] when K = 1, [N, K] when K > 1;
        ``gram_inv_diag`` float64 [N] = [(Cm^T Cm)^{-1}]_rr with Cm = [x~_1 ... x~_N]
        (x~ = [x, 1] with a bias). Both on the device of ``features``.

    Raises:
        ValueError: shapes inconsistent, NaN/inf, or N > p (+1 with bias) or a rank-deficient
            Gram matrix (the message says to use a smaller batch or a wider layer); a
            ``factorization`` of another shape.

    Source: Yuan et al. 2022 eq. 1, Alg. 1 and Alg. 3 (App. A.1.1), Alg. 2 (the variance factor).
    """
    a_hat, f = _statistic(features, weight_grad, bias_grad, factorization)
    return a_hat, f.gram_inv_diag


def _statistic(
    features: Tensor, weight_grad: Tensor, bias_grad: Tensor | None,
    factorization: LayerFactorization | None,
) -> tuple[Tensor, LayerFactorization]:
    if factorization is None:
        factorization = factorize_layer(features, bias=bias_grad is not None)
    else:
        _check_factorization(factorization, features, bias_grad is not None)
    n, p = factorization.n, factorization.d - factorization.has_bias
    gmat = _grad_matrix(weight_grad, bias_grad, p).to(factorization.r.device)
    a_hat = n * factorization.solve(gmat.T)
    if a_hat.shape[1] == 1:
        a_hat = a_hat[:, 0]
    return a_hat, factorization


def _check_factorization(f: LayerFactorization, features: Tensor, bias: bool) -> None:
    if not isinstance(f, LayerFactorization):
        raise TypeError(f"factorization must be a LayerFactorization (factorize_layer), got {type(f).__name__}")
    shape = tuple(features.shape) if hasattr(features, "shape") else None
    if f.has_bias != bias or shape is None or len(shape) != 2 or shape != (f.n, f.d - f.has_bias):
        raise ValueError(
            f"factorization is of a [{f.n}, {f.d - f.has_bias}] design with bias={f.has_bias}, "
            f"but features have shape {shape} and bias={bias}: factorise these features"
        )


def reconstruct_labels(
    features: Tensor, weight_grad: Tensor, bias_grad: Tensor | None = None, *,
    factorization: LayerFactorization | None = None,
) -> Tensor:
    """Reconstruct every label of a batch from the last layer's aggregated gradient.

    Binary (K = 1, sigmoid logit): y_r = 1 iff a_hat_r < 0. Multi-class (K >= 2, softmax):
    y_r = argmin_k A_hat[r, k]. Exact (100%) without noise, also after DP-SGD clipping, and for
    any positive scaling of the gradient (mean, sum, Opacus' division by the expected batch
    size). With noise see :func:`label_attack_statistic` and
    :func:`audit_callbacks.estimators.label_dp.label_dp_lower_bound`.

    Args:
        features: [N, p] inputs of the attacked linear layer (per-example activations).
        weight_grad: [K, p] (or [p]) gradient of its weight; not a weight delta (pass -delta).
        bias_grad: [K] gradient of its bias, or None.
        factorization: :func:`factorize_layer` of ``features`` (reused; None: factorise here).

    Returns:
        int64 [N] labels in {0, 1} (K = 1) or {0, ..., K - 1}, on the device of ``features``.

    Raises:
        ValueError: as :func:`label_attack_statistic` (notably N > p (+1 with bias): use a
            smaller batch or a wider layer).

    Source: Yuan et al. 2022 Alg. 1 and Alg. 3 (binary).

    Example:
        >>> import torch
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> p = torch.tensor([0.3, 0.6]); y = torch.tensor([1.0, 0.0])
        >>> g_w = ((p - y)[:, None] * x).mean(0, keepdim=True)  # [1, 2] mean gradient
        >>> reconstruct_labels(x, g_w, (p - y).mean().reshape(1)).tolist()
        [1, 0]
    """
    a_hat, _ = _statistic(features, weight_grad, bias_grad, factorization)
    if a_hat.ndim == 1:
        return (a_hat < 0).to(torch.int64)
    return torch.argmin(a_hat, dim=1).to(torch.int64)


# --------------------------------------------------------------------------------------------
# Sign-ambiguous attacks (Yuan et al. 2022 Alg. 4, 5)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignAmbiguousLabels:
    """Labels from an attack that knows Cm only up to an unknown scalar sign (Yuan et al. 2022 Alg. 4, 5).

    Attributes:
        labels: int64 [N]; 0/1 for determined examples, -1 where ``undetermined``.
        undetermined: bool [N]; True where the equation system says nothing about the example
            (ReLU with U_r = 0 in Alg. 4; every example when the observed gradient is 0).
        statistic: float64 [N], b = N (X^T X)^{-1} X^T G over the determined examples, with
            X = Cm / (unknown scalar), so b_r = scalar * (p_r - y_r) (times the clip factor);
            0.0 for undetermined examples.
        complemented: True when the output is 1 - I(b < 0) (the unknown scalar taken
            negative), False for I(b < 0).
        sign_ambiguous: True when the prior could not pick the sign (both candidates have a
            positive rate of exactly 0.5, or nothing is determined); I(b < 0) is returned.
        sign_source: "prior" (the positive-rate prior chose) or "given" (the caller's sign).
    """

    labels: Tensor
    undetermined: Tensor
    statistic: Tensor
    complemented: bool
    sign_ambiguous: bool
    sign_source: str

    @property
    def num_determined(self) -> int:
        """Number of examples with a reconstructed label."""
        return int((~self.undetermined).sum())


def _resolve_sign(
    stat: Tensor,
    determined: Tensor,
    positive_rate_below_half: bool,
    known_sign: int | None,
) -> SignAmbiguousLabels:
    """Pick I(b < 0) or its complement on the determined examples (Yuan et al. 2022 Alg. 4)."""
    n = stat.shape[0]
    candidate = (stat < 0).to(torch.int64)
    num_det = int(determined.sum())
    if known_sign is not None:
        if known_sign not in (-1, 1):
            raise ValueError(f"the known sign must be +1 or -1, got {known_sign!r}")
        complemented, ambiguous, source = known_sign < 0, False, "given"
    elif num_det == 0:
        complemented, ambiguous, source = False, True, "prior"
    else:
        rate = float(candidate[determined].sum()) / num_det
        if rate == 0.5:
            complemented, ambiguous = False, True
        else:
            ambiguous = False
            complemented = (rate < 0.5) != positive_rate_below_half
        source = "prior"
    labels = 1 - candidate if complemented else candidate
    labels = torch.where(
        determined, labels, torch.full((n,), -1, dtype=torch.int64, device=stat.device)
    )
    return SignAmbiguousLabels(
        labels=labels,
        undetermined=~determined,
        statistic=torch.where(determined, stat, torch.zeros_like(stat)),
        complemented=bool(complemented),
        sign_ambiguous=bool(ambiguous),
        sign_source=source,
    )


def _activation_derivative(
    z: Tensor, activation: Activation | Callable[[Tensor], Tensor]
) -> Tensor:
    if callable(activation):
        u = activation(z)
        if not isinstance(u, Tensor) or u.shape != z.shape:
            raise ValueError(
                "the activation-derivative callable must return a tensor shaped like Z"
            )
        return u.to(torch.float64)
    if activation == "relu":
        return (z > 0).to(torch.float64)  # torch's ReLU backward uses A'(0) = 0
    if activation == "sigmoid":
        s = torch.sigmoid(z)
        return s * (1.0 - s)
    if activation == "tanh":
        return 1.0 - torch.tanh(z) ** 2
    if activation == "identity":
        return torch.ones_like(z)
    raise ValueError(
        f"activation must be 'relu', 'sigmoid', 'tanh', 'identity' or a callable returning "
        f"A'(Z), got {activation!r}"
    )


def _vector(x: Any, name: str, n: int) -> Tensor:
    t = _as_float_tensor(x, name).reshape(-1)
    if t.shape[0] != n:
        raise ValueError(f"{name} must have {n} entries, got {t.shape[0]}")
    _check_finite(t, name)
    return t.to(torch.float64)


def reconstruct_labels_second_last_layer(
    inputs: Tensor,
    unit_weight_grad: Tensor,
    *,
    pre_activations: Tensor | None = None,
    activation_derivative: Tensor | None = None,
    activation: Activation | Callable[[Tensor], Tensor] = "relu",
    unit_bias_grad: Tensor | float | None = None,
    positive_rate_below_half: bool = True,
    output_weight_sign: int | None = None,
) -> SignAmbiguousLabels:
    """Second-last layer attack (Yuan et al. 2022 Alg. 4, App. A.1.2), binary logit.

    The adversary sees the gradient of the weights W_J (and optionally bias) INTO hidden unit J
    of the last hidden layer, and the inputs x^{L-1} of that layer. dZ_r/dW_J =
    W_J^L U_r x_r^{L-1} with U_r = A'(Z_J^L[r]); W_J^L (the output weight of unit J) is not
    seen, so the solve gives b_r = W_J^L (p_r - y_r) (times positive factors) and the labels
    are I(b < 0) if W_J^L > 0, else its complement. The sign is resolved with the prior of the
    paper: the candidate whose positive rate (over the determined examples) is below 0.5 when
    ``positive_rate_below_half`` (rare positives: tumours, fraud, loan default), above 0.5
    otherwise; ``output_weight_sign`` overrides the prior when the sign is known. If the batch's
    actual positive rate is on the other side of 0.5 than the prior says, EVERY determined label
    is flipped: the prior is an assumption of the attack, not something it can check.

    Examples with U_r = 0 (ReLU units that are off) contribute nothing to the gradient: they
    are reported as ``undetermined`` (label -1), never guessed; the solve uses only the others,
    so the batch may hold more examples than p' (+1) as long as the determined ones fit.

    Args:
        inputs: [N, p'] the layer's inputs x^{L-1} (activations of the second-last layer).
        unit_weight_grad: [p'] gradient of the weights into unit J (a mean, sum, Opacus
            gradient or a weight delta: the unknown sign absorbs -lr).
        pre_activations: [N] Z_J^L[r], the pre-activation of unit J; or
        activation_derivative: [N] U_r = A'(Z_J^L[r]) directly (exactly one of the two).
        activation: the hidden activation for ``pre_activations``: "relu" (A'(0) = 0, as
            torch), "sigmoid", "tanh", "identity", or a callable Z -> A'(Z).
        unit_bias_grad: gradient of unit J's bias (scalar), or None.
        positive_rate_below_half: the prior (True: positives are the minority).
        output_weight_sign: +1 / -1 if the sign of W_J^L is known, else None (use the prior).

    Returns:
        :class:`SignAmbiguousLabels` (labels int64 [N] with -1 for undetermined examples).

    Raises:
        ValueError: neither or both of ``pre_activations`` / ``activation_derivative``; shapes
            inconsistent; NaN/inf; more determined examples than p' (+1 with bias) or a
            rank-deficient system (use a smaller batch or a wider layer);
            ``positive_rate_below_half`` not a bool; ``output_weight_sign`` not None, +1 or -1.

    Source: Yuan et al. 2022 Alg. 4 and eq. 4.
    """
    positive_rate_below_half = check_flag(positive_rate_below_half, "positive_rate_below_half")
    output_weight_sign = _check_sign(output_weight_sign, "output_weight_sign")
    x = _check_features(inputs, "inputs")
    n, p = x.shape
    if (pre_activations is None) == (activation_derivative is None):
        raise ValueError(
            "pass exactly one of pre_activations (Z_J^L) and activation_derivative (U)"
        )
    if activation_derivative is not None:
        u = _vector(activation_derivative, "activation_derivative", n).to(x.device)
    else:
        z = _vector(pre_activations, "pre_activations", n).to(x.device)
        u = _activation_derivative(z, activation)
        _check_finite(u, "A'(Z)")
    gmat = _grad_matrix(unit_weight_grad, unit_bias_grad, p,
                        ("unit_weight_grad", "unit_bias_grad")).to(x.device)
    if gmat.shape[0] != 1:
        raise ValueError("unit_weight_grad must be the [p'] gradient of ONE hidden unit's weights")
    determined = u != 0
    stat = torch.zeros(n, dtype=torch.float64, device=x.device)
    num_det = int(determined.sum())
    if num_det > 0:
        design = _design(x, unit_bias_grad is not None) * u.unsqueeze(1)
        what = _what(p, unit_bias_grad is not None, "inputs of the layer")
        coef = _qr_solve(design[determined], gmat.T, _eps_of(x), what)
        stat[determined] = num_det * coef[:, 0]
    return _resolve_sign(stat, determined, positive_rate_below_half, output_weight_sign)


def craft_malicious_features(
    first_layer_weight: Tensor,
    batch_size: int,
    *,
    target: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Features for the malicious input-layer attack (Yuan et al. 2022 Alg. 5 steps 1-3).

    Returns N linearly independent solutions x_r of W x = V (W: the first layer's weight,
    [p2, p1]): x_r = x_0 + n_r with x_0 = W^+ V (orthogonal to null(W), non-zero) and n_r the
    first N vectors of an orthonormal basis of null(W) (from the SVD). Every crafted example
    then has the same first-layer pre-activation W x_r + B = V + B, hence the same value of
    every hidden unit and of the output p; the input-layer gradient of unit J becomes
    g_J X^T (p - y) / N with one unknown scalar g_J (Yuan et al. 2022 Alg. 5).

    Args:
        first_layer_weight: W, [p2, p1] (``nn.Linear(p1, p2).weight``).
        batch_size: N, 1 <= N <= p1 - rank(W) (= p1 - p2 for a generic W).
        target: V, [p2], must lie in the range of W; default: W u for a standard normal u
            drawn with ``generator``.
        generator: torch.Generator for V (CPU).

    Returns:
        float64 [N, p1] features on the device of W (cast to the model's dtype before use).

    Raises:
        ValueError: W not 2-D or not finite; ``batch_size`` not an integer >= 1; N > p1 -
            rank(W) ("pick a smaller batch or a larger feature size"); V not in the range of W,
            or V = 0 (the crafted rows would not be linearly independent); ``generator`` not a
            ``torch.Generator``.

    Source: Yuan et al. 2022 Alg. 5 and App. A.1.3.
    """
    w = _as_float_tensor(first_layer_weight, "first_layer_weight")
    if w.ndim != 2:
        raise ValueError(f"first_layer_weight must be 2-D [p2, p1], got {tuple(w.shape)}")
    _check_finite(w, "first_layer_weight")
    w64 = w.to(torch.float64)
    p2, p1 = w64.shape
    batch_size = check_count(batch_size, "batch_size", minimum=1)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
    u_w, s, vh = torch.linalg.svd(w64, full_matrices=True)
    tol = max(p1, p2) * _eps_of(w) * (float(s[0]) if s.numel() else 0.0)
    rank = int((s > tol).sum())
    null_dim = p1 - rank
    if batch_size > null_dim:
        raise ValueError(
            f"batch_size N = {batch_size} exceeds the dimension p1 - rank(W) = {p1} - {rank} = "
            f"{null_dim} of the solution space of W x = V (Alg. 5 needs N <= p1 - p2): pick a "
            "smaller batch or a larger feature size p1"
        )
    if target is None:
        u = torch.randn(p1, generator=generator, dtype=torch.float64).to(w64.device)
        v = w64 @ u
    else:
        v = _vector(target, "target", p2).to(w64.device)
    # minimum-norm solution x_0 = W^+ V from the SVD (any device, no lstsq driver limits)
    x0 = vh[:rank].T @ ((u_w[:, :rank].T @ v) / s[:rank])
    v_norm = float(torch.linalg.vector_norm(v))
    if v_norm == 0.0 or float(torch.linalg.vector_norm(x0)) == 0.0:
        raise ValueError("target V must be non-zero (x_0 = 0 makes the crafted rows dependent)")
    resid = float(torch.linalg.vector_norm(w64 @ x0 - v))
    if resid > 1e-8 * max(1.0, v_norm):
        raise ValueError("target V is not in the range of W: W x = V has no solution")
    null_basis = vh[rank : rank + batch_size]  # [N, p1], orthonormal, orthogonal to x0
    return x0.unsqueeze(0) + null_basis


def reconstruct_labels_malicious_input_layer(
    features: Tensor,
    unit_weight_grad: Tensor,
    *,
    unit_bias_grad: Tensor | float | None = None,
    positive_rate_below_half: bool = True,
    unit_sign: int | None = None,
) -> SignAmbiguousLabels:
    """Labels from the input-layer weights of one hidden unit (Yuan et al. 2022 Alg. 5 step 4).

    With features from :func:`craft_malicious_features`, the gradient of the weights into
    first-layer unit J is g_J X^T (p - y) / N (one unknown scalar g_J, the same for every
    example), so b = N (X^T X)^{-1} X^T G = g_J (p - y) and the labels are I(b < 0) or the
    complement, resolved with the positive-rate prior as in
    :func:`reconstruct_labels_second_last_layer`. Use a smooth activation (the paper's malicious
    server avoids ReLU): if unit J is off, g_J = 0 and every example is ``undetermined``.

    Args:
        features: [N, p1] the crafted features actually fed to the model.
        unit_weight_grad: [p1] gradient (or weight delta, the sign being unknown anyway) of the
            weights into unit J.
        unit_bias_grad: gradient of unit J's bias, or None.
        positive_rate_below_half: the prior (True: positives are the minority).
        unit_sign: +1 / -1 if the sign of g_J is known, else None.

    Returns:
        :class:`SignAmbiguousLabels`; all ``undetermined`` when the gradient is exactly zero.

    Raises:
        ValueError: shapes inconsistent, NaN/inf, N > p1 (+1) or rank-deficient features;
            ``positive_rate_below_half`` not a bool; ``unit_sign`` not None, +1 or -1.

    Source: Yuan et al. 2022 Alg. 5, eq. 6-7.

    Example (worked, as in tests/attacks/test_label_reconstruction.py):
        >>> import torch
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Linear(8, 3), nn.Tanh(), nn.Linear(3, 1)).double()
        >>> x = craft_malicious_features(model[0].weight, 5, generator=torch.Generator().manual_seed(1))
        >>> x.shape
        torch.Size([5, 8])
        >>> h = model[0](x)  # every row of the first hidden layer is the same
        >>> bool(torch.allclose(h, h[:1].expand_as(h)))
        True
        >>> y = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])  # 2 positives of 5: the prior holds
        >>> loss = nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y)
        >>> loss.backward()
        >>> out = reconstruct_labels_malicious_input_layer(x, model[0].weight.grad[0])
        >>> out.labels.tolist()
        [0, 1, 0, 0, 1]
    """
    positive_rate_below_half = check_flag(positive_rate_below_half, "positive_rate_below_half")
    unit_sign = _check_sign(unit_sign, "unit_sign")
    x = _check_features(features)
    n, p = x.shape
    gmat = _grad_matrix(unit_weight_grad, unit_bias_grad, p,
                        ("unit_weight_grad", "unit_bias_grad")).to(x.device)
    if gmat.shape[0] != 1:
        raise ValueError("unit_weight_grad must be the [p1] gradient of ONE hidden unit's weights")
    if not bool((gmat != 0).any()):
        determined = torch.zeros(n, dtype=torch.bool, device=x.device)
        stat = torch.zeros(n, dtype=torch.float64, device=x.device)
        return _resolve_sign(stat, determined, positive_rate_below_half, unit_sign)
    design = _design(x, unit_bias_grad is not None)
    what = _what(p, unit_bias_grad is not None, "input features")
    coef = _qr_solve(design, gmat.T, _eps_of(x), what)
    stat = n * coef[:, 0]
    determined = torch.ones(n, dtype=torch.bool, device=x.device)
    return _resolve_sign(stat, determined, positive_rate_below_half, unit_sign)
