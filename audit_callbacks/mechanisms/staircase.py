"""Staircase randomized response, SRR-FL (§4.3-4.4 of 002; docs/methods/ldp.md, C6), and broken variants.

Construction used here (Varun et al. 2024 leaves the details below open; the choices are ours):

Grid. ``D = 2 r 10^p + 1`` values ``c - r + k 10^-p`` (see :mod:`.grid`).

Group sizes (eq. 4-6). ``|G_1| = D/m - (m - 1) Delta_d / 2`` and ``|G_j| = |G_1| + (j-1) Delta_d``
sum to D but are integers only when ``D/m - (m-1) Delta_d/2`` is. We round the cumulative sums
``S_j = |G_1| + ... + |G_j|`` half up (exact rational arithmetic): ``n_j = [S_j] - [S_{j-1}]``.
Then ``sum n_j = D`` exactly, ``|n_j - |G_j|| < 1``, ``n_j = |G_j|`` whenever the |G_j| are
integers, and every ``n_j >= 1`` provided ``|G_1| >= 1`` (we require that; it is slightly
stricter than eq. 5's ``Delta_d < 2D/(m(m-1))``, which only keeps |G_1| > 0). The sizes are
the same for every input, as 002 §4.4 requires for its privacy proof.

Groups (which values go where). For input index i, all D grid values are ranked by distance
``|k - i|``; of two values at the same distance the smaller (left) one comes first; once one
side runs out at the domain edge the ranking simply continues on the other side, so it is a
permutation of all D values for every input. ``G_1`` is the first ``n_1`` ranks (the input
itself, then its nearest neighbours), ``G_2`` the next ``n_2``, and so on: the groups partition
the domain, have the same sizes for every input, and every value in ``G_j`` is at least as close
to the input as every value in ``G_{j+1}``. Any deterministic tie rule gives the same privacy;
we take "left first" because (a) it is the order of the public reference code (a stable sort by
distance), and (b) it keeps the mechanism as identifiable as possible: inputs with identical
output laws occur only in two blocks at the domain edges (a window of n_1 values holding the
input cannot move past the edge, so about n_1 - 1 inputs collide under any tie rule), and in all 244
configurations we checked (D in {21, 31, 101, 151, 201}, m in {2, 3, 4, 5, 7, 10}, Delta_d from
0 to its maximum, eps in {0.5, 2}) the distinct rows were linearly independent, so the
debiasing below is exactly unbiased for every input between the edge blocks. The
reflection-symmetric rule ("towards the centre first") instead makes the centre input collide
with its neighbour when all cumulative sizes are even and left interior bias in 38 of those 244.

Probabilities (eq. 8, with the integer sizes). Each value in ``G_j`` has probability
``alpha_j = alpha_m (e^eps (m - j) + (j - 1)) / (m - 1)``, i.e. ``alpha_1 = e^eps alpha_m`` and
a constant step ``Delta_w = alpha_m (e^eps - 1)/(m - 1)``, with
``alpha_m = (m-1) / ((m-1) D e^eps - (e^eps - 1) sum_{j>=2} (j-1) n_j)``. This normalises
``sum_j n_j alpha_j = 1`` for ANY sizes summing to D, so the integer rounding keeps the rows
summing to 1 and the max/min probability ratio exactly e^eps. Since every output has, for every
input, a probability in ``[alpha_m, alpha_1]``, the mechanism is eps-LDP per coordinate; it is
exactly eps (the edge value ``c - r`` is in ``G_1`` for the input ``c - r`` and, ranked last,
in ``G_m`` for the input ``c + r``).

Sampling is O(1) per coordinate: draw the group j w.p. ``n_j alpha_j`` (the same for every
input), a uniform rank inside it, and map (input, rank) to the grid index.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from audit_callbacks.mechanisms.base import (
    _check_epsilon,
    _check_rows,
    _uniform,
)
from audit_callbacks.mechanisms.grid import GridRandomizer
from audit_callbacks.validation import check_choice, check_count, check_real

__all__ = [
    "BrokenStaircase",
    "Staircase",
    "reference_group_sizes",
    "staircase_alphas",
    "staircase_group_sizes",
    "staircase_max_delta",
]

_DEBIAS_METHODS = ("unbiased", "none")
_DEFECTS = ("interval", "sorted", "per_group")


# ----------------------------------------------------------------------- sizes, probabilities
def _check_groups(domain_size: int, groups: int) -> int:
    m = check_count(groups, "groups", minimum=2)
    if m > domain_size:
        raise ValueError(f"groups must be <= the domain size D = {domain_size}, got {m}")
    return m


def _as_fraction(value: float, name: str) -> Fraction:
    return Fraction(check_real(value, name, low=0.0))


def staircase_max_delta(domain_size: int, groups: int) -> float:
    """Eq. 5 of 002: ``Delta_d < 2 D / (m (m - 1))`` keeps ``|G_1| > 0``."""
    d = check_count(domain_size, "domain_size", minimum=1)
    m = _check_groups(d, groups)
    return 2.0 * d / (m * (m - 1))


def default_delta(domain_size: int, groups: int) -> int:
    """Default ``Delta_d = floor(D / (m (m - 1)))``: the integer part of half eq. 5's maximum,
    so ``|G_1|`` is about ``D / (2m)`` (002 gives no default)."""
    m = _check_groups(domain_size, groups)
    return domain_size // (m * (m - 1))


def staircase_group_sizes(domain_size: int, groups: int, delta_d: float) -> tuple[int, ...]:
    """Integer group sizes ``n_1..n_m`` (sum D) from eq. 4 and 6 of 002, rounded as above.

    Raises:
        ValueError: m < 2 or m > D, ``delta_d`` < 0 or not finite, or ``|G_1| < 1``.
    """
    d = check_count(domain_size, "domain_size", minimum=1)
    m = _check_groups(d, groups)
    delta = _as_fraction(delta_d, "delta_d")
    g1 = Fraction(d, m) - (m - 1) * delta / 2
    if g1 < 1:
        limit = 2 * (Fraction(d, m) - 1) / (m - 1)
        raise ValueError(
            f"delta_d = {float(delta_d)} makes |G_1| = {float(g1):.4g} < 1 (D = {d}, m = {m}); "
            f"use delta_d <= {float(limit):.6g} (eq. 5 of 002: strictly below "
            f"{2 * d / (m * (m - 1)):.6g})"
        )
    cumulative = [j * g1 + delta * j * (j - 1) / 2 for j in range(m + 1)]
    rounded = [math.floor(s + Fraction(1, 2)) for s in cumulative]
    sizes = tuple(rounded[j + 1] - rounded[j] for j in range(m))
    assert sum(sizes) == d and min(sizes) >= 1
    return sizes


def staircase_alphas(
    epsilon: float, sizes: tuple[int, ...] | list[int], domain_size: int | None = None
) -> Tensor:
    """Per-value probabilities ``alpha_1..alpha_m`` (float64 ``[m]``) of eq. 7-8 of 002.

    ``alpha_j = alpha_m (e^eps (m - j) + (j - 1)) / (m - 1)`` with
    ``alpha_m = (m-1) / ((m-1) D e^eps - (e^eps - 1) sum_{j>=2} (j-1) n_j)``;
    ``alpha_1 / alpha_m = e^eps``.

    Args:
        epsilon: the epsilon of one coordinate's release, in (0, 700].
        sizes: group sizes ``n_1..n_m``, m >= 2, each >= 1.
        domain_size: D in ``alpha_m``; default ``sum(sizes)``, which makes
            ``sum_j n_j alpha_j = 1``. Another D (the public reference code passes the true D
            with sizes that need not sum to it; :class:`BrokenStaircase`) does not normalise.

    Raises:
        ValueError: epsilon not in (0, 700]; sizes not a sequence of >= 2 integers >= 1;
            ``domain_size`` < 1.
    """
    eps = _check_epsilon(epsilon)
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__"):
        raise ValueError(f"sizes must be a sequence of group sizes, got {sizes!r}")
    sizes = tuple(check_count(n, "sizes", minimum=1) for n in sizes)
    m = len(sizes)
    if m < 2:
        raise ValueError(f"sizes must hold >= 2 groups of size >= 1, got {sizes}")
    d = sum(sizes) if domain_size is None else check_count(domain_size, "domain_size", minimum=1)
    epsilon = eps
    k = math.exp(epsilon)
    weighted = sum((j - 1) * n for j, n in enumerate(sizes, start=1))
    alpha_m = (m - 1) / ((m - 1) * d * k - math.expm1(epsilon) * weighted)
    return torch.tensor(
        [alpha_m * (k * (m - j) + (j - 1)) / (m - 1) for j in range(1, m + 1)], dtype=torch.float64
    )


def reference_group_sizes(domain_size: int, groups: int, delta_d: float) -> tuple[int, ...]:
    """Group sizes as the public SRR-FL reference code computes them (see BrokenStaircase).

    ``g1 = (2D/m - (m - 1) delta_d) / 2``; sizes ``int(g1) + 1`` then ``int(g1 + j delta_d)``
    for j = 1..m-1. Their sum is ``D - m frac(g1) + 1`` for integer delta_d: D only when
    ``m frac(g1) = 1``; otherwise the groups miss values or overrun the domain.
    """
    d = check_count(domain_size, "domain_size", minimum=1)
    m = _check_groups(d, groups)
    delta = _as_fraction(delta_d, "delta_d")
    g1 = (Fraction(2 * d, m) - (m - 1) * delta) / 2
    if g1 < 0:
        raise ValueError(f"delta_d = {float(delta_d)} makes the first group negative")
    sizes = (math.floor(g1) + 1,) + tuple(math.floor(g1 + j * delta) for j in range(1, m))
    if min(sizes) < 1:
        raise ValueError(f"reference group sizes {sizes} contain an empty group")
    return sizes


# ---------------------------------------------------------------------- ranking by distance
def _rank_of(i: Tensor, k: Tensor, domain_size: int) -> Tensor:
    """Rank (0 = the input itself) of grid index k in input i's distance ranking (broadcast).

    Ranking: by ``|k - i|``; of two values at the same distance the smaller (left) one first;
    once the shorter side is exhausted the longer side continues alone.
    """
    i, k = torch.broadcast_tensors(i, k)
    s = torch.minimum(i, domain_size - 1 - i)  # values on the shorter side
    t = (k - i).abs()
    paired = torch.where(k < i, 2 * t - 1, 2 * t)
    rank = torch.where(t <= s, paired, s + t)
    return torch.where(t == 0, torch.zeros_like(rank), rank)


def _index_at_rank(i: Tensor, rank: Tensor, domain_size: int) -> Tensor:
    """Inverse of :func:`_rank_of`: the grid index with the given rank for input i."""
    i, rank = torch.broadcast_tensors(i, rank)
    s = torch.minimum(i, domain_size - 1 - i)
    longer = torch.where(domain_size - 1 - i > i, 1, -1).to(i.dtype)  # the tail's side
    in_pairs = rank <= 2 * s
    t = torch.where(in_pairs, torch.div(rank + 1, 2, rounding_mode="floor"), rank - s)
    side = torch.where(in_pairs, torch.where(rank % 2 == 1, -1, 1).to(i.dtype), longer)
    return i + side * t


def _min_norm_solution(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Minimum-norm least-squares solution of ``a g = b`` for a wide ``a`` (K <= D), float64.

    Fast path: reduced QR of ``a^T = Q R``; when R is well conditioned (a has full row rank),
    ``g = Q R^-T b`` is the exact minimum-norm solution. Otherwise (dependent rows) fall back to
    an SVD least-squares solve (LAPACK gelsd). (torch.linalg.lstsq's gelsy driver is not used:
    on wide systems it misjudged the rank in our runs and returned wrong solutions.)
    """
    at = torch.from_numpy(np.ascontiguousarray(a.T))
    q, r = torch.linalg.qr(at, mode="reduced")
    diag = r.diagonal().abs()
    if a.shape[0] <= a.shape[1] and float(diag.min()) > 1e-10 * float(diag.max()):
        rhs = torch.from_numpy(np.ascontiguousarray(b)).reshape(-1, 1)
        y = torch.linalg.solve_triangular(r.T, rhs, upper=False)
        return (q @ y).reshape(-1).numpy()
    return np.linalg.lstsq(a, b, rcond=None)[0]


# ------------------------------------------------------------------------ grouped grid base
class _StaircaseGroups(GridRandomizer):
    """Grid mechanisms that release one of m groups of values ranked by distance from the input.

    Shared by :class:`Staircase` and :class:`BrokenStaircase`: the group count and step, the
    distance ranking (:meth:`rank`, :meth:`group_of`) and the O(1) sampler (draw the group j
    w.p. ``group_masses[j]``, the same for every input, then a uniform position inside it).
    Subclasses call :meth:`_set_groups` with their sizes and group masses.

    Args:
        epsilon_per_coordinate, center, radius, precision, rounding, dim: as
            :class:`~.grid.GridRandomizer`.
        groups: m >= 2 (<= D).
        delta_d: the group-size step Delta_d (real); default ``floor(D / (m (m - 1)))``.
    """

    def __init__(
        self,
        epsilon_per_coordinate: float,
        center: float,
        radius: float,
        precision: int,
        groups: int,
        delta_d: float | None,
        *,
        rounding: str,
        dim: int | None,
    ) -> None:
        super().__init__(epsilon_per_coordinate, center, radius, precision, rounding=rounding, dim=dim)
        self.groups: int = _check_groups(self.domain_size, groups)
        self.delta_d: float = float(
            default_delta(self.domain_size, self.groups) if delta_d is None else delta_d
        )

    def _set_groups(self, sizes: tuple[int, ...], masses: Tensor) -> None:
        """Store the sizes ``n_j`` and masses ``P(group j)`` (float64 ``[m]``, sum 1)."""
        self.group_sizes: tuple[int, ...] = tuple(sizes)
        self.group_masses: Tensor = masses
        self._sizes = torch.tensor(self.group_sizes, dtype=torch.int64)
        self._cum_sizes = torch.cumsum(self._sizes, 0)  # C_j: ranks < C_j lie in G_1..G_j
        self._mass_cdf = torch.cumsum(masses, 0)

    def rank(self, i: Tensor, k: Tensor) -> Tensor:
        """Rank of grid index k in input index i's distance ranking (int64, broadcast)."""
        return _rank_of(torch.as_tensor(i), torch.as_tensor(k), self.domain_size)

    def group_of(self, i: Tensor, k: Tensor) -> Tensor:
        """0-based group (0 = G_1) of grid index k for input index i (int64, broadcast).

        Ranks past the last group (sizes summing to less than D) give ``m``.
        """
        r = self.rank(i, k)
        return torch.searchsorted(self._cum_sizes.to(r.device), r, right=True)

    def _all_groups(self, k: Tensor) -> Tensor:
        """``group_of(k_i, every grid index)``: int64 ``[n, D]`` for input indices ``k [n]``."""
        return self.group_of(k.reshape(-1, 1).cpu(), torch.arange(self.domain_size).reshape(1, -1))

    def _draw_group_position(
        self, k: Tensor, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(group j, size n_j, position in 0..n_j - 1), int64 like ``k``, one per input."""
        cdf = self._mass_cdf.to(k.device)
        j = torch.searchsorted(cdf, _uniform(k.shape, k, generator), right=True).clamp(
            max=self.groups - 1
        )
        sizes = self._sizes.to(k.device)[j]
        pos = torch.floor(_uniform(k.shape, k, generator) * sizes.to(torch.float64)).to(torch.int64)
        return j, sizes, torch.minimum(pos, sizes - 1)

    def _sample_sorted(self, k: Tensor, generator: torch.Generator | None) -> Tensor:
        """The grid index at rank ``C_j - n_j + position`` of input k's distance ranking."""
        j, sizes, pos = self._draw_group_position(k, generator)
        rank = self._cum_sizes.to(k.device)[j] - sizes + pos
        return _index_at_rank(k, rank, self.domain_size)


# -------------------------------------------------------------------------------- Staircase
class Staircase(_StaircaseGroups):
    """Staircase randomized response (SRR-FL, 002 §4.3-4.4), per coordinate, eps-LDP each.

    See the module docstring for the exact construction (grid, integer group sizes, groups by
    distance with the tie rule, probabilities).

    Args:
        epsilon: per-coordinate epsilon, > 0 (``k = e^eps`` of 002).
        center, radius, precision, rounding, dim: as :class:`~.grid.GridRandomizer`.
        groups: m >= 2 (<= D).
        delta_d: the group-size step Delta_d >= 0 (real); default ``floor(D / (m (m - 1)))``.
            Must keep ``|G_1| = D/m - (m-1) Delta_d / 2 >= 1``.
        debias_method: ``"unbiased"`` (default) or ``"none"`` (identity: the plain average
            that 002's server takes, biased towards the centre).
        max_debias_domain: largest D for which the ``"unbiased"`` table is computed (it needs
            a least-squares solve of a D x D system); larger D raises in :meth:`debias`.

    Debiasing. ``E[y | x]`` is not affine in x (groups pile up on one side near the edges),
    so no affine correction is unbiased. Worse, near each edge the ranking puts the same values
    in every group for several inputs: the ``~n_1 / 2`` grid inputs nearest each edge have
    IDENTICAL output laws (:attr:`identical_input_blocks`), so no estimator whatsoever is
    unbiased for all of them. What holds for ``debias_method="unbiased"``: :meth:`debias` maps
    each output grid value through a table g, the minimum-norm least-squares solution
    (QR, or SVD when rows are dependent) of ``sum_y P(y | x) g(y) = x_bar(x)`` over the
    distinct rows of the transition matrix, where ``x_bar`` is x itself or, for the inputs of
    an edge block, the block's mean. When the distinct rows are linearly independent (in every
    configuration we checked, see the module docstring), g is EXACTLY unbiased (to float64
    round-off) for every grid input outside the two edge blocks, and its bias inside a block is
    at most half the block's width. :attr:`debias_bias` gives ``E[g(y) | x] - x`` for every
    grid input, so callers can check any configuration. With ``rounding="stochastic"`` the same
    holds for every clipped real input between the edge blocks. The price of unbiasedness is
    variance: at the centre input g's standard deviation was 2 to 540 times the raw output's
    (median 16) over those configurations, growing with m and shrinking as eps grows.
    ``debias_method="none"`` returns y (the paper's plain average: biased towards the centre).
    """

    name = "staircase"

    def __init__(
        self,
        epsilon_per_coordinate: float,
        center: float = 0.0,
        radius: float = 1.0,
        precision: int = 1,
        groups: int = 4,
        delta_d: float | None = None,
        *,
        rounding: str = "nearest",
        debias_method: str = "unbiased",
        max_debias_domain: int = 4001,
        dim: int | None = None,
    ) -> None:
        super().__init__(
            epsilon_per_coordinate, center, radius, precision, groups, delta_d, rounding=rounding, dim=dim
        )
        sizes = staircase_group_sizes(self.domain_size, self.groups, self.delta_d)
        self.alphas: Tensor = staircase_alphas(self.epsilon_per_coordinate, sizes)
        # P(group j) = n_j alpha_j, the same for every input
        self._set_groups(sizes, self.alphas * torch.tensor(sizes, dtype=torch.float64))
        self.debias_method: str = check_choice(debias_method, "debias_method", _DEBIAS_METHODS)
        self.max_debias_domain: int = check_count(max_debias_domain, "max_debias_domain", minimum=1)
        self._debias_table: Tensor | None = None
        self._debias_bias: Tensor | None = None
        self._blocks: tuple[int, int] | None = None

    # ------------------------------------------------------------------ groups
    def _rows(self, k: Tensor) -> Tensor:
        return self.alphas[self._all_groups(k)]

    def _sample(self, k: Tensor, generator: torch.Generator | None) -> Tensor:
        return self._sample_sorted(k, generator)

    # ---------------------------------------------------------------- debias
    def _solve_debias(self) -> None:
        d = self.domain_size
        if d > self.max_debias_domain:
            raise ValueError(
                f"the unbiased staircase table needs a D x D least-squares solve; D = {d} exceeds "
                f"max_debias_domain = {self.max_debias_domain} (raise it, or use "
                "debias_method='none')"
            )
        p = self.transition_matrix().numpy()
        grid = self.grid.numpy()
        _, first, inverse = np.unique(p, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        counts = np.bincount(inverse)
        block_mean = np.bincount(inverse, weights=grid) / counts
        rows = p[first]
        targets = block_mean[inverse[first]]
        g = _min_norm_solution(rows, targets)
        self._debias_table = torch.from_numpy(g)
        self._debias_bias = torch.from_numpy(p @ g - grid)
        left = int(counts[inverse[0]])
        right = int(counts[inverse[-1]])
        self._blocks = (left, right)

    @property
    def debias_table(self) -> Tensor:
        """g (float64 ``[D]``): :meth:`debias` maps output grid value k to ``g[k]``."""
        if self._debias_table is None:
            self._solve_debias()
        assert self._debias_table is not None
        return self._debias_table

    @property
    def debias_bias(self) -> Tensor:
        """``E[g(y) | x] - x`` for every grid input x (float64 ``[D]``), exact."""
        if self._debias_bias is None:
            self._solve_debias()
        assert self._debias_bias is not None
        return self._debias_bias

    @property
    def identical_input_blocks(self) -> tuple[int, int]:
        """How many grid inputs at the (left, right) edge share one output law (1 = none)."""
        if self._blocks is None:
            self._solve_debias()
        assert self._blocks is not None
        return self._blocks

    def debias(self, y: Tensor) -> Tensor:
        """``[B, d] -> [B, d]``: ``g[k(y)]`` (``"unbiased"``; see the class docstring for what
        holds) or ``y`` unchanged (``"none"``)."""
        _check_rows(y, "y")
        if self.debias_method == "none":
            return y.clone()
        k = self._output_grid_index(y)
        return self.debias_table.to(y.device)[k].to(y.dtype)

    def __repr__(self) -> str:
        return f"Staircase({self._grid_repr()}, groups={self.groups!r}, delta_d={self.delta_d!r})"


# -------------------------------------------------------------------------- broken variant
class BrokenStaircase(_StaircaseGroups):
    """Deliberately defective staircase mechanisms that an exact audit must flag.

    ``defect="interval"`` and ``"sorted"`` reproduce, in exact arithmetic, the staircase of the
    public SRR-FL reference code (github.com/matta-varun/SRR-FL, ``LDP_Functions.py``, class
    ``SRR``; ``MNIST_FL.py`` perturbs with its ``_perturb``). Both use its group sizes
    (:func:`reference_group_sizes`: they need not sum to D) and its probabilities: eq. 8 with the
    true D, then whatever is missing from 1 added to the FIRST group's total mass (so the
    per-value ratio exceeds e^eps whenever the sizes do not sum to D).

    - ``"interval"`` (the ``_perturb`` path, the one the reference's training uses): group j is
      the interval around w grown by ``n_j / 2`` grid steps on each side (shifted when it hits
      an edge), and a position ``pos`` uniform in ``0..n_j - 1`` is read as
      ``left_end + pos`` when ``pos <= size_left`` else ``previous_right_end + (pos - size_left)``,
      ``size_left = int((previous_left_end - left_end) / step)``. This read-out never outputs
      the value at a group's right end, and when a group's left end falls between grid values
      (odd ``n_j``) it releases that group's whole left part half a grid step off the grid;
      with odd ``n_1`` the input's own value is never output. Such values are possible under
      some inputs and impossible under others: not epsilon-LDP for any epsilon (exact audit:
      inf).
      Outputs are therefore on the half-step grid ``c - r + h 10^-p / 2``.
    - ``"sorted"`` (the reference's ``perturb``): the domain sorted by distance from w (stable
      sort: ties to the left, as in :class:`Staircase`), group j = the next ``n_j`` values.
      When the sizes sum to less than D the farthest values are never output (epsilon = inf);
      when they sum to more the reference indexes past the list, so we raise ValueError; when
      they sum to exactly D this path is the correct mechanism.
    - ``"per_group"`` (a misreading of eq. 3 that we did NOT find in that code: "alpha_j is the
      probability of group j"): correct groups (as :class:`Staircase`), but group j is drawn
      w.p. ``alpha_j / sum(alpha)`` and a value uniformly inside it, so a value's probability is
      ``alpha_j / (n_j sum(alpha))``: the exact epsilon is ``eps + log(n_m / n_1)`` > eps when
      ``delta_d > 0``.

    The claimed ``epsilon_per_coordinate`` is the ``epsilon`` argument (what the code claims).
    :meth:`debias` is the identity (the reference server averages raw outputs). Rounding of the
    input is to the nearest grid value.
    """

    name = "broken_staircase"

    def __init__(
        self,
        epsilon_per_coordinate: float,
        center: float = 0.0,
        radius: float = 1.0,
        precision: int = 1,
        groups: int = 4,
        delta_d: float | None = None,
        *,
        defect: str = "interval",
        dim: int | None = None,
    ) -> None:
        check_choice(defect, "defect", _DEFECTS)
        super().__init__(
            epsilon_per_coordinate, center, radius, precision, groups, delta_d, rounding="nearest", dim=dim
        )
        self.defect: str = defect
        d, m, eps = self.domain_size, self.groups, self.epsilon_per_coordinate
        if defect == "per_group":
            sizes = staircase_group_sizes(d, m, self.delta_d)
            alphas = staircase_alphas(eps, sizes)
            masses = alphas / alphas.sum()
        else:
            sizes = reference_group_sizes(d, m, self.delta_d)
            if defect == "sorted" and sum(sizes) > d:
                raise ValueError(
                    f"reference group sizes {sizes} sum to {sum(sizes)} > D = {d}: the reference "
                    "code indexes past the sorted domain (IndexError) for these parameters"
                )
            # eq. 8 with the true D although the sizes need not sum to it, then the fix-up
            masses = staircase_alphas(eps, sizes, d) * torch.tensor(sizes, dtype=torch.float64)
            masses[0] += 1.0 - float(masses.sum())
            if float(masses[0]) <= 0:
                raise ValueError("the reference's probability fix-up leaves group 1 a mass <= 0")
        self._set_groups(sizes, masses)
        self._per_value = masses / self._sizes.to(torch.float64)
        if defect == "interval":
            self._build_interval_tables()

    # ------------------------------------------------------------- interval emulation
    def _build_interval_tables(self) -> None:
        """Per (group, input) interval ends in half-step units (exact emulation)."""
        d = self.domain_size
        lo, hi = 0, 2 * (d - 1)  # the domain ends, in half steps
        cur_l = 2 * torch.arange(d, dtype=torch.int64)
        cur_r = cur_l.clone()
        hit_l = torch.zeros(d, dtype=torch.bool)
        hit_r = torch.zeros(d, dtype=torch.bool)
        tables = {"temp_l": [], "cur_l": [], "cur_r": [], "size_l": []}
        for n in self.group_sizes:
            free = ~hit_l & ~hit_r
            only_left_hit = hit_l & ~hit_r
            ext_l = torch.where(free, cur_l - n, torch.where(hit_r, cur_l - 2 * n, cur_l))
            ext_r = torch.where(free, cur_r + n, torch.where(only_left_hit, cur_r + 2 * n, cur_r))
            touch_l = ext_l <= lo
            ext_r = ext_r + (lo - ext_l).clamp(min=0)
            ext_l = ext_l.clamp(min=lo)
            touch_r = ext_r >= hi
            ext_l = ext_l - (ext_r - hi).clamp(min=0)
            ext_r = ext_r.clamp(max=hi)
            tables["temp_l"].append(ext_l)
            tables["cur_l"].append(cur_l)
            tables["cur_r"].append(cur_r)
            tables["size_l"].append(torch.div(cur_l - ext_l, 2, rounding_mode="trunc"))
            # the ends are the same whether the code tests < (last group) or <= (earlier
            # groups, which also set the flags): the difference is a shift by 0
            hit_l = hit_l | touch_l
            hit_r = hit_r | touch_r
            cur_l, cur_r = ext_l, ext_r
        self._t_temp_l = torch.stack(tables["temp_l"])  # [m, D]
        self._t_cur_l = torch.stack(tables["cur_l"])
        self._t_cur_r = torch.stack(tables["cur_r"])
        self._t_size_l = torch.stack(tables["size_l"])
        n = self._sizes.reshape(-1, 1)
        has_left = self._t_size_l >= 0
        left_hi = self._t_temp_l + 2 * torch.minimum(self._t_size_l, n - 1)
        first_right = torch.clamp(self._t_size_l + 1, min=0)
        has_right = first_right <= n - 1
        right_lo = self._t_cur_r + 2 * (first_right - self._t_size_l)
        right_hi = self._t_cur_r + 2 * (n - 1 - self._t_size_l)
        big = torch.iinfo(torch.int64).max
        h_min = min(
            int(torch.where(has_left, self._t_temp_l, big).min()),
            int(torch.where(has_right, right_lo, big).min()),
        )
        h_max = max(
            int(torch.where(has_left, left_hi, -big).max()),
            int(torch.where(has_right, right_hi, -big).max()),
        )
        self._h_min, self._h_max = h_min, h_max

    def _interval_output(self, j: Tensor, k: Tensor, pos: Tensor) -> Tensor:
        """Half-step position of the output for group j, grid input k, position pos."""
        temp_l = self._t_temp_l.to(k.device)[j, k]
        cur_r = self._t_cur_r.to(k.device)[j, k]
        size_l = self._t_size_l.to(k.device)[j, k]
        return torch.where(pos > size_l, cur_r + 2 * (pos - size_l), temp_l + 2 * pos)

    # -------------------------------------------------------------- mechanism hooks
    def output_values(self) -> Tensor:
        if self.defect != "interval":
            return self.grid
        h = torch.arange(self._h_min, self._h_max + 1, dtype=torch.float64)
        return (h + 2 * self._lo_int) / (2 * self._scale)

    def _output_value(self, o: Tensor) -> Tensor:
        if self.defect != "interval":
            return self._grid_value(o)
        return (o.to(torch.float64) + self._h_min + 2 * self._lo_int) / (2 * self._scale)

    def _rows(self, k: Tensor) -> Tensor:
        k = k.reshape(-1).cpu()
        n_in = k.numel()
        if self.defect == "per_group":
            return self._per_value[self._all_groups(k)]
        if self.defect == "sorted":
            group = self._all_groups(k)
            covered = group < self.groups
            per_value = torch.cat([self._per_value, torch.zeros(1, dtype=torch.float64)])
            return torch.where(covered, per_value[group.clamp(max=self.groups)], 0.0)
        width = self._h_max - self._h_min + 1
        probs = torch.zeros((n_in, width), dtype=torch.float64)
        for j, n in enumerate(self.group_sizes):
            pos = torch.arange(n).reshape(1, -1).expand(n_in, n)
            jj = torch.full_like(pos, j)
            h = self._interval_output(jj, k.reshape(-1, 1).expand(n_in, n), pos)
            probs.scatter_add_(
                1,
                h - self._h_min,
                torch.full(h.shape, float(self._per_value[j]), dtype=torch.float64),
            )
        return probs

    def _sample(self, k: Tensor, generator: torch.Generator | None) -> Tensor:
        if self.defect != "interval":
            return self._sample_sorted(k, generator)
        j, _, pos = self._draw_group_position(k, generator)
        return self._interval_output(j, k, pos) - self._h_min

    def debias(self, y: Tensor) -> Tensor:
        """Identity (the reference server averages the raw outputs)."""
        return _check_rows(y, "y").clone()

    def __repr__(self) -> str:
        return (
            f"BrokenStaircase({self._grid_repr()}, groups={self.groups!r}, "
            f"delta_d={self.delta_d!r}, defect={self.defect!r})"
        )
