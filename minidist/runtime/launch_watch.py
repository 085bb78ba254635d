"""Watching a launch's running ranks and collecting what they report (``launch.py``).

Property: a launch ends, and says why. The launcher waits on the ranks' report pipes, their process sentinels and
an interrupt pipe at once, so it learns at once that a rank returned, raised, died or was interrupted; a rank that
never starts or overstays the launch's limits is asked where it is (SIGUSR1) and stopped; after the first failure
the others get ``GRACE`` to report, and the result is a ``LaunchResult`` or the ``RankError`` that explains it.
"""

from __future__ import annotations

import math
import os
import signal
import time

from multiprocess.connection import wait as mp_wait

from minidist.hardware.trace import Trace
from minidist.runtime import pickling, shm
from minidist.runtime.errors import exit_text, process_state
from minidist.runtime.results import LaunchResult, failure
from minidist.runtime.transport import SETTLE_S

GRACE = 1.0  # seconds the parent waits for the other ranks' reports once one rank has failed
# seconds a rank started fresh (spawn, forkserver) may take to start, at least: a new interpreter imports numpy and
# minidist first, which takes seconds when several start at once on a busy machine
FRESH_START_S = 60.0


class Interrupts:
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

    def __enter__(self) -> Interrupts:
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


def ask_where(procs, ranks, readers, handle, stacks, within: float = 0.5) -> None:
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


def overstay(rank: int, why: str, board: shm.Board, pid: int) -> str:
    state, _, desc = board.describe(rank)
    doing = f"waiting in {desc}" if state == shm.WAITING else "running its own code"
    if process_state(pid) == "stopped":
        doing = "stopped (SIGSTOP, Ctrl-Z or a debugger)"
    return f"rank {rank} was still {doing} at {why} and was stopped"


class Ranks:
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
        ask_where(self.procs, late, self.readers, self.handle, self.stacks)
        why = (f"the launch's deadline of {self.deadline:g} s" if overall <= after_first else
               f"{self.timeout:g} s (the timeout) after rank {min(self.values)} returned")
        for r in late:
            self.fail(r, "DeadlineExceeded", overstay(r, why, self.board, self.procs[r].pid), self.stacks.get(r, ""))
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
