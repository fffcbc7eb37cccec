"""The JSON summary a callback writes at fit end, atomically, into the run's own folder."""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import is_dataclass
from importlib import metadata
from typing import Any

import numpy as np

__all__ = ["run_dir", "summary_dir", "to_jsonable", "versions", "write_summary"]

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


# Trainer -> the fresh folder of a run without a logger: every callback of one run writes there.
_RUN_DIRS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def run_dir(trainer: Any) -> str:
    """The run's own folder: the first logger's ``log_dir`` (Lightning's versioned folder),
    else a fresh ``default_root_dir/audit/version_N`` (N one more than the largest there),
    chosen once per Trainer so that every callback of the run shares it."""
    for logger in getattr(trainer, "loggers", None) or []:
        path = getattr(logger, "log_dir", None)
        if path:
            return str(path)
    cached = _RUN_DIRS.get(trainer)
    if cached is None:
        root = os.path.join(str(trainer.default_root_dir), "audit")
        os.makedirs(root, exist_ok=True)
        taken = [int(m.group(1)) for name in os.listdir(root)
                 if (m := re.fullmatch(r"version_(\d+)", name))]
        version = max(taken, default=-1) + 1
        while True:  # another run may take the same number at the same moment
            cached = os.path.join(root, f"version_{version}")
            try:
                os.makedirs(cached)
                break
            except FileExistsError:
                version += 1
        _RUN_DIRS[trainer] = cached
    return cached


def summary_dir(trainer: Any, filename: str) -> str:
    """:func:`run_dir`, with the folder of ``filename`` (which may hold subfolders) created.

    Raises:
        ValueError: ``filename`` is absolute or leaves the run folder, or the folder cannot be
            created (called at fit start, so a bad path fails before any training).
    """
    if os.path.isabs(filename) or os.path.normpath(filename).startswith(".."):
        raise ValueError(f"summary_filename must be a path inside the run folder, got {filename!r}")
    directory = run_dir(trainer)
    try:
        os.makedirs(os.path.dirname(os.path.join(directory, filename)) or directory, exist_ok=True)
    except OSError as err:
        raise ValueError(f"summary_filename {filename!r}: cannot create its folder in {directory}: {err}") from err
    return directory


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
