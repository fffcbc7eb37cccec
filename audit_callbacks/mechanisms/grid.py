"""Discrete mechanisms on the decimal grid of Varun et al. 2024 (§4.3): the grid base and GRR.

The domain ``[c - r, c + r]`` at precision ``10^-p`` becomes the ``D = 2 r 10^p + 1`` values
``c - r + k 10^-p``, k = 0..D-1, after c and r are rounded to p decimals (round half up on
their decimal representation; §4.3 of 002). Everything is computed on the integer index k; a
value is only formed, as ``(integer) / 10^p`` in float64, when it is released.
"""

from __future__ import annotations

import abc
import math
from decimal import ROUND_HALF_UP, Decimal

import torch
from torch import Tensor

from audit_callbacks.mechanisms.base import (
    PerCoordinateRandomizer,
    _as_inputs,
    _check_rows,
    _uniform,
)
from audit_callbacks.validation import check_choice, check_count, check_positive, check_real

__all__ = ["GRR", "GridRandomizer"]

_ROUNDING = ("nearest", "stochastic")
_MAX_PRECISION = 12


def _round_decimal(value: float, precision: int) -> int:
    """``value * 10^precision`` rounded half up on the decimal representation of ``value``."""
    return int(
        Decimal(repr(float(value))).scaleb(precision).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    )


class GridRandomizer(PerCoordinateRandomizer):
    """Base of the per-coordinate mechanisms on the grid ``c - r + k 10^-p`` (k = 0..D-1).

    Args:
        epsilon_per_coordinate: the epsilon of one coordinate's release, > 0.
        center: c, rounded to p decimals (stored rounded in ``self.center``).
        radius: r > 0, rounded to p decimals (must stay >= 10^-p).
        precision: p, an integer in [0, 12].
        rounding: how an input reaches the grid after clipping to ``[c - r, c + r]``:
            ``"nearest"`` (002 §4.3; ties round up) or ``"stochastic"`` (to one of the two
            neighbouring grid values with probabilities that keep its mean equal to the clipped
            input). Stochastic rounding is a mixture of two grid inputs, so the epsilon-LDP
            claim is unchanged, and it makes ``debias`` unbiased for the clipped input itself
            instead of its nearest grid value.
        dim: optional row length (see :class:`PerCoordinateRandomizer`).
    """

    def __init__(
        self,
        epsilon_per_coordinate: float,
        center: float = 0.0,
        radius: float = 1.0,
        precision: int = 1,
        *,
        rounding: str = "nearest",
        dim: int | None = None,
    ) -> None:
        super().__init__(epsilon_per_coordinate, dim)
        check_real(center, "center")
        check_positive(radius, "radius")
        self.precision: int = check_count(precision, "precision", minimum=0)
        if self.precision > _MAX_PRECISION:
            raise ValueError(f"precision must be <= {_MAX_PRECISION}, got {precision}")
        self.rounding: str = check_choice(rounding, "rounding", _ROUNDING)
        self._scale: int = 10**self.precision
        c_int = _round_decimal(center, self.precision)
        r_int = _round_decimal(radius, self.precision)
        if r_int < 1:
            raise ValueError(
                f"radius {radius} rounds to 0 at precision {self.precision}; it must be >= "
                f"10^-{self.precision}"
            )
        self._c_int, self._r_int = c_int, r_int
        self._lo_int: int = c_int - r_int
        self.center: float = c_int / self._scale
        self.radius: float = r_int / self._scale
        self.domain_size: int = 2 * r_int + 1  # D

    # ----------------------------------------------------------------- grid <-> values
    @property
    def grid(self) -> Tensor:
        """The D grid values, float64 ``[D]``, ascending."""
        return self._grid_value(torch.arange(self.domain_size))

    def _grid_value(self, k: Tensor) -> Tensor:
        return (k.to(torch.float64) + self._lo_int) / self._scale

    def _position(self, x: Tensor) -> Tensor:
        """Clipped input in grid units, float64 in [0, D - 1]."""
        t = x.to(torch.float64) * self._scale - self._lo_int
        return t.clamp(0.0, float(self.domain_size - 1))

    def grid_index(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Grid index (int64, same shape) of each input after clipping and rounding."""
        t = self._position(x)
        if self.rounding == "nearest":
            k = torch.floor(t + 0.5)
        else:
            k0 = torch.floor(t)
            k = k0 + (_uniform(t.shape, t, generator) < (t - k0)).to(t.dtype)
        return k.clamp(0, self.domain_size - 1).to(torch.int64)

    def project(self, x: Tensor) -> Tensor:
        """What :meth:`debias` estimates, per coordinate: the nearest grid value of the clipped
        input (``rounding="nearest"``) or the clipped input itself (``"stochastic"``)."""
        self._check_input(x)
        t = self._position(x)
        if self.rounding == "nearest":
            t = torch.floor(t + 0.5).clamp(0, self.domain_size - 1)
        return ((t + self._lo_int) / self._scale).to(x.dtype)

    def _output_grid_index(self, y: Tensor) -> Tensor:
        """Grid index of released values ``y`` (raises if a value is off the grid)."""
        t = y.to(torch.float64) * self._scale - self._lo_int
        k = torch.round(t)
        if not bool(((t - k).abs() <= 0.25).all()) or bool(
            ((k < 0) | (k >= self.domain_size)).any()
        ):
            raise ValueError("y holds values that are not on this mechanism's output grid")
        return k.to(torch.int64)

    # ------------------------------------------------------------- mechanism hooks
    def output_values(self) -> Tensor:
        """Every value the mechanism can output, float64 ``[m]`` (default: the grid)."""
        return self.grid

    def _output_value(self, o: Tensor) -> Tensor:
        """Value (float64) of output index ``o`` into :meth:`output_values`."""
        return self._grid_value(o)

    @abc.abstractmethod
    def _rows(self, k: Tensor) -> Tensor:
        """``P(output index | grid input index)`` for int64 ``k [n]``: float64 ``[n, m]``."""

    @abc.abstractmethod
    def _sample(self, k: Tensor, generator: torch.Generator | None) -> Tensor:
        """One output index (int64, same shape) per grid input index in ``k``."""

    # ------------------------------------------------------------------ public API
    def randomize(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x [B, d] -> [B, d]``: each coordinate clipped, put on the grid, randomized."""
        self._check_input(x)
        k = self.grid_index(x, generator)
        return self._output_value(self._sample(k, generator)).to(x.dtype)

    def default_inputs(self) -> Tensor:
        """The whole grid (float64 ``[D]``)."""
        return self.grid

    def output_distribution(self, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(output_values() [m], probs [n, m])`` float64; inputs default to the grid.

        Inputs are clipped and rounded as in :meth:`randomize`; with stochastic rounding the
        row is the exact mixture of the two neighbouring grid rows.
        """
        xs = self.default_inputs() if inputs is None else _as_inputs(inputs)
        t = self._position(xs)
        if self.rounding == "nearest":
            probs = self._rows(torch.floor(t + 0.5).clamp(0, self.domain_size - 1).to(torch.int64))
        else:
            k0 = torch.floor(t).clamp(0, self.domain_size - 1)
            frac = (t - k0).unsqueeze(1)
            k1 = (k0 + 1).clamp(max=self.domain_size - 1)
            probs = (1.0 - frac) * self._rows(k0.to(torch.int64)) + frac * self._rows(
                k1.to(torch.int64)
            )
        return self.output_values(), probs

    def transition_matrix(self) -> Tensor:
        """``P[k, o] = P(output o | grid input k)``, float64 ``[D, m]``."""
        chunk = max(1, (1 << 20) // self.domain_size)
        return torch.cat(
            [self._rows(k) for k in torch.arange(self.domain_size).split(chunk)], dim=0
        )

    def _grid_repr(self) -> str:
        return (
            f"epsilon={self.epsilon_per_coordinate!r}, center={self.center!r}, "
            f"radius={self.radius!r}, precision={self.precision!r}, rounding={self.rounding!r}, "
            f"dim={self.dim!r}"
        )


class GRR(GridRandomizer):
    """Generalized randomized response on the grid of 002 §4.3 (the baseline of 002 §6).

    The grid input is kept w.p. ``p = e^eps / (e^eps + D - 1)``; otherwise each of the other
    D - 1 values is released w.p. ``q = 1 / (e^eps + D - 1)`` each. Exact epsilon: log(p/q) = eps.

    Debiasing (exact affine inverse): with S = sum of the grid = D c (the grid is symmetric
    about the rounded c), ``E[y | x] = p x + q (S - x) = (p - q) x + q D c``, so
    ``debias(y) = (y - q D c) / (p - q)``, ``p - q = (e^eps - 1) / (e^eps + D - 1)``. Unbiased
    for the rounded input (``rounding="nearest"``) or the clipped input (``"stochastic"``).

    Args: as :class:`GridRandomizer`.
    """

    name = "grr"

    @property
    def _denominator(self) -> float:
        return math.exp(self.epsilon_per_coordinate) + self.domain_size - 1

    @property
    def keep_probability(self) -> float:
        """p = e^eps / (e^eps + D - 1), the probability of releasing the grid input itself."""
        return math.exp(self.epsilon_per_coordinate) / self._denominator

    @property
    def other_probability(self) -> float:
        """q = 1 / (e^eps + D - 1), the probability of each of the other D - 1 values."""
        return 1.0 / self._denominator

    def _rows(self, k: Tensor) -> Tensor:
        k = k.reshape(-1).cpu()
        probs = torch.full(
            (k.numel(), self.domain_size), self.other_probability, dtype=torch.float64
        )
        probs[torch.arange(k.numel()), k] = self.keep_probability
        return probs

    def _sample(self, k: Tensor, generator: torch.Generator | None) -> Tensor:
        keep = _uniform(k.shape, k, generator) < self.keep_probability
        other = torch.randint(
            0, self.domain_size - 1, k.shape, generator=generator, device=k.device
        )
        other = other + (other >= k).to(other.dtype)  # uniform over the D - 1 values != k
        return torch.where(keep, k, other)

    def debias(self, y: Tensor) -> Tensor:
        """``(y - q D c) / (p - q)`` elementwise: unbiased for each coordinate's grid input."""
        _check_rows(y, "y")
        shift = self.other_probability * self.domain_size * self.center
        p_minus_q = math.expm1(self.epsilon_per_coordinate) / self._denominator
        return (y.to(torch.float64) - shift).div(p_minus_q).to(y.dtype)

    def __repr__(self) -> str:
        return f"GRR({self._grid_repr()})"
