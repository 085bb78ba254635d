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

import datetime
import pickle

import numpy as np

from minidist.collectives.buffers import as_array, contiguous
from minidist.runtime.context import current
from minidist.runtime.groups import ProcessGroup
from minidist.runtime.ops import ReduceOp
from minidist.runtime.process_groups import (  # noqa: F401  (md.dist's own names)
    _group,
    _not_in,
    cluster,
    destroy_process_group,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init,
    is_initialized,
    new_group,
)
from minidist.runtime.results import positive_seconds
from minidist.runtime.work import Work

__all__ = [
    "ReduceOp", "Work", "ProcessGroup", "get_rank", "get_world_size", "is_initialized", "new_group",
    "get_group_rank", "get_global_rank", "get_process_group_ranks", "group", "send", "recv", "isend", "irecv",
    "P2POp", "batch_isend_irecv", "all_to_all", "reduce_scatter", "broadcast_object_list", "all_gather_object",
    "gather_object", "scatter_object_list",
    "now", "compute", "memory", "cluster",
    "broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single", "barrier", "init_device_mesh", "DeviceMesh", "progress",
    "init", "destroy_process_group", "get_backend", "monitored_barrier", "send_object_list", "recv_object_list",
]


# -- point to point ------------------------------------------------------------------------
def _peer(ctx, peer, group_peer, op: str, role: str, group: ProcessGroup | None) -> int:
    if group_peer is not None:  # torch's group_dst / group_src: a rank of ``group`` instead of a global one
        if peer is not None:
            raise ValueError(f"{op}: give {role} or group_{role}, not both")
        if group is None:
            raise ValueError(f"{op}: group_{role}={group_peer!r} needs group=")
        peer = group.global_rank(group_peer)
    if peer is None and role == "src":
        raise ValueError(f"{op}: minidist receives only from a named sender: pass src (a global rank)")
    if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < ctx.world_size:
        raise ValueError(f"{op}: {role}={peer!r} is not a rank of the world of {ctx.world_size}")
    if peer == ctx.rank:
        raise ValueError(f"{op}: rank {ctx.rank} cannot {op} to/from itself ({role}={peer})")
    if group is not None and peer not in group:
        raise ValueError(f"{op}: {role}={peer} is not in {group}")
    return int(peer)


def _tag(tag, op: str) -> int:
    # a message header carries the tag as a signed 64-bit word; the collectives use the negative ones
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag < 2**63:
        raise ValueError(f"{op}: tag must be an int from 0 to 2**63 - 1, got {tag!r}")
    return int(tag)


def isend(tensor, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to global rank ``dst``; do not modify it before ``wait()``.

    The arguments are torch.distributed's, in its order: ``group`` before ``tag``."""
    ctx = current("md.dist.isend")
    if _not_in(ctx, _group(group, "send"), "isend"):
        return None
    dst = _peer(ctx, dst, group_dst, "send", "dst", group)
    arr = contiguous(as_array(tensor, "send"))[0]
    ready = ctx.clock.begin_comm()
    op = ctx.transport.isend(arr, dst, _tag(tag, "send"), ready)
    return Work(ctx, [op], ready, op.end, f"send->{dst}", arr.nbytes, result=[tensor])


def irecv(tensor, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` (in place) from global rank ``src``."""
    ctx = current("md.dist.irecv")
    if _not_in(ctx, _group(group, "recv"), "irecv"):
        return None
    src = _peer(ctx, src, group_src, "recv", "src", group)
    arr, back = contiguous(as_array(tensor, "recv", writable=True))
    ready = ctx.clock.begin_comm()
    op = ctx.transport.irecv(arr, src, _tag(tag, "recv"), ready)
    w = Work(ctx, [op], ready, ready, f"recv<-{src}", arr.nbytes, result=[tensor])
    w.source = src
    if back is not None:
        wait = w.wait

        def wait_and_copy(timeout=None):
            wait(timeout)
            back()
            return True

        w.wait = wait_and_copy
    return w


def send(tensor, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to ``dst``; returns once ``dst`` has received it. Costs alpha + n/beta."""
    w = isend(tensor, dst, group, tag, group_dst)
    if w is not None:
        w.wait()


def recv(tensor, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src``; returns the sender's global rank (-1 off ``group``), as torch does."""
    w = irecv(tensor, src, group, tag, group_src)
    if w is None:
        return -1
    w.wait()
    return w.source


class P2POp:
    """One point-to-point operation for ``batch_isend_irecv``: ``op`` is ``isend`` or ``irecv`` (torch's P2POp)."""

    def __init__(self, op, tensor, peer: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
                 group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            raise ValueError(f"P2POp: op must be md.dist.isend or md.dist.irecv, got {op!r:.60}")
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer


def batch_isend_irecv(p2p_op_list: list) -> list[Work]:
    """Start every operation of ``p2p_op_list`` (P2POps) at once; returns their Works, in order.

    Sends here never wait for their receiver to be ready, so starting them one by one in the list's order
    cannot deadlock: the batch needs no more than that (torch fuses the batch into one NCCL group)."""
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(o, P2POp) for o in p2p_op_list):
        raise TypeError("batch_isend_irecv: p2p_op_list must be a list of md.dist.P2POp")
    works = [o.op(o.tensor, o.peer, o.group, o.tag, o.group_peer) for o in p2p_op_list]
    return [w for w in works if w is not None]


def send_object_list(object_list: list, dst: int | None = None, group: ProcessGroup | None = None,
                     device: object = None, group_dst: int | None = None) -> None:
    """Send the picklable objects of ``object_list`` to ``dst``, as torch does: their pickled sizes (int64), then
    their bytes. The receiver passes a list of the same length to ``recv_object_list``. ``device`` is accepted
    for torch's signature and ignored (there are no devices to stage on)."""
    del device
    if not isinstance(object_list, list) or not object_list:
        raise ValueError(f"send_object_list: object_list must be a non-empty list, got {object_list!r:.60}")
    blobs = [pickled(o, "send_object_list", f"object_list[{i}]") for i, o in enumerate(object_list)]
    send(np.array([len(b) for b in blobs], np.int64), dst, group, group_dst=group_dst)
    send(np.frombuffer(b"".join(blobs), np.uint8), dst, group, group_dst=group_dst)


def recv_object_list(object_list: list, src: int | None = None, group: ProcessGroup | None = None,
                     device: object = None, group_src: int | None = None) -> int:
    """Fill ``object_list`` in place with the objects ``src`` sent by ``send_object_list`` (a list of the same
    length); returns the sender's global rank, as torch does. Unpickling runs what the pickle says: use it
    between your own ranks only."""
    del device
    if not isinstance(object_list, list) or not object_list:
        raise ValueError(f"recv_object_list: object_list must be a non-empty list (as long as the sender's), got "
                         f"{object_list!r:.60}")
    sizes = np.zeros(len(object_list), np.int64)
    sender = recv(sizes, src, group, group_src=group_src)
    if sender < 0:
        return sender
    data = np.empty(int(sizes.sum()), np.uint8)
    recv(data, sender)
    at = 0
    for i, n in enumerate(sizes):
        object_list[i] = pickle.loads(data[at:at + n].tobytes())
        at += n
    return sender


def get_backend(group: ProcessGroup | None = None) -> str:
    """The backend this rank runs on: "sim" (processes over shared memory), "inprocess" or "mpi"."""
    ctx = current("md.dist.get_backend")
    _group(group, "get_backend")
    return ctx.transport.backend


def monitored_barrier(group: ProcessGroup | None = None, timeout: float | datetime.timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """torch's debugging barrier: return once every rank of ``group`` has arrived, or raise ``CommTimeoutError``
    after ``timeout`` (seconds or a ``datetime.timedelta``; default: the launch's) naming what this rank still
    waits for. The launch's report then says what every other rank is doing, so ``wait_all_ranks`` (torch's
    switch between the first missing rank and all of them) changes nothing here. The timeout is wall time, so it
    applies to ranks as processes (the simulator and MPI); under ``backend="inprocess"`` the ranks take turns, a
    rank busy in its own code holds the others back before they reach the barrier, and a rank that never arrives
    is found at once by deadlock detection instead."""
    del wait_all_ranks
    ctx = current("md.dist.monitored_barrier")
    if timeout is None:
        barrier(group)
        return
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if not positive_seconds(seconds):
        raise ValueError(f"monitored_barrier: timeout must be a positive number of seconds or a timedelta, "
                         f"got {timeout!r}")
    before, ctx.transport.timeout = ctx.transport.timeout, float(seconds)
    try:
        barrier(group)
    finally:
        ctx.transport.timeout = before


# -- the simulated device ------------------------------------------------------------------
def now() -> float:
    """This rank's simulated time in seconds: the compute stream, i.e. the program's own time.

    Every sync operation and every ``Work.wait()`` joins the comm stream into it, so it includes all
    communication the program has waited for and excludes async work still in flight.
    """
    return current("md.dist.now").clock.now()


def compute(flops: float = 0.0, bytes: float = 0.0, name: str = "compute", dtype=np.float32,
            seconds: float | None = None, shape: tuple = ()) -> float:
    """Charge work to this rank's compute stream (or a fixed ``seconds``); returns its cost. The cluster's device
    model prices it: the roofline, or on a measured device the kernels an op called ``name`` launches (``shape``
    as the autograd reports it: ``(batch, m, k, n)`` for ``name="matmul"``, see ``md.autograd.cost``)."""
    clock = current("md.dist.compute").clock
    if seconds is not None:
        clock.charge_compute_seconds(name, seconds)
        return float(seconds)
    return clock.charge_compute(name, flops, bytes, dtype, tuple(shape))


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
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from minidist.collectives.objects import (  # noqa: E402
    all_gather_object,
    broadcast_object_list,
    gather_object,
    pickled,
    scatter_object_list,
)
from minidist.runtime.mesh import DeviceMesh, init_device_mesh  # noqa: E402,F401
