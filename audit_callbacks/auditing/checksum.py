"""A checksum over an audit state, so that a damaged state is refused at load.

The state a front end checkpoints (:meth:`CanaryAuditor.state_dict`) carries ``checksum``: the
SHA-256 of a canonical serialisation of each of its fields (one level deep, so that a mismatch
names the field: ``stats.theta0``, ``participations``...). The serialisation does not depend on
the container a number travels in: a tensor, a numpy array and a list of the same numbers, a
tuple and a list, hash alike; floats hash by their IEEE-754 double value (float16/float32/
bfloat16 tensors are widened exactly), so a state that went through ``torch.save`` /
``torch.load`` or a deep copy hashes the same, and any change of a number does not.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["CHECKSUM_KEY", "field_digests", "verify"]

#: The state's key that holds ``{"sha256": {field: hex digest}}``.
CHECKSUM_KEY = "checksum"


def _feed(h: Any, obj: Any) -> None:
    """Feed the canonical form of ``obj`` into the hash ``h``."""
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # a torch tensor
        t = obj.detach().cpu()
        floating = t.is_floating_point()
        obj = (t.double() if floating else t.long()).numpy()
    if isinstance(obj, np.ndarray):
        kind = "f" if obj.dtype.kind in "fc" else "i"
        arr = np.ascontiguousarray(obj, dtype=np.float64 if kind == "f" else np.int64)
        h.update(f"A{kind}{arr.shape}".encode())
        h.update(arr.tobytes())
    elif obj is None or isinstance(obj, (bool, np.bool_)):
        h.update(f"C{obj!r}".encode())
    elif isinstance(obj, (int, np.integer)):
        h.update(f"I{int(obj)}".encode())
    elif isinstance(obj, (float, np.floating)):
        value = float(obj)
        h.update(b"F" + (struct.pack("<d", value) if not math.isnan(value) else b"nan"))
    elif isinstance(obj, str):
        h.update(f"S{len(obj)}:".encode() + obj.encode())
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)}".encode())
        for key in sorted(obj, key=str):
            _feed(h, str(key))
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                       for v in obj):  # a list of numbers hashes like the array it was
            floating = any(isinstance(v, (float, np.floating)) for v in obj)
            _feed(h, np.asarray(obj, dtype=np.float64 if floating else np.int64))
            return
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"R{type(obj).__name__}:{obj!r}".encode())


def _digest(obj: Any) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def field_digests(state: Mapping[str, Any]) -> dict[str, str]:
    """``{field: SHA-256 hex digest}`` of every field of ``state`` (``checksum`` itself
    excluded), one level into dict-valued fields (``"stats.theta0"``)."""
    out: dict[str, str] = {}
    for key in sorted(state, key=str):
        if key == CHECKSUM_KEY:
            continue
        value = state[key]
        if isinstance(value, Mapping) and value:
            for sub in sorted(value, key=str):
                out[f"{key}.{sub}"] = _digest(value[sub])
        else:
            out[str(key)] = _digest(value)
    return out


def verify(state: Mapping[str, Any], *, name: str) -> bool:
    """Check ``state`` against its checksum.

    Returns:
        True when the state holds a checksum and it matches; False when it holds none (a
        checkpoint from before checksums: the caller warns).

    Raises:
        ValueError: the checksum is malformed, or a field is missing, added or changed
            (naming every field that does not match).
    """
    saved = state.get(CHECKSUM_KEY)
    if saved is None:
        return False
    digests = saved.get("sha256") if isinstance(saved, Mapping) else None
    if not isinstance(digests, Mapping):
        raise ValueError(f"{name}: the checkpoint's audit state has a malformed checksum")
    mine = field_digests(state)
    bad = sorted({k for k in set(mine) | set(digests) if mine.get(k) != digests.get(k)})
    if bad:
        raise ValueError(
            f"{name}: the checkpoint's audit state is damaged: {', '.join(bad)} does not match "
            "its SHA-256 checksum (the state was changed after it was saved); refusing to resume "
            "from it. Resume from another checkpoint or start a new run")
    return True
