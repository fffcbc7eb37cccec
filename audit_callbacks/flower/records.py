"""Flower ``ArrayRecord`` <-> flat model vectors, reply checks, and the summary's versions.

A model is audited as one flat float32 vector ``[d]``: the floating arrays of the global
``ArrayRecord``, in its key order, each flattened in C order. Integer arrays (e.g. BatchNorm's
``num_batches_tracked``) are not part of ``d``: a canary client leaves them as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from audit_callbacks.auditing.files import versions

__all__ = ["LOGGER", "Layout", "flower_versions", "numeric_metrics"]

#: Flower's own logger: the audit's messages appear among the server app's.
LOGGER = logging.getLogger("flwr")


@dataclass(frozen=True)
class Layout:
    """The shapes of a model's arrays: ``(key, shape, dtype)`` for every array, in order.

    Attributes:
        entries: one ``(key, shape, numpy dtype string)`` per array of the record.
        dim: d, the number of floating entries (the length of the flat vectors).
    """

    entries: tuple[tuple[str, tuple[int, ...], str], ...]
    dim: int

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        """The layout of ``record``.

        Raises:
            ValueError: the record has no floating array with at least 2 entries in all.
        """
        entries, dim = [], 0
        for key, arr in record.items():
            nd = arr.numpy()
            entries.append((str(key), tuple(int(s) for s in nd.shape), nd.dtype.str))
            if np.issubdtype(nd.dtype, np.floating):
                dim += int(nd.size)
        if dim < 2:
            raise ValueError(f"the model has {dim} floating parameter(s); canaries need d >= 2")
        return cls(tuple(entries), dim)

    def mismatch(self, record: ArrayRecord) -> str | None:
        """Why ``record`` is not a model of this layout with finite weights, or None."""
        keys = [str(k) for k in record.keys()]
        mine = [e[0] for e in self.entries]
        if keys != mine:
            missing = sorted(set(mine) - set(keys))[:3]
            extra = sorted(set(keys) - set(mine))[:3]
            return f"its arrays are not the model's (missing {missing}, unexpected {extra})"
        for (key, shape, dtype), arr in zip(self.entries, record.values(), strict=True):
            try:
                nd = arr.numpy()
            except Exception as err:  # noqa: BLE001 - undecodable bytes are bad input
                return f"array {key!r} cannot be decoded ({err})"
            if tuple(nd.shape) != shape:
                return f"array {key!r} has shape {tuple(nd.shape)}, the model's is {shape}"
            floating = np.issubdtype(np.dtype(dtype), np.floating)
            # an integer array may come back as floats (FedAvg averages every array in float64)
            if (floating and not np.issubdtype(nd.dtype, np.floating)) or (
                not np.issubdtype(nd.dtype, np.number) or np.issubdtype(nd.dtype, np.complexfloating)
            ):
                return f"array {key!r} has dtype {nd.dtype}, the model's is {dtype}"
            if floating and not np.isfinite(nd).all():
                return f"array {key!r} has NaN or inf entries"
        return None

    def flatten(self, record: ArrayRecord) -> torch.Tensor:
        """The floating arrays of ``record`` as one flat float32 vector ``[d]`` (CPU)."""
        parts = []
        for (_, _, dtype), arr in zip(self.entries, record.values(), strict=True):
            if np.issubdtype(np.dtype(dtype), np.floating):
                parts.append(np.asarray(arr.numpy(), dtype=np.float32).reshape(-1))
        return torch.from_numpy(np.concatenate(parts))

    def integer_entries(self) -> tuple[tuple[str, int], ...]:
        """``((key, numel), ...)`` of the model's integer arrays (buffers such as BatchNorm's
        ``num_batches_tracked``), which carry no canary but are released too."""
        return tuple((key, int(np.prod(shape, dtype=np.int64))) for key, shape, dtype in self.entries
                     if not np.issubdtype(np.dtype(dtype), np.floating))

    def flatten_integer(self, record: ArrayRecord) -> torch.Tensor:
        """The integer arrays of ``record`` (as released: integers, or floats after FedAvg's
        average) as one flat float64 vector (CPU; empty without integer arrays)."""
        parts = [np.asarray(arr.numpy(), dtype=np.float64).reshape(-1)
                 for (_, _, dtype), arr in zip(self.entries, record.values(), strict=True)
                 if not np.issubdtype(np.dtype(dtype), np.floating)]
        return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.float64)

    def add_rows(self, record: ArrayRecord, rows: torch.Tensor) -> list[ArrayRecord]:
        """New records, one per row of ``rows`` ``[b, d]``: ``record`` plus that row on its
        floating arrays (each cast back to its dtype; integer arrays copied), with ``record``
        decoded once."""
        base = [arr.numpy() for arr in record.values()]
        vecs = rows.detach().cpu().numpy()
        out = []
        for vec in vecs:
            arrays: dict[str, Array] = {}
            pos = 0
            for (key, shape, dtype), nd in zip(self.entries, base, strict=True):
                if np.issubdtype(np.dtype(dtype), np.floating):
                    n = int(np.prod(shape, dtype=np.int64))
                    nd = (nd + vec[pos:pos + n].reshape(shape)).astype(nd.dtype, copy=False)
                    pos += n
                arrays[key] = Array(np.ascontiguousarray(nd))
            out.append(ArrayRecord(arrays))
        return out


def _flwr_version() -> str:
    try:
        return metadata.version("flwr")
    except metadata.PackageNotFoundError:  # pragma: no cover - this module imports flwr
        return "not installed"


def flower_versions() -> dict[str, str]:
    """The package versions of a summary, Flower's included."""
    return {**versions(), "flwr": _flwr_version()}


def numeric_metrics(metrics: Any, prefix: str) -> dict[str, float | None]:
    """The numeric entries of a ``MetricRecord``, as ``{prefix + key: value}``."""
    return {f"{prefix}{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
