"""Flat views of a model's parameters: one reused buffer gathered by one op a step."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch


def flat_parameters(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The optimizer's parameters, flattened and concatenated: ``[d]`` float32 on the first
    parameter's device (the model's; no copy to the host: the release deltas and the statistics
    stay there)."""
    device = params[0].device
    return torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in params])


class FlatGather:
    """Tensors of fixed shapes gathered into one persistent flat buffer, by one
    ``torch._foreach_copy_`` a call (a fresh ``torch.cat`` of per-tensor flattened
    views cost three dispatched ops a tensor and a new ``[d]`` allocation every step; this is
    one dispatched op, on CUDA multi-tensor kernels where the dtypes agree, and no allocation
    after the first call).

    The values are those of ``torch.cat([t.reshape(-1).to(device, dtype) for t in tensors])``
    bit for bit (a copy, with the same casts). The buffer is rebuilt when the tensors' shapes,
    dtypes or devices change (a per-call check on their metadata, no device work).

    Persistent tensors (a model's parameters, updated in place: the same storages call after
    call) are gathered by one ``torch.cat`` into the buffer from flattened aliases of them made
    once: on the CPU, where ``_foreach_copy_`` runs one ``copy_`` a tensor, this is one aten
    event instead of one a tensor. The aliases are made when a call finds the tensors at the
    addresses (``data_ptr``) of the previous call, all contiguous and of the buffer's dtype; they
    are used while each tensor starts at its alias' address (an alias keeps its storage alive,
    so a tensor starting there, contiguous, of the same shape and dtype, is those bytes), and
    dropped for good the first time one does not (tensors made anew every call, such as
    ``p.grad``, go on by ``_foreach_copy_``).

    Args:
        dtype: the buffer's dtype, or None (default): the promoted dtype of the tensors
            gathered, as ``torch.cat`` would give.

    Attributes:
        flat: the last buffer ``[d]`` on the first tensor's device (None before the first
            :meth:`gather`).
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._key: tuple[Any, ...] | None = None
        self._last_ptrs: tuple[int, ...] | None = None  # the previous call's addresses
        self._aliases: list[torch.Tensor] = []  # flattened aliases of persistent tensors
        self._alias_ptrs: tuple[int, ...] | None = None
        self._persistent = True  # False once the aliases missed: no more are made

    def gather(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Copy ``tensors`` (in order) into the buffer and return it: ``[sum of numels]`` on the
        first tensor's device. The buffer is overwritten by the next call: copy it to keep it.
        Autograd does not record the copy.

        Raises:
            ValueError: no tensors.
        """
        if not len(tensors):
            raise ValueError("tensors: none given")
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if key != self._key:
            self._build(tensors, key)
        assert self.flat is not None
        if self._persistent:
            # (metadata: no aten op) a non-contiguous tensor never matches an alias
            ptrs = tuple(t.data_ptr() if t.is_contiguous() else -1 for t in tensors)
            if self._alias_ptrs is not None and ptrs != self._alias_ptrs:
                self._persistent, self._aliases, self._alias_ptrs = False, [], None
            elif self._alias_ptrs is None and ptrs == self._last_ptrs and self._aliasable(tensors):
                self._aliases = [t.detach().view(-1) for t in tensors]
                self._alias_ptrs = ptrs
            self._last_ptrs = ptrs
        with torch.no_grad():
            if self._alias_ptrs is not None:
                torch.cat(self._aliases, out=self.flat)
            else:
                torch._foreach_copy_(self._views, list(tensors))
        return self.flat

    def _aliasable(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether one ``torch.cat`` of flattened aliases gives the buffer's bits: every tensor
        contiguous, non-empty, of the buffer's dtype and device."""
        assert self.flat is not None
        flat = self.flat
        return all(t.is_contiguous() and t.numel() > 0 and t.dtype == flat.dtype and t.device == flat.device
                   for t in tensors)

    def _build(self, tensors: Sequence[torch.Tensor], key: tuple[Any, ...]) -> None:
        dtype = self.dtype
        if dtype is None:
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
        flat = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=tensors[0].device)
        views, offset = [], 0
        for t in tensors:
            views.append(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        self.flat, self._views, self._key = flat, views, key
        self._last_ptrs, self._aliases, self._alias_ptrs, self._persistent = None, [], None, True
