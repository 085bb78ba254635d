"""Trace: every charge on every rank as one event, exportable to Chrome/Perfetto and drawable.

An event is ``(rank, stream, name, start, end, nbytes, flops)`` with times in simulated seconds.
Streams are ``compute``, ``comm`` (whole operations as the program sees them) and ``link`` (each
message on its directed link). Recording is a tuple append, cheap enough to stay always on.
Open the JSON in https://ui.perfetto.dev or chrome://tracing (chapter 32, profiling).
"""

from __future__ import annotations

import gc
import json
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

STREAMS = ("compute", "comm", "link")


class Event(NamedTuple):
    rank: int
    stream: str
    name: str
    start: float
    end: float
    nbytes: float
    flops: float

    @property
    def duration(self) -> float:
        return self.end - self.start


class Recorder:
    """Collects one rank's events as plain tuples (turned into Events once, at the end)."""

    __slots__ = ("rank", "events", "enabled")

    def __init__(self, rank: int, enabled: bool = True) -> None:
        self.rank = rank
        self.events: list[tuple] = []
        self.enabled = enabled

    def record(self, stream: str, name: str, start: float, end: float, nbytes: float, flops: float) -> None:
        if self.enabled:
            self.events.append((stream, name, start, end, nbytes, flops))


_ORDER = operator.itemgetter(3, 0, 1)  # start, rank, stream: a C key, no Python call per event
_RAW_ORDER = operator.itemgetter(2, 0)  # the same order within one rank's recorded tuples


class Trace:
    """All ranks' events, sorted by start time.

    A launch hands over each rank's recorded tuples; the sorted list of Events is made the first time
    someone asks for it (a long run records hundreds of thousands, and most callers only want a few
    sums, which ``busy_within`` and ``bytes_within`` take from the tuples directly).
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._raw: dict[int, list[tuple]] | None = None
        self._per_rank: dict[int, list[tuple]] | None = None
        self._events: list[Event] | None = sorted(events, key=_ORDER)

    @classmethod
    def from_recorders(cls, per_rank: dict[int, list[tuple]]) -> Trace:
        tr = cls()
        tr._raw, tr._events = per_rank, None
        return tr

    @property
    def events(self) -> list[Event]:
        if self._events is None:
            new = tuple.__new__  # an Event without namedtuple's Python-level __new__
            collecting = gc.isenabled()
            gc.disable()  # hundreds of thousands of new tuples would start a collection every few hundred
            try:
                evs = [new(Event, (r, *e)) for r, es in self._raw.items() for e in es]
                evs.sort(key=_ORDER)  # stable: events that tie keep the order they were recorded in
            finally:
                if collecting:
                    gc.enable()
            self._events, self._raw = evs, None
        return self._events

    def _by_rank(self) -> dict[int, list[tuple]]:
        """rank -> its events as (stream, name, start, end, nbytes, flops), in the order ``events`` has them
        (sums over them then add up exactly as sums over ``events`` do)."""
        if self._per_rank is None:
            if self._raw is not None:
                self._per_rank = {r: sorted(es, key=_RAW_ORDER) for r, es in self._raw.items()}
            else:
                per: dict[int, list[tuple]] = {}
                for e in self._events:
                    per.setdefault(e.rank, []).append(e[1:])
                self._per_rank = per
        return self._per_rank

    def rank_events(self, rank: int) -> list[Event]:
        """``rank``'s events in the order ``events`` has them, without walking the other ranks' (a budget of one
        rank of a 16,384-GPU step should not pass over the 15 simulated others)."""
        new = tuple.__new__
        return [new(Event, (rank, *e)) for e in self._by_rank().get(rank, ())]

    def __len__(self) -> int:
        if self._raw is not None:
            return sum(len(es) for es in self._raw.values())
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __repr__(self) -> str:
        ranks = sorted({e.rank for e in self.events})
        return f"Trace({len(self.events)} events, ranks={ranks}, end={self.end():.6g} s)"

    def filter(self, rank: int | None = None, stream: str | None = None, name: str | None = None) -> Trace:
        """Events matching every given field (``name`` matches as a prefix)."""
        return Trace(
            e
            for e in self.events
            if (rank is None or e.rank == rank)
            and (stream is None or e.stream == stream)
            and (name is None or e.name.startswith(name))
        )

    def end(self) -> float:
        return max((e.end for e in self.events), default=0.0)

    def busy(self, rank: int, stream: str) -> float:
        """Seconds during which ``stream`` of ``rank`` is busy (overlapping events counted once)."""
        spans = sorted((e.start, e.end) for e in self.events if e.rank == rank and e.stream == stream)
        total, cur_s, cur_e = 0.0, None, None
        for s, t in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, t
            else:
                cur_e = max(cur_e, t)
        if cur_e is not None:
            total += cur_e - cur_s
        return total

    def busy_within(self, windows: Sequence[tuple[float, float]], stream: str = "compute") -> list[float]:
        """Seconds of ``stream`` events of each rank r inside ``windows[r]`` (each event clipped to it), in one
        pass over the trace: a step's busy time per rank, however many ranks the run had."""
        out = [0.0] * len(windows)
        for rank, evs in self._by_rank().items():
            lo, hi = windows[rank]
            for st, _, start, end, _, _ in evs:
                if st == stream and end > lo and start < hi:
                    out[rank] += (end if end < hi else hi) - (start if start > lo else lo)
        return out

    def bytes_within(self, rank: int, windows: Sequence[tuple[float, float]], stream: str = "link") -> list[float]:
        """Bytes of ``rank``'s ``stream`` events that start inside each of ``windows`` (say, what it sent in each
        training step)."""
        out = [0] * len(windows)  # as sum() gives: 0 where nothing was sent
        for st, _, start, _, nbytes, _ in self._by_rank().get(rank, ()):
            if st == stream:
                for i, (lo, hi) in enumerate(windows):
                    if lo <= start < hi:
                        out[i] += nbytes
        return out

    # -- export ----------------------------------------------------------------------------
    def to_chrome(self, path: str | None = None) -> dict:
        """Chrome trace-event JSON (times in microseconds); one process per rank, one thread per stream."""
        tid = {s: i for i, s in enumerate(STREAMS)}
        out = []
        for r in sorted({e.rank for e in self.events}):
            out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
            for s, i in tid.items():
                out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": i, "args": {"name": s}})
        for e in self.events:
            out.append({
                "ph": "X", "name": e.name, "cat": e.stream, "pid": e.rank, "tid": tid.get(e.stream, len(tid)),
                "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6,
                "args": {"bytes": e.nbytes, "flops": e.flops},
            })
        doc = {"traceEvents": out, "displayTimeUnit": "ns"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc

    def plot(self, ax=None, streams: tuple[str, ...] = ("compute", "comm"), title: str | None = None,
             color_by: str = "stream", unit: str = "ms"):
        """Gantt chart: one row per (rank, stream). Returns the axes.

        ``color_by="stream"`` colours compute and communication apart; ``color_by="name"`` gives each op name
        (all_reduce, matmul, ...) its own colour with a legend, which shows the phases of an algorithm.
        ``unit`` is "s", "ms" or "us".
        """
        import matplotlib.pyplot as plt

        if color_by not in ("stream", "name"):
            raise ValueError(f"Trace.plot: color_by must be 'stream' or 'name', got {color_by!r}")
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6}.get(unit)
        if scale is None:
            raise ValueError(f"Trace.plot: unit must be 's', 'ms' or 'us', got {unit!r}")
        rows = self._rows(streams)
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.5 + 0.35 * max(1, len(rows))), dpi=80, layout="constrained")
        stream_colors = {"compute": "tab:blue", "comm": "tab:orange", "link": "tab:green"}
        names = sorted({e.name for e in self.events if e.stream in streams})
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        name_colors = {n: cycle[i % len(cycle)] for i, n in enumerate(names)}
        for y, (rank, stream) in enumerate(rows):
            evs = [e for e in self.events if e.rank == rank and e.stream == stream]
            spans = [(e.start * scale, (e.end - e.start) * scale) for e in evs]
            if color_by == "stream":
                faces = stream_colors.get(stream, "tab:gray")
            else:
                faces = [name_colors[e.name] for e in evs]
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=faces, edgecolor="k", lw=0.3)
        if color_by == "name" and len(names) <= 12:
            from matplotlib.patches import Patch

            ax.legend(handles=[Patch(color=name_colors[n], label=n) for n in names], fontsize=8,
                      loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_yticks(range(len(rows)), [f"rank {r} {s}" for r, s in rows])
        ax.invert_yaxis()
        ax.set_xlabel(f"simulated time ({unit})")
        if title:
            ax.set_title(title)
        return ax

    def _rows(self, streams) -> list[tuple[int, str]]:
        present = {(e.rank, e.stream) for e in self.events if e.stream in streams}
        ranks = sorted({r for r, _ in present})
        return [(r, s) for r in ranks for s in streams if (r, s) in present]
