"""Argument checks shared by every public entry point: callbacks, strategies, mechanisms,
attacks and estimators (numpy only: no torch or Lightning import).

Every check returns the value in its canonical Python type or raises :class:`ValueError` whose
message names the argument and shows the value it got (``repr``, shortened when long). They are
meant to be called once, where a user's value enters the package (a constructor, a public
function), so that code further in can trust its inputs.

Scalars
    :func:`check_count`, :func:`check_optional_count`, :func:`check_seed` (integers; ``2.0`` is
    not a count), :func:`check_real`, :func:`check_positive`, :func:`check_probability`
    (finite reals), :func:`check_flag` (a real ``bool`` only), :func:`check_choice` (one of
    the listed strings). ``bool`` is never accepted as a number, nor a number as a ``bool``.
    0-d numpy arrays and tensors (anything with ``.detach()``) are read as scalars of their
    dtype: an integer tensor is a count, a float tensor a real.

Arrays
    :func:`to_numpy`, :func:`as_float_array`, :func:`check_finite_1d`, :func:`check_cosines`:
    tensors of any float dtype (bfloat16 included), on any device, with or without
    ``requires_grad``, are detached, moved to the CPU and widened to float64.

Domain-specific
    :func:`check_delta`, :func:`check_alpha` (open interval (0, 1)), :func:`check_dim` (a
    dimension >= 2), :func:`check_size` (an output shape), :func:`make_rng` (a numpy Generator
    from a Generator, a seed or None).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable

import numpy as np

__all__ = [
    "check_count",
    "check_optional_count",
    "check_seed",
    "check_real",
    "check_positive",
    "check_probability",
    "check_flag",
    "check_choice",
    "check_summary_filename",
    "check_delta",
    "check_alpha",
    "check_dim",
    "check_size",
    "make_rng",
    "to_numpy",
    "as_float_array",
    "check_finite_1d",
    "check_cosines",
    # older names, kept for the modules that import them
    "check_real_finite",
    "check_positive_finite",
]

_REPR_MAX = 80


def _show(value: object) -> str:
    """``repr(value)``, shortened to about 80 characters (arrays can be long)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= _REPR_MAX else text[: _REPR_MAX - 3] + "..."


def _is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def _scalar_of(value: object, name: str) -> object | None:
    """The Python scalar held by a 0-d numpy array or tensor, or None when ``value`` is not
    one (nothing that is not an array or tensor is converted)."""
    if not (isinstance(value, np.ndarray) or callable(getattr(value, "detach", None))):
        return None
    try:
        arr = to_numpy(value, name)
    except ValueError:
        return None
    if arr.ndim != 0 or arr.dtype.kind not in "iuf":
        return None
    return arr.item()


# ---------------------------------------------------------------------------------- integers


def check_count(value: object, name: str, *, minimum: int = 0) -> int:
    """An integer ``>= minimum`` as ``int``.

    Accepted: ``int``, numpy integers, 0-d integer arrays and tensors. Rejected: every float
    (``2.5`` and ``2.0`` alike: a count written as a float is usually a bug), ``bool``,
    strings, ``None``, NaN, inf and anything else.

    Raises:
        ValueError: naming ``name`` and showing ``value``.
    """
    v: object = value
    if not _is_bool(v) and not isinstance(v, (numbers.Integral, np.integer)):
        inner = _scalar_of(v, name)
        v = inner if isinstance(inner, int) and not isinstance(inner, bool) else None
    if v is None or _is_bool(v) or not isinstance(v, (numbers.Integral, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    out = int(v)
    if out < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    return out


def check_optional_count(value: object, name: str, *, minimum: int = 0) -> int | None:
    """``None``, or a count as in :func:`check_count`."""
    return None if value is None else check_count(value, name, minimum=minimum)


def check_seed(value: object, name: str = "seed") -> int:
    """A non-negative integer seed (what numpy's ``SeedSequence`` and ``torch.manual_seed``
    accept); ``True``, floats, inf and negative numbers are rejected."""
    return check_count(value, name, minimum=0)


# ------------------------------------------------------------------------------------- reals


def check_real(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    """A finite real number as ``float``, optionally within bounds.

    Accepted: ``int`` and ``float`` (and their numpy types), 0-d real arrays and tensors.
    Rejected: ``bool``, complex numbers, strings, ``None``, NaN, +-inf, non-scalar arrays, an
    integer too large for a float, and anything outside ``[low, high]`` (each end open when its
    ``*_inclusive`` is False; ``None`` means unbounded).

    Raises:
        ValueError: naming ``name`` and showing ``value``.
    """
    v: object = value
    if _is_bool(v) or not isinstance(v, (numbers.Real, np.integer, np.floating)):
        v = None if _is_bool(v) else _scalar_of(v, name)
        if v is None:
            raise ValueError(f"{name} must be a finite real number, got {_show(value)}")
    try:
        out = float(v)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"{name} must be a finite real number, got {_show(value)}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be a finite real number, got {_show(value)}")
    too_low = low is not None and (out < low if low_inclusive else out <= low)
    too_high = high is not None and (out > high if high_inclusive else out >= high)
    if too_low or too_high:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        left = "[" if low is not None and low_inclusive else "("
        right = "]" if high is not None and high_inclusive else ")"
        raise ValueError(f"{name} must be in {left}{lo}, {hi}{right}, got {_show(value)}")
    return out


def check_positive(value: object, name: str) -> float:
    """A finite real ``> 0`` as ``float``."""
    return check_real(value, name, low=0.0, low_inclusive=False)


def check_probability(
    value: object, name: str, *, low_inclusive: bool = False, high_inclusive: bool = False
) -> float:
    """A finite real in the interval from 0 to 1, each end included only when asked (the
    default is the open interval (0, 1), as for delta and alpha)."""
    return check_real(
        value, name, low=0.0, high=1.0, low_inclusive=low_inclusive, high_inclusive=high_inclusive
    )


# ------------------------------------------------------------------------- flags and choices


def check_flag(value: object, name: str) -> bool:
    """A ``bool`` (or numpy bool) as ``bool``; ``None``, ``0``/``1``, ``'yes'`` and NaN are
    rejected (a truthy value is not a decision)."""
    if not _is_bool(value):
        raise ValueError(f"{name} must be True or False, got {_show(value)}")
    return bool(value)


def check_choice(value: object, name: str, choices: Iterable[str]) -> str:
    """One of ``choices`` (strings, compared exactly)."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        listed = ", ".join(repr(c) for c in options)
        raise ValueError(f"{name} must be one of {listed}; got {_show(value)}")
    return value


def check_summary_filename(value: object, name: str = "summary_filename", *,
                           optional: bool = True) -> str | None:
    """A summary file's name relative to the run's folder (it may hold subfolders): a
    non-empty ``str`` (or ``os.PathLike``) that is not absolute and does not leave the folder
    (no leading ``..`` once normalized), and does not name a folder (``"."``, a trailing
    separator). None where ``optional`` (no summary).

    Raises:
        ValueError: naming ``name``, for anything else (a number, ``""``, ``"/tmp/x.json"``,
            ``"../x.json"``).
    """
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a file name (a non-empty str), got {_show(value)}")
    norm = os.path.normpath(value)
    seps = tuple({os.sep, os.altsep or os.sep, "/"})
    if (os.path.isabs(value) or os.path.splitdrive(value)[0] or norm.split(os.sep)[0] == os.pardir
            or norm == os.curdir or value.endswith(seps)):
        raise ValueError(f"{name} must be a path inside the run folder, got {value!r}")
    return value


# ----------------------------------------------------------------------- domain-specific


def check_delta(delta: object, name: str = "delta") -> float:
    """delta in the open interval (0, 1)."""
    return check_probability(delta, name)


def check_alpha(alpha: object, name: str = "alpha") -> float:
    """alpha (a significance level) in the open interval (0, 1)."""
    return check_probability(alpha, name)


def check_dim(dim: object, name: str = "dim") -> int:
    """An integer dimension >= 2 (the cosine null needs a sphere of dimension >= 2)."""
    return check_count(dim, name, minimum=2)


def check_size(size: object, name: str = "size") -> tuple[int, ...]:
    """An output shape: a non-negative integer or a tuple / list of them."""
    dims = size if isinstance(size, (tuple, list)) else (size,)
    return tuple(check_count(s, name, minimum=0) for s in dims)


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
    if _is_bool(rng) or not isinstance(rng, (numbers.Integral, np.integer)):
        raise ValueError(
            f"{name} must be a numpy.random.Generator, a non-negative integer seed or None, "
            f"got {_show(rng)}"
        )
    return np.random.default_rng(check_seed(rng, name))


# ------------------------------------------------------------------------------------ arrays


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


# Older names (the estimators were written against these).
check_real_finite = check_real
check_positive_finite = check_positive
