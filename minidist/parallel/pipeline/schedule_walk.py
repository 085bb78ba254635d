"""Walking a pipeline schedule the way the ranks would: does it finish, and when (chapter 16, lab 10).

:func:`check_schedule` walks every stage's action list with blocking receives and buffered sends, and
rejects a schedule that deadlocks (naming every stuck action and what it waits for) or runs an action
before what it depends on (naming the action). :func:`simulate` runs the same walk with costs and
returns a ``Trace`` whose ``pipeline`` events are the actions, so the bubble can be measured and drawn
without starting any process.
"""

from __future__ import annotations

from minidist.hardware.trace import Event, Trace
from minidist.parallel.pipeline.schedules import COMPUTE, OPS, Action, Schedule, ScheduleError


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
        vs = s.virtual_stage(r, a.chunk)
        prev_r = s.rank_of(vs - 1) if vs > 0 else None
        next_r = s.rank_of(vs + 1) if vs < nvs - 1 else None
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
                    vs = s.virtual_stage(r, a.chunk)
                    src = s.rank_of(vs - 1) if a.op == "RECV_F" else s.rank_of(vs + 1)
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
