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
