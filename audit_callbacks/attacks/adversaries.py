"""The five crafting adversaries of Matsumoto et al. (Table 2, §4.4; docs/methods/ldp.md, C2).

Each builds the pair (g1, g2) that the client then feeds to the eps0 test
(:func:`audit_callbacks.attacks.ldp_epsilon_test`):

=============  =================================  ===================
name           g1                                 g2
=============  =================================  ===================
benign         grad l(theta; x1)                  grad l(theta; x2)
label_flip     grad l(theta; x1, label1)          grad l(theta; x1, label2)
gradient_flip  grad l(theta; x1)                  -g1
collusion      grad l(theta~; x1), theta~ = the   -g1
               model trained by the server on a
               single label (x1 has another one)
dummy          (lam, ..., lam), lam = L/sqrt(d)   -g1
=============  =================================  ===================

Gradients are flat [P] vectors over the model's trainable parameters (``requires_grad``), in
``model.parameters()`` order, computed with ``torch.autograd.grad`` on one example
(``x[i:i+1]``, ``y[i:i+1]``). The model is put in ``eval()`` mode for the gradient (BatchNorm
with one example, deterministic dropout) and restored afterwards; the model is never modified
(collusion trains a deep copy). ``loss_fn(model(x), y)`` must return a scalar, e.g.
``torch.nn.functional.cross_entropy``; labels are class indices.

Every function returns a :class:`CraftedPair` holding g1, g2, their norms and cosine (the
norms decide whether LDP-SGD's clipping/sign step can flip the sign: Matsumoto et al. §3.1, Fig. 6).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from audit_callbacks.validation import check_count, check_positive, make_rng

__all__ = [
    "ADVERSARIES",
    "CraftedPair",
    "benign_pair",
    "collusion_pair",
    "craft_pair",
    "dummy_pair",
    "flat_gradient",
    "gradient_flip_pair",
    "label_flip_pair",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
RngLike = np.random.Generator | int | None


@dataclass(frozen=True)
class CraftedPair:
    """A crafted input pair of Matsumoto et al. Table 2.

    Attributes:
        name: adversary name (a key of :data:`ADVERSARIES`).
        g1, g2: flat [P] tensors (detached), same dtype and device as the model's parameters
            (``dummy``: the requested dtype).
        norm_g1, norm_g2: Euclidean norms (float).
        cosine: cos(g1, g2) (float; -1 for the flipped pairs).
        details: small JSON-able facts (example index, labels, training loss of the collusion
            model, ...).
    """

    name: str
    g1: torch.Tensor
    g2: torch.Tensor
    norm_g1: float
    norm_g2: float
    cosine: float
    details: dict[str, Any] = field(default_factory=dict)

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.g1, self.g2


def _make_pair(name: str, g1: torch.Tensor, g2: torch.Tensor, **details: Any) -> CraftedPair:
    n1 = float(g1.double().norm())
    n2 = float(g2.double().norm())
    cos = float((g1.double() @ g2.double()) / (n1 * n2)) if n1 > 0 and n2 > 0 else math.nan
    return CraftedPair(name=name, g1=g1, g2=g2, norm_g1=n1, norm_g2=n2, cosine=cos, details=details)


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return params


def _check_x(x: Any, params: list[torch.nn.Parameter], minimum: int = 1) -> torch.Tensor:
    """x as a detached floating tensor in the parameters' dtype (any float dtype accepted)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor of examples, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 1 or x.shape[0] < minimum:
        raise ValueError(f"x must hold at least {minimum} example(s), got shape {tuple(x.shape)}")
    x = x.detach()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or inf")
    dtype = next((p.dtype for p in params if p.is_floating_point()), x.dtype)
    return x.to(dtype)


def _check_y(y: Any, n: int) -> torch.Tensor:
    """y as a 1-D tensor of n non-negative integer class indices."""
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"y must be a torch.Tensor of class indices, got {type(y).__name__}")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise ValueError(f"y must hold integer class indices, got dtype {y.dtype}")
    if y.dim() != 1 or y.shape[0] != n:
        raise ValueError(
            f"y must have shape [{n}] (one label per example of x), got {tuple(y.shape)}"
        )
    if bool((y < 0).any()):
        raise ValueError("y holds negative class indices")
    return y


def flat_gradient(
    model: torch.nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Flat gradient [P] of ``loss_fn(model(x), y)`` over the trainable parameters (eval mode).

    Parameters that the loss does not reach contribute zeros. ``x`` may have any float dtype
    (it is detached and cast to the parameters' dtype).

    Raises:
        ValueError: x not a finite floating tensor; y not a 1-D tensor of non-negative integer
            labels, one per example; the loss is not a scalar, fails on (x, y) (e.g. a label
            beyond the model's classes) or has a non-finite gradient; no trainable parameters.
    """
    params = _trainable(model)
    x = _check_x(x, params)
    y = _check_y(y, int(x.shape[0]))
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            try:
                loss = loss_fn(model(x), y)
            except (RuntimeError, IndexError) as exc:
                raise ValueError(f"loss_fn(model(x), y) failed on these x, y: {exc}") from None
            if loss.numel() != 1:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
            grads = torch.autograd.grad(loss.reshape(()), params, allow_unused=True)
    finally:
        model.train(was_training)
    flat = torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(grads, params, strict=True)
        ]
    ).detach()
    if not bool(torch.isfinite(flat).all()):
        raise ValueError("the gradient of loss_fn(model(x), y) is not finite (check the model)")
    return flat


def _check_data(
    model: torch.nn.Module, x: Any, y: Any, minimum: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    xs = _check_x(x, _trainable(model), minimum)
    return xs, _check_y(y, int(xs.shape[0]))


def benign_pair(
    model: torch.nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    rng: RngLike = None,
) -> CraftedPair:
    """Benign: g1, g2 = gradients of two distinct random examples (Matsumoto et al. Table 2, row 1).

    Args:
        model, loss_fn: the global model theta_t and its loss.
        x: [N, ...] client inputs, y: [N] labels, N >= 2.
        rng: numpy Generator or seed for the choice of the two examples.

    Raises:
        ValueError: fewer than 2 examples; x not a finite floating tensor; y not one
            non-negative integer label per example; rng not a Generator, seed or None.
    """
    x, y = _check_data(model, x, y, minimum=2)
    n = int(x.shape[0])
    i, j = (int(v) for v in make_rng(rng).choice(n, size=2, replace=False))
    g1 = flat_gradient(model, loss_fn, x[i : i + 1], y[i : i + 1])
    g2 = flat_gradient(model, loss_fn, x[j : j + 1], y[j : j + 1])
    return _make_pair("benign", g1, g2, index1=i, index2=j, label1=int(y[i]), label2=int(y[j]))


def label_flip_pair(
    model: torch.nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    rng: RngLike = None,
) -> CraftedPair:
    """Label flip: one example x1 with its label and with another random label (Table 2, row 2).

    Opposite directions need a well-trained model (Matsumoto et al. Prop. 4.1).

    Args:
        num_classes: C >= 2; label2 is uniform over the C - 1 labels other than y[i].
        (others as :func:`benign_pair`)

    Raises:
        ValueError: num_classes not an integer >= 2 or not above every label; x, y, rng as
            :func:`benign_pair`.
    """
    x, y = _check_data(model, x, y)
    n = int(x.shape[0])
    num_classes = check_count(num_classes, "num_classes", minimum=2)
    if int(y.max()) >= num_classes:
        raise ValueError(f"num_classes = {num_classes} but y holds the label {int(y.max())}")
    gen = make_rng(rng)
    i = int(gen.integers(n))
    label1 = int(y[i])
    label2 = int(gen.integers(num_classes - 1))
    label2 += int(label2 >= label1)
    y1 = y[i : i + 1]
    y2 = torch.full_like(y1, label2)
    g1 = flat_gradient(model, loss_fn, x[i : i + 1], y1)
    g2 = flat_gradient(model, loss_fn, x[i : i + 1], y2)
    return _make_pair("label_flip", g1, g2, index=i, label1=label1, label2=label2)


def gradient_flip_pair(
    model: torch.nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    rng: RngLike = None,
) -> CraftedPair:
    """Gradient flip: g1 = gradient of a random example, g2 = -g1 (Table 2, row 3).

    Reaches eps0 against LDP-SGD only when |g1| >= L (Matsumoto et al. §3.1).

    Raises:
        ValueError: x, y, rng as :func:`benign_pair`.
    """
    x, y = _check_data(model, x, y)
    n = int(x.shape[0])
    i = int(make_rng(rng).integers(n))
    g1 = flat_gradient(model, loss_fn, x[i : i + 1], y[i : i + 1])
    return _make_pair("gradient_flip", g1, -g1, index=i, label=int(y[i]))


def collusion_pair(
    model: torch.nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    target_label: int,
    steps: int = 100,
    lr: float = 0.1,
    rng: RngLike = None,
) -> CraftedPair:
    """Collusion: the server's malicious model trained on one label; g2 = -g1 (Table 2, row 4).

    The server trains a deep copy of ``model`` for ``steps`` full-batch SGD steps at ``lr`` on
    the examples of x whose label is ``target_label`` (train mode), so it predicts that label
    with high confidence. The client's g1 is the gradient of this model on a random example
    whose label differs from ``target_label`` (large loss, hence a large norm, so LDP-SGD's
    clipping keeps the sign); g2 = -g1. ``model`` itself is not modified.

    Args:
        target_label: the single label the malicious model is trained on.
        steps: SGD steps (>= 0). lr: learning rate (> 0).
        (others as :func:`benign_pair`)

    Raises:
        ValueError: no example with ``target_label`` or none with another label; steps not an
            integer >= 0; lr not finite > 0; target_label not an integer; x, y, rng as
            :func:`benign_pair`.

    Details returned: target_label, steps, lr, train_loss_start/_end, index, label.
    """
    x, y = _check_data(model, x, y)
    steps = check_count(steps, "steps", minimum=0)
    lr = check_positive(lr, "lr")
    target_label = check_count(target_label, "target_label", minimum=0)
    gen = make_rng(rng)
    same = torch.nonzero(y == target_label).reshape(-1)
    other = torch.nonzero(y != target_label).reshape(-1)
    if same.numel() == 0:
        raise ValueError(
            f"no example of y has target_label {target_label} to train the malicious model on"
        )
    if other.numel() == 0:
        raise ValueError(f"every example has label {target_label}; x1 needs another label")
    malicious = copy.deepcopy(model)
    params = _trainable(malicious)
    xs, ys = x[same], y[same]
    malicious.train()
    losses = []
    # plain SGD by hand (torch.optim's first step imports torch._dynamo: seconds)
    for _ in range(int(steps)):
        with torch.enable_grad():
            loss = loss_fn(malicious(xs), ys)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for prm, grd in zip(params, grads, strict=True):
                if grd is not None:
                    prm.sub_(float(lr) * grd)
        losses.append(float(loss.detach()))
    i = int(other[int(gen.integers(other.numel()))])
    g1 = flat_gradient(malicious, loss_fn, x[i : i + 1], y[i : i + 1])
    return _make_pair(
        "collusion",
        g1,
        -g1,
        target_label=int(target_label),
        steps=int(steps),
        lr=float(lr),
        train_loss_start=losses[0] if losses else None,
        train_loss_end=losses[-1] if losses else None,
        index=i,
        label=int(y[i]),
    )


def dummy_pair(
    dim: int,
    clip_norm: float,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> CraftedPair:
    """Dummy: g1 = (lam, ..., lam), lam = L/sqrt(d), |g1| = L; g2 = -g1 (Table 2, row 5).

    The worst case of LDP-SGD (Matsumoto et al. Prop. 3.1): the test's eq.-3 value equals eps0.

    Args:
        dim: d >= 1. clip_norm: L > 0. dtype, device: of the returned tensors.

    Raises:
        ValueError: dim not an integer >= 1; clip_norm not finite > 0; dtype not a floating
            torch dtype.
    """
    d = check_count(dim, "dim", minimum=1)
    L = check_positive(clip_norm, "clip_norm")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    finfo = torch.finfo(dtype)
    if not finfo.tiny <= L / math.sqrt(d) <= finfo.max:
        raise ValueError(
            f"clip_norm / sqrt(dim) = {L / math.sqrt(d):.3g} is not representable in {dtype}"
        )
    lam = L / math.sqrt(d)
    g1 = torch.full((d,), lam, dtype=dtype, device=device)
    return _make_pair("dummy", g1, -g1, lam=lam, clip_norm=L)


ADVERSARIES: dict[str, Callable[..., CraftedPair]] = {
    "benign": benign_pair,
    "label_flip": label_flip_pair,
    "gradient_flip": gradient_flip_pair,
    "collusion": collusion_pair,
    "dummy": dummy_pair,
}


def craft_pair(name: str, *args: Any, **kwargs: Any) -> CraftedPair:
    """``ADVERSARIES[name](*args, **kwargs)``.

    Raises:
        ValueError: unknown name (the message lists the known ones); the adversary's own errors.
    """
    try:
        fn = ADVERSARIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown adversary name {name!r}; known: {sorted(ADVERSARIES)}"
        ) from None
    return fn(*args, **kwargs)
