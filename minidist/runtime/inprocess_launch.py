"""``md.launch(fn, world_size, backend="inprocess")``: every rank a thread of this process, one at a time.

Simulated time never depended on which rank the operating system ran when: each message carries the
times its sender's clock booked, and a receive completes at ``max(arrival, posted)``. So ranks can take
turns on one core, an event-driven simulation: a rank runs until it must wait for a message (or for its
peers to join a collective), then hands the turn to the next rank that can move (``Turns``). Clocks,
ledgers, traces and results are bitwise those of one process per rank; no process is started and no byte
of shared memory is mapped, which is what a shape-only run of thousands of ranks needs.

What the process holds per rank (the ``md.dist`` context, the cost hook, grad mode, autocast, the default
generator, a few strategy registries, ``sys.stdout``) is swapped in and out with the turn (``RANK_STATE``).
When no rank can move, the waits form a deadlock: it is raised at once, naming who waits for what.

A rank that never gives the turn back (it loops, sleeps, or computes) is stopped like a rank process that
overstays: at the launch's ``deadline``, or once its turn has lasted ``timeout`` seconds while another rank
waits in a communication call or has returned; the error names it and the line it was on (its thread's
frame, ``sys._current_frames``). It is stopped by an exception raised in its thread, which Python delivers
only when the thread runs Python code: a thread in a system call or in C (``time.sleep``, a long numpy call)
cannot be stopped, nor killed. After ``STOP_GRACE`` seconds it is abandoned: the turn goes on as if it had
failed, the launch ends with the error, which says so, and the thread (a daemon, so the interpreter can
exit) ends by itself when its call returns: the exception is raised there, and the launch it belonged to
ignores it (only the rank's own cleanup, its ``finally`` and ``with`` blocks, still runs).
"""

from __future__ import annotations

import copy
import ctypes
import importlib
import sys
import threading
import time
import traceback

import dill

from minidist.hardware.clock import Clock
from minidist.hardware.cluster import Cluster
from minidist.hardware.memory import MemoryLedger
from minidist.hardware.trace import Recorder, Trace
from minidist.runtime import context
from minidist.runtime.errors import DeadlockError, RankAborted, reason
from minidist.runtime.inprocess_transport import Exchange, InProcessTransport
from minidist.runtime.live import LiveView, RankStream
from minidist.runtime.results import LaunchResult, failure

# Module-level state that belongs to the rank running, not to the process (module, attribute). A forked
# rank gets its own copy of each; here each rank starts from a copy of the launcher's and keeps its own.
RANK_STATE = (
    ("minidist.runtime.context", "_current"),
    ("minidist.autograd.cost", "_hook"),
    ("minidist.autograd.grad_mode", "_enabled"),
    ("minidist.autograd.autocast", "_round"),
    ("minidist.autograd.autocast", "_round_grad"),
    ("minidist.autograd.random", "_generator"),
    ("minidist.autograd.shape_only", "_BUILDING"),
    ("minidist.parallel.tensor.sequence_parallel", "_scope"),
    ("minidist.parallel.pipeline.split_backward", "_capturing"),
    ("sys", "stdout"),
    ("sys", "stderr"),
)


STOP_GRACE = 1.0  # seconds a rank stopped by the launcher has to give the turn back before it is abandoned


def _modules() -> list:
    return [(importlib.import_module(m), a) for m, a in RANK_STATE]


class Turns:
    """Which rank runs: one at a time, handed over when the running one must wait (round robin)."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks  # the ranks simulated (all of them, or one per symmetry class)
        self.world = len(ranks)
        self.go = {r: threading.Event() for r in ranks}
        self.waits: dict[int, tuple] = {}  # rank -> (ready(), what it waits for, peers)
        self.done: set[int] = set()
        self.failed: set[int] = set()
        self.aborted: str | None = None
        self.state: dict[int, list] = {}
        self.threads: dict[int, int] = {}  # rank -> thread ident
        self.running: int | None = None
        self.since = 0.0  # when the running rank's turn began (time.monotonic)
        self.interrupted: set[int] = set()
        self.abandoned: set[int] = set()  # ranks the launcher gave up on (their threads never gave the turn back)
        self.lock = threading.Lock()  # finish: the rank's own thread and the launcher's abandon may race
        self.finished = threading.Event()
        self.mods = _modules()

    # -- the state a rank carries ----------------------------------------------------------------
    def seed_state(self, rank: int, ctx, stream) -> None:
        vals = []
        for mod, attr in self.mods:
            v = getattr(mod, attr)
            vals.append(copy.deepcopy(v) if isinstance(v, (list, dict)) or attr == "_generator" else v)
        names = [a for _, a in self.mods]
        vals[names.index("_current")] = ctx
        vals[names.index("_hook")] = ctx.clock.hook
        vals[names.index("stdout")] = vals[names.index("stderr")] = stream
        self.state[rank] = vals

    def _save(self, rank: int) -> None:
        self.state[rank] = [getattr(mod, attr) for mod, attr in self.mods]

    def _restore(self, rank: int) -> None:
        for (mod, attr), v in zip(self.mods, self.state[rank]):
            setattr(mod, attr, v)
        self.since = time.monotonic()  # before running: the launcher reads running, then since
        self.running = rank

    # -- turns ---------------------------------------------------------------------------------
    def start(self, rank: int) -> None:
        """A rank's thread waits here for its first turn."""
        self.threads[rank] = threading.get_ident()
        self.go[rank].wait()
        self.go[rank].clear()
        self._restore(rank)

    def _next(self, rank: int) -> int | None:
        i = self.ranks.index(rank)
        for k in range(1, self.world + 1):
            r = self.ranks[(i + k) % self.world]
            if r in self.done:
                continue
            w = self.waits.get(r)
            if w is None or self.aborted is not None or w[0]():
                return r
        return None

    def _hand(self, rank: int, nxt: int) -> None:
        self._save(rank)
        self.go[nxt].set()
        self.go[rank].wait()
        self.go[rank].clear()
        self._restore(rank)

    def block(self, rank: int, ready, what: str, peers: list[int]) -> None:
        """Let the other ranks run until ``ready()``; a deadlock or an abort raises instead."""
        while not ready():
            if self.aborted is not None:
                raise RankAborted(f"rank {rank} stopped because {self.aborted}")
            self.waits[rank] = (ready, what, peers)
            nxt = self._next(rank)
            if nxt is None or nxt == rank:
                del self.waits[rank]
                report = self.describe(rank, what, peers)
                self.aborted = f"of a deadlock ({report})"
                raise DeadlockError(f"deadlock: no rank can move. {report}")
            self._hand(rank, nxt)
            del self.waits[rank]

    def describe(self, rank: int, what: str, peers: list[int]) -> str:
        lines = [f"rank {rank} waits in {what} for ranks {peers}"]
        for r in sorted(self.waits):
            if r != rank:
                _, w, p = self.waits[r]
                lines.append(f"rank {r} waits in {w} for ranks {p}")
        lines += [f"rank {r} has {'failed' if r in self.failed else 'finished'}" for r in sorted(self.done)]
        return "; ".join(lines)

    def abort(self, message: str) -> None:
        if self.aborted is None:
            self.aborted = message

    def finish(self, rank: int, failed: bool, abandon: bool = False) -> bool:
        """Rank ``rank`` returned or raised: the turn goes on, or the launch is over.

        ``abandon`` (from the launcher's thread): ``rank`` still holds the turn but cannot be stopped; it counts as
        failed and its thread, when it ends, changes nothing here. False when it gave the turn back meanwhile."""
        with self.lock:
            if rank in self.abandoned:
                return False
            if abandon:
                if rank in self.done or self.running != rank:
                    return False
                self.abandoned.add(rank)
            self._finish(rank, failed or abandon, save=not abandon)
        return True

    def _finish(self, rank: int, failed: bool, save: bool) -> None:
        self.done.add(rank)
        if failed:
            self.failed.add(rank)
        if save:
            self._save(rank)
        self.running = None
        if len(self.done) == self.world:
            self.finished.set()
            return
        nxt = self._next(rank)
        if nxt is None:  # everyone left waits for someone: nobody can move again
            first = min(self.waits)
            _, what, peers = self.waits[first]
            self.abort(f"of a deadlock ({self.describe(first, what, peers)})")
            nxt = first
        self.go[nxt].set()

    def interrupt(self, why: str) -> None:
        """From the launcher's thread: stop the running rank with RankAborted (Ctrl-C, deadline)."""
        self.abort(why)
        r = self.running
        ident = self.threads.get(r) if r is not None else None
        if ident is not None and r not in self.interrupted:
            self.interrupted.add(r)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(RankAborted))

    def where(self, rank: int) -> str:
        """The lines ``rank``'s thread is on now, its own frames only (below ``fn``'s caller here)."""
        frame = sys._current_frames().get(self.threads.get(rank))
        if frame is None:
            return ""
        frames = traceback.extract_stack(frame)
        ours = [i for i, f in enumerate(frames) if f.filename == __file__]
        return "".join(traceback.format_list(frames[ours[-1] + 1 if ours else 0 :][-8:]))

    def overstay(self, t0: float, deadline: float | None, timeout: float) -> tuple[int, str] | None:
        """(rank, why) when the running rank has overstayed: past the deadline, or a turn of more than ``timeout``
        seconds while another rank waits for a message or has returned (a rank process would have timed out)."""
        r = self.running
        if r is None:
            return None
        now = time.monotonic()
        if deadline is not None and now - t0 > deadline:
            return r, f"the launch's deadline of {deadline:g} s"
        if now - self.since > timeout:
            waiting = sorted(w for w in self.waits if w != r)
            if waiting:
                return r, (f"{timeout:g} s (the timeout) into its turn, while ranks {waiting} waited in a "
                           f"communication call")
            if self.done:
                return r, f"{timeout:g} s (the timeout) after rank {min(self.done)} returned"
        return None


def launch_inprocess(fn, world_size: int, args: tuple, kwargs: dict | None, cluster: Cluster | None,
                     timeout: float, quiet: bool, deadline: float | None, represent=None):
    """Run ``fn`` on ``world_size`` thread-ranks taking turns; the LaunchResult or the RankError of the failure.

    ``represent`` (shape-only runs of many ranks): a function giving each rank the rank that stands for it;
    only the representatives run, their messages to and from the others are mirrored (``inprocess_transport``)
    and every rank's entry of the result is its representative's."""
    cluster = (cluster if cluster is not None else Cluster.dgx_h100()).for_world(world_size)
    rep = list(range(world_size)) if represent is None else [int(represent(r)) for r in range(world_size)]
    ranks = sorted(set(rep))
    if any(rep[r] != r for r in ranks):
        raise ValueError("launch: a representative must represent itself (represent(represent(r)) == represent(r))")
    turns = Turns(ranks)
    exchange = Exchange(world_size, rep)
    live = LiveView(world_size, quiet)
    real = sys.stdout, sys.stderr
    reports: dict[int, tuple] = {}
    order: list[int] = []

    def shown(call):  # the live view prints to the launcher's streams, not to the rank's capture
        def f(*a):
            saved = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = real
            try:
                call(*a)
            finally:
                sys.stdout, sys.stderr = saved
        return f

    def body(rank: int, ctx, recorder, out) -> None:
        turns.start(rank)
        try:
            try:
                if turns.aborted is not None:  # its first turn came after the launch had failed: nothing to run
                    raise RankAborted(f"rank {rank} stopped before it began because {turns.aborted}")
                value = fn(*args, **(kwargs or {}))
                ctx.transport.flush()
                reports[rank] = ("ok", value, ctx.clock.end(), ctx.memory, recorder.events, out.getvalue())
            except BaseException as e:
                if not isinstance(e, RankAborted):
                    turns.abort(f"rank {rank} raised {type(e).__name__}: {reason(e)}")
                why = reason(e) or f"rank {rank} was stopped because {turns.aborted}"  # raised from the launcher
                try:
                    exc = dill.dumps(e)
                except Exception:
                    exc = None
                reports[rank] = ("error", type(e).__name__, why, traceback.format_exc(), exc, out.getvalue())
            order.append(rank)
        finally:
            turns.finish(rank, reports.get(rank, ("error",))[0] == "error")

    threads = []
    for r in ranks:
        recorder = Recorder(r)
        clock = Clock(r, cluster, recorder)
        ledger = MemoryLedger(cluster.hbm, r)
        ledger.attach_clock(clock.now)
        ctx = context.RankContext(r, world_size, cluster, clock, ledger,
                                  InProcessTransport(r, exchange, turns, clock, timeout), timeout)
        ctx.recorder = recorder
        ctx.report_progress = shown(lambda done, total, what, r=r: live.report(r, done, total, what))
        out = RankStream(shown(lambda text, r=r: live.output(r, text)))
        turns.seed_state(r, ctx, out)
        threads.append(threading.Thread(target=body, args=(r, ctx, recorder, out), name=f"minidist-rank-{r}",
                                        daemon=True))
    launcher = [getattr(mod, attr) for mod, attr in turns.mods]
    stopped: dict[int, tuple] = {}  # rank -> (when, what it was doing, where) of a rank that overstayed
    t0 = time.monotonic()
    for t in threads:
        t.start()
    turns.go[ranks[0]].set()
    try:
        while not turns.finished.wait(0.05):
            late = turns.overstay(t0, deadline, timeout)
            if late is None:
                continue
            r, why = late
            if r not in stopped:
                stopped[r] = (time.monotonic(), f"rank {r} was still running its own code at {why} and was stopped",
                              turns.where(r))
                turns.interrupt(f"the launcher stopped rank {r}: it ran past {why}")
            elif time.monotonic() - stopped[r][0] > STOP_GRACE:  # it cannot be stopped: the launch ends without it
                turns.finish(r, True, abandon=True)
    except KeyboardInterrupt:
        turns.interrupt("the launch was interrupted (Ctrl-C)")
        turns.finished.wait(2.0)
        raise
    finally:
        for (mod, attr), v in zip(turns.mods, launcher):
            setattr(mod, attr, v)
    for r, t in zip(ranks, threads):
        if r not in turns.abandoned:
            t.join()
    wall = time.monotonic() - t0
    reports = {r: rp for r, rp in dict(reports).items() if r not in turns.abandoned}  # (one may end meanwhile)
    live.close({r: rp[-1] for r, rp in reports.items()})
    errors = {r: rp[1:5] for r, rp in reports.items() if rp[0] == "error"}
    for r, (_, doing, where) in stopped.items():
        if r in turns.abandoned:
            doing += (f"; its thread did not give the turn back within {STOP_GRACE:g} s (it is in a system call or in "
                      f"C code: time.sleep, a lock, a long numpy call) and a thread cannot be killed, so it is "
                      f"abandoned: a daemon thread, it ends when that call returns and does not keep Python from "
                      f"exiting")
        errors[r] = ("DeadlineExceeded", doing, where, None)
    if errors:
        order = [r for r in order if r in errors and r not in stopped]
        raise failure(errors, list(stopped) + order)
    res = LaunchResult([reports[rep[r]][1] for r in range(world_size)], [reports[rep[r]][2] for r in range(world_size)],
                       [reports[rep[r]][3] for r in range(world_size)],
                       Trace.from_recorders({r: reports[r][4] for r in ranks}),
                       [reports[rep[r]][5] for r in range(world_size)])
    res.representatives = rep
    res.wall = wall
    return res
