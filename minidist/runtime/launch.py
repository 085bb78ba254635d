"""``launch``: run a function on ``world_size`` simulated devices, each a real process.

The parent creates the shared segment and one doorbell per rank (a pipe), starts the ranks with
the ``multiprocess`` package (dill pickling, so a function typed in a notebook cell works) and
waits for their reports on pipes. Each rank (``rank_process.py``) captures its printed output and
sends back its return value, simulated time, memory ledger and trace events; the parent shows the
output as it comes (``live.py``). Failures end quickly and cleanly: the first exception aborts every
other rank at its next communication call, the parent re-raises it with the failing rank's
traceback, a rank that overstays the launch's limits is stopped and reported with the line it was
on, and no process or shared-memory segment survives the call (nor a Ctrl-C, nor a killed parent).
"""

from __future__ import annotations

import errno
import math
import mmap
import numbers
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext

import multiprocess
from multiprocess import spawn as mp_spawn
from multiprocess.connection import wait as mp_wait

from minidist.hardware.cluster import Cluster
from minidist.hardware.trace import Trace
from minidist.runtime import context, pickling, shm
from minidist.runtime.doorbell import Doorbell
from minidist.runtime.errors import exit_text, process_state
from minidist.runtime.inprocess_launch import launch_inprocess
from minidist.runtime.live import LiveView
from minidist.runtime.mpi_launch import launch_mpi
from minidist.runtime.rank_process import rank_main
from minidist.runtime.results import LaunchResult, failure, positive_seconds
from minidist.runtime.transport import SETTLE_S

_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
START_METHODS = ("fork", "spawn", "forkserver")
GRACE = 1.0  # seconds the parent waits for the other ranks' reports once one rank has failed
# seconds a rank started fresh (spawn, forkserver) may take to start, at least: a new interpreter imports numpy and
# minidist first, which takes seconds when several start at once on a busy machine
FRESH_START_S = 60.0
# ranks as processes need POSIX: shared memory by name, pipes to poll, signals to stop them and ask where they are
_POSIX = os.name == "posix"


class _Segment:
    """The launch's shared memory, never left behind.

    Under fork the ranks inherit an anonymous shared mapping. Under spawn and forkserver they inherit a
    descriptor of a segment whose name was unlinked the moment it was created (``shm.create_unnamed``; the
    module docstring of shm.py says why not a name kept until the ranks map it). Either way nothing is left in
    /dev/shm whoever is killed and when, the launcher's whole process group included.
    """

    def __init__(self, size: int, fork: bool) -> None:
        self.fd = -1
        if fork:
            self.mm = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
        else:
            self.mm, self.fd = shm.create_unnamed(size)

    def for_rank(self):
        """What ``rank_main`` maps: the mapping itself under fork, else the descriptor to pass on."""
        return self.mm if self.fd < 0 else shm.Inherited(self.fd)

    def close(self) -> None:
        """Close the descriptor once every rank has been started (their own copies and mappings keep it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _layout(world: int, named: bool) -> shm.Layout:
    """The channels' layout, within the room a named segment has (spawn): touching a page past it would kill."""
    budget = shm.segment_budget()
    room = shm.named_segment_room() if named else None
    if room is not None and room * 9 // 10 < budget:
        try:
            return shm.default_layout(world, room * 9 // 10)
        except ValueError as e:
            raise ValueError(f"{e}; the limit here is /dev/shm, with {shm.size_text(room)} free (a container's "
                             f"default is 64 MB; `docker run --shm-size=1g` raises it); start_method='fork' does not "
                             f"use /dev/shm") from None
    return shm.default_layout(world, budget)


# a rank's doorbell, report pipe and exit sentinel take 5 files in the launcher, and a forked rank inherits them all
FILES_PER_RANK = 6


def _open_files() -> int:
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d))
        except OSError:
            pass
    return 64


def _enough_files(world: int) -> None:
    """Make sure this process may open the files a launch of ``world`` ranks needs, raising its soft limit if
    the hard one allows; else say how to. A forked rank inherits them all, so it needs as many.

    Without this, 64 ranks under macOS's default limit of 256 (or 256 under Linux's 1024) fail half-started
    with a bare ``OSError: Too many open files``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX, refused earlier
        return
    need = _open_files() + FILES_PER_RANK * world + 32
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    target = 2 * need if hard == resource.RLIM_INFINITY else min(hard, 2 * need)
    if target >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return
        except (ValueError, OSError):
            pass
    raise OSError(errno.EMFILE, _files_text(world, need, soft, hard))


AS_THREADS = "backend='inprocess' (ranks as threads of this process: the same results and clocks)"  # the way out
_FILES_WAY_OUT = "raise it before starting Python or Jupyter (`ulimit -n {n}` in the shell), or pass " + AS_THREADS


def _files_text(world: int, need: int, soft: int, hard: int) -> str:
    import resource

    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return (f"launch: {world} ranks as processes need about {need} open files in this process ({FILES_PER_RANK} per "
            f"rank: its doorbell, report pipe and exit sentinel pipe), but the limit is {soft} and its hard limit "
            f"({limit}) does not let minidist raise it; " + _FILES_WAY_OUT.format(n=2 * need))


def _start_failed(e: OSError, rank: int, world: int) -> OSError | None:
    """The error for a rank the system would not start, saying which limit is the likely cause (None: no limit)."""
    if e.errno == errno.EMFILE:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        text = (f"launch: this process ran out of open files (its limit is {soft}) while setting up rank {rank} of "
                f"{world}, {FILES_PER_RANK} files per rank; " + _FILES_WAY_OUT.format(n=max(4096, 2 * soft)))
    elif e.errno in (errno.EAGAIN, errno.ENOMEM):
        text = (f"launch: the system would not start rank {rank} of {world} ({e.strerror}): a limit on processes "
                f"(`ulimit -u`, a container's pid limit) or on memory was reached; use fewer ranks, or {AS_THREADS}")
    else:
        return None
    return OSError(e.errno, text)


def default_start_method() -> str:
    """fork on Linux (fast), spawn elsewhere; ``MINIDIST_START_METHOD`` overrides it, so that code meant for macOS or
    Windows can be tried on Linux (``make test-portability`` runs the notebooks so)."""
    chosen = os.environ.get("MINIDIST_START_METHOD")
    if chosen:
        if chosen not in START_METHODS:
            raise ValueError(f"launch: MINIDIST_START_METHOD must be 'fork', 'spawn' or 'forkserver', got {chosen!r}")
        return chosen
    return "fork" if sys.platform.startswith("linux") else "spawn"


@contextmanager
def _spawning():
    """While ranks are started fresh (spawn, forkserver): one BLAS thread each, and no re-run of ``__main__``.

    A spawned child normally re-runs the parent's script before its target, which is why Python asks scripts
    to guard their top level with ``if __name__ == "__main__"``. A rank needs nothing from the script: ``fn``
    arrives by value with the globals it uses (pickling.py), as it must from a notebook, which has no file to
    re-run. So a script without the guard works under spawn (macOS's and Windows' default) as under fork, and
    its top level (loading data, say) runs once, not once per rank.
    """
    saved_env = {k: os.environ.get(k) for k in _BLAS_ENV}
    os.environ.update({k: "1" for k in _BLAS_ENV})
    plain = mp_spawn.get_preparation_data

    def without_main(name):
        data = plain(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = plain
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Interrupts:
    """Ctrl-C (or a Jupyter interrupt) during a launch, taken only where the launcher can act on it.

    Python raises KeyboardInterrupt wherever the main thread happens to be, and in some places it
    is swallowed: inside the hooks ``os.fork`` runs ("Exception ignored in ..."), and a ``select``
    interrupted by a handler that does not raise is retried. So while ranks start and run, SIGINT
    only sets a flag and writes a byte to a pipe that the launcher's wait watches; the launcher
    raises KeyboardInterrupt at its next step, and its cleanup stops every rank.
    """

    def __init__(self) -> None:
        self.hit = False
        self.prev = None
        self.rd = self.wr = -1

    def __enter__(self) -> _Interrupts:
        import threading

        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if prev is signal.default_int_handler:  # somebody else's handler is theirs to keep
                self.rd, self.wr = os.pipe()
                os.set_blocking(self.wr, False)
                self.prev = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.hit = True
        try:
            os.write(self.wr, b"!")
        except OSError:
            pass

    def fds(self) -> list[int]:
        return [self.rd] if self.rd >= 0 else []

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self.prev is not None:
            signal.signal(signal.SIGINT, self.prev)
            os.close(self.rd)
            os.close(self.wr)
        if self.hit and exc[0] is None:
            raise KeyboardInterrupt


def _ask_where(procs, ranks, readers, handle, stacks, within: float = 0.5) -> None:
    """Ask ``ranks`` for their stacks (SIGUSR1) and collect the answers for at most ``within`` seconds."""
    for r in ranks:
        if procs[r].is_alive():
            os.kill(procs[r].pid, signal.SIGUSR1)
    end = time.monotonic() + within
    while any(r not in stacks for r in ranks) and time.monotonic() < end:
        conns = [c for c, r in readers.items() if r in ranks]
        for c in mp_wait(conns, timeout=max(0.0, end - time.monotonic())):
            if c in readers:
                handle(c)


def _overstay(rank: int, why: str, board: shm.Board, pid: int) -> str:
    state, _, desc = board.describe(rank)
    doing = f"waiting in {desc}" if state == shm.WAITING else "running its own code"
    if process_state(pid) == "stopped":
        doing = "stopped (SIGSTOP, Ctrl-Z or a debugger)"
    return f"rank {rank} was still {doing} at {why} and was stopped"


class _Ranks:
    """The launcher's side of a running launch: what each rank reported, and when to stop them.

    ``collect`` waits on the ranks' pipes, their process sentinels and the interrupt pipe, and turns
    every way a launch can go wrong into errors: a rank that raised, died, never started, or ran past
    the launch's limits (``timeout`` after the first rank returned, ``deadline`` overall).
    """

    def __init__(self, world, procs, readers, board, bells, live, timeout, deadline, fork: bool) -> None:
        self.world, self.procs, self.readers, self.board, self.bells = world, procs, readers, board, bells
        self.live, self.timeout, self.deadline = live, timeout, deadline
        self.fork = fork
        self.start_s = timeout if fork else max(timeout, FRESH_START_S)
        self.values, self.times, self.memory, self.events, self.stdout = {}, {}, {}, {}, {}
        self.errors, self.order = {}, []  # rank -> (name, message, traceback, pickled exception); failure order
        self.ready, self.stacks = set(), {}
        self.t0 = time.monotonic()
        self.first_done = self.failed_at = self.all_ready = None

    # -- what the ranks send -----------------------------------------------------------------
    def handle(self, conn) -> None:
        r = self.readers[conn]
        try:
            msg = pickling.loads_report(conn.recv_bytes())
        except (EOFError, OSError):
            del self.readers[conn]
            return
        kind = msg[0]
        if kind == "ready":
            self.ready.add(r)
            if len(self.ready) == self.world:
                self.all_ready = time.monotonic()
        elif kind == "ok":
            _, _, self.values[r], self.times[r], self.memory[r], self.events[r], self.stdout[r] = msg
            self.first_done = time.monotonic() if self.first_done is None else self.first_done
        elif kind == "stack":
            self.stacks[r] = msg[2]
        elif kind == "out":
            self.live.output(r, msg[2])
        elif kind == "progress":
            self.live.report(r, *msg[2:])
        else:
            _, _, ename, emsg, tb, exc, self.stdout[r], self.times[r] = msg
            self.fail(r, ename, emsg, tb, exc)

    def fail(self, r: int, name: str, message: str, tb: str = "", exc=None) -> None:
        self.errors[r] = (name, message, tb, exc)
        self.order.append(r)

    def stop_all(self, why: str) -> None:
        """Every rank stops at its next communication call; the launcher gives them GRACE to report."""
        self.board.abort(why)
        for b in self.bells:
            b.ring()
        self.failed_at = time.monotonic()

    def running(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.values and r not in self.errors]

    # -- limits ------------------------------------------------------------------------------
    def _start_limit(self) -> float | None:
        """Seconds left for every rank to start, or None once they all have (or the launch failed).

        A rank that never reports ready is stuck before running anything (e.g. a lock held by another
        thread of the parent when it forked): no communication timeout would ever fire for it.
        """
        if len(self.ready) == self.world or self.failed_at is not None:
            return None
        left = self.t0 + self.start_s - time.monotonic()
        if left > 0:
            return left
        why = ("under the fork start method a lock another thread of this process held at the fork can do that: "
               "retry, or use start_method='spawn'" if self.fork else
               "a fresh interpreter was still importing, or stuck there: is the machine overloaded?")
        for r in range(self.world):
            if r not in self.ready and r not in self.errors:
                self.fail(r, "StartTimeout", f"rank {r} did not start within {self.start_s:g} s (stuck before running "
                          f"fn; {why})")
        self.stop_all("a rank did not start")
        return 0.0

    def _run_limit(self) -> float | None:
        """Seconds left before the running ranks overstay (None: no limit applies yet)."""
        overall = math.inf if self.deadline is None else self.t0 + self.deadline
        # a rank's own timeout report (which says what everyone was doing) comes first: it may look SETTLE_S longer,
        # and as long again is left for it to arrive. A rank still starting (a spawned one can take seconds) is not
        # late yet: the others' time counts from when the last one started.
        after_first = math.inf if self.first_done is None or self.all_ready is None else \
            max(self.first_done, self.all_ready) + self.timeout + 2 * SETTLE_S
        due = min(overall, after_first)
        if self.failed_at is not None or due == math.inf:
            return None
        left = due - time.monotonic()
        if left > 0:
            return left
        late = self.running()
        _ask_where(self.procs, late, self.readers, self.handle, self.stacks)
        why = (f"the launch's deadline of {self.deadline:g} s" if overall <= after_first else
               f"{self.timeout:g} s (the timeout) after rank {min(self.values)} returned")
        for r in late:
            self.fail(r, "DeadlineExceeded", _overstay(r, why, self.board, self.procs[r].pid), self.stacks.get(r, ""))
        self.stop_all(f"the launcher stopped ranks {late}: they ran past {why}")
        return 0.0

    # -- the wait ------------------------------------------------------------------------------
    def collect(self, interrupts) -> None:
        """Wait until every rank has reported, or GRACE after the first failure."""
        self.t0 = time.monotonic()  # the limits count from here: starting the processes is not the ranks' time
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while self.running():
            limits = [t for t in (self._start_limit(), self._run_limit()) if t is not None]
            if self.failed_at is not None:
                limits.append(max(0.0, self.failed_at + GRACE - time.monotonic()))
            wait_s = min(limits) if limits else None
            if wait_s == 0.0:
                if self.failed_at is not None and time.monotonic() >= self.failed_at + GRACE:
                    break
                continue
            objs = mp_wait(list(self.readers) + list(sentinels) + interrupts.fds(), timeout=wait_s)
            interrupts.check()
            for o in objs:
                if o in self.readers:
                    self.handle(o)
            for o in objs:
                if o in sentinels:
                    self._exited(sentinels.pop(o))
            if self.errors and self.failed_at is None:
                self.failed_at = time.monotonic()

    def _exited(self, r: int) -> None:
        """Rank r's process ended: read what it still had to say; without a report it died."""
        for c, rr in list(self.readers.items()):
            if rr == r:
                while c in self.readers and c.poll():
                    self.handle(c)
        if r not in self.values and r not in self.errors:
            self.procs[r].join(0.5)
            code = self.procs[r].exitcode
            self.fail(r, "RankDied", f"rank {r} exited without reporting ({exit_text(code)})")
            self.stop_all(f"rank {r} died ({exit_text(code, cause=False)})")

    def result(self) -> LaunchResult:
        """Show the output; the LaunchResult, or the RankError that explains the failure."""
        self.live.close(self.stdout)
        if self.errors:
            for r in self.running():  # a consequence, not part of the failure order
                self.errors[r] = ("Terminated", "stopped by the launcher after another rank failed", "", None)
            raise failure(self.errors, self.order or sorted(self.errors))
        w = range(self.world)
        return LaunchResult([self.values[r] for r in w], [self.times[r] for r in w], [self.memory[r] for r in w],
                            Trace.from_recorders(self.events), [self.stdout[r] for r in w])


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
    _enough_files(world_size)
    with _Interrupts() as interrupts:
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
        ranks = _Ranks(world_size, procs, readers, board, bells, live, timeout, deadline, fork)
        try:
            r = 0  # the rank being set up, for the error if the system refuses
            try:
                for _ in range(world_size):
                    bells.append(Doorbell())
                with nullcontext() if fork else _spawning():
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
                why = _start_failed(e, r, world_size)
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
