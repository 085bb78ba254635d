"""``md.dist``: the torch.distributed-like API a rank uses inside ``md.launch``.

Semantics follow torch.distributed so the skill transfers: collectives work in place on the
caller's buffer, ``src``/``dst`` are global ranks even with ``group=``, and ``async_op=True`` (or
``isend``/``irecv``) returns a ``Work`` whose ``wait()`` must be called before the buffer is used.
Buffers are numpy arrays or minidist Tensors (anything with a ``.data`` ndarray).

The same calls run across real machines under MPI: ``md.launch(fn, n, backend="mpi")``, or a script
started by ``mpiexec -n N python script.py`` that calls ``init(backend="mpi")`` first and
``destroy_process_group()`` at the end.

On top of torch's API: ``now()`` (this rank's simulated time), ``compute(...)`` (charge work to
the roofline by hand), ``memory()`` (this rank's ledger) and ``cluster()``.
"""

from __future__ import annotations

import numpy as np

from minidist.runtime.context import current
from minidist.runtime.groups import ProcessGroup
from minidist.runtime.ops import ReduceOp
from minidist.runtime.work import Work

__all__ = [
    "ReduceOp", "Work", "ProcessGroup", "get_rank", "get_world_size", "is_initialized", "new_group",
    "get_group_rank", "get_global_rank", "send", "recv", "isend", "irecv", "now", "compute", "memory", "cluster",
    "broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single", "barrier", "init_device_mesh", "DeviceMesh", "progress",
    "init", "destroy_process_group",
]


# -- buffers -------------------------------------------------------------------------------
def as_array(t, op: str, writable: bool = False) -> np.ndarray:
    """The ndarray behind ``t`` (an ndarray or an object with a ``.data`` ndarray)."""
    arr = t if isinstance(t, np.ndarray) else getattr(t, "data", None)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{op}: expected a numpy array or a Tensor, got {type(t).__name__}")
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{op}: dtype {arr.dtype} cannot be communicated (numeric dtypes only)")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{op}: the buffer of shape {arr.shape} is read-only but {op} writes into it")
    return arr


def contiguous(arr: np.ndarray):
    """(C-contiguous array to work on, function writing it back into ``arr`` or None)."""
    if arr.flags.c_contiguous:
        return arr, None
    tmp = arr.copy(order="C")

    def back():
        arr[...] = tmp

    return tmp, back


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
    return start_rank(cluster, timeout).rank


def destroy_process_group() -> None:
    """Finish the messages in flight and leave the world that ``init`` joined."""
    from minidist.runtime.mpi_worker import stop_rank

    stop_rank()


# -- ranks and groups ----------------------------------------------------------------------
def is_initialized() -> bool:
    from minidist.runtime.context import in_rank

    return in_rank()


def get_rank(group: ProcessGroup | None = None) -> int:
    """This rank's global rank, or its rank inside ``group`` (-1 if not a member)."""
    ctx = current("md.dist.get_rank")
    return ctx.rank if group is None else group.group_rank(ctx.rank)


def get_world_size(group: ProcessGroup | None = None) -> int:
    ctx = current("md.dist.get_world_size")
    return ctx.world_size if group is None else group.size()


def new_group(ranks=None) -> ProcessGroup:
    """A group of the given global ranks (all ranks when None). No communication is needed."""
    ctx = current("md.dist.new_group")
    ranks = range(ctx.world_size) if ranks is None else ranks
    g = ProcessGroup(ranks)
    bad = [r for r in g.ranks if not 0 <= r < ctx.world_size]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are outside the world of {ctx.world_size} ranks")
    return g


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    return group.group_rank(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    return group.global_rank(group_rank)


def cluster():
    """The Cluster this run simulates."""
    return current("md.dist.cluster").cluster


# -- point to point ------------------------------------------------------------------------
def _peer(ctx, peer: int, op: str, role: str, group: ProcessGroup | None) -> int:
    if not isinstance(peer, (int, np.integer)) or not 0 <= peer < ctx.world_size:
        raise ValueError(f"{op}: {role}={peer!r} is not a rank of the world of {ctx.world_size}")
    if peer == ctx.rank:
        raise ValueError(f"{op}: rank {ctx.rank} cannot {op} to/from itself ({role}={peer})")
    if group is not None and (peer not in group or ctx.rank not in group):
        raise ValueError(f"{op}: ranks {ctx.rank} and {peer} must both be in {group}")
    return int(peer)


def _tag(tag, op: str) -> int:
    # a message header carries the tag as a signed 64-bit word; the collectives use the negative ones
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag < 2**63:
        raise ValueError(f"{op}: tag must be an int from 0 to 2**63 - 1, got {tag!r}")
    return int(tag)


def isend(tensor, dst: int, tag: int = 0, group: ProcessGroup | None = None) -> Work:
    """Start sending ``tensor`` to global rank ``dst``; do not modify it before ``wait()``."""
    ctx = current("md.dist.isend")
    dst = _peer(ctx, dst, "send", "dst", group)
    arr = contiguous(as_array(tensor, "send"))[0]
    ready = ctx.clock.begin_comm()
    op = ctx.transport.isend(arr, dst, _tag(tag, "send"), ready)
    return Work(ctx, [op], ready, op.end, f"send->{dst}", arr.nbytes)


def irecv(tensor, src: int, tag: int = 0, group: ProcessGroup | None = None) -> Work:
    """Start receiving into ``tensor`` (in place) from global rank ``src``."""
    ctx = current("md.dist.irecv")
    src = _peer(ctx, src, "recv", "src", group)
    arr, back = contiguous(as_array(tensor, "recv", writable=True))
    ready = ctx.clock.begin_comm()
    op = ctx.transport.irecv(arr, src, _tag(tag, "recv"), ready)
    w = Work(ctx, [op], ready, ready, f"recv<-{src}", arr.nbytes)
    if back is not None:
        wait = w.wait

        def wait_and_copy(timeout=None):
            wait(timeout)
            back()
            return True

        w.wait = wait_and_copy
    return w


def send(tensor, dst: int, tag: int = 0, group: ProcessGroup | None = None) -> None:
    """Send ``tensor`` to ``dst``; returns once ``dst`` has received it. Costs alpha + n/beta."""
    isend(tensor, dst, tag, group).wait()


def recv(tensor, src: int, tag: int = 0, group: ProcessGroup | None = None) -> int:
    """Receive into ``tensor`` from ``src``; returns ``src`` like torch.distributed."""
    irecv(tensor, src, tag, group).wait()
    return src


# -- the simulated device ------------------------------------------------------------------
def now() -> float:
    """This rank's simulated time in seconds: the compute stream, i.e. the program's own time.

    Every sync operation and every ``Work.wait()`` joins the comm stream into it, so it includes all
    communication the program has waited for and excludes async work still in flight.
    """
    return current("md.dist.now").clock.now()


def compute(flops: float = 0.0, bytes: float = 0.0, name: str = "compute", dtype=np.float32,
            seconds: float | None = None) -> float:
    """Charge work to this rank's compute stream by the roofline (or a fixed ``seconds``); returns its cost."""
    clock = current("md.dist.compute").clock
    if seconds is not None:
        clock.charge_compute_seconds(name, seconds)
        return float(seconds)
    return clock.charge_compute(name, flops, bytes, dtype)


def progress(done: int, total: int, what: str = "step") -> None:
    """Report that this rank has done ``done`` of ``total`` units of work (shown while the launch runs)."""
    report = getattr(current("md.dist.progress"), "report_progress", None)
    if report is not None:
        report(int(done), int(total), str(what))


def memory():
    """This rank's MemoryLedger (categories params, grads, optimizer, activations, buffers)."""
    return current("md.dist.memory").memory


# -- collectives (implemented in minidist.collectives) ------------------------------------
from minidist.collectives.api import (  # noqa: E402
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter_tensor,
    scatter,
)
from minidist.runtime.mesh import DeviceMesh, init_device_mesh  # noqa: E402,F401
