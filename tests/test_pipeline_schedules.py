"""Pipeline schedules as data (chapter 16, lab 10): the checker, the simulated bubble and the partition.

No processes here: schedules are checked and timed by walking the action lists, the way the ranks
run them. The executed schedules (processes, simulated clock, ledger) are in test_pipeline.py.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist as md
from minidist.parallel.pipeline.schedule_walk import check_schedule, simulate
from minidist.parallel.pipeline.schedules import (
    Action,
    Schedule,
    ScheduleError,
    bubble_fraction,
    gpipe,
    interleaved,
    make_schedule,
    one_f_one_b,
    with_communication,
    zb_h1,
)
from minidist.parallel.pipeline.stages import partition, stage_layout

CASES = [(name, p, m, v) for name, v in (("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2),
                                           ("interleaved", 3))
         for p in (1, 2, 4) for m in (1, 2, 4, 8) if not (name == "interleaved" and m > p and m % p)]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_every_schedule_runs_every_action_once(name, p, m, v):
    s = check_schedule(make_schedule(name, p, m, v))
    for r in range(p):
        comp = s.compute(r)
        split = name == "zb-h1"
        assert len(comp) == m * v * (3 if split else 2)
        for c in range(v):  # micro-batches enter each chunk in order, and leave the backward in order
            fs = [a.mb for a in comp if a.op == "F" and a.chunk == c]
            bs = [a.mb for a in comp if a.op == ("I" if split else "B") and a.chunk == c]
            assert fs == list(range(m)) and bs == list(range(m))


@pytest.mark.parametrize("p, m", list(itertools.product((1, 2, 3, 4, 8), (1, 2, 4, 8, 16))))
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    for s in (gpipe(p, m), one_f_one_b(p, m)):
        for costs in (dict(F=1.0), dict(F=1.0, B=3.0), dict(F=0.5, I=0.7, W=0.2)):
            b = bubble_fraction(simulate(s, **costs))
            assert b == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
            assert b == pytest.approx(md.estimate.pipeline_bubble(p, m, s.name), abs=1e-12)


@pytest.mark.parametrize("p, k, v", list(itertools.product((2, 3, 4), (1, 2, 4), (2, 3, 4))))
def test_interleaved_bubble_is_p_minus_1_over_mv_plus_p_minus_1(p, k, v):
    m = k * p
    b = bubble_fraction(simulate(interleaved(p, m, v)))
    assert b == pytest.approx((p - 1) / (m * v + p - 1), abs=1e-12)
    assert b == pytest.approx(md.estimate.pipeline_bubble(p, m, "interleaved", v), abs=1e-12)
    assert b < bubble_fraction(simulate(one_f_one_b(p, m)))


@pytest.mark.parametrize("p, m", list(itertools.product((2, 3, 4, 6, 8), (1, 2, 3, 4, 8, 16))))
def test_zb_h1_bubble_is_a_third_of_1f1b_for_m_at_least_p(p, m):
    zb = bubble_fraction(simulate(zb_h1(p, m)))  # F = I = W
    assert zb < bubble_fraction(simulate(one_f_one_b(p, m)))
    if m >= p:
        assert zb == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
        assert zb == pytest.approx(md.estimate.pipeline_bubble(p, m, "zb-h1"), abs=1e-12)


@pytest.mark.parametrize("p, m", list(itertools.product((2, 4, 8), (1, 4, 8, 16))))
def test_in_flight_micro_batches(p, m):
    """GPipe holds all m micro-batches; 1F1B holds min(p - s, m) on stage s; ZB-H1 at most min(p, m)."""
    def peak(s, r, done_op):
        held = top = 0
        for a in s.compute(r):
            held += (a.op == "F") - (a.op == done_op)
            top = max(top, held)
        return top
    for r in range(p):
        assert peak(gpipe(p, m), r, "B") == m
        assert peak(one_f_one_b(p, m), r, "B") == min(p - r, m)
        assert peak(zb_h1(p, m), r, "W") <= min(p, m)
    warm = [next(i for i, a in enumerate(one_f_one_b(p, m).compute(r)) if a.op == "B") for r in range(p)]
    # min(p-s-1, m) warm-up forwards, then (if any are left) one more F before the first B
    assert warm == [min(p - r - 1, m) + (p - r - 1 < m) for r in range(p)]


def book_1f1b(p, m, warm):
    """The book's 1F1B code: stage s warms up with warm(s) forwards."""
    comp = []
    for s in range(p):
        w = min(warm(s), m)
        acts = [Action("F", i) for i in range(w)]
        for i in range(m - w):
            acts += [Action("F", w + i), Action("B", i)]
        comp.append(acts + [Action("B", i) for i in range(m - w, m)])
    return Schedule("book-1f1b", p, m, 1, with_communication(comp, p))


@pytest.mark.parametrize("warm", [lambda s: s, lambda s: s + 1], ids=["s", "s+1"])
def test_the_books_1f1b_deadlocks_and_the_checker_names_the_stuck_actions(warm):
    with pytest.raises(ScheduleError, match=r"deadlocks: stage 0 waits at action \d+ \(RECV_B0\) for the gradient "
                                            r"of micro-batch 0 from stage 1"):
        check_schedule(book_1f1b(4, 8, warm))


def test_checker_names_dependency_violations():
    ok = one_f_one_b(2, 2)
    bad = [list(a) for a in ok.actions]
    bad[1] = [Action("B", 0)] + [a for a in bad[1] if a != Action("B", 0)]  # backward before its forward
    with pytest.raises(ScheduleError, match=r"stage 1, action 0 \(B0\): runs before its forward F0"):
        check_schedule(Schedule("x", 2, 2, 1, bad))
    bad = [list(a) for a in ok.actions]
    bad[1].remove(Action("RECV_F", 1))  # forward on stage 1 without receiving its input
    with pytest.raises(ScheduleError, match=r"\(F1\): its input comes from stage 0, but RECV_F1 has not run"):
        check_schedule(Schedule("x", 2, 2, 1, bad))
    zb = [list(a) for a in zb_h1(2, 2).actions]
    zb[0].remove(Action("W", 0))
    zb[0].insert(0, Action("W", 0))
    with pytest.raises(ScheduleError, match=r"stage 0, action 0 \(W0\): the weight gradient needs I0 first"):
        check_schedule(Schedule("x", 2, 2, 1, zb))
    bad = [list(a) for a in ok.actions]
    i = bad[0].index(Action("SEND_F", 0))
    bad[0][i - 1], bad[0][i] = bad[0][i], bad[0][i - 1]
    with pytest.raises(ScheduleError, match=r"\(SEND_F0\): sends the output of micro-batch 0 before computing it"):
        check_schedule(Schedule("x", 2, 2, 1, bad))


def test_checker_rejects_missing_repeated_and_unmatched_work():
    ok = one_f_one_b(2, 2)
    bad = [list(a) for a in ok.actions]
    bad[0].remove(Action("B", 1))
    with pytest.raises(ScheduleError, match="stage 0 never runs B1"):
        check_schedule(Schedule("x", 2, 2, 1, bad))
    bad = [list(a) for a in ok.actions]
    bad[0].append(Action("F", 1))
    with pytest.raises(ScheduleError, match="stage 0 runs F1 2 times"):
        check_schedule(Schedule("x", 2, 2, 1, bad))
    bad = [list(a) for a in ok.actions]
    bad[1].remove(Action("SEND_B", 1))  # stage 0 waits for a gradient nobody sends
    with pytest.raises(ScheduleError, match=r"deadlocks: stage 0 waits at action \d+ \(RECV_B1\)"):
        check_schedule(Schedule("x", 2, 2, 1, bad))
    bad = [list(a) for a in ok.actions]
    bad[1].remove(Action("RECV_F", 0))
    bad[1].insert(0, Action("F", 7))
    with pytest.raises(ScheduleError, match="names micro-batch 7"):
        check_schedule(Schedule("x", 2, 2, 1, bad))


def test_action_text_round_trip_and_bad_arguments():
    for a in (Action("F", 3), Action("RECV_B", 2, 1), Action("W", 12, 3)):
        assert Action.parse(str(a)) == a
    with pytest.raises(ValueError, match="cannot read"):
        Action.parse("X3")
    with pytest.raises(ValueError, match="must be one of"):
        make_schedule("chimera", 2, 4)
    with pytest.raises(ValueError, match="multiple of stages"):
        make_schedule("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match="virtual=2 needs schedule='interleaved'"):
        make_schedule("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="microbatches must be an int >= 1"):
        make_schedule("gpipe", 2, 0)
    assert make_schedule("zero_bubble", 2, 4).name == "zb-h1"


def test_communication_delays_the_pipeline_by_the_message_time():
    """GPipe with c seconds per message: the fill and the drain each cross p-1 messages, so the span is
    (m+p-1)(F+B) + 2(p-1)c; 1F1B's steady state waits for round trips too, so it pays at least that."""
    for p, m in ((2, 4), (4, 8)):
        span = (m + p - 1) * 3 + 2 * (p - 1) * 0.25
        assert simulate(gpipe(p, m), F=1.0, comm=0.25).end() == pytest.approx(span, abs=1e-12)
        assert simulate(one_f_one_b(p, m), F=1.0, comm=0.25).end() >= span


def brute_force_partition(costs, parts):
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), parts - 1):
        b = (0,) + cuts + (len(costs),)
        worst = max(sum(costs[i:j]) for i, j in zip(b, b[1:]))
        best = worst if best is None else min(best, worst)
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=9), st.integers(1, 9))
def test_partition_minimises_the_largest_stage(costs, parts):
    if parts > len(costs):
        with pytest.raises(ValueError, match="non-empty stages"):
            partition(costs, parts)
        return
    cut = partition(costs, parts)
    assert [lo for lo, _ in cut] == [0] + [hi for _, hi in cut[:-1]] and cut[-1][1] == len(costs)
    assert all(hi > lo for lo, hi in cut)
    assert max(sum(costs[lo:hi]) for lo, hi in cut) == brute_force_partition(costs, parts)


def test_even_layout_and_a_heavy_last_layer():
    assert stage_layout(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_layout(8, 2, 2) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_layout(4, 2, costs=[1, 1, 1, 3]) == [(0, 3), (3, 4)]
    assert np.allclose(bubble_fraction(simulate(gpipe(1, 3))), 0.0)


def test_gantt_chart_and_explorer():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minidist.viz import pipeline_explorer, plot_pipeline

    trace = simulate(interleaved(2, 4, 2))
    ax = plot_pipeline(trace, unit="", title="interleaved")
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == 2 * 4 * 2 * 2  # every compute action of every stage is a bar
    assert "bubble 11.1%" in ax.get_title()
    with pytest.raises(ValueError, match="no 'pipeline' events"):
        plot_pipeline([])
    box = pipeline_explorer("zb-h1", 4, 8)
    box.children[1].children[0].value = 12  # m: redraws without error
    plt.close("all")


@pytest.mark.parametrize("p, m", list(itertools.product((2, 3, 4, 8), (8, 16))))
def test_zb_h1_bubble_with_its_own_pass_costs(p, m):
    """ZB-H1 with unequal passes: each fill-and-drain slot idles F + I - W, never less than the longer of F and I
    (a W longer than that cannot hide what a stage waits for)."""
    rng = np.random.default_rng(p * 100 + m)
    for f, i, w in [(1.0, 1.0, 0.36), (1.0, 0.8, 1.5), (0.5, 1.2, 0.2), *rng.uniform(0.1, 2.0, (6, 3)).tolist()]:
        walked = bubble_fraction(simulate(zb_h1(p, m), F=f, I=i, W=w))
        assert walked == pytest.approx(md.estimate.pipeline_bubble(p, m, "zb-h1", costs=(f, i, w)), abs=1e-12)
    equal = md.estimate.pipeline_bubble(p, m, "zb-h1")
    assert md.estimate.pipeline_bubble(p, m, "zb-h1", costs=(2.0, 2.0, 2.0)) == equal
    with pytest.raises(ValueError, match="costs must be"):
        md.estimate.pipeline_bubble(p, m, "zb-h1", costs=(1.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="dualpipev's bubble with unequal passes is not"):
        md.estimate.pipeline_bubble(p, m, "dualpipev", costs=(1.0, 1.0, 1.0))
