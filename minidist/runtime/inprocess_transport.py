"""Point-to-point messages between ranks that are threads of one process (``inprocess_launch.py``).

The same interface, headers and simulated times as ``transport.py``: the sender books its link on the
simulated clock (``Clock.message``), the message carries its start and arrival times, and a receive
completes at ``max(arrival, when it was posted)``. So every clock advances exactly as with one process
per rank, and every result is bitwise the same. What changes is the engine: a message is a Python object
handed over in memory, matched by tag (a receive takes the first message with its tag, a message the
first receive posted for it), and a rank that must wait gives the turn to another rank (``Turns``)
instead of sleeping. Only one rank runs at a time, so nothing here needs a lock.

Shape-only arrays (``autograd/shape_only.py``) travel as their header alone: there are no bytes to move.

Mirrors. In a shape-only run of many ranks only one rank per symmetry class runs (``represent`` in
``inprocess_launch.py``); a rank that is not simulated behaves like its representative. Within a collective
every member of the group then does what its representative does, step for step. So when rank C receives
from an unsimulated rank D, the message is the mirror image of one a simulated rank sends: the one D's
representative A sends to an unsimulated rank that C stands for, in the same step (sent at the same moment,
of the size C receives, over the link from D). The k-th receive of a call with a tag by C from ranks A stands
for is paired with the k-th send of that call with that tag by A to ranks C stands for. Often A is C itself
(one simulated member in the group: a data-parallel group); when several members run (context-parallel ranks
in a data-parallel ring), A is another of them. A real array in the message (the token counts of experts
routed by plan) holds A's values, which every rank A stands for shares. Exact for algorithms in which every
member takes the same steps (ring, bidirectional ring, pairwise, recursive doubling and halving on powers of
two) on groups whose links are alike; a receive whose mirror no simulated rank sends is a deadlock, named.
A root that only sends (a broadcast) hears nothing back, so nothing here can tell when its receivers finish:
the collectives refuse those whose receivers finish at other moments than the root
(``collectives.finishes_with_root``, asked through ``represents``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minidist.autograd.shape_only import ShapeArray
from minidist.runtime.errors import DeadlockError, MismatchError, PeerExitedError, RankAborted, misfit


def _take(items, tag: int):
    """Remove and return the first of ``items`` (messages or receives) with ``tag``, or None."""
    for i, x in enumerate(items):
        if x.tag == tag:
            del items[i]
            return x
    return None


class _Send:
    __slots__ = ("peer", "tag", "name", "start", "end", "done", "error")

    def __init__(self, peer, tag, name, start, end):
        self.peer, self.tag, self.name, self.start, self.end = peer, tag, name, start, end
        self.done, self.error = True, None  # handed over at once: see isend

    def describe(self) -> str:
        return f"{self.name}(dst={self.peer}, tag={self.tag})"


class _Recv:
    __slots__ = ("peer", "tag", "buf", "ufunc", "sig", "name", "post", "end", "done", "error")

    def __init__(self, peer, tag, buf, ufunc, sig, name, post):
        self.peer, self.tag, self.buf, self.ufunc, self.sig, self.name = peer, tag, buf, ufunc, sig, name
        self.post, self.end, self.done, self.error = post, 0.0, False, None

    def describe(self) -> str:
        return f"{self.name}(src={self.peer}, tag={self.tag})"


class _Message:
    __slots__ = ("src", "tag", "nbytes", "dtype", "shape", "start", "end", "sig", "data", "send")

    def __init__(self, src, tag, arr, start, end, sig, send):
        self.src, self.tag, self.nbytes, self.dtype, self.shape = src, tag, arr.nbytes, arr.dtype, arr.shape
        self.start, self.end, self.sig, self.send = start, end, sig, send
        self.data = None if isinstance(arr, ShapeArray) or not arr.nbytes else arr


class Exchange:
    """What the ranks of one in-process world share: the messages in flight and the collective calls seen."""

    def __init__(self, world: int, rep: list[int] | None = None) -> None:
        self.world = world
        self.rep = list(range(world)) if rep is None else rep  # rank -> the simulated rank standing for it
        self.simulated = set(self.rep)
        # (tag, call, sender, receiver's representative) -> (start, values) of sends to unsimulated ranks not yet
        # paired with a receive; keyed by the call too, so what a rooted broadcast sent (nothing comes back) never
        # pairs with a later collective. And the receives from unsimulated ranks awaiting their pair, by the same key.
        self.mirror_sent: dict[tuple, deque] = {}
        self.mirror_wait: dict[tuple, deque] = {}
        self.queued: dict[tuple[int, int], deque] = {}  # (src, dst) -> messages nobody has taken yet
        self.posted: dict[tuple[int, int], list[_Recv]] = {}  # (src, dst) -> receives waiting for a message
        self.calls: dict[tuple[int, int], tuple[int, bytes]] = {}  # (rank, group key) -> (seq, signature)


class _Board:
    """The simulator's board, as far as collectives use it: an abort reaches every rank through the turns."""

    def __init__(self, turns) -> None:
        self.turns = turns

    def abort(self, message: str, mismatch: bool = False) -> None:
        self.turns.abort(message)


def _mirror_arrive(op: _Recv, sent: tuple, receiver: int, cluster) -> None:
    """Complete ``receiver``'s receive from an unsimulated peer: its send left when its mirror send did, and held
    what that one held (real arrays in a shape-only run are counts that every represented rank agrees on)."""
    start, values = sent
    link = cluster.link(op.peer, receiver)
    arrival = start + link.alpha + op.buf.nbytes / link.beta
    if values is not None and not isinstance(op.buf, ShapeArray) and values.nbytes == op.buf.nbytes:
        flat = op.buf.reshape(-1)
        if op.ufunc is None:
            flat[...] = values.reshape(-1).view(flat.dtype)
        else:
            op.ufunc(flat, values.reshape(-1).view(flat.dtype), out=flat)
    op.end = arrival if arrival > op.post else op.post
    op.done = True


class InProcessTransport:
    """The message engine of one thread-rank (same interface as ``transport.Transport``)."""

    backend = "inprocess"  # what md.dist.get_backend() answers

    rendezvous_bytes = 1 << 62  # nothing is read in place: the algorithms take their plain path

    def __init__(self, rank: int, exchange: Exchange, turns, clock, timeout: float) -> None:
        self.rank, self.world, self.ex, self.turns = rank, exchange.world, exchange, turns
        self.clock, self.timeout = clock, timeout
        self.board = _Board(turns)
        self.coll = None
        self.mine: list = []  # receives not yet complete (flush waits for them)

    # -- posting ---------------------------------------------------------------------------
    def isend(self, arr: np.ndarray, dst: int, tag: int, ready: float, sig: bytes = b"", name: str = "send",
              eager: bool = False) -> _Send:
        """Hand ``arr`` to ``dst``; the send is done at once (its end is the arrival its link booked).

        Over shared memory a waiting receiver takes every message off its channels, setting aside those it
        has not asked for yet, so a send only ever waits for a receiver that is busy or gone; here a
        receiver that is gone is the one case to refuse.
        """
        if self.turns.aborted is not None:
            raise RankAborted(f"rank {self.rank} stopped because {self.turns.aborted}")
        if dst not in self.ex.simulated:
            return self._mirror_send(arr, dst, (tag, sig, self.rank, self.ex.rep[dst]), ready, name)
        if dst in self.turns.done:
            raise PeerExitedError(f"{name}: rank {self.rank} sends to rank {dst} (tag {tag}) but rank {dst} has "
                                  f"{'failed' if dst in self.turns.failed else 'finished'}")
        start, end = self.clock.message(dst, arr.nbytes, ready)
        op = _Send(dst, tag, name, start, end)
        msg = _Message(self.rank, tag, arr, start, end, sig, None if eager else op)
        r = _take(self.ex.posted.get((self.rank, dst), ()), tag)
        if r is not None:
            self._deliver(r, msg, dst)
            return op
        if msg.data is not None:
            msg.data = arr.copy()  # the sender may reuse its buffer as soon as the send is done
        self.ex.queued.setdefault((self.rank, dst), deque()).append(msg)
        return op

    def irecv(self, arr: np.ndarray, src: int, tag: int, ready: float, ufunc=None, sig: bytes = b"",
              name: str = "recv", held: bool = False) -> _Recv:
        op = _Recv(src, tag, arr, ufunc, sig, name, ready)
        if src not in self.ex.simulated:
            key = (tag, sig, self.ex.rep[src], self.rank)
            sent = self.ex.mirror_sent.get(key)
            if sent:
                _mirror_arrive(op, sent.popleft(), self.rank, self.clock.cluster)
            else:
                self.ex.mirror_wait.setdefault(key, deque()).append((op, self.rank))
                self.mine.append(op)
            return op
        m = _take(self.ex.queued.get((src, self.rank), ()), tag)
        if m is not None:
            self._deliver(op, m, self.rank)
            return op
        self.ex.posted.setdefault((src, self.rank), []).append(op)
        self.mine.append(op)
        return op

    def _mirror_send(self, arr: np.ndarray, dst: int, key: tuple, ready: float, name: str) -> _Send:
        start, end = self.clock.message(dst, arr.nbytes, ready)
        sent = (start, None if isinstance(arr, ShapeArray) else arr.copy())
        waiting = self.ex.mirror_wait.get(key)
        if waiting:
            op, receiver = waiting.popleft()
            _mirror_arrive(op, sent, receiver, self.clock.cluster)
        else:
            self.ex.mirror_sent.setdefault(key, deque()).append(sent)
        return _Send(dst, key[0], name, start, end)

    def sendrecv_small(self, *args, **kwargs) -> None:
        return None  # the general path is already direct here

    def _deliver(self, op: _Recv, m: _Message, dst: int) -> None:
        """Hand ``m`` to rank ``dst``'s receive ``op`` (called by the sender or the receiver, whoever comes last)."""
        problem = self._check(op, m, dst)
        if problem:
            op.error = problem
            if m.send is not None:  # a plain send hears of it too, as over shared memory
                m.send.error = problem
        elif m.data is not None:
            flat = op.buf.reshape(-1)
            src = m.data.reshape(-1)
            if op.ufunc is None:
                flat[...] = src
            else:
                op.ufunc(flat, src, out=flat)
        op.end = m.end if m.end > op.post else op.post
        op.done = True

    def _check(self, op: _Recv, m: _Message, dst: int) -> str | None:
        if m.sig != op.sig:
            theirs = m.sig.decode(errors="replace") or "a point-to-point send"
            mine = op.sig.decode(errors="replace") or "a point-to-point recv"
            return f"ranks disagree about a collective call: rank {m.src} called {theirs}; rank {dst} called {mine}"
        if m.dtype != op.buf.dtype or m.nbytes != op.buf.nbytes:
            return misfit(op.name, m.src, dst, m.tag, (m.shape, m.dtype, m.nbytes),
                          (op.buf.shape, op.buf.dtype, op.buf.nbytes))
        return None

    # -- waiting -------------------------------------------------------------------------------
    def progress(self) -> bool:
        return False  # messages move when they are sent

    def pending(self) -> bool:
        return any(not op.done for op in self.mine)

    def wait(self, ops, timeout: float | None = None) -> None:
        """Until every op is done, let the other ranks run; raise what a refused message said."""
        if not all(op.done for op in ops):
            try:
                self.turns.block(self.rank, lambda: all(op.done for op in ops),
                                 ", ".join(op.describe() for op in ops if not op.done),
                                 sorted({op.peer for op in ops if not op.done}))
            except DeadlockError as e:
                unmirrored = [op for op in ops if not op.done and op.peer not in self.ex.simulated]
                if not unmirrored:
                    raise
                op = unmirrored[0]  # no simulated rank will send its mirror: the members' steps differ
                call = f"{op.name}'s algorithm" if self.coll is None else self.coll[3].decode(errors="replace")
                raise DeadlockError(
                    f"rank {self.rank} waits in {op.describe()} for rank {op.peer}, which is represented by simulated "
                    f"rank {self.ex.rep[op.peer]}, and no simulated rank sends the mirror message: in {call} the "
                    f"members do not all take the same steps (a tree, a root, or halving/doubling on a group whose "
                    f"size is not a power of two), so representatives cannot stand for them; pass algorithm='ring' "
                    f"(ParallelConfig(algorithm='ring') in train), or bidirectional_ring, hierarchical, pairwise, and "
                    f"halving_doubling or recursive_doubling on powers of two ({e})") from None
        self.mine = [op for op in self.mine if not op.done]
        for op in ops:
            if op.error is not None:
                raise MismatchError(op.error)

    def wait_times(self, ops, meanwhile=None) -> bool:
        """Here a receive's header and bytes come together (an ``irecv``'s ``held`` changes nothing): wait for
        all, leaving ``meanwhile`` to the caller."""
        self.wait(ops)
        return False

    def flush(self) -> None:
        """Finish every receive still in flight (the rank's function returned with some), and refuse to finish
        with a plain send to this rank nobody received: over shared memory its sender would still wait for it."""
        if self.mine:
            self.wait(list(self.mine))
        for src in range(self.world):
            left = [m for m in self.ex.queued.get((src, self.rank), ()) if m.send is not None]
            if left:
                m = left[0]
                raise PeerExitedError(
                    f"rank {self.rank} returned from fn without receiving {m.send.describe()} from rank {src}"
                    f"{f' (+{len(left) - 1} more)' if len(left) > 1 else ''}: every send needs a recv or irecv on its "
                    f"peer, and rank {src} would wait for it forever")

    def close(self) -> None:
        pass

    def ring_all(self) -> None:
        pass

    # -- collectives: every member announces its call, and they must agree ---------------------
    def represents(self, ranks) -> bool:
        """Whether some of ``ranks`` are not run but stood for by their representatives."""
        sims = self.ex.simulated
        return any(r not in sims for r in ranks)

    def publish(self, ranks, key: int, seq: int, sig: bytes, wake: bool = True) -> None:
        self.ex.calls[(self.rank, key)] = (seq, sig)
        self.coll = (ranks, key, seq, sig)

    def agree(self, ranks, key: int, seq: int, sig: bytes, what: str) -> None:
        """Wait until every member has announced call ``seq`` on the group; a different call raises."""
        calls = self.ex.calls

        sims = self.ex.simulated

        def late() -> list[int]:
            return [r for r in ranks if r in sims and calls.get((r, key), (0,))[0] < seq]

        if late():
            self.turns.block(self.rank, lambda: not late(), f"{sig.decode(errors='replace')}: waiting for ranks "
                             f"{late()} to join", late())
        for r in ranks:
            got = calls.get((r, key))
            if got is not None and got[0] == seq and got[1] != sig:
                raise MismatchError(f"ranks disagree about a collective call: rank {r} called "
                                    f"{got[1].decode(errors='replace')}; rank {self.rank} called "
                                    f"{sig.decode(errors='replace')}")
