"""``launch``: run a function on ``world_size`` simulated devices, each a real process.

The parent creates the shared segment and one doorbell per rank (a pipe), starts the ranks with
the ``multiprocess`` package (dill pickling, so a function typed in a notebook cell works) and
waits for their reports on pipes. Each rank (``rank_process.py``) captures its printed output and
sends back its return value, simulated time, memory ledger and trace events; the parent shows the
output as it comes (``live.py``). Failures end quickly and cleanly: the first exception aborts every
other rank at its next communication call, the parent re-raises it with the failing rank's
traceback, a rank that overstays the launch's limits is stopped and reported with the line it was
on, and no process or shared-memory segment survives the call (nor a Ctrl-C, nor a killed parent).

This module checks the arguments and runs the phases in order; starting the ranks is ``launch_start.py`` (the
segment, the open files, the start method), watching them and collecting their reports ``launch_watch.py``.
"""

from __future__ import annotations

import errno
import numbers
import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext

import multiprocess

from minidist.hardware.cluster import Cluster
from minidist.runtime import context, pickling, shm
from minidist.runtime.doorbell import Doorbell
from minidist.runtime.inprocess_launch import launch_inprocess
from minidist.runtime.launch_start import (
    AS_THREADS,
    START_METHODS,
    default_start_method,
    enough_files,
    spawning,
    start_failed,
)
from minidist.runtime.launch_start import Segment as _Segment  # the old name: tests replace it here
from minidist.runtime.launch_start import channel_layout as _layout  # the old name: tests import it from here
from minidist.runtime.launch_watch import Interrupts, Ranks
from minidist.runtime.live import LiveView
from minidist.runtime.mpi_launch import launch_mpi
from minidist.runtime.rank_process import rank_main
from minidist.runtime.results import LaunchResult, positive_seconds

# ranks as processes need POSIX: shared memory by name, pipes to poll, signals to stop them and ask where they are
_POSIX = os.name == "posix"


def launch(
    fn: Callable,
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    cluster: Cluster | None = None,
    timeout: float = 60.0,
    start_method: str | None = None,
    quiet: bool = False,
    deadline: float | None = None,
    backend: str = "sim",
    represent: Callable[[int], int] | None = None,
) -> LaunchResult:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` simulated devices and collect what they return.

    ``cluster`` (default: DGX H100 nodes) gives the GPUs and links the clocks charge. ``timeout`` is
    how many seconds a rank may wait inside one communication call before the run stops with a
    report of who waits for whom; once a rank has returned, the others have ``timeout`` seconds to
    return too. ``deadline`` (seconds, default none) bounds the whole launch. A rank that overstays
    either limit is stopped and reported with the line it was running. ``start_method`` is "fork"
    (default on Linux: fast), "spawn" (the default elsewhere) or "forkserver"; ranks started fresh get ``fn`` by
    value and do not re-run the launching script, so it needs no ``if __name__ == "__main__"`` guard.
    ``backend="mpi"`` starts the ranks with ``mpiexec`` instead, one MPI process each, exchanging their messages
    over MPI (``mpi_launch.py``; the simulated clocks run as usual);
    ``backend="inprocess"`` runs them as threads of this process taking turns (``inprocess_launch.py``: the same
    results and clocks, no process started, for shape-only runs of many ranks); with it, ``represent`` maps each
    rank to the rank that stands for it, and only those run (shape-only arrays, symmetric collectives: see
    ``inprocess_transport.py``).
    What ranks print is shown as it happens in a long launch and grouped by rank otherwise, with the
    progress ranks report through ``md.dist.progress`` (see live.py; ``quiet=True`` keeps the output in
    ``result.stdout`` only). Raises RankError if any rank raises.
    """
    if context.in_rank():
        raise RuntimeError("md.launch cannot be called from inside a rank")
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function to run on every rank, got {type(fn).__name__} {fn!r:.60}")
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"launch: world_size must be a positive int, got {world_size!r}")
    world_size = int(world_size)  # np.int64(2) is a fine world size
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"launch: args must be a tuple of fn's positional arguments (args=(x,) for one), "
                        f"got {type(args).__name__} {args!r:.60}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"launch: kwargs must be a dict of fn's keyword arguments, got {type(kwargs).__name__} "
                        f"{kwargs!r:.60}")
    if cluster is not None and not isinstance(cluster, Cluster):
        raise TypeError(f"launch: cluster must be a md.Cluster (md.Cluster.dgx_h100(nodes=2), say), got "
                        f"{type(cluster).__name__} {cluster!r:.60}")
    args, kwargs = tuple(args), (dict(kwargs) if kwargs is not None else None)  # plain ones travel under any start
    if not positive_seconds(timeout):
        raise ValueError(f"launch: timeout must be a positive number of seconds, got {timeout!r}")
    timeout = float(timeout)
    if deadline is not None and not positive_seconds(deadline):
        raise ValueError(f"launch: deadline must be None or a positive number of seconds, got {deadline!r}")
    if backend not in ("sim", "mpi", "inprocess"):
        raise ValueError(f"launch: backend must be 'sim' (shared memory), 'mpi' or 'inprocess', got {backend!r}")
    if backend != "inprocess" and not _POSIX:
        raise OSError(f"launch: backend={backend!r} runs each rank as a process, which needs Linux or macOS; on "
                      f"Windows run minidist under WSL, or pass backend='inprocess' (every rank a thread of this "
                      f"process, taking turns: the same results and clocks)")
    if represent is not None and backend != "inprocess":
        raise ValueError("launch: represent= needs backend='inprocess' (the other backends run every rank)")
    if backend == "inprocess":
        if start_method is not None:
            raise ValueError("launch: start_method applies to backend='sim' only (inprocess ranks are threads)")
        return launch_inprocess(fn, world_size, args, kwargs, cluster, timeout, quiet, deadline, represent)
    if backend == "mpi":
        if start_method is not None:
            raise ValueError("launch: start_method applies to backend='sim' only (mpiexec starts MPI ranks)")
        return launch_mpi(fn, world_size, args, kwargs, cluster, timeout, quiet, deadline)
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"launch: start_method must be 'fork', 'spawn' or 'forkserver', got {start_method!r}")
    if start_method is None:
        start_method = default_start_method()
    mp = multiprocess.get_context(start_method)
    payload = (fn, args, kwargs)
    if start_method != "fork":
        try:
            payload = (pickling.dumps(payload), (), None)
        except Exception as e:
            raise TypeError(f"launch: fn and its arguments must be picklable to start ranks with "
                            f"start_method={start_method!r}: {type(e).__name__}: {e}") from e
    cluster = (cluster if cluster is not None else Cluster.dgx_h100()).for_world(world_size)
    layout = _layout(world_size, named=start_method != "fork")
    layout_args = (layout.slot_bytes, layout.nslots)
    enough_files(world_size)
    with Interrupts() as interrupts:
        fork = start_method == "fork"
        try:
            seg = _Segment(layout.size, fork)
        except OSError as e:
            if not fork and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOSYS):
                raise OSError(e.errno, f"launch: ranks started by {start_method} open the channels by name in POSIX "
                                       f"shared memory (/dev/shm on Linux), which refused it here ({e.strerror}); "
                                       f"start_method='fork' (Linux) needs no name, or {AS_THREADS}") from e
            if e.errno not in (errno.ENOMEM, errno.ENOSPC, errno.EFBIG):
                raise
            raise OSError(e.errno, f"launch: the system would not reserve {layout.size / 2**20:,.0f} MB of shared "
                                   f"memory for the channels of {world_size} ranks ({e.strerror}); use fewer ranks, "
                                   f"or {AS_THREADS}") from e
        mm = seg.mm
        procs, readers, bells = [], {}, []
        board = shm.Board(mm, layout)
        live = LiveView(world_size, quiet)
        ranks = Ranks(world_size, procs, readers, board, bells, live, timeout, deadline, fork)
        try:
            r = 0  # the rank being set up, for the error if the system refuses
            try:
                for _ in range(world_size):
                    bells.append(Doorbell())
                with nullcontext() if fork else spawning():
                    for r in range(world_size):
                        rd, wr = mp.Pipe(duplex=False)
                        readers[rd] = r
                        p = mp.Process(target=rank_main, name=f"minidist-rank-{r}", daemon=True,
                                       args=(r, world_size, *payload, cluster, seg.for_rank(), layout_args,
                                             bells, wr, timeout, os.getpid()))
                        try:
                            p.start()
                        finally:
                            wr.close()
                        procs.append(p)
                        interrupts.check()
            except OSError as e:
                why = start_failed(e, r, world_size)
                if why is None:
                    raise
                raise why from e
            ranks.collect(interrupts)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join()
            for c in readers:
                c.close()
            seg.close()
            for b in bells:
                b.close()
            del board
    res = ranks.result()
    res.wall = time.monotonic() - ranks.t0
    return res
