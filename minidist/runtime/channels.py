"""The shared-memory channels: moving queued messages through the slots, and refusing those that do not fit.

Each ordered pair of ranks (src -> dst) owns a channel: ``nslots`` slots and a few control words (``shm.py``).
``_push`` writes the queued sends to a peer into free slots, header first; ``_pull`` takes what a peer wrote into the
posted receives (copying or reducing in place), setting aside messages with other tags, and refuses one that does
not fit its receive (``_check``: a nack its sender sees). ``progress`` is one pass over every channel with work.
After moving a counter, a side fences and rings the peer's doorbell if the peer sleeps waiting for that channel.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from minidist.runtime import shm
from minidist.runtime.errors import misfit
from minidist.runtime.messages import _DTYPES, RecvOp, _Discard, _Stash, wire_signature
from minidist.runtime.shm import (
    C_HEAD,
    C_NACK,
    C_NACK_OFF,
    C_NACKLEN,
    C_RWANT,
    C_TAIL,
    C_WANT,
    HDR_BYTES,
    HEADER,
)

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


class Channels:
    """The Transport's channels: each peer's control words and slots, and the progress passes over them."""

    def _ctrl(self, src, dst) -> memoryview:
        """The control words of channel src -> dst (a memoryview: cheap single-word access)."""
        w = self.layout.channel(src, dst) // 8
        return self.words[w : w + shm.CTRL_BYTES // 8]

    def _slot(self, src, dst, i):
        off = self.layout.slot(src, dst, i)
        return off, self.buf[off + HDR_BYTES : off + HDR_BYTES + self.slot_bytes]

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
