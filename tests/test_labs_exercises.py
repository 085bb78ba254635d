"""The exercise notebooks fail only at their exercises, with a clear message.

Each exercise notebook runs in a fresh kernel from the top until its first error. It is built afresh from
``solutions/`` (what ``make labs`` writes to ``labs/``), never read from ``labs/``: that folder holds the
learner's working copies, and a learner who has answered a lab must not fail ``make test``. That error must come
from a cell holding an exercise stub (``# your code here``) and be the stub's NotImplementedError, or a
check's CheckFailed saying the exercise is not done yet. Anything else (a crash in the lab's own code
before the first exercise, a stub that raises something cryptic, a check that blames the learner for
the wrong thing) fails this test. Execution stops at the first exercise, so this stays fast.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from minidist.labs.build import exercise_notebook  # noqa: E402
from minidist.labs.execute import start_kernel, stop_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "solutions").glob("*.ipynb"))
STUB = "# your code here"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_error(path: Path) -> tuple[int, dict] | None:
    """Run the notebook until a cell raises; return (cell index, error output) or None if none did."""
    return first_error_of(nbformat.read(path, as_version=4))


def exercise_version(solution: Path):
    """The exercise notebook ``make labs`` writes for ``solution``, as nbformat reads it."""
    return nbformat.reads(json.dumps(exercise_notebook(json.loads(solution.read_text()))), as_version=4)


def first_error_of(nb) -> tuple[int, dict] | None:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False,
                                     resources={"metadata": {"path": str(ROOT / "labs")}})
    try:
        start_kernel(client, env)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, i)
            except nbclient.exceptions.CellExecutionError:
                errs = [o for o in cell.outputs if o.get("output_type") == "error"]
                return i, errs[0] if errs else {"ename": "?", "evalue": "no error output"}
        return None
    finally:
        stop_kernel(client)


def _lab_param(p: Path):
    # Each lab starts a kernel (2-5 s): make test runs every third lab, make test-slow (and CI) the rest. Lab 04
    # trains before its first exercise (about 20 s), so it is always one of the rest.
    fast = int(p.stem[:2]) % 3 == 0 and not p.stem.startswith("04_")
    return pytest.param(p, id=p.stem, marks=[] if fast else [pytest.mark.slow])


@pytest.mark.parametrize("path", [_lab_param(p) for p in LABS])
def test_exercise_version_fails_only_at_an_exercise(path: Path):
    assert "### BEGIN SOLUTION" in path.read_text(), f"{path.name}: the solution notebook has no exercise"
    nb = exercise_version(path)
    hit = first_error_of(nb)
    assert hit is not None, f"{path.name}: ran to the end although it has exercises (is a stub missing?)"
    index, err = hit
    cell = "".join(nb.cells[index].source)
    ename, evalue = err["ename"], ANSI.sub("", err["evalue"])
    where = f"{path.name}, cell {index} ({ename}: {evalue[:300]})\n--- cell ---\n{cell[:600]}"
    assert STUB in cell, f"the first error is not in an exercise cell: {where}"
    assert ename in ("NotImplementedError", "CheckFailed"), f"an exercise cell failed with the wrong error: {where}"
    if ename == "CheckFailed":
        assert "not done yet" in evalue, f"the check does not say the exercise is unfinished: {where}"


def test_first_error_reports_a_crash_before_the_exercise(tmp_path):
    """The harness itself: it finds the first failing cell and runs with one BLAS thread."""
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("import os\nassert os.environ['OPENBLAS_NUM_THREADS'] == '1'"),
        v4.new_code_cell("1 / 0"),
        v4.new_code_cell("raise NotImplementedError  # your code here"),
    ])
    path = tmp_path / "99_broken.ipynb"
    nbformat.write(nb, path)
    index, err = first_error(path)
    assert (index, err["ename"]) == (1, "ZeroDivisionError")
