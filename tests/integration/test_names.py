"""The name table is the one source of every quantity name.

Walks every module of the package (its AST: string constants, f-string parts, dict keys, the
arguments of ``tag(...)``) and fails on a quantity name spelled as a literal outside
``audit_callbacks/names/``: import the constant from :mod:`audit_callbacks.names` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit_callbacks import names

PACKAGE = Path(__file__).resolve().parents[2] / "audit_callbacks"

#: Names that are also ordinary parameter, attribute or state names (``check_positive(clip_norm,
#: "clip_norm")``, ``state["round"]``) or plain words: a bare literal of one is allowed; its tag
#: (``"fl/round"``), a ``tag(...)`` call with a literal argument, a family prefix (``"val/"``) and
#: an f-string part that builds a tag still fail.
GENERIC = frozenset({
    names.ACCURACY, names.CLIP_NORM, names.COHORT_SIZE, names.LOSS, names.ROUND, names.WARNINGS,
    names.EPSILON0_STEM, names.ERROR_STEM, names.CONFIDENCE_STEM,
})

_STEMS = {names.EPSILON0_STEM, names.EPSILON0_LOWER_BOUND_STEM, names.NORM_G1_STEM,
          names.ERROR_STEM, names.ERROR_MEDIAN_STEM, names.ERROR_MAX_STEM, names.CONFIDENCE_STEM}
_NAMES = {q.name for q in names.QUANTITIES} | _STEMS
_TAGS = {q.tag for q in names.QUANTITIES}
_FAMILIES = {q.family for q in names.QUANTITIES}
_FORBIDDEN = (_NAMES - GENERIC) | _TAGS
#: f-string parts that build a name or a tag: ``f"epsilon0_{adv}"``, ``f"ldp/{key}"``.
_FAMILY_PREFIXES = {f"{fam}/" for fam in _FAMILIES}
_PREFIXES = {f"{stem}_" for stem in _STEMS} | _FAMILY_PREFIXES


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _is_tag_call(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "tag") or (isinstance(f, ast.Attribute) and f.attr == "tag")


def literals(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of every quantity name spelled in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in _FORBIDDEN or node.value in _FAMILY_PREFIXES:
                hits.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant) and any(str(part.value).endswith(p) for p in _PREFIXES):
                    hits.append((part.lineno, str(part.value)))
        elif isinstance(node, ast.Call) and _is_tag_call(node):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    hits.append((arg.lineno, f"tag(...{arg.value!r}...)"))
    return sorted(set(hits))


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "names" not in p.relative_to(PACKAGE).parts[:1])


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_no_quantity_name_literal_outside_names() -> None:
    found = {_rel(p): h for p in _modules() if (h := literals(p))}
    assert not found, (
        "quantity names spelled as literals (import the constants of audit_callbacks.names): "
        + "; ".join(f"{f}: {h}" for f, h in sorted(found.items())))


@pytest.mark.parametrize("source", [
    'x = {"epsilon_all_iterates": 1.0}',
    'x = "audit/epsilon_all_iterates"',
    'x = f"epsilon0_lower_bound_{adv}"',
    'x = f"ldp/{key}"',
    'x = tag("fl", ROUND)',
    'x = numeric_metrics(res, "val/")',
])
def test_the_walk_sees(tmp_path: Path, source: str) -> None:
    p = tmp_path / "m.py"
    p.write_text(source + "\n")
    assert literals(p)


def test_the_walk_allows(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text('"""epsilon_all_iterates in a docstring."""\n'
                 'c = check_positive(clip_norm, "clip_norm")\nr = state["round"]\n'
                 'x = tag(FAMILY_AUDIT, EPSILON_ALL_ITERATES)\n')
    assert literals(p) == []


def test_constants_cover_the_table() -> None:
    values = set(names.CONSTANTS.values())
    for q in names.QUANTITIES:
        assert q.family in values
        assert q.name in values or any(q.name.startswith(f"{s}_") for s in _STEMS), q.name
    assert len(values) == len(names.CONSTANTS), "a name is defined twice"
    for const in names.CONSTANTS:
        assert getattr(names, const) == names.CONSTANTS[const]
        assert const in names.__all__


def test_docs_tags_md_is_current() -> None:
    path = PACKAGE.parent / "docs" / "tags.md"
    assert path.exists(), f"docs/tags.md is missing: run `{names.REGENERATE}`"
    assert path.read_text(encoding="utf-8") == names.markdown_table(), (
        f"docs/tags.md is stale (the name table changed): run `{names.REGENERATE}`")


def test_docs_tags_md_lists_every_quantity() -> None:
    table = names.markdown_table()
    for q in names.QUANTITIES:
        assert f"| `{q.tag}` | `{q.name}` |" in table
    for fam in names.SECTIONS:
        assert fam in names.SOURCES, f"family {fam!r} has no source"
