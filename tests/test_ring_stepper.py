"""The ring stepper: 2 (p - 1) steps of one message per rank read from a simulated ring all-reduce's trace, each
chunk's contributions growing by one a step in the reduce-scatter half and every copy finished at the end."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

import minidist as md
from minidist.viz.ring_stepper import contributions, ring_steps

matplotlib.use("Agg")


@pytest.mark.parametrize("p", [2, 4])
def test_steps_come_from_the_trace_and_the_sums_complete(p):
    steps = ring_steps(p, 1 << 16)
    assert len(steps) == 2 * (p - 1) and all(sorted(e.rank for e in step) == list(range(p)) for step in steps)
    assert all(e.nbytes == (1 << 16) // p for step in steps for e in step)  # one chunk per message
    for a, b in zip(steps, steps[1:]):  # a step starts once the previous one has arrived
        assert min(e.start for e in b) >= min(e.end for e in a)
    half = contributions(p, p - 1)
    assert (np.sort(half.max(axis=1)) == p).all() and (half == p).sum() == p  # each rank owns one finished chunk
    assert (contributions(p, 2 * (p - 1)) == p).all()


def test_the_widget_follows_its_slider():
    box = md.viz.ring_stepper(p=4, nbytes=1 << 14)
    assert (box.held == 1).all()
    box.children[0].value = 3
    assert (box.held == contributions(4, 3)).all() and box.held.max() == 4
