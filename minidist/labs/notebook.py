"""How errors read in a lab notebook: the message that helps, never the check's own source.

IPython prints a traceback with the source around every frame. For a failing lab check those lines are
the check itself (its hints for other mistakes, the reference computation: the answer), and for a cell
that fails only because an exercise above it is unfinished they are a riddle (``KeyError: 7``). So, in
an IPython shell (a Jupyter kernel or the terminal):

- a :class:`CheckFailed` shows its message, then only the learner's own frames if their code raised
  inside the check (``CheckFailed._render_traceback_``, IPython's protocol for this, in ``check.py`` with the
  rest of what a failure says);
- an exercise stub (``raise NotImplementedError  # your code here``) shows one line naming the exercise;
- a function the failing cell defines that raised when a check called it shows the error and the cell's
  frames: the learner's own mistake, even while an exercise above is unfinished;
- otherwise, while an exercise is unfinished, a later cell that fails shows one line naming the exercise to
  finish first, with the original error in brackets. Every other error shows IPython's usual traceback.

An exercise counts as finished again once the cell that failed, or a cell defining its function, runs
without error.
"""

from __future__ import annotations

import linecache
import re
import sys
import traceback
from pathlib import Path

from minidist.labs.check import _RED, _RESET, CheckFailed
from minidist.labs.check import learner_frames as learner_frames  # re-exported: importable from here too
from minidist.labs.check import learner_lines as learner_lines
from minidist.labs.check import render_check_failure as render_check_failure

STUB = "# your code here"
_CHECKS = str(Path(__file__).resolve().parent)  # minidist/labs: the checks that call a learner's function

# exercise name -> (key, source) of the cell where it last failed; the most recent failure last
_unfinished: dict[str, tuple[str, str]] = {}
_cell = {"key": "", "source": "", "count": None}


def stub_exercise(etype: type, tb) -> str | None:
    """The exercise whose stub raised, if this NotImplementedError came from ``# your code here``."""
    if not issubclass(etype, NotImplementedError) or tb is None:
        return None
    last = traceback.extract_tb(tb)[-1]
    line = last.line or linecache.getline(last.filename, last.lineno)
    if STUB not in line:
        return None
    return f"`{last.name}`" if last.name != "<module>" else _this_cell()


def _stub_on_a_rank(value: BaseException) -> str | None:
    """The exercise whose stub raised inside a simulated rank (a RankError carries each rank's traceback)."""
    for err in (getattr(value, "errors", None) or {}).values():
        if len(err) > 2 and err[0] == "NotImplementedError" and STUB in str(err[2]):
            names = re.findall(r'^  File "[^"]*", line \d+, in (\S+)\n(?=.*' + re.escape(STUB) + ")", str(err[2]),
                               re.M)
            if names and names[-1] != "<module>":
                return f"`{names[-1]}`"
    return None


def _this_cell() -> str:
    return f"the exercise in cell [{_cell['count']}]" if _cell["count"] is not None else "the exercise in this cell"


def _finished(source: str, key: str) -> None:
    for name, (where, _) in list(_unfinished.items()):
        defined = name.startswith("`") and re.search(rf"^\s*def\s+{re.escape(name.strip('`'))}\s*\(", source, re.M)
        if where == key or defined:
            del _unfinished[name]


def _record(exercise: str) -> None:
    _unfinished.pop(exercise, None)  # re-inserted last: the most recent failure
    _unfinished[exercise] = (_cell["key"], _cell["source"])


def blocking_exercise(error: BaseException) -> str | None:
    """The unfinished exercise a failing cell most likely waits for, or None if none is unfinished.

    A missing name points at the exercise whose cell would have assigned it; anything else (a missing
    key, a wrong shape) at the exercise that failed last, since cells use what was computed just above.
    """
    pending = [(name, src) for name, (where, src) in _unfinished.items() if where != _cell["key"]]
    if not pending:
        return None
    if isinstance(error, NameError) and getattr(error, "name", None):
        target = re.compile(rf"^[^#\n=]*\b{re.escape(error.name)}\b[^=\n]*=(?!=)|^\s*def\s+{re.escape(error.name)}\b",
                            re.M)
        for name, src in pending:
            if target.search(src):
                return name
    return pending[-1][0]


def _cell_frames(tb) -> list[str]:
    """The formatted frames of ``tb`` in notebook cells: neither minidist's, nor IPython's, nor any library's."""
    return traceback.format_list([f for f in traceback.extract_tb(tb) if _in_a_cell(f.filename)])


def _in_a_cell(filename: str) -> bool:
    # ipykernel compiles a cell to a file named by its hash in its temp folder; the terminal to <ipython-input-..>
    return filename.startswith("<ipython-input-") or re.search(r"ipykernel_\d+", filename) is not None


def _own_function(tb) -> str | None:
    """The function defined in the running cell that a minidist check called and that raised, if any: the error
    is then that function's, whatever exercise above is unfinished."""
    defined = set(re.findall(r"^def\s+(\w+)\s*\(", _cell["source"], re.M))
    frames = traceback.extract_tb(tb) if defined and tb is not None else []
    for caller, f in zip(frames, frames[1:]):
        if f.name in defined and _in_a_cell(f.filename) and caller.filename.startswith(_CHECKS):
            return f.name
    return None


def _pre_run_cell(info) -> None:
    _cell["source"] = getattr(info, "raw_cell", "") or ""
    _cell["key"] = getattr(info, "cell_id", None) or _cell["source"].strip().split("\n", 1)[0]


def _post_run_cell(result) -> None:
    if result.success:
        _finished(_cell["source"], _cell["key"])


def _handler(shell, etype, value, tb, tb_offset=None):
    count = getattr(shell, "execution_count", None)
    _cell["count"] = count - 1 if isinstance(count, int) else None  # IPython counts a cell before running it
    exercise = stub_exercise(etype, tb) or _stub_on_a_rank(value)
    if exercise is not None:
        _record(exercise)
        stb = [f"{_RED}NotImplementedError{_RESET}: {exercise} is not done yet: "
               f"replace `raise NotImplementedError  {STUB}` with your code"]
    elif isinstance(value, CheckFailed):
        defined = re.findall(r"^def\s+(\w+)\s*\(", _cell["source"], re.M)
        text = str(value)  # a check names the function it found wrong first: blame that one of the cell's
        named = ([d for d in defined if re.match(rf"{d}\b", text)]
                 or [d for d in defined if re.search(rf"\b{d}\b", text)])
        _record(f"`{(named or defined)[0]}`" if defined else _this_cell())
        stb = value._render_traceback_()
    elif (own := _own_function(tb)) is not None:  # a check ran the learner's function and it crashed: theirs to fix
        _record(f"`{own}`")
        stb = [f"{_RED}{etype.__name__}{_RESET}: {value}", "", f"where your `{own}` raised it:"]
        stb += [line.rstrip("\n") for frame in _cell_frames(tb) for line in frame.splitlines()]
    else:
        culprit = blocking_exercise(value)
        if culprit is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return None
        first = (str(value).splitlines() or [""])[0]  # a rank's report runs on for pages: its first line says it
        stb = [f"{_RED}Finish {culprit} first{_RESET}: this cell depends on it "
               f"({etype.__name__}: {first})"]
    shell._showtraceback(etype, value, stb)
    return None


def install(shell=None) -> bool:
    """Use these renderings in ``shell`` (default: the running IPython, if any); True if installed."""
    if shell is None:
        ipython = sys.modules.get("IPython")  # not imported: not running in an IPython shell
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_minidist_labs_errors", False):
        return shell is not None
    shell.set_custom_exc((Exception,), _handler)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_run_cell", _post_run_cell)
    shell._minidist_labs_errors = True
    return True
