"""Running canary statistics for the two threat models (paper 003 Alg. 2 and 3; METHODS A4, A5).

Torch only, no Lightning. :class:`CanaryStatistics` holds, for k observed and k' unobserved
canaries of one :class:`~audit_callbacks.canaries.CanarySet`:

* ``final_model``: ``cos(c_j, sign * (theta_now - theta_0))`` for every canary (A4);
* ``all_iterates``: the running ``max_t cos(c_j, sign * Delta_t)`` over every round's model delta
  ``Delta_t = theta_t - theta_{t-1}`` (A5).

``sign`` is +1 when a canary is added to the update the model moves along (DP-FedAvg client
updates) and -1 when it is added to a gradient the model moves against (DP-SGD, METHODS A7).

Deltas are buffered (at most ``max_buffered`` of them, plus the final-model column) and folded
into the running maxima in one pass over the canaries, so each pass regenerates every canary
once whatever the number of buffered rounds. Memory: O((max_buffered + 2 * group + chunk) * d).

Fixed layout (bit-identical resume): the n-th delta ever added (n = ``rounds_seen`` before it)
is stored in row ``n % group`` of a ``[group, d]`` block of its own (block ``n // group``), rows
without a pending delta are zero, and a pass multiplies each canary chunk by whole blocks
(``chunk @ block.T``, one matrix product instead of ``group`` matrix-vector products). The
``group`` depends on ``d`` only, the canary chunks on ``d`` and the chunk size only, so a delta's
dot products are computed with the same operands at the same positions whenever its pass runs:
an interrupted and resumed run (a checkpoint flushes the buffer) folds bit-identical cosines. The
final-model column is one matrix-vector product per chunk.

Background passes (:meth:`CanaryStatistics.compute_async`, and the pass a full buffer starts):
the pending deltas are handed over on the calling thread and folded on one estimation thread
(the canary set's own background thread, :meth:`~audit_callbacks.canaries.CanarySet.executor`,
so that passes and canaries generated ahead share one thread beside training), so training goes
on while the canaries are regenerated. At most one pass is in flight (a new one
first waits for it), passes run in the order they were started, and every method that reads or
replaces the statistics waits for the pass in flight: results are the same as without threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from audit_callbacks.canaries import CanarySet, thread_pool

__all__ = ["CanaryStatistics"]


def _ignore(_: object) -> None:
    return None


def _all_finite(vec: torch.Tensor) -> bool:
    """Whether every entry is finite. A NaN or inf entry makes the sum NaN or inf, so a finite
    sum settles it in one reduction (5 us against 71 us for ``isfinite(vec).all()`` at
    d = 13,706, and this runs every round); an overflowing sum of finite entries falls back to
    the exact test.
    """
    if math.isfinite(float(vec.sum())):
        return True
    return bool(torch.isfinite(vec).all())

_GROUP_ROUNDS = 16  # deltas per matrix product (one product costs about one matrix-vector here)
_GROUP_BYTES = 8 << 20  # ... but a block stays under 8 MiB: fewer rows for a large d


def group_rounds(dim: int) -> int:
    """Deltas per fixed block for dimension ``dim``: ``min(16, 8 MiB / (4 d))``, at least 1."""
    return max(1, min(_GROUP_ROUNDS, _GROUP_BYTES // (4 * int(dim))))


class CanaryStatistics:
    """Cosine statistics of observed and unobserved canaries.

    Args:
        canaries: the set; indices ``0..num_observed-1`` are observed (inserted), the next
            ``num_unobserved`` are never inserted.
        num_observed: k.
        num_unobserved: k'.
        sign: +1 (updates) or -1 (gradients), see the module docstring.
        max_buffered: rounds buffered before a pass over the canaries (the results do not
            depend on it, see the module docstring).
        background: run the pass a full buffer starts on the estimation thread (the buffer's
            memory is then held twice at most: the pass's deltas and the new ones).
    """

    def __init__(
        self, canaries: CanarySet, num_observed: int, num_unobserved: int, *, sign: float = 1.0,
        max_buffered: int = 32, background: bool = True,
    ) -> None:
        if num_observed + num_unobserved > len(canaries):
            raise ValueError("the canary set is smaller than num_observed + num_unobserved")
        if sign not in (1.0, -1.0):
            raise ValueError(f"sign must be +1 or -1, got {sign}")
        self.canaries = canaries
        self.num_observed = int(num_observed)
        self.num_unobserved = int(num_unobserved)
        self.sign = float(sign)
        self.max_buffered = max(1, int(max_buffered))
        total = self.num_observed + self.num_unobserved
        self.max_cos = torch.full((total,), -math.inf, dtype=torch.float64)
        self.theta0: torch.Tensor | None = None
        self.rounds_seen = 0
        self.rounds_skipped = 0
        self.group = group_rounds(canaries.dim)
        # buffered deltas: block index -> ([group, d] float32, rows pending)
        self._blocks: dict[int, tuple[torch.Tensor, list[int]]] = {}
        self._pending = 0
        self._final_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # (theta, cosines)
        self.background = bool(background)
        # the estimation thread when the canary set has no background thread (workers == 1)
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future[Any] | None = None

    @property
    def dim(self) -> int:
        return self.canaries.dim

    def set_initial(self, theta0: torch.Tensor) -> None:
        """Record ``theta_0`` (flat ``[d]``), the model before training."""
        self._check(theta0)
        self.wait()
        self.theta0 = theta0.detach().to("cpu", torch.float32).clone()
        self._final_cache = None

    def _check(self, vec: torch.Tensor) -> None:
        if vec.dim() != 1 or vec.numel() != self.dim:
            raise ValueError(f"expected a flat vector of {self.dim} entries, got {tuple(vec.shape)}")

    def add_delta(self, delta: torch.Tensor) -> bool:
        """Buffer one round's model delta ``[d]``. Returns False (and skips it) if non-finite."""
        self._check(delta)
        if not _all_finite(delta):
            self.rounds_skipped += 1
            return False
        block_idx, row = divmod(self.rounds_seen, self.group)
        entry = self._blocks.get(block_idx)
        if entry is None:
            entry = self._blocks[block_idx] = (torch.zeros(self.group, self.dim, dtype=torch.float32), [])
        entry[0][row] = delta.detach().to("cpu", torch.float32)
        entry[1].append(row)
        self._pending += 1
        self.rounds_seen += 1
        if self._pending >= self.max_buffered:
            if self.background:
                self._submit(self._take(), None, _ignore)
            else:
                self._run(self._take(), None, _ignore)
        return True

    def flush(self) -> None:
        """Fold the buffered deltas into the running maxima (waits for a background pass)."""
        self.wait()
        if self._pending:
            self._run(self._take(), None, _ignore)

    def wait(self) -> None:
        """Wait for the background pass in flight, if any (re-raises its exception)."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            fut.result()

    def close(self) -> None:
        """Wait for the pass in flight, then stop this object's own estimation thread, if it
        has one (restarted on demand). Passes that ran on the canary set's thread leave it to
        :meth:`CanarySet.close <audit_callbacks.canaries.CanarySet.close>`.

        An error of that pass is not raised here (whoever holds its Future, or :meth:`wait`,
        reports it): closing runs on the way out of a failed fit too.
        """
        fut, self._inflight = self._inflight, None
        if fut is not None:
            fut.exception()  # waits; the error stays with the Future
        pool, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        self.wait()
        state = dict(self.__dict__)
        state["_executor"] = None
        state["_inflight"] = None
        return state

    def _submit(
        self, blocks: list[tuple[torch.Tensor, list[int]]], final: torch.Tensor | None,
        then: Callable[[torch.Tensor | None], Any],
    ) -> Future[Any]:
        """Fold ``blocks`` (and cosines with ``final``) on the estimation thread, then ``then``.

        The estimation thread is the canary set's own background thread when it has one
        (:meth:`~audit_callbacks.canaries.CanarySet.executor`), so the pass and the canaries
        generated ahead for the next rounds queue on one thread instead of competing with
        training for the CPUs. The pass generates its canaries on that thread alone (splitting
        its chunks over the same pool would wait for itself).
        """
        self.wait()  # one pass in flight at most: bounded memory, passes in order
        def task() -> Any:
            return then(self._fold(blocks, final, parallel=False))

        if self.canaries.executor() is not None:  # the set's thread: one thread beside training
            fut = self.canaries.run_in_background(task)
        else:
            if self._executor is None:
                self._executor = thread_pool(1, "canary-estimate")
            fut = self._executor.submit(task)
        self._inflight = fut
        return fut

    def _run(
        self, blocks: list[tuple[torch.Tensor, list[int]]], final: torch.Tensor | None,
        then: Callable[[torch.Tensor | None], Any],
    ) -> Any:
        """Fold on this thread (after the pass in flight). The estimation thread is configured
        like this one (:func:`~audit_callbacks.canaries.thread_pool`), so a pass gives the same
        bits on either, and a resumed run folds bit-identical cosines."""
        self.wait()
        return then(self._fold(blocks, final, parallel=True))

    def _take(self) -> list[tuple[torch.Tensor, list[int]]]:
        """Hand the pending deltas over to a pass: ``[(block [group, d], rows)]`` in order.

        The newest block, if it will still receive rows, is copied (its pending rows are then
        zeroed here), so a background pass and :meth:`add_delta` never share a tensor.
        """
        blocks = [(block, rows) for _, (block, rows) in sorted(self._blocks.items()) if rows]
        last = max(self._blocks, default=None)
        if last is not None and (self.rounds_seen % self.group) and last == self.rounds_seen // self.group:
            block, rows = self._blocks[last]
            if rows:
                blocks[-1] = (block.clone(), list(rows))
                block[rows] = 0.0
                rows.clear()
            self._blocks = {last: (block, rows)}
        else:
            self._blocks = {}
        self._pending = 0
        return blocks

    def _fold(
        self, taken: list[tuple[torch.Tensor, list[int]]], final: torch.Tensor | None, *,
        parallel: bool,
    ) -> torch.Tensor | None:
        """One pass over the canaries: fold ``taken`` deltas; cosines with ``final``."""
        blocks = [(block, rows, self._norms(block, rows)) for block, rows in taken]
        if not blocks and final is None:
            return None
        n = self.max_cos.numel()
        out = None
        if final is not None:
            out = torch.empty(n, dtype=torch.float64)
            final = final.to(torch.float32)
            norm = torch.linalg.vector_norm(final.to(torch.float64))
            if not torch.isfinite(norm):
                raise ValueError("cannot take cosines against a vector with NaN or inf entries")
            final_norm = norm if norm > 0 else torch.ones_like(norm)
        pos = 0
        workers = None if parallel else 1
        for part, chunk in self.canaries.chunks(range(n), workers=workers):
            end = pos + len(part)
            if blocks:
                best = None
                for block, rows, norms in blocks:
                    cos = (torch.mm(chunk, block.t()).to(torch.float64) / norms).clamp_(-1.0, 1.0)
                    if self.sign < 0:
                        cos = cos.neg_()
                    top = cos[:, rows].max(dim=1).values
                    best = top if best is None else torch.maximum(best, top)
                self.max_cos[pos:end] = torch.maximum(self.max_cos[pos:end], best)
            if out is not None:
                cos = (torch.mv(chunk, final).to(torch.float64) / final_norm).clamp_(-1.0, 1.0)
                out[pos:end] = cos.neg_() if self.sign < 0 else cos
            pos = end
        return out

    @staticmethod
    def _norms(block: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Float64 norms of the pending rows (1 elsewhere, and for a zero delta: cosine 0)."""
        norms = torch.ones(block.shape[0], dtype=torch.float64)
        for row in rows:
            norm = torch.linalg.vector_norm(block[row].to(torch.float64))
            if norm > 0:
                norms[row] = norm
        return norms

    def compute(self, theta_now: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flush and return the statistics (float64, CPU).

        Returns:
            ``{"final_observed" [k], "final_unobserved" [k'], "all_observed" [k],
            "all_unobserved" [k']}``; the all-iterates entries are empty before any round.
        """
        theta = self._prepare(theta_now)
        self.wait()
        cached = self._final_cache
        if not self._pending and cached is not None and torch.equal(cached[0], theta):
            return self._results(cached[1])  # same model, no new round: no pass over the canaries
        return self._run(self._take(), theta - self.theta0, lambda final: self._finish(theta, final))

    def compute_async(
        self, theta_now: torch.Tensor, then: Callable[[dict[str, torch.Tensor]], Any] | None = None,
    ) -> Future[Any]:
        """:meth:`compute` on the estimation thread: returns a Future of ``then(results)``
        (of the results when ``then`` is None). ``theta_now`` is copied before this returns.
        """
        theta = self._prepare(theta_now).clone()
        self.wait()
        cached = self._final_cache
        done = (lambda x: x) if then is None else then
        if not self._pending and cached is not None and torch.equal(cached[0], theta):
            return self._submit([], None, lambda _: done(self._results(cached[1])))
        return self._submit(
            self._take(), theta - self.theta0, lambda final: done(self._finish(theta, final)),
        )

    def _prepare(self, theta_now: torch.Tensor) -> torch.Tensor:
        """Checks on the calling thread: a bad model raises here, before any delta is taken."""
        if self.theta0 is None:
            raise RuntimeError("set_initial(theta0) must be called before compute()")
        self._check(theta_now)
        theta = theta_now.detach().to("cpu", torch.float32)
        if not _all_finite(theta):
            raise ValueError("cannot take cosines against a vector with NaN or inf entries")
        return theta

    def _finish(self, theta: torch.Tensor, final: torch.Tensor | None) -> dict[str, torch.Tensor]:
        assert final is not None
        self._final_cache = (theta.clone(), final)
        return self._results(final)

    def _results(self, final: torch.Tensor) -> dict[str, torch.Tensor]:
        k = self.num_observed
        have_all = self.rounds_seen > 0
        empty = torch.empty(0, dtype=torch.float64)
        return {
            "final_observed": final[:k].clone(),
            "final_unobserved": final[k:].clone(),
            "all_observed": self.max_cos[:k].clone() if have_all else empty,
            "all_unobserved": self.max_cos[k:].clone() if have_all else empty,
        }

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        return {
            "seed": self.canaries.seed,
            "dim": self.dim,
            "num_observed": self.num_observed,
            "num_unobserved": self.num_unobserved,
            "sign": self.sign,
            "max_cos": self.max_cos.clone(),
            "theta0": None if self.theta0 is None else self.theta0.clone(),
            "rounds_seen": self.rounds_seen,
            "rounds_skipped": self.rounds_skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = (self.canaries.seed, self.dim, self.num_observed, self.num_unobserved, self.sign)
        theirs = (state["seed"], state["dim"], state["num_observed"], state["num_unobserved"],
                  state["sign"])
        if mine != theirs:
            raise ValueError(f"checkpointed canary statistics {theirs} do not match this run {mine}")
        self.wait()
        self.max_cos = state["max_cos"].clone().to(torch.float64)
        self.theta0 = None if state["theta0"] is None else state["theta0"].clone()
        self.rounds_seen = int(state["rounds_seen"])
        self.rounds_skipped = int(state["rounds_skipped"])
        self._blocks = {}
        self._pending = 0
        self._final_cache = None
