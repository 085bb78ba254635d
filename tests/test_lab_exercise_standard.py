"""Every lab asks the learner to derive its result, not to copy it.

The standard (DESIGN.md, "Labs: what a learner does"): a lab has at least three exercises, at least two of them
derivations whose solution holds four or more lines of logic, and no exercise's answer is on the page. The last
part is checked mechanically where it can be: an arithmetic expression that a solution returns must not appear,
whitespace aside, anywhere else in the notebook (markdown, code, hints printed in outputs), since a learner who
finds it there transcribes instead of deriving.

Labs that do not meet the standard yet are listed in ``NOT_YET`` as strict expected failures: each fails the
test run as soon as it meets the standard, so the list can only shrink.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb"))
BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION[^\n]*$", re.S | re.M)
MIN_EXERCISES, MIN_DERIVATIONS, DERIVATION_LINES = 3, 2, 4

# Labs whose exercises are still short of the standard.
NOT_YET: set[str] = set()


@dataclass
class Exercise:
    cell: int
    body: str

    @property
    def logic_lines(self) -> list[str]:
        """Lines that do something: not blank, not a comment, not a lone docstring line or bracket."""
        lines = []
        for line in self.body.splitlines():
            s = line.strip()
            if s and not s.startswith("#") and s not in (")", "]", "}", "pass"):
                lines.append(s)
        return lines

    def returned_expressions(self) -> list[str]:
        """The returned arithmetic expressions (holding an operator), whitespace removed; a call of the course's
        API such as ``osm.finalize(state)[0]`` is a tool the page introduces, not an answer."""
        out = []
        for line in self.logic_lines:
            if line.startswith("return "):
                expr = line[len("return "):].split("#")[0]
                if re.search(r"[-+*/%@]", expr):
                    out.append(squash(expr))
        return out


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def exercises(nb: dict) -> list[Exercise]:
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            found += [Exercise(i, m.group(1)) for m in BLOCK.finditer(cell_text(cell))]
    return found


def page_without_solutions(nb: dict) -> str:
    """Everything a learner sees: every cell's source with its solution blocks removed, and every saved output."""
    parts = []
    for cell in nb["cells"]:
        parts.append(BLOCK.sub("", cell_text(cell)))
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return squash("\n".join(parts))


def shortfalls(nb: dict) -> list[str]:
    """What keeps a notebook from the standard, one line each (empty if it meets it)."""
    found = exercises(nb)
    long = [e for e in found if len(e.logic_lines) >= DERIVATION_LINES]
    problems = []
    if len(found) < MIN_EXERCISES:
        problems.append(f"{len(found)} exercises, want at least {MIN_EXERCISES}")
    if len(long) < MIN_DERIVATIONS:
        sizes = [len(e.logic_lines) for e in found]
        problems.append(f"{len(long)} exercises of {DERIVATION_LINES}+ lines of logic (sizes {sizes}), "
                        f"want at least {MIN_DERIVATIONS}")
    page = page_without_solutions(nb)
    for e in found:
        for expr in e.returned_expressions():
            if expr in page:
                problems.append(f"cell [{e.cell}] returns `{expr}`, which is written elsewhere in the notebook")
    return problems


def _param(path: Path):
    marks = [pytest.mark.xfail(strict=True, reason="short of the standard: see NOT_YET")] \
        if path.stem[:2] in NOT_YET else []
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_the_learner_derives_the_result(path: Path):
    problems = shortfalls(json.loads(path.read_text()))
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _nb(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": kind, "source": src, "outputs": []} for kind, src in cells]}


SOLVED = "def f(a, b):\n    ### BEGIN SOLUTION\n    {}\n    ### END SOLUTION\n"
LONG = "x = a + 1\n    y = b * 2\n    z = x - y\n    w = z * z\n    return w / 2"


def test_the_measure_counts_exercises_and_their_lines():
    short = _nb(("code", SOLVED.format("return a * b")), ("code", SOLVED.format(LONG)))
    assert any("2 exercises" in p for p in shortfalls(short))
    assert any("1 exercises of 4+" in p for p in shortfalls(short))
    good = _nb(*[("code", SOLVED.format(LONG))] * 2, ("code", SOLVED.format("# why\n    return a * b")))
    assert shortfalls(good) == []


def test_an_answer_written_on_the_page_is_found():
    """The formula in a markdown cell (spaced differently) or in a printed output gives the answer away."""
    base = [("code", SOLVED.format(LONG))] * 2 + [("code", SOLVED.format("return np.sqrt(2 * c * m)"))]
    assert shortfalls(_nb(*base)) == []
    told = _nb(*base, ("markdown", "the best interval is `np.sqrt(2*c*m)`"))
    assert any("np.sqrt(2*c*m)" in p for p in shortfalls(told))
    printed = _nb(*base)
    printed["cells"][0]["outputs"] = [{"output_type": "stream", "text": ["hint: np.sqrt(2 * c * m)\n"]}]
    assert any("written elsewhere" in p for p in shortfalls(printed))
    # a returned name is no formula: `return out` may appear anywhere
    plain = _nb(*base, ("code", SOLVED.format("out = a\n    return out")), ("markdown", "return out"))
    assert shortfalls(plain) == []
