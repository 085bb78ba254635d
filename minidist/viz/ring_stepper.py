"""A ring all-reduce, step by step, from a real simulated run (lab 06).

The run is ``md.dist.all_reduce(..., algorithm="ring")`` on ``p`` simulated GPUs; its trace holds every message with
its sender, receiver and simulated times. On a ring each rank cuts the buffer into ``p`` chunks; in step ``s`` of the
reduce-scatter half rank ``r`` sends chunk ``(r - s) mod p`` to rank ``r + 1``, which adds it to its own, and in the
all-gather half the finished chunks travel on round. The grid shows, after the chosen step, how many ranks'
contributions each rank's copy of each chunk holds (``p`` is a finished sum); the timeline below marks the step's
messages as the trace recorded them.
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.hardware.cluster import Cluster
from minidist.runtime import launch


def _ring(n: int) -> None:
    x = np.full(n, float(dist.get_rank()))
    dist.all_reduce(x, algorithm="ring")


def ring_steps(p: int, nbytes: int = 1 << 20, cluster: Cluster | None = None) -> list[list]:
    """The messages of a ring all-reduce of ``nbytes`` on ``p`` ranks, grouped into its ``2 (p - 1)`` steps
    (each step: one message per rank, as trace events sorted by sender)."""
    res = launch(_ring, p, args=(max(p, nbytes // 8),), cluster=cluster or Cluster())
    per_rank = [sorted((e for e in res.trace if e.stream == "link" and e.rank == r), key=lambda e: e.start)
                for r in range(p)]
    if any(len(msgs) != 2 * (p - 1) for msgs in per_rank):
        raise RuntimeError(f"ring_steps: expected {2 * (p - 1)} messages per rank, got {[len(m) for m in per_rank]}")
    return [[per_rank[r][s] for r in range(p)] for s in range(2 * (p - 1))]


def contributions(p: int, step: int) -> np.ndarray:
    """(rank, chunk): how many ranks' values rank's copy of chunk holds after ``step`` steps of the ring (0: none)."""
    held = np.eye(p, dtype=int)  # before any step each rank holds its own value of every chunk: 1 contribution
    held[:] = 1
    for s in range(step):
        new = held.copy()
        for r in range(p):
            dst = (r + 1) % p
            if s < p - 1:  # reduce-scatter: the chunk is added to the receiver's
                c = (r - s) % p
                new[dst, c] = held[dst, c] + held[r, c]
            else:  # all-gather: the finished chunk replaces the receiver's
                c = (r - (s - (p - 1)) + 1) % p
                new[dst, c] = held[r, c]
        held = new
    return held


def ring_stepper(p: int = 4, nbytes: int = 1 << 20):
    """ipywidgets: a slider over the steps of a simulated ring all-reduce on ``p`` ranks (see module)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    steps = ring_steps(p, nbytes)
    t0 = min(e.start for step in steps for e in step)
    slider = w.IntSlider(value=0, min=0, max=len(steps), description="after step", style={"description_width": "90px"})
    out = w.Output()
    box = w.VBox([slider, out])
    box.held = None

    def redraw(*_):
        s = slider.value
        held = contributions(p, s)
        box.held = held
        with out:
            out.clear_output(wait=True)
            fig, (grid, line) = plt.subplots(1, 2, figsize=(9, 3), dpi=80, layout="constrained",
                                             gridspec_kw={"width_ratios": [1, 2]})
            grid.imshow(held, cmap="Blues", vmin=0, vmax=p)
            for r in range(p):
                for c in range(p):
                    grid.text(c, r, str(held[r, c]), ha="center", va="center", fontsize=9)
            grid.set_xlabel("chunk")
            grid.set_ylabel("rank")
            grid.set_title("contributions held", fontsize=10)
            for k, step in enumerate(steps):
                for e in step:
                    line.barh(e.rank, (e.end - e.start) * 1e6, left=(e.start - t0) * 1e6,
                              color="tab:orange" if k == s - 1 else "lightgrey")
            line.set_xlabel("simulated microseconds")
            line.set_ylabel("sending rank")
            phase = "start" if s == 0 else ("reduce-scatter" if s <= p - 1 else "all-gather")
            line.set_title(f"step {s} of {len(steps)} ({phase})", fontsize=10)
            plt.show()

    slider.observe(redraw, names="value")
    redraw()
    return box
