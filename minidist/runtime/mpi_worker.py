"""One rank under ``mpiexec``: the MPI counterpart of ``rank_process.py``.

``start_rank`` turns the current MPI process into a minidist rank (clock, ledger, recorder, MPI
transport, ``md.dist`` context); ``md.dist.init(backend="mpi")`` calls it in a user's script.
``python -m minidist.runtime.mpi_worker DIR`` is what ``md.launch(..., backend="mpi")`` runs on every
rank: it loads the function and its arguments from ``DIR/payload``, runs it with the output captured
(and copied line by line to ``DIR/<rank>.out``, which the launcher shows as it grows), and writes the
same report ``rank_process`` sends over its pipe to ``DIR/<rank>.report``. A rank that raises writes its
report and then aborts the whole MPI job, so no peer waits for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import traceback

import dill

from minidist.autograd.cost import set_cost_hook
from minidist.hardware.clock import Clock
from minidist.hardware.cluster import Cluster
from minidist.hardware.memory import MemoryLedger
from minidist.hardware.trace import Recorder
from minidist.runtime import context, pickling
from minidist.runtime.errors import reason
from minidist.runtime.live import RankStream
from minidist.runtime.mpi_launch import mpi_segments, record_segments, remove_segments
from minidist.runtime.mpi_transport import MPITransport


def mpi_world():
    """COMM_WORLD, or an ImportError that says how to get MPI."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("the MPI backend needs mpi4py and an MPI library: pip install -e '.[mpi]' "
                          "(mpi4py and MPICH as packages), or mpi4py built against your cluster's MPI") from e
    return MPI.COMM_WORLD


def start_rank(cluster: Cluster | None = None, timeout: float = 60.0) -> context.RankContext:
    """Make this MPI process rank ``COMM_WORLD.rank`` of a minidist world (``md.dist`` works afterwards)."""
    world = mpi_world()
    rank, size = world.Get_rank(), world.Get_size()
    cluster = (cluster if cluster is not None else Cluster.dgx_h100()).for_world(size)
    recorder = Recorder(rank)
    clock = Clock(rank, cluster, recorder)
    ledger = MemoryLedger(cluster.hbm, rank)
    ledger.attach_clock(clock.now)
    transport = MPITransport(world, clock, timeout)
    ctx = context.RankContext(rank, size, cluster, clock, ledger, transport, timeout)
    ctx.recorder = recorder
    context.set_current(ctx)
    set_cost_hook(clock.hook)
    return ctx


def stop_rank() -> None:
    """Finish what is in flight and leave the minidist world (the MPI process goes on)."""
    ctx = context._current  # not current(): a rank whose group fn destroyed still has a transport to close
    if ctx is not None:
        try:
            ctx.transport.flush()
            ctx.transport.announce_finished()  # a peer still waiting on this rank hears it has left
        finally:
            ctx.transport.close()
            set_cost_hook(None)
            context.set_current(None)


def _die_with_launcher(parent: int, folder: str) -> None:
    """A watchdog thread: if the launching process dies (killed, or its kernel restarted), end this rank.

    mpiexec runs in a session of its own (so that the launcher can stop it as a whole), which also keeps
    it out of the launcher's death; without this a rank computing forever would outlive everyone.
    """

    def watch() -> None:
        while True:
            time.sleep(0.2)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)  # nobody is left to remove it
                remove_segments(mpi_segments())  # nor the MPI library's shared memory (exit skips it)
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="minidist-launcher-watch", daemon=True).start()


def _run(folder: str) -> None:
    parent = os.environ.get("MINIDIST_MPI_LAUNCHER")
    if parent:
        _die_with_launcher(int(parent), folder)
    with open(os.path.join(folder, "payload"), "rb") as f:
        fn, args, kwargs, cluster, timeout = pickling.loads(f.read())
    ctx = start_rank(cluster, timeout)
    rank = ctx.rank
    record_segments(folder, rank)
    out_path = os.path.join(folder, f"{rank}.out")
    live = open(out_path, "w")

    def send(text: str) -> None:
        live.write(text)
        live.flush()

    out = RankStream(send)
    progress = os.path.join(folder, f"{rank}.progress")

    def report_progress(done: int, total: int, what: str) -> None:
        with open(progress + ".tmp", "w") as f:
            f.write(f"{done} {total} {what}")
        os.replace(progress + ".tmp", progress)

    ctx.report_progress = report_progress
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    failed = False
    try:
        value = fn(*args, **(kwargs or {}))
        ctx.transport.flush()
        sys.stdout, sys.stderr = saved
        try:
            data = pickling.dumps_report(("ok", rank, value, ctx.clock.end(), ctx.memory, ctx.recorder.events,
                                          out.getvalue()))
        except Exception as e:
            failed = True
            data = pickling.dumps_report(("error", rank, "PicklingError", f"the return value of rank {rank} cannot be "
                                          f"pickled: {e}", "", None, out.getvalue(), ctx.clock.end()))
    except BaseException as e:
        sys.stdout, sys.stderr = saved
        failed = True
        try:
            exc = dill.dumps(e)
        except Exception:
            exc = None
        data = pickling.dumps_report(("error", rank, type(e).__name__, reason(e), traceback.format_exc(), exc,
                                      out.getvalue(), ctx.clock.end()))
    finally:
        sys.stdout, sys.stderr = saved
    out.flush_lines()
    live.close()
    tmp = os.path.join(folder, f"{rank}.report.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(folder, f"{rank}.report"))  # whole or absent, whenever the launcher looks
    if failed:
        mpi_world().Abort(1)  # the peers may be waiting for this rank: stop the job
    stop_rank()


if __name__ == "__main__":
    _run(sys.argv[1])
