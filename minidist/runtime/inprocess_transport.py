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
every member of the group then does what this rank does, step for step, so the message this rank receives
from an unsimulated peer is the mirror image of the one it sends to an unsimulated peer in the same step:
sent at the same moment, of the size it receives, over the link from that peer. The k-th receive with a tag
from an unsimulated rank is paired with the k-th send of the same call with that tag to one, and a real array in
it (the token counts of experts routed by plan) holds this rank's own values, which every represented rank
shares. Exact for algorithms in which every member takes the same steps (ring, bidirectional ring, pairwise,
recursive doubling and halving on powers of two) on groups whose links are alike; a receive that never finds
its mirror is a deadlock, named. A root that only sends (a broadcast) hears nothing back, so nothing here can
tell when its receivers finish: the collectives refuse those whose receivers finish at other moments than the
root (``collectives.finishes_with_root``, asked through ``represents``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minidist.autograd.shape_only import ShapeArray
from minidist.runtime.errors import DeadlockError, MismatchError, PeerExitedError, RankAborted
from minidist.runtime.transport import _fmt


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

    def __init__(self, world: int, simulated: set[int] | None = None) -> None:
        self.world = world
        self.simulated = set(range(world)) if simulated is None else simulated
        self.queued: dict[tuple[int, int], deque] = {}  # (src, dst) -> messages nobody has taken yet
        self.posted: dict[tuple[int, int], list[_Recv]] = {}  # (src, dst) -> receives waiting for a message
        self.calls: dict[tuple[int, int], tuple[int, bytes]] = {}  # (rank, group key) -> (seq, signature)


class _Board:
    """The simulator's board, as far as collectives use it: an abort reaches every rank through the turns."""

    def __init__(self, turns) -> None:
        self.turns = turns

    def abort(self, message: str, mismatch: bool = False) -> None:
        self.turns.abort(message)


class InProcessTransport:
    """The message engine of one thread-rank (same interface as ``transport.Transport``)."""

    rendezvous_bytes = 1 << 62  # nothing is read in place: the algorithms take their plain path

    def __init__(self, rank: int, exchange: Exchange, turns, clock, timeout: float) -> None:
        self.rank, self.world, self.ex, self.turns = rank, exchange.world, exchange, turns
        self.clock, self.timeout = clock, timeout
        self.board = _Board(turns)
        self.coll = None
        self.mine: list = []  # receives not yet complete (flush waits for them)
        # (tag, call) -> (start time, values) of sends to unsimulated ranks not yet paired with a receive; keyed by
        # the call too, so what a rooted broadcast sent (nothing comes back) never pairs with a later collective
        self.mirror_sent: dict[tuple, deque] = {}
        self.mirror_wait: dict[tuple, deque] = {}  # (tag, call) -> receives from unsimulated ranks awaiting a pair

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
            return self._mirror_send(arr, dst, (tag, sig), ready, name)
        if dst in self.turns.done:
            raise PeerExitedError(f"{name}: rank {self.rank} sends to rank {dst} (tag {tag}) but rank {dst} has "
                                  f"{'failed' if dst in self.turns.failed else 'finished'}")
        start, end = self.clock.message(dst, arr.nbytes, ready)
        op = _Send(dst, tag, name, start, end)
        msg = _Message(self.rank, tag, arr, start, end, sig, None if eager else op)
        r = _take(self.ex.posted.get((self.rank, dst), ()), tag)
        if r is not None:
            self._deliver(r, msg)
            return op
        if msg.data is not None:
            msg.data = arr.copy()  # the sender may reuse its buffer as soon as the send is done
        self.ex.queued.setdefault((self.rank, dst), deque()).append(msg)
        return op

    def irecv(self, arr: np.ndarray, src: int, tag: int, ready: float, ufunc=None, sig: bytes = b"",
              name: str = "recv", held: bool = False) -> _Recv:
        op = _Recv(src, tag, arr, ufunc, sig, name, ready)
        if src not in self.ex.simulated:
            sent = self.mirror_sent.get((tag, sig))
            if sent:
                self._mirror_arrive(op, sent.popleft())
            else:
                self.mirror_wait.setdefault((tag, sig), deque()).append(op)
                self.mine.append(op)
            return op
        m = _take(self.ex.queued.get((src, self.rank), ()), tag)
        if m is not None:
            self._deliver(op, m)
            return op
        self.ex.posted.setdefault((src, self.rank), []).append(op)
        self.mine.append(op)
        return op

    def _mirror_send(self, arr: np.ndarray, dst: int, key: tuple, ready: float, name: str) -> _Send:
        start, end = self.clock.message(dst, arr.nbytes, ready)
        sent = (start, None if isinstance(arr, ShapeArray) else arr.copy())
        waiting = self.mirror_wait.get(key)
        if waiting:
            self._mirror_arrive(waiting.popleft(), sent)
        else:
            self.mirror_sent.setdefault(key, deque()).append(sent)
        return _Send(dst, key[0], name, start, end)

    def _mirror_arrive(self, op: _Recv, sent: tuple) -> None:
        """Complete a receive from an unsimulated peer: its send left when this rank's mirror send did, and held
        what this rank's held (real arrays in a shape-only run are counts that every represented rank agrees on)."""
        start, values = sent
        link = self.clock.cluster.link(op.peer, self.rank)
        arrival = start + link.alpha + op.buf.nbytes / link.beta
        if values is not None and not isinstance(op.buf, ShapeArray) and values.nbytes == op.buf.nbytes:
            flat = op.buf.reshape(-1)
            if op.ufunc is None:
                flat[...] = values.reshape(-1).view(flat.dtype)
            else:
                op.ufunc(flat, values.reshape(-1).view(flat.dtype), out=flat)
        op.end = arrival if arrival > op.post else op.post
        op.done = True

    def sendrecv_small(self, *args, **kwargs) -> None:
        return None  # the general path is already direct here

    def _deliver(self, op: _Recv, m: _Message) -> None:
        problem = self._check(op, m)
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

    def _check(self, op: _Recv, m: _Message) -> str | None:
        if m.sig != op.sig:
            theirs = m.sig.decode(errors="replace") or "a point-to-point send"
            mine = op.sig.decode(errors="replace") or "a point-to-point recv"
            return f"ranks disagree about a collective call: rank {m.src} called {theirs}; rank {op.peer} called {mine}"
        if m.dtype != op.buf.dtype or m.nbytes != op.buf.nbytes:
            me = op.buf
            return (f"{op.name}: message from rank {m.src} (tag {m.tag}) does not fit: rank {m.src} sent "
                    f"{_fmt(m.shape, m.dtype)} ({m.nbytes} bytes) but the receiver takes {_fmt(me.shape, me.dtype)} "
                    f"({me.nbytes} bytes)")
        return None

    # -- waiting -------------------------------------------------------------------------------
    def progress(self) -> bool:
        return False  # messages move when they are sent

    def pending(self) -> bool:
        return any(not op.done for op in self.mine)

    def wait(self, ops, timeout: float | None = None) -> None:
        """Until every op is done, let the other ranks run; raise what a refused message said."""
        unmirrored = [op for op in ops if not op.done and op.peer not in self.ex.simulated]
        if unmirrored:  # only this rank's own later sends could pair them, and it is waiting
            op = unmirrored[0]
            call = f"{op.name}'s algorithm" if self.coll is None else self.coll[3].decode(errors="replace")
            raise DeadlockError(
                f"rank {self.rank} waits in {op.describe()} for rank {op.peer}, which is represented by a simulated "
                f"rank, before sending the step's mirror message: in {call} the members do not all take the same "
                f"steps (a tree, a root, or halving/doubling on a group whose size is not a power of two), so "
                f"representatives cannot stand for them; pass algorithm='ring' (ParallelConfig(algorithm='ring') in "
                f"train), or bidirectional_ring, hierarchical, pairwise, and halving_doubling or recursive_doubling "
                f"on powers of two")
        if not all(op.done for op in ops):
            self.turns.block(self.rank, lambda: all(op.done for op in ops),
                             ", ".join(op.describe() for op in ops if not op.done),
                             sorted({op.peer for op in ops if not op.done}))
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
