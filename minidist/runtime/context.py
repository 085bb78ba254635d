"""The state of the rank this process is playing: its clock, ledger, transport and groups.

``launch`` creates one RankContext in each rank process; ``md.dist`` functions find it here.
"""

from __future__ import annotations

from minidist.hardware.clock import Clock
from minidist.hardware.cluster import Cluster
from minidist.hardware.memory import MemoryLedger
from minidist.runtime.groups import ProcessGroup


class RankContext:
    def __init__(self, rank: int, world_size: int, cluster: Cluster, clock: Clock, memory: MemoryLedger,
                 transport, timeout: float) -> None:
        self.rank, self.world_size, self.cluster = rank, world_size, cluster
        self.clock, self.memory, self.transport, self.timeout = clock, memory, transport, timeout
        self.world = ProcessGroup(range(world_size))
        self.seq: dict[int, int] = {}  # group key -> number of collectives started on it
        self.plans: dict = {}  # what the collectives layer remembers about each distinct call it made
        self.last_plan: tuple | None = None  # (key, plan) of the latest call: a loop of one call finds it at once
        self.standalone = False  # joined by md.dist.init (MPI), not started by md.launch
        self.destroyed = False  # md.dist.destroy_process_group was called inside md.launch

    def next_seq(self, group: ProcessGroup) -> int:
        s = self.seq.get(group.key, 0) + 1
        self.seq[group.key] = s
        return s


_current: RankContext | None = None


def set_current(ctx: RankContext | None) -> None:
    global _current
    _current = ctx


def current(what: str = "md.dist") -> RankContext:
    """The running rank's context; a clear error when called outside ``md.launch``."""
    if _current is None:
        raise RuntimeError(
            f"{what} needs a simulated rank: call it inside a function run by md.launch(fn, world_size)"
        )
    if _current.destroyed:
        raise RuntimeError(
            f"{what}: rank {_current.rank} called md.dist.destroy_process_group() earlier, so it has no process "
            f"group any more; inside md.launch a rank's world ends when fn returns: call it last, or not at all")
    return _current


def in_rank() -> bool:
    return _current is not None
