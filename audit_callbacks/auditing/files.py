"""Summary files: JSON written atomically into a run's own folder (no Lightning, no Flower).

What holds for every file written here: a reader never sees a partial file (a
temporary file, ``fsync``'d, then renamed); a failed write (disk full) leaves nothing under the
final name; no run replaces a file another run wrote (:func:`write_text`); a folder two runs
took at once is detected (:func:`claim_dir`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import re
import socket
import tempfile
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import is_dataclass
from importlib import metadata
from typing import Any

import numpy as np

__all__ = ["CLAIM_FILENAME", "RUN_TOKEN", "check_writable", "claim_dir", "fresh_version_dir", "to_jsonable",
           "versions", "write_summary", "write_text"]

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


#: The marker file by which a run claims its folder.
CLAIM_FILENAME = ".audit_run"


def _new_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}-{uuid.uuid4().hex}"


def _stale(token: str) -> bool:
    """Whether the run that wrote ``token`` is gone: it ran on this host and its process no
    longer exists (a run killed with -9, or one that ended, whose folder a resumed run of the
    same Lightning version now uses). A token of another host, or of a live process, is not."""
    host, _, rest = token.partition(":")
    pid = rest.split("-", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


#: This process's token in the folder claims (:func:`claim_dir`): host, pid and a random part,
#: so that a reused pid never passes for an earlier process (renewed in a forked child).
RUN_TOKEN = _new_token()
# Paths this process has written: the only ones it may replace (another run's never).
_WRITTEN: set[str] = set()


def _after_fork() -> None:  # a forked child is another run: its own token, nothing written yet
    global RUN_TOKEN
    RUN_TOKEN = _new_token()
    _WRITTEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def write_text(path: str, text: str) -> str:
    """Write ``text`` to ``path`` so that no reader ever sees a partial file and no run
    replaces a file another run wrote; returns the path written.

    The text goes to a temporary file in the same folder, is flushed and ``fsync``'d, then
    takes the final name: ``os.replace`` where this process wrote that name before (a repeated
    fit updates its own summary), else an exclusive ``os.link`` (atomic: it fails if the name
    exists). If the name was taken by another run (or process), the file is written under a
    fresh name ``<stem>-<n><ext>`` instead, with a ``UserWarning`` naming both.

    Raises:
        OSError: the file could not be written (disk full, no permission); the temporary
            file is removed and nothing under the final name changed.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        final = _place(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return final


def _place(tmp: str, path: str) -> str:
    """Give the written temporary file ``tmp`` its final name (see :func:`write_text`): the
    first of ``path``, ``<stem>-1<ext>``, ... that this process wrote before (replaced) or that
    does not exist yet (created exclusively)."""
    stem, ext = os.path.splitext(path)
    candidate, n = path, 0
    while True:
        if os.path.realpath(candidate) in _WRITTEN:
            os.replace(tmp, candidate)
            return candidate
        try:
            _exclusive_rename(tmp, candidate)
            _WRITTEN.add(os.path.realpath(candidate))
            break
        except FileExistsError:
            n += 1
            candidate = f"{stem}-{n}{ext}"
    if candidate != path:  # warned once, when the fresh name is taken
        warnings.warn(f"{path} was written by another run: this run's file is {candidate} "
                      "(runs never replace each other's outputs)", UserWarning, stacklevel=4)
    return candidate


def _exclusive_rename(tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path`` unless ``path`` exists (``FileExistsError``): a hard link
    (atomic), or where the file system has none, the name reserved with ``O_EXCL`` and then
    replaced."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some network and FUSE file systems)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        try:
            os.replace(tmp, path)
        except BaseException:
            os.unlink(path)
            raise
        return
    os.unlink(tmp)


def _fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` durable (best effort: not every platform opens folders)."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_summary(directory: str, filename: str, summary: Mapping[str, Any]) -> str:
    """Write ``summary`` (with versions added) as indented JSON into ``directory/filename``
    with :func:`write_text` (atomic, ``fsync``'d, never replacing another run's file: then
    under a fresh name, warned); returns the path written.

    Raises:
        OSError: it could not be written (nothing under the final name changed).
    """
    path = os.path.join(directory, filename)
    payload = dict(summary)
    payload.setdefault("versions", versions())
    text = json.dumps(to_jsonable(payload), indent=2, allow_nan=False)
    return write_text(path, text)


def check_writable(directory: str, filename: str) -> None:
    """Fail early where ``directory/filename`` could not be written at the end: the folder is
    created and a probe file written and removed in it.

    Raises:
        ValueError: the name is an existing folder, or the folder cannot be created or
            written (naming the path and the error).
    """
    path = os.path.join(directory, filename)
    if os.path.isdir(path):
        raise ValueError(f"summary_filename: {path} is a folder; the summary file cannot go there")
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"summary_filename: the folder {folder} is not writable ({err})") from err


def claim_dir(path: str) -> bool:
    """Claim the folder ``path`` for this process's run: its marker file ``.audit_run`` is
    created exclusively with :data:`RUN_TOKEN`. True when the folder is this process's (just
    claimed, or claimed by it before, or left by a run whose process is gone on this host: a
    resume into the same Lightning version); False when another live process claimed it (two
    runs that took the same Lightning version, two processes resuming one checkpoint) or a
    process on another host did."""
    os.makedirs(path, exist_ok=True)
    marker = os.path.join(path, CLAIM_FILENAME)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            with open(marker, encoding="utf-8") as fh:
                owner = fh.read().strip()
        except OSError:
            return False
        if owner == RUN_TOKEN:
            return True
        # an empty marker is a claim being written an instant ago: not stale, another run's
        return _stale(owner) and _take_over(marker, owner)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(RUN_TOKEN)
    return True


def _take_over(marker: str, owner: str) -> bool:
    """Take over the claim ``owner`` (a gone process's token) of ``marker``: of several
    processes that read the same stale token, exactly one wins. A taker holds the takeover
    lock named after that token (created with ``O_EXCL``), checks under it that the marker
    still holds ``owner`` (a slower taker finds the winner's token there and steps aside),
    replaces the marker with this process's token atomically (a temporary file renamed over
    it), then removes the lock. A rename of the marker itself would not do: a slower process
    could rename away the claim the winner had just written and win as well (seen as two
    winners of four in CI). A taker that dies holding the lock leaves the folder to nobody
    (later runs take a fresh version folder), never to two."""
    lock = f"{marker}.takeover-{hashlib.sha256(owner.encode('utf-8')).hexdigest()[:16]}"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError:  # FileExistsError: another process is taking this claim over
        return False
    tmp = f"{marker}.tmp-{uuid.uuid4().hex}"
    try:
        with open(marker, encoding="utf-8") as fh:
            if fh.read().strip() != owner:  # taken over already
                return False
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(RUN_TOKEN)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, marker)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock)


def fresh_version_dir(root: str) -> str:
    """A new ``root/version_N`` (N one more than the largest there), created with ``os.mkdir``
    (atomic: it fails where the folder exists), so that two runs started at the same moment
    never share (and overwrite) a folder."""
    os.makedirs(root, exist_ok=True)
    taken = [int(m.group(1)) for name in os.listdir(root) if (m := re.fullmatch(r"version_(\d+)", name))]
    version = max(taken, default=-1) + 1
    while True:  # another run may take the same number at the same moment
        path = os.path.join(root, f"version_{version}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            version += 1
