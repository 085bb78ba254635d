"""``md.dist``'s process-group calls, as torch.distributed has them: joining and leaving a world (``init``,
``destroy_process_group``), this rank and the world (``get_rank``, ``get_world_size``, ``is_initialized``), groups
(``new_group``, translating ranks between a group and the world) and the simulated ``cluster``. ``dist.py``
re-exports them beside the point-to-point calls and the collectives.
"""

from __future__ import annotations

import warnings

import numpy as np

from minidist.runtime.context import current
from minidist.runtime.groups import ProcessGroup


# -- joining a world without md.launch ------------------------------------------------------
def init(backend: str = "mpi", cluster=None, timeout: float = 60.0) -> int:
    """Make this process a rank of the MPI job it runs in (``mpiexec -n N python script.py``); returns its rank.

    ``cluster`` is the hardware the simulated clocks charge (default: DGX H100 nodes), ``timeout`` how long a
    communication call may wait. Only ``backend="mpi"``: the simulator's ranks are started by ``md.launch``.
    """
    from minidist.runtime.context import in_rank
    from minidist.runtime.mpi_worker import start_rank

    if backend != "mpi":
        raise ValueError(f"md.dist.init: backend must be 'mpi' (simulated ranks are started by md.launch), got "
                         f"{backend!r}")
    if in_rank():
        raise RuntimeError("md.dist.init: this process is already a rank (init was called twice, or inside md.launch)")
    ctx = start_rank(cluster, timeout)
    ctx.standalone = True
    return ctx.rank


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the world: after ``init``, finish the messages in flight and detach from MPI; inside ``md.launch``,
    this rank's later ``md.dist`` calls raise, as torch's do (the rank's world itself ends when fn returns).

    A ``group`` holds nothing to free here, so destroying one does nothing."""
    from minidist.runtime.mpi_worker import stop_rank

    if group is not None:
        _group(group, "destroy_process_group")
        return
    ctx = current("md.dist.destroy_process_group")
    if ctx.standalone:
        stop_rank()
    else:
        ctx.destroyed = True


# -- ranks and groups ----------------------------------------------------------------------
def is_initialized() -> bool:
    from minidist.runtime import context

    return context.in_rank() and not context._current.destroyed


class group:
    """``group.WORLD``: the default group, as in torch.distributed (``None`` means the same everywhere here)."""

    WORLD = None


def _group(group, op: str) -> ProcessGroup | None:
    if group is not None and not isinstance(group, ProcessGroup):
        hint = ""
        if op in ("send", "recv") and isinstance(group, (int, np.integer)):
            hint = f" (torch.distributed's order puts group before tag: pass tag={group} by name)"
        raise TypeError(f"{op}: group must be a ProcessGroup (from md.dist.new_group or a mesh) or None, got "
                        f"{type(group).__name__} {group!r:.40}{hint}")
    return group


def _not_in(ctx, group: ProcessGroup | None, op: str) -> bool:
    """True (after a warning) if this rank is not in ``group``: there, as in torch.distributed, a call does nothing."""
    if group is None or ctx.rank in group:
        return False
    warnings.warn(f"md.dist.{op}: rank {ctx.rank} is not a member of {group}, so the call does nothing on it "
                  f"(as in torch.distributed)", stacklevel=3)
    return True


def get_rank(group: ProcessGroup | None = None) -> int:
    """This rank's global rank, or its rank inside ``group`` (-1 if not a member)."""
    ctx = current("md.dist.get_rank")
    return ctx.rank if group is None else _group(group, "get_rank").group_rank(ctx.rank)


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in the world, or in ``group`` (-1 if this rank is not a member, as in torch)."""
    ctx = current("md.dist.get_world_size")
    if _group(group, "get_world_size") is None:
        return ctx.world_size
    return group.size() if ctx.rank in group else -1


def new_group(ranks=None) -> ProcessGroup:
    """A group of the given global ranks (all ranks when None). No communication is needed."""
    ctx = current("md.dist.new_group")
    ranks = range(ctx.world_size) if ranks is None else ranks
    g = ProcessGroup(ranks)
    bad = [r for r in g.ranks if not 0 <= r < ctx.world_size]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are outside the world of {ctx.world_size} ranks")
    return g


def get_group_rank(group: ProcessGroup | None, global_rank: int) -> int:
    """The rank of global rank ``global_rank`` inside ``group`` (ValueError if it is not a member)."""
    if _group(group, "get_group_rank") is None:
        return _world_rank(global_rank, "get_group_rank")
    r = group.group_rank(global_rank)
    if r < 0:
        raise ValueError(f"get_group_rank: global rank {global_rank!r} is not part of {group}")
    return r


def get_global_rank(group: ProcessGroup | None, group_rank: int) -> int:
    """The global rank of rank ``group_rank`` of ``group`` (ValueError if the group has no such rank)."""
    if _group(group, "get_global_rank") is None:
        return _world_rank(group_rank, "get_global_rank")
    return group.global_rank(group_rank)


def _world_rank(rank, op: str) -> int:
    world = current(f"md.dist.{op}").world_size
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError(f"{op}: rank {rank!r} is not part of the world of {world} ranks")
    return int(rank)


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The global ranks of ``group``, in group-rank order."""
    if _group(group, "get_process_group_ranks") is None:
        return list(range(current("md.dist.get_process_group_ranks").world_size))
    return list(group.ranks)


def cluster():
    """The Cluster this run simulates."""
    return current("md.dist.cluster").cluster
