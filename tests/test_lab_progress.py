"""`make check LAB=NN`: the learner's notebook runs, and each exercise is reported done / not done / failed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
LAB = "01_extended_roofline.ipynb"  # a quick lab with seven exercises


def course(tmp_path: Path, lab_source: Path, edit=None) -> Path:
    """A course folder whose labs/ holds ``lab_source`` (optionally edited), as a learner's clone would."""
    (tmp_path / "labs").mkdir()
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    nb = json.loads(lab_source.read_text())
    if edit:
        edit(nb)
    (tmp_path / "labs" / LAB).write_text(json.dumps(nb))
    return tmp_path


def unanswered(tmp_path: Path) -> Path:
    """The exercise version of the lab, built from its solution (labs/ may hold this learner's answers)."""
    from minidist.labs.build import exercise_notebook

    path = tmp_path / f"unanswered_{LAB}"
    path.write_text(json.dumps(exercise_notebook(json.loads((ROOT / "solutions" / LAB).read_text()))))
    return path


def progress(root: Path) -> tuple[int, list[str]]:
    out = subprocess.run([sys.executable, "-m", "minidist.labs.progress", "01", "--root", str(root)],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("  [")]
    return out.returncode, lines


@pytest.mark.slow  # each runs a whole lab (6 s); the copied solution below stays in make test
def test_an_unanswered_lab_lists_every_exercise_as_not_done(tmp_path):
    code, lines = progress(course(tmp_path, unanswered(tmp_path)))
    assert code == 1
    assert len(lines) == 7, lines
    for line in lines:
        assert line.startswith("  [not done]") and "replace `raise NotImplementedError" in line, line
    assert "matmul_intensity (cell [3])" in lines[0]


def test_the_solution_copied_over_is_all_done(tmp_path):
    code, lines = progress(course(tmp_path, ROOT / "solutions" / LAB))
    assert code == 0
    assert len(lines) == 7 and all(line.startswith("  [done]") for line in lines), lines


@pytest.mark.slow
def test_a_wrong_answer_fails_with_the_checks_message_and_the_rest_is_judged_alone(tmp_path):
    def halve(nb):  # the classic mistake: one FLOP per multiply-add
        cell = nb["cells"][5]
        src = "".join(cell["source"])
        assert "2 * m * n * k" in src
        cell["source"] = src.replace("2 * m * n * k", "m * n * k")

    code, lines = progress(course(tmp_path, ROOT / "solutions" / LAB, halve))
    assert code == 1
    assert lines[0].startswith("  [failed]") and "is wrong" in lines[0] and "factor of 2" in lines[0], lines[0]
    assert all(line.startswith("  [done]") for line in lines[1:]), lines


def test_an_exercise_is_labelled_by_the_functions_the_learner_writes_not_the_helpers_beside_them():
    from minidist.labs.progress import _label

    cell = ("def bus_bandwidth(algbw: float, collective: str,\n"
            "                  p: int) -> float:\n"
            "    raise NotImplementedError  # your code here\n\n\n"
            "def sweep():\n"
            "    for n in (1, 2):\n"
            "        pass\n\n\n"
            "res = md.launch(sweep, 4)\n")
    assert _label(cell, 2) == "bus_bandwidth"
    assert _label("def helper():\n    return 1\n\n\nx = helper()  # your code here\n", 3) == "helper"


def test_a_learners_copy_of_a_lab_is_judged_against_the_lab_of_its_number(tmp_path):
    from minidist.labs.progress import pristine_for

    root = course(tmp_path, ROOT / "solutions" / LAB)
    copy = root / "labs" / "01_my_attempt.ipynb"
    assert pristine_for(copy, root) == pristine_for(root / "labs" / LAB, root)
    with pytest.raises(SystemExit, match="name a copy of a lab by its number first"):
        pristine_for(root / "labs" / "attempt.ipynb", root)
