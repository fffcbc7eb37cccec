"""The name table: every number a callback, strategy or ``DPFedAvg`` logs, with its one name.

A quantity has one ``name``: the field of its result, its key in the summary JSON, and (after
its family's prefix) its TensorBoard tag ``"<family>/<name>"``. Its ``chart`` is the title of
the Custom Scalars chart that draws it (None: a scalar with no chart). Every callback and
strategy takes its tags from here (:func:`tag`) and its charts from :func:`chart_layout`, and a
test walks this table against every logged tag and JSON key.

The table is assembled from one file per kind of audit (split by concept): ``_canary``
(family ``audit``), ``_label`` (``label_attack``, ``label_dp``, ``fl_label_attack``), ``_ldp``
(``ldp``, ``ldp_inference``) and ``_federated`` (``DPFedAvg``'s own ``fl``, ``privacy`` and
``train`` metrics).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from . import _canary, _federated, _label, _ldp
from ._quantity import Quantity

__all__ = ["QUANTITIES", "SECTIONS", "Quantity", "chart_layout", "family", "names", "tag"]

_PARTS = (_canary, _label, _ldp, _federated)

#: The one table.
QUANTITIES: tuple[Quantity, ...] = tuple(q for part in _PARTS for q in part.QUANTITIES)

#: The section title of each family in TensorBoard's Custom Scalars tab.
SECTIONS: dict[str, str] = {fam: title for part in _PARTS for fam, title in part.SECTIONS.items()}

_BY_TAG: dict[str, Quantity] = {q.tag: q for q in QUANTITIES}
if len(_BY_TAG) != len(QUANTITIES):  # pragma: no cover - a table error
    raise RuntimeError("audit_callbacks.names: a tag is registered twice")


def tag(family_name: str, name: str) -> str:
    """The TensorBoard tag of quantity ``name`` of ``family_name``.

    Raises:
        KeyError: the quantity is not in the table (every logged number must be).
    """
    key = f"{family_name}/{name}"
    if key not in _BY_TAG:
        raise KeyError(f"{key!r} is not in audit_callbacks.names.QUANTITIES")
    return key


def family(family_name: str) -> list[Quantity]:
    """The quantities of one family, in table order."""
    return [q for q in QUANTITIES if q.family == family_name]


def names(family_name: str) -> list[str]:
    """The names (JSON keys) of one family."""
    return [q.name for q in family(family_name)]


def _anchored(tags: Iterable[str]) -> list[str]:
    """Custom Scalars tags are regular expressions: match each tag exactly."""
    return [f"^{re.escape(t)}$" for t in tags]


def chart_layout(
    families: Iterable[str], *, only: Iterable[str] | None = None,
    extra: dict[str, dict[str, list[str]]] | None = None,
) -> dict[str, dict[str, list[Any]]]:
    """TensorBoard's Custom Scalars layout of ``families``: a section per family, a Multiline
    chart per ``chart`` title, each with the exact (anchored) tags it draws.

    Args:
        families: family names, in the order of their sections.
        only: if given, only these tags are drawn (e.g. the analytic epsilons a backend has).
        extra: further ``{section: {chart: [regex, ...]}}`` (e.g. the accuracy beside).
    """
    keep = None if only is None else set(only)
    layout: dict[str, dict[str, list[Any]]] = {}
    for fam in families:
        charts: dict[str, list[str]] = {}
        for q in family(fam):
            if q.chart is not None and (keep is None or q.tag in keep):
                charts.setdefault(q.chart, []).append(q.tag)
        if charts:
            layout[SECTIONS.get(fam, fam)] = {
                title: ["Multiline", _anchored(tags)] for title, tags in charts.items()}
    for section, charts in (extra or {}).items():
        layout.setdefault(section, {}).update({t: ["Multiline", list(p)] for t, p in charts.items()})
    return layout
