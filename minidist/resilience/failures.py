"""Failures on the simulated clock, and the arithmetic of surviving them (chapter 26, lab 17).

Components fail independently, so failure rates add: ``n`` parts of MTBF ``M`` each fail together at
rate ``lambda = n / M``, a system MTBF of ``M / n``. Without checkpoints a job of length ``T`` restarts
from zero at every failure, and its expected completion time ``(e^{lambda T} - 1) / lambda`` explodes.
With a checkpoint every ``I`` seconds that costs ``C`` to write, each interval pays ``C`` and each
failure loses on average half an interval, so the overhead per second is ``C / I + lambda I / 2``,
smallest at ``I* = sqrt(2 C / lambda) = sqrt(2 C MTBF)`` (Young 1974, Daly 2006).

:class:`Faults` says what goes wrong in a training run of ``md.parallel.train``: named ranks killed at
named steps, failures arriving as a Poisson process of given MTBF on the simulated clock, slow ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def system_mtbf(component_mtbf: float, count: int) -> float:
    """MTBF of ``count`` independent components of MTBF ``component_mtbf`` (any failure stops the job)."""
    if not component_mtbf > 0 or count < 1:
        raise ValueError(f"system_mtbf: component_mtbf must be > 0 and count >= 1, got {component_mtbf}, {count}")
    return component_mtbf / count


def expected_completion(work: float, mtbf: float) -> float:
    """Expected time to finish ``work`` seconds restarting from zero at each failure: (e^{T/M} - 1) M."""
    if not (work >= 0 and mtbf > 0):
        raise ValueError(f"expected_completion: work must be >= 0 and mtbf > 0, got {work}, {mtbf}")
    return math.expm1(work / mtbf) * mtbf


def young_daly_interval(checkpoint_seconds: float, mtbf: float) -> float:
    """The checkpoint interval that minimises the expected overhead: sqrt(2 C MTBF)."""
    if not (checkpoint_seconds > 0 and mtbf > 0):
        raise ValueError(f"young_daly_interval: both must be > 0, got {checkpoint_seconds}, {mtbf}")
    return math.sqrt(2 * checkpoint_seconds * mtbf)


def overhead(interval: float, checkpoint_seconds: float, mtbf: float) -> float:
    """First-order expected overhead per second of work: C / I + I / (2 MTBF)."""
    if not (interval > 0 and mtbf > 0 and checkpoint_seconds >= 0):
        raise ValueError(f"overhead: interval and mtbf must be > 0, got {interval}, {mtbf}")
    return checkpoint_seconds / interval + interval / (2 * mtbf)


class RankFailure(RuntimeError):
    """A rank failed (by the fault plan) and the run was not allowed to restart."""


@dataclass(frozen=True)
class Faults:
    """What goes wrong in a run: ``kill`` ((rank, step) pairs: that rank dies as it starts that step, once);
    ``mtbf`` (simulated seconds: failures of a random rank arrive as a Poisson process, drawn from
    ``seed``); ``slow`` ({rank: factor}: that rank's compute takes ``factor`` times longer);
    ``restart_seconds`` (simulated time to reschedule and reload after a failure); ``hang`` ({rank: step}:
    that rank stops making progress as it starts that step, in its own code, as a GPU stuck in a kernel or a
    process deadlocked on a lock would; its peers wait until the launch's timeout). ``in_place=True``:
    an MTBF failure is survived inside the launch - every rank rolls back to the newest checkpoint, as an
    elastic agent restarting the job on the same machines would - instead of ending the processes; the
    arithmetic is the same, without the wall-clock cost of new processes (for sweeps). ``spike`` ({rank: bytes}:
    that rank holds that many bytes more, as buffers, through every step: a temporary kept alive or oversized,
    the memory fault of lab 23)."""

    kill: tuple[tuple[int, int], ...] = ()
    mtbf: float | None = None
    seed: int = 0
    slow: dict = field(default_factory=dict)
    restart_seconds: float = 0.0
    in_place: bool = False
    hang: dict = field(default_factory=dict)
    spike: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for pair in self.kill:
            if len(pair) != 2 or not all(isinstance(x, int) and x >= 0 for x in pair):
                raise ValueError(f"Faults: kill holds (rank, step) pairs of ints >= 0, got {pair!r}")
        if self.mtbf is not None and not (isinstance(self.mtbf, (int, float)) and self.mtbf > 0):
            raise ValueError(f"Faults: mtbf must be None or > 0 simulated seconds, got {self.mtbf!r}")
        for r, f in self.slow.items():
            if not (isinstance(r, int) and r >= 0 and f >= 1):
                raise ValueError(f"Faults: slow maps a rank to a factor >= 1, got {r!r}: {f!r}")
        for r, step in self.hang.items():
            if not (isinstance(r, int) and r >= 0 and isinstance(step, int) and step >= 0):
                raise ValueError(f"Faults: hang maps a rank to the step it hangs at (ints >= 0), got {r!r}: {step!r}")
        for r, n in self.spike.items():
            if not (isinstance(r, int) and r >= 0 and n >= 0):
                raise ValueError(f"Faults: spike maps a rank to the bytes it holds more (>= 0), got {r!r}: {n!r}")
        if not self.restart_seconds >= 0:
            raise ValueError(f"Faults: restart_seconds must be >= 0, got {self.restart_seconds!r}")
        if self.in_place and (self.mtbf is None or self.kill):
            raise ValueError("Faults: in_place=True rolls back MTBF failures; give mtbf and no kill")

    def in_place_arrivals(self):
        """The failure times of an in-place run: a Poisson process of rate 1/mtbf (each next one drawn
        from the failure before it), the same on every rank."""
        rng = np.random.default_rng([self.seed, 1 << 20])
        t = 0.0
        while True:
            t += float(rng.exponential(self.mtbf))
            yield t

    @property
    def timing_only(self) -> bool:
        """Only slow ranks and memory spikes: faults that change what a step costs, never its values, so a
        shape-only run can carry them."""
        return not (self.kill or self.mtbf is not None or self.hang)

    def check(self, world_size: int) -> None:
        bad = [r for r, _ in self.kill if r >= world_size] + [r for r in [*self.slow, *self.hang, *self.spike]
                                                            if r >= world_size]
        if bad:
            raise ValueError(f"Faults: rank(s) {bad} outside the {world_size} ranks of the layout")

    def arrivals(self, attempt: int, world_size: int) -> tuple[float, int] | None:
        """The failure of this attempt under the MTBF process: (simulated seconds after the attempt starts,
        rank), or None without one. Memoryless, so each attempt draws afresh."""
        if self.mtbf is None or self.in_place:
            return None
        rng = np.random.default_rng([self.seed, attempt])
        return float(rng.exponential(self.mtbf)), int(rng.integers(world_size))
