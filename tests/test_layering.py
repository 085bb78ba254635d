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
