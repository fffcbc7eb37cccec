"""LDP-FL two-point mechanism (Sun et al. 2021; eq. 1 of Varun et al. 2024; docs/methods/ldp.md, C5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from audit_callbacks.mechanisms.base import (
    PerCoordinateRandomizer,
    _as_inputs,
)
from audit_callbacks.validation import check_positive, check_real

__all__ = ["TwoPoint"]


class TwoPoint(PerCoordinateRandomizer):
    """Two-point LDP-FL mechanism, per coordinate; unbiased; epsilon-LDP per coordinate.

    Each coordinate w is clipped to ``[c - r, c + r]`` and released as (eq. 1 of 002)::

        c + B  w.p.  ((w - c)(e^eps - 1) + r(e^eps + 1)) / (2r(e^eps + 1)),
        c - B  otherwise,                       B = r (e^eps + 1) / (e^eps - 1).

    ``E[M(w)] = w`` for clipped w, so :meth:`debias` is the identity. The high-output
    probability runs from ``1/(1 + e^eps)`` (w = c - r) to ``e^eps/(1 + e^eps)`` (w = c + r):
    the ratio is exactly e^eps, the exact epsilon of one coordinate. It is computed as
    ``(sigma(eps)(1 + s) + sigma(-eps)(1 - s)) / 2`` with ``s = (w - c)/r`` and
    ``sigma(t) = 1/(1 + e^-t)``, algebraically eq. 1 and exact at both ends.

    Args:
        epsilon_per_coordinate: the epsilon of one coordinate's release, > 0.
        center: c (finite).
        radius: r > 0.
        dim: optional row length (see :class:`PerCoordinateRandomizer`).
    """

    name = "two_point"

    def __init__(
        self, epsilon_per_coordinate: float, center: float = 0.0, radius: float = 1.0,
        dim: int | None = None,
    ) -> None:
        super().__init__(epsilon_per_coordinate, dim)
        self.center: float = check_real(center, "center")
        self.radius: float = check_positive(radius, "radius")
        eps = self.epsilon_per_coordinate
        self.output_magnitude: float = self.radius / math.tanh(eps / 2.0)  # B
        self._p_top = 1.0 / (1.0 + math.exp(-eps))  # e^eps / (1 + e^eps)
        self._p_bottom = 1.0 / (1.0 + math.exp(eps))  # 1 / (1 + e^eps)

    @property
    def outputs(self) -> tuple[float, float]:
        """The two output values ``(c - B, c + B)``."""
        return (self.center - self.output_magnitude, self.center + self.output_magnitude)

    def project(self, x: Tensor) -> Tensor:
        """Clip each coordinate to ``[c - r, c + r]``."""
        self._check_input(x)
        return x.clamp(self.center - self.radius, self.center + self.radius)

    def _probability_from(self, s: Tensor) -> Tensor:
        """P(high) from a float64 buffer holding the clipped inputs (the buffer is overwritten).

        ``0.5 (p_top (1 + s) + p_bottom (1 - s))``, s = clamp((w - c)/r), evaluated in place on
        two float64 buffers: the same operations, so the same bits, as the plain expression.
        """
        s.sub_(self.center).div_(self.radius).clamp_(-1.0, 1.0)
        p = torch.add(s, 1.0).mul_(self._p_top)  # (1 + s) p_top
        p.add_(s.neg_().add_(1.0).mul_(self._p_bottom))  # + (1 - s) p_bottom
        return p.mul_(0.5)

    def randomize(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x [B, d] -> [B, d]`` with entries in ``{c - B, c + B}``; coordinates independent.

        Memory: two float64 ``[B, d]`` buffers besides the output. The first holds
        :meth:`project` (x) (x clamped at the clip bounds as x's dtype rounds them: the same
        values, without a copy in x's dtype), then the uniform draws of the comparison (the
        draws ``torch.rand`` would make, written into it).
        """
        self._check_input(x)
        lo_t, hi_t = (
            float(torch.tensor(v, dtype=x.dtype))
            for v in (self.center - self.radius, self.center + self.radius)
        )
        buf = x.detach().to(torch.float64, copy=True).clamp_(lo_t, hi_t)
        p_high = self._probability_from(buf)
        high = buf.uniform_(0.0, 1.0, generator=generator) < p_high
        del buf, p_high
        lo, hi = self.outputs
        return torch.where(
            high,
            torch.tensor(hi, dtype=x.dtype, device=x.device),
            torch.tensor(lo, dtype=x.dtype, device=x.device),
        )

    def default_inputs(self) -> Tensor:
        """The two ends ``[c - r, c + r]`` (they attain the exact epsilon)."""
        return torch.tensor(
            [self.center - self.radius, self.center + self.radius], dtype=torch.float64
        )

    def output_distribution(self, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``values = [c - B, c + B]``, ``probs [n, 2]`` (float64) for the clipped inputs."""
        xs = self.default_inputs() if inputs is None else _as_inputs(inputs)
        s = ((xs - self.center) / self.radius).clamp(-1.0, 1.0)
        p_hi = 0.5 * (self._p_top * (1.0 + s) + self._p_bottom * (1.0 - s))
        p_lo = 0.5 * (self._p_bottom * (1.0 + s) + self._p_top * (1.0 - s))  # = 1 - p_hi
        values = torch.tensor(self.outputs, dtype=torch.float64)
        return values, torch.stack([p_lo, p_hi], dim=1)

    def __repr__(self) -> str:
        return (
            f"TwoPoint(epsilon_per_coordinate={self.epsilon_per_coordinate!r}, center={self.center!r}, "
            f"radius={self.radius!r}, dim={self.dim!r})"
        )
