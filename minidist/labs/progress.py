"""Which exercises of a lab are done: ``make check LAB=08``.

The learner's notebook (``labs/08_*.ipynb``) runs top to bottom in a fresh kernel, as ``make test`` runs
the solutions. The exercises are the cells that hold ``# your code here`` in the notebook generated from
``solutions/``; each is found again in the learner's notebook by the lines around the stub (which the
learner does not edit), then reported with the first line its cell, or a cell after it before the next
exercise, displayed:

    done       the exercise's cells ran and its check passed
    not done   the stub is still there (or raised)
    failed     the check, or the learner's code, raised: the check's message, one line
    blocked    an earlier exercise is unfinished and this part needs it

    python -m minidist.labs.progress 08            # or a path to a notebook
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from minidist.labs.build import exercise_notebook
from minidist.labs.notebook import STUB

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Exercise:
    """One exercise cell of the generated lab: its label and the lines that identify it."""

    number: int
    label: str
    template: list[str]


@dataclass
class Result:
    exercise: Exercise
    status: str  # "done", "not done", "failed", "blocked" or "missing"
    message: str = ""
    cell: int | None = None  # the learner's cell, as Jupyter numbers it in a top-to-bottom run


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _label(source: str, number: int) -> str:
    names = re.findall(r"^def\s+(\w+)\s*\(", source, re.M)
    # a cell may also define helpers the learner does not write: name only the functions holding a stub
    with_stub = [name for name, body in _top_level_defs(source) if STUB in body]
    if with_stub or names:
        return ", ".join(with_stub or names)
    assigned = re.findall(r"^([A-Za-z_]\w*)\s*=", source, re.M)
    if assigned:
        return ", ".join(dict.fromkeys(assigned))
    checks = re.findall(r"check_(\w+)\s*\(", source)
    return ", ".join(dict.fromkeys(checks)) if checks else f"exercise {number}"


def _top_level_defs(source: str) -> list[tuple[str, str]]:
    """``(name, text)`` of each top-level function: from its ``def`` to the next line that starts at column 0 (a
    wrapped signature's closing bracket aside)."""
    lines = source.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = re.match(r"def\s+(\w+)\s*\(", line)
        if not m:
            continue
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t)"):
            end += 1
        found.append((m.group(1), "\n".join(lines[i:end])))
    return found


def exercises(pristine: dict) -> list[Exercise]:
    """The exercises of a generated (unanswered) lab notebook, in order."""
    found = []
    for cell in pristine["cells"]:
        src = _source(cell)
        if cell.get("cell_type") == "code" and STUB in src:
            template = [line.strip() for line in src.splitlines() if line.strip() and STUB not in line]
            found.append(Exercise(len(found) + 1, _label(src, len(found) + 1), template))
    return found


def match(exs: list[Exercise], cells: list[dict]) -> list[int | None]:
    """For each exercise, the index of the learner's cell that holds it (None if it is gone)."""
    where, start = [], 0
    for ex in exs:
        best, best_score = None, 0.0
        for i in range(start, len(cells)):
            if cells[i].get("cell_type") != "code":
                continue
            lines = {line.strip() for line in _source(cells[i]).splitlines()}
            score = sum(t in lines for t in ex.template) / max(len(ex.template), 1)
            if STUB in _source(cells[i]) and not ex.template:
                score = 1.0
            if score > best_score:
                best, best_score = i, score
            if score == 1.0:
                break
        if best is not None and best_score >= 0.5:
            where.append(best)
            start = best + 1
        else:
            where.append(None)
    return where


def _count(cells: list, index: int) -> int:
    """The execution count a top-to-bottom run gives the cell at ``index`` (what Jupyter shows as [n])."""
    return sum(c.get("cell_type") == "code" for c in cells[:index + 1])


def _shown_error(cell) -> tuple[str, str] | None:
    """(exception name, first displayed line) of a cell's error output, or None if it ran."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            shown = [ANSI.sub("", line) for line in "\n".join(out.get("traceback", [])).splitlines()]
            first = next((line for line in shown if line.strip()), f"{out.get('ename')}: {out.get('evalue')}")
            if first.startswith("---") or first.startswith("Traceback"):  # IPython's usual traceback
                first = f"{out.get('ename')}: {ANSI.sub('', out.get('evalue', '')).strip()}".splitlines()[0]
            hints = [line.strip() for line in shown if line.strip().startswith("hint:")]
            return out.get("ename", "?"), first.strip() + (f" ({hints[0]})" if hints else "")
    return None


def grade(executed: dict, pristine: dict) -> list[Result]:
    """Each exercise's status in an executed learner notebook (``pristine``: the unanswered lab)."""
    exs = exercises(pristine)
    cells = executed["cells"]
    where = match(exs, cells)
    results = []
    for k, (ex, i) in enumerate(zip(exs, where)):
        if i is None:
            results.append(Result(ex, "missing", "its cell is gone from your notebook; reset the lab to get it back"))
            continue
        end = next((j for j in where[k + 1:] if j is not None), len(cells))
        if STUB in _source(cells[i]):
            results.append(Result(ex, "not done", f"replace `raise NotImplementedError  {STUB}` with your code",
                                  _count(cells, i)))
            continue
        status, message = "done", ""
        for j in range(i, end):
            err = _shown_error(cells[j]) if cells[j].get("cell_type") == "code" else None
            if err is None:
                continue
            ename, first = err
            if first.startswith("Finish "):
                if j != i:
                    continue  # a later cell waits for an earlier exercise, reported there
                status, message = "blocked", first.split(":")[0]
            elif ename == "NotImplementedError" and "is not done yet" in first:
                status, message = "not done", first.split(": ", 1)[-1]
            else:
                status, message = "failed", first if j == i else f"cell [{_count(cells, j)}]: {first}"
            break
        results.append(Result(ex, status, message, _count(cells, i)))
    return results


def report(name: str, results: list[Result]) -> str:
    done = sum(r.status == "done" for r in results)
    lines = [f"{name}: {done} of {len(results)} exercises done"]
    for r in results:
        where = f" (cell [{r.cell}])" if r.cell is not None else ""
        text = f"  [{r.status}]".ljust(13) + f"{r.exercise.number}. {r.exercise.label}{where}"
        lines.append(text + (f": {r.message}" if r.message else ""))
    return "\n".join(lines)


def find_lab(spec: str, root: Path) -> Path:
    """``08`` or ``8`` or a path -> the learner's notebook in ``root/labs``."""
    path = Path(spec)
    if path.suffix == ".ipynb":
        return path
    if not spec.isdigit():
        raise SystemExit(f"LAB must be a lab number like 08 or a notebook path, got {spec!r}")
    hits = sorted((root / "labs").glob(f"{int(spec):02d}_*.ipynb"))
    if not hits:
        raise SystemExit(f"no lab {int(spec):02d} in {root / 'labs'}")
    return hits[0]


def pristine_for(path: Path, root: Path) -> dict:
    """The unanswered version of a lab, generated from its solution notebook."""
    solution = root / "solutions" / path.name
    number = re.match(r"(\d+)_", path.name)
    if not solution.exists() and number:  # a learner's copy (08_mine.ipynb): the lab of the same number
        hits = sorted((root / "solutions").glob(f"{int(number.group(1)):02d}_*.ipynb"))
        solution = hits[0] if hits else solution
    if not solution.exists():
        raise SystemExit(f"no solution notebook {solution} to find the exercises of {path.name} (name a copy of a "
                         f"lab by its number first: 08_mine.ipynb)")
    return exercise_notebook(json.loads(solution.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lab", help="a lab number (08) or a notebook path")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the course folder (holds labs/, solutions/)")
    args = ap.parse_args(argv)
    from minidist.labs.execute import run_notebook

    path = find_lab(args.lab, args.root)
    pristine = pristine_for(path, args.root)
    print(f"running {path} ...", flush=True)
    executed = run_notebook(path)
    results = grade(executed, pristine)
    print(report(path.stem, results))
    return 0 if all(r.status == "done" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
