"""Input checks shared by the estimators, attacks and mechanisms (private, numpy only).

Every failure raises ValueError naming the argument. Tensors (anything with a ``.detach()``
method, e.g. torch tensors of any float dtype including bfloat16/float16, on any device, with or
without ``requires_grad``) are converted here, without importing torch: detached, moved to the
CPU, widened to float64 (:func:`to_numpy`). Booleans, complex numbers, objects and strings are
never accepted as numbers; integers only where the argument says so.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "as_float_array",
    "to_numpy",
    "check_alpha",
    "check_delta",
    "check_dim",
    "check_positive_finite",
    "check_real_finite",
    "check_finite_1d",
    "check_cosines",
    "check_count",
    "check_seed",
    "check_size",
    "make_rng",
]


def to_numpy(x: object, name: str) -> np.ndarray:
    """``x`` as a numpy array; a tensor (duck-typed: has ``.detach()``) is detached, moved to the
    CPU and, when floating-point, widened to float64 (bfloat16 has no numpy dtype).

    Raises:
        ValueError: ``x`` cannot be read as an array (ragged nesting, a complex tensor...).
    """
    detach = getattr(x, "detach", None)
    if callable(detach) and not isinstance(x, np.ndarray):
        t = detach()
        is_complex = getattr(t, "is_complex", None)
        if callable(is_complex) and is_complex():
            raise ValueError(f"{name} must be real-valued, got dtype {getattr(t, 'dtype', '?')}")
        cpu = getattr(t, "cpu", None)
        t = cpu() if callable(cpu) else t
        is_float = getattr(t, "is_floating_point", None)
        if callable(is_float) and is_float():
            t = t.double()
        numpy = getattr(t, "numpy", None)
        if callable(numpy):
            return np.asarray(numpy())
        x = t
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of real numbers: {exc}") from None


def as_float_array(x: object, name: str, *, allow_int: bool = False) -> np.ndarray:
    """``x`` as a float64 array (no copy when it already is one): float input of any dtype,
    integers only with ``allow_int``.

    Raises:
        ValueError: booleans, complex numbers, objects, strings (and integers unless allowed).
    """
    arr = to_numpy(x, name)
    kind = arr.dtype.kind
    if kind == "f" or (allow_int and kind in "iu"):
        return arr.astype(np.float64, copy=False)
    what = {"b": "booleans", "i": "integers", "u": "integers", "c": "complex numbers"}.get(
        kind, f"dtype {arr.dtype}"
    )
    expected = "real numbers" if allow_int else "floating-point numbers"
    raise ValueError(f"{name} must hold {expected}, got {what}")


def check_real_finite(x: object, name: str) -> float:
    """A finite real scalar as float (a 0-d array or tensor is accepted; bool is not)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(
        x, (numbers.Real, np.floating, np.integer)
    ):
        arr = to_numpy(x, name)
        if arr.ndim != 0 or arr.dtype.kind not in "iuf":
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
    """An integer count >= minimum (an integral float or 0-d tensor is accepted; bool is not)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Integral, np.integer)):
        v = None
        if not isinstance(x, (bool, np.bool_)):
            arr = to_numpy(x, name)
            if arr.ndim == 0 and arr.dtype.kind in "iuf":
                v = arr.item()
        if v is not None and math.isfinite(v) and float(v).is_integer():
            x = int(v)
        else:
            raise ValueError(f"{name} must be an integer, got {x!r}")
    v = int(x)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_finite_1d(x: object, name: str, min_size: int = 1) -> np.ndarray:
    """A 1-D float64 array of finite values with at least min_size entries (float input only:
    booleans, integers, complex numbers are rejected; tensors are converted)."""
    arr = as_float_array(x, name)
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


def check_seed(seed: object, name: str = "seed") -> int:
    """A non-negative integer seed (numpy's SeedSequence and torch's manual_seed accept it)."""
    return check_count(seed, name, minimum=0)


def make_rng(rng: object, name: str = "rng") -> np.random.Generator:
    """A numpy Generator from ``rng``: a Generator is used as is, a non-negative integer seeds
    :func:`numpy.random.default_rng`, and None gives a fresh, unseeded (not reproducible) one.

    Raises:
        ValueError: anything else (a float, a string, a bool, a negative integer).
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (bool, np.bool_)) or not isinstance(rng, (numbers.Integral, np.integer)):
        raise ValueError(
            f"{name} must be a numpy.random.Generator, a non-negative integer seed or None, "
            f"got {rng!r}"
        )
    return np.random.default_rng(check_seed(rng, name))


def check_size(size: object, name: str = "size") -> tuple[int, ...]:
    """An output shape: a non-negative integer or a tuple of them."""
    dims = size if isinstance(size, (tuple, list)) else (size,)
    return tuple(check_count(s, name, minimum=0) for s in dims)
