"""Errors in a lab notebook read as a message, never as the check's source (run in a real Jupyter kernel).

IPython prints source lines around every frame of a traceback; for a failing ``md.labs.check_*`` those
lines would show the reference computation and the hints for other mistakes. These tests run small
notebooks in a kernel, as JupyterLab does, and read the error each cell displays.
"""

from __future__ import annotations

import re

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from minidist.labs.execute import run_notebook  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def displayed(nb) -> list[str | None]:
    """What each code cell shows as its error (the traceback lines joined), or None if it ran."""
    shown = []
    for cell in nb.cells:
        errs = [o for o in cell.outputs if o.get("output_type") == "error"]
        shown.append(ANSI.sub("", "\n".join(errs[0]["traceback"])) if errs else None)
    return shown


def run_cells(tmp_path_factory, cells: list[str]):
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell(c) for c in cells])
    path = tmp_path_factory.mktemp("nb") / "errors.ipynb"
    nbformat.write(nb, path)
    ran = run_notebook(path, timeout=120)
    return ran, displayed(ran)


@pytest.fixture(scope="module")
def check_run(tmp_path_factory):
    return run_cells(tmp_path_factory, [
        "import minidist as md",
        # 1: a wrong answer: the check fails with its message
        "def intensity(m, n, k, b):\n    return m * n * k / (b * (m * k + k * n + m * n))\n\n"
        "md.labs.check_matmul_intensity(intensity)",
        # 2: the learner's own code crashes inside the check
        "def crashing(m, n, k, b):\n    return undefined_name * 2\n\nmd.labs.check_matmul_intensity(crashing)",
        # 3: a cell failing after the failed checks names one of them
        "print(undefined_result)",
    ])


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    return run_cells(tmp_path_factory, [
        "import minidist as md",
        "pass",
        "pass",
        # 3: an exercise stub, defined and called in one cell
        "def fit(x):\n    raise NotImplementedError  # your code here\n\n\nPSI = fit(3)",
        # 4: a later cell needing the unfinished exercise
        "print(PSI + 1)",
        # 5: an unrelated cell still runs
        "print('independent cell')",
        # 6: the exercise, now done
        "def fit(x):\n    return 2 * x\n\n\nPSI = fit(3)",
        # 7: the dependent cell works now, and an ordinary error shows IPython's usual traceback
        "print(PSI + 1)\n{}['missing']",
    ])


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory):
    return run_cells(tmp_path_factory, [
        "import minidist as md",
        # 1: an exercise left unfinished above
        "def fit(x):\n    raise NotImplementedError  # your code here\n\n\nPSI = fit(3)",
        # 2: a check that lets this error through (its last call, outside check_cases) calls a function of this
        # cell, which crashes there
        "calls = []\n\n\ndef attainable(peak, bw, i, net_bw=None, i_net=None):\n"
        "    calls.append(i)\n"
        "    ceilings = [peak, bw * i] + ([net_bw * i_net] if net_bw else [])\n"
        "    return min(ceilings) if len(calls) <= 5 else ceilings[2]\n\n\n"
        "md.labs.check_attainable(attainable)",
        # 3: a check that names the call its learner's function crashed in
        "def round_to(x, m, e):\n    return max(e, x)\n\nmd.labs.check_round_to(round_to)",
    ])


@pytest.fixture(scope="module")
def rank_run(tmp_path_factory):
    return run_cells(tmp_path_factory, [
        "import numpy as np\nimport minidist as md",
        # 1: a stub called on simulated ranks
        "def shift_right(x):\n    raise NotImplementedError  # your code here\n\n\n"
        "def body():\n    return shift_right(np.ones(2))\n\n\nres = md.launch(body, 2, quiet=True)",
        # 2: a launch that fails for another reason while shift_right is unfinished: one line, not the report
        "def other():\n    return res\n\n\nmd.launch(other, 2, quiet=True)",
        # 3: a cell of two functions, the second one wrong: the check names it, and so does the next cell
        "def ring_time(n, p, a, b):\n    return md.estimate.collective_time('all_reduce', n, p, a, b, 'ring')\n\n\n"
        "def tree_time(n, p, a, b):\n    return 0.0\n\n\nmd.labs.check_collective_times(ring_time, tree_time)",
        "print(TIMES)",
    ])


def test_a_stub_on_a_simulated_rank_is_named_in_one_line(rank_run):
    _, shown = rank_run
    assert shown[1] == ("NotImplementedError: `shift_right` is not done yet: replace "
                        "`raise NotImplementedError  # your code here` with your code")


def test_a_rank_failure_blamed_on_an_unfinished_exercise_shows_its_first_line_only(rank_run):
    _, shown = rank_run
    assert shown[2].startswith("Finish `shift_right` first: this cell depends on it (RankError: rank ")
    assert "\n" not in shown[2] and "traceback of rank" not in shown[2]


def test_the_function_a_check_found_wrong_is_the_one_blamed_later(rank_run):
    _, shown = rank_run
    assert shown[3].startswith("CheckFailed: tree_time(")
    assert shown[4].startswith("Finish `tree_time` first")


def test_a_crash_in_a_function_a_check_called_is_the_learners_not_an_earlier_exercises(crash_run):
    _, shown = crash_run
    assert shown[2].startswith("IndexError: list index out of range")
    assert "where your `attainable` raised it" in shown[2] and "ceilings[2]" in shown[2]
    assert "Finish" not in shown[2] and "roofline_checks" not in shown[2]
    assert shown[3].startswith("CheckFailed: round_to(x of shape (")
    assert "(fp16) raised ValueError: The truth value of an array" in shown[3]
    assert "return max(e, x)" in shown[3] and "Finish" not in shown[3]


def test_a_failing_check_shows_its_message_and_not_its_source(check_run):
    _, shown = check_run
    text = shown[1]
    assert text.startswith("CheckFailed: matmul_intensity(1024, 1024, 1024, 2) is wrong")
    assert "off by a factor of 2" in text  # the hint for this mistake
    for source_line in ("def ref(m, n, k, b)", "2 * m * n * k", "check_cases(", "def diagnose",
                        "intensity is FLOP per *byte*", "roofline_checks.py"):
        assert source_line not in text, f"the check's source leaked into the notebook: {source_line!r}\n{text}"
    assert len(text.splitlines()) <= 4


def test_a_crash_in_the_learners_code_shows_their_frame_only(check_run):
    _, shown = check_run
    text = shown[2]
    assert "NameError: name 'undefined_name' is not defined" in text
    assert "return undefined_name * 2" in text  # the learner's line, so they can find it
    assert "minidist/labs" not in text and "check_cases" not in text


def test_a_failed_check_is_an_unfinished_exercise(check_run):
    _, shown = check_run
    # nothing names the missing value's source, so the latest unfinished exercise is blamed
    assert shown[3] == ("Finish `crashing` first: this cell depends on it "
                        "(NameError: name 'undefined_result' is not defined)")


def test_a_stub_says_which_exercise_in_one_line(lab_run):
    ran, shown = lab_run
    assert shown[3] == ("NotImplementedError: `fit` is not done yet: replace "
                        "`raise NotImplementedError  # your code here` with your code")
    assert ran.cells[3].outputs[-1]["ename"] == "NotImplementedError"


def test_a_cell_after_an_unfinished_exercise_names_it(lab_run):
    ran, shown = lab_run
    assert shown[4] == "Finish `fit` first: this cell depends on it (NameError: name 'PSI' is not defined)"
    assert shown[5] is None and "independent cell" in ran.cells[5].outputs[0]["text"]


def test_once_done_the_dependent_cell_runs_and_other_errors_are_untouched(lab_run):
    ran, shown = lab_run
    assert shown[6] is None
    assert ran.cells[7].outputs[0]["text"] == "7\n"
    assert "KeyError" in shown[7] and "Finish" not in shown[7]
    assert "Traceback" in shown[7] or "----> 2" in shown[7]  # IPython's usual rendering, with the source


def test_the_blamed_exercise_is_the_one_that_would_define_the_missing_name(monkeypatch):
    from minidist.labs import notebook

    monkeypatch.setattr(notebook, "_unfinished", {
        "`approx_params`": ("c3", "def approx_params(d):\n    raise NotImplementedError\n\nPSI = approx_params(4)"),
        "`bucketed_time`": ("c9", "def bucketed_time(n):\n    raise NotImplementedError"),
    })
    monkeypatch.setattr(notebook, "_cell", {"key": "c11", "source": "", "count": 11})
    assert notebook.blocking_exercise(NameError("name 'PSI' is not defined", name="PSI")) == "`approx_params`"
    assert notebook.blocking_exercise(NameError("name 'bucketed_time'", name="bucketed_time")) == "`bucketed_time`"
    assert notebook.blocking_exercise(KeyError(7)) == "`bucketed_time`"  # the latest failure
    monkeypatch.setattr(notebook, "_unfinished", {})
    assert notebook.blocking_exercise(KeyError(7)) is None


def test_a_stuck_cell_is_interrupted_and_the_run_goes_on(tmp_path):
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell("import time\ntime.sleep(60)"), v4.new_code_cell("print('after')")])
    path = tmp_path / "stuck.ipynb"
    nbformat.write(nb, path)
    ran = run_notebook(path, timeout=3)
    assert displayed(ran)[0] is not None and "KeyboardInterrupt" in displayed(ran)[0]
    assert ran.cells[1].outputs[0]["text"] == "after\n"


def test_a_finished_notebook_stops_its_kernel_without_interrupting_it(monkeypatch, tmp_path_factory):
    # jupyter_client's shutdown interrupts first, and an idle kernel logs that as an ERROR on the terminal
    from jupyter_client.manager import KernelManager

    sent = []
    interrupt = KernelManager._async_interrupt_kernel

    async def spy(self):
        sent.append(self)
        await interrupt(self)

    monkeypatch.setattr(KernelManager, "_async_interrupt_kernel", spy)
    ran, errors = run_cells(tmp_path_factory, ["print('ran')"])
    assert errors == [None] and ran.cells[0].outputs[0]["text"] == "ran\n"
    assert sent == []


class _Client:
    """Stands for an nbclient client whose first kernels die at start, as when another process takes a port."""

    def __init__(self, deaths: int, error: str = "Kernel died before replying to kernel_info") -> None:
        self.deaths, self.error, self.starts, self.km = deaths, error, 0, None

    def create_kernel_manager(self):
        self.km = object()
        return self.km

    def start_new_kernel(self, env):
        self.starts += 1

    def start_new_kernel_client(self):
        if self.starts <= self.deaths:
            self.km = None  # nbclient shuts a kernel that did not answer down and forgets it
            raise RuntimeError(self.error)


def test_a_kernel_that_dies_at_start_is_started_again_with_fresh_ports():
    from minidist.labs.execute import KERNEL_STARTS, start_kernel, stop_kernel

    ok = _Client(deaths=KERNEL_STARTS - 1)
    start_kernel(ok, {})
    assert ok.starts == KERNEL_STARTS and ok.km is not None
    for client, tries in ((_Client(deaths=KERNEL_STARTS), KERNEL_STARTS), (_Client(deaths=1, error="bad spec"), 1)):
        with pytest.raises(RuntimeError):  # dying every time, or any other failure (not retried), is not hidden
            start_kernel(client, {})
        assert client.starts == tries
        stop_kernel(client)  # nothing left to stop: no error either


def test_nbvals_kernels_are_started_again_when_they_die_at_start(monkeypatch):
    import nbval.kernel

    from minidist.labs.execute import KERNEL_STARTS
    from tests import nb_kernels

    assert nbval.kernel.start_new_kernel is nb_kernels.start_new_kernel  # what RunningKernel calls

    def dying(deaths: int, error: str = "Kernel died before replying to kernel_info"):
        calls = []

        def start(*args, **kwargs):
            calls.append(kwargs)
            if len(calls) <= deaths:
                raise RuntimeError(error)
            return "km", "kc"
        return start, calls

    start, calls = dying(KERNEL_STARTS - 1)
    monkeypatch.setattr(nb_kernels, "_nbval_start", start)
    assert nb_kernels.start_new_kernel(kernel_name="python3") == ("km", "kc")
    assert len(calls) == KERNEL_STARTS and all(c == {"kernel_name": "python3"} for c in calls)
    for deaths, error, tries in ((KERNEL_STARTS, "Kernel died before replying to kernel_info", KERNEL_STARTS),
                                 (1, "no such kernel", 1)):
        start, calls = dying(deaths, error)
        monkeypatch.setattr(nb_kernels, "_nbval_start", start)
        with pytest.raises(RuntimeError, match=error):  # dying every time, or another failure, is not hidden
            nb_kernels.start_new_kernel()
        assert len(calls) == tries
