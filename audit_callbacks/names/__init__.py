"""The name table: every number a callback, strategy or ``DPFedAvg`` logs, with its one name.

A quantity has one ``name``: the field of its result, its key in the summary JSON, and (after
its family's prefix) its TensorBoard tag ``"<family>/<name>"``. Its ``chart`` is the title of
the Custom Scalars chart that draws it (None: a scalar with no chart). Every callback and
strategy takes its tags from here (:func:`tag`) and its charts from :func:`chart_layout`, and a
test walks this table against every logged tag and JSON key.

The table is assembled from one file per kind of audit (split by concept): ``_canary``
(family ``audit``), ``_label`` (``label_attack``, ``label_dp``, ``fl_label_attack``), ``_ldp``
(``ldp``, ``ldp_inference``) and ``_federated`` (``DPFedAvg``'s own ``fl``, ``privacy``, ``val`` and
``test`` metrics).

Every name and family is a constant defined once (``_keys``, re-exported here:
``EPSILON_ALL_ITERATES``, ``FAMILY_AUDIT``...); the rows above are built from them, and code
outside this package imports them instead of spelling a name
(``tests/integration/test_names.py`` walks the package for literals). :func:`markdown_table`
renders the table as ``docs/tags.md`` (:data:`REGENERATE` rewrites it; a test checks that it is
current).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from . import _canary, _federated, _label, _ldp
from ._keys import (
    ACCURACY,
    ACCURACY_NOISED,
    ATTACKED_CLIENTS,
    ATTACKED_FRACTION,
    BATCH_SIZE_VARIANCE_RATIO,
    CLIENT_UPDATES_AT_CLIP,
    CLIP_NORM,
    COHORT_SIZE,
    CONFIDENCE_STEM,
    CONSTANTS,
    COUNT_ACCURACY,
    DELTA_SOURCE,
    EPSILON0_CEILING,
    EPSILON0_CLAIMED,
    EPSILON0_LOWER_BOUND_STEM,
    EPSILON0_STEM,
    EPSILON_ACCOUNTANT,
    EPSILON_ALL_ITERATES,
    EPSILON_ALL_ITERATES_MATCHED,
    EPSILON_ALL_ITERATES_MAX_COSINE,
    EPSILON_ANALYTIC,
    EPSILON_ANALYTIC_KNOWN_BATCHES,
    EPSILON_ANALYTIC_PRV,
    EPSILON_ANALYTIC_RDP,
    EPSILON_CLAIMED_PER_COORDINATE,
    EPSILON_EXACT_PER_COORDINATE,
    EPSILON_FINAL_MODEL,
    EPSILON_FINAL_MODEL_UNEQUAL_FIT,
    EPSILON_GDP_LOWER_BOUND_ALL_ITERATES,
    EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED,
    EPSILON_GDP_LOWER_BOUND_FINAL_MODEL,
    EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED,
    EPSILON_LAST_ITERATE_HEURISTIC,
    EPSILON_LOWER_BOUND,
    EPSILON_LOWER_BOUND_ALL_ITERATES,
    EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED,
    EPSILON_LOWER_BOUND_EXTRAPOLATED,
    EPSILON_LOWER_BOUND_FINAL_MODEL,
    EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED,
    EPSILON_LOWER_BOUND_MAX,
    EPSILON_LOWER_BOUND_SECOND_LAST,
    EPSILON_LOWER_BOUND_SECOND_LAST_MAX,
    EPSILON_PAIR_ALL_PARAMS,
    EPSILON_PAIR_LAYER,
    EPSILON_PAIR_OPTIMAL_TEST,
    EPSILON_RATIO_ALL_ITERATES,
    EPSILON_RATIO_FINAL_MODEL,
    EPSILON_SINGLE_ROUND,
    EPSILON_SINGLE_STEP,
    ERROR_MAX_STEM,
    ERROR_MEDIAN_STEM,
    ERROR_STEM,
    EXPECTED_ACCURACY_NOISED,
    EXPECTED_ATTACK_ACCURACY,
    FAMILY_AUDIT,
    FAMILY_FL,
    FAMILY_FL_LABEL_ATTACK,
    FAMILY_LABEL_ATTACK,
    FAMILY_LABEL_DP,
    FAMILY_LDP,
    FAMILY_LDP_INFERENCE,
    FAMILY_PRIVACY,
    FAMILY_TEST,
    FAMILY_VAL,
    FIT_END_NUMBERS,
    FRESH_NOISE_RATIO,
    LOSS,
    NOISE_SCALE_RATIO,
    NORM_G1_STEM,
    NUM_CANARIES_PARTICIPATED,
    PLAN_CEILING,
    PLAN_CLIP_FACTOR,
    PLAN_COVERAGE,
    PLAN_NOISE_FACTOR,
    PLAN_RATIO_HIGH,
    PLAN_RATIO_LOW,
    PLAN_RATIO_MEDIAN,
    PLAN_RATIO_READING,
    PLAN_REFERENCE,
    PLAN_SENTENCE,
    PLAN_STATUS,
    PLAN_STEPS,
    ROUND,
    SKIP_REASON,
    VERDICT_ALL_ITERATES,
    VERDICT_FINAL_MODEL,
    VERDICT_MECHANISM,
    WARNINGS,
    qualified,
)
from ._quantity import Quantity

__all__ = [
    "CONSTANTS", "QUANTITIES", "SECTIONS", "SOURCES", "Quantity", "chart_layout", "family",
    "REGENERATE", "markdown_table", "names", "qualified", "tag",
    "FAMILY_AUDIT",
    "NOISE_SCALE_RATIO",
    "FRESH_NOISE_RATIO",
    "BATCH_SIZE_VARIANCE_RATIO",
    "VERDICT_MECHANISM",
    "PLAN_STATUS",
    "PLAN_CEILING",
    "PLAN_RATIO_LOW",
    "PLAN_RATIO_MEDIAN",
    "PLAN_RATIO_HIGH",
    "PLAN_COVERAGE",
    "PLAN_REFERENCE",
    "PLAN_CLIP_FACTOR",
    "PLAN_NOISE_FACTOR",
    "PLAN_SENTENCE",
    "PLAN_RATIO_READING",
    "PLAN_STEPS",
    "EPSILON_LOWER_BOUND_ALL_ITERATES_WATCHED",
    "EPSILON_LOWER_BOUND_FINAL_MODEL_WATCHED",
    "EPSILON_GDP_LOWER_BOUND_ALL_ITERATES_WATCHED",
    "EPSILON_GDP_LOWER_BOUND_FINAL_MODEL_WATCHED",
    "DELTA_SOURCE",
    "FIT_END_NUMBERS",
    "FAMILY_LABEL_ATTACK",
    "FAMILY_LABEL_DP",
    "FAMILY_FL_LABEL_ATTACK",
    "FAMILY_LDP",
    "FAMILY_LDP_INFERENCE",
    "FAMILY_FL",
    "FAMILY_PRIVACY",
    "FAMILY_VAL",
    "FAMILY_TEST",
    "EPSILON_FINAL_MODEL",
    "EPSILON_FINAL_MODEL_UNEQUAL_FIT",
    "EPSILON_LOWER_BOUND_FINAL_MODEL",
    "EPSILON_GDP_LOWER_BOUND_FINAL_MODEL",
    "EPSILON_LAST_ITERATE_HEURISTIC",
    "EPSILON_ALL_ITERATES",
    "EPSILON_ALL_ITERATES_MATCHED",
    "EPSILON_ALL_ITERATES_MAX_COSINE",
    "EPSILON_LOWER_BOUND_ALL_ITERATES",
    "EPSILON_GDP_LOWER_BOUND_ALL_ITERATES",
    "EPSILON_ANALYTIC",
    "EPSILON_ANALYTIC_RDP",
    "EPSILON_ANALYTIC_PRV",
    "EPSILON_ANALYTIC_KNOWN_BATCHES",
    "EPSILON_RATIO_FINAL_MODEL",
    "EPSILON_RATIO_ALL_ITERATES",
    "NUM_CANARIES_PARTICIPATED",
    "VERDICT_FINAL_MODEL",
    "VERDICT_ALL_ITERATES",
    "ACCURACY",
    "COUNT_ACCURACY",
    "ATTACKED_FRACTION",
    "SKIP_REASON",
    "WARNINGS",
    "EPSILON_LOWER_BOUND",
    "EPSILON_LOWER_BOUND_MAX",
    "EPSILON_LOWER_BOUND_EXTRAPOLATED",
    "EPSILON_LOWER_BOUND_SECOND_LAST",
    "EPSILON_LOWER_BOUND_SECOND_LAST_MAX",
    "EPSILON_PAIR_OPTIMAL_TEST",
    "EPSILON_PAIR_LAYER",
    "EPSILON_PAIR_ALL_PARAMS",
    "EPSILON_SINGLE_STEP",
    "EPSILON_ACCOUNTANT",
    "EXPECTED_ATTACK_ACCURACY",
    "ACCURACY_NOISED",
    "EXPECTED_ACCURACY_NOISED",
    "ATTACKED_CLIENTS",
    "EPSILON_SINGLE_ROUND",
    "EPSILON0_STEM",
    "EPSILON0_LOWER_BOUND_STEM",
    "NORM_G1_STEM",
    "ERROR_STEM",
    "ERROR_MEDIAN_STEM",
    "ERROR_MAX_STEM",
    "CONFIDENCE_STEM",
    "EPSILON0_CLAIMED",
    "EPSILON0_CEILING",
    "CLIP_NORM",
    "CLIENT_UPDATES_AT_CLIP",
    "EPSILON_EXACT_PER_COORDINATE",
    "EPSILON_CLAIMED_PER_COORDINATE",
    "ROUND",
    "COHORT_SIZE",
    "LOSS",
]

_PARTS = (_canary, _label, _ldp, _federated)

#: The one table.
QUANTITIES: tuple[Quantity, ...] = tuple(q for part in _PARTS for q in part.QUANTITIES)

#: The section title of each family in TensorBoard's Custom Scalars tab.
SECTIONS: dict[str, str] = {fam: title for part in _PARTS for fam, title in part.SECTIONS.items()}

#: The work each family's quantities come from.
SOURCES: dict[str, str] = {fam: src for part in _PARTS for fam, src in part.SOURCES.items()}

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


#: How docs/tags.md is made (the test that it is current prints it).
REGENERATE = "python -m audit_callbacks.names docs/tags.md"


def _cell(text: str | None) -> str:
    return "" if text is None else text.replace("|", "\\|")


def markdown_table() -> str:
    """docs/tags.md: every quantity of the table, a section per family, with its TensorBoard tag,
    its summary-JSON key, its Custom Scalars chart, its description and the family's source."""
    lines = [
        "# TensorBoard tags and summary keys",
        "",
        "Generated from the name table, `audit_callbacks.names`, by",
        f"`{REGENERATE}`: do not edit by hand (a test checks that it is current).",
        "A quantity's JSON key (in `audit_summary.json` and the callbacks' records) is its name,",
        "the field of its result; its TensorBoard tag is `<family>/<name>`; its chart is the",
        "Custom Scalars chart that draws it (none: a plain scalar). Code imports the names as",
        "constants: `from audit_callbacks.names import EPSILON_ALL_ITERATES`.",
    ]
    for fam in dict.fromkeys(q.family for q in QUANTITIES):
        lines += ["", f"## `{fam}`: {SECTIONS.get(fam, fam)}", ""]
        if fam in SOURCES:
            lines += [f"Source: {SOURCES[fam]}.", ""]
        lines += ["| TensorBoard tag | JSON key | chart | description |", "|---|---|---|---|"]
        lines += [f"| `{q.tag}` | `{q.name}` | {_cell(q.chart or 'none')} | {_cell(q.description)} |"
                  for q in family(fam)]
    return "\n".join(lines) + "\n"
