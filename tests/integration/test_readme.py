"""README.md is a guide a new user can follow: every fenced ``python`` block runs as written
(each on its own, in a fresh folder, from the repository root's imports), writes a summary,
prints the paths its comments name and draws no warning from the audit about its own settings;
the guide stays short and its links lead somewhere."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300
#: the audit's own warnings start with the front end's name
FRONT_ENDS = ("CanaryAudit:", "OpacusCanaryAudit:", "CanaryStrategy:")

pytestmark = pytest.mark.filterwarnings("ignore")


def _blocks(language: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced block of ``language`` in README.md, in order."""
    text = README.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M):
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


SNIPPETS = _blocks("python")


def test_the_readme_is_a_short_guide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES
    assert len(SNIPPETS) >= 6  # one per kind of training: DP-SGD, plain loop, FedAvg, Flower, label, LDP


DOCS = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)  # no headings inside code
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_relative_link_leads_somewhere(doc):
    text = re.sub(r"^```.*?^```$", "", doc.read_text(encoding="utf-8"), flags=re.S | re.M)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in link or link.startswith("mailto:"):
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(link)
    assert not broken


def test_every_public_name_the_readme_imports_exists():
    import importlib

    for _, code in SNIPPETS:
        for module, names in re.findall(r"^from (audit_callbacks[\w.]*) import (.+)$", code, re.M):
            mod = importlib.import_module(module)
            for name in (n.strip() for n in names.split("#")[0].split(",")):
                assert hasattr(mod, name), f"{module}.{name}"


@pytest.mark.parametrize("line,code", SNIPPETS, ids=[f"README.md:{line}" for line, _ in SNIPPETS])
def test_readme_snippet_has_no_undefined_or_unused_name(line, code):
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F,B,E9",
         "--line-length", "100", "--stdin-filename", f"README_{line}.py", "-"],
        input=code, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("line,code", SNIPPETS, ids=[f"README.md:{line}" for line, _ in SNIPPETS])
def test_readme_snippet_runs_as_written(line, code, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # `datamodules`, `models`: the repository's own
    # a user's script starts in a fresh process: torch's global generator seeded from OS
    # entropy and no Lightning seed (an earlier test in this process may have seeded both)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    torch.seed()
    namespace = {"__name__": "__readme__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
    summaries = sorted(p.name for p in tmp_path.rglob("*summary*.json"))
    assert summaries, f"the snippet at README.md:{line} wrote no summary"
    # a snippet a user copies draws no warning from the audit about its own settings
    own = [str(w.message) for w in caught if str(w.message).startswith(FRONT_ENDS)]
    own += [r.getMessage() for r in caplog.records  # Flower's front end warns through its logger
            if r.levelno >= logging.WARNING and r.getMessage().startswith(FRONT_ENDS)]
    # a verdict is about this run's random noise and cohorts (a correct run is flagged at the
    # checks' false-positive rate), not about the snippet's settings
    own = [m for m in own if "the claimed privacy:" not in m]
    assert not own, f"the snippet at README.md:{line} warns: {own}"
    # doctest-style: the path a print's comment names is what it prints
    for expected in re.findall(r"^print\(.*?\)\s+#\s+(\S+\.(?:json|html))", code, re.M):
        assert expected.replace("/", os.sep) in printed.getvalue(), (expected, printed.getvalue())
