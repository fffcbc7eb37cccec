"""The audit report a person reads: ``audit_report.html`` and ``audit_report.md`` in the run's
folder, written whenever any audit ran (:class:`~audit_callbacks.auditing.output.AuditRun`).

The canary audit's part is built from its summary dict alone (:meth:`~audit_callbacks.auditing.CanaryAuditor.summary`), with
optional matplotlib figures (the density figures of
:func:`~audit_callbacks.auditing.figures.canary_figures`), an optional history of the estimates
over training, and optional further results (label attacks, local-DP audits). The HTML is
self-contained: inline CSS, figures as base64 PNG, no external resource.

Verdicts (:func:`verdict`, defined in :mod:`audit_callbacks.auditing.report` and computed once
into the summary as ``verdict_<tm>``), per threat model; the claim is the analytic epsilon:

* ``violation``: the valid (1 - alpha) lower bound ``epsilon_lower_bound_<tm>`` exceeds the
  analytic epsilon; the accounting (or the DP implementation) is wrong.
* ``suspicious`` (all iterates only): the estimate's interval lies above the analytic epsilon
  (its lower end exceeds it); an estimate, not a bound, so a sign to look closer.
* ``consistent``: neither.
* ``unchecked``: no finite claimed epsilon (no DP noise, or unknown), or no estimate.

Escaping. Every value that comes from a run (class names, reprs, keys, statuses, sentences,
section titles, sources) is escaped for the format it lands in: in the HTML by
:func:`html.escape` (a verdict word becomes a CSS class only when it is one of :data:`_WORDS`,
and is escaped even then); in the Markdown by :func:`markdown_text`, which turns line breaks
into spaces (a value never breaks a table row) and escapes ``|``, the HTML characters and the
Markdown markup, so the report shows the same text wherever it is rendered (MLflow, W&B).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from audit_callbacks import names
from audit_callbacks.auditing.files import write_text
from audit_callbacks.auditing.plan import EPSILON_SCALE, EPSILON_SCALE_SOURCE, epsilon_tier
from audit_callbacks.auditing.report import (
    REFERENCE_TITLES,
    REFERENCES,
    THREAT_MODEL_TITLES,
    fmt,
    verdict,
)

__all__ = ["EPSILON_SCALE", "EPSILON_SCALE_SOURCE", "HTML_FILENAME", "MARKDOWN_FILENAME", "epsilon_tier",
           "fmt", "history_figure", "interval", "markdown_text", "number_to_read", "render_html",
           "render_markdown",
           "verdict", "write_report"]

HTML_FILENAME = "audit_report.html"
MARKDOWN_FILENAME = "audit_report.md"

_DESCRIPTIONS = {q.name: q.description for q in names.family(names.FAMILY_AUDIT)}
#: the report's figure titles, in words (a figure is given by its TensorBoard tag)
_FIGURE_TITLES = {
    "audit/cosine_density_final_model": "Final model: cosines of the inserted canaries against the "
                                        "never-inserted ones (further apart: more leakage)",
    "audit/roc_final_model": "Final model: how well a canary's cosine tells whether it was inserted",
    "audit/cosine_density_all_iterates": "All iterates: each canary's largest cosine with a round's "
                                         "update, inserted against never inserted",
}


def interval(lower: Any, upper: Any) -> str:
    """``[lower, upper]`` as shown, or ``-`` when the estimate has no interval."""
    return "-" if lower is None and upper is None else f"[{fmt(lower)}, {fmt(upper)}]"


def _interval_words(est: Mapping[str, Any]) -> str:
    """An estimate's interval in a sentence: ``interval [a, b]``, or why there is none (the
    intervals are bootstrap percentiles, which ``bootstrap=0`` does not compute)."""
    if est.get("lower") is None and est.get("upper") is None:
        return "no interval: bootstrap=0" if est.get("value") is not None else "no estimate"
    return f"interval {interval(est.get('lower'), est.get('upper'))}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _estimate(summary: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return (summary.get("estimates") or {}).get(name) or {}


# ---------------------------------------------------------------------------- content
def _verdict(summary: Mapping[str, Any], tm: str) -> tuple[str, str]:
    """The summary's own verdict (computed once, when it was built), else :func:`verdict`."""
    word, sentence = summary.get(f"verdict_{tm}"), summary.get(f"verdict_{tm}_sentence")
    return (word, sentence) if isinstance(word, str) and isinstance(sentence, str) else verdict(summary, tm)


#: the verdict words (each a CSS class of the report)
_WORDS = ("consistent", "suspicious", "unproven", "violation", "unchecked")


def _mechanism(summary: Mapping[str, Any]) -> tuple[str, str] | None:
    """The summary's verdict of the checks of the mechanism, or None (a summary without it)."""
    word = summary.get(names.VERDICT_MECHANISM)
    sentence = summary.get(f"{names.VERDICT_MECHANISM}_sentence")
    return (word, sentence) if isinstance(word, str) and isinstance(sentence, str) else None


def _headline_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row a threat model: its estimate with interval, valid bound, reference, ratio."""
    rows = []
    for tm, (estimate_name, reference_name) in REFERENCES.items():
        est = _estimate(summary, estimate_name)
        rows.append({
            "threat_model": tm, "estimate": est.get("value"), "lower": est.get("lower"),
            "upper": est.get("upper"), "status": est.get("status", "-"),
            "bound": _estimate(summary, f"epsilon_lower_bound_{tm}").get("value"),
            "reference_name": reference_name, "reference": summary.get(reference_name),
            "ratio": summary.get(f"epsilon_ratio_{tm}"), "verdict": _verdict(summary, tm),
        })
    return rows


def _plan_words(summary: Mapping[str, Any]) -> str:
    """Which plan the ratio was read against, from what happened: its T (``plan_steps``,
    rounds for DP-FedAvg), made at fit start, at the plain loop's first write, or again at
    the steps taken (the reading then says so)."""
    steps = summary.get(names.PLAN_STEPS)
    if not isinstance(steps, int):
        return "against the run's plan"
    unit = "rounds" if "FedAvg" in str((summary.get("inputs") or {}).get("training", "")) else "steps"
    return f"against the plan for {steps} {unit}"


def _read_first(summary: Mapping[str, Any]) -> dict[str, str]:
    """The number to read: the all-iterates estimate (the adversary who sees every release),
    its interval, the claim, the ratio read against the plan, and both on the epsilon scale."""
    est = _estimate(summary, names.EPSILON_ALL_ITERATES)
    claim = summary.get(names.EPSILON_ANALYTIC)
    out = {"the number to read": (
        f"epsilon_all_iterates = {fmt(est.get('value'))} "
        f"({_interval_words(est)}; {est.get('status', 'skipped')}): "
        "the empirical epsilon of an adversary who sees every release, against the claim "
        f"epsilon_analytic = {fmt(claim)} at delta = {fmt((summary.get('inputs') or {}).get('delta'))}")}
    reading = summary.get(names.PLAN_RATIO_READING)
    if isinstance(reading, str):
        out["estimate / claim"] = f"{reading} ({_plan_words(summary)})"
    elif summary.get(names.EPSILON_RATIO_ALL_ITERATES) is not None:
        out["estimate / claim"] = (f"{fmt(summary.get(names.EPSILON_RATIO_ALL_ITERATES))} (no plan: "
                                   f"{summary.get(names.PLAN_STATUS, 'not planned')})")
    plan = summary.get(names.PLAN_SENTENCE)
    if isinstance(plan, str):
        out["plan"] = plan
    tier = epsilon_tier(claim)
    if tier is not None:
        out["the claim on the epsilon scale"] = f"{fmt(claim)}: {tier}"
    estimate = est.get("value")
    if epsilon_tier(estimate) is not None:  # an estimate is no guarantee: its range, not the words
        where = "at most 1" if estimate <= 1 else "at most 10" if estimate <= 10 else "above 10"
        out["the estimate on the epsilon scale"] = (f"{fmt(estimate)}: {where} (an empirical "
                                                    "estimate, not a guarantee)")
    out["epsilon scale"] = ("at most 1: strong formal privacy guarantee; at most 10: reasonable; above 10: "
                            f"weak to no formal privacy guarantee ({EPSILON_SCALE_SOURCE})")
    return out


def number_to_read(summary: Mapping[str, Any]) -> str:
    """The canary audit's one line for the terminal at the end: the number to read with its
    claim, and the ratio read against the plan (or the ratio alone)."""
    first = _read_first(summary)
    line = first["the number to read"]
    ratio = first.get("estimate / claim")
    return f"{line}; estimate / claim {ratio}" if ratio else line


def _chance(values: Mapping[str, Any]) -> str | None:
    """The chance level of a label section with an accuracy and a class count, as a sentence."""
    classes, acc = values.get("num_classes"), _number(values.get(names.ACCURACY))
    if not isinstance(classes, int) or classes < 2:
        return None
    chance = 1.0 / classes
    where = "" if acc is None else (
        f"; the measured {fmt(acc)} is " + ("at or below it: the attack recovers no label beyond "
                                            "guessing" if acc <= chance else f"{acc / chance:.1f} times it"))
    return (f"chance level: 1 / {classes} = {fmt(chance)} (guessing a label uniformly among the "
            f"{classes} classes){where}")


def _extra_table(values: Mapping[str, Any]) -> dict[str, Any]:
    """A further section's rows, with the chance level beside an accuracy."""
    chance = _chance(values)
    return dict(values) if chance is None else {**values, "chance level": chance}


def _sources(summary: Mapping[str, Any]) -> list[str]:
    out = [summary["source"]] if summary.get("source") else []
    for est in (summary.get("results") or summary.get("estimates") or {}).values():
        src = est.get("source")
        if src and src not in out:
            out.append(src)
    return out


def _plain(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return fmt(value)


def _png(fig: Any) -> str:
    """The figure's PNG as base64 text: the rendering a sink made of it already
    (:func:`~audit_callbacks.auditing.figures.render_figure`), else one made now."""
    from audit_callbacks.auditing.figures import figure_png

    return base64.b64encode(figure_png(fig)).decode("ascii")


def history_figure(history: Sequence[Sequence[Any]]) -> Any:
    """The "epsilon over training" figure from rows ``(step, epsilon_all_iterates,
    epsilon_analytic[, epsilon_final_model])`` (None where unknown); log scale when positive.

    Kept light, as the density figures are (:func:`~audit_callbacks.auditing.figures.
    density_figure`): at most 5 step ticks; on the log scale, major ticks at 1, 2 and 5 times
    the powers of ten where the values span less than three decades (the powers of ten
    alone otherwise), labelled as plain numbers, and no minor ticks (a tick is ~0.5 ms of
    drawing, a label ~1 ms); only the ticks inside the view are made
    (:func:`~audit_callbacks.auditing.figures.in_view_ticks`)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    from audit_callbacks.auditing.figures import DPI, in_view_ticks

    fig = Figure(figsize=(6, 3.5), dpi=DPI)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.14, top=0.9)
    ax = fig.add_subplot(1, 1, 1)
    labels = ("epsilon_all_iterates (estimate)", "epsilon_analytic (claim)",
              "epsilon_final_model (estimate)")
    values: list[float] = []
    for col, label in enumerate(labels, start=1):
        pts = [(row[0], row[col]) for row in history if len(row) > col and _number(row[col]) is not None
               and math.isfinite(row[col])]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label,
                    linestyle="--" if "claim" in label else "-")
            values += [float(p[1]) for p in pts]
    ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
    if values and min(values) > 0:
        ax.set_yscale("log")  # labels as plain text: matplotlib's mathtext ones cost ~20 ms
        few_decades = max(values) / min(values) < 1e3
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if few_decades else (1.0,)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_tick))
    ax.set_xlabel("step")
    ax.set_ylabel("epsilon")
    fig.text(0.5, 0.985, "Empirical epsilon over training, against the claim", ha="center", va="top")
    if ax.lines:
        ax.legend(loc="best", fontsize="small", frameon=False)
    in_view_ticks(ax)
    return fig


def _plain_tick(x: float, pos: int | None = None) -> str:
    """A log axis' tick label as a plain number (``%g``: 20, 500, 1e+04): no mathtext."""
    return f"{x:g}"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-family:monospace;white-space:nowrap}
.verdict{padding:.6em 1em;margin:.4em 0;border-radius:4px;font-size:1.05em}
.violation{background:#fbe3e3;border-left:6px solid #c62828}
.suspicious{background:#fff4d6;border-left:6px solid #ef8f00}
.unproven{background:#fff4d6;border-left:6px solid #ef8f00}
.consistent{background:#e5f4e7;border-left:6px solid #2e7d32}
.unchecked{background:#eee;border-left:6px solid #777}
img{max-width:100%;border:1px solid #eee}.small{color:#666;font-size:.9em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


#: characters that open Markdown markup anywhere in a line: code spans, emphasis, links and
#: images, table cells, and the backslash itself (so a value's trailing ``\`` cannot escape the
#: cell's ``|``); ``~`` (strike-through) becomes an entity, since not every renderer (Python-
#: Markdown, TensorBoard's) takes ``\~``
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|])")
#: an underscore that can open or close emphasis: not between two letters or digits
_MARKDOWN_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
#: every line break a Markdown renderer (or a text editor) may honour
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")


def markdown_text(value: Any) -> str:
    """``value`` as Markdown text that renders as itself, on one line, inside a table cell.

    Dicts and lists as JSON, numbers as :func:`fmt`; then line breaks become spaces, ``&``,
    ``<`` and ``>`` HTML entities (no raw HTML or autolink), and the characters of Markdown's
    inline markup (``\\ ` * [ ] |``, and ``_`` where it can delimit emphasis) are
    backslash-escaped and ``~`` is ``&#126;``; an intraword ``_`` (``num_canaries``) stays as it
    is. The text renders as itself in CommonMark, GitHub's Markdown and Python-Markdown.
    """
    text = _LINE_BREAKS.sub(" ", _plain(value))
    text = html.escape(text, quote=False)
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("~", "&#126;")
    return _MARKDOWN_UNDERSCORE.sub(r"\\_", text)


def _num_td(value: Any) -> str:
    data = f' data-value="{_e(repr(float(value)))}"' if _number(value) is not None else ""
    return f'<td class="num"{data}>{_e(fmt(value))}</td>'


def _table(rows: Mapping[str, Any]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_plain(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"


def _claim(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Which sampling the analytic epsilon assumes and, where the batches are known, the
    unamplified claim beside it (the summary's ``claim_sampling`` and
    ``epsilon_analytic_known_batches``)."""
    out: dict[str, Any] = {}
    sampling = (summary.get("inputs") or {}).get("claim_sampling")
    if sampling is not None:
        out["sampling the claim assumes"] = sampling
    known = names.EPSILON_ANALYTIC_KNOWN_BATCHES
    for key in (known, f"{known}_status"):
        if key in summary:
            out[key] = summary[key]
    return out


def render_html(summary: Mapping[str, Any] | None, images: Mapping[str, str],
                extra: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The report's HTML; ``images``: ``{title: base64 PNG}``; ``summary`` None: a report of
    the other audits' sections only (no canary audit ran)."""
    if summary is None:
        out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
               f"<title>Privacy audit report</title><style>{_CSS}</style></head><body>",
               "<h1>Privacy audit report</h1>"]
        for section, values in (extra or {}).items():
            out.append(f"<h2>{_e(section)}</h2>{_table(_extra_table(values))}")
        sources = [str(v["source"]) for v in (extra or {}).values() if v.get("source")]
        if sources:
            out.append("<h2>Sources</h2><ul>" + "".join(f"<li>{_e(s)}</li>" for s in sources) + "</ul>")
        out.append("</body></html>")
        return "\n".join(out)
    callback = summary.get("callback", "canary audit")
    training = (summary.get("inputs") or {}).get("training", "")
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>Privacy audit report: {_e(callback)}</title><style>{_CSS}</style></head><body>",
           f"<h1>Privacy audit report: {_e(callback)} {_e(training)}</h1>",
           "<h2>The number to read</h2>", _table(_read_first(summary)), "<h2>Verdict</h2>"]
    rows = _headline_rows(summary)
    verdicts = [(THREAT_MODEL_TITLES[row["threat_model"]], *row["verdict"]) for row in rows]
    mechanism = _mechanism(summary)
    if mechanism is not None:
        verdicts.append(("checks of the mechanism", *mechanism))
    for title, word, sentence in verdicts:
        css = word if word in _WORDS else "unchecked"  # a class name, never a summary's markup
        out.append(f'<div class="verdict {_e(css)}"><b>{_e(title)}</b>: {_e(sentence)}</div>')
    out.append("<h2>Headline numbers</h2><table><tr><th>threat model</th><th>estimate</th>"
               "<th>interval</th><th>valid lower bound</th><th>reference</th><th>value</th>"
               "<th>estimate / reference</th><th>status</th></tr>")
    for row in rows:
        out.append(
            f"<tr><th>{_e(THREAT_MODEL_TITLES[row['threat_model']])}</th>{_num_td(row['estimate'])}"
            f"<td class='num'>{_e(interval(row['lower'], row['upper']))}</td>"
            f"{_num_td(row['bound'])}<td>{_e(REFERENCE_TITLES[row['reference_name']])}</td>"
            f"{_num_td(row['reference'])}{_num_td(row['ratio'])}<td>{_e(row['status'])}</td></tr>")
    out.append("</table>")
    analytic = {k: summary.get(k) for k in (names.EPSILON_ANALYTIC, names.EPSILON_ANALYTIC_RDP,
                                            names.EPSILON_ANALYTIC_PRV, "epsilon_analytic_status",
                                            names.NUM_CANARIES_PARTICIPATED, "max_participations")
                if k in summary}
    out.append(_table({**analytic, **_claim(summary)}))
    out.append("<h2>Every estimate</h2><table><tr><th>name</th><th>value</th><th>interval</th>"
               "<th>status</th><th>what it is</th></tr>")
    for n, est in (summary.get("results") or summary.get("estimates") or {}).items():
        out.append(f"<tr><th>{_e(n)}</th>{_num_td(est.get('value'))}<td class='num'>"
                   f"{_e(interval(est.get('lower'), est.get('upper')))}</td>"
                   f"<td>{_e(est.get('status', '-'))}</td><td class='small'>"
                   f"{_e(_DESCRIPTIONS.get(n, ''))}</td></tr>")
    out.append("</table>")
    if images:
        out.append("<h2>Figures</h2>")
        for title, data in images.items():
            out.append(f"<h3>{_e(title)}</h3><img alt='{_e(title)}' src='data:image/png;base64,{_e(data)}'>")
    for section, values in (extra or {}).items():
        out.append(f"<h2>{_e(section)}</h2>{_table(_extra_table(values))}")
    out.append("<h2>Threat models</h2>")
    out.append(_table({THREAT_MODEL_TITLES.get(k, k): v for k, v in (summary.get("threat_models") or {}).items()}))
    out.append("<h2>Settings</h2>" + _table(summary.get("inputs") or {}))
    if summary.get("versions"):
        out.append("<h2>Versions</h2>" + _table(summary["versions"]))
    out.append("<h2>Sources</h2><ul>" + "".join(f"<li>{_e(s)}</li>" for s in _sources(summary))
               + "</ul></body></html>")
    return "\n".join(out)


def render_markdown(summary: Mapping[str, Any] | None, figure_titles: Sequence[str] = (),
                    extra: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The report's Markdown (the figures are in the HTML only); every value from the run
    through :func:`markdown_text`."""
    cell = markdown_text

    def section_table(section: Any, values: Mapping[str, Any]) -> list[str]:
        return (["", f"## {cell(section)}", "", "| | |", "|---|---|"]
                + [f"| {cell(k)} | {cell(v)} |" for k, v in _extra_table(values).items()])

    if summary is None:
        lines = ["# Privacy audit report"]
        for section, values in (extra or {}).items():
            lines += section_table(section, values)
        return "\n".join(lines) + "\n"
    callback = summary.get("callback", "canary audit")
    training = (summary.get("inputs") or {}).get("training", "")
    lines = [f"# Privacy audit report: {cell(callback)} {cell(training)}", "", "## The number to read",
             "", "| | |", "|---|---|"]
    lines += [f"| {cell(k)} | {cell(v)} |" for k, v in _read_first(summary).items()]
    lines += ["", "## Verdict", ""]
    rows = _headline_rows(summary)
    lines += [f"- **{THREAT_MODEL_TITLES[r['threat_model']]}**: {cell(r['verdict'][1])}" for r in rows]
    mechanism = _mechanism(summary)
    if mechanism is not None:
        lines.append(f"- **checks of the mechanism**: {cell(mechanism[1])}")
    lines += ["", "## Headline numbers", "",
              "| threat model | estimate | interval | valid lower bound | reference | value "
              "| estimate / reference | status |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {THREAT_MODEL_TITLES[r['threat_model']]} | {cell(r['estimate'])} | "
                     f"{cell(interval(r['lower'], r['upper']))} | {cell(r['bound'])} | "
                     f"{REFERENCE_TITLES[r['reference_name']]} | {cell(r['reference'])} | "
                     f"{cell(r['ratio'])} | {cell(r['status'])} |")
    claim = _claim(summary)
    if claim:
        lines += ["", "## The claim", "", "| | |", "|---|---|"]
        lines += [f"| {cell(k)} | {cell(v)} |" for k, v in claim.items()]
    lines += ["", "## Every estimate", "", "| name | value | interval | status |", "|---|---|---|---|"]
    for n, est in (summary.get("results") or summary.get("estimates") or {}).items():
        lines.append(f"| {cell(n)} | {cell(est.get('value'))} | "
                     f"{cell(interval(est.get('lower'), est.get('upper')))} | {cell(est.get('status', '-'))} |")
    if figure_titles:
        lines += ["", f"Figures ({', '.join(cell(t) for t in figure_titles)}): see {HTML_FILENAME}."]
    for section, values in (extra or {}).items():
        lines += section_table(section, values)
    lines += ["", "## Settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| {cell(k)} | {cell(v)} |" for k, v in (summary.get("inputs") or {}).items()]
    lines += ["", "## Sources", ""] + [f"- {cell(s)}" for s in _sources(summary)]
    return "\n".join(lines) + "\n"


def write_report(summary: Mapping[str, Any] | None, directory: str, *,
                 figures: Mapping[str, Any] | None = None,
                 extra: Mapping[str, Mapping[str, Any]] | None = None,
                 history: Sequence[Sequence[Any]] | None = None) -> tuple[str, str]:
    """Write ``audit_report.html`` (self-contained) and ``audit_report.md`` into ``directory``,
    each atomically and never over another run's file
    (:func:`audit_callbacks.auditing.files.write_text`); returns their paths ``(html, markdown)``.

    Args:
        summary: the canary audit's summary JSON content (:meth:`CanaryAuditor.summary`);
            None when no canary audit ran (the report holds the ``extra`` sections only).
        directory: the summary's folder (created if missing).
        figures: ``{title or tag: matplotlib Figure}`` embedded as PNG (HTML only); a figure
            a sink wrote already is not drawn again (its rendering is reused).
        extra: further sections ``{title: {key: value}}`` (label attacks, local-DP audits).
        history: rows ``(step, epsilon_all_iterates, epsilon_analytic[, epsilon_final_model])``;
            drawn as "epsilon over training" when it has at least one row.

    Raises:
        OSError: a file could not be written. ValueError: a figure could not be drawn.
    """
    os.makedirs(directory, exist_ok=True)
    figs = dict(figures or {})
    if history:
        figs = {"Empirical epsilon over training, against the claim": history_figure(history), **figs}
    images = {_FIGURE_TITLES.get(title, title): _png(fig) for title, fig in figs.items()}
    html_path = os.path.join(directory, HTML_FILENAME)
    md_path = os.path.join(directory, MARKDOWN_FILENAME)
    return (write_text(html_path, render_html(summary, images, extra)),
            write_text(md_path, render_markdown(summary, list(images), extra)))
