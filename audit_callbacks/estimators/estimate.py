"""The result type every estimator and callback reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ._validation import check_real_finite


@dataclass(frozen=True)
class Estimate:
    """An empirical privacy estimate with its uncertainty and provenance.

    Attributes:
        value: the point estimate (epsilon, or a rate), a finite float.
        lower: lower end of its interval, or ``None`` when none was computed.
        upper: upper end of its interval, or ``None``.
        n: number of statistics (canaries, trials) behind the estimate.
        method: short name of the estimator, e.g. ``"two_gaussians"``.
        threat_model: ``"final_model"``, ``"all_iterates"``, ... .
        delta: the delta at which epsilon is stated (``None`` for rates).
        confidence: confidence level of ``[lower, upper]`` (e.g. 0.95), if any.
        extras: small JSON-serialisable details (fitted means, thresholds).
    """

    value: float
    lower: float | None = None
    upper: float | None = None
    n: int = 0
    method: str = ""
    threat_model: str = ""
    delta: float | None = None
    confidence: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises ValueError when value (or lower/upper, when given) is not a finite real
        scalar (bool, complex, str, arrays and NaN/inf are rejected; 0-d tensors converted)."""
        for name in ("value", "lower", "upper"):
            v = getattr(self, name)
            if v is None and name != "value":
                continue
            try:
                f = check_real_finite(v, name)
            except ValueError as exc:
                raise ValueError(f"Estimate.{exc}") from None
            if type(v) is not float:
                object.__setattr__(self, name, f)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
