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
is virtual stage ``c p + r`` of the ``p v`` stages the layers are cut into (Megatron-LM's layout, the
``"loop"`` placement). DualPipeV uses the ``"v"`` placement: two chunks per rank, rank r holding virtual
stages r and 2p - 1 - r, so a micro-batch goes down the ranks and comes back up, and the first and last
pieces (embedding, head and loss) share rank 0. :func:`virtual_stage` and :func:`rank_of` are the only
places that know either map.

Whether a schedule runs, and how long it takes, is ``schedule_walk.py``'s (:func:`check_schedule`,
:func:`simulate`).

Warm-up of 1F1B: stage s runs ``min(p - s - 1, m)`` forwards before its first backward, so the first
stage runs the most. The book's code warms stage s up with s (or s+1) forwards, which deadlocks:
``check_schedule`` says where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

COMPUTE = ("F", "B", "I", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
OPS = COMPUTE + COMM
NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipev")
ALIASES = {"zero_bubble": "zb-h1", "zbh1": "zb-h1", "interleaved_1f1b": "interleaved", "dualpipe": "dualpipev"}
PLACEMENTS = ("loop", "v")


def virtual_stage(placement: str, p: int, rank: int, chunk: int) -> int:
    """The virtual stage that ``rank``'s ``chunk`` holds, out of ``p v``."""
    if placement == "v":
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def rank_of(placement: str, p: int, vs: int) -> int:
    """The rank that holds virtual stage ``vs``."""
    if placement == "v":
        return vs if vs < p else 2 * p - 1 - vs
    return vs % p


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
    placement: str = "loop"

    @property
    def n_virtual(self) -> int:
        return self.stages * self.virtual

    def rank_of(self, vs: int) -> int:
        return rank_of(self.placement, self.stages, vs)

    def virtual_stage(self, rank: int, chunk: int) -> int:
        return virtual_stage(self.placement, self.stages, rank, chunk)

    def compute(self, rank: int) -> list[Action]:
        """Rank ``rank``'s compute actions only (no messages)."""
        return [a for a in self.actions[rank] if a.op in COMPUTE]

    def __str__(self) -> str:
        rows = [f"{self.name}: p={self.stages}, m={self.microbatches}, v={self.virtual}"]
        for r, acts in enumerate(self.actions):
            rows.append(f"  stage {r}: " + " ".join(str(a) for a in acts if a.op in COMPUTE))
        return "\n".join(rows)


# -- the dependencies --------------------------------------------------------------------------
def with_communication(compute: list[list[Action]], stages: int, virtual: int = 1,
                       placement: str = "loop") -> list[list[Action]]:
    """Insert the messages into per-rank compute lists: a receive right before the action that needs
    a remote input, a send right after the action whose output another rank needs."""
    p, nvs = stages, stages * virtual
    out = []
    for r, acts in enumerate(compute):
        seq = []
        for a in acts:
            vs = virtual_stage(placement, p, r, a.chunk)
            remote_prev = vs > 0 and rank_of(placement, p, vs - 1) != r
            remote_next = vs < nvs - 1 and rank_of(placement, p, vs + 1) != r
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


# name -> builder(stages, microbatches); dualpipe.py adds "dualpipev" (minidist.parallel imports it)
BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}


def make_schedule(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The schedule ``name`` in {"gpipe", "1f1b", "interleaved", "zb-h1", "dualpipev"} (aliases "zero_bubble",
    "dualpipe"); ``virtual`` applies to "interleaved" (DualPipeV always has two chunks per rank)."""
    key = ALIASES.get(name, name)
    if key not in NAMES:
        raise ValueError(f"make_schedule: schedule must be one of {NAMES} (or {sorted(ALIASES)}), got {name!r}")
    if key == "interleaved":
        return interleaved(stages, microbatches, virtual)
    if key == "dualpipev":
        if virtual not in (1, 2):
            raise ValueError(f"make_schedule: dualpipev has 2 chunks per rank; virtual={virtual} does not apply")
    elif virtual != 1:
        raise ValueError(f"make_schedule: virtual={virtual} needs schedule='interleaved', got {name!r}")
    return BUILDERS[key](stages, microbatches)


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
