"""Gantt charts of pipeline schedules, executed or simulated, and an explorer of p, m and v (lab 10).

The chart reads the ``pipeline`` events of a trace: the executor records one per compute action
(``F3``, ``B3``, ``I3``, ``W3``, with ``.c`` for chunk c of an interleaved schedule), and
``schedules.simulate`` produces the same events without running anything. One row per stage;
white space is the bubble.
"""

from __future__ import annotations

COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#DD8452", "W": "#8172B3"}
LABELS = {"F": "forward", "B": "backward", "I": "backward, input grad", "W": "backward, weight grad"}


def plot_pipeline(trace, ax=None, title: str | None = None, unit: str = "ms", labels: bool = True):
    """Draw the ``pipeline`` events of ``trace`` as one row per stage; returns the axes.

    ``unit``: "s", "ms", "us", or "" for the raw numbers (a simulation in units of a forward).
    Later chunks of an interleaved or V schedule are drawn lighter and labelled ``mb.chunk`` (``3.1``: micro-batch 3,
    chunk 1); the title gives the measured bubble.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from minidist.parallel.pipeline.schedules import Action, bubble_fraction

    scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "": 1.0}.get(unit)
    if scale is None:
        raise ValueError(f"plot_pipeline: unit must be 's', 'ms', 'us' or '', got {unit!r}")
    evs = [e for e in trace if e.stream == "pipeline"]
    if not evs:
        raise ValueError("plot_pipeline: the trace has no 'pipeline' events (run or simulate a schedule first)")
    ranks = sorted({e.rank for e in evs})
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * len(ranks)), dpi=80, layout="constrained")
    t0 = min(e.start for e in evs)
    shortest = min(e.end - e.start for e in evs) * scale
    span = (max(e.end for e in evs) - t0) * scale
    chunked = any(Action.parse(e.name).chunk for e in evs)  # name the chunk too, or "3" would be two boxes
    for e in evs:
        a = Action.parse(e.name)
        y = ranks.index(e.rank)
        x, w = (e.start - t0) * scale, (e.end - e.start) * scale
        ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=COLORS[a.op], edgecolor="k", lw=0.4,
                       alpha=1.0 / (1 + 0.6 * a.chunk))
        if labels and w >= 0.015 * span and w >= 0.9 * shortest:
            ax.text(x + w / 2, y, f"{a.mb}.{a.chunk}" if chunked else str(a.mb), ha="center", va="center",
                    fontsize=6 if chunked else 7, color="white" if a.chunk == 0 else "black")
    used = sorted({Action.parse(e.name).op for e in evs}, key="FBIW".index)
    ax.legend(handles=[Patch(color=COLORS[o], label=LABELS[o]) for o in used], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(ranks)), [f"stage {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"simulated time ({unit})" if unit else "time (one forward = 1)")
    bubble = bubble_fraction(evs)
    ax.set_title(f"{title + ': ' if title else ''}bubble {bubble:.1%}", fontsize=10)
    return ax


def pipeline_explorer(schedule: str = "1f1b", stages: int = 4, microbatches: int = 8, virtual: int = 2):
    """ipywidgets: pick a schedule, p, m and v; the Gantt chart of the simulated schedule is redrawn with
    its measured bubble beside the closed form (uniform stage cost; B = 2 F, I = W = F)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from minidist.estimate import pipeline_bubble
    from minidist.parallel.pipeline.schedule_walk import simulate
    from minidist.parallel.pipeline.schedules import NAMES, make_schedule

    sched_w = w.Dropdown(options=list(NAMES), value=schedule, description="schedule")
    p_w = w.IntSlider(value=stages, min=1, max=8, description="stages p")
    m_w = w.IntSlider(value=microbatches, min=1, max=24, description="micro-batches m")
    v_w = w.IntSlider(value=virtual, min=1, max=4, description="virtual v")
    out = w.Output()

    def redraw(*_):
        name, p, m = sched_w.value, p_w.value, m_w.value
        v = v_w.value if name == "interleaved" else 1
        v_w.disabled = name != "interleaved"
        with out:
            out.clear_output(wait=True)
            try:
                s = make_schedule(name, p, m, v)
            except ValueError as err:
                print(err)
                return
            fig, ax = plt.subplots(figsize=(10, 0.8 + 0.45 * p), dpi=80, layout="constrained")
            formula = pipeline_bubble(p, m, name, v)
            plot_pipeline(simulate(s), ax=ax, unit="", title=f"{name}, p={p}, m={m}" + (f", v={v}" if v > 1 else "")
                          + f"; closed form {formula:.1%}")
            plt.show()

    for widget in (sched_w, p_w, m_w, v_w):
        widget.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([sched_w, p_w]), w.HBox([m_w, v_w]), out])
