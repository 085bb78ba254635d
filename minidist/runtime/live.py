"""What a launch shows while it runs: each rank's printed lines and its progress, as they happen.

A rank's ``print`` is kept (``LaunchResult.stdout``) and its complete lines are also sent to the
launcher at most every few hundredths of a second, with ``md.dist.progress`` reports. The launcher
shows them in one of two ways:

* In a terminal, lines appear as they arrive, each prefixed with its rank, once the launch has run
  for ``STREAM_AFTER`` seconds (a short launch prints its output grouped by rank at the end, as
  before); progress is one line on stderr, redrawn in place, when stderr is a terminal.
* In a notebook, one display area holds each rank's latest lines and the progress, redrawn in
  place, and is emptied when the launch ends; the output is then printed grouped by rank. A saved
  notebook therefore never depends on how fast the machine ran it (nbval compares the outputs:
  an emptied area and the grouped text are the same on every machine).
"""

from __future__ import annotations

import html
import io
import sys
import time

STREAM_AFTER = 1.0  # seconds before a terminal launch starts streaming rank output
REDRAW = 0.25  # seconds between redraws of a notebook area or a progress line
TAIL = 3  # lines of each rank shown in a notebook area


def _prefixed(rank: int, text: str) -> str:
    return "\n".join(f"[rank {rank}] {line}" for line in text.rstrip("\n").split("\n"))


def in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    ip = shell.get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def in_output_widget() -> bool:
    """True inside ``with ipywidgets.Output():``, where a widget callback's output must go in JupyterLab. A display
    handle's updates do not reach an Output widget there (ipywidgets#1844 on GitHub); a widget's value does."""
    widgets = sys.modules.get("ipywidgets")
    registry = sys.modules.get("ipywidgets.widgets.widget")
    if widgets is None or registry is None:
        return False
    instances = getattr(registry, "_instances", {})
    return any(isinstance(w, widgets.Output) and getattr(w, "msg_id", "") for w in list(instances.values()))


class RankStream:
    """A rank's sys.stdout/sys.stderr: keeps everything, and sends complete lines to the launcher.

    It answers as a text file does (``writable``, ``encoding``, ``fileno`` refusing as ``io.StringIO``'s does),
    since libraries ask before they print (logging, progress bars). It is stdout and stderr at once and the
    launcher still reads it, so ``close()`` only sends what is pending: a rank that closes its stdout keeps
    its stderr, and its traceback.
    """

    encoding, errors, newlines, closed = "utf-8", "strict", None, False

    def __init__(self, send) -> None:
        self.parts: list[str] = []
        self.pending: list[str] = []
        self.send = send
        self.last = 0.0

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.pending.append(text)
        if "\n" in text:
            now = time.monotonic()
            if now - self.last > 0.05:
                self.flush_lines(now)
        return len(text)

    def flush_lines(self, now: float | None = None) -> None:
        joined = "".join(self.pending)
        cut = joined.rfind("\n") + 1
        if cut:
            self.pending = [joined[cut:]] if cut < len(joined) else []
            self.last = time.monotonic() if now is None else now
            self.send(joined[:cut])

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.flush_lines()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a rank's output is captured: it has no file descriptor")

    def getvalue(self) -> str:
        return "".join(self.parts)


io.TextIOBase.register(RankStream)  # isinstance(sys.stdout, io.TextIOBase) holds, without IOBase's closing __del__


class LiveView:
    """The launcher's side: collects streamed lines and progress and shows them (see the module doc)."""

    def __init__(self, world: int, quiet: bool) -> None:
        self.world, self.quiet = world, quiet
        self.t0 = time.monotonic()
        self.lines: dict[int, list[str]] = {r: [] for r in range(world)}
        self.shown: dict[int, int] = {r: 0 for r in range(world)}  # characters of each rank already printed
        self.received: dict[int, int] = {r: 0 for r in range(world)}
        self.buffer: dict[int, str] = {r: "" for r in range(world)}
        self.progress: dict[int, tuple[int, int, str]] = {}
        self.streaming = False
        self.last_draw = 0.0
        self.drawn = False
        self.notebook = not quiet and in_notebook()
        self.handle = self.area = None
        self.tty = not quiet and not self.notebook and getattr(sys.stderr, "isatty", lambda: False)()
        if self.notebook:
            from IPython.display import display

            if in_output_widget():  # a widget callback: the live area is a widget of its own
                import ipywidgets

                self.area = ipywidgets.HTML()
                display(self.area)
            else:
                self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    # -- what arrives -----------------------------------------------------------------------
    def output(self, rank: int, text: str) -> None:
        self.buffer[rank] += text
        self.received[rank] += len(text)
        self.lines[rank] = (self.lines[rank] + text.rstrip("\n").split("\n"))[-TAIL:]
        self.tick()

    def report(self, rank: int, done: int, total: int, what: str) -> None:
        self.progress[rank] = (done, total, what)
        self.tick()

    # -- showing ----------------------------------------------------------------------------
    def tick(self) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.notebook and not self.streaming and now - self.t0 >= STREAM_AFTER:
            self.streaming = True
        if self.streaming:
            self._stream()
        if now - self.last_draw >= REDRAW:
            self.last_draw = now
            self._draw()

    def _stream(self) -> None:
        self._clear_progress()
        for r in range(self.world):
            text = self.buffer[r]
            if text:
                print(_prefixed(r, text), flush=True)
                self.shown[r] += len(text)
                self.buffer[r] = ""

    def _progress_text(self) -> str:
        if not self.progress:
            return ""
        done, total, what = min(self.progress.values())
        secs = time.monotonic() - self.t0
        width = 24
        filled = int(width * done / total) if total else width
        return f"{what} {done}/{total} [{'#' * filled}{'.' * (width - filled)}] {secs:.1f} s"

    def _area_text(self) -> str:
        rows = [self._progress_text()] if self.progress else []
        for r in range(self.world):
            rows += [f"[rank {r}] {line}" for line in self.lines[r] if line]
        return "\n".join(rows)

    def _draw(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": self._area_text()}, raw=True)
            self.drawn = True
        elif self.area is not None:
            self.area.value = "<pre>" + html.escape(self._area_text()) + "</pre>"
            self.drawn = True
        elif self.tty and self.progress:
            sys.stderr.write("\r" + self._progress_text() + "\x1b[K")
            sys.stderr.flush()
            self.drawn = True

    def _clear_progress(self) -> None:
        if self.tty and self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False

    def close(self, stdout: dict[int, str]) -> None:
        """The launch ended: empty the live area and print what was not shown yet, grouped by rank."""
        if self.handle is not None and self.drawn:
            self.handle.update({"text/plain": ""}, raw=True)
        if self.area is not None:
            self.area.close()
        self._clear_progress()
        if self.quiet:
            return
        for r in sorted(stdout):
            text = stdout[r][self.shown[r]:] if self.streaming else stdout[r]
            if text:
                print(_prefixed(r, text), flush=True)
