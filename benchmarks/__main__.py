"""``python -m benchmarks NAME [args]``: run the benchmark ``NAME`` (a module of this package with a
``main(argv)``) with ``args``; without a name, list the benchmarks with their first lines."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, str]:
    """Benchmark name -> the first line of its docstring: every public module of the package
    that defines ``main`` (the planted-bug case modules have none: ``planted_bugs`` runs them)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            doc = ast.get_docstring(tree) or ""
            out[path.stem] = doc.splitlines()[0] if doc else ""
    return out


def run(argv: list[str]) -> int:
    available = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(map(len, available))
        print("usage: python -m benchmarks NAME [args]   (NAME --help: its arguments)\n")
        for name, line in available.items():
            print(f"  {name:<{width}}  {line}")
        return 0
    name, args = argv[0], argv[1:]
    if name not in available:
        print(f"unknown benchmark {name!r}; one of: {', '.join(available)}", file=sys.stderr)
        return 2
    sys.argv = [str(Path("benchmarks") / f"{name}.py"), *args]  # what a result file records as its command
    result = importlib.import_module(f"benchmarks.{name}").main(args)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
