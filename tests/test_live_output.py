"""What a launch shows while it runs: rank output as it happens, progress, and outputs that do not
depend on how fast the machine ran them (so nbval can compare them)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import minidist as md
from minidist.runtime import live
from minidist.runtime.live import LiveView

TICKING = """
import time
import minidist as md

def body():
    for i in range(8):
        print("tick", i)
        md.dist.progress(i + 1, 8, "tick")
        time.sleep(0.25)

md.launch(body, 2)
print("launch returned", flush=True)
"""


def test_a_long_launch_streams_rank_output_as_it_happens(tmp_path):
    script = tmp_path / "ticking.py"
    script.write_text(TICKING)
    proc = subprocess.Popen([sys.executable, "-u", str(script)], stdout=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append((time.monotonic(), line.rstrip("\n")))
    proc.wait(timeout=30)
    texts = [t for _, t in seen]
    assert texts[-1] == "launch returned"
    assert sorted(texts[:-1]) == sorted(f"[rank {r}] tick {i}" for r in range(2) for i in range(8))
    end = seen[-1][0]
    early = [t for when, t in seen if end - when > 0.6]
    assert "[rank 0] tick 5" in early, seen  # printed ~0.5 s before the end, shown well before it
    for r in range(2):  # each rank's lines keep their order
        assert [t for t in texts if t.startswith(f"[rank {r}]")] == [f"[rank {r}] tick {i}" for i in range(8)]


def test_a_short_launch_prints_grouped_by_rank_at_the_end(capsys):
    def chatty():
        print("hello from", md.dist.get_rank())

    md.launch(chatty, 3)
    assert capsys.readouterr().out == "".join(f"[rank {r}] hello from {r}\n" for r in range(3))


class _Handle:
    def __init__(self):
        self.shown = []

    def update(self, data, raw=False):
        self.shown.append(data["text/plain"])


def test_notebook_area_shows_progress_and_lines_then_is_emptied(monkeypatch, capsys):
    monkeypatch.setattr(live, "REDRAW", 0.0)
    view = LiveView(2, quiet=False)
    view.notebook, view.handle, view.tty = True, _Handle(), False
    view.output(1, "loading\nready\n")
    view.report(0, 1, 4, "step")
    view.report(1, 2, 4, "step")
    last = view.handle.shown[-1]
    assert "step 1/4 [######..................]" in last  # the slowest rank's progress
    assert "[rank 1] loading\n[rank 1] ready" in last
    view.close({0: "", 1: "loading\nready\n"})
    assert view.handle.shown[-1] == ""  # the saved notebook holds an empty area, whatever was drawn
    assert capsys.readouterr().out == "[rank 1] loading\n[rank 1] ready\n"


def test_terminal_progress_is_one_line_redrawn_then_erased(monkeypatch, capsys):
    monkeypatch.setattr(live, "REDRAW", 0.0)
    view = LiveView(2, quiet=False)
    view.tty = True
    view.report(0, 3, 10, "step")
    view.report(1, 5, 10, "step")
    view.close({0: "", 1: ""})
    err = capsys.readouterr().err
    assert err.startswith("\rstep 3/10 [#######.................]")
    assert err.endswith("\r\x1b[K") and "\n" not in err


def test_quiet_shows_nothing(capsys):
    def chatty():
        print("hello")
        md.dist.progress(1, 1)

    res = md.launch(chatty, 2, quiet=True)
    assert capsys.readouterr() == ("", "") and res.stdout == ["hello\n", "hello\n"]


def test_progress_outside_a_rank_is_a_clear_error():
    with pytest.raises(RuntimeError, match="md.dist.progress needs a simulated rank"):
        md.dist.progress(1, 2)


def test_inside_an_output_widget_the_live_area_is_a_widget(monkeypatch, capsys):
    """A widget callback prints into an Output widget, where display-handle updates never arrive (ipywidgets#1844
    on GitHub): the live area is then an HTML widget whose value changes, closed when the launch ends."""
    ipywidgets = pytest.importorskip("ipywidgets")
    out = ipywidgets.Output()
    assert not live.in_output_widget()
    out.msg_id = "a callback's request"  # what `with out:` sets inside a kernel
    try:
        assert live.in_output_widget()
    finally:
        out.msg_id = ""
    monkeypatch.setattr(live, "REDRAW", 0.0)
    view = LiveView(2, quiet=False)
    view.notebook, view.area, view.tty = True, ipywidgets.HTML(), False
    view.report(0, 3, 4, "step")
    view.output(0, "x < y\n")
    assert "step 3/4" in view.area.value and "[rank 0] x &lt; y" in view.area.value
    area = view.area
    view.close({0: "x < y\n", 1: ""})
    assert area.comm is None  # closed: nothing of it stays in the saved notebook
    assert capsys.readouterr().out == "[rank 0] x < y\n"
    out.close()


def _file_like_use():
    import io
    import logging

    out = sys.stdout
    facts = (isinstance(out, io.TextIOBase), out.writable(), out.readable(), out.encoding, out.isatty(), out.closed)
    try:
        out.fileno()
        fileno = "a descriptor"
    except io.UnsupportedOperation:
        fileno = "unsupported"
    log = logging.getLogger(f"rank{md.dist.get_rank()}")
    log.addHandler(logging.StreamHandler(sys.stdout))
    log.warning("logged")
    out.writelines(["one\n", "two\n"])
    sys.stdout.close()  # some tools close their stdout when done; the stream is stderr too
    print("to stderr after the close", file=sys.stderr)
    print("printed after the close")
    return facts, fileno


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_a_ranks_output_answers_as_a_text_file_does(backend):
    res = md.launch(_file_like_use, 2, backend=backend, quiet=True)
    assert list(res) == [((True, True, False, "utf-8", False, False), "unsupported")] * 2
    for text in res.stdout:
        assert text == "logged\none\ntwo\nto stderr after the close\nprinted after the close\n"
