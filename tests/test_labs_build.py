"""The lab builder: solutions/ is the single source, labs/ is generated and checked for staleness."""

import json
from pathlib import Path

import pytest

from minidist.labs.build import build, exercise_notebook, strip_solutions

ROOT = Path(__file__).resolve().parents[1]


def _nb(*cells):
    return {"cells": [dict(c) for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_strip_keeps_indent_and_surroundings():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n\nprint(f(1))\n"
    out = strip_solutions(src)
    assert out == "def f(x):\n    raise NotImplementedError  # your code here\n\nprint(f(1))\n"


def test_strip_several_blocks_and_markdown():
    src = "### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n### BEGIN SOLUTION\nc = 3\n### END SOLUTION"
    assert strip_solutions(src).count("NotImplementedError") == 2
    assert "b = 2" in strip_solutions(src)
    md = "Answer:\n### BEGIN SOLUTION\nthe ring is bandwidth optimal\n### END SOLUTION\n"
    assert strip_solutions(md, markdown=True) == "Answer:\n...\n"


def test_unbalanced_markers_are_rejected():
    with pytest.raises(ValueError, match="unbalanced"):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n")


def test_outputs_cleared_and_input_untouched():
    cell = {"cell_type": "code", "source": ["### BEGIN SOLUTION\n", "x = 1\n", "### END SOLUTION\n"],
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "1"}], "execution_count": 3,
            "metadata": {}}
    nb = _nb(cell)
    ex = exercise_notebook(nb)
    assert ex["cells"][0]["outputs"] == [] and ex["cells"][0]["execution_count"] is None
    assert "NotImplementedError" in "".join(ex["cells"][0]["source"])
    assert nb["cells"][0]["execution_count"] == 3  # the solution notebook is not modified


def test_check_detects_stale_and_orphan_labs(tmp_path):
    (tmp_path / "solutions").mkdir()
    cell = {"cell_type": "code", "source": "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "outputs": [],
            "execution_count": None, "metadata": {}}
    (tmp_path / "solutions" / "00_a.ipynb").write_text(json.dumps(_nb(cell)))
    assert build(tmp_path, check=True) == ["00_a.ipynb"]
    assert build(tmp_path) == ["00_a.ipynb"]
    assert build(tmp_path, check=True) == []
    (tmp_path / "labs" / "99_orphan.ipynb").write_text("{}")
    assert build(tmp_path, check=True) == ["99_orphan.ipynb (no solution notebook)"]


def test_repository_labs_are_up_to_date():
    assert build(ROOT, check=True) == [], "labs/ is stale: run `make labs`"


def test_check_accepts_a_learners_answers_but_not_a_stale_commit(tmp_path):
    """Learners answer in labs/: their edits must not fail `make test`; a solution changed without
    `make labs` must, whether or not the stale lab is committed."""
    git = pytest.importorskip("shutil").which("git")
    if git is None:
        pytest.skip("git is not installed")
    import subprocess

    def run(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "solutions").mkdir()
    cell = {"cell_type": "code", "source": "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "outputs": [],
            "execution_count": None, "metadata": {}}
    (tmp_path / "solutions" / "00_a.ipynb").write_text(json.dumps(_nb(cell)))
    build(tmp_path)
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lab")
    lab = tmp_path / "labs" / "00_a.ipynb"
    lab.write_text(lab.read_text().replace("raise NotImplementedError  # your code here", "x = 1"))
    assert build(tmp_path, check=True) == []  # the learner's answer, uncommitted
    cell["source"] = "### BEGIN SOLUTION\nx = 2\n### END SOLUTION\ny = 3\n"
    (tmp_path / "solutions" / "00_a.ipynb").write_text(json.dumps(_nb(cell)))
    assert build(tmp_path, check=True) == ["00_a.ipynb"]  # the solution moved on, labs/ did not
