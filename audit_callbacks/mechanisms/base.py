"""Interface shared by the local-DP client randomizers, and the exact audit by enumeration.

A :class:`LocalRandomizer` randomizes each row of a ``[B, d]`` float tensor independently (one
row = one client's update), states the epsilon it claims, and gives the server-side correction
(:meth:`LocalRandomizer.debias`, :meth:`LocalRandomizer.aggregate`) that keeps the mean
(as close as the mechanism allows to) unbiased.

Per-coordinate mechanisms (:class:`PerCoordinateRandomizer`: two-point, staircase, GRR) randomize
each coordinate independently with ``epsilon_per_coordinate``; releasing a whole ``d``-dim row is
then ``d * epsilon_per_coordinate``-LDP by basic composition (docs/methods/ldp.md, C6), which is what
:meth:`LocalRandomizer.epsilon_for_dim` returns. Being discrete, they also give their full
output law (:meth:`PerCoordinateRandomizer.output_distribution`), so :func:`exact_epsilon` can
audit them exactly: the largest ``|log P(y|x) - log P(y|x')|`` over input pairs and outputs.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from audit_callbacks.validation import (
    as_float_array,
    check_count,
    check_optional_count,
    check_real,
)

__all__ = [
    "ExactAudit",
    "LocalRandomizer",
    "PerCoordinateRandomizer",
    "exact_epsilon",
    "exact_epsilon_witness",
]

# exp(eps) must stay finite, with room for the sums the discrete mechanisms form from it.
_MAX_EPSILON = 700.0


def _check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float; raise ValueError unless 0 < epsilon <= 700 (finite)."""
    return check_real(epsilon, name, low=0.0, high=_MAX_EPSILON, low_inclusive=False)


def _check_rows(x: Tensor, name: str = "x", *, finite: bool = True) -> Tensor:
    """Validate a ``[B, d]`` floating tensor with B, d >= 1 (and finite entries)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B, d], got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [B, d] (2-D), got shape {tuple(x.shape)}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must have B >= 1 rows and d >= 1 columns, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite entries")
    return x


def _uniform(shape: Sequence[int], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U[0, 1) draws in float64 on ``like``'s device (float64 keeps rare events exact enough)."""
    return torch.rand(tuple(shape), generator=generator, device=like.device, dtype=torch.float64)


class LocalRandomizer(abc.ABC):
    """A local-DP client randomizer, batched over rows: ``x [B, d] -> y [B, d]``.

    Attributes:
        name: short identifier (e.g. ``"ldp_sgd"``).
        epsilon0: the epsilon claimed for ONE call of :meth:`randomize` on one row (whole
            vector release). For per-coordinate mechanisms it needs the row length: see
            :class:`PerCoordinateRandomizer`.
        per_coordinate: True when each coordinate is randomized independently.
        epsilon_per_coordinate: the epsilon of one coordinate (per-coordinate mechanisms), else
            None.
        delta: the delta of the claim (0 for pure epsilon-LDP mechanisms).
    """

    name: str
    epsilon0: float
    per_coordinate: bool = False
    epsilon_per_coordinate: float | None = None
    delta: float = 0.0

    @abc.abstractmethod
    def randomize(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Randomize each row independently: ``x [B, d] float -> [B, d]`` (same dtype/device).

        The input is first clipped/projected to the mechanism's domain (:meth:`project`).
        ``generator`` (on ``x``'s device) makes the draws reproducible; None uses torch's
        global generator.
        """

    @abc.abstractmethod
    def project(self, x: Tensor) -> Tensor:
        """The input as the mechanism sees it after clipping/projection: ``[B, d] -> [B, d]``."""

    def debias(self, y: Tensor) -> Tensor:
        """Server side: ``[B, d] -> [B, d]``, an unbiased estimate of each row's clipped input.

        Default: identity (for mechanisms whose output is already unbiased).
        """
        return _check_rows(y, "y").clone()

    def aggregate(self, y: Tensor) -> Tensor:
        """Server side: ``[B, d] -> [d]``, the mean over rows of :meth:`debias`."""
        return self.debias(y).mean(dim=0)

    def epsilon_for_dim(self, d: int) -> float:
        """Epsilon of releasing one whole ``d``-dim row (default: ``epsilon0`` whatever d)."""
        check_count(d, "d", minimum=1)
        return float(self.epsilon0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon0={self.epsilon0!r})"


class PerCoordinateRandomizer(LocalRandomizer):
    """A discrete mechanism applied independently to each coordinate with the same law.

    Args:
        epsilon_per_coordinate: epsilon of ONE coordinate, in (0, 700].
        dim: optional row length d. When given, ``epsilon0 = d * epsilon`` (basic composition;
            the claim for the whole row) and :meth:`randomize` checks ``x.shape[1] == d``. When
            None, ``epsilon0`` is the per-coordinate epsilon (the claim for a one-dimensional
            row); use :meth:`epsilon_for_dim` for whole rows.
    """

    per_coordinate = True

    def __init__(self, epsilon_per_coordinate: float, dim: int | None = None) -> None:
        self.epsilon_per_coordinate: float = _check_epsilon(epsilon_per_coordinate,
                                                            "epsilon_per_coordinate")
        self.dim: int | None = check_optional_count(dim, "dim", minimum=1)

    @property
    def epsilon(self) -> float:
        """Alias of ``epsilon_per_coordinate``."""
        return self.epsilon_per_coordinate

    @property
    def epsilon0(self) -> float:  # type: ignore[override]
        return self.epsilon_for_dim(self.dim if self.dim is not None else 1)

    def epsilon_for_dim(self, d: int) -> float:
        """``d * epsilon_per_coordinate`` (basic composition over independent coordinates)."""
        return check_count(d, "d", minimum=1) * self.epsilon_per_coordinate

    def _check_input(self, x: Tensor) -> Tensor:
        _check_rows(x)
        if self.dim is not None and x.shape[1] != self.dim:
            raise ValueError(
                f"x has {x.shape[1]} columns, this mechanism was built for dim={self.dim}"
            )
        return x

    @abc.abstractmethod
    def default_inputs(self) -> Tensor:
        """The inputs an exact audit enumerates by default (float64 ``[n]``)."""

    @abc.abstractmethod
    def output_distribution(self, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Exact output law of ONE coordinate for each given input value.

        Args:
            inputs: ``[n]`` input values (default :meth:`default_inputs`); they are clipped /
                projected exactly as :meth:`randomize` does.

        Returns:
            ``(values [m], probs [n, m])``, both float64 on the CPU: every output value the
            mechanism can produce (for any input; the same ``values`` whatever ``inputs``), and
            ``probs[i, j] = P(y = values[j] | x = inputs[i])``; rows sum to 1.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon_per_coordinate!r}, dim={self.dim!r})"


def _as_inputs(inputs: Tensor | Sequence[float] | np.ndarray, name: str = "inputs") -> Tensor:
    """Input values as a flat float64 CPU tensor (any real dtype, requires_grad, any device).

    Raises:
        ValueError: empty, NaN/inf, booleans, complex numbers or non-numbers.
    """
    arr = as_float_array(inputs, name, allow_int=True)
    t = torch.from_numpy(np.array(arr, dtype=np.float64)).reshape(-1)
    if t.numel() == 0:
        raise ValueError(f"{name} must hold at least one value")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contain NaN or infinite values")
    return t


def _check_discrete(mechanism: object) -> None:
    """The exact audit enumerates a discrete per-coordinate law; anything else is refused."""
    if not isinstance(mechanism, PerCoordinateRandomizer):
        raise ValueError(
            "mechanism must be a discrete PerCoordinateRandomizer (TwoPoint, GRR, Staircase, "
            f"BrokenStaircase) whose output law can be enumerated, got {type(mechanism).__name__}"
            "; a continuous randomizer (LDPSGD, GaussianRandomizer) has no finite output set: "
            "audit it empirically with audit_callbacks.attacks.ldp_epsilon_test"
        )


class ExactAudit(NamedTuple):
    """Result of :func:`exact_epsilon_witness`.

    ``epsilon = log P(y | x_high) - log P(y | x_low)``, the largest over all enumerated input
    pairs and outputs (``inf`` when ``P(y | x_low) = 0 < P(y | x_high)``).
    """

    epsilon: float
    x_high: float
    x_low: float
    y: float


def exact_epsilon_witness(
    mechanism: PerCoordinateRandomizer,
    inputs: Tensor | Sequence[float] | np.ndarray | None = None,
    *,
    chunk_elements: int = 1 << 22,
) -> ExactAudit:
    """Exact epsilon of a discrete per-coordinate mechanism by enumeration, with a witness.

    Computes ``max_{x, x', y} log P(y|x) - log P(y|x')`` over the given inputs (default: the
    mechanism's :meth:`~PerCoordinateRandomizer.default_inputs`, e.g. the whole grid) and all
    outputs, in float64. Outputs that no input can produce are skipped; an output with zero
    probability under one input and positive under another gives ``inf``. Inputs are processed
    in chunks of about ``chunk_elements`` probabilities, so large grids fit in memory.

    This is the epsilon of ONE coordinate; a whole ``d``-dim row of independent coordinates has
    ``d`` times it (the composition is tight for product mechanisms under pure DP).

    Raises:
        ValueError: ``mechanism`` is not a :class:`PerCoordinateRandomizer` (e.g. LDPSGD or the
            Gaussian randomizer, whose outputs are continuous); ``inputs`` empty, NaN/inf,
            boolean or complex; ``chunk_elements`` not an integer >= 1; a mechanism whose
            ``output_distribution`` is inconsistent.
    """
    _check_discrete(mechanism)
    step = check_count(chunk_elements, "chunk_elements", minimum=1)
    xs = mechanism.default_inputs() if inputs is None else _as_inputs(inputs)
    xs = _as_inputs(xs)
    values: Tensor | None = None
    col_max = col_min = arg_max = arg_min = None
    start = 0
    while start < xs.numel():
        # size chunks from the first chunk's output count
        rows = 1 if values is None else max(1, step // max(1, values.numel()))
        chunk = xs[start : start + rows]
        vals, probs = mechanism.output_distribution(chunk)
        vals = vals.to(torch.float64).cpu()
        probs = probs.to(torch.float64).cpu()
        if probs.shape != (chunk.numel(), vals.numel()):
            raise ValueError(
                f"output_distribution returned probs of shape {tuple(probs.shape)}, expected "
                f"{(chunk.numel(), vals.numel())}"
            )
        if values is None:
            values = vals
        elif vals.shape != values.shape or not torch.equal(vals, values):
            raise ValueError("output_distribution returned different output values per chunk")
        cmax, amax = probs.max(dim=0)
        cmin, amin = probs.min(dim=0)
        amax = amax + start
        amin = amin + start
        if col_max is None:
            col_max, col_min, arg_max, arg_min = cmax, cmin, amax, amin
        else:
            upd = cmax > col_max
            col_max = torch.where(upd, cmax, col_max)
            arg_max = torch.where(upd, amax, arg_max)
            upd = cmin < col_min
            col_min = torch.where(upd, cmin, col_min)
            arg_min = torch.where(upd, amin, arg_min)
        start += chunk.numel()
    assert values is not None and col_max is not None and col_min is not None
    assert arg_max is not None and arg_min is not None
    if bool((col_min < 0).any()):
        raise ValueError("output_distribution returned negative probabilities")
    reachable = col_max > 0
    if not bool(reachable.any()):
        raise ValueError("output_distribution gave no output positive probability")
    gap = torch.full_like(col_max, -math.inf)
    pos = reachable & (col_min > 0)
    gap[pos] = torch.log(col_max[pos]) - torch.log(col_min[pos])
    gap[reachable & (col_min == 0)] = math.inf
    j = int(torch.argmax(gap))
    return ExactAudit(
        epsilon=float(gap[j]),
        x_high=float(xs[int(arg_max[j])]),
        x_low=float(xs[int(arg_min[j])]),
        y=float(values[j]),
    )


def exact_epsilon(
    mechanism: PerCoordinateRandomizer,
    inputs: Tensor | Sequence[float] | np.ndarray | None = None,
) -> float:
    """Exact audit by enumeration: ``max |log P(y|x) - log P(y|x')|`` over input pairs, outputs.

    ``inf`` if some output has zero probability under one input and positive under another.
    See :func:`exact_epsilon_witness` (which also returns the pair and output attaining it).

    Raises:
        ValueError: as :func:`exact_epsilon_witness` (a continuous mechanism such as LDPSGD is
            refused with a pointer to the empirical test).
    """
    return exact_epsilon_witness(mechanism, inputs).epsilon
