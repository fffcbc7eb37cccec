"""The one result type of every estimate, bound and rate the package reports (numpy only).

Canary estimates, label-DP bounds, local-DP (epsilon0) tests and error-rate epsilons are all an
:class:`AuditResult`: a finite ``value`` with its interval, the confidence and delta it is stated
at, the method and its source, the counts behind it, small JSON-serialisable ``details`` and a
``status``. Per-example arrays (per-label probabilities, per-pair epsilons) are never part of it:
they travel in a separate object beside it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AuditResult"]


def _finite(value: Any, name: str) -> float:
    """``value`` as a finite float; ValueError naming ``AuditResult.<name>`` otherwise (bool,
    complex, str, arrays, NaN and inf are rejected; 0-d tensors and numpy scalars converted)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"AuditResult.{name} must be a finite real number, got {value!r}")
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (int, float)):
        try:
            value = item()
        except (ValueError, RuntimeError):
            raise ValueError(f"AuditResult.{name} must be a scalar, got {value!r}") from None
        if isinstance(value, (bool, complex)):
            raise ValueError(f"AuditResult.{name} must be a finite real number, got {value!r}")
    if not isinstance(value, (int, float)):
        raise ValueError(f"AuditResult.{name} must be a finite real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"AuditResult.{name} must be finite, got {value!r}")
    return out


@dataclass(frozen=True)
class AuditResult:
    """One reported number with its uncertainty and provenance.

    Attributes:
        value: the estimate, bound or rate (epsilon in nats), a finite float.
        lower, upper: the ends of its interval (a bootstrap or binomial interval), or ``None``.
        alpha: 1 - confidence of the interval, or of ``value`` when ``value`` is a lower
            bound; ``None`` for a point estimate without an interval.
        delta: the delta at which epsilon is stated, in [0, 1) (``None`` for rates).
        method: the estimator's short name, e.g. ``"clopper_pearson_bonferroni"``.
        source: authors, year, title and section / equation of the formula.
        counts: the integer counts behind it (``k_in``, ``k_out``, ``fp``, ``fn``, ``n``...).
        details: further small JSON-serialisable numbers (threshold, goodness-of-fit p-value,
            fitted means, the threat model).
        status: ``"ok"``, or why the number should not be read as it stands
            (``"rejected: goodness-of-fit p = ..."``, ``"stale: from step N"``).

    Raises:
        ValueError: ``value`` (or ``lower`` / ``upper`` when given) is not a finite real
            scalar, ``alpha`` outside (0, 1) or ``delta`` outside [0, 1).
    """

    value: float
    lower: float | None = None
    upper: float | None = None
    alpha: float | None = None
    delta: float | None = None
    method: str = ""
    source: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"

    def __post_init__(self) -> None:
        for name in ("value", "lower", "upper", "alpha", "delta"):
            v = getattr(self, name)
            if v is None and name != "value":
                continue
            f = _finite(v, name)
            if name == "alpha" and not 0.0 < f < 1.0:
                raise ValueError(f"AuditResult.alpha must lie in (0, 1), got {v!r}")
            if name == "delta" and not 0.0 <= f < 1.0:
                raise ValueError(f"AuditResult.delta must lie in [0, 1), got {v!r}")
            if type(v) is not float:
                object.__setattr__(self, name, f)

    @property
    def confidence(self) -> float | None:
        """``1 - alpha``, or None."""
        return None if self.alpha is None else 1.0 - self.alpha

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-serialisable."""
        return asdict(self)
