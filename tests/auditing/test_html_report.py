"""The audit report a person reads (issue 27, item 2): audit_report.html / .md next to the
summary, the verdict rules, and a screenshot in headless Chromium."""

import json
import os
import re
import shutil
import subprocess

import pytest

from audit_callbacks.auditing.html_report import fmt, verdict, write_report
from audit_callbacks.callbacks import CanaryAudit
from tests._federated import digits_dpfedavg, fit


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    dm, module = digits_dpfedavg(rounds_per_epoch=4)
    fit(dm, module, [CanaryAudit(30, 30, seed=1)], 12, tmp)
    return os.path.join(str(tmp), "run", "version_0")


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_report_written_next_to_summary(run_dir):
    summary = json.loads(_read(os.path.join(run_dir, "audit_summary.json")))
    page = _read(os.path.join(run_dir, "audit_report.html"))
    md = _read(os.path.join(run_dir, "audit_report.md"))
    for tm in ("final_model", "all_iterates"):
        word, sentence = verdict(summary, tm)
        assert word in ("violation", "suspicious", "consistent")
        assert sentence in md
        assert f'class="verdict {word}"' in page
    # the numbers are the summary's: exactly in data-value, as shown in the Markdown
    values = {float(v) for v in re.findall(r'data-value="([^"]+)"', page)}
    for name in ("epsilon_final_model", "epsilon_all_iterates", "epsilon_lower_bound_all_iterates"):
        value = summary["estimates"][name]["value"]
        assert value in values
        assert fmt(value) in md
    for key in ("epsilon_analytic", "epsilon_last_iterate_heuristic", "epsilon_ratio_all_iterates"):
        assert summary[key] in values
        assert fmt(summary[key]) in md
    for est in summary["estimates"].values():  # every status
        assert est["status"] in md
    # self-contained: figures inline, no external resource
    assert "http://" not in page and "https://" not in page
    assert page.count("data:image/png;base64,") >= 3  # epsilon over training + 2 densities
    assert "epsilon over training" in page
    assert "<style>" in page
    # readable Markdown: headings, a table, the settings
    assert md.startswith("# Privacy audit report")
    assert "## Verdict" in md and "## Settings" in md and "| num_canaries | 30 |" in md
    assert "base64" not in md
    assert not [f for f in os.listdir(run_dir) if f.startswith(".tmp-")]


def _summary(bound, lower, value=2.0, analytic=4.0):
    est = {"value": value, "lower": lower, "upper": value + 1, "status": "ok"}
    return {
        "inputs": {"alpha": 0.05},
        "epsilon_analytic": analytic, "epsilon_last_iterate_heuristic": 1.5,
        "epsilon_ratio_final_model": value / 1.5, "epsilon_ratio_all_iterates": value / analytic,
        "estimates": {
            "epsilon_final_model": est, "epsilon_all_iterates": est,
            "epsilon_lower_bound_final_model": {"value": bound, "status": "ok"},
            "epsilon_lower_bound_all_iterates": {"value": bound, "status": "ok"},
        },
    }


def test_verdict_violation():
    word, sentence = verdict(_summary(bound=5.0, lower=4.5, value=6.0), "all_iterates")
    assert word == "violation"
    assert sentence == "violation: the valid 95% lower bound 5 exceeds the claimed epsilon 4"
    # the final model's bound is held against the claim (the analytic epsilon) too
    assert verdict(_summary(bound=5.0, lower=4.5, value=6.0), "final_model")[0] == "violation"


def test_verdict_suspicious():
    summary = _summary(bound=1.0, lower=4.5, value=6.0)
    word, sentence = verdict(summary, "all_iterates")
    assert word == "suspicious"
    assert sentence.startswith("suspicious: the estimate's 95% interval lies above the claimed epsilon")
    assert verdict(summary, "final_model")[0] == "consistent"  # suspicious: all iterates only


def test_verdict_consistent_and_unchecked():
    assert verdict(_summary(bound=1.0, lower=1.5), "all_iterates")[0] == "consistent"
    assert verdict(_summary(bound=4.0, lower=4.0), "all_iterates")[0] == "consistent"  # not above
    no_noise = {**_summary(bound=9.0, lower=9.0), "epsilon_analytic": None,
                "epsilon_analytic_status": "infinite: no DP noise (noise_multiplier = 0)"}
    assert verdict(no_noise, "all_iterates")[0] == "unchecked"


def test_write_report_fabricated(tmp_path):
    summary = _summary(bound=5.0, lower=4.5, value=6.0)
    html_path, md_path = write_report(summary, str(tmp_path / "sub"),
                                      history=[(1, 2.0, 4.0, 1.0), (2, 6.0, 4.0, None)],
                                      extra={"label attack": {"accuracy": 0.5}})
    page = _read(html_path)
    assert "violation: the valid 95% lower bound 5 exceeds the claimed epsilon 4" in page
    assert "label attack" in page and "epsilon over training" in page
    assert "label attack" in _read(md_path)


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_screenshot_headless_chromium(run_dir, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium, chromium-browser or google-chrome on PATH (install one to "
                    "take the report's screenshot)")
    out = tmp_path / "report.png"
    page = os.path.abspath(os.path.join(run_dir, "audit_report.html"))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={out}",
           "--window-size=1200,1600", f"file://{page}"]
    subprocess.run(cmd, capture_output=True, timeout=120, check=False,
                   env={**os.environ, "HOME": str(tmp_path)})
    assert out.exists(), "chromium wrote no screenshot"
    assert out.stat().st_size > 10_000


# ---------------------------------------------------------------------------- crafted values
_EVIL = "<script>alert(1)</script>"
#: a Flower strategy's repr: a pipe and newlines that would end the table row and start a heading
_STRATEGY = "FedAvg(accept_failures=True | fraction_fit=0.1)\n\n# injected heading\n| x | y |\r\n|---|---|"
#: Markdown markup of every kind: link, image, emphasis, code, strike-through, a trailing backslash
_MARKUP = "[link](javascript:alert(1)) ![img](http://x/p.png) **bold** `code` _it_ ~~s~~ <b>b</b> &amp; \\"


def _crafted():
    """A summary a run (or a forged file) could hold, markup in keys, values, class names and
    reprs, and a verdict word that is not one."""
    return {
        "callback": "<img src=x onerror=alert(1)>",
        "inputs": {"training": "DP-SGD <i>x</i>", "accountant": f"Evil{_EVIL}Accountant|x\ny",
                   "strategy": _STRATEGY, "<b>key</b>|k\ney": _MARKUP, "num_canaries": 30},
        "verdict_all_iterates": 'consistent" onmouseover="alert(1)',
        "verdict_all_iterates_sentence": f"{_EVIL}\n| forged | row |",
        "verdict_final_model": "<b>violation</b>", "verdict_final_model_sentence": _MARKUP,
        "verdict_mechanism": "violation onclick=alert(1)", "verdict_mechanism_sentence": "x\n# h",
        "epsilon_analytic": 4.0, "epsilon_analytic_status": _STRATEGY,
        "estimates": {
            "epsilon_final_model": {"value": 2.0, "lower": 1.0, "upper": 3.0, "status": "ok|<b>x</b>\nrow"},
            f"{_EVIL}|est\nx": {"value": 1.0, "status": "<img src=x onerror=alert(3)>"},
        },
        "threat_models": {"<b>tm</b>": "x|y\nz"},
        "versions": {"torch<script>": "2|x\n"},
        "source": f"{_EVIL} [s](http://evil)",
    }


_EXTRA = {"<h1>section</h1>|x\n# h": {"<b>k</b>|\n": f"v{_EVIL}|\n", "source": "<a href=x>s</a>"}}


class _Tags:
    """Every start tag and attribute of an HTML document, and its text."""

    def __init__(self, page):
        from html.parser import HTMLParser

        self.tags, self.text = [], []
        outer = self

        class P(HTMLParser):
            def handle_starttag(self, tag, attrs):
                outer.tags.append((tag, dict(attrs)))

            def handle_data(self, data):
                outer.text.append(data)

        parser = P(convert_charrefs=True)
        parser.feed(page)
        parser.close()


def test_crafted_summary_html_escapes_every_value(tmp_path):
    """Issue 37 item 8: markup in the verdict word, keys, values, the accountant's class name and
    a strategy's repr is text in the HTML; the verdict word is a class only if it is a verdict."""
    from audit_callbacks.auditing.html_report import _WORDS, render_html

    page = render_html(_crafted(), {"<b>fig</b>": "AAAA'><script>alert(4)</script>"}, _EXTRA)
    parsed = _Tags(page)
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "div", "b",
               "table", "tr", "th", "td", "ul", "li", "img"}
    assert {t for t, _ in parsed.tags} <= allowed, {t for t, _ in parsed.tags} - allowed
    for tag, attrs in parsed.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert set((attrs.get("class") or "").split()) <= {"verdict", "num", "small", *_WORDS}, attrs
        if tag == "img":
            assert attrs["src"] == "data:image/png;base64,AAAA'><script>alert(4)</script>"  # one attribute
    text = "".join(parsed.text)  # every crafted value is shown as itself
    for value in (_EVIL, "<img src=x onerror=alert(1)>", "<b>key</b>|k\ney", _STRATEGY.replace("\r", ""),
                  "<h1>section</h1>|x\n# h", "<a href=x>s</a>"):
        assert value in text.replace("\r", ""), value
    assert page.count('class="verdict unchecked"') == 3  # none of the three words is a verdict


def _md_tables(md):
    """The Markdown's tables: lists of rows, a row the cells split at unescaped pipes."""
    import re

    tables, current = [], None
    for line in md.split("\n"):
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)
            if current is None:
                current = []
                tables.append(current)
            current.append([c.strip() for c in cells[1:-1]])
        else:
            current = None
    return tables


def test_crafted_summary_markdown_escapes_every_value():
    """Issue 37 item 8: the Markdown escaped nothing but ``|``: a class name or repr reached it
    raw (HTML, links, images), and a newline in a key or value broke its tables."""
    from markdown_it import MarkdownIt

    from audit_callbacks.auditing.html_report import render_markdown

    summary = _crafted()
    md = render_markdown(summary, ["<b>fig</b>|x"], _EXTRA)
    # every table keeps its shape: each row as many cells as its header, one row per entry
    tables = _md_tables(md)
    for table in tables:
        assert {len(row) for row in table} == {len(table[0])}, table
    settings = next(t for t in tables if t[0] == ["setting", "value"])
    assert len(settings) == 2 + len(summary["inputs"])
    estimates = next(t for t in tables if t[0][0] == "name")
    assert len(estimates) == 2 + len(summary["estimates"])
    # rendered by renderers that pass raw HTML (as MLflow's and W&B's may; TensorBoard's text
    # plugin uses Python-Markdown): no tag from the run, and each value shows as itself, on one line
    import markdown

    for page in (MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough").render(md),
                 markdown.markdown(md, extensions=["tables"])):
        parsed = _Tags(page)
        allowed = {"h1", "h2", "p", "ul", "li", "strong", "table", "thead", "tbody", "tr", "th", "td"}
        assert {t for t, _ in parsed.tags} <= allowed, {t for t, _ in parsed.tags} - allowed
        assert not [a for _, attrs in parsed.tags for a in attrs if a not in ("style", "align")]
        text = "".join(parsed.text)
        for value in (_EVIL, _MARKUP, "<img src=x onerror=alert(1)>", "Evil<script>alert(1)</script>Accountant|x y",
                      "FedAvg(accept_failures=True | fraction_fit=0.1)  # injected heading | x | y | |---|---|",
                      "<b>key</b>|k ey", "<h1>section</h1>|x # h"):
            assert value in text, value
    # the escaping function: one line, no raw markup; intraword underscores kept
    from audit_callbacks.auditing.html_report import markdown_text

    assert markdown_text("num_canaries") == "num_canaries"
    assert markdown_text("a\\|b\nc") == "a\\\\\\|b c"
    assert "\n" not in markdown_text(_STRATEGY) and "<" not in markdown_text(_EVIL)
