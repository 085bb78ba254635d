"""Pipeline schedules as data: per stage, the ordered list of actions it runs (chapter 16, lab 10).

Property: separability. The model is ``f_L o ... o f_1``, so stage s only needs stage s-1's output
for a micro-batch to run its forward on it, and stage s+1's input gradient to run its backward.
A schedule is nothing but the order in which each stage takes up the work those dependencies
allow, so it is data: ``Schedule.actions[rank]`` is a list of :class:`Action` s.

Actions: ``F`` forward of micro-batch ``mb`` through chunk ``chunk`` of the rank's layers; ``B``
its whole backward; or the backward split in two (zero-bubble), ``I`` (input gradient, on the
critical path) and ``W`` (weight gradient, which nothing waits for); and the point-to-point
messages ``SEND_F``/``RECV_F`` (an activation) and ``SEND_B``/``RECV_B`` (a gradient). Sends are
asynchronous (buffered) and receives block, as with ``isend`` and ``recv``.

With ``v`` virtual stages per rank (interleaved 1F1B), rank r holds chunks c = 0..v-1, and chunk c
is virtual stage ``c p + r`` of the ``p v`` stages the layers are cut into (Megatron-LM's layout).

:func:`check_schedule` walks every stage's list the way the ranks would, and rejects a schedule that
deadlocks (naming every stuck action and what it waits for) or that runs an action before what it
depends on (naming the action). :func:`simulate` runs the same walk with costs and returns a
``Trace`` whose ``pipeline`` events are the actions, so the bubble can be measured and drawn without
starting any process.

Warm-up of 1F1B: stage s runs ``min(p - s - 1, m)`` forwards before its first backward, so the first
stage runs the most. The book's code warms stage s up with s (or s+1) forwards, which deadlocks:
:func:`check_schedule` says where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from minidist.hardware.trace import Event, Trace

COMPUTE = ("F", "B", "I", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
OPS = COMPUTE + COMM
NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")
ALIASES = {"zero_bubble": "zb-h1", "zbh1": "zb-h1", "interleaved_1f1b": "interleaved"}


class ScheduleError(ValueError):
    """A schedule that cannot run: it deadlocks, breaks a dependency, or misses or repeats work."""


class Action(NamedTuple):
    """One step of one stage: ``op`` on micro-batch ``mb`` in the rank's model chunk ``chunk``."""

    op: str
    mb: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.op}{self.mb}" + (f".{self.chunk}" if self.chunk else "")

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``str``: ``"F3"`` -> Action("F", 3), ``"RECV_B2.1"`` -> Action("RECV_B", 2, 1)."""
        head, _, chunk = text.partition(".")
        op = head.rstrip("0123456789")
        if op not in OPS or op == head:
            raise ValueError(f"Action.parse: cannot read {text!r} as an action (ops {OPS})")
        return cls(op, int(head[len(op):]), int(chunk) if chunk else 0)


@dataclass
class Schedule:
    """``actions[r]``: what rank r does, in order, for ``microbatches`` micro-batches on ``stages`` ranks."""

    name: str
    stages: int
    microbatches: int
    virtual: int
    actions: list[list[Action]]

    @property
    def n_virtual(self) -> int:
        return self.stages * self.virtual

    def rank_of(self, vs: int) -> int:
        return vs % self.stages

    def virtual_stage(self, rank: int, chunk: int) -> int:
        return chunk * self.stages + rank

    def compute(self, rank: int) -> list[Action]:
        """Rank ``rank``'s compute actions only (no messages)."""
        return [a for a in self.actions[rank] if a.op in COMPUTE]

    def __str__(self) -> str:
        rows = [f"{self.name}: p={self.stages}, m={self.microbatches}, v={self.virtual}"]
        for r, acts in enumerate(self.actions):
            rows.append(f"  stage {r}: " + " ".join(str(a) for a in acts if a.op in COMPUTE))
        return "\n".join(rows)


# -- the dependencies --------------------------------------------------------------------------
def with_communication(compute: list[list[Action]], stages: int, virtual: int = 1) -> list[list[Action]]:
    """Insert the messages into per-rank compute lists: a receive right before the action that needs
    a remote input, a send right after the action whose output another rank needs."""
    p, nvs = stages, stages * virtual
    out = []
    for r, acts in enumerate(compute):
        seq = []
        for a in acts:
            vs = a.chunk * p + r
            remote_prev = vs > 0 and (vs - 1) % p != r
            remote_next = vs < nvs - 1 and (vs + 1) % p != r
            if a.op == "F":
                before, after = [Action("RECV_F", *a[1:])] * remote_prev, [Action("SEND_F", *a[1:])] * remote_next
                seq += before + [a] + after
            elif a.op in ("B", "I"):
                before, after = [Action("RECV_B", *a[1:])] * remote_next, [Action("SEND_B", *a[1:])] * remote_prev
                seq += before + [a] + after
            else:
                seq.append(a)
        out.append(seq)
    return out


def _validate(s: Schedule) -> None:
    """Every action well formed; every (micro-batch, chunk) forwarded once and backwarded once (B, or I and W)."""
    p, m, v = s.stages, s.microbatches, s.virtual
    if len(s.actions) != p:
        raise ScheduleError(f"schedule {s.name!r}: {len(s.actions)} action lists for {p} stages")
    for r, acts in enumerate(s.actions):
        count: dict[Action, int] = {}
        for i, a in enumerate(acts):
            if not isinstance(a, Action) or a.op not in OPS:
                raise ScheduleError(f"stage {r}, position {i}: {a!r} is not an Action with op in {OPS}")
            if not (0 <= a.mb < m and 0 <= a.chunk < v):
                raise ScheduleError(f"stage {r}, position {i}: {a} names micro-batch {a.mb} / chunk {a.chunk}, "
                                    f"outside m={m}, v={v}")
            count[a] = count.get(a, 0) + 1
        for a, n in count.items():
            if n > 1:
                raise ScheduleError(f"stage {r} runs {a} {n} times")
        for c in range(v):
            for mb in range(m):
                f, b, i, w = (count.get(Action(op, mb, c), 0) for op in COMPUTE)
                if not f:
                    raise ScheduleError(f"stage {r} never runs {Action('F', mb, c)}")
                if b and (i or w):
                    raise ScheduleError(f"stage {r} runs both a whole backward {Action('B', mb, c)} and a split one")
                if not b and not (i and w):
                    missing = Action("B", mb, c) if not (i or w) else Action("W" if i else "I", mb, c)
                    raise ScheduleError(f"stage {r} never runs {missing}")


def _walk(s: Schedule, costs: dict | None = None, comm: float = 0.0):
    """Run every stage's list in order, as the ranks would (buffered sends, blocking receives).

    Returns ``[(rank, action, start, end)]`` for every action; with ``costs`` None every duration is 0.
    Raises ScheduleError at the first dependency violation or on deadlock.
    """
    p, nvs, v = s.stages, s.n_virtual, s.virtual
    acts = s.actions
    pos, now = [0] * p, [0.0] * p
    done: list[dict[Action, float]] = [{} for _ in range(p)]  # action -> end time
    sent: dict[tuple, float] = {}  # (src rank, kind, mb, src virtual stage) -> arrival time
    link_free: dict[tuple[int, int], float] = {}
    timeline = []

    def dur(op: str) -> float:
        if costs is None:
            return 0.0
        c = costs["I"] + costs["W"] if op == "B" and "B" not in costs else costs[op]
        return c / v

    def fail(r: int, a: Action, why: str) -> None:
        raise ScheduleError(f"stage {r}, action {pos[r]} ({a}): {why}")

    def grad_done(r: int, mb: int, c: int) -> float | None:
        d = done[r]
        return d.get(Action("B", mb, c), d.get(Action("I", mb, c)))

    def step(r: int) -> bool:
        """Run rank r's next action if it can; False if it must wait for a message."""
        a = acts[r][pos[r]]
        vs = a.chunk * p + r
        prev_r, next_r = (vs - 1) % p, (vs + 1) % p
        need: list[float] = []  # times the inputs are ready
        if a.op == "F":
            if vs == 0:
                pass
            elif prev_r == r:
                t = done[r].get(Action("F", a.mb, a.chunk - 1))
                if t is None:
                    fail(r, a, f"needs the output of {Action('F', a.mb, a.chunk - 1)} on this stage, not run yet")
            else:
                t = done[r].get(Action("RECV_F", a.mb, a.chunk))
                if t is None:
                    fail(r, a, f"its input comes from stage {prev_r}, but {Action('RECV_F', a.mb, a.chunk)} "
                               f"has not run before it")
            if vs > 0:
                need.append(t)
        elif a.op in ("B", "I"):
            t = done[r].get(Action("F", a.mb, a.chunk))
            if t is None:
                fail(r, a, f"runs before its forward {Action('F', a.mb, a.chunk)}")
            need.append(t)
            if vs < nvs - 1:
                if next_r == r:
                    t = grad_done(r, a.mb, a.chunk + 1)
                    if t is None:
                        fail(r, a, f"needs the input gradient of chunk {a.chunk + 1} on this stage, not computed yet")
                else:
                    t = done[r].get(Action("RECV_B", a.mb, a.chunk))
                    if t is None:
                        fail(r, a, f"its output gradient comes from stage {next_r}, but "
                                   f"{Action('RECV_B', a.mb, a.chunk)} has not run before it")
                need.append(t)
        elif a.op == "W":
            t = done[r].get(Action("I", a.mb, a.chunk))
            if t is None:
                fail(r, a, f"the weight gradient needs {Action('I', a.mb, a.chunk)} first")
            need.append(t)
        elif a.op in ("SEND_F", "SEND_B"):
            fwd = a.op == "SEND_F"
            dst = next_r if fwd else prev_r
            if (vs == nvs - 1) if fwd else (vs == 0):
                fail(r, a, f"virtual stage {vs} has no {'next' if fwd else 'previous'} stage to send to")
            if dst == r:
                fail(r, a, "the neighbouring chunk lives on this same stage: there is nothing to send")
            t = done[r].get(Action("F", a.mb, a.chunk)) if fwd else grad_done(r, a.mb, a.chunk)
            if t is None:
                fail(r, a, f"sends {'the output' if fwd else 'the input gradient'} of micro-batch {a.mb} "
                           f"before computing it")
            start = max(now[r], t, link_free.get((r, dst), 0.0))
            link_free[(r, dst)] = start + comm
            sent[(r, a.op[-1], a.mb, vs)] = start + comm
            done[r][a] = now[r]
            timeline.append((r, a, start, start + comm))
            pos[r] += 1
            return True
        else:  # a receive
            fwd = a.op == "RECV_F"
            src, svs = (prev_r, vs - 1) if fwd else (next_r, vs + 1)
            if (vs == 0) if fwd else (vs == nvs - 1):
                fail(r, a, f"virtual stage {vs} has no {'previous' if fwd else 'next'} stage to receive from")
            if src == r:
                fail(r, a, "the neighbouring chunk lives on this same stage: there is nothing to receive")
            t = sent.pop((src, a.op[-1], a.mb, svs), None)
            if t is None:
                return False
            now[r] = max(now[r], t)
            done[r][a] = now[r]
            timeline.append((r, a, now[r], now[r]))
            pos[r] += 1
            return True
        start = max([now[r]] + need)
        now[r] = start + dur(a.op)
        done[r][a] = now[r]
        timeline.append((r, a, start, now[r]))
        pos[r] += 1
        return True

    while any(pos[r] < len(acts[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(acts[r]) and step(r):
                moved = True
        if not moved:
            stuck = []
            for r in range(p):
                if pos[r] < len(acts[r]):
                    a = acts[r][pos[r]]
                    vs = a.chunk * p + r
                    src = (vs - 1) % p if a.op == "RECV_F" else (vs + 1) % p
                    what = "activation" if a.op == "RECV_F" else "gradient"
                    stuck.append(f"stage {r} waits at action {pos[r]} ({a}) for the {what} of micro-batch {a.mb} "
                                 f"from stage {src}")
            raise ScheduleError(f"schedule {s.name!r} deadlocks: " + "; ".join(stuck))
    if sent:
        (src, kind, mb, vs), _ = next(iter(sent.items()))
        raise ScheduleError(f"stage {src} sends the {'activation' if kind == 'F' else 'gradient'} of micro-batch "
                            f"{mb} (virtual stage {vs}) but no stage receives it")
    return timeline


def check_schedule(s: Schedule) -> Schedule:
    """Raise ScheduleError unless ``s`` runs to completion with every dependency met; return ``s``."""
    _validate(s)
    _walk(s)
    return s


def simulate(s: Schedule, F: float = 1.0, B: float | None = None, I: float | None = None,  # noqa: E741
             W: float | None = None, comm: float = 0.0):
    """Time ``s`` with per-stage costs (seconds for one micro-batch through all of a rank's layers;
    a chunk costs 1/v of that) and ``comm`` seconds per message; returns a ``Trace`` with one
    ``pipeline`` event per compute action (named ``str(action)``) and a ``link`` event per message.

    Defaults: I = W = F and B = I + W (the backward costs twice the forward)."""
    check_schedule(s)
    I = F if I is None else I  # noqa: E741
    W = F if W is None else W
    costs = {"F": F, "I": I, "W": W, "B": I + W if B is None else B}
    events = []
    for r, a, start, end in _walk(s, costs, comm):
        if a.op in COMPUTE:
            events.append(Event(r, "pipeline", str(a), start, end, 0.0, 0.0))
        elif a.op.startswith("SEND"):
            events.append(Event(r, "link", str(a), start, end, 0.0, 0.0))
    return Trace(events)


# -- the schedules -----------------------------------------------------------------------------
def _args(fn: str, p: int, m: int, v: int = 1) -> None:
    for name, x in (("stages", p), ("microbatches", m), ("virtual", v)):
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"{fn}: {name} must be an int >= 1, got {x!r}")


def gpipe(stages: int, microbatches: int) -> Schedule:
    """All forwards, then all backwards (Huang et al. 2019): every stage holds all m micro-batches."""
    _args("gpipe", stages, microbatches)
    m = microbatches
    comp = [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)] for _ in range(stages)]
    return Schedule("gpipe", stages, m, 1, with_communication(comp, stages))


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """PipeDream-flush: stage s warms up with min(p-s-1, m) forwards, then alternates one forward and
    one backward, then drains; at most min(p-s, m) micro-batches in flight on stage s."""
    _args("1f1b", stages, microbatches)
    p, m = stages, microbatches
    comp = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action("F", warm + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warm, m)]
        comp.append(acts)
    return Schedule("1f1b", p, m, 1, with_communication(comp, p))


def _interleaved_order(p: int, m: int, v: int, backward: bool) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in Megatron's order: groups of p micro-batches, each through chunk 0..v-1
    (v-1..0 for the backward); with m < p the one group has m micro-batches."""
    order = []
    for g0 in range(0, m, p):
        g = min(p, m - g0)
        chunks = range(v - 1, -1, -1) if backward else range(v)
        order += [(g0 + i, c) for c in chunks for i in range(g)]
    return order


def interleaved(stages: int, microbatches: int, virtual: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021): v chunks per rank; rank r warms up with
    2 (p - r - 1) + (v - 1) p chunk-forwards, then alternates, then drains. The bubble shrinks by v
    to (p-1)/(m v + p - 1) of the span (m a multiple of p); m must be a multiple of p or at most p."""
    _args("interleaved", stages, microbatches, virtual)
    p, m, v = stages, microbatches, virtual
    if m > p and m % p:
        raise ValueError(f"interleaved: microbatches ({m}) must be a multiple of stages ({p}) or at most {p} "
                         f"(the micro-batches go round the stages in groups of p, as in Megatron-LM)")
    fwd, bwd = _interleaved_order(p, m, v, False), _interleaved_order(p, m, v, True)
    total = m * v
    comp = []
    for r in range(p):
        warm = min(2 * (p - r - 1) + (v - 1) * p, total)
        acts = [Action("F", *fwd[k]) for k in range(warm)]
        for i in range(total - warm):
            acts += [Action("F", *fwd[warm + i]), Action("B", *bwd[i])]
        acts += [Action("B", *bwd[k]) for k in range(total - warm, total)]
        comp.append(acts)
    return Schedule("interleaved", p, m, v, with_communication(comp, p, v))


def zb_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024): the backward split into I (input gradient) and W (weight gradient).

    I stays on the critical path; W waits. Stage s warms up like 1F1B (min(p-s-1, m) forwards), then
    runs F, I pairs and lets its W passes lag s micro-batches behind, so later stages fill the
    cool-down bubble with W; no stage holds more than p micro-batches (1F1B's peak, on stage 0).
    With equal F, I and W costs the bubble is (p-1)/(3m + p - 1) for m >= p, a third of 1F1B's."""
    _args("zb-h1", stages, microbatches)
    p, m = stages, microbatches
    comp = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action("F", i) for i in range(warm)]
        nw = 0
        for k in range(m - warm):
            acts += [Action("F", warm + k), Action("I", k)]
            if k - nw >= s:  # more W passes pending than this stage's lag
                acts.append(Action("W", nw))
                nw += 1
        for j in range(m - warm, m):
            acts += [Action("I", j), Action("W", nw)]
            nw += 1
        acts += [Action("W", i) for i in range(nw, m)]
        comp.append(acts)
    return Schedule("zb-h1", p, m, 1, with_communication(comp, p))


def make_schedule(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The schedule ``name`` in {"gpipe", "1f1b", "interleaved", "zb-h1"} (alias "zero_bubble")."""
    key = ALIASES.get(name, name)
    if key not in NAMES:
        raise ValueError(f"make_schedule: schedule must be one of {NAMES} (or {sorted(ALIASES)}), got {name!r}")
    if key == "interleaved":
        return interleaved(stages, microbatches, virtual)
    if virtual != 1:
        raise ValueError(f"make_schedule: virtual={virtual} needs schedule='interleaved', got {name!r}")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[key](stages, microbatches)


def bubble_fraction(trace, window: tuple[float, float] | None = None) -> float:
    """Idle fraction of the ranks that ran ``pipeline`` actions: 1 - busy / (ranks x span).

    ``window`` (start, end) is the step to measure; by default from the first action to the last."""
    evs = [e for e in trace if e.stream == "pipeline"]
    if not evs:
        raise ValueError("bubble_fraction: the trace has no 'pipeline' events (run a schedule first)")
    lo, hi = window if window is not None else (min(e.start for e in evs), max(e.end for e in evs))
    ranks = {e.rank for e in evs}
    busy = sum(min(e.end, hi) - max(e.start, lo) for e in evs if e.end > lo and e.start < hi)
    return 1.0 - busy / (len(ranks) * (hi - lo))
