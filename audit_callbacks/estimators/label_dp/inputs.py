"""Inputs of the label-DP bounds: array checks, the attacked layer's design matrix, its Gram
inverse diagonal, and the clip factors.

Every function here raises ``ValueError`` naming the argument (``features``, ``probs``,
``labels``, ``grad_norms``, ``gram_inv_diag``...), never ``TypeError`` from a conversion.
Tensors of any float dtype are accepted (detached, moved to the CPU, widened to float64).

Notation (Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks with Strong DP-SGD Lower Bounds
for Label Privacy", §3 and Alg. 2): x_r are the inputs of the attacked linear layer (the last
hidden activations), x~_r = [x_r, 1] with a bias, Cm = [x~_1 ... x~_N] (d x N) and
v_r = [(Cm^T Cm)^{-1}]_rr; the attack statistic of row r has noise variance proportional to v_r.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import solve_triangular

from audit_callbacks.validation import check_flag, to_numpy

__all__ = [
    "GRAD_NORM_RTOL",
    "as_features",
    "as_vector",
    "binary_labels",
    "check_binary_probs",
    "check_grad_norms",
    "class_labels",
    "clip_factors",
    "design_matrix",
    "gram_inverse_diag",
    "last_layer_gram_inverse_diag",
    "resolve_gram_inverse_diag",
    "softmax_probs",
    "whole_grad_norms",
]

#: Relative slack of the check ``||g_r|| >= ||last-layer part of g_r||`` (float32 gradients).
GRAD_NORM_RTOL = 1e-4


# --------------------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------------------


def _real(raw: np.ndarray, name: str) -> None:
    """Raise unless ``raw`` holds real numbers (bool, complex, object and str are refused)."""
    if raw.dtype == bool or not np.issubdtype(raw.dtype, np.number):
        raise ValueError(f"{name} must be a real array, got dtype {raw.dtype}")
    if np.issubdtype(raw.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real-valued")


def as_features(x: ArrayLike, name: str = "features") -> tuple[np.ndarray, float]:
    """A finite, non-empty 2-D float64 array [N, p] and the machine epsilon of the input dtype
    (at least float64's), which scales the rank tolerance of :func:`gram_inverse_diag`."""
    raw = to_numpy(x, name)
    _real(raw, name)
    eps = float(np.finfo(raw.dtype).eps) if np.issubdtype(raw.dtype, np.floating) else 2.0**-52
    arr = raw.astype(float, copy=False)  # only read
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [N, p], got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr, max(eps, 2.0**-52)


def as_vector(x: ArrayLike, name: str, n: int) -> np.ndarray:
    """A finite float64 vector of shape [n] (one entry per row of the features)."""
    arr = to_numpy(x, name)
    _real(arr, name)
    arr = arr.astype(float).reshape(-1) if arr.ndim <= 1 else arr.astype(float)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape [{n}] (one per row of features), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def whole_grad_norms(grad_norms: ArrayLike, n: int) -> np.ndarray:
    """[n] norms of the whole per-example gradients (over all parameters, before clipping), >= 0."""
    g = as_vector(grad_norms, "grad_norms", n)
    if (g < 0).any():
        raise ValueError("grad_norms must be >= 0")
    return g


def check_grad_norms(g: np.ndarray, layer_part: np.ndarray, formula: str) -> None:
    """Raise when a whole-gradient norm is below its last-layer part (up to
    :data:`GRAD_NORM_RTOL`): this catches layer-only or post-clip norms passed by mistake.

    Args:
        g: [N] whole-gradient norms. layer_part: [N] the norms of their last-layer parts.
        formula: how the last-layer part was computed, for the message.
    """
    if (bad := g < layer_part * (1.0 - GRAD_NORM_RTOL)).any():
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"grad_norms[{r}] = {g[r]:.6g} is smaller than the norm of that example's last-layer "
            f"gradient {formula} = {layer_part[r]:.6g} (kappa = grad_scale): pass the norm of the "
            "whole per-example gradient over all parameters, before clipping")


# --------------------------------------------------------------------------------------------
# Probabilities and labels
# --------------------------------------------------------------------------------------------


def check_binary_probs(p: np.ndarray) -> None:
    """Sigmoid outputs must lie strictly inside (0, 1): at p_r = y_r the observed gradient is 0
    and the flipped label's gradient norm cannot be recovered from ``grad_norms``."""
    if (p <= 0.0).any() or (p >= 1.0).any():
        raise ValueError(
            "probs must lie strictly inside (0, 1): at p_r = y_r the observed gradient is 0 and "
            "the flipped-label gradient norm cannot be recovered from grad_norms (compute the "
            "sigmoid in float64 from the logits to avoid saturation)"
        )


def binary_labels(labels: ArrayLike, n: int) -> np.ndarray:
    """[n] labels in {0, 1} as float64 (booleans accepted)."""
    raw = to_numpy(labels, "labels")
    y = as_vector(raw.astype(float) if raw.dtype == bool else raw, "labels", n)
    if not ((y == 0.0) | (y == 1.0)).all():
        raise ValueError("labels must be binary, every value 0 or 1")
    return y


def softmax_probs(probs: np.ndarray, n: int) -> np.ndarray:
    """[n, K] softmax probabilities (K >= 2): finite, in [0, 1], rows summing to 1 (1e-4)."""
    _real(probs, "probs")
    p = probs.astype(float)
    if p.ndim != 2 or p.shape[0] != n:
        raise ValueError(f"probs must have shape [{n}, K] (one row per row of features), got {p.shape}")
    if p.shape[1] < 2:
        raise ValueError(f"probs must have K >= 2 columns (softmax), got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("probs contains NaN or inf")
    if (p < 0.0).any() or (p > 1.0).any():
        raise ValueError("probs must lie in [0, 1] (softmax probabilities)")
    if (np.abs(p.sum(axis=1) - 1.0) > 1e-4).any():
        raise ValueError("probs rows must sum to 1 (softmax probabilities), up to 1e-4")
    return p


def class_labels(labels: ArrayLike, n: int, k: int) -> np.ndarray:
    """[n] integer labels in 0..K-1 as int64 (floats equal to integers accepted)."""
    y = to_numpy(labels, "labels")
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number) or np.issubdtype(y.dtype, np.complexfloating):
        raise ValueError(f"labels must be integers in 0..{k - 1}, got dtype {y.dtype}")
    flat = y.reshape(-1)
    if flat.shape[0] != n:
        raise ValueError(f"labels must have shape [{n}], got {y.shape}")
    if not np.isfinite(flat).all() or (flat != np.round(flat)).any() or (flat < 0).any() or (flat >= k).any():
        raise ValueError(f"labels must be integers in 0..{k - 1} (K = {k} columns of probs)")
    return flat.astype(np.int64)


# --------------------------------------------------------------------------------------------
# The attacked layer: design matrix and Gram inverse diagonal
# --------------------------------------------------------------------------------------------


def design_matrix(features: np.ndarray, bias: bool) -> np.ndarray:
    """x~_r = [x_r, 1] (``bias``) or x_r; shape [N, d]."""
    if bias:
        return np.concatenate([features, np.ones((features.shape[0], 1))], axis=1)
    return features


def gram_inverse_diag(xt: np.ndarray, eps: float) -> np.ndarray:
    """diag((Cm^T Cm)^{-1}) [N], with Cm = xt^T.

    Via the R of the thin QR Cm = Q R (R upper triangular N x N, Q never formed):
    (Cm^T Cm)^{-1} = R^{-1} R^{-T}, so the diagonal is the row sums of (R^{-1})^2 -- no Gram
    matrix is formed (its condition number is the square of Cm's).

    Raises:
        ValueError: N > d, or Cm numerically rank deficient (smallest |R_rr| <= max(N, d) *
            eps * largest, eps = the machine epsilon of the input dtype; the SVD test of the
            same form agrees on every case in the tests, at a fraction of the cost).
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


def resolve_gram_inverse_diag(given: ArrayLike | None, xt: np.ndarray, eps: float) -> np.ndarray:
    """v_r: the caller's precomputed diagonal (checked: [N], finite, > 0, and N <= d), or
    :func:`gram_inverse_diag` of ``xt`` when ``given`` is None."""
    n, d = xt.shape
    if given is None:
        return gram_inverse_diag(xt, eps)
    v = as_vector(given, "gram_inv_diag", n)
    if d < n:
        gram_inverse_diag(xt, eps)  # raises the N > d error
    if (v <= 0).any():
        raise ValueError("gram_inv_diag must be > 0 (diagonal of the inverse of a positive definite matrix)")
    return v


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
            matrix (use a smaller batch or a wider layer); ``bias`` not a bool.

    Source: Yuan et al. 2022 Alg. 2 (R^T (C^T C)^{-1} R).
    """
    bias = check_flag(bias, "bias")
    x, eps = as_features(features)
    return gram_inverse_diag(design_matrix(x, bias), eps)


# --------------------------------------------------------------------------------------------
# Clipping
# --------------------------------------------------------------------------------------------


def clip_factors(norms: np.ndarray, c_max: float) -> np.ndarray:
    """c = min(1, C / ||g||) elementwise: 1 where ||g|| <= C, 0 where ||g|| is inf (an unknown
    norm, the conservative case).

    Opacus clips by min(1, C / (||g|| + 1e-6)); here min(1, C / ||g||) (relative difference
    ~1e-6).
    """
    with np.errstate(divide="ignore"):
        return np.where(norms > c_max, c_max / np.where(norms > 0, norms, 1.0), 1.0)
