"""A quantity of the name table (see :mod:`audit_callbacks.names`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Quantity"]


@dataclass(frozen=True)
class Quantity:
    """One logged number.

    Attributes:
        family: the tag prefix (``"audit"``, ``"label_dp"``...).
        name: the field / JSON key; the tag is ``family + "/" + name``.
        chart: the Custom Scalars chart that draws it, or None.
        description: what it is, for a user who has only the package.
    """

    family: str
    name: str
    chart: str | None
    description: str

    @property
    def tag(self) -> str:
        return f"{self.family}/{self.name}"
