"""Summary files: JSON written atomically into a run's own folder (no Lightning, no Flower)."""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from dataclasses import is_dataclass
from importlib import metadata
from typing import Any

import numpy as np

__all__ = ["fresh_version_dir", "to_jsonable", "versions", "write_summary"]

_PACKAGES = ("audit-callbacks", "torch", "lightning", "opacus", "torchmetrics", "numpy", "scipy")


def versions() -> dict[str, str]:
    """Versions of Python and of the packages an estimate depends on (read once a process)."""
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, numpy and torch values to plain JSON (non-finite floats become None)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(obj.to_dict() if hasattr(obj, "to_dict") else vars(obj))
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "detach"):  # torch tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_summary(directory: str, filename: str, summary: Mapping[str, Any]) -> str:
    """Write ``summary`` (with versions added) as indented JSON into ``directory/filename``,
    atomically (a temporary file in the same folder, then ``os.replace``: a reader sees the old
    file or the new one, never a partial one); returns the path."""
    path = os.path.join(directory, filename)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = dict(summary)
    payload.setdefault("versions", versions())
    text = json.dumps(to_jsonable(payload), indent=2, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def fresh_version_dir(root: str) -> str:
    """A new ``root/version_N`` (N one more than the largest there), created exclusively, so
    that two runs started at the same moment never share (and overwrite) a folder."""
    os.makedirs(root, exist_ok=True)
    taken = [int(m.group(1)) for name in os.listdir(root) if (m := re.fullmatch(r"version_(\d+)", name))]
    version = max(taken, default=-1) + 1
    while True:  # another run may take the same number at the same moment
        path = os.path.join(root, f"version_{version}")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            version += 1
