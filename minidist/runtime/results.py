"""What a launch hands back, whichever backend ran it: the ``LaunchResult``, or the ``RankError`` built from the
ranks' errors (``failure``); and the check of a number of seconds every timeout argument goes through.

The process launcher (``launch.py``), the thread one (``inprocess_launch.py``) and the MPI one (``mpi_launch.py``)
all return and raise these, so they live below all three.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import dill

from minidist.runtime.errors import RankError


class LaunchResult(Sequence):
    """The ranks' return values in rank order, plus what the simulation measured.

    ``times[r]``: rank r's final simulated time in seconds (all its streams finished);
    ``memory[r]``: its MemoryLedger; ``trace``: every rank's events; ``stdout[r]``: what it printed;
    ``wall``: the real seconds the launch took (under MPI: from mpiexec's start to its end).
    """

    def __init__(self, values, times, memory, trace, stdout, wall: float | None = None) -> None:
        self.values, self.times, self.memory, self.trace, self.stdout = values, times, memory, trace, stdout
        self.wall = wall

    def __getitem__(self, i):
        return self.values[i]

    def __len__(self) -> int:
        return len(self.values)

    @property
    def time(self) -> float:
        """The run's simulated duration: the slowest rank's time."""
        return max(self.times, default=0.0)

    def __repr__(self) -> str:
        return f"LaunchResult({self.values!r}, time={self.time:.6g} s)"


def positive_seconds(value: object) -> bool:
    """Whether ``value`` is a finite positive number of seconds (a bool, a string or NaN is not)."""
    return (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
            and value > 0)


def failure(errors: dict, order: list[int]) -> RankError:
    """One error for the caller: the first real failure with its traceback, then every other rank's.

    A rank that stopped only because a peer failed (aborted, or waiting on a peer that exited) is a
    consequence, not the cause, so the root cause is reported first whatever order the ranks died in.
    """
    consequences = ("RankAborted", "PeerExitedError", "Terminated")
    real = ([r for r in order if errors[r][0] not in consequences]
            or [r for r in order if errors[r][0] != "RankAborted"] or order)
    first = real[0]
    name, msg, tb, exc = errors[first][:4]
    lines = [f"rank {first} failed with {name}: {msg}"]
    others = [r for r in sorted(errors) if r != first]
    if others:
        lines.append("other ranks: " + "; ".join(f"rank {r}: {errors[r][0]}: {errors[r][1]}" for r in others))
    if tb:
        where = "where it was" if name == "DeadlineExceeded" else "traceback"
        lines.append(f"\n--- {where} of rank {first} ---\n{tb.rstrip()}")
    obj = None
    if exc is not None:
        try:
            obj = dill.loads(exc)
        except Exception:
            obj = None
    return RankError("\n".join(lines), rank=first, errors={r: errors[r][:3] for r in errors}, exc=obj)
