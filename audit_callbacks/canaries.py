"""Seeded random canaries, regenerated chunk by chunk (paper 003 §3; METHODS A2, A8).

A canary is a unit vector drawn uniformly from the sphere S^{d-1}: a standard normal vector
divided by its norm. Canary ``j`` of a :class:`CanarySet` is a pure function of
``(seed, j)``: it is regenerated whenever it is needed and never stored alongside the others,
so memory stays O(d) (times a small chunk) whatever the number of canaries k.

The generator is torch's CPU Mersenne Twister, re-seeded per canary from a
:class:`numpy.random.SeedSequence` of ``(seed, j)``; canaries are generated on the CPU (so a run
on a GPU sees the same canaries) and moved to the target device chunk by chunk.

Generating a canary (about 10 ns a coordinate) costs far more than using it, so a set spreads the
rows of a chunk over ``workers`` threads and can generate canaries ahead of use in its
background thread (:meth:`CanarySet.submit`, one canary; :meth:`CanarySet.submit_many`, a
cohort's canaries as one task). The loop that re-seeds, draws and normalises a batch of canaries
is one TorchScript call (:func:`_unit_rows`), which holds no GIL: a thread generating beside
training takes the GIL back once a batch, not once a canary. Every canary is still generated
alone from its own seed, so the values do not depend on the number of workers, on the batch or
on which thread made them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch

from audit_callbacks._torchscript import compile_or_python

__all__ = ["CanarySet", "canary_seed", "default_workers", "thread_pool"]

T = TypeVar("T")

_DEFAULT_CHUNK_ELEMENTS = 1 << 22  # 4M floats (16 MiB in float32) per generated chunk
_MAX_DEFAULT_WORKERS = 2  # the training thread and one more: canaries must not starve training


def thread_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A pool whose threads run torch (and its BLAS) with the creating thread's settings.

    A thread that torch has not configured runs MKL with its own default thread count, and its
    sums then differ in the last bits from the main thread's (measured: ``torch.mm`` of
    ``[40, 2410] x [2410, 16]``). ``torch.set_num_threads`` with the current value changes
    nothing global and configures the new thread like the others.
    """
    return ThreadPoolExecutor(
        workers, thread_name_prefix=name, initializer=torch.set_num_threads,
        initargs=(torch.get_num_threads(),),
    )


def default_workers() -> int:
    """Threads a :class:`CanarySet` generates with by default: ``min(2, usable CPUs)``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_WORKERS, cpus))


def _unit_rows(gen: torch.Generator, seeds: list[int], out: torch.Tensor, scale: float) -> None:
    """Row i of ``out`` (``[>= len(seeds), d]`` float32) := a standard normal vector drawn by
    ``gen`` re-seeded with ``seeds[i]``, divided by its norm (one row-wise norm and one division
    for all the rows; a row's bits do not depend on the others), times ``scale`` (skipped for 1,
    exact either way). Compiled with TorchScript (:mod:`audit_callbacks._torchscript`): the
    whole loop is one call that holds no GIL.
    """
    for i in range(len(seeds)):
        gen.manual_seed(seeds[i])  # the whole Mersenne Twister state: as fresh as a new generator
        torch.randn([out.size(1)], generator=gen, out=out[i])
    rows = out[: len(seeds)]
    rows.div_(torch.linalg.vector_norm(rows, 2.0, [1], True))
    if scale != 1.0:
        rows.mul_(scale)


_UNIT_ROWS = compile_or_python(_unit_rows)


def canary_seed(seed: int, index: int) -> int:
    """The 63-bit generator seed of canary ``index`` in the set seeded with ``seed``.

    Distinct ``(seed, index)`` pairs give statistically independent streams (SeedSequence
    hashing); the value is stable across processes and platforms.
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    state = np.random.SeedSequence([int(seed), int(index)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


class CanarySet:
    """``num_canaries`` unit canaries of dimension ``dim``, regenerated from ``seed``.

    Args:
        seed: the set's seed (non-negative int). Canary j is a function of (seed, j) only.
        dim: the dimension d (number of model parameters); at least 2.
        num_canaries: k, the number of canaries.
        chunk_elements: at most this many floats are generated at once (chunk of
            ``max(1, chunk_elements // dim)`` canaries), which bounds the extra memory.
        workers: threads that generate canaries, the calling thread included (default
            :func:`default_workers`: 2 where two CPUs are usable). 1: no thread is started and
            :meth:`submit` generates at once. The canaries do not depend on it.

    Example:
        >>> cs = CanarySet(seed=0, dim=1000, num_canaries=10)
        >>> v = torch.randn(1000)
        >>> cs.cosines(v).shape
        torch.Size([10])
    """

    def __init__(
        self,
        seed: int,
        dim: int,
        num_canaries: int,
        *,
        chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
        workers: int | None = None,
    ) -> None:
        if dim < 2:
            raise ValueError(f"canaries need dim >= 2 (the cosine null is undefined), got {dim}")
        if num_canaries < 0:
            raise ValueError(f"num_canaries must be >= 0, got {num_canaries}")
        if chunk_elements < 1:
            raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.seed = int(seed)
        self.dim = int(dim)
        self.num_canaries = int(num_canaries)
        self.chunk_size = max(1, int(chunk_elements) // self.dim)
        self.workers = default_workers() if workers is None else int(workers)
        self._seeds: dict[int, int] = {}  # canary_seed cache: one int a canary, never k x d
        self._local = threading.local()  # one generator a thread, re-seeded per canary
        self._pool: ThreadPoolExecutor | None = None
        self._long_tasks = 0  # tasks of run_in_background queued or running
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.num_canaries

    def _fill_rows(self, indices: Sequence[int], out: torch.Tensor, scale: float = 1.0) -> None:
        """Canaries ``indices`` times ``scale`` into the rows of ``out`` ``[>= len(indices), dim]``
        (float32).

        Each row from its own seed, normalised with the whole batch by :func:`_unit_rows` (one
        TorchScript call); a canary is the same in any batch (tested bit for bit). Raises
        ``IndexError`` for an index outside ``[0, num_canaries)``.
        """
        gen = getattr(self._local, "gen", None)
        if gen is None:
            gen = self._local.gen = torch.Generator(device="cpu")
        cache = self._seeds
        seeds = []
        for index in indices:
            if not 0 <= index < self.num_canaries:
                raise IndexError(f"canary index {index} out of range [0, {self.num_canaries})")
            seed = cache.get(index)
            if seed is None:  # SeedSequence hashing costs ~50 us: once per canary, not per use
                seed = cache[index] = canary_seed(self.seed, index)
            seeds.append(seed)
        _UNIT_ROWS(gen, seeds, out, float(scale))

    def executor(self) -> ThreadPoolExecutor | None:
        """The set's background threads (``workers - 1`` of them, started on first use), or None
        with ``workers == 1``. :class:`~audit_callbacks.canary_stats.CanaryStatistics` runs its
        background passes here too, so training shares the CPUs with one pool, not two."""
        if self.workers < 2:
            return None
        if self._pool is None:
            self._pool = thread_pool(self.workers - 1, "canaries")
        return self._pool

    def run_in_background(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn()`` (a long task, e.g. an estimation pass) on the set's background thread.

        While it runs, :meth:`chunks` fills on the calling thread alone instead of queueing
        behind it; canaries submitted with :meth:`submit` / :meth:`submit_many` wait their turn.
        Raises ``RuntimeError`` with ``workers == 1`` (no background thread).
        """
        pool = self.executor()
        if pool is None:
            raise RuntimeError("this CanarySet has no background thread (workers == 1)")
        self._count_long(+1)

        def task() -> T:
            try:
                return fn()
            finally:
                self._count_long(-1)  # before the Future completes: its waiters see the thread free

        try:
            future = pool.submit(task)
        except BaseException:
            self._count_long(-1)
            raise
        # a task cancelled before it ran never reaches its finally
        future.add_done_callback(lambda f: self._count_long(-1) if f.cancelled() else None)
        return future

    def _count_long(self, step: int) -> None:
        with self._lock:
            self._long_tasks += step

    def close(self) -> None:
        """Stop the set's threads (they are restarted on demand); pending work is finished."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_local"] = None  # generators and threads are scratch space, recreated on use
        state["_pool"] = None
        state["_lock"] = None
        state["_long_tasks"] = 0
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._lock = threading.Lock()

    def canary(
        self, index: int, *, device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32, scale: float = 1.0,
    ) -> torch.Tensor:
        """Canary ``index`` as a unit vector of shape ``[dim]``, times ``scale``.

        A new tensor, bit-identical to ``canary(index, device=device, dtype=dtype) * scale``
        (multiplied in place; ``scale == 1`` skips the multiplication, exact as ``x * 1.0``).
        """
        out = torch.empty(self.dim, dtype=torch.float32)
        self._fill_rows([index], out.view(1, -1))
        out = out.to(device=device, dtype=dtype)  # self, or a copy: either way ours to modify
        if scale != 1.0:
            out.mul_(scale)
        return out

    def submit(self, index: int, *, scale: float = 1.0) -> Future[torch.Tensor]:
        """Start generating ``canary(index, scale=scale)`` (CPU, float32) in a background thread.

        Returns a :class:`~concurrent.futures.Future` whose ``result()`` is that tensor,
        bit-identical to :meth:`canary`. With ``workers == 1`` the canary is generated now.
        Each pending canary holds ``4 * dim`` bytes: bound how many are in flight.
        """
        return self._start(lambda: self.canary(index, scale=scale))

    def submit_many(self, indices: Sequence[int], *, scale: float = 1.0) -> Future[torch.Tensor]:
        """Start generating ``scale * c_j`` for every j in ``indices`` in a background thread.

        Returns a :class:`~concurrent.futures.Future` of a ``[len(indices), dim]`` CPU float32
        tensor whose row i is bit-identical to ``canary(indices[i], scale=scale)``: one task for
        a whole cohort's canaries. It holds ``4 * dim * len(indices)`` bytes: bound the batch.
        With ``workers == 1`` the batch is generated now. An index outside ``[0, num_canaries)``
        raises ``IndexError`` from ``result()``.
        """
        idx = [int(j) for j in indices]
        return self._start(lambda: self.batch(idx, scale=scale))

    def _start(self, make: Callable[[], torch.Tensor]) -> Future[torch.Tensor]:
        """``make()`` on the background thread, or now (as a finished Future) without one."""
        pool = self.executor()
        if pool is not None:
            return pool.submit(make)
        done: Future[torch.Tensor] = Future()
        done.set_result(make())
        return done

    def batch(self, indices: Sequence[int], *, scale: float = 1.0) -> torch.Tensor:
        """``scale * c_j`` for every j in ``indices``, generated now on this thread: a
        ``[len(indices), dim]`` CPU float32 tensor, row i bit-identical to
        ``canary(indices[i], scale=scale)``. Raises ``IndexError`` for an index outside
        ``[0, num_canaries)``."""
        out = torch.empty(len(indices), self.dim, dtype=torch.float32)
        self._fill_rows(indices, out, scale)  # elementwise: each row as canary(j, scale=scale)
        return out

    def chunks(
        self, indices: Sequence[int] | None = None, *, device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32, workers: int | None = None,
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Yield ``(indices_chunk, canaries [b, dim])`` over ``indices`` (default: all).

        ``workers``: threads filling a chunk, this one included (default: the set's
        ``workers``; at most that many). While a task of :meth:`run_in_background` is queued or
        running, chunks are filled on this thread alone. The values do not depend on either.
        """
        idx = list(range(self.num_canaries)) if indices is None else [int(i) for i in indices]
        nthreads = self.workers if workers is None else max(1, min(int(workers), self.workers))
        buf = torch.empty(min(self.chunk_size, max(1, len(idx))), self.dim, dtype=torch.float32)
        for start in range(0, len(idx), self.chunk_size):
            part = idx[start:start + self.chunk_size]
            # a long task holds the background thread: fill here rather than wait behind it
            busy = self._long_tasks > 0
            pool = self.executor() if len(part) > 1 and nthreads > 1 and not busy else None
            if pool is None:
                self._fill_rows(part, buf)
            else:  # rows split over the pool's threads and this one, each row from its own seed
                bounds = np.linspace(0, len(part), nthreads + 1).astype(int).tolist()
                futures = [
                    pool.submit(self._fill_rows, part[lo:hi], buf[lo:hi])
                    for lo, hi in zip(bounds[1:-1], bounds[2:], strict=True)
                ]
                self._fill_rows(part[: bounds[1]], buf[: bounds[1]])
                for fut in futures:
                    fut.result()
            yield part, buf[: len(part)].to(device=device, dtype=dtype)

    def dots(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Dot products ``<c_j, v_m>``.

        Args:
            vectors: one ``[dim]`` vector, an ``[M, dim]`` matrix, or a sequence of M ``[dim]``
                vectors (not stacked: no copy is made). Any device, float.
            indices: canaries to use (default: all).

        Returns:
            ``[n]`` for a single vector, ``[n, M]`` otherwise (float64 on the vectors' device),
            n = number of canaries used. Each column is its own matrix-vector product, so a
            result does not depend on which other vectors share the pass (a resumed run matches
            an uninterrupted one bit for bit).
        """
        single = isinstance(vectors, torch.Tensor) and vectors.dim() == 1
        cols = [vectors] if single else list(vectors)
        if not cols:
            raise ValueError("no vectors given")
        for v in cols:
            if v.dim() != 1 or v.numel() != self.dim:
                raise ValueError(f"vectors must have {self.dim} entries, got {tuple(v.shape)}")
        device = cols[0].device
        n = self.num_canaries if indices is None else len(indices)
        out = torch.empty(n, len(cols), dtype=torch.float64, device=device)
        pos = 0
        for part, block in self.chunks(indices, device=device):
            for m, v in enumerate(cols):
                out[pos:pos + len(part), m] = torch.mv(block, v.to(torch.float32))
            pos += len(part)
        return out[:, 0] if single else out

    def cosines(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Cosines ``cos(c_j, v_m)``; arguments and shapes as :meth:`dots`.

        A zero vector gives cosine 0. Raises ``ValueError`` for a vector with NaN or inf.
        """
        single = isinstance(vectors, torch.Tensor) and vectors.dim() == 1
        cols = [vectors] if single else list(vectors)
        norms = torch.stack([torch.linalg.vector_norm(v.to(torch.float64)) for v in cols])
        if not torch.isfinite(norms).all():
            raise ValueError("cannot take cosines against a vector with NaN or inf entries")
        dots = self.dots(cols, indices)
        safe = torch.where(norms > 0, norms, torch.ones_like(norms)).to(dots.device)
        cos = (dots / safe.unsqueeze(0)).clamp_(-1.0, 1.0)
        return cos[:, 0] if single else cos

    def sum(self, indices: Sequence[int] | None = None, *, weights: torch.Tensor | None = None,
            device: torch.device | str | None = None) -> torch.Tensor:
        """``sum_j w_j c_j`` over ``indices`` as a ``[dim]`` float32 vector (memory O(dim))."""
        total = torch.zeros(self.dim, dtype=torch.float32, device=device)
        pos = 0
        for part, block in self.chunks(indices, device=device):
            if weights is None:
                total += block.sum(0)
            else:
                w = weights[pos:pos + len(part)].to(device=block.device, dtype=block.dtype)
                total += w @ block
            pos += len(part)
        return total
