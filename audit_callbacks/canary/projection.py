"""The projection of a release onto the canaries, written once for every statistic.

Every canary statistic reads a release through its dot products with the k + k' canaries,
``<c_j, v>``:

* Hadamard canaries (:class:`~audit_callbacks.canary.vectors.HadamardCanaries`): one transform
  gives all of them. :class:`Projection` computes them once per released vector, on its device,
  when a statistic first asks, and hands the same tensors to every statistic of that release
  (the final-model / max-cosine statistic and the known-rounds statistic of a DP-FedAvg round
  share one transform).
* Gaussian canaries are regenerated chunk by chunk for every pass over them, so the released
  vectors are buffered (:class:`BlockBuffer`) and projected in one pass when enough are
  pending or an estimate is asked for. A pass multiplies each chunk of canaries by a fixed
  block of ``group`` rows (rows ``b * group .. (b + 1) * group - 1``, zeros where a vector has
  not arrived): a vector's dot products then have the same bits whenever the pass runs (a
  column of a matrix product does not depend on the other columns), so a resumed run equals an
  uninterrupted one bit for bit.

Nothing here reads a value back to the host.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from audit_callbacks.canary.vectors import CanarySet

__all__ = ["BlockBuffer", "Projection", "block_passes", "group_rounds"]

_GROUP_ROUNDS = 16  # rows per matrix product (one product costs about one matrix-vector)
_GROUP_BYTES = 8 << 20  # ... but a block stays under 8 MiB: fewer rows for a large d


def group_rounds(dim: int) -> int:
    """Rows per fixed block for dimension ``dim``: ``min(16, 8 MiB / (4 d))``, at least 1."""
    return max(1, min(_GROUP_ROUNDS, _GROUP_BYTES // (4 * int(dim))))


class Projection:
    """The dot products of one released vector with every canary, computed once and shared.

    Args:
        canaries: the audit's canary set (k + k' canaries).
        vector: the released vector ``[d]`` (a model delta or a noisy sum), any floating dtype
            and device; kept, not copied (the caller must not modify it while the release is
            being folded).

    Attributes:
        vector: ``vector``, detached.
    """

    __slots__ = ("_dots", "_norm", "canaries", "vector")

    def __init__(self, canaries: CanarySet, vector: torch.Tensor) -> None:
        self.canaries = canaries
        self.vector = vector.detach() if vector.requires_grad else vector
        self._dots: torch.Tensor | None = None
        self._norm: torch.Tensor | None = None

    @property
    def dots(self) -> torch.Tensor:
        """``[k + k']`` float64 ``<c_j, vector>`` in the canaries' order (one transform for
        Hadamard canaries), on the vector's device; shared: never modify it."""
        if self._dots is None:
            self._dots = self.canaries.dots(self.vector)
        return self._dots

    @property
    def norm(self) -> torch.Tensor:
        """0-dim float64 ``||vector||`` (NaN or inf when the vector has a NaN or inf entry)."""
        if self._norm is None:
            self._norm = torch.linalg.vector_norm(self.vector, dtype=torch.float64)
        return self._norm


#: one unit of pending work: (block [group, d] float32, ok [group] bool, payload per row, first
#: row not folded yet, one past the last row to fold)
Work = tuple[torch.Tensor, torch.Tensor, list[Any], int, int]


class BlockBuffer:
    """Released vectors buffered in fixed blocks of ``group`` rows (Gaussian canaries).

    Args:
        dim: d, the vectors' length.
        group: rows per block (:func:`group_rounds`).
        max_buffered: vectors pending after which :meth:`add` asks for a pass (>= 1).

    Attributes:
        position: the vectors given so far (and restored from a checkpoint): the next one goes
            to row ``position % group``.
        pending: vectors given since the last :meth:`take`.
    """

    def __init__(self, dim: int, group: int, max_buffered: int) -> None:
        self.dim = int(dim)
        self.group = int(group)
        self.max_buffered = max(1, int(max_buffered))
        self.reset(0)

    def reset(self, position: int) -> None:
        """Drop everything buffered; the next vector goes to row ``position % group``."""
        self.position = int(position)
        self.pending = 0
        self._full: list[Work] = []
        self._block: torch.Tensor | None = None
        self._ok: torch.Tensor | None = None
        self._payload: list[Any] = []
        self._done = 0  # the first row of the current block not folded yet

    def add(self, vector: torch.Tensor, ok: torch.Tensor, payload: Any = None) -> bool:
        """Buffer ``vector`` ``[d]`` (``ok``: a device bool, False for a vector with a NaN or inf
        entry, whose row is then left out of the pass) with a per-row ``payload`` (e.g. the
        step's rate). Returns whether ``max_buffered`` vectors are pending (time for a pass)."""
        row = self.position % self.group
        self.position += 1
        if self._block is None:
            self._block = torch.zeros(self.group, self.dim, dtype=torch.float32, device=vector.device)
            self._ok = torch.zeros(self.group, dtype=torch.bool, device=vector.device)
            self._payload = [None] * self.group
            self._done = row
        assert self._ok is not None
        self._block[row] = vector.to(torch.float32)
        self._ok[row] = ok
        self._payload[row] = payload
        self.pending += 1
        if row == self.group - 1:
            self._full.append((self._block, self._ok, self._payload, self._done, self.group))
            self._block, self._ok, self._payload = None, None, []
        return self.pending >= self.max_buffered

    def take(self) -> list[Work]:
        """The rows given since the last call, as blocks ``(block, ok, payload, lo, hi)`` (rows
        ``lo..hi-1`` to fold; a block still being filled is returned again later with its
        newer rows only)."""
        if not self.pending:
            return []
        work = list(self._full)
        if self._block is not None:
            filled = self.position % self.group
            if filled > self._done:
                assert self._ok is not None
                work.append((self._block, self._ok, self._payload, self._done, filled))
            self._done = filled
        self._full, self.pending = [], 0
        return work


def block_passes(canaries: CanarySet, work: list[Work], device: torch.device
                 ) -> Iterator[tuple[int, int, torch.Tensor, list[torch.Tensor]]]:
    """One pass over the canaries: for each chunk ``(start, end, chunk [n, d], products)``,
    ``products[i]`` the float64 ``chunk @ block_i^T`` ``[n, group]`` of each block of ``work``
    (the dot products of every row, computed on the fixed block: the same bits whenever the
    pass runs)."""
    pos = 0
    for part, chunk in canaries.chunks(device=device):  # type: ignore[attr-defined]
        end = pos + len(part)
        yield pos, end, chunk, [torch.mm(chunk, block.t()).to(torch.float64) for block, *_ in work]
        pos = end
