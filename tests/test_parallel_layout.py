"""md.parallel reads top to bottom: no import circles, imports at the top, files a reader can hold.

Each strategy is a file that imports what it builds on, so the package's import graph is a DAG and a
reader can open any file next to its lab. A function-level import is how a cycle hides; there are none.
"""

from __future__ import annotations

import ast
from pathlib import Path

PARALLEL = Path(__file__).resolve().parents[1] / "minidist" / "parallel"
FILES = sorted(PARALLEL.glob("*.py"))
MAX_LINES = 300
LONG: set[str] = set()  # files allowed to be longer (none now)


def _imports(tree: ast.Module) -> set[str]:
    """The md.parallel modules a file imports at its top level."""
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minidist.parallel."):
            found.add(node.module.split(".")[2])
    return found


def test_no_function_level_imports_of_the_package():
    inner = []
    for path in FILES:
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(fn):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and (
                            getattr(sub, "module", "") or "").startswith("minidist"):
                        inner.append(f"{path.name}:{sub.lineno}")
    assert not inner, f"imports inside functions (move them to the top): {inner}"


def test_the_import_graph_has_no_cycle():
    graph = {p.stem: _imports(ast.parse(p.read_text())) - {p.stem} for p in FILES if p.stem != "__init__"}
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
    long = {p.name: len(p.read_text().splitlines()) for p in FILES}
    over = {name: n for name, n in long.items() if n > MAX_LINES and name not in LONG}
    assert not over, f"split these files (over {MAX_LINES} lines): {over}"
