"""Point-to-point messages over shared memory: one copy in, read or reduce in place, wait cheaply.

Each ordered pair of ranks (src -> dst) owns a channel: a ring of ``nslots`` slots in the shared
segment plus two counters, ``head`` (chunks written, advanced only by src) and ``tail`` (chunks
consumed, advanced only by dst). A message is cut into slot-sized chunks, so a message of any size
streams through a bounded buffer while both sides work on different chunks (pipelining). The first
chunk carries a header: tag, size, dtype, shape, the simulated start/arrival times and, inside a
collective, the call's signature, which is how ranks catch disagreeing arguments.

* The sender copies each chunk once into a free slot. A send completes when the receiver has
  consumed the whole message (like NCCL, a send needs its receive), which lets a receiver that
  detects a size/dtype mismatch refuse the message (``nack``) so that *both* sides raise.
* The receiver copies a chunk straight into its buffer, or reduces it in place
  (``ufunc(buf, slot, out=buf)``) without a temporary: what reduction collectives are made of.
* Messages between a pair stay in order; a receive takes the first message with its tag, and
  messages with other tags that arrive first are set aside (copied out) until asked for.
* A message larger than ``RENDEZVOUS_BYTES`` travels as its header alone, with the address of the
  sender's buffer: the receiver copies or reduces it straight out of the sender's memory
  (``cma.py``, when the kernel allows it) and then frees the slot, which completes the send. One
  copy instead of two, and no back-and-forth over free slots. Such a send completes only once it
  is read (a collective's small sends complete when written); the simulated times are the same.
* A collective's small messages skip the queues: a step with one partner each way is ``sendrecv_small``, a
  step that talks to many peers (``exchange_small``) posts all its sends together and then reads whatever
  has arrived in one pass over its channels, with one fence per pass. Per message that leaves a header, a
  copy and a clock entry: the same bytes, headers and times as the queued path.

Waiting is cheap: one pipe per rank is its doorbell (``doorbell.py``). A rank about to sleep
raises a flag on the channels it waits on and looks once more; whoever changes a flagged channel
rings the bell, and nobody rings a rank that is busy (a wake-up costs far more than a message).
Before sleeping a rank polls for a few tens of microseconds (``spin_seconds``), yielding its core at
every look, so the poll only uses time nobody else on that core wants; a look reads the few control words
that can move what it waits for, and runs a progress pass only when one of them changed.
Sleeps are timed, so a deadlock turns into a report of who waits for whom.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from collections import deque

import numpy as np

from minidist.runtime import cma, deadlock, shm
from minidist.runtime.errors import (
    CommTimeoutError,
    DeadlockError,
    MismatchError,
    PeerExitedError,
    RankAborted,
    misfit,
    process_state,
)
from minidist.runtime.shm import (
    C_CMA,
    C_HEAD,
    C_NACK,
    C_NACK_OFF,
    C_NACKLEN,
    C_RWANT,
    C_TAIL,
    C_WANT,
    HDR_BYTES,
    HEADER,
    SIG_MAX,
)

# Above this, a message is read in place by its receiver: one copy instead of two. Measured on 2 cores,
# 256 KB is where that starts to pay (below it the extra round trip costs more than the copy saved).
RENDEZVOUS_BYTES = 256 * 1024
SPIN_US = 50.0  # default poll before sleeping (see spin_seconds)
NAP_S = 0.01  # a small collective's step naps this long on the doorbell before the general wait takes over
# a timeout report looks again for this long at ranks it saw running: between two of its waits a waiting rank runs
# for a moment, and the report must not call it hung for that (the launcher's own deadline allows for it)
SETTLE_S = 0.25


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def oversubscribed(world: int) -> bool:
    """Whether ``world`` ranks outnumber the cores this process may run on."""
    return world > _cores()


def spin_seconds() -> float:
    """How long a waiting rank polls before it sleeps on its doorbell.

    Sleeping on the doorbell costs a wake-up (tens of microseconds of CPU on both sides) per message;
    like MPI, a waiting rank polls briefly first (``SPIN_US``). A plain poll would hold the core its
    peer needs whenever the two share one, so every look is followed by ``sched_yield`` (the transport's
    ``pause``): a runnable peer on this core runs at once, and the poll ends, still brief, when the time
    is up. Ranks share a core when they outnumber cores (on 2 cores, a 1 KB all-reduce on 4 ranks went
    from about 200 us to 40-80 us), and also when another program holds a core: 2 ranks beside a busy
    process took 140 us a call with plain polls and 17 us with yields, while on an idle machine the
    yields cost nothing measurable (7 us either way). ``MINIDIST_SPIN_US`` sets the poll (0: always
    sleep at once).
    """
    env = os.environ.get("MINIDIST_SPIN_US")
    spin = SPIN_US if env is None or env == "" else float(env)
    return max(0.0, spin) * 1e-6


def unreceived(peer: int, tag: int) -> str:
    """For a point-to-point send whose peer returned: what the program is missing (the in-process backend, which
    runs the peer's return first, says the same from the peer's side)."""
    if tag < 0:  # a collective's message: the peer skipped the collective, which other reports name
        return ""
    return f": rank {peer} returned from fn without a recv or irecv for it (every send needs one on its peer)"


_FENCE = threading.Lock()


def fence() -> None:
    """Make this process's earlier stores visible before its later loads.

    A rank that goes to sleep raises a flag and then looks for work once more; a peer that adds work
    stores it and then looks at the flag. If both loads could overtake the stores, both would miss
    and the sleeper would oversleep (until its timed wait ends). Taking a lock is an atomic
    read-modify-write, which on x86 orders everything around it: the cheapest fence Python offers.
    """
    _FENCE.acquire()
    _FENCE.release()


class SendOp:
    __slots__ = ("peer", "tag", "data", "nbytes", "dtype", "shape", "sig", "name", "off", "chunks",
                 "written", "end_counter", "msg", "start", "end", "done", "error", "eager", "addr")

    def __init__(self, peer, tag, data, nbytes, dtype, shape, sig, name):
        self.peer, self.tag, self.data, self.nbytes = peer, tag, data, nbytes
        self.dtype, self.shape, self.sig, self.name = dtype, shape, sig, name
        self.off = self.chunks = 0
        self.written = self.done = False
        self.end_counter = self.msg = 0
        self.start = self.end = 0.0
        self.error = None
        self.eager = False
        self.addr = 0  # where the receiver reads the bytes from (cma.py); 0: they go through the slots

    def describe(self) -> str:
        if self.tag >= 0:
            return f"{self.name}(dst={self.peer}, tag={self.tag})"
        return f"{self.name} (send to rank {self.peer})"


class RecvOp:
    __slots__ = ("peer", "tag", "buf", "bview", "flat", "ufunc", "sig", "name", "post", "end", "done", "off",
                 "nbytes", "hdr", "error", "held")

    def __init__(self, peer, tag, buf, ufunc, sig, name, post, held=False):
        self.peer, self.tag, self.buf, self.ufunc, self.held = peer, tag, buf, ufunc, held
        self.sig, self.name, self.post = sig, name, post
        self.flat = buf.reshape(-1)
        self.bview = self.flat.view(np.uint8)
        self.nbytes = buf.nbytes
        self.off = 0
        self.end = 0.0
        self.done = False
        self.hdr = None
        self.error = None

    def describe(self) -> str:
        if self.tag >= 0:
            return f"{self.name}(src={self.peer}, tag={self.tag})"
        return f"{self.name} (recv from rank {self.peer})"

    def consume(self, chunk: np.ndarray) -> None:
        """Take the next bytes of the message: copy, or reduce element-wise straight from shared memory."""
        k = chunk.size
        if k:
            off = self.off
            if self.ufunc is None:
                self.bview[off : off + k] = chunk
            else:
                isz = self.flat.itemsize
                dst = self.flat[off // isz : (off + k) // isz]
                self.ufunc(dst, chunk.view(self.flat.dtype), out=dst)
            self.off = off + k

    def take_from(self, tp: Transport, pid: int, addr: int) -> None:
        """Take the whole message straight from the sender's memory: one copy, or a reduction through
        a small scratch buffer that stays in cache."""
        n = self.nbytes
        if self.ufunc is None:
            tp.read_remote(self.peer, pid, addr, self.bview, n)
        else:
            dt, isz = self.flat.dtype, self.flat.itemsize
            start = cma.clear_of(addr, tp.scratch.__array_interface__["data"][0])  # no 4K aliasing (cma.py)
            scratch = tp.scratch[start : start + tp.scratch.size - cma.PAGE]
            step = scratch.size // isz * isz
            for off in range(0, n, step):
                k = min(step, n - off)
                tp.read_remote(self.peer, pid, addr + off, scratch, k)
                dst = self.flat[off // isz : (off + k) // isz]
                self.ufunc(dst, scratch[:k].view(dt), out=dst)
        self.off = n


class _Timing:
    """A receive waited for only until its header is in (``Transport.wait_times``)."""

    __slots__ = ("op",)
    error = None

    def __init__(self, op: RecvOp) -> None:
        self.op = op

    @property
    def done(self) -> bool:
        return self.op.done or self.op.hdr is not None

    @property
    def peer(self) -> int:
        return self.op.peer

    def describe(self) -> str:
        return self.op.describe()


class _Stash:
    """A message nobody asked for yet (another tag was awaited): kept as private bytes."""

    __slots__ = ("hdr", "sig", "data", "off", "nbytes", "peer")
    held = False

    def __init__(self, hdr, sig, peer):
        self.hdr, self.sig, self.peer = hdr, sig, peer
        self.nbytes = hdr[1]
        self.data = np.empty(self.nbytes, np.uint8)
        self.off = 0

    def consume(self, chunk):
        k = chunk.size
        self.data[self.off : self.off + k] = chunk
        self.off += k

    def take_from(self, tp, pid, addr):
        tp.read_remote(self.peer, pid, addr, self.data, self.nbytes)
        self.off = self.nbytes


class _Discard(_Stash):
    """The rest of a refused message: its chunks are taken and dropped, keeping the channel in step."""

    def __init__(self, hdr, peer):
        self.hdr, self.sig, self.nbytes, self.off, self.data, self.peer = hdr, b"", hdr[1], 0, None, peer

    def consume(self, chunk):
        self.off += chunk.size

    def take_from(self, tp, pid, addr):
        self.off = self.nbytes  # refused: nothing to read


_DTYPES: dict[bytes, np.dtype] = {}  # header dtype field -> dtype
_WIRE: dict[bytes, bytes] = {}


_HEAD = struct.Struct("<qqddq")  # HEADER's first fields (tag, size, start, arrival, number): all that varies
_HEAD_SIZE = _HEAD.size
_RESTS: dict[tuple, bytes] = {}  # (shape, dtype, signature) -> the header's remaining bytes and the signature
_LAST_REST: list = [(), None, b"", b""]  # (shape, dtype, signature, rest) of the latest _header_rest


def _header_rest(shape: tuple, dtype: np.dtype, wsig: bytes) -> bytes:
    """The bytes of a small message's header after ``_HEAD`` (shape, dtype, signature; no address): the same
    from one call to the next, so packed once."""
    last = _LAST_REST  # the previous message's, compared without hashing (a dtype hashes slowly)
    if dtype is last[1] and wsig is last[2] and shape == last[0]:
        return last[3]
    got = _RESTS.get((shape, dtype, wsig))
    if got is None:
        if len(_RESTS) > 4096:
            _RESTS.clear()
        dims = shape[:8]
        full = HEADER.pack(0, 0, 0.0, 0.0, 0, len(shape), *dims, *(0,) * (8 - len(dims)), dtype.str.encode(),
                           len(wsig), 0)
        got = _RESTS[shape, dtype, wsig] = full[_HEAD.size :] + wsig
    _LAST_REST[:] = shape, dtype, wsig, got
    return got


def _bytes_of(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat memoryview (a slice assignment of memoryviews costs a
    third of numpy's for a small message)."""
    try:
        return arr.data.cast("B")
    except (TypeError, ValueError):  # formats memoryview cannot cast (complex, non-native byte order)
        return memoryview(arr.reshape(-1).view(np.uint8))


def wire_signature(sig: bytes) -> bytes:
    """The signature as a header carries it: whole if it fits, else its start and a checksum of all of it.

    A collective's signature lists the group's ranks, so it outgrows the header from about 180 ranks;
    both sides compare this form, so a long signature still matches itself and still differs from any
    other (its text stays readable up to the cut).
    """
    if len(sig) <= SIG_MAX:
        return sig
    wire = _WIRE.get(sig)
    if wire is None:
        if len(_WIRE) > 1024:
            _WIRE.clear()
        wire = _WIRE[sig] = sig[: SIG_MAX - 24] + f" ... (crc32 {zlib.crc32(sig):08x})".encode()
    return wire


class Transport:
    """The message engine of one rank: queues of pending sends/receives and the progress loop."""

    backend = "sim"  # what md.dist.get_backend() answers

    def __init__(self, rank: int, mm, layout: shm.Layout, doorbells, board: shm.Board, clock, timeout: float):
        self.rank, self.world, self.layout = rank, layout.world, layout
        self.mm, self.mv = mm, memoryview(mm)
        self.buf = np.frombuffer(mm, np.uint8)
        self.words = self.mv.cast("q")
        self.bells, self.bell = doorbells, doorbells[rank]
        self.board, self.clock, self.timeout = board, clock, timeout
        self.slot_bytes, self.nslots = layout.slot_bytes, layout.nslots
        W = self.world
        self.out_ctrl = [None] * W
        self.in_ctrl = [None] * W
        self.out_slots = [None] * W
        self.in_slots = [None] * W
        for p in range(W):
            if p == rank:
                continue
            self.out_ctrl[p] = self._ctrl(rank, p)
            self.in_ctrl[p] = self._ctrl(p, rank)
            self.out_slots[p] = [self._slot(rank, p, i) for i in range(self.nslots)]
            self.in_slots[p] = [self._slot(p, rank, i) for i in range(self.nslots)]
        self.head = [0] * W  # chunks written to rank -> p (only this rank writes it)
        self.tail = [0] * W  # chunks consumed from p -> rank
        self.msgs_out = [0] * W
        self.send_q: dict[int, deque] = {}
        self.recv_q: dict[int, list] = {}
        self.cur_in: dict[int, object] = {}
        self.stash: dict[int, list] = {}
        self.failed: list = []  # ops whose error has not been raised yet
        self.coll = None  # (ranks, group key, seq, signature) of the collective in progress
        self.finishing = False  # fn has returned: what is still in flight is waited for in flush
        self.spin = spin_seconds()
        # between two looks of a poll: give the core to a runnable peer on it (see spin_seconds)
        self.pause = os.sched_yield if hasattr(os, "sched_yield") else None
        # Cross-memory attach (cma.py) for messages above RENDEZVOUS_BYTES (at most a whole channel).
        self.rendezvous_bytes = min(RENDEZVOUS_BYTES, self.nslots * self.slot_bytes)
        self.small_bytes = min(self.slot_bytes, self.rendezvous_bytes)  # sendrecv_small's limit: one slot
        self.typed_slots: dict[tuple, np.ndarray] = {}  # (payload offset, dtype) -> the slot seen as that dtype
        self.cma_in = [0] * W  # per sender: 0 not probed yet, 1 we can read its memory, 2 we cannot
        self.scratch = None
        if cma.enabled():
            self._probe_word = np.array([cma.MAGIC], np.int64)
            w = board.rec[rank]
            board.q[w + shm.R_PROBE] = self._probe_word.__array_interface__["data"][0]
            self.scratch = np.empty((1 << 20) + cma.PAGE, np.uint8)
            for p in range(W):  # peers that started before us; the others when their first message arrives
                if p != rank:
                    self._probe(p)
        else:
            self.cma_in = [2] * W
        board.q[board.rec[rank] + shm.R_PID] = os.getpid()  # last: a pid says the probe word is in place

    # -- cross-memory attach -------------------------------------------------------------------
    def peer_pid(self, r: int) -> int:
        return self.board.q[self.board.rec[r] + shm.R_PID]

    def _probe(self, src: int) -> None:
        """Find out once whether this rank may read ``src``'s memory, and tell ``src`` (C_CMA)."""
        pid = self.peer_pid(src)
        if not pid:
            return  # src has not started yet
        got = np.zeros(1, np.int64)
        err = cma.read(pid, self.board.q[self.board.rec[src] + shm.R_PROBE], got.__array_interface__["data"][0], 8)
        self.cma_in[src] = 1 if err is None and got[0] == cma.MAGIC else 2
        self.in_ctrl[src][C_CMA] = self.cma_in[src]

    def read_remote(self, src: int, pid: int, addr: int, into: np.ndarray, nbytes: int) -> None:
        err = cma.read(pid, addr, into.__array_interface__["data"][0], nbytes)
        if err is not None:
            msg = self.board.aborted()
            if msg is not None:
                raise RankAborted(f"rank {self.rank} stopped because {msg}")
            raise PeerExitedError(f"rank {self.rank} could not read the message of rank {src} from its memory "
                                  f"({nbytes} bytes): {err}")

    def _ctrl(self, src, dst) -> memoryview:
        """The control words of channel src -> dst (a memoryview: cheap single-word access)."""
        w = self.layout.channel(src, dst) // 8
        return self.words[w : w + shm.CTRL_BYTES // 8]

    def _slot(self, src, dst, i):
        off = self.layout.slot(src, dst, i)
        return off, self.buf[off + HDR_BYTES : off + HDR_BYTES + self.slot_bytes]

    # -- posting ---------------------------------------------------------------------------
    def isend(self, arr: np.ndarray, dst: int, tag: int, ready: float, sig: bytes = b"", name: str = "send",
              eager: bool = False) -> SendOp:
        """Queue ``arr`` (C-contiguous) for ``dst``; the message is ready at simulated time ``ready``.

        A plain send is done when ``dst`` has taken the whole message (so a refusal reaches the sender);
        an ``eager`` one as soon as its last chunk is in the channel (collectives, whose arguments the
        ranks have already agreed on, use it to save a wake-up per message).
        """
        flat = arr.reshape(-1)
        op = SendOp(dst, tag, flat.view(np.uint8), arr.nbytes, arr.dtype, arr.shape, sig, name)
        op.eager = eager
        if op.nbytes > self.rendezvous_bytes and self.out_ctrl[dst][C_CMA] == 1:
            op.addr = flat.__array_interface__["data"][0]
            op.eager = False  # our buffer must outlive the receiver's read
        op.start, op.end = self.clock.message(dst, op.nbytes, ready)
        op.msg = self.msgs_out[dst]
        self.msgs_out[dst] += 1
        q = self.send_q.get(dst)
        if q is None:
            q = self.send_q[dst] = deque()
        q.append(op)
        self._push(dst, q)
        return op

    def irecv(self, arr: np.ndarray, src: int, tag: int, ready: float, ufunc=None, sig: bytes = b"",
              name: str = "recv", held: bool = False) -> RecvOp:
        """Post a receive into ``arr`` (C-contiguous, writable); with ``ufunc`` reduce into it instead.

        A ``held`` receive takes its header when it comes but its bytes only once its times have been
        asked for (``wait_times``) or it is waited for.
        """
        op = RecvOp(src, tag, arr, ufunc, sig, name, ready, held)
        st = self.stash.get(src)
        if st:
            for i, s in enumerate(st):
                if s.hdr[0] == tag:
                    del st[i]
                    problem = self._check(op, s.hdr, s.sig)
                    if problem:
                        self._fail(op, problem)
                    else:
                        op.consume(s.data)
                        self._complete(op, s.hdr)
                    return op
        q = self.recv_q.get(src)
        if q is None:
            q = self.recv_q[src] = []
        q.append(op)
        self._pull(src)
        return op

    def sendrecv_small(self, sbuf: np.ndarray, dst: int, rbuf: np.ndarray, src: int, tag: int, ready: float,
                       sig: bytes, name: str, ufunc=None) -> float | None:
        """A collective's exchange step (send ``sbuf`` to ``dst``, take ``rbuf`` from ``src``) without the queues.

        Small messages dominate latency, and for them the general machinery (an op object per message,
        queues, a progress pass over every channel) costs more CPU than the bytes. When nothing else
        is in flight on either channel and both messages fit one slot, the message is written straight
        into a free slot and the incoming one, if it is already there and fits, is taken straight from
        its slot: the same bytes, header, order and simulated times as the general path. Returns the
        step's completion time, or None when the fast path does not apply (then nothing was done).
        """
        n = sbuf.nbytes
        if (self.send_q or self.recv_q or self.cur_in or self.stash or self.failed) and (
                dst in self.send_q or src in self.recv_q or src in self.cur_in or self.stash.get(src) or self.failed):
            return None
        sb = self.small_bytes
        if n > sb or rbuf.nbytes > sb:
            return None
        ctrl = self.out_ctrl[dst]
        head = self.head[dst]
        if ctrl[C_NACK] or head - ctrl[C_TAIL] >= self.nslots:
            return None
        start, end = self.clock.message(dst, n, ready)
        msg = self.msgs_out[dst]
        self.msgs_out[dst] = msg + 1
        hoff = self.out_slots[dst][head % self.nslots][0]
        wsig = sig if len(sig) <= SIG_MAX else wire_signature(sig)
        mv = self.mv
        _HEAD.pack_into(mv, hoff, tag, n, start, end, msg)
        shape, dtype = sbuf.shape, sbuf.dtype
        rest = _header_rest(shape, dtype, wsig)
        mv[hoff + _HEAD_SIZE : hoff + _HEAD_SIZE + len(rest)] = rest
        if n:
            poff = hoff + HDR_BYTES
            mv[poff : poff + n] = _bytes_of(sbuf)
        self.head[dst] = head + 1
        ctrl[C_HEAD] = head + 1
        # the header the expected message carries after _HEAD: ours, when we receive into a buffer like it
        expect = rest if rbuf is sbuf or (rbuf.shape == shape and rbuf.dtype == dtype) else \
            _header_rest(rbuf.shape, rbuf.dtype, wsig)
        done = self._take_small(rbuf, src, tag, ready, expect, ufunc, False)
        # one fence for both counters: they must be visible before we read the flags, or a sleeper could miss them
        _FENCE.acquire()
        _FENCE.release()
        if ctrl[C_RWANT]:
            self.bells[dst].ring()
        if done is not None:
            if self.in_ctrl[src][C_WANT]:
                self.bells[src].ring()
        elif self._await((src,)):  # the peer is usually a few microseconds behind: watch its head word
            done = self._take_small(rbuf, src, tag, ready, expect, ufunc)
        if done is None:  # not there yet, or not what we expect: the general path waits and explains
            op = self.irecv(rbuf, src, tag, ready, ufunc, sig, name)
            self.wait([op])
            done = op.end
        return end if end > done else done

    def exchange_small(self, sends, recvs, tag: int, ready: float, sig: bytes, name: str,
                       chain: bool = False) -> float | None:
        """Post every send of a step at once, then take every receive as it arrives, in one pass per look.

        ``sends`` and ``recvs`` are lists of (buffer, global rank), each rank at most once in each list. The
        sends leave at ``ready`` (on their separate links), or, with ``chain``, each when the one before it has
        arrived (one rank feeding its peers in turn); the receives are posted at ``ready``. The messages are
        written straight into free slots and taken straight from them, as in ``sendrecv_small``, with one
        fence for all the counters of a pass: the per-message work is a header, a copy, a clock entry. The
        same bytes, headers, order and simulated times as posting ``isend``/``irecv`` one by one. Returns the
        latest completion, or None when the fast path does not apply (then nothing was done): a message
        above one slot, a channel busy with other messages or full.
        """
        if self.send_q or self.recv_q or self.cur_in or self.stash or self.failed:
            return None
        sb, nslots, out_ctrl = self.small_bytes, self.nslots, self.out_ctrl
        for buf, dst in sends:
            if buf.nbytes > sb or out_ctrl[dst][C_NACK] or self.head[dst] - out_ctrl[dst][C_TAIL] >= nslots:
                return None
        for buf, _ in recvs:
            if buf.nbytes > sb:
                return None
        wsig = sig if len(sig) <= SIG_MAX else wire_signature(sig)
        mv, clock, end, t = self.mv, self.clock, ready, ready
        for buf, dst in sends:
            n = buf.nbytes
            start, arrival = clock.message(dst, n, t)
            if chain:
                t = arrival
            if arrival > end:
                end = arrival
            msg = self.msgs_out[dst]
            self.msgs_out[dst] = msg + 1
            head = self.head[dst]
            hoff = self.out_slots[dst][head % nslots][0]
            _HEAD.pack_into(mv, hoff, tag, n, start, arrival, msg)
            rest = _header_rest(buf.shape, buf.dtype, wsig)
            mv[hoff + _HEAD_SIZE : hoff + _HEAD_SIZE + len(rest)] = rest
            if n:
                mv[hoff + HDR_BYTES : hoff + HDR_BYTES + n] = _bytes_of(buf)
            self.head[dst] = head + 1
            out_ctrl[dst][C_HEAD] = head + 1
        left = [(buf, src, _header_rest(buf.shape, buf.dtype, wsig)) for buf, src in recvs]
        rung = False
        while True:
            waiting, took = [], []
            for item in left:
                got = self._take_small(item[0], item[1], tag, ready, item[2], None, False)
                if got is None:
                    waiting.append(item)
                else:
                    took.append(item[1])
                    if got > end:
                        end = got
            if not rung or took:  # one fence for every counter this pass moved, then the flags of sleepers
                fence()
                if not rung:
                    rung = True
                    for _, dst in sends:
                        if out_ctrl[dst][C_RWANT]:
                            self.bells[dst].ring()
                for src in took:
                    if self.in_ctrl[src][C_WANT]:
                        self.bells[src].ring()
            if not waiting:
                return end
            left = waiting
            if took or self._await([item[1] for item in left]):
                continue
            break  # not there after the poll, or there but not what we expect: the general path waits and explains
        ops = [self.irecv(buf, src, tag, ready, None, sig, name) for buf, src, _ in left]
        self.wait(ops)
        for op in ops:
            if op.end > end:
                end = op.end
        return end

    def _await(self, srcs) -> bool:
        """Wait cheaply until a message reaches the channel from one of ``srcs`` (True).

        First a poll of their head words for ``spin_seconds`` (yielding the core at each look), then a nap on
        the doorbell with those channels flagged, for at most ``NAP_S``: a step's partner that is far behind
        costs no progress passes, no op objects and no further polls. False when the time is up, when a
        channel already holds a message (one the fast path did not take: the general path names what is wrong
        with it) or when the launch is aborting: then the general path waits, watching the peers, with its
        reports and its deadline.
        """
        looks = [(self.in_ctrl[src], self.tail[src]) for src in srcs]
        for c, tail in looks:
            if c[C_HEAD] > tail:
                return False
        if self.spin:
            until = time.monotonic() + self.spin
            pause = self.pause
            while time.monotonic() < until:
                if pause is not None:
                    pause()
                for c, tail in looks:
                    if c[C_HEAD] > tail:
                        return True
        for c, _ in looks:
            c[C_RWANT] = 1
        try:
            fence()  # the flags must be visible before the last look, or a sender could miss them
            until = time.monotonic() + NAP_S
            while True:
                for c, tail in looks:
                    if c[C_HEAD] > tail:
                        return True
                left = until - time.monotonic()
                if left <= 0 or self.board.q[0]:
                    return False
                self.bell.sleep(left)
        finally:
            for c, _ in looks:
                c[C_RWANT] = 0

    def _take_small(self, rbuf: np.ndarray, src: int, tag: int, ready: float, expect: bytes, ufunc,
                    ring: bool = True) -> float | None:
        """Take the message at the head of channel ``src`` -> us if it is the one expected: its tag and size,
        and the rest of its header (shape, dtype, no address, signature) byte for byte ``expect``, as
        ``_header_rest`` makes it for ``rbuf``. None leaves it for the general path, which names any mismatch."""
        rctrl = self.in_ctrl[src]
        tail = self.tail[src]
        if tail >= rctrl[C_HEAD]:
            return None
        if not self.cma_in[src]:
            self._probe(src)
        hoff = self.in_slots[src][tail % self.nslots][0]
        hdr = _HEAD.unpack_from(self.mv, hoff)
        n = rbuf.nbytes
        rest = hoff + _HEAD_SIZE
        # one comparison of bytes (an mmap slice is bytes) instead of unpacking every field: a third of the time
        if hdr[0] != tag or hdr[1] != n or self.mm[rest : rest + len(expect)] != expect:
            return None
        mv = self.mv
        if n:
            poff = hoff + HDR_BYTES
            if ufunc is None:
                _bytes_of(rbuf)[:] = mv[poff : poff + n]
            else:
                flat = rbuf if rbuf.ndim == 1 else rbuf.reshape(-1)
                typed = self.typed_slots.get((poff, rbuf.dtype))
                if typed is None:
                    whole = self.small_bytes // rbuf.itemsize * rbuf.itemsize
                    typed = self.typed_slots[poff, rbuf.dtype] = self.buf[poff : poff + whole].view(rbuf.dtype)
                ufunc(flat, typed[: flat.size], out=flat)  # out= by keyword: a fifth faster than by position
        self.tail[src] = tail + 1
        rctrl[C_TAIL] = tail + 1
        if ring:  # (else the caller fences and rings)
            fence()
            if rctrl[C_WANT]:
                self.bells[src].ring()
        arrival = hdr[3]
        return arrival if arrival > ready else ready

    # -- progress --------------------------------------------------------------------------
    def _push(self, dst: int, q: deque) -> bool:
        ctrl = self.out_ctrl[dst]
        if ctrl[C_NACK]:
            self._nacked(dst, q)
        tail = int(ctrl[C_TAIL])
        head = self.head[dst]
        nslots, sb = self.nslots, self.slot_bytes
        slots = self.out_slots[dst]
        wrote = False
        for op in q:
            if op.written:
                continue
            while head - tail < nslots:
                hoff, payload = slots[head % nslots]
                if op.chunks == 0:
                    shape = op.shape if len(op.shape) <= 8 else op.shape[:8]
                    sig = wire_signature(op.sig)
                    HEADER.pack_into(self.mv, hoff, op.tag, op.nbytes, op.start, op.end, op.msg, len(op.shape),
                                     *shape, *(0,) * (8 - len(shape)), op.dtype.str.encode(), len(sig), op.addr)
                    if sig:
                        self.mv[hoff + HEADER.size : hoff + HEADER.size + len(sig)] = sig
                    if op.addr:
                        op.off = op.nbytes  # the receiver reads the bytes from our memory
                k = min(sb, op.nbytes - op.off)
                if k:
                    payload[:k] = op.data[op.off : op.off + k]
                    op.off += k
                op.chunks += 1
                head += 1
                ctrl[C_HEAD] = head
                wrote = True
                if op.off >= op.nbytes:
                    op.written = True
                    op.end_counter = head
                    if op.eager:
                        op.done = True
                    break
            if not op.written:
                break
        self.head[dst] = head
        if wrote:
            fence()
            if ctrl[C_RWANT]:  # the receiver sleeps waiting for this channel: wake it
                self.bells[dst].ring()
        done = False
        while q and q[0].written and (q[0].eager or tail >= q[0].end_counter):
            q.popleft().done = True
            done = True
        if not q:
            del self.send_q[dst]
        return wrote or done

    def _pull(self, src: int) -> bool:
        ctrl = self.in_ctrl[src]
        head = int(ctrl[C_HEAD])
        tail = self.tail[src]
        if tail >= head:
            return False
        slots, nslots = self.in_slots[src], self.nslots
        moved = False
        while tail < head:
            hoff, payload = slots[tail % nslots]
            cur = self.cur_in.get(src)
            if cur is None:
                q = self.recv_q.get(src)
                if not q:
                    break  # nobody here wants a message from src yet: leave it in the channel
                if not self.cma_in[src]:  # src has sent us something, so it has published its probe word
                    self._probe(src)
                hdr = HEADER.unpack_from(self.mv, hoff)
                tag, siglen = hdr[0], hdr[15]
                sig = bytes(self.mv[hoff + HEADER.size : hoff + HEADER.size + siglen]) if siglen else b""
                for i, op in enumerate(q):
                    if op.tag == tag:
                        del q[i]
                        if not q:
                            del self.recv_q[src]
                        problem = self._check(op, hdr, sig, ctrl)
                        if problem:
                            self._fail(op, problem)
                            cur = _Discard(hdr, src)
                        else:
                            op.hdr = hdr
                            arrival = hdr[3]
                            op.end = arrival if arrival > op.post else op.post  # known now, before the bytes
                            cur = op
                        break
                else:
                    cur = _Stash(hdr, sig, src)
                self.cur_in[src] = cur
            if cur.held:  # its bytes wait until its times have been asked for (see irecv)
                break
            if cur.hdr[16]:  # the sender left the bytes in its own memory: read them from there
                cur.take_from(self, self.peer_pid(src), cur.hdr[16])
            else:
                k = min(self.slot_bytes, cur.nbytes - cur.off)
                cur.consume(payload[:k])
            tail += 1
            moved = True
            if cur.off >= cur.nbytes:
                del self.cur_in[src]
                if isinstance(cur, _Discard):
                    pass
                elif isinstance(cur, _Stash):
                    self.stash.setdefault(src, []).append(cur)
                else:
                    self._complete(cur, cur.hdr)
        self.tail[src] = tail
        ctrl[C_TAIL] = tail
        if moved:
            fence()
            if ctrl[C_WANT]:  # the sender sleeps until slots free up or its message is taken
                self.bells[src].ring()
        return moved

    def _complete(self, op: RecvOp, hdr) -> None:
        arrival = hdr[3]
        op.end = arrival if arrival > op.post else op.post
        op.done = True

    def _check(self, op: RecvOp, hdr, sig, ctrl=None) -> str | None:
        """Refuse a message that does not fit the posted receive (and tell its sender): return the problem."""
        tag, nbytes, _, _, msg, ndim = hdr[:6]
        dtype = _DTYPES.get(hdr[14])
        if dtype is None:
            dtype = _DTYPES[hdr[14]] = np.dtype(hdr[14].rstrip(b"\0").decode())
        problem = None
        if sig != op.sig and sig != wire_signature(op.sig):
            theirs = sig.decode(errors="replace") or "a point-to-point send"
            mine = op.sig.decode(errors="replace") or "a point-to-point recv"
            problem = (f"ranks disagree about a collective call: rank {op.peer} called {theirs}; "
                       f"rank {self.rank} called {mine}")
        elif dtype != op.flat.dtype or nbytes != op.nbytes:
            shape = tuple(hdr[6 : 6 + min(ndim, 8)])
            problem = misfit(op.name, op.peer, self.rank, tag, (shape, dtype, nbytes),
                             (op.buf.shape, op.buf.dtype, op.nbytes))
        if problem is None:
            return None
        if ctrl is not None:  # tell the sender, who is waiting for this message to be taken
            data = problem.encode()[: shm.CTRL_BYTES - C_NACK_OFF]
            base = self.layout.channel(op.peer, self.rank)
            self.buf[base + C_NACK_OFF : base + C_NACK_OFF + len(data)] = np.frombuffer(data, np.uint8)
            ctrl[C_NACKLEN] = len(data)
            ctrl[C_NACK] = msg + 1
            self.bells[op.peer].ring()
        return problem

    def _nacked(self, dst: int, q) -> None:
        """The receiver refused message ``nack - 1``: fail that send (it still streams out, to be dropped)."""
        ctrl = self.out_ctrl[dst]
        msg, n = int(ctrl[C_NACK]) - 1, int(ctrl[C_NACKLEN])
        base = self.layout.channel(self.rank, dst)
        text = bytes(self.buf[base + C_NACK_OFF : base + C_NACK_OFF + n]).decode(errors="replace")
        ctrl[C_NACK] = 0
        for op in q:
            if op.msg == msg:
                self._fail(op, text)

    def _fail(self, op, problem: str) -> None:
        op.error = problem
        self.failed.append(op)
        if isinstance(op, RecvOp):
            op.done = True

    def progress(self) -> bool:
        """One non-blocking pass over every pending send and receive; True if anything moved."""
        moved = False
        if self.send_q:
            for dst, q in list(self.send_q.items()):
                moved |= self._push(dst, q)
        for src in set(self.recv_q) | set(self.cur_in):
            moved |= self._pull(src)
        return moved

    def pending(self) -> bool:
        return bool(self.send_q or self.recv_q or self.cur_in)

    # -- waiting ---------------------------------------------------------------------------
    def _sleep(self, seconds: float) -> None:
        """Sleep on this rank's doorbell (at most ``seconds``); a wake-up swallows the rings that piled up."""
        self.bell.sleep(seconds)

    def wait(self, ops, timeout: float | None = None) -> None:
        """Block (on the doorbell, not spinning) until every op in ``ops`` is done.

        Before sleeping the rank raises a flag on each channel it waits on (C_RWANT for data, C_WANT
        for free slots) and looks once more; peers ring the bell only when they see a flag, so a
        rank that is busy is never disturbed. What it waits for is written on the board only when
        the wait lasts (reports need it after seconds, the fast path should not pay for it).
        """
        for op in ops:
            if not op.done:
                break
        else:
            if self.failed:
                self._raise_failed(ops)
            return
        for op in ops:
            if op.__class__ is RecvOp and op.held:
                op.held = False
        timeout = self.timeout if timeout is None else timeout
        t0 = time.monotonic()
        deadline = t0 + timeout
        blocked = described = False
        flags = []
        if self.spin and self._spin(ops, t0 + self.spin):  # a short poll before sleeping
            if self.failed:
                self._raise_failed(ops)
            return
        suspect = None
        try:
            while True:
                if self.progress() and blocked:
                    deadlock.moved(self.board, self.rank)
                    if described:  # what it waits for may have shrunk: a stale edge would close a false cycle
                        self.board.set_desc(self.rank, self._what(ops))
                        deadlock.publish_waits(self.board, self.rank, [op.peer for op in ops if not op.done])
                if self.failed:
                    self._raise_failed(ops)
                if all(op.done for op in ops):
                    return
                now = time.monotonic()
                self._check_peers(ops, slow=now - t0 > 0.05)
                if now >= deadline:
                    raise CommTimeoutError(self._report(ops, now - t0), self._states())
                if described and now - t0 > 0.5:
                    suspect = self._check_deadlock(suspect, now)
                if not blocked:
                    blocked = True
                    self.board.set_waiting(self.rank, time.time())
                    flags = [(self.out_ctrl[d], C_WANT) for d in self.send_q]
                    flags += [(self.in_ctrl[s], C_RWANT) for s in set(self.recv_q) | set(self.cur_in)]
                    for c, w in flags:
                        c[w] = 1
                    fence()
                    continue  # look once more now that peers can see the flags: no lost wake-up
                if not described and now - t0 > 0.05:
                    described = True
                    self.board.set_desc(self.rank, self._what(ops))
                    deadlock.publish_waits(self.board, self.rank, [op.peer for op in ops if not op.done])
                self._sleep(min(deadline - now, 0.05 if not described else 0.25))
                deadlock.looked(self.board, self.rank)
        finally:
            if blocked:
                for c, w in flags:
                    c[w] = 0
                self.board.set_state(self.rank, shm.RUNNING)

    def _words(self) -> list:
        """The control words whose change is the only thing that can move a pending op: the head of each
        channel a receive waits on, the tail and refusal word of each channel a send waits on."""
        words = [(self.in_ctrl[s], C_HEAD) for s in self.recv_q]
        words += [(self.in_ctrl[s], C_HEAD) for s in self.cur_in if s not in self.recv_q]
        for d in self.send_q:
            words += [(self.out_ctrl[d], C_TAIL), (self.out_ctrl[d], C_NACK)]
        return words

    def _spin(self, ops, until: float) -> bool:
        """Poll until every op in ``ops`` is done (True) or ``until`` passes (False), yielding the core at each
        look (see spin_seconds). A look reads the few words that can move (``_words``) in one pass; the
        progress pass over the queues runs only when one of them changed."""
        pause = self.pause
        while True:
            self.progress()
            for op in ops:
                if not op.done:
                    break
            else:
                return True
            if self.failed:
                return False
            words = self._words()
            seen = [c[i] for c, i in words]
            while True:
                if time.monotonic() >= until:
                    return False
                if pause is not None:
                    pause()
                if [c[i] for c, i in words] != seen:
                    break

    def wait_times(self, ops, meanwhile=None) -> bool:
        """Wait until every op's simulated end is known: a send's is from the start, a receive's once its
        header is in. A held receive is then released: its bytes are taken by any later progress pass
        (``wait`` finishes them). ``meanwhile()``, if given, runs first when a time is not known yet
        (local work instead of an idle wait); returns whether it ran."""
        pending = [op for op in ops if op.__class__ is RecvOp and not op.done and op.hdr is None]
        ran = False
        if pending and meanwhile is not None:
            self.progress()
            pending = [op for op in pending if not op.done and op.hdr is None]
            if pending:
                meanwhile()
                ran = True
        if pending:
            self.wait([_Timing(op) for op in pending])
        for op in ops:
            if op.error is not None and op in self.failed:
                self.wait([op])  # raises what went wrong
            if op.__class__ is RecvOp:
                op.held = False
        return ran

    def _raise_failed(self, ops) -> None:
        for op in ops:
            if op.error is not None and op in self.failed:
                self.failed.remove(op)
                raise MismatchError(op.error)

    def _what(self, ops) -> str:
        waiting = [op.describe() for op in ops if not op.done]
        what = ", ".join(waiting[:4]) + (f" (+{len(waiting) - 4} more)" if len(waiting) > 4 else "")
        if self.coll is not None:  # name the call and its group: ranks may disagree about either
            what = f"{self.coll[3].decode(errors='replace')}: {what}"
        return f"{what}, {deadlock.UNFINISHED}" if self.finishing else what

    def _check_deadlock(self, suspect, now: float):
        """Raise DeadlockError if a cycle of blocked ranks through this one has not moved since the last look.

        Returns what to compare with at the next look (None: no cycle now).
        """
        cycle = deadlock.find_cycle(self.board, self.rank)
        if cycle is None:
            return None
        snap, looks = deadlock.snapshot(self.board, cycle), deadlock.looks(self.board, cycle)
        if suspect is None or suspect[0] != snap:
            return snap, now, looks
        if now - suspect[1] >= 0.3 and all(a > b for a, b in zip(looks, suspect[2])):  # each ran, and found nothing
            raise DeadlockError(deadlock.describe(self.board, cycle))
        return suspect

    def _check_peers(self, ops, slow: bool = True) -> None:
        """Turn a wait that can never end into an error: another rank failed, finished or disagrees.

        The board's collective records are compared only once the wait is ``slow``: when ranks
        disagree their messages usually meet and are refused long before.
        """
        board = self.board
        if board.q[0]:  # the abort word
            self._last_words(ops)
            msg = board.aborted()
            if board.abort_is_mismatch():
                raise MismatchError(msg)
            raise RankAborted(f"rank {self.rank} stopped because {msg}")
        for op in ops:
            if op.done:
                continue
            st = board.state(op.peer)
            if st == shm.FINISHED or st == shm.FAILED:
                self._last_words(ops)
                if op.done:  # (a held receive's header counts, though taking it moved nothing)
                    continue
                self._raise_if_mismatch()
                raise PeerExitedError(
                    f"rank {self.rank} waits in {op.describe()} but rank {op.peer} has "
                    f"{shm.STATE_NAMES[st]} and will never {'receive' if isinstance(op, SendOp) else 'send'} it"
                    + self._unclaimed(op) + self._unreceived(op, st)
                )
        if slow and self.coll is not None:  # stuck inside a collective: maybe because the ranks disagree
            ranks, key, seq, sig = self.coll
            mine = zlib.crc32(sig)
            for r in ranks:
                got = board.lookup_crc(r, key) if r != self.rank else None
                if got is not None and got[0] == seq and got[1] != mine:
                    self._disagree(r, key, sig)

    def _last_words(self, ops) -> None:
        """One more progress pass before blaming a peer that failed or left: what it sent last may be what we
        wait for, or a refusal of our message, which a peer that failed over it sent first and which is then the
        report (raised here)."""
        self.progress()
        if self.failed:
            self._raise_failed(ops)

    def _raise_if_mismatch(self) -> None:
        """A peer that failed over a disagreeing call marked the abort word before it marked itself failed.

        The word was read before the peer's state, so it is read again: the disagreement, not the exit, is the
        cause every rank should report.
        """
        fence()
        if self.board.q[0] and self.board.abort_is_mismatch():
            raise MismatchError(self.board.aborted())

    @staticmethod
    def _unreceived(op, state: int) -> str:
        return unreceived(op.peer, op.tag) if isinstance(op, SendOp) and state == shm.FINISHED else ""

    def _unclaimed(self, op) -> str:
        """For a receive that will never complete: the tags of what its peer did send that nobody took."""
        if not isinstance(op, RecvOp) or op.tag < 0:
            return ""
        tags = [s.hdr[0] for s in self.stash.get(op.peer, ()) if s.hdr[0] >= 0]
        ctrl = self.in_ctrl[op.peer]
        if self.tail[op.peer] < int(ctrl[C_HEAD]) and op.peer not in self.cur_in:  # a message nobody asked for
            hoff = self.in_slots[op.peer][self.tail[op.peer] % self.nslots][0]
            tag = HEADER.unpack_from(self.mv, hoff)[0]
            if tag >= 0:
                tags.append(tag)
        if not tags:
            return ""
        return (f" (rank {op.peer} sent rank {self.rank} a message with tag {', '.join(map(str, tags))}, "
                f"which no receive asked for: do the tags agree?)")

    def _disagree(self, r: int, key: int, sig: bytes):
        got = self.board.lookup(r, key)
        theirs = got[2] if got is not None else "a different call"
        raise MismatchError(f"ranks disagree about a collective call: rank {r} called {theirs}; "
                            f"rank {self.rank} called {sig.decode(errors='replace')}")

    def publish(self, ranks, key: int, seq: int, sig: bytes, wake: bool = True) -> None:
        """Announce this rank's collective call on the board (checked by peers that wait on us).

        Peers sleep on the board only in ``agree``, waiting for this very call; a call that never agrees
        (its data reaches everyone) passes ``wake=False``: a peer asleep there made another call, and
        its own timed nap finds the disagreement. That saves a fence and a look at every member.
        """
        board = self.board
        board.publish(self.rank, key, seq, sig)
        self.coll = (ranks, key, seq, sig)
        if not wake:
            return
        fence()
        q, rec, me = board.q, board.rec, self.rank
        for r in ranks:  # wake only the peers sleeping in agree(), waiting for this
            if q[rec[r] + shm.R_NAP] and r != me:
                self.bells[r].ring()

    def agree(self, ranks, key: int, seq: int, sig: bytes, what: str) -> None:
        """Wait until every member has published the same call (after the data moved, so usually at once).

        No simulated time passes. Ranks that disagree all raise, each naming the other's call: a
        member that is already past this call has checked ours, so it agreed. Messages carry the
        signature too, so no data is ever taken from a disagreeing call.
        """
        me = self.rank
        board = self.board
        mine = zlib.crc32(sig)
        todo = [r for r in ranks if r != me]
        t0 = time.monotonic()
        blocked, suspect = False, None
        try:
            while True:
                late = []
                for r in todo:
                    got = board.lookup_crc(r, key)
                    if got is None or got[0] < seq:
                        late.append(r)
                    elif got[0] == seq and got[1] != mine:
                        self._disagree(r, key, sig)
                if not late:
                    return
                todo = late
                msg = board.aborted()
                if msg is not None:
                    if board.abort_is_mismatch():
                        raise MismatchError(msg)
                    raise RankAborted(f"rank {me} stopped because {msg}")
                for r in late:
                    st = board.state(r)
                    got = board.lookup_crc(r, key)
                    if st in (shm.FINISHED, shm.FAILED) and (got is None or got[0] < seq):
                        self._raise_if_mismatch()
                        raise PeerExitedError(f"rank {me} waits for rank {r} to join {what} but rank {r} has "
                                              f"{shm.STATE_NAMES[st]}")
                now = time.monotonic()
                if now - t0 >= self.timeout:
                    raise CommTimeoutError(self._report_text(
                        f"rank {me} waited {now - t0:.1f} s for ranks {late} to join {what}", now - t0),
                        self._states())
                if not blocked:
                    if self.spin and now - t0 < self.spin:
                        if self.pause is not None:
                            self.pause()
                        continue
                    blocked = True
                    board.set_state(me, shm.WAITING, time.time(),
                                    f"{sig.decode(errors='replace')}: waiting for ranks {late} to join")
                    deadlock.publish_waits(board, me, late)
                    board.set_napping(me, True)
                    fence()
                    continue  # look once more now that peers can see we sleep: no lost wake-up
                if now - t0 > 0.5:
                    suspect = self._check_deadlock(suspect, now)
                self._sleep(min(self.timeout - (now - t0), 0.25))
        finally:
            if blocked:
                board.set_napping(me, False)
                board.set_state(me, shm.RUNNING)

    def _report(self, ops, waited: float) -> str:
        return self._report_text(f"rank {self.rank} waited {waited:.1f} s in {self._what(ops)}", waited)

    def _peer_state(self, r: int) -> tuple[str, int, float, str]:
        """What rank ``r`` is doing: (kind, board state, since, description)."""
        st, since, desc = self.board.describe(r)
        if st == shm.WAITING:
            return "waiting", st, since, desc
        if process_state(self.peer_pid(r)) == "stopped":
            return "stopped", st, since, desc
        if st == shm.RUNNING:
            return "running", st, since, desc
        return shm.STATE_NAMES[st], st, since, desc

    def _states(self, settle: float = SETTLE_S) -> dict[int, str]:
        """Every rank's kind of activity (this one is waiting): the structured half of a timeout report.

        A rank seen running is looked at again for up to ``settle`` seconds: a rank that waits is running for a
        moment between two of its waits, and a report must not call it hung for that; a hung one stays running.
        """
        states = {r: "waiting" if r == self.rank else self._peer_state(r)[0] for r in range(self.world)}
        until = time.monotonic() + settle
        while "running" in states.values() and time.monotonic() < until:
            time.sleep(0.02)
            for r, kind in states.items():
                if kind == "running":
                    states[r] = self._peer_state(r)[0]
        return states

    def _report_text(self, first: str, waited: float) -> str:
        lines = [first]
        now = time.time()
        for r in range(self.world):
            if r == self.rank:
                continue
            kind, st, since, desc = self._peer_state(r)
            if kind == "waiting":
                lines.append(f"rank {r} is waiting ({now - since:.1f} s) in {desc}")
            elif kind == "stopped":
                lines.append(f"rank {r} is stopped (SIGSTOP, Ctrl-Z or a debugger): it cannot run until continued")
            elif kind == "running":
                lines.append(f"rank {r} is running its own code (not in a communication call)")
            else:
                lines.append(f"rank {r} has {shm.STATE_NAMES[st]}")
        return "; ".join(lines)

    def flush(self) -> None:
        """Finish every pending send and receive (a rank's function returned with work in flight)."""
        ops = [op for q in self.send_q.values() for op in q]
        ops += [op for q in self.recv_q.values() for op in q]
        ops += [op for op in self.cur_in.values() if not isinstance(op, _Stash)]
        if self.failed:
            self._raise_failed(list(self.failed))
        if ops:
            self.finishing = True
            self.wait(ops)

    def ring_all(self) -> None:
        for r, b in enumerate(self.bells):
            if r != self.rank:
                b.ring()
