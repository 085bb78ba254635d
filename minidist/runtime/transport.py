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
from collections import deque

import numpy as np

from minidist.runtime import shm
from minidist.runtime.agreement import Agreement
from minidist.runtime.attach import Attach
from minidist.runtime.channels import Channels, fence  # noqa: F401  (fence: part of this module's interface)
from minidist.runtime.fastpath import NAP_S, SmallMessages  # noqa: F401
from minidist.runtime.messages import (  # noqa: F401  (the message records, importable from here as before)
    RecvOp,
    SendOp,
    _Discard,
    _Stash,
    _Timing,
    wire_signature,
)
from minidist.runtime.shm import C_CMA
from minidist.runtime.waiting import SETTLE_S, Waiting, unreceived  # noqa: F401

# Above this, a message is read in place by its receiver: one copy instead of two. Measured on 2 cores,
# 256 KB is where that starts to pay (below it the extra round trip costs more than the copy saved).
RENDEZVOUS_BYTES = 256 * 1024
SPIN_US = 50.0  # default poll before sleeping (see spin_seconds)


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


class Transport(Attach, Channels, SmallMessages, Waiting, Agreement):
    """The message engine of one rank: queues of pending sends/receives and the progress loop.

    Its parts, by mechanism: the shared-memory channels and their progress passes (``channels.py``), the
    fast paths of a collective's small messages (``fastpath.py``), cross-memory attach (``attach.py``), waiting
    and the doorbell (``waiting.py``) and the agreement of a collective call (``agreement.py``)."""

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
        self._attach(rank, W, board)
        board.q[board.rec[rank] + shm.R_PID] = os.getpid()  # last: a pid says the probe word is in place

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
