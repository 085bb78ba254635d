"""Write the exercise notebooks in ``labs/`` from the completed ones in ``solutions/``.

``solutions/`` is the single source. In a code cell, everything between a line
``### BEGIN SOLUTION`` and a line ``### END SOLUTION`` becomes
``raise NotImplementedError  # your code here`` (indented like the block); in a markdown cell the
block becomes ``...``. Outputs and execution counts are cleared. ``--check`` writes nothing and
fails if a file in ``labs/`` differs from what would be written, both in the working tree and in the
last commit: learners answer in ``labs/``, so their edits must not fail ``make test``, while a
solution changed without ``make labs`` still does.

    python -m minidist.labs.build [--check] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
_BLOCK = re.compile(r"^([ \t]*)" + re.escape(BEGIN) + r"[^\n]*\n.*?^[ \t]*" + re.escape(END) + r"[^\n]*(\n|$)",
                    re.S | re.M)


def strip_solutions(source: str, markdown: bool = False) -> str:
    """Replace every solution block in one cell's source; raise ValueError on an unclosed block."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"unbalanced {BEGIN!r}/{END!r} markers in cell:\n{source[:200]}")

    def repl(m: re.Match) -> str:
        indent, tail = m.group(1), m.group(2)
        return indent + ("..." if markdown else "raise NotImplementedError  # your code here") + tail

    return _BLOCK.sub(repl, source)


def exercise_notebook(nb: dict) -> dict:
    """The exercise version of a solution notebook (a new dict; the input is not changed)."""
    out = json.loads(json.dumps(nb))
    out.get("metadata", {}).pop("widgets", None)  # saved widget state belongs to a run, not to the exercise
    for cell in out.get("cells", []):
        src = cell.get("source", "")
        text = "".join(src) if isinstance(src, list) else src
        text = strip_solutions(text, markdown=cell.get("cell_type") == "markdown")
        cell["source"] = text.splitlines(keepends=True)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return out


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def committed(root: Path, relpath: str) -> str | None:
    """The text of ``relpath`` (relative to ``root``) in the last git commit, or None (no git, untracked)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "show", f"HEAD:./{relpath}"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", errors="replace") if out.returncode == 0 else None


def build(root: Path, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) every lab; return the names of stale or written files.

    With ``check``, a lab is up to date if its working-tree copy or its committed copy is what the
    solution generates (the working copy may hold a learner's answers).
    """
    src_dir, dst_dir = root / "solutions", root / "labs"
    dst_dir.mkdir(exist_ok=True)
    changed = []
    wanted = set()
    for src in sorted(src_dir.glob("*.ipynb")):
        dst = dst_dir / src.name
        wanted.add(dst.name)
        text = render(exercise_notebook(json.loads(src.read_text())))
        if not dst.exists() or dst.read_text() != text:
            if check and committed(root, f"labs/{dst.name}") == text:
                continue
            changed.append(dst.name)
            if not check:
                dst.write_text(text)
    for extra in sorted(dst_dir.glob("*.ipynb")):
        if extra.name not in wanted:
            changed.append(extra.name + " (no solution notebook)")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if labs/ is out of date")
    ap.add_argument("--root", type=Path, default=Path.cwd())
    args = ap.parse_args(argv)
    changed = build(args.root, check=args.check)
    if args.check:
        if changed:
            print("labs/ is out of date with solutions/ (run `make labs`):", *changed, sep="\n  ")
            return 1
        print("labs/ is up to date")
        return 0
    print(f"wrote {len(changed)} lab(s)", *changed, sep="\n  " if changed else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
