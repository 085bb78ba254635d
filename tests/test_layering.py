"""The package's layers import downward only, in the order README.md's layout table gives (bottom first).

Every ``import minidist.X`` and ``from minidist.X import ...`` in the package counts, those inside functions
too: a lazy import is still a dependency. The order is read from the README, so the table and the code
cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers() -> dict[str, int]:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("The package, bottom layer first"):].split("\n\n")[1]
    level = {}
    for i, row in enumerate(r for r in table.splitlines() if r.startswith("| `")):
        for name in re.findall(r"`([a-z_]+)(?:/|\.py)`", row.split("|")[1]):
            level[name] = i
    return level


def upward_imports(level: dict[str, int]) -> list[str]:
    found = []
    for path in sorted((ROOT / "minidist").rglob("*.py")):
        top = path.relative_to(ROOT / "minidist").with_suffix("").parts[0]
        if top not in level:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for m in mods:
                parts = m.split(".")
                if parts[0] == "minidist" and len(parts) > 1 and level.get(parts[1], -1) > level[top]:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {m}")
    return found


def test_the_readme_table_names_every_layer():
    level = layers()
    assert {"autograd", "nn", "hardware", "estimate", "runtime", "collectives", "dist", "parallel", "viz", "labs"} \
        <= set(level)
    assert level["hardware"] < level["runtime"] < level["parallel"] < level["viz"]


def test_no_layer_imports_from_a_layer_above_it():
    assert upward_imports(layers()) == []


def test_an_upward_import_would_be_found():
    level = layers()
    level["collectives"], level["estimate"] = level["estimate"], level["collectives"]  # the old order
    assert any("collectives/native.py" in f for f in upward_imports(level))


# ---------------------------------------------------------------------------- import cycles

# Circles allowed in the package, each named by its modules (a strongly connected part of the import graph), with why
# it remains: none today. Any other circle fails the test, and so does one of these once it is gone: delete its entry
# then.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module):
    """Every import statement of a module, those inside functions too (a lazy import is still a dependency, and
    hiding one in a function does not break a circle), except those under ``if TYPE_CHECKING:``, which never run."""
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING" for b in node.body for n in ast.walk(b)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def import_graph() -> dict[str, set[str]]:
    """module -> the minidist modules it imports when it is imported. ``from package import name`` points at
    the submodule ``package.name`` when there is one, else at the package (its ``__init__``)."""
    files = {module_name(p): p for p in sorted((ROOT / "minidist").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
                continue
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}"
                edges.add(sub if sub in files else target)
        graph[mod] = {e for e in edges if e in files and e != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every group of modules that import one another round a circle (Tarjan's strongly connected components of
    more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    m = stack.pop()
                    part.append(m)
                    if m == node:
                        break
                if len(part) > 1:
                    found.append(tuple(sorted(part)))
    return sorted(found)


def circle(graph: dict[str, set[str]], part: tuple[str, ...]) -> list[str]:
    """A shortest chain of imports inside ``part`` from its first module back to it."""
    start, came = part[0], {part[0]: None}
    for node in (queue := [start]):
        for nxt in sorted(graph[node] & set(part)):
            if nxt == start:
                chain = [node]
                while came[chain[-1]] is not None:
                    chain.append(came[chain[-1]])
                return [*reversed(chain), start]
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    return [*part, start]


def test_no_import_cycles_but_the_known_ones():
    graph = import_graph()
    found = set(cycles(graph))
    new = [" -> ".join(circle(graph, c)) + f"\n      (all of: {', '.join(c)})"
           for c in sorted(found - set(KNOWN_CYCLES))]
    gone = [", ".join(c) for c in sorted(set(KNOWN_CYCLES) - found)]
    assert not new, "import cycles (move what both sides need into a module of its own):\n  " + "\n  ".join(new)
    assert not gone, "these known cycles are gone (or changed): remove them from KNOWN_CYCLES\n  " + "\n  ".join(gone)


def test_a_cycle_through_a_lazy_import_is_found():
    tree = ast.parse("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from minidist.nn import Module\n"
                     "def f():\n    from minidist.autograd.engine import run_backward\n")
    assert [getattr(n, "module", None) for n in _imports(tree)] == ["__future__", "typing", "minidist.autograd.engine"]
    graph = import_graph()
    assert "minidist.autograd.tensor" in graph["minidist.autograd.engine"]
    graph["minidist.autograd.tensor"].add("minidist.autograd.engine")  # tensor.py's old lazy import of the engine
    assert ("minidist.autograd.engine", "minidist.autograd.tensor") in cycles(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert circle({"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"b"}}, ("a", "b", "c", "d")) == ["a", "b", "c", "a"]


# ---------------------------------------------------------------------------- file length

MAX_LINES = 400

# Files over MAX_LINES today, and why each still is: none. A file that drops under the limit fails the test until
# its entry is deleted, so the list only shrinks.
LONG_FILES: dict[str, str] = {}


def long_files() -> dict[str, int]:
    return {str(p.relative_to(ROOT / "minidist")): n for p in sorted((ROOT / "minidist").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_no_file_over_the_line_limit_but_the_known_ones():
    found = long_files()
    new = [f"minidist/{f}: {n} lines" for f, n in found.items() if f not in LONG_FILES]
    shrunk = [f"minidist/{f}" for f in LONG_FILES if f not in found]
    assert not new, f"files over {MAX_LINES} lines (split by idea, one per file):\n  " + "\n  ".join(new)
    assert not shrunk, f"now at most {MAX_LINES} lines (or gone): remove them from LONG_FILES\n  " + "\n  ".join(shrunk)


# ---------------------------------------------------------------------------- inside md.parallel

# md.parallel's own layers, bottom first: the trainer's base modules, then one subpackage per family of strategies,
# then the modules that compose them into a run. A module imports only from its own layer or one below. The
# strategies' order is what the code needs: 1-bit Adam reuses Local SGD's flat buffers (asynchronous < data), a
# tensor-parallel linear defers its weight gradient with the pipeline's split backward (pipeline < tensor), and
# expert data parallelism is data parallelism over two groups (data < expert).
PARALLEL_LAYERS: list[tuple[str, ...]] = [
    ("config", "mesh", "memory", "runner", "recompute", "offload", "mixed_precision", "engine"),
    ("asynchronous",),
    ("data",),
    ("pipeline",),
    ("tensor",),
    ("context",),
    ("expert",),
    ("parallelize", "refusals", "options", "result", "train", "restart", "checkpointing", "rank_state",
     "checkpoint_sweep", "at_scale", "measured"),
]


def parallel_level(name: str) -> int:
    """The layer of ``minidist.parallel.<name>...`` (a top-level module or a subpackage); KeyError if unplaced."""
    top = name.split(".")[0]
    return next(i for i, layer in enumerate(PARALLEL_LAYERS) if top in layer)


def parallel_upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside md.parallel that go up a layer; ``minidist.parallel`` itself (the facade) is above them all."""
    found = []
    prefix = "minidist.parallel."

    def level(mod: str) -> int:
        return len(PARALLEL_LAYERS) if mod == "minidist.parallel" else parallel_level(mod[len(prefix):])

    for mod, deps in sorted(graph.items()):
        if not mod.startswith(prefix):
            continue
        for dep in sorted(deps):
            if (dep == "minidist.parallel" or dep.startswith(prefix)) and level(dep) > level(mod):
                found.append(f"{mod} imports {dep}")
    return found


def test_every_parallel_module_has_a_layer():
    names = {p.relative_to(ROOT / "minidist" / "parallel").parts[0].removesuffix(".py")
             for p in (ROOT / "minidist" / "parallel").rglob("*.py")} - {"__init__"}
    placed = [n for layer in PARALLEL_LAYERS for n in layer]
    assert len(placed) == len(set(placed)), "a name is in two layers"
    assert sorted(names - set(placed)) == [], "place these in PARALLEL_LAYERS"
    assert sorted(set(placed) - names) == [], "these are gone: remove them from PARALLEL_LAYERS"


def test_parallel_subpackages_import_only_downward():
    assert parallel_upward_imports(import_graph()) == []


def test_an_upward_import_inside_parallel_would_be_found():
    graph = import_graph()
    graph["minidist.parallel.data.fsdp"].add("minidist.parallel.expert.expert_parallel")  # fsdp's old import
    assert parallel_upward_imports(graph) == ["minidist.parallel.data.fsdp imports "
                                              "minidist.parallel.expert.expert_parallel"]
