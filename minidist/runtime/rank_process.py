"""One rank's life: the process ``launch`` starts for each simulated device.

A rank ignores Ctrl-C (the launcher handles it and stops everyone), dies with its parent, limits
BLAS to one thread, maps the shared segment, builds its clock, memory ledger and transport, runs
the user's function with its output captured (and streamed to the launcher, see live.py), and
reports back on its pipe: the return value with the simulated time, ledger and trace, or the
exception with its traceback. Asked by SIGUSR1, it tells the launcher which line it is on.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

import dill

from minidist.autograd.cost import set_cost_hook
from minidist.hardware.clock import Clock
from minidist.hardware.memory import MemoryLedger
from minidist.hardware.trace import Recorder
from minidist.runtime import context, pickling, shm
from minidist.runtime.errors import RankAborted, proc_stat, reason
from minidist.runtime.live import RankStream
from minidist.runtime.transport import Transport


def _limit_blas_threads() -> None:
    """One BLAS thread per rank, so 8 ranks do not fight over 2 cores."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    except OSError:
        return
    for lib in libs:
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "scipy_openblas_set_num_threads"):
            fn = getattr(dll, sym, None)
            if fn is not None:
                fn(1)
                break


def _prctl(option: int, arg: int) -> None:
    """Linux's prctl(option, arg); where it does not exist or refuses, nothing happens."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    except Exception:
        pass


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this rank if the parent dies (no orphans after a SIGKILL).

    A parent that died before the request was made is not covered by it: then we are already
    somebody else's child, and leave at once. Under forkserver our parent is the fork server, a child
    of the launcher that exits when the launcher dies (its pipe closes), so the request still covers
    us; there it is the launcher that must still be alive.
    """
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == parent:
        return
    try:
        os.kill(parent, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: the pid now names someone else's process
        os._exit(1)
    fields = proc_stat(os.getppid())  # None where there is no /proc to ask
    if fields and int(fields[1]) != parent:
        os._exit(1)


def _let_siblings_read(parent: int) -> None:
    """Linux with Yama's ptrace_scope 1 (Ubuntu's default) lets a process read another's memory only if it is
    an ancestor, so the ranks, which are siblings, could not use cross-memory attach (cma.py) and every large
    message would take the two-copy path. Naming the launcher as our ptracer lets its descendants, the other
    ranks, read us, and nobody else (MPI libraries do the same). Elsewhere the call fails and changes nothing."""
    _prctl(0x59616D61, parent)  # PR_SET_PTRACER


class _Pipe:
    """A rank's messages to the launcher; a message asked for by a signal never cuts into another."""

    def __init__(self, conn) -> None:
        self.conn, self.busy = conn, False

    def send(self, msg) -> None:
        self.send_raw(pickling.dumps_report(msg))

    def send_raw(self, data: bytes, from_signal: bool = False) -> None:
        if self.busy and from_signal:
            return  # the handler interrupted a send: skip this report rather than corrupt the stream
        self.busy = True
        try:
            self.conn.send_bytes(data)
        finally:
            self.busy = False


def _send_stack(pipe: _Pipe, rank: int, frame) -> None:
    """Tell the launcher where this rank is (it asks when the rank overstays the launch's limits)."""
    frames = traceback.extract_stack(frame)
    ours = [i for i, f in enumerate(frames) if f.filename == __file__]
    mine = frames[ours[-1] + 1 if ours else 0 :][-8:]  # the rank's own frames, below rank_main
    try:
        pipe.send_raw(pickling.dumps_report(("stack", rank, "".join(traceback.format_list(mine)))), from_signal=True)
    except Exception:
        pass


def rank_main(rank, world, fn, args, kwargs, cluster, seg, layout_args, bells, conn, timeout, parent):
    """The body of rank ``rank``'s process (``fn`` is bytes when it travelled by value, under spawn; ``seg`` is the
    shared mapping under fork, else the descriptor of the segment, ``shm.Inherited``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tears us down
    _die_with_parent(parent)
    _let_siblings_read(parent)  # before the transport publishes our pid: peers probe us only after that
    _limit_blas_threads()
    if isinstance(fn, bytes):  # spawned: the function and its arguments travel by value (pickling.py)
        fn, args, kwargs = pickling.loads(fn)
    layout = shm.Layout(world, *layout_args)
    mm = shm.map_inherited(seg, layout.size) if isinstance(seg, shm.Inherited) else seg
    pipe = _Pipe(conn)
    pipe.send(("ready", rank))
    signal.signal(signal.SIGUSR1, lambda signum, frame: _send_stack(pipe, rank, frame))
    board = shm.Board(mm, layout)
    recorder = Recorder(rank)
    clock = Clock(rank, cluster, recorder)
    ledger = MemoryLedger(cluster.hbm, rank)
    ledger.attach_clock(clock.now)
    transport = Transport(rank, mm, layout, bells, board, clock, timeout)
    ctx = context.RankContext(rank, world, cluster, clock, ledger, transport, timeout)
    ctx.report_progress = lambda done, total, what: pipe.send(("progress", rank, done, total, what))
    context.set_current(ctx)
    set_cost_hook(clock.hook)
    out = RankStream(lambda text: pipe.send(("out", rank, text)))
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        value = fn(*args, **(kwargs or {}))
        transport.flush()
        board.set_state(rank, shm.FINISHED)
        transport.ring_all()
        sys.stdout, sys.stderr = saved
        try:
            data = pickling.dumps_report(("ok", rank, value, clock.end(), ledger, recorder.events, out.getvalue()))
        except Exception as e:
            data = pickling.dumps_report(("error", rank, "PicklingError", f"the return value of rank {rank} cannot be "
                                          f"pickled: {e}", "", None, out.getvalue(), clock.end()))
    except BaseException as e:
        sys.stdout, sys.stderr = saved
        board.set_state(rank, shm.FAILED)
        if not isinstance(e, RankAborted):
            board.abort(f"rank {rank} raised {type(e).__name__}: {reason(e)}")
        transport.ring_all()
        try:
            exc = dill.dumps(e)
        except Exception:
            exc = None
        data = pickling.dumps_report(("error", rank, type(e).__name__, reason(e), traceback.format_exc(), exc,
                                      out.getvalue(), clock.end()))
    finally:
        sys.stdout, sys.stderr = saved
        set_cost_hook(None)
        context.set_current(None)
    pipe.send_raw(data)
    conn.close()
