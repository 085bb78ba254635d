"""md.parallel reads top to bottom: no import circles, imports at the top, files a reader can hold.

Each strategy is a file that imports what it builds on, so the package's import graph is a DAG and a
reader can open any file next to its lab. A function-level import is how a cycle hides; there are none.
The package is a few modules at the top (the trainer's own) and one subpackage per family of strategies
(``data``, ``tensor``, ``pipeline``, ``context``, ``expert``, ``asynchronous``); every check walks them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

PARALLEL = Path(__file__).resolve().parents[1] / "minidist" / "parallel"
FILES = sorted(PARALLEL.rglob("*.py"))
MAX_LINES = 300
LONG: set[str] = set()  # files allowed to be longer (none now)
SUBPACKAGES = {"data", "tensor", "pipeline", "context", "expert", "asynchronous"}


def module(path: Path) -> str:
    """A file's name inside md.parallel: ``train``, ``data.zero``, ``pipeline`` (a subpackage's ``__init__``)."""
    parts = path.relative_to(PARALLEL).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module(p) for p in FILES}


def _imports(tree: ast.Module) -> set[str]:
    """The md.parallel modules a file imports at its top level (``from package import module`` names the module)."""
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minidist.parallel."):
            target = node.module[len("minidist.parallel."):]
            for a in node.names:
                found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target)
    return found


def test_the_subpackages_are_walked():
    assert {p.relative_to(PARALLEL).parts[0] for p in FILES if len(p.relative_to(PARALLEL).parts) > 1} == SUBPACKAGES
    assert {"data.zero", "tensor.tensor_parallel", "pipeline.executor", "context.ulysses", "expert.expert_parallel",
            "asynchronous.hogwild"} <= MODULES
    assert all((PARALLEL / s / "__init__.py").exists() for s in SUBPACKAGES)


def test_no_function_level_imports_of_the_package():
    inner = []
    for path in FILES:
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(fn):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and (
                            getattr(sub, "module", "") or "").startswith("minidist"):
                        inner.append(f"{path.relative_to(PARALLEL)}:{sub.lineno}")
    assert not inner, f"imports inside functions (move them to the top): {inner}"


def test_the_import_graph_has_no_cycle():
    graph = {module(p): _imports(ast.parse(p.read_text())) - {module(p)}
             for p in FILES if p != PARALLEL / "__init__.py"}
    state: dict[str, int] = {}

    def visit(node, path):
        if state.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [node])}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            visit(dep, path + [node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])


def test_files_stay_short():
    long = {str(p.relative_to(PARALLEL)): len(p.read_text().splitlines()) for p in FILES}
    over = {name: n for name, n in long.items() if n > MAX_LINES and name not in LONG}
    assert not over, f"split these files (over {MAX_LINES} lines): {over}"
