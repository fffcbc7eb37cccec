"""Re-export of :mod:`audit_callbacks.validation` under its old private path.

The estimators, attacks and mechanisms were written against this module; the checks now live in
the public :mod:`audit_callbacks.validation` (numpy only). ``check_count`` here also takes
``minimum`` positionally, as its callers do.
"""

from __future__ import annotations

from audit_callbacks import validation as _v
from audit_callbacks.validation import (
    as_float_array,
    check_alpha,
    check_choice,
    check_cosines,
    check_delta,
    check_dim,
    check_finite_1d,
    check_flag,
    check_optional_count,
    check_positive,
    check_positive_finite,
    check_probability,
    check_real,
    check_real_finite,
    check_seed,
    check_size,
    make_rng,
    to_numpy,
)

__all__ = [
    "as_float_array",
    "to_numpy",
    "check_alpha",
    "check_choice",
    "check_delta",
    "check_dim",
    "check_flag",
    "check_optional_count",
    "check_positive",
    "check_positive_finite",
    "check_probability",
    "check_real",
    "check_real_finite",
    "check_finite_1d",
    "check_cosines",
    "check_count",
    "check_seed",
    "check_size",
    "make_rng",
]


def check_count(x: object, name: str, minimum: int = 0) -> int:
    """:func:`audit_callbacks.validation.check_count` with ``minimum`` also positional."""
    return _v.check_count(x, name, minimum=minimum)
