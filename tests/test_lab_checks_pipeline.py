"""Lab 10 checks accept the right answers and reject the usual wrong ones with the intended hint."""

import pytest

import minidist as md
from minidist.labs import CheckFailed


def bubble(p, m, v=1):
    return (p - 1) / (m * v + p - 1)


def one_f_one_b(p, m):
    rows = []
    for s in range(p):
        w = min(p - s - 1, m)
        row = [f"F{i}" for i in range(w)]
        for i in range(m - w):
            row += [f"F{w + i}", f"B{i}"]
        rows.append(row + [f"B{i}" for i in range(m - w, m)])
    return rows


def book(shift):
    def actions(p, m):
        rows = []
        for s in range(p):
            w = min(s + shift, m)
            row = [f"F{i}" for i in range(w)]
            for i in range(m - w):
                row += [f"F{w + i}", f"B{i}"]
            rows.append(row + [f"B{i}" for i in range(m - w, m)])
        return rows
    return actions


def test_right_answers_pass(capsys):
    md.labs.check_bubble(bubble)
    md.labs.check_1f1b_actions(one_f_one_b)
    out = capsys.readouterr().out
    assert out.count("ok:") == 2


@pytest.mark.parametrize("wrong, hint", [
    (lambda p, m, v=1: (p - 1) / (m * v), "bubble / useful work"),
    (lambda p, m, v=1: (p - 1) / p, "single-batch pipeline"),
    (lambda p, m, v=1: (p - 1) / (m + p - 1), "the fill shrinks by v"),
])
def test_bubble_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        md.labs.check_bubble(wrong)


@pytest.mark.parametrize("shift, name", [(0, "s"), (1, r"s \+ 1")])
def test_books_warmup_is_diagnosed(shift, name):
    with pytest.raises(CheckFailed, match=rf"deadlocks(.|\n)*warms up with {name} forwards, as in the book"):
        md.labs.check_1f1b_actions(book(shift))


def test_gpipe_order_is_not_1f1b():
    def gpipe(p, m):
        return [[f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for _ in range(p)]
    with pytest.raises(CheckFailed, match="holds 4 micro-batches at once(.|\n)*all forwards first is GPipe"):
        md.labs.check_1f1b_actions(gpipe)


def test_malformed_and_unfinished_answers():
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_1f1b_actions(lambda p, m: (_ for _ in ()).throw(NotImplementedError))
    with pytest.raises(CheckFailed, match="one list per stage"):
        md.labs.check_1f1b_actions(lambda p, m: [["F0", "B0"]])
    with pytest.raises(CheckFailed, match="only forwards and backwards"):
        md.labs.check_1f1b_actions(lambda p, m: [["F0", "W0"]] * p)
    with pytest.raises(CheckFailed, match="never runs B0"):
        md.labs.check_1f1b_actions(lambda p, m: [[f"F{i}" for i in range(m)]] * p)


def test_one_warmup_forward_too_many_is_rejected():
    def extra(p, m):
        rows = []
        for s in range(p):
            w = min(p - s, m)  # off by one: stage s then holds p - s + 1 micro-batches
            row = [f"F{i}" for i in range(w)]
            for i in range(m - w):
                row += [f"F{w + i}", f"B{i}"]
            rows.append(row + [f"B{i}" for i in range(m - w, m)])
        return rows
    with pytest.raises(CheckFailed, match="holds 3 micro-batches at once"):
        md.labs.check_1f1b_actions(extra)


def test_micro_batches_out_of_order_are_rejected():
    """Relabelling micro-batches 0 and 1 on every stage runs, holds as much and has the same bubble; it is
    still not 1F1B's order."""
    def swapped(p, m):
        swap = {"0": "1", "1": "0"} if m > 1 else {}
        return [[a[0] + swap.get(a[1:], a[1:]) for a in row] for row in one_f_one_b(p, m)]
    with pytest.raises(CheckFailed, match="out of order(.|\n)*first in, first out"):
        md.labs.check_1f1b_actions(swapped)


def test_an_action_outside_the_micro_batches_is_not_blamed_on_the_books_warm_up():
    with pytest.raises(CheckFailed, match="outside m=1") as e:
        md.labs.check_1f1b_actions(lambda p, m: [["F1", "B1"]] * p)
    assert "book" not in str(e.value)


def test_walk_schedule_accepts_the_executors_walk_and_names_the_closed_form():
    from minidist.labs.pipeline_checks import _walk
    from minidist.parallel.pipeline import schedules as S
    from minidist.parallel.pipeline.schedule_walk import simulate

    # the reference walk is the executor's: same span and bubble, messages included
    for name, p, m, F, B, comm in [("1f1b", 4, 6, 0.7, 1.9, 0.2), ("gpipe", 3, 5, 1.0, 2.0, 0.1)]:
        s = S.make_schedule(name, p, m)
        tr = simulate(s, F=F, B=B, comm=comm)
        span, bubble = _walk([[str(a) for a in s.compute(r)] for r in range(p)], F, B, comm)
        assert abs(span - (max(e.end for e in tr.events) - min(e.start for e in tr.events))) < 1e-12
        assert abs(bubble - S.bubble_fraction(tr)) < 1e-12
    md.labs.check_walk_schedule(lambda rows, F, B, comm=0.0: _walk(rows, F, B, comm))

    def closed_form(rows, F, B, comm=0.0):
        p, m = len(rows), len(rows[0]) // 2
        return (m + p - 1) * (F + B), (p - 1) / (m + p - 1)

    with pytest.raises(CheckFailed, match="closed form"):
        md.labs.check_walk_schedule(closed_form)
    with pytest.raises(CheckFailed, match="arrives `comm` seconds"):
        md.labs.check_walk_schedule(lambda rows, F, B, comm=0.0: _walk(rows, F, B, 0.0))
    with pytest.raises(CheckFailed, match="IDLE share"):
        md.labs.check_walk_schedule(lambda rows, F, B, comm=0.0: (_walk(rows, F, B, comm)[0],
                                                                  1 - _walk(rows, F, B, comm)[1]))
