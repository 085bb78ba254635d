"""``launch``: run a function on ``world_size`` simulated devices, each a real process.

The parent creates the shared segment and one doorbell semaphore per rank, starts the ranks with
the ``multiprocess`` package (dill pickling, so a function typed in a notebook cell works) and
waits for their reports on pipes. Each rank (``rank_process.py``) captures its printed output and
sends back its return value, simulated time, memory ledger and trace events; the parent shows the
output as it comes (``live.py``). Failures end quickly and cleanly: the first exception aborts every
other rank at its next communication call, the parent re-raises it with the failing rank's
traceback, a rank that overstays the launch's limits is stopped and reported with the line it was
on, and no process or shared-memory segment survives the call (nor a Ctrl-C, nor a killed parent).
"""

from __future__ import annotations

import math
import numbers
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

import dill
import multiprocess
from multiprocess import resource_tracker
from multiprocess.connection import wait as mp_wait

from minidist.hardware.cluster import Cluster
from minidist.hardware.trace import Trace
from minidist.runtime import context, pickling, shm
from minidist.runtime.errors import RankError, process_state
from minidist.runtime.live import LiveView
from minidist.runtime.rank_process import rank_main

_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
GRACE = 1.0  # seconds the parent waits for the other ranks' reports once one rank has failed


class LaunchResult(Sequence):
    """The ranks' return values in rank order, plus what the simulation measured.

    ``times[r]``: rank r's final simulated time in seconds (all its streams finished);
    ``memory[r]``: its MemoryLedger; ``trace``: every rank's events; ``stdout[r]``: what it printed.
    """

    def __init__(self, values, times, memory, trace, stdout) -> None:
        self.values, self.times, self.memory, self.trace, self.stdout = values, times, memory, trace, stdout

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


class _Segment:
    """The launch's shared-memory segment, unlinked exactly once.

    Under spawn the name must live until every rank has mapped it, and a parent killed meanwhile
    cannot unlink it: multiprocess's resource tracker (a helper process that outlives the parent)
    then does, so it is told about the segment until it is unlinked.
    """

    def __init__(self, size: int, fork: bool) -> None:
        self.mm, self.name = shm.create(size)
        self.tracked = False
        if fork:
            shm.unlink(self.name)  # children inherit the mapping; the name is no longer needed
            self.name = None
        else:
            resource_tracker.register(self.name, "shared_memory")
            self.tracked = True

    def unlink(self) -> None:
        if self.name is not None:
            shm.unlink(self.name)
            if self.tracked:
                resource_tracker.unregister(self.name, "shared_memory")
            self.name = None


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


def _failure(errors: dict, order: list[int]) -> RankError:
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
) -> LaunchResult:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` simulated devices and collect what they return.

    ``cluster`` (default: DGX H100 nodes) gives the GPUs and links the clocks charge. ``timeout`` is
    how many seconds a rank may wait inside one communication call before the run stops with a
    report of who waits for whom; once a rank has returned, the others have ``timeout`` seconds to
    return too. ``deadline`` (seconds, default none) bounds the whole launch. A rank that overstays
    either limit is stopped and reported with the line it was running. ``start_method`` is "fork"
    (default on Linux: fast) or "spawn".
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
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError(f"launch: timeout must be a positive number of seconds, got {timeout!r}")
    timeout = float(timeout)
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, numbers.Real)
                                 or not math.isfinite(deadline) or deadline <= 0):
        raise ValueError(f"launch: deadline must be None or a positive number of seconds, got {deadline!r}")
    if start_method not in (None, "fork", "spawn", "forkserver"):
        raise ValueError(f"launch: start_method must be 'fork', 'spawn' or 'forkserver', got {start_method!r}")
    if start_method is None:
        start_method = "fork" if sys.platform.startswith("linux") else "spawn"
    mp = multiprocess.get_context(start_method)
    payload = (fn, args, kwargs)
    if start_method != "fork":
        try:
            payload = (pickling.dumps(payload), (), None)
        except Exception as e:
            raise TypeError(f"launch: fn and its arguments must be picklable to start ranks with "
                            f"start_method={start_method!r}: {type(e).__name__}: {e}") from e
    cluster = (cluster if cluster is not None else Cluster.dgx_h100()).for_world(world_size)
    layout = shm.default_layout(world_size)
    layout_args = (layout.slot_bytes, layout.nslots)
    with _Interrupts() as interrupts:
        fork = start_method == "fork"
        seg = _Segment(layout.size, fork)
        mm, name = seg.mm, seg.name
        procs, readers = [], {}
        board = shm.Board(mm, layout)
        bells = [mp.Semaphore(0) for _ in range(world_size)]
        values, times, memory, events, stdout, errors, order = {}, {}, {}, {}, {}, {}, []
        live = LiveView(world_size, quiet)
        try:
            saved_env = {k: os.environ.get(k) for k in _BLAS_ENV}
            if not fork:
                os.environ.update({k: "1" for k in _BLAS_ENV})
            try:
                for r in range(world_size):
                    rd, wr = mp.Pipe(duplex=False)
                    p = mp.Process(target=rank_main, name=f"minidist-rank-{r}", daemon=True,
                                   args=(r, world_size, *payload, cluster, mm if fork else name, layout_args,
                                         bells, wr, timeout, os.getpid()))
                    p.start()
                    wr.close()
                    procs.append(p)
                    readers[rd] = r
                    interrupts.check()
            finally:
                if not fork:
                    for k, v in saved_env.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
            sentinels = {p.sentinel: r for r, p in enumerate(procs)}
            ready, failed_at = set(), None
            # A rank that never reports ready is stuck before running anything (e.g. a lock held by another
            # thread of the parent when it forked): no communication timeout would ever fire for it.
            t_launch = time.monotonic()
            start_deadline = t_launch + timeout
            first_done, stacks = None, {}

            def handle(conn) -> None:
                nonlocal first_done
                r = readers[conn]
                try:
                    msg = dill.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    del readers[conn]
                    return
                if msg[0] == "ready":
                    ready.add(r)
                    if len(ready) == world_size and not fork:
                        seg.unlink()  # every rank has it mapped now
                elif msg[0] == "ok":
                    _, _, values[r], times[r], memory[r], events[r], stdout[r] = msg
                    first_done = time.monotonic() if first_done is None else first_done
                elif msg[0] == "stack":
                    stacks[r] = msg[2]
                elif msg[0] == "out":
                    live.output(r, msg[2])
                elif msg[0] == "progress":
                    live.report(r, *msg[2:])
                else:
                    _, _, ename, emsg, tb, exc, stdout[r], times[r] = msg
                    errors[r] = (ename, emsg, tb, exc)
                    order.append(r)

            while len(values) + len(errors) < world_size:
                wait_s = None if failed_at is None else max(0.0, failed_at + GRACE - time.monotonic())
                if failed_at is not None and wait_s == 0.0:
                    break
                if len(ready) < world_size and failed_at is None:
                    left = start_deadline - time.monotonic()
                    if left <= 0:
                        for r in range(world_size):
                            if r not in ready and r not in errors:
                                errors[r] = ("StartTimeout", f"rank {r} did not start within {timeout:g} s (stuck "
                                             f"before running fn; under the fork start method a lock another thread "
                                             f"of this process held at the fork can do that: retry, or use "
                                             f"start_method='spawn')", "", None)
                                order.append(r)
                        board.abort("a rank did not start")
                        for b in bells:
                            b.release()
                        failed_at = time.monotonic()
                        continue
                    wait_s = left
                due = min(math.inf if deadline is None else t_launch + deadline,
                          math.inf if first_done is None else first_done + timeout)
                if failed_at is None and due < math.inf:
                    left = due - time.monotonic()
                    if left <= 0:
                        late = [r for r in range(world_size) if r not in values and r not in errors]
                        _ask_where(procs, late, readers, handle, stacks)
                        why = (f"the launch's deadline of {deadline:g} s" if first_done is None
                               or t_launch + (deadline or math.inf) <= first_done + timeout else
                               f"{timeout:g} s (the timeout) after rank {min(values)} returned")
                        for r in late:
                            text = _overstay(r, why, board, procs[r].pid)
                            errors[r] = ("DeadlineExceeded", text, stacks.get(r, ""), None)
                            order.append(r)
                        board.abort(f"the launcher stopped ranks {late}: they ran past {why}")
                        for b in bells:
                            b.release()
                        failed_at = time.monotonic()
                        continue
                    wait_s = left if wait_s is None else min(wait_s, left)
                objs = mp_wait(list(readers) + list(sentinels) + interrupts.fds(), timeout=wait_s)
                interrupts.check()
                for o in objs:
                    if o in readers:
                        handle(o)
                for o in objs:
                    if o in sentinels:
                        r = sentinels.pop(o)
                        for c, rr in list(readers.items()):
                            if rr == r:
                                while c in readers and c.poll():
                                    handle(c)
                        if r not in values and r not in errors:
                            procs[r].join(0.5)
                            code = procs[r].exitcode
                            errors[r] = ("RankDied", f"rank {r} exited without reporting (exit code {code})", "", None)
                            order.append(r)
                            board.abort(f"rank {r} died (exit code {code})")
                            for b in bells:
                                b.release()
                if errors and failed_at is None:
                    failed_at = time.monotonic()
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
            seg.unlink()
            del board
    live.close(stdout)
    if errors:
        for r in range(world_size):
            if r not in values and r not in errors:
                errors[r] = ("Terminated", "stopped by the launcher after another rank failed", "", None)
        raise _failure(errors, order or sorted(errors))
    res = LaunchResult(
        [values[r] for r in range(world_size)],
        [times[r] for r in range(world_size)],
        [memory[r] for r in range(world_size)],
        Trace.from_recorders(events),
        [stdout[r] for r in range(world_size)],
    )
    return res
