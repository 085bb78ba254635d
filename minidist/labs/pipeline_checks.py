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

from minidist.labs.check import CheckFailed, attempt, check_cases, close, fail, passed


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
    from minidist.parallel.schedule_walk import check_schedule, simulate
    from minidist.parallel.schedules import (
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
