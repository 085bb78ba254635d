"""Where a step's time went, from its trace: every instant of every rank attributed once (book ch32, lab 23).

Property: a rank's step is a single interval, and at every instant its compute stream either runs an op or
does not, and its communication stream either moves data or does not. Cutting the interval at every event
boundary gives segments on which both are constant, so attributing each segment to one category - the op
computing, else the collective exposed, else idle - partitions the step: the categories sum to the step
time, with nothing counted twice and nothing left out. The same segments give the overlap of communication
with compute, alpha = hidden / min(T_compute, T_comm), the alpha_ov of T = T_c + T_m - alpha_ov min(T_c, T_m).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from minidist.hardware.trace import Trace


def compute_category(name: str) -> str:
    """forward, backward, optimizer or other, from an op's name as the autograd and trainer charge it."""
    if name.endswith(".backward"):
        return "backward"
    if name.startswith("optimizer"):
        return "optimizer"
    if name in ("idle", "checkpoint", "checkpoint.write", "restart") or name.startswith("checkpoint"):
        return "other"
    return "forward"


@dataclass
class Budget:
    """One rank's step: seconds per category (``compute:<kind>``, ``exposed:<collective>``, ``idle``) summing to
    ``total``; ``compute`` and ``comm`` the busy time of each stream and ``hidden`` the time both were busy."""

    rank: int
    start: float
    end: float
    parts: dict[str, float] = field(default_factory=dict)
    compute: float = 0.0
    comm: float = 0.0
    hidden: float = 0.0

    @property
    def total(self) -> float:
        return self.end - self.start

    @property
    def overlap(self) -> float:
        """alpha_ov: the share of the shorter stream's busy time that ran under the other (0 if either is idle)."""
        shorter = min(self.compute, self.comm)
        return self.hidden / shorter if shorter > 0 else 0.0

    def grouped(self) -> dict[str, float]:
        """compute, exposed communication and idle, each summed over its kinds."""
        out: dict[str, float] = defaultdict(float)
        for k, v in self.parts.items():
            out[k.split(":")[0]] += v
        return dict(out)


def _label(trace: Trace, rank: int, e, axis) -> str:
    """The collective's name, with the mesh axis its messages crossed when ``axis(src, dst)`` is given: of the
    messages this rank sent wholly inside the collective's span, the axis that carried the most bytes (an
    asynchronous collective's span also holds other, shorter collectives' messages)."""
    if axis is None:
        return e.name
    carried: dict[str, float] = defaultdict(float)
    for x in trace.rank_events(rank):
        if x.stream == "link" and e.start <= x.start and x.end <= e.end:
            carried[axis(rank, int(x.name.split("->")[1]))] += x.nbytes
    return f"{e.name}@{max(carried, key=carried.get) if carried else 'local'}"


def step_budget(trace: Trace, rank: int, start: float, end: float, axis=None) -> Budget:
    """Attribute every instant of ``rank`` in ``[start, end)`` (a step window, e.g. ``TrainResult.windows``).

    ``axis(src, dst)``, e.g. the mesh axis on which two ranks differ, labels exposed communication by the axis its
    messages crossed (``exposed:all_reduce@dp``); ``axis_of(config)`` builds it for a ``ParallelConfig``."""
    if not end > start:
        raise ValueError(f"step_budget: the window must have end > start, got [{start}, {end})")
    mine = trace.rank_events(rank)
    comp = sorted((max(e.start, start), min(e.end, end), e.name) for e in mine
                  if e.stream == "compute" and e.end > start and e.start < end and e.end > e.start)
    comm = sorted((max(e.start, start), min(e.end, end), _label(trace, rank, e, axis)) for e in mine
                  if e.stream == "comm" and e.end > start and e.start < end and e.end > e.start)
    cuts = sorted({start, end, *(t for s, e, _ in comp + comm for t in (s, e))})
    b = Budget(rank, start, end)
    parts: dict[str, float] = defaultdict(float)
    ci = mi = 0
    active: list[tuple[float, float, str]] = []
    for lo, hi in zip(cuts, cuts[1:]):
        while ci < len(comp) and comp[ci][1] <= lo:
            ci += 1
        running = comp[ci] if ci < len(comp) and comp[ci][0] <= lo else None
        while mi < len(comm) and comm[mi][0] <= lo:
            active.append(comm[mi])
            mi += 1
        active = [c for c in active if c[1] > lo]
        dt = hi - lo
        if running is not None:
            parts["compute:" + compute_category(running[2])] += dt
            b.compute += dt
            if active:
                b.hidden += dt
        elif active:
            parts["exposed:" + min(active)[2]] += dt  # the collective that started first is the one waited for
        else:
            parts["idle"] += dt
        if active:
            b.comm += dt
    b.parts = dict(parts)
    return b


def run_budget(result, step: int = -1, axis=None) -> list[Budget]:
    """Every rank's budget for one step of an ``md.parallel.train`` result (``axis`` as in ``step_budget``)."""
    return [step_budget(result.trace, r, *w[step], axis=axis) for r, w in enumerate(result.windows)]


def axis_of(mesh_of) -> object:
    """``axis(src, dst)`` from ``mesh_of(rank)`` returning that rank's device mesh (e.g.
    ``lambda r: md.parallel.build_mesh(config, r)``): the names of the dimensions on which the two differ."""
    def axis(a: int, b: int) -> str:
        ma, mb = mesh_of(a), mesh_of(b)
        diff = [n for n, x, y in zip(ma.mesh_dim_names, ma.get_coordinate(), mb.get_coordinate()) if x != y]
        return "+".join(diff) if diff else "self"

    return axis
