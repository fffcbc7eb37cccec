"""Canary participation drawn by the training loader's own Poisson sampler (torch, no Lightning).

An audit of DP-SGD must see what the accountant does not: a loader that takes examples more
often than the accountant is told. So where the training loader's batch sampler is Opacus'
:class:`~opacus.utils.uniform_sampler.UniformWithReplacementSampler` (what ``DPDataLoader`` and
``make_private(poisson_sampling=True)`` give), the k canaries are k extra examples of the
population that sampler draws from: indices ``N .. N+k-1`` of a population of ``N + k``, where
``N`` is the sampler's ``num_samples``. For every batch the sampler draws (its own ``__iter__``,
its own rate, its own generator, so a sampler that draws at 2q makes the canaries join at 2q),
the canary indices are stripped from the batch before the dataset sees them and queued, in draw
order, for the optimizer to insert (:class:`LoaderCanarySampling`).

How it is installed. The sampler's class is swapped, on that one instance, for a subclass that
only wraps ``__iter__`` (``isinstance`` checks, ``len``, ``BatchMemoryManager``'s
``BatchSplittingSampler`` and the sampler's attributes are untouched); ``num_samples`` is
``N + k`` only while the wrapped ``__iter__`` draws a batch and ``N`` at any other time, so an
iterator created before installation (Lightning creates the first epoch's in
``configure_optimizers``) still yields real indices only. :meth:`LoaderCanarySampling.detach`
restores the class.

Order of consumption. A ``DataLoader`` draws its batches' indices in the main process, in
order, possibly ahead of consumption (worker prefetching, Lightning's fetcher, Opacus'
``BatchSplittingSampler``); batches are consumed in the same order, so the queue is FIFO:
:meth:`LoaderCanarySampling.take` pops the draws of the batches consumed by one logical step
(``accumulated_iterations`` of them: one per backward pass since the last step; one per logical
batch under ``BatchMemoryManager``, which splits one draw into physical batches). A new
iteration of the sampler (a new epoch) clears the queue: draws of an abandoned iterator never
reach training. When a step needs more draws than are queued (the iterator began before the
audit attached, or the training skipped a batch), the missing draws are made by the audit at
the sampler's own ``sample_rate`` and counted (``draws_by_audit``).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch
from opacus.utils.uniform_sampler import (
    DistributedUniformWithReplacementSampler,
    UniformWithReplacementSampler,
)

__all__ = ["LoaderCanarySampling", "find_poisson_sampler"]

_ATTRIBUTE = "_audit_canary_sampling"
_SUBCLASSES: dict[type, type] = {}


def find_poisson_sampler(data_loader: Any) -> tuple[UniformWithReplacementSampler | None, str]:
    """The Opacus Poisson batch sampler the training loader draws from, or None with the reason.

    Looks through Opacus' ``BatchSplittingSampler`` (``BatchMemoryManager``'s loader).

    Args:
        data_loader: the training loader (a ``DataLoader``), or None.

    Returns:
        ``(sampler, "")`` for a ``UniformWithReplacementSampler`` (or a subclass), else
        ``(None, reason)``.
    """
    if data_loader is None:
        return None, "no training loader was found"
    sampler = getattr(data_loader, "batch_sampler", None)
    inner = getattr(sampler, "sampler", None)
    if type(sampler).__name__ == "BatchSplittingSampler" and inner is not None:
        sampler = inner  # BatchMemoryManager: one draw of the Poisson sampler per logical batch
    if isinstance(sampler, DistributedUniformWithReplacementSampler):
        return None, ("the loader's sampler is Opacus' DistributedUniformWithReplacementSampler "
                      "(data-parallel): its batches are drawn per rank")
    if not isinstance(sampler, UniformWithReplacementSampler):
        return None, (f"the training loader's batch sampler is {type(sampler).__name__}, not Opacus' "
                      "Poisson UniformWithReplacementSampler (DPDataLoader)")
    if sampler.__dict__.get(_ATTRIBUTE) is not None:
        return None, "the loader's sampler already hosts another audit's canaries"
    return sampler, ""


def _subclass(base: type) -> type:
    """``base`` with ``__iter__`` wrapped (one subclass per sampler class)."""
    if base not in _SUBCLASSES:
        _SUBCLASSES[base] = type(f"Canary{base.__name__}", (base,), {
            "__iter__": _canary_iter, "__module__": __name__,
            "__doc__": f"{base.__name__} whose draws include the audit's canaries (see {__name__})."})
    return _SUBCLASSES[base]


def _canary_iter(self: Any):  # the __iter__ of the swapped-in subclass
    state: LoaderCanarySampling | None = self.__dict__.get(_ATTRIBUTE)
    if state is None:  # detached, but the class was swapped by someone since: plain draws
        yield from super(type(self), self).__iter__()
        return
    generation = state._new_iteration()
    inner = state.base.__iter__(self)
    while True:
        extend = state.attached and generation == state.generation
        if extend:
            self.num_samples = state.population + state.num_canaries
        try:
            batch = next(inner)
        except StopIteration:
            return
        finally:
            if extend:
                self.num_samples = state.population
        yield state._split(batch) if extend else batch


class CanaryUniformWithReplacementSampler(UniformWithReplacementSampler):
    """Opacus' ``UniformWithReplacementSampler`` whose draws include the audit's canaries (the
    class an installed sampler has; a module attribute, so the sampler still pickles)."""

    __iter__ = _canary_iter


_SUBCLASSES[UniformWithReplacementSampler] = CanaryUniformWithReplacementSampler


class LoaderCanarySampling:
    """The canaries as k extra examples of an Opacus ``UniformWithReplacementSampler``.

    Args:
        sampler: the training loader's Poisson sampler (:func:`find_poisson_sampler`); its
            class is swapped on the instance until :meth:`detach`.
        num_canaries: k, the canaries that may join (indices ``0..k-1``).
        seed: the seed of the draws the audit makes itself (missing draws, see the module).

    Attributes:
        population: N, the sampler's ``num_samples`` (the real examples).
        batches: batches drawn by the sampler since installation.
        draws_by_audit: batches whose canary draws the audit made (the loader had not drawn
            them: its iteration began before installation, or a batch was skipped).

    Raises:
        ValueError: ``num_canaries`` < 1, or ``sampler`` not an Opacus Poisson sampler.
    """

    def __init__(self, sampler: UniformWithReplacementSampler, num_canaries: int, *, seed: int = 0) -> None:
        if not isinstance(sampler, UniformWithReplacementSampler):
            raise ValueError(f"sampler must be Opacus' UniformWithReplacementSampler, got {type(sampler).__name__}")
        if int(num_canaries) < 1:
            raise ValueError(f"num_canaries must be >= 1, got {num_canaries}")
        if sampler.__dict__.get(_ATTRIBUTE) is not None:
            raise ValueError("sampler: it already hosts another audit's canaries")
        self.sampler = sampler
        self.base = type(sampler)
        self.population = int(sampler.num_samples)
        self.num_canaries = int(num_canaries)
        self.seed = int(seed)
        self.queue: collections.deque[np.ndarray] = collections.deque()
        self.generation = 0
        self.batches = 0
        self.draws_by_audit = 0
        self.attached = True
        sampler.__dict__[_ATTRIBUTE] = self
        sampler.__class__ = _subclass(self.base)

    @property
    def sample_rate(self) -> float:
        """The sampler's own Poisson rate per batch."""
        return float(self.sampler.sample_rate)

    def _new_iteration(self) -> int:
        self.generation += 1
        self.queue.clear()
        return self.generation

    def _split(self, batch: Any) -> Any:
        """The real indices of ``batch`` (same container type); queue its canaries ``[m]``.
        A list (what Opacus' sampler yields) or an array is split in numpy (no torch op a
        batch); a tensor in torch, on its device."""
        if isinstance(batch, torch.Tensor):
            t = batch.reshape(-1).long()
            canary = t >= self.population
            self.queue.append((t[canary] - self.population).cpu().numpy().astype(np.int64))
            self.batches += 1
            return t[~canary].to(batch.device)
        arr = np.asarray(batch, dtype=np.int64).reshape(-1)
        canary = arr >= self.population
        self.queue.append(arr[canary] - self.population)
        self.batches += 1
        real = arr[~canary]
        return real if isinstance(batch, np.ndarray) else real.tolist()

    def take(self, batches: int, step: int) -> np.ndarray:
        """The canaries of the next ``batches`` consumed batches (FIFO), concatenated: ``[m]``
        int64 indices in ``[0, k)``, one entry per canary and batch (a canary drawn in two
        accumulated batches appears twice). Missing draws are made at the sampler's rate from
        ``numpy.random.default_rng([seed, 0xA8, step, i])`` and counted in ``draws_by_audit``.

        Raises:
            ValueError: ``batches`` < 1.
        """
        if int(batches) < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        out = []
        for i in range(int(batches)):
            if self.queue:
                out.append(self.queue.popleft())
            else:
                self.draws_by_audit += 1
                draws = np.random.default_rng([self.seed, 0xA8, int(step), i]).random(self.num_canaries)
                out.append(np.flatnonzero(draws < self.sample_rate).astype(np.int64))
        return np.concatenate(out)

    def state_dict(self) -> dict[str, int]:
        """Counters for resume (the queue is not saved: a resumed run starts a new iteration)."""
        return {"batches": self.batches, "draws_by_audit": self.draws_by_audit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = int(state.get("batches", 0))
        self.draws_by_audit = int(state.get("draws_by_audit", 0))

    def detach(self) -> None:
        """Restore the sampler's class and population (idempotent)."""
        if not self.attached:
            return
        self.attached = False
        self.queue.clear()
        sampler = self.sampler
        if sampler.__dict__.get(_ATTRIBUTE) is self:
            del sampler.__dict__[_ATTRIBUTE]
            if type(sampler) is _SUBCLASSES.get(self.base):
                sampler.__class__ = self.base
        sampler.num_samples = self.population
