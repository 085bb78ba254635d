"""Comm: what an algorithm file sees of a collective in progress on one rank.

Ranks are group-local indices ``0 .. size-1``. The comm stream has a cursor ``now``: ``isend`` and
``irecv`` start at the cursor, ``wait`` moves it to the latest completion among the handles
waited for. So a step written as "send to the right, receive from the left, wait for both" costs
one message time, and the simulated time of the whole collective *emerges* from its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, islice

import numpy as np

from minidist.hardware.cluster import Cluster
from minidist.runtime.ops import UFUNCS, ReduceOp


class Pieces(list):
    """Consecutive views of one flat buffer, as a list, that remembers the buffer: a run of pieces is then
    one slice of it (``run``), with no need to prove from addresses that the views lie back to back."""

    __slots__ = ("whole", "starts")

    def run(self, lo: int, hi: int) -> np.ndarray:
        """Pieces ``lo .. hi-1`` as one view."""
        return self.whole[self.starts[lo] : self.starts[hi]]


def pieces(flat: np.ndarray, sizes: Sequence[int]) -> Pieces:
    """Consecutive views of flat ``flat`` with the given sizes (np.split spends microseconds on small arrays)."""
    starts = _STARTS.get(sizes) if type(sizes) is tuple else None
    if starts is None:
        starts = [0, *accumulate(sizes)]
        if type(sizes) is tuple:
            if len(_STARTS) > 1024:
                _STARTS.clear()
            _STARTS[sizes] = starts
    out = Pieces([flat[a:b] for a, b in zip(starts, islice(starts, 1, None))])
    out.whole, out.starts = flat, starts
    return out


_STARTS: dict[tuple, list] = {}  # piece sizes -> their offsets (small collectives cut alike call after call)


class _Cursor:
    __slots__ = ("t",)

    def __init__(self, t: float) -> None:
        self.t = t


class Comm:
    """A group-local view of one collective call: ``rank``, ``size``, ``ranks``, p2p steps and the cursor."""

    def __init__(self, ctx, ranks: Sequence[int], cursor: _Cursor, tag_base: int, sig: bytes, name: str) -> None:
        self._ctx, self._tp = ctx, ctx.transport
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(ctx.rank)
        self.cluster: Cluster = ctx.cluster
        self._cursor, self._tag_base, self._sig, self.name = cursor, tag_base, sig, name

    @property
    def in_place_bytes(self) -> int:
        """Messages larger than this are read by the receiver straight from the sender's buffer (cma.py)."""
        return self._tp.rendezvous_bytes

    # -- time ------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """The comm-stream cursor of this rank, in simulated seconds."""
        return self._cursor.t

    # -- point to point (peer = group-local index) -------------------------------------------
    def _tag(self, tag: int) -> int:
        if not 0 <= tag < 64:
            raise ValueError(f"{self.name}: internal tag must be in 0..63, got {tag}")
        return self._tag_base - tag

    def isend(self, buf: np.ndarray, peer: int, tag: int = 0):
        """Start sending ``buf`` (C-contiguous; do not modify it until waited) to group rank ``peer``.

        The handle completes once the bytes are in the channel; a message above ``in_place_bytes`` is
        read by the receiver straight from ``buf``, so its handle completes when that read is done.
        """
        return self._tp.isend(buf, self.ranks[peer], self._tag(tag), self._cursor.t, self._sig, self.name, True)

    def irecv(self, buf: np.ndarray, peer: int, tag: int = 0, op: ReduceOp | None = None, held: bool = False):
        """Start receiving into ``buf``; with ``op``, combine the incoming data into ``buf`` in place.

        A ``held`` receive takes only its header when the message comes, and its bytes once ``wait_times``
        has seen that header (or ``wait`` is called): a rank with sends still to offer offers them first.
        """
        ufunc = None if op is None else op.ufunc
        return self._tp.irecv(buf, self.ranks[peer], self._tag(tag), self._cursor.t, ufunc, self._sig, self.name,
                              held)

    def wait(self, *handles) -> None:
        """Wait for all ``handles``; the cursor moves to the latest of their completions."""
        hs = [h for h in handles if h is not None]
        if not hs:
            return
        self._tp.wait(hs)
        self._advance(hs)

    def wait_times(self, *handles, meanwhile=None) -> bool:
        """Move the cursor as ``wait`` would, needing only when each message ends in simulated time.

        Physical and simulated time are separate: a send's times are fixed when it is posted and a
        receive's as soon as its header is in, so this can return while the bytes are still moving
        (``wait`` the handles before using their buffers). A rank can then offer its next step's message
        without first copying this step's bytes. ``meanwhile()`` (local work, run at most once) fills
        the wait if a time is not known yet; returns whether it ran.
        """
        hs = [h for h in handles if h is not None]
        ran = self._tp.wait_times(hs, meanwhile) if hs else False
        self._advance(hs)
        return ran

    def _advance(self, hs) -> None:
        t = self._cursor.t
        for h in hs:
            if h.end > t:
                t = h.end
        self._cursor.t = t

    def send(self, buf: np.ndarray, peer: int, tag: int = 0) -> None:
        self.wait(self.isend(buf, peer, tag))

    def recv(self, buf: np.ndarray, peer: int, tag: int = 0, op: ReduceOp | None = None) -> None:
        self.wait(self.irecv(buf, peer, tag, op))

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int, tag: int = 0,
                 op: ReduceOp | None = None) -> None:
        """Send to ``dst`` and receive (or reduce, with ``op``) from ``src`` at the same time.

        With ``op``, ``recvbuf`` may be ``sendbuf`` itself: this rank's values leave before the partner's
        are combined into them (recursive doubling's step, without a scratch buffer).
        """
        tp, ufunc, t0 = self._tp, None if op is None else UFUNCS[op], self._cursor.t
        peer_out, peer_in = self.ranks[dst], self.ranks[src]
        wire_tag = self._tag_base - tag if tag == 0 else self._tag(tag)
        t = tp.sendrecv_small(sendbuf, peer_out, recvbuf, peer_in, wire_tag, t0, self._sig, self.name, ufunc)
        if t is None:  # too large, or other messages in flight: the queued path
            into = recvbuf if recvbuf is not sendbuf else np.empty_like(recvbuf)  # it may receive before sending
            # ours is offered first: posting the receive may read (or reduce) the peer's whole message at once,
            # and a peer that got here first would sit idle until ours appeared
            s = tp.isend(sendbuf, peer_out, wire_tag, t0, self._sig, self.name, True)
            r = tp.irecv(into, peer_in, wire_tag, t0, None if into is not recvbuf else ufunc, self._sig, self.name)
            tp.wait([s, r])
            if into is not recvbuf:
                if ufunc is None:
                    recvbuf[...] = into
                else:
                    ufunc(recvbuf, into, out=recvbuf)
            t = s.end if s.end > r.end else r.end
        if t > t0:
            self._cursor.t = t

    def exchange(self, sends: Sequence[tuple[np.ndarray, int]], recvs: Sequence[tuple[np.ndarray, int]] = (),
                 chain: bool = False) -> None:
        """Send every ``(buf, peer)`` of ``sends`` and receive every ``(buf, peer)`` of ``recvs``, all at once.

        The sends start together at the cursor, each on its own link; with ``chain`` each starts when the one
        before it has arrived (a rank serving its peers one after another). The receives are posted at the
        cursor and taken in whatever order they arrive; the cursor moves to the latest completion. The same
        times as ``isend``/``irecv`` of each and one ``wait`` (``send`` after ``send``, with ``chain``), for a
        fraction of the work: small messages are posted together and what has arrived is read in one pass.
        A peer appears at most once in each list, and never this rank itself.
        """
        tp, t0, tag = self._tp, self._cursor.t, self._tag_base
        ranks = self.ranks
        fast = getattr(tp, "exchange_small", None)
        t = None if fast is None else fast([(b, ranks[i]) for b, i in sends], [(b, ranks[i]) for b, i in recvs],
                                           tag, t0, self._sig, self.name, chain)
        if t is None:  # large messages, other messages in flight, or another backend: one by one
            hs, t = [], t0
            for b, i in sends:
                h = tp.isend(b, ranks[i], tag, t if chain else t0, self._sig, self.name, True)
                if chain:
                    tp.wait([h])
                    t = h.end if h.end > t else t
                else:
                    hs.append(h)
            hs += [tp.irecv(b, ranks[i], tag, t0, None, self._sig, self.name) for b, i in recvs]
            if hs:
                tp.wait(hs)
            for h in hs:
                if h.end > t:
                    t = h.end
        if t > self._cursor.t:
            self._cursor.t = t

    def sendrecv_during(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int, local) -> None:
        """``sendrecv`` with ``local()`` (say, copying this rank's own block) done while the messages move.

        A message above ``in_place_bytes`` is read by the receiver straight from ``sendbuf`` (cma.py), so
        the copy runs at the same time as the peer's read instead of before it. Small messages gain
        nothing from that: they do the local work first and take the fast exchange.
        """
        if sendbuf.nbytes <= self.in_place_bytes:
            local()
            self.sendrecv(sendbuf, dst, recvbuf, src)
            return
        s = self.isend(sendbuf, dst)  # offered first, as in sendrecv
        r = self.irecv(recvbuf, src)
        local()
        self.wait(s, r)

    # -- MPI's own collectives (native.py) ------------------------------------------------------
    def wait_request(self, req) -> None:
        """Wait for a non-blocking MPI request with this transport's timeout (MPI backend only)."""
        self._tp.wait_native(req, f"{self.name} (MPI's own collective on ranks {list(self.ranks)})")

    def advance(self, seconds: float) -> None:
        """Move the cursor by ``seconds`` (a closed form charged for work the messages did not show)."""
        self._cursor.t += seconds

    # -- structure ---------------------------------------------------------------------------
    def sub(self, members: Sequence[int]) -> Comm:
        """A Comm over some of this group's ranks (group-local indices), sharing this rank's cursor.

        Every rank of the sub-group must make the same call; phases stay ordered because messages
        between two ranks never overtake each other.
        """
        members = list(members)
        if self.rank not in members:
            raise ValueError(f"{self.name}: sub-group {members} does not contain this rank ({self.rank})")
        return Comm(self._ctx, [self.ranks[i] for i in members], self._cursor, self._tag_base, self._sig, self.name)

    def node(self, i: int) -> int:
        """Node of group rank ``i`` in the cluster (for topology-aware algorithms)."""
        return self.cluster.node_of(self.ranks[i])

    def link(self, i: int, j: int):
        """The Link between group ranks ``i`` and ``j``."""
        return self.cluster.link(self.ranks[i], self.ranks[j])

    def __repr__(self) -> str:
        return f"Comm({self.name}, rank {self.rank} of {self.size}, ranks={list(self.ranks)}, now={self.now:.6g})"
