"""Input checks shared by the estimators (private). Every failure raises ValueError."""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "check_alpha",
    "check_delta",
    "check_dim",
    "check_positive_finite",
    "check_real_finite",
    "check_finite_1d",
    "check_cosines",
    "check_count",
]


def check_real_finite(x: object, name: str) -> float:
    """A finite real scalar as float."""
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        arr = np.asarray(x)
        if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{name} must be a real scalar, got {x!r}")
        x = arr.item()
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return v


def check_positive_finite(x: object, name: str) -> float:
    v = check_real_finite(x, name)
    if v <= 0.0:
        raise ValueError(f"{name} must be > 0, got {x!r}")
    return v


def check_delta(delta: object, name: str = "delta") -> float:
    """delta in the open interval (0, 1)."""
    v = check_real_finite(delta, name)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {delta!r}")
    return v


def check_alpha(alpha: object, name: str = "alpha") -> float:
    """alpha (a significance level) in the open interval (0, 1)."""
    v = check_real_finite(alpha, name)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {alpha!r}")
    return v


def check_dim(dim: object) -> int:
    """An integer dimension >= 2 (floats with an integral value are accepted)."""
    if isinstance(dim, bool):
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    if isinstance(dim, (numbers.Integral, np.integer)):
        d = int(dim)
    elif (
        isinstance(dim, (numbers.Real, np.floating))
        and math.isfinite(float(dim))
        and float(dim).is_integer()
    ):
        d = int(dim)
    else:
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    if d < 2:
        raise ValueError(f"dim must be >= 2 (the cosine null needs a sphere of dim >= 2), got {d}")
    return d


def check_count(x: object, name: str, minimum: int = 0) -> int:
    """An integer count >= minimum."""
    if isinstance(x, bool) or not isinstance(x, (numbers.Integral, np.integer)):
        if isinstance(x, (numbers.Real, np.floating)) and float(x).is_integer():
            x = int(x)
        else:
            raise ValueError(f"{name} must be an integer, got {x!r}")
    v = int(x)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_finite_1d(x: object, name: str, min_size: int = 1) -> np.ndarray:
    """A 1-D float array of finite values with at least min_size entries."""
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} values, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


_COS_SLACK = 1e-9


def check_cosines(x: object, name: str, min_size: int = 1) -> np.ndarray:
    """Finite 1-D cosines in [-1, 1] (a rounding slack of 1e-9 is clipped back into range)."""
    arr = check_finite_1d(x, name, min_size)
    if np.any(np.abs(arr) > 1.0 + _COS_SLACK):
        raise ValueError(f"{name} must be cosines in [-1, 1]; max |value| = {np.abs(arr).max()}")
    return np.clip(arr, -1.0, 1.0)
