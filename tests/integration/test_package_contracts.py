"""Whole-package contracts: the front ends are thin adapters, and no module imports itself back
through another (counting the cycles that go through a package's ``__init__``)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "audit_callbacks"

#: the canary audit's front ends: Lightning, Flower, plain-PyTorch Opacus
FRONT_ENDS = ("callbacks/canary_audit.py", "flower/strategy.py", "plain/opacus_audit.py")
#: where the statistics and the estimates live: a front end imports nothing from them
STATISTICS = ("audit_callbacks.canary", "audit_callbacks.estimators")
#: array and statistics libraries: a front end computes no statistic
NUMERICS = ("numpy", "scipy", "math", "statistics")
#: attributes that hold a statistic's internals: a front end reads none of them
INTERNALS = {"stats", "statistics", "projection", "matched", "cosines", "scores"}
#: the framework hooks a front end forwards (Lightning's, DP-FedAvg's rounds, Flower's strategy)
HOOK_PREFIXES = ("on_", "configure_", "aggregate_")
HOOK_NAMES = {"setup", "teardown"}
#: a forwarding call's receiver: the front end itself, its auditor and the auditor's backend,
#: the wrapped Flower strategy, or a base class
RECEIVERS = {"self", "self.auditor", "self.auditor.backend", "self.strategy", "super()"}


def _imported_modules(tree: ast.Module, module: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")[: -node.level] if node.level else []
            out.add(".".join([*base, node.module] if node.module else base))
    return out


def _audit_imports(tree: ast.Module) -> set[str]:
    """Names bound by ``from audit_callbacks... import name`` (the helpers a hook may call)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.level or (node.module or "").startswith("audit_callbacks")) for a in node.names}


def _receiver(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return ast.unparse(func.value)
    return None


@pytest.mark.parametrize("relpath", FRONT_ENDS)
def test_the_front_ends_are_thin_adapters(relpath):
    """A front end defines no statistic and switches on no backend type: it imports nothing
    from ``canary/`` or ``estimators/`` nor any numerical library, reads no statistic's
    internals, has no ``isinstance`` on a backend, and each of its framework hooks forwards (to
    itself, its auditor, the auditor's backend, the wrapped strategy, a base class or a helper
    of the package)."""
    path = PACKAGE / relpath
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    tree = ast.parse(path.read_text())

    imported = _imported_modules(tree, module)
    assert not {m for m in imported for s in STATISTICS if m == s or m.startswith(s + ".")}, (path, imported)
    assert not {m for m in imported if m.split(".")[0] in NUMERICS}, (path, imported)

    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not read & INTERNALS, (path, read & INTERNALS)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            assert "Backend" not in ast.unparse(node), (path, ast.unparse(node))

    helpers = _audit_imports(tree)
    hooks = [fn for cls in tree.body if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_")
             for fn in cls.body if isinstance(fn, ast.FunctionDef)
             and (fn.name.startswith(HOOK_PREFIXES) or fn.name in HOOK_NAMES)]
    for fn in hooks:
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
        forwards = [c for c in calls if _receiver(c) in RECEIVERS
                    or (isinstance(c.func, ast.Name) and c.func.id in helpers)]
        assert forwards, f"{relpath}: {fn.name} forwards to nothing"


# ---------------------------------------------------------------------------- import cycles
def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file (a package is its ``__init__.py``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _import_time_statements(body: list[ast.stmt]):
    """The imports a module runs when it is imported: its top level, the branches of ``if``
    (not ``if TYPE_CHECKING``), ``try`` and ``with``, and class bodies; not function bodies
    (deferred: they cannot form a cycle)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _import_time_statements(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time_statements(node.body)


def _module_imports() -> dict[str, set[str]]:
    """Module -> the package modules its import runs first, packages' ``__init__`` included.

    Importing ``audit_callbacks.pkg.mod`` runs ``pkg/__init__.py`` and then ``mod``, so it
    depends on both; ``from audit_callbacks.pkg import X`` depends on ``pkg.X`` when X is a
    submodule, and on ``pkg/__init__.py`` (which depends on what it imports) when X is a name
    it binds. The importer's own ancestor packages are already being imported (Python's
    partial initialisation), so only a name taken from an ancestor's ``__init__`` counts
    as a dependency on it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        parts = mod.split(".")
        deps: set[str] = set()

        def runs(target: str, mod: str = mod, deps: set[str] = deps) -> None:
            pieces = target.split(".")
            for i in range(1, len(pieces) + 1):
                name = ".".join(pieces[:i])
                if name in modules and name != mod and not mod.startswith(name + "."):
                    deps.add(name)

        for node in _import_time_statements(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("audit_callbacks"):
                        runs(alias.name)
                continue
            base = parts if is_pkg else parts[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("audit_callbacks"):
                continue
            runs(target)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    runs(sub)
                elif target != mod and mod.startswith(target + "."):
                    deps.add(target)  # a name of an ancestor's __init__: it must have run to the end
        graph[mod] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, set(c)) for c in components]


def _a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(component)  # pragma: no cover - a component has a cycle


def test_no_import_cycle_between_modules():
    """Counting the cycles through a package's ``__init__`` (``a`` imports ``from pkg import
    X``, ``pkg/__init__`` imports ``pkg.b``, which imports ``a``)."""
    cycles = _cycles(_module_imports())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_cycles_through_a_package_init():
    """The graph counts a dependency on a package's ``__init__`` and what it imports: a
    planted ``a -> pkg (__init__) -> pkg.b -> a`` is a cycle, a chain is not."""
    graph = {"a": {"pkg"}, "pkg": {"pkg.b"}, "pkg.b": {"a"}}
    assert _cycles(graph) == [["a", "pkg", "pkg.b", "a"]]
    assert _cycles({"a": {"pkg"}, "pkg": {"pkg.b"}, "pkg.b": set()}) == []
    assert "audit_callbacks.callbacks.canary_audit" in _module_imports()["audit_callbacks.callbacks"]


def test_the_top_of_the_package_holds_only_entry_points_and_shared_validation():
    """At most four modules beside ``__init__.py`` at the top of ``audit_callbacks/``; the
    layers live in their folders."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 4, top


def test_no_issue_narration_or_numbered_paper_in_the_package():
    """Docstrings say what the code does and cite authors and venues, not "issue 26" or
    "Paper 000" (the tracker and the paper files are not shipped with the package)."""
    pattern = re.compile(r"\b(issue\s+#?\d+|paper\s+0\d\d)\b", re.IGNORECASE)
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in PACKAGE.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
