"""Cosine statistics of canaries for both threat models (Andrew et al., ICLR 2024, Alg. 2 and 3).

* final model: ``cos(c_j, sign * (theta_T - theta_0))`` for every canary;
* all iterates: ``max_t cos(c_j, sign * Delta_t)`` over the rounds (or logical DP-SGD steps)
  ``Delta_t = theta_t - theta_{t-1}`` seen so far, for every canary.

``sign`` is +1 for DP-FedAvg (canaries are client updates, the model moves along them) and -1
for DP-SGD (canaries are gradients, the model moves against them).

Hadamard canaries (:class:`~audit_callbacks.canary.vectors.HadamardCanaries`) score every canary
against a delta in one transform (the release's shared
:class:`~audit_callbacks.canary.projection.Projection`), so every round is folded into the
running maxima when it arrives. Gaussian canaries are regenerated for every pass, so deltas are
buffered in fixed blocks (:class:`~audit_callbacks.canary.projection.BlockBuffer`) and folded in
one pass over the canaries when ``max_buffered`` rounds are pending or an estimate is asked
for; a resumed run equals an uninterrupted one bit for bit.

Everything runs on the calling thread, on the device of the model's vectors, and a round costs
no host synchronisation: the running maxima stay on that device, a round whose delta
has a NaN or inf entry is not folded (Hadamard: its cosines are NaN and ``torch.fmax`` keeps the
maxima; Gaussian: its column is masked) and is counted in a device tensor. The counts
(``rounds_seen``, ``rounds_skipped``) and the statistics are read back to the host only when
asked for (:meth:`CanaryStatistics.compute`, a checkpoint, an estimate).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from audit_callbacks.canary.base import Release
from audit_callbacks.canary.projection import BlockBuffer, Projection, block_passes, group_rounds
from audit_callbacks.canary.vectors import CanarySet

__all__ = ["CanaryStatistics", "group_rounds"]

_TINY = 1e-300  # below the norm of any vector with a nonzero float32 entry


def _finite(vec: torch.Tensor) -> bool:
    """Whether every entry is finite (reads one value back: a host synchronisation)."""
    return bool(torch.isfinite(vec).all())


class CanaryStatistics:
    """Cosine statistics of observed and unobserved canaries: the final-model cosines and the
    all-iterates maximum cosines (a :class:`~audit_callbacks.canary.base.CanaryStatistic` of the
    model deltas).

    Args:
        canaries: the set of exactly k + k' canaries; indices ``0..num_observed-1`` are
            observed (inserted), the others are never inserted.
        num_observed: k.
        num_unobserved: k'.
        sign: +1 (updates) or -1 (gradients), see the module docstring.
        max_buffered: Gaussian canaries: rounds buffered before a pass over the canaries (the
            results do not depend on it).

    Raises:
        ValueError: the set is smaller than k + k', a sign other than +-1.
    """

    name = "max_cosine"
    reads = "model_delta"
    state_key = "stats"

    def __init__(
        self, canaries: CanarySet, num_observed: int, num_unobserved: int, *, sign: float = 1.0,
        max_buffered: int = 32,
    ) -> None:
        if num_observed + num_unobserved != len(canaries):
            raise ValueError("the canary set must hold exactly num_observed + num_unobserved canaries")
        if sign not in (1.0, -1.0):
            raise ValueError(f"sign must be +1 or -1, got {sign}")
        self.canaries = canaries
        self.num_observed = int(num_observed)
        self.num_unobserved = int(num_unobserved)
        self.sign = float(sign)
        self.max_buffered = max(1, int(max_buffered))
        self.group = group_rounds(canaries.dim)
        self.max_cos = torch.full((self.num_observed + self.num_unobserved,), -math.inf,
                                  dtype=torch.float64)
        self.theta0: torch.Tensor | None = None
        self._seen_base = 0  # rounds folded before this object's deltas (a checkpoint's)
        self._skipped_base = 0  # rounds skipped without a device count (a checkpoint's, skip())
        self._arrivals = 0  # deltas given to add_delta since then (finite or not)
        self._folded: torch.Tensor | None = None  # device int64: how many of them were finite
        self._nan_on: torch.Tensor | None = None  # a 0-dim float64 NaN on the deltas' device
        # Gaussian canaries: the deltas waiting for a pass over the canaries
        self._buffer = BlockBuffer(canaries.dim, self.group, self.max_buffered)
        self._final_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # (theta, cosines)

    @property
    def dim(self) -> int:
        return self.canaries.dim

    @property
    def exact_per_round(self) -> bool:
        """Whether every round is folded on arrival (Hadamard canaries: one transform)."""
        return self.canaries.kind == "hadamard"

    def _check(self, vec: torch.Tensor, name: str) -> None:
        if vec.dim() != 1 or vec.numel() != self.dim:
            raise ValueError(f"{name}: expected a flat vector of {self.dim} entries, got {tuple(vec.shape)}")

    def set_initial(self, theta0: torch.Tensor) -> None:
        """Record ``theta_0`` (flat ``[d]``), the model before training."""
        self._check(theta0, "theta0")
        self.theta0 = theta0.detach().to(torch.float32).clone()
        self._final_cache = None

    @property
    def rounds_skipped(self) -> int:
        """Rounds not folded: deltas with a NaN or inf entry, and :meth:`skip` (reads the device
        count back: call it at estimate time, not per round)."""
        return self._skipped_base + self._not_folded()

    @rounds_skipped.setter
    def rounds_skipped(self, value: int) -> None:
        self._skipped_base = int(value) - self._not_folded()

    def _not_folded(self) -> int:
        """Deltas given since the checkpoint that were not folded (reads the device count)."""
        return self._arrivals - (0 if self._folded is None else int(self._folded))

    @property
    def rounds_seen(self) -> int:
        """Rounds folded (or buffered) so far (reads the device count back, as
        :attr:`rounds_skipped`)."""
        return self._seen_base + self._arrivals - self._not_folded()

    def skip(self) -> None:
        """Count a release the audit could not read (nothing folded, no synchronisation)."""
        self._skipped_base += 1

    def _on_device(self, device: torch.device) -> None:
        """Keep the running maxima and the non-finite count on the deltas' device."""
        if self.max_cos.device != device:
            self.max_cos = self.max_cos.to(device)
        if self._folded is None:
            self._folded = torch.zeros((), dtype=torch.int64, device=device)
            self._nan_on = torch.full((), math.nan, dtype=torch.float64, device=device)
        elif self._folded.device != device:
            self._folded = self._folded.to(device)
            self._nan_on = torch.full((), math.nan, dtype=torch.float64, device=device)

    def fold(self, release: Release) -> torch.Tensor:
        """Fold one release's model delta (:meth:`add_delta` with its shared projection)."""
        return self.add_delta(release.vector, projection=release.projection)

    def add_delta(self, delta: torch.Tensor, *, projection: Projection | None = None) -> torch.Tensor:
        """Fold (or buffer) one round's model delta ``[d]``, with no host synchronisation.

        A delta with a NaN or inf entry is not folded and is counted in ``rounds_skipped``
        (a device count, read back at estimate time).

        Args:
            delta: ``[d]`` floating, any device.
            projection: the delta's :class:`~audit_callbacks.canary.projection.Projection`,
                shared with the other statistics of the release (None: made here).

        Returns:
            A 0-dim bool tensor on the delta's device: whether the round was folded (reading it
            as a Python bool synchronises; the auditor never does per round).
        """
        self._check(delta, "delta")
        if delta.requires_grad:
            delta = delta.detach()
        self._on_device(delta.device)
        assert self._folded is not None and self._nan_on is not None
        self._arrivals += 1
        if self.exact_per_round:
            # the set is exactly k + k' canaries; a non-finite delta gives NaN cosines (its norm
            # is not finite), which the maxima ignore. The steps of CanarySet.cosines, from the
            # release's projection (its dot products serve the other statistics too)
            if projection is None:
                projection = Projection(self.canaries, delta)
            norm = projection.norm
            dots = projection.dots
            ok = norm < math.inf  # = isfinite(norm) for a norm (>= 0 or NaN), 1 operation, not 4
            # cosines_from_dots(dots, norm) in fewer operations, the same bits: the divisor is
            # the norm, NaN for a non-finite delta, and any positive number where the norm is
            # below 1e-300 (0 included): such a delta has no float32 entry but +-0 in its first
            # n coordinates, so its dots are +-0, which every positive divisor keeps
            safe = torch.where(ok, norm.clamp_min(_TINY), self._nan_on)
            cos = torch.div(dots, safe).clamp_(-1.0, 1.0)
            if self.sign != 1.0:
                cos.mul_(self.sign)
            # = torch.fmax(max_cos, cos), 10x faster: cos is NaN in every entry or in none
            torch.maximum(self.max_cos, cos.nan_to_num_(nan=-math.inf), out=self.max_cos)
            self._folded += ok
            return ok
        ok = torch.isfinite(delta).all()
        self._folded += ok
        if self._buffer.add(delta, ok):
            self._fold(None)
        return ok

    def flush(self) -> None:
        """Fold the buffered deltas into the running maxima."""
        if self._buffer.pending:
            self._fold(None)

    def _fold(self, final: torch.Tensor | None) -> torch.Tensor | None:
        """One pass over the Gaussian canaries: fold the pending blocks into the maxima, and
        return the cosines with ``final`` (when given)."""
        work = self._buffer.take()
        norms = [_row_norms(block) for block, *_ in work]
        n = self.max_cos.numel()
        out = None
        if not work and final is None:
            return None
        device = (final if final is not None else work[0][0]).device
        if self.max_cos.device != device:
            self.max_cos = self.max_cos.to(device)
        if final is not None:
            out = torch.empty(n, dtype=torch.float64, device=device)
            final32 = final.to(torch.float32)
            norm = torch.linalg.vector_norm(final.to(torch.float64))
            final_norm = torch.where(norm > 0, norm, torch.ones_like(norm))
        for pos, end, chunk, products in block_passes(self.canaries, work, device):
            for (_, ok, _, lo, hi), product, row_norms in zip(work, products, norms, strict=True):
                cos = (product / row_norms).clamp_(-1.0, 1.0)  # rows lo..hi-1 hold rounds not folded yet
                # a non-finite round's column (NaN) never reaches the maxima
                cos = torch.where(ok[lo:hi], cos[:, lo:hi] * self.sign, -math.inf)
                top = cos.max(dim=1).values
                torch.maximum(self.max_cos[pos:end], top, out=self.max_cos[pos:end])
            if out is not None:
                cos = (torch.mv(chunk, final32).to(torch.float64) / final_norm).clamp_(-1.0, 1.0)
                out[pos:end] = cos * self.sign
        return None if out is None else out.cpu()

    def compute(self, theta_now: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fold what is pending and return the statistics (float64, CPU).

        Args:
            theta_now: the current flat model ``[d]``.

        Returns:
            ``{"final_observed" [k], "final_unobserved" [k'], "all_observed" [k],
            "all_unobserved" [k']}``; the all-iterates entries are empty before any round.

        Raises:
            RuntimeError: before :meth:`set_initial`; ValueError: a model of the wrong size or
            with NaN or inf entries.
        """
        if self.theta0 is None:
            raise RuntimeError("set_initial(theta0) must be called before compute()")
        self._check(theta_now, "theta_now")
        theta = theta_now.detach().to(device=self.theta0.device, dtype=torch.float32)
        if not _finite(theta):
            raise ValueError("theta_now: cannot take cosines against a model with NaN or inf entries")
        cached = self._final_cache
        if cached is not None and not self._buffer.pending and torch.equal(cached[0], theta):
            return self._results(cached[1])  # same model, no new round: no pass over the canaries
        release = theta - self.theta0
        if self.exact_per_round:
            final = (self.canaries.cosines(release) * self.sign).cpu()
        else:
            final = self._fold(release)
        assert final is not None
        self._final_cache = (theta.clone(), final)
        return self._results(final)

    def _results(self, final: torch.Tensor) -> dict[str, torch.Tensor]:
        k = self.num_observed
        have_all = self.rounds_seen > 0
        empty = torch.empty(0, dtype=torch.float64)
        max_cos = self.max_cos.cpu() if have_all else empty
        return {
            "final_observed": final[:k].clone(),
            "final_unobserved": final[k:].clone(),
            "all_observed": max_cos[:k].clone() if have_all else empty,
            "all_unobserved": max_cos[k:].clone() if have_all else empty,
        }

    def scores(self) -> tuple[np.ndarray, np.ndarray]:
        """``(observed [k], unobserved [k'])``: the all-iterates maximum cosines (pending
        rounds folded first; empty before any round)."""
        self.flush()
        if self.rounds_seen == 0:
            return np.empty(0), np.empty(0)
        max_cos = self.max_cos.cpu().numpy().astype(np.float64, copy=True)
        return max_cos[: self.num_observed], max_cos[self.num_observed:]

    def estimate(self, delta: float, *, alpha: float = 0.05, bootstrap: int = 0, seed: int = 0) -> Any:
        """The max-cosine estimate of every observed canary's scores (Andrew et al., Alg. 3):
        the equal-variance two-Gaussian fit of :meth:`scores` (the auditor's report uses the
        canaries that took part); ValueError with fewer than 2 scores."""
        from audit_callbacks.estimators import CanaryScoreAuditor

        observed, unobserved = self.scores()
        return CanaryScoreAuditor(observed, unobserved).epsilon_estimate(
            delta, fit="equal", bootstrap=bootstrap, confidence=1.0 - alpha, seed=seed)

    def state_dict(self) -> dict[str, Any]:
        """Everything the statistics depend on (the pending rounds are folded first)."""
        self.flush()
        return {
            "kind": self.canaries.kind,
            "seed": self.canaries.seed,
            "dim": self.dim,
            "num_observed": self.num_observed,
            "num_unobserved": self.num_unobserved,
            "sign": self.sign,
            "max_cos": self.max_cos.cpu().clone(),
            "theta0": None if self.theta0 is None else self.theta0.cpu().clone(),
            "rounds_seen": self.rounds_seen,
            "rounds_skipped": self.rounds_skipped,
            "positions": self._buffer.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: the checkpoint's canaries (kind, seed, dimension, k, k', sign) differ
                from this object's, naming the field, or a state of the wrong shape.
        """
        mine = {"kind": self.canaries.kind, "seed": self.canaries.seed, "dim": self.dim,
                "num_observed": self.num_observed, "num_unobserved": self.num_unobserved,
                "sign": self.sign}
        for key, value in mine.items():
            theirs = state.get(key, "gaussian" if key == "kind" else None)
            if theirs != value:
                raise ValueError(f"checkpointed canary statistics have {key}={theirs!r}, this run {value!r}")
        max_cos = torch.as_tensor(state["max_cos"], dtype=torch.float64)
        if max_cos.shape != self.max_cos.shape:
            raise ValueError(f"checkpointed max_cos has shape {tuple(max_cos.shape)}, expected "
                             f"{tuple(self.max_cos.shape)}")
        theta0 = state["theta0"]
        if theta0 is not None and tuple(theta0.shape) != (self.dim,):
            raise ValueError(f"checkpointed theta0 has shape {tuple(theta0.shape)}, expected ({self.dim},)")
        device = self.theta0.device if self.theta0 is not None else torch.device("cpu")
        self.max_cos = max_cos.to(self.max_cos.device).clone()
        self.theta0 = None if theta0 is None else theta0.to(device=device, dtype=torch.float32).clone()
        self._seen_base = int(state["rounds_seen"])
        self._skipped_base = int(state["rounds_skipped"])
        self._arrivals, self._folded = 0, None
        # the block row of the next delta: the deltas given so far (older checkpoints: the
        # rounds seen, as they had no row for a skipped round)
        self._buffer.reset(int(state.get("positions", self._seen_base)))
        self._final_cache = None


def _row_norms(block: torch.Tensor) -> torch.Tensor:
    """Float64 norms of the rows (1 for a zero row: its cosines are 0)."""
    norms = torch.linalg.vector_norm(block.to(torch.float64), dim=1)
    return torch.where(norms > 0, norms, torch.ones_like(norms))
