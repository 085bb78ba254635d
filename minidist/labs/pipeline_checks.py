"""Checks for lab 10, pipeline parallelism (book chapter 16).

``check_bubble`` compares the learner's bubble formula with the idle fraction of the pipeline span
(and recognises the other convention, bubble over useful work, and the naive (p-1)/p).
``check_1f1b_actions`` takes the learner's per-stage 1F1B action lists, adds the messages, and runs
the schedule checker: a deadlock is reported with the stuck actions (and, when the warm-up follows
the book's code, with that diagnosis); then it checks that every stage takes micro-batches in order,
keeps at most min(p-s, m) micro-batches in flight (what makes it 1F1B rather than GPipe) and that the
simulated bubble is (p-1)/(m+p-1).
"""

from __future__ import annotations

from collections.abc import Callable

from minidist.labs.check import CheckFailed, attempt, check_cases, close, fail, learner_name, passed


def check_bubble(bubble: Callable) -> None:
    """``bubble(p, m, v)``: idle fraction of the pipeline span, (p-1)/(m v + p - 1)."""
    cases = []
    for p, m, v in [(4, 1, 1), (4, 8, 1), (8, 32, 1), (2, 3, 1), (4, 8, 2), (16, 32, 4), (1, 5, 1)]:
        cases.append(((p, m, v), (p - 1) / (m * v + p - 1), "the span is the work m v plus a fill of p - 1 "
                      "chunk-slots; the bubble is the idle part of p stages x span"))

    def diagnose(args, expected, got):
        p, m, v = args
        if close(got, (p - 1) / (m * v)):
            return ("that is bubble / useful work, (p-1)/(m v): the book's chapter 16 approximation. Here we want "
                    "the idle fraction of the whole span, bubble / (work + bubble)")
        if close(got, (p - 1) / p):
            return "that is the single-batch pipeline: micro-batches (m) shrink the bubble"
        if v > 1 and close(got, (p - 1) / (m + p - 1)):
            return "with v chunks per stage each slot of the fill is 1/v as long: the fill shrinks by v"
        return None

    check_cases("bubble", bubble, cases, diagnose=diagnose)


def _book_warmup(comp: list, p: int, m: int) -> str | None:
    """'s' or 's+1' when every stage's warm-up matches the book's code, else None."""
    warm = []
    for acts in comp:
        first_b = next((i for i, a in enumerate(acts) if a.op == "B"), len(acts))
        warm.append(first_b)
    for name, f in (("s", lambda s: s), ("s + 1", lambda s: s + 1)):
        if all(w == min(f(s), m) + (f(s) < m) for s, w in enumerate(warm)):
            return name
    return None


def check_1f1b_actions(actions: Callable) -> None:
    """``actions(p, m)`` -> one list per stage of "F<i>" / "B<i>" strings in the order the stage runs them."""
    from minidist.parallel.pipeline.schedule_walk import check_schedule, simulate
    from minidist.parallel.pipeline.schedules import (
        Action,
        Schedule,
        ScheduleError,
        bubble_fraction,
        with_communication,
    )

    name = getattr(actions, "__name__", "")  # the learner's own name for it (one_f_one_b in the lab)
    name = name if name.isidentifier() else "actions"
    n = 0
    for p, m in [(2, 1), (2, 4), (3, 5), (4, 4), (4, 8), (4, 2)]:
        got = attempt(name, actions, p, m)
        if not isinstance(got, (list, tuple)) or len(got) != p:
            fail(f"{name}({p}, {m}) must return one list per stage", f"{p} lists", got)
        comp = []
        for s, row in enumerate(got):
            acts = []
            for x in row:
                try:
                    a = Action.parse(str(x))
                except ValueError:
                    fail(f"{name}({p}, {m}), stage {s}: {x!r} is not an action", "'F3' or 'B3'", x)
                if a.op not in ("F", "B"):
                    fail(f"{name}({p}, {m}), stage {s}: only forwards and backwards here", "'F<i>' or 'B<i>'", x,
                         "the messages are added for you")
                acts.append(a)
            comp.append(acts)
        sched = Schedule("yours", p, m, 1, with_communication(comp, p))
        try:
            check_schedule(sched)
        except ScheduleError as e:
            hint = "stage s runs min(p - s - 1, m) forwards before its first backward (stage 0 the most)"
            book = _book_warmup(comp, p, m) if "deadlock" in str(e) else None
            if book:
                hint = (f"your stage s warms up with {book} forwards, as in the book's code, which is reversed: "
                        f"the last stage must start backwards first. " + hint)
            raise CheckFailed(f"{name}({p}, {m}) cannot run: {e}\n  hint: {hint}") from None
        for s, acts in enumerate(comp):
            for op, word in (("F", "forwards"), ("B", "backwards")):
                order = [a.mb for a in acts if a.op == op]
                if order != sorted(order):
                    fail(f"{name}({p}, {m}): stage {s} runs its {word} out of order", sorted(order), order,
                         "1F1B takes micro-batches first in, first out: F0, F1, ... and B0, B1, ... on every "
                         "stage (the oldest activations are freed first)")
            held = top = 0
            for a in acts:
                held += 1 if a.op == "F" else -1
                top = max(top, held)
            if top != min(p - s, m):
                fail(f"{name}({p}, {m}): stage {s} holds {top} micro-batch{'es' if top != 1 else ''} at once",
                     min(p - s, m), top,
                     "1F1B runs a backward as soon as it can after min(p-s-1, m) warm-up forwards, so stage s "
                     "never holds more than p - s micro-batches (all forwards first is GPipe)")
        b = bubble_fraction(simulate(sched))
        if not close(b, (p - 1) / (m + p - 1), rel=1e-9):
            fail(f"{name}({p}, {m}): simulated bubble", (p - 1) / (m + p - 1), b,
                 "a stage waits longer than it must: alternate one F and one B in the steady state")
        n += 1
    passed(f"1F1B action lists: {n} pipelines run without deadlock, hold min(p-s, m) micro-batches, bubble "
           f"(p-1)/(m+p-1)")


def _walk(rows: list[list[str]], F: float, B: float, comm: float) -> tuple[float, float]:
    """The reference: every stage runs its list in order, each action as soon as its stage is free and its input
    has arrived (a neighbour's output ``comm`` seconds after it ends); (span, idle share of the p stages)."""
    p = len(rows)
    end: dict[tuple, float] = {}
    free, nxt = [0.0] * p, [0] * p
    while any(nxt[s] < len(rows[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while nxt[s] < len(rows[s]):
                op, i = rows[s][nxt[s]][0], int(rows[s][nxt[s]][1:])
                if op == "F":
                    dep, hop = (("F", s - 1, i), comm) if s > 0 else (None, 0.0)
                else:
                    dep, hop = (("B", s + 1, i), comm) if s < p - 1 else (("F", s, i), 0.0)
                if dep is not None and dep not in end:
                    break
                start = max(free[s], end[dep] + hop if dep else 0.0)
                free[s] = end[(op, s, i)] = start + (F if op == "F" else B)
                nxt[s] += 1
                moved = True
        if not moved:
            raise ValueError("the schedule deadlocks")
    span = max(free)
    busy = sum(F if a[0] == "F" else B for row in rows for a in row)
    return span, 1 - busy / (p * span)


def check_walk_schedule(walk: Callable) -> None:
    """``walk(rows, F, B, comm)`` -> (span, bubble) of any valid F/B schedule, timed from its dependencies."""
    from minidist.parallel.pipeline.schedules import make_schedule

    name = learner_name(walk, "walk")
    # "lockstep" (every stage F0 B0 F1 B1 ...) is valid but slow: no closed form of the page fits it
    cases = [("1f1b", 3, 5, 1.0, 2.0, 0.0), ("lockstep", 3, 4, 1.0, 2.0, 0.0),
             ("gpipe", 5, 7, 0.7, 1.9, 0.0), ("1f1b", 6, 3, 1.0, 2.0, 0.0),
             ("gpipe", 2, 6, 1.0, 2.0, 0.3), ("1f1b", 5, 9, 0.5, 1.5, 0.25), ("1f1b", 3, 2, 2.0, 3.0, 0.5),
             ("gpipe", 4, 4, 1.0, 1.0, 0.1), ("1f1b", 7, 11, 0.9, 2.1, 0.05)]
    for sched, p, m, F, B, comm in cases:
        if sched == "lockstep":
            rows = [[f"{op}{i}" for i in range(m) for op in "FB"] for _ in range(p)]
        else:
            s = make_schedule(sched, p, m)
            rows = [[str(a) for a in s.compute(r)] for r in range(p)]
        call = f"{name}(<{sched} rows, p={p}, m={m}>, F={F}, B={B}, comm={comm})"
        got = attempt(name, walk, [list(r) for r in rows], F, B, comm, shown=call)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{call} must return two numbers", "(span, bubble)", got, "return the tuple (span, bubble)")
        span, bub = (float(x) for x in got)
        want_span, want_bub = _walk(rows, F, B, comm)
        if close(span, want_span, rel=1e-9) and close(bub, want_bub, rel=1e-9, abs_=1e-12):
            continue
        hint = ("time each action: it starts when its stage is free AND its input exists (a forward needs the "
                "previous stage's forward of the same micro-batch, a backward the next stage's backward, the last "
                "stage's backward its own forward)")
        if comm and close(span, _walk(rows, F, B, 0.0)[0]):
            hint = "a result produced on another stage arrives `comm` seconds after it ends there"
        elif close(bub, (p - 1) / (m + p - 1)):
            hint = ("that is the closed form, which holds for uniform slots without messages only: walk the "
                    "actions instead, so that any costs and message times count")
        elif close(span, want_span) and close(bub, 1 - want_bub):
            hint = "the bubble is the IDLE share of the p stages over the span, not the busy share"
        elif close(span, want_span):
            hint = ("the span is right; the bubble is 1 - (time the p stages compute) / (p x span), each action "
                    "counted at its own cost")
        fail(f"{call} is wrong", (want_span, want_bub), (span, bub), hint)
    passed(f"{name}: {len(cases)} schedules timed from their dependencies (uneven costs and message times included)")
