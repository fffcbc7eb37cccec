"""LDP-SGD client randomizer (Erlingsson et al. 2020; Alg. 1 of Matsumoto et al.; docs/methods/ldp.md, C1)."""

from __future__ import annotations

import math

import torch
from scipy.special import gammaln
from torch import Tensor

from audit_callbacks.mechanisms.base import (
    LocalRandomizer,
    _check_epsilon,
    _check_rows,
    _uniform,
)
from audit_callbacks.validation import check_count, check_positive

__all__ = ["LDPSGD", "sphere_sign_constant"]


def sphere_sign_constant(d: int) -> float:
    """``c_d = E|v_1| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))`` for v uniform on S^{d-1}.

    For a unit vector u, ``E[sgn(<u, v>) v] = c_d u``. Values: c_1 = 1, c_2 = 2/pi, c_3 = 1/2;
    c_d ~ sqrt(2 / (pi d)) for large d. Computed with log-gamma (no overflow for any d).
    """
    d = check_count(d, "d", minimum=1)
    return math.exp(float(gammaln(d / 2.0) - gammaln((d + 1) / 2.0))) / math.sqrt(math.pi)


class LDPSGD(LocalRandomizer):
    """LDP-SGD gradient randomized response; ``epsilon0``-LDP for the whole row, whatever d.

    Per row g (docs/methods/ldp.md, C1, Alg. 1 of 000):

    1. clip: ``x = g * min(1, L / ||g||)``;
    2. ``z = L x / ||x||`` w.p. ``1/2 + ||x|| / (2L)``, else ``-L x / ||x||``. For ``x = 0`` the
       direction is undefined; we use ``z = +-L e_1`` with a fair sign. The output law is then
       uniform on the sphere whatever direction is taken (a fair random sign times a
       sign-symmetric v), so this choice is immaterial;
    3. ``v ~`` uniform on the unit sphere S^{d-1} (a normalised standard normal);
    4. output ``sgn(<z, v>) v`` w.p. ``e^eps0 / (1 + e^eps0)``, else ``-sgn(<z, v>) v``
       (``sgn(0) = +1``; a probability-zero event).

    The output is a unit vector. Server side (derived, checked by Monte Carlo in the tests):
    ``E[sgn(<z, v>) v | z] = c_d z / L`` (:func:`sphere_sign_constant`), the sign step gives
    ``E[z] = L x/||x|| * (||x|| / L) = x``, and randomized response multiplies by
    ``(e^eps0 - 1)/(e^eps0 + 1) = tanh(eps0 / 2)``; so ``E[output] = c_d tanh(eps0/2) x / L`` and
    :meth:`debias` multiplies by ``L / (c_d tanh(eps0 / 2))``, unbiased for the clipped x.

    Args:
        epsilon0: claimed LDP epsilon of one release, > 0.
        clip_norm: L, the L2 clipping norm, > 0.
    """

    name = "ldp_sgd"
    per_coordinate = False
    epsilon_per_coordinate = None

    def __init__(self, epsilon0: float, clip_norm: float) -> None:
        self.epsilon0: float = _check_epsilon(epsilon0, "epsilon0")
        self.clip_norm: float = check_positive(clip_norm, "clip_norm")
        # P(keep the side of z) = e^eps / (1 + e^eps), written to stay exact for large eps
        self.keep_probability: float = 1.0 / (1.0 + math.exp(-self.epsilon0))

    def project(self, x: Tensor) -> Tensor:
        """L2 clipping of each row to norm ``clip_norm``: ``[B, d] -> [B, d]``."""
        _check_rows(x)
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        scale = torch.clamp(
            self.clip_norm / torch.clamp(norm, min=torch.finfo(x.dtype).tiny), max=1.0
        )
        return x * scale

    def randomize(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x [B, d] -> [B, d]`` unit vectors (before :meth:`debias`); rows independent."""
        xc = self.project(x)
        b, d = xc.shape
        norm = torch.linalg.vector_norm(xc, dim=1, keepdim=True)  # <= L
        zero = norm == 0
        e1 = torch.zeros_like(xc)
        e1[:, 0] = 1.0
        u = torch.where(zero, e1, xc / torch.where(zero, torch.ones_like(norm), norm))
        p_plus = (0.5 + norm.to(torch.float64) / (2.0 * self.clip_norm)).clamp(0.0, 1.0)
        s_z = torch.where(_uniform((b, 1), xc, generator) < p_plus, 1.0, -1.0).to(xc.dtype)
        v = torch.randn((b, d), generator=generator, device=xc.device, dtype=xc.dtype)
        v = v / torch.clamp(
            torch.linalg.vector_norm(v, dim=1, keepdim=True), min=torch.finfo(v.dtype).tiny
        )
        side = torch.where((s_z * u * v).sum(dim=1, keepdim=True) >= 0, 1.0, -1.0).to(xc.dtype)
        keep = _uniform((b, 1), xc, generator) < self.keep_probability
        rr = torch.where(keep, 1.0, -1.0).to(xc.dtype)
        return side * rr * v

    def debias_scale(self, d: int) -> float:
        """``L / (c_d tanh(eps0 / 2))``: the factor that makes ``E[debias(M(x))] = clip(x)``."""
        return self.clip_norm / (sphere_sign_constant(d) * math.tanh(self.epsilon0 / 2.0))

    def debias(self, y: Tensor) -> Tensor:
        """``y [B, d] -> y * L / (c_d tanh(eps0/2))``: unbiased for each row's clipped input."""
        _check_rows(y, "y")
        return y * self.debias_scale(y.shape[1])

    def epsilon_for_dim(self, d: int) -> float:
        """``epsilon0`` whatever d (the whole row is one randomized-response release)."""
        check_count(d, "d", minimum=1)
        return self.epsilon0

    def __repr__(self) -> str:
        return f"LDPSGD(epsilon0={self.epsilon0!r}, clip_norm={self.clip_norm!r})"
