"""Per-example gradient quantities the label-DP bounds need, from Opacus' per-example gradients.

Torch only, no Lightning; used by the label callbacks (:mod:`audit_callbacks.callbacks.label_dp`)
and usable on their own. The bounds of :func:`audit_callbacks.estimators.label_dp.label_dp_lower_bound`
need, per example r of a DP-SGD batch:

* ||g_r||, the norm of the whole per-example gradient (all parameters, before clipping): what
  Opacus clips with (Abadi et al. 2016, "Deep Learning with Differential Privacy", Alg. 1) --
  :func:`per_example_grad_norms`, or, for a model made only of ``nn.Linear`` layers with a bias,
  :func:`ghost_grad_norms` from the per-example bias gradients and input norms (Goodfellow 2015,
  "Efficient Per-Example Gradient Computations"; the "ghost norm" of Li, Tramer, Liang &
  Hashimoto 2022, "Large Language Models Can Be Strong Differentially Private Learners", §4);
* kappa, the loss scale with per-example logit-layer gradient kappa (p_r - e_{y_r}) x~_r^T
  (Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks with Strong DP-SGD Lower Bounds for Label
  Privacy", §3 eq. (1)): :func:`gradient_scale`; None when the loss is not (a multiple of) the
  log-loss of a sigmoid logit or the cross-entropy of a softmax (the bounds then do not apply);
* ||g_r(k)|| for every label k (the clip factor of a replaced label, K classes):
  :func:`relu_mlp_label_grad_norms` for an MLP of ``nn.Linear`` layers with ReLU activations,
  by back-propagating the K output errors p_r - e_k through the recorded activations;
* for a federated client's update, the change of the whole gradient when one example's label is
  replaced, grad_theta (L_r(y') - L_r(y_r)): :func:`label_change_gradients` (any model, by
  ``torch.func``), and :func:`mean_loss_gradient` to check the update it is added to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from audit_callbacks.validation import check_positive

__all__ = [
    "ReluMlpLabelNorms",
    "ghost_grad_norms",
    "ghost_layers",
    "gradient_scale",
    "label_change_gradients",
    "mean_loss_gradient",
    "per_example_grad_norms",
    "relu_mlp_label_grad_norms",
]


def per_example_grad_norms(grad_samples: Sequence[Tensor]) -> np.ndarray:
    """[N] norms of the whole per-example gradients from Opacus' ``grad_samples`` (float64).

    Reads every per-example gradient (memory-bound, ~1 ms for 64 x 46,601 floats).
    """
    per_param = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in grad_samples]
    norms = torch.linalg.vector_norm(torch.stack(per_param, dim=1), dim=1)
    return norms.detach().to("cpu", torch.float64).numpy()


def ghost_layers(module: nn.Module, params: Sequence[Tensor]) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers (with a bias, in ``module.modules()`` order) that hold EVERY
    parameter in ``params``, or {} when some parameter lives elsewhere."""
    ids = {id(p) for p in params}
    layers = {str(i): m for i, m in enumerate(module.modules()) if isinstance(m, nn.Linear) and m.bias is not None
              and id(m.weight) in ids and id(m.bias) in ids}
    covered = {id(p) for m in layers.values() for p in (m.weight, m.bias)}
    return layers if layers and covered == ids and len(covered) == len(params) else {}


def ghost_grad_norms(bias_grads: Sequence[Tensor], input_sqnorms: Sequence[Tensor]) -> np.ndarray | None:
    """[N] per-example gradient norms of an all-``nn.Linear`` model from the bias gradients alone.

    For ``nn.Linear`` on [N, p] inputs, the per-example weight gradient is the outer product
    b_i a_i^T (b_i the per-example bias gradient, a_i the input), so the example's squared norm
    over the layer is ||b_i||^2 (||a_i||^2 + 1) (Goodfellow 2015). Reads the [N, k] bias
    gradients instead of every [N, k, p] weight gradient.

    Args:
        bias_grads: per layer, Opacus' per-example bias gradients [N, k].
        input_sqnorms: per layer, ||a_i||^2 [N] (float64).

    Returns:
        float64 [N], or None when the shapes do not line up (use :func:`per_example_grad_norms`).
    """
    total: Tensor | None = None
    for b, a2 in zip(bias_grads, input_sqnorms, strict=True):
        if b.ndim != 2 or b.shape[0] != a2.shape[0]:
            return None
        part = torch.linalg.vector_norm(b, dim=1).to("cpu", torch.float64) ** 2 * (a2 + 1.0)
        total = part if total is None else total + part
    return None if total is None else torch.sqrt(total).numpy()


def gradient_scale(
    output_errors: np.ndarray, bias_grads: Tensor | None = None, *, weight_grads: Tensor | None = None,
    features: Tensor | None = None,
) -> float | None:
    """kappa with per-example logit-layer gradient = kappa (p_r - e_{y_r}) [x_r, 1].

    kappa = 1 for a per-example log-loss / cross-entropy; Lightning's gradient accumulation
    divides the loss by ``accumulate_grad_batches`` (kappa = 1/2 for 2). Read from the layer's
    per-example bias gradients (or weight-gradient norms without a bias), row by row.

    Args:
        output_errors: a_r = p_r - y_r [N] (sigmoid logit) or p_r - e_{y_r} [N, K] (softmax).
        bias_grads: Opacus' per-example bias gradients of the logit layer, [N, 1] / [N, K].
        weight_grads: per-example weight gradients [N, K, p], used when ``bias_grads`` is None.
        features: the layer inputs [N, p] (with ``weight_grads``).

    Tolerance. The check allows for the rounding of the gradient's dtype (eps =
    ``torch.finfo(dtype).eps`` of ``bias_grads`` / ``weight_grads``; bfloat16 and float16 under
    Lightning's ``bf16-mixed``, ``bf16-true`` and ``16-mixed`` precisions). Rounding a row to that
    dtype moves each entry by at most eps/2 relative; a loss evaluated in that dtype
    (``bf16-true``) also moves p_r by at most eps/2 per entry, an error of eps/(2 ||a_r||)
    relative to the row a_r = p_r - e_{y_r} (Higham 2002, "Accuracy and Stability of Numerical
    Algorithms", §2.2, the standard model of floating-point arithmetic). A row's ratio to kappa
    therefore deviates by at most about eps (1 + 1/||a_r||) (the row's error and that of the
    median kappa); the tolerance is twice that, 4 eps (1 + 1/||a_r||), and never below 1e-3
    (float32: the 1e-3 of before, since 4 eps (1 + 1/||a_r||) < 5e-4 on the rows used). Only rows
    with ||a_r|| > max(1e-3, 32 eps) are read (bfloat16: 0.25, where a row is still within 2 %),
    or the largest row when none is. In bfloat16 a loss that differs from log-loss by less than
    the tolerance (e.g. label smoothing below ~0.05) is not detected.

    Returns:
        kappa > 0, or None when the rows disagree by more than the tolerance (the loss is not
        log-loss / cross-entropy on this layer's outputs, e.g. label smoothing or MSE: the bounds
        do not apply) or nothing is given.
    """
    a = np.asarray(output_errors, dtype=float)
    a2 = a.reshape(a.shape[0], -1)
    size = np.linalg.norm(a2, axis=1)
    if bias_grads is not None:
        b = bias_grads.detach().reshape(bias_grads.shape[0], -1).to("cpu", torch.float64).numpy()
        if b.shape != a2.shape:
            return None
        ratio = (b * a2).sum(1) / np.where(size > 0, size**2, 1.0)
        resid = np.linalg.norm(b - ratio[:, None] * a2, axis=1)
    elif weight_grads is not None and features is not None:
        gw = weight_grads.detach()
        gn = torch.linalg.vector_norm(gw.reshape(gw.shape[0], -1), dim=1).to("cpu", torch.float64).numpy()
        xn = torch.linalg.vector_norm(features.to(torch.float64), dim=1).cpu().numpy()
        if gn.shape[0] != a2.shape[0]:
            return None
        ratio = gn / np.where(size * xn > 0, size * xn, 1.0)
        resid = np.zeros_like(ratio)
    else:
        return None
    eps = _gradient_eps(bias_grads if bias_grads is not None else weight_grads)
    use = size > max(1e-3, 32.0 * eps)  # float32 gradients: relative error ~1e-7 / |p - y|
    if not use.any():  # a batch the model fits almost perfectly: its best-determined row
        use = size >= size.max()
    kappa = float(np.median(ratio[use]))
    if not (math.isfinite(kappa) and kappa > 0):
        return None
    tol = np.maximum(1e-3, 4.0 * eps * (1.0 + 1.0 / size[use]))  # see "Tolerance" above
    if bool(np.any(np.abs(ratio[use] / kappa - 1.0) > tol)):
        return None
    if bool(np.any(resid[use] / (kappa * size[use]) > tol)):  # not parallel to p - e_y
        return None
    return kappa


def _gradient_eps(grads: Tensor) -> float:
    """Machine epsilon of the gradients' dtype (float32's for a non-floating dtype)."""
    dtype = grads.dtype if grads.dtype.is_floating_point else torch.float32
    return float(torch.finfo(dtype).eps)


class ReluMlpLabelNorms:
    """Norms ||g_r(k)|| of the whole per-example gradient at label k, for a ReLU MLP.

    Model: layers l = 1..L, ``nn.Linear`` with a bias, z_l = W_l a_{l-1} + b_l, a_l = ReLU(z_l),
    softmax on z_L, cross-entropy scaled by kappa. The backward pass is linear in the output
    error v = kappa (p_r - e_k): delta_L = v, delta_l = (W_{l+1}^T delta_{l+1}) * 1[a_l > 0],
    and the example's squared gradient norm is sum_l ||delta_l||^2 (||a_{l-1}||^2 + 1)
    (per-example weight gradient delta_l a_{l-1}^T, bias gradient delta_l; Goodfellow 2015).

    Built once per step from the recorded activations (the masks and input norms are shared by
    :meth:`matches` and every call). ``ok`` is False when the shapes do not chain or a hidden
    input is negative (not ReLU); the other methods must not be used then.

    Args:
        weights: W_1..W_L ([out_l, in_l]), in forward order.
        inputs: a_0..a_{L-1} ([N, in_l]), the recorded inputs of each layer.
        probs: [N, K] softmax outputs. labels: [N] observed labels. kappa: the loss scale.
        dtype: of the propagation (float32 halves the cost; the norms are then accurate to
            ~1e-6 relative, far inside the 1e-3 check and the bound's needs).

    Raises:
        ValueError: ``kappa`` not a finite real > 0; ``dtype`` not a floating-point dtype.
    """

    def __init__(self, weights: Sequence[Tensor], inputs: Sequence[Tensor], probs: Tensor, labels: Tensor,
                 kappa: float, *, dtype: torch.dtype = torch.float64) -> None:
        kappa = check_positive(kappa, "kappa")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.ok = False
        if not weights or len(weights) != len(inputs):
            return
        n, k = probs.shape
        self.n, self.k, self.kappa, self.dtype = n, k, kappa, dtype
        self.w = [wi.detach().to("cpu", dtype) for wi in weights]
        a = [x.detach().reshape(x.shape[0], -1).to("cpu", dtype) for x in inputs]
        if self.w[-1].shape[0] != k or any(x.shape[0] != n for x in a):
            return
        for li in range(len(self.w)):
            if a[li].shape[1] != self.w[li].shape[1] or (li > 0 and self.w[li - 1].shape[0] != self.w[li].shape[1]):
                return
        if len(a) > 1 and bool(torch.stack([(x < 0).any() for x in a[1:]]).any()):
            return
        self.p = probs.detach().to("cpu", dtype)
        self.eye = torch.eye(k, dtype=dtype)
        self.y = labels.reshape(-1).to("cpu", torch.int64)
        self.sq_in = [(x * x).sum(1) + 1.0 for x in a]
        self.masks = [x > 0 for x in a]
        self.ok = True

    def _deltas(self, err: Tensor, rows: Tensor | None) -> list[Tensor]:
        """delta_l for output errors err [M, K] of examples ``rows`` (None: all, in order), L..1."""
        delta = self.kappa * err
        out = [delta]
        for li in range(len(self.w) - 2, -1, -1):
            mask = self.masks[li + 1] if rows is None else self.masks[li + 1][rows]
            delta = (delta @ self.w[li + 1]) * mask
            out.append(delta)
        return out

    def matches(self, observed_bias_grads: Sequence[Tensor], rtol: float = 1e-3) -> bool:
        """Whether the deltas at the observed labels equal Opacus' per-example bias gradients of
        each layer (relative tolerance ``rtol``): the layers form this chain with ReLU between them.

        Raises:
            ValueError: ``rtol`` not a finite real > 0.
        """
        rtol = check_positive(rtol, "rtol")
        deltas = self._deltas(self.p - self.eye[self.y], None)[::-1]  # layers 1..L
        if len(observed_bias_grads) != len(deltas):
            return False
        bad = []
        for obs_raw, delta in zip(observed_bias_grads, deltas, strict=True):
            obs = obs_raw.detach().reshape(self.n, -1).to("cpu", self.dtype)
            if obs.shape != delta.shape:
                return False
            err_n = torch.linalg.vector_norm(obs - delta, dim=1)
            ref = torch.linalg.vector_norm(obs, dim=1)
            bad.append((err_n > rtol * ref + 1e-6 * ref.max() + 1e-30).any())
        return not bool(torch.stack(bad).any())

    def __call__(self, rows: Any, labels: Any) -> Tensor:
        """float64 [P] norms for the pairs (rows [P], labels [P])."""
        r = torch.as_tensor(np.asarray(rows), dtype=torch.int64)
        lab = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        deltas = self._deltas(self.p[r] - self.eye[lab], r)
        total = torch.zeros(r.shape[0], dtype=self.dtype)
        for li, delta in zip(range(len(self.w) - 1, -1, -1), deltas, strict=True):
            total += (delta * delta).sum(1) * self.sq_in[li][r]
        return torch.sqrt(total).to(torch.float64)


def relu_mlp_label_grad_norms(
    weights: Sequence[Tensor], inputs: Sequence[Tensor], probs: Tensor, labels: Tensor, kappa: float,
    observed_bias_grads: Sequence[Tensor] | None = None, *, rtol: float = 1e-3,
    dtype: torch.dtype = torch.float64, pairs: tuple[Any, Any] | None = None,
) -> Tensor | None:
    """Norms ||g_r(k)|| of the whole per-example gradient at label k, for a ReLU MLP
    (:class:`ReluMlpLabelNorms`, which states the model; one call builds it and asks once).

    Args:
        weights, inputs, probs, labels, kappa, dtype: as :class:`ReluMlpLabelNorms`.
        observed_bias_grads: Opacus' per-example bias gradients of each layer ([N, out_l]); when
            given, the propagated delta at the observed label must match them (relative
            tolerance ``rtol``), which checks that the layers form this chain with ReLU between
            them (else None).
        pairs: ``(rows [P], labels [P])``: only these (example, label) pairs (default: all).

    Returns:
        float64 [N, K] (column y_r is ||g_r||), or [P] with ``pairs``; None when the shapes do
        not chain, a hidden input is negative (not ReLU) or the check against the observed
        gradients fails.

    Raises:
        ValueError: ``kappa`` or ``rtol`` not a finite real > 0; ``dtype`` not a floating-point
            dtype.
    """
    rtol = check_positive(rtol, "rtol")
    prep = ReluMlpLabelNorms(weights, inputs, probs, labels, kappa, dtype=dtype)
    if not prep.ok or (observed_bias_grads is not None and not prep.matches(observed_bias_grads, rtol)):
        return None
    if pairs is not None:
        return prep(*pairs)
    n, k = prep.n, prep.k
    return prep(np.repeat(np.arange(n), k), np.tile(np.arange(k), n)).reshape(n, k)


def _bias_grad_of(by_id: dict[int, Tensor], layer: nn.Linear) -> Tensor | None:
    """Opacus' per-example bias gradient of ``layer`` (None without a bias or a grad sample)."""
    if layer.bias is None:
        return None
    return by_id.get(id(layer.bias))


def _log_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of softmax logits [N, K], or log-loss of one sigmoid logit [N, 1]."""
    if logits.shape[-1] == 1:
        return nn.functional.binary_cross_entropy_with_logits(logits.reshape(-1), labels.to(logits.dtype))
    return nn.functional.cross_entropy(logits, labels)


def mean_loss_gradient(model: nn.Module, x: Tensor, labels: Tensor) -> Tensor:
    """Flat gradient [d] of the mean log-loss / cross-entropy of ``model(x)`` over its trainable
    parameters (in ``model.parameters()`` order), float64.

    What a FedSGD client's update is -1 / lr times before clipping (McMahan et al. 2018); the
    federated label bound checks the observed update against it.

    Args:
        model: maps x [n, ...] to logits [n, K] (K >= 2, cross-entropy) or [n, 1] (log-loss).
        x: [n, ...] inputs. labels: [n] integer labels (0/1 for one logit).

    Raises:
        RuntimeError: from torch, when ``model`` cannot run on ``x`` or the labels do not fit
        the logits.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.enable_grad():
        loss = _log_loss(model(x), labels.reshape(-1))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64)
                      for p, g in zip(params, grads, strict=True)])


def label_change_gradients(model: nn.Module, x: Tensor, labels: Tensor, new_labels: Tensor) -> Tensor:
    """grad_theta (L(x_i, new_labels[i]) - L(x_i, labels[i])) for each row i, flat, float64 [P, d].

    For cross-entropy L = logsumexp(z) - z_y, so the difference is grad (z_y - z_{y'}); for the
    log-loss of one sigmoid logit z it is grad ((y - y') z). One ``torch.func`` gradient per row
    (``vmap`` over the rows), over the trainable parameters in ``model.parameters()`` order. The
    model must treat examples independently (no layer that couples a batch, such as BatchNorm in
    training mode: each row is evaluated alone).

    Args:
        model: maps x [P, ...] to logits [P, K] (K >= 2) or [P, 1].
        x: [P, ...] inputs. labels, new_labels: [P] integer labels.

    Returns:
        float64 [P, d] on the model's device (P x d x 8 bytes: callers chunk the rows).
    """
    from torch.func import functional_call, grad, vmap

    named = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    buffers = {k: b.detach() for k, b in model.named_buffers()}

    def margin(prm: dict[str, Tensor], xi: Tensor, ci: Tensor) -> Tensor:
        return (functional_call(model, (prm, buffers), (xi.unsqueeze(0),)).reshape(-1) * ci).sum()

    with torch.no_grad():
        k = int(model(x[:1]).reshape(-1).shape[0])
    y, y2 = labels.reshape(-1).to(torch.int64), new_labels.reshape(-1).to(torch.int64)
    if k == 1:  # (y - y') z
        coef = (y - y2).reshape(-1, 1)
    else:  # z_y - z_{y'}
        coef = nn.functional.one_hot(y, k) - nn.functional.one_hot(y2, k)
    dtype = next(iter(named.values())).dtype if named else torch.float32
    g = vmap(grad(margin), in_dims=(None, 0, 0))(named, x, coef.to(dtype))
    return torch.cat([g[k].reshape(x.shape[0], -1).to(torch.float64) for k in named], dim=1)
