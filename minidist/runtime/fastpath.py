"""A collective's small messages without the queues: one slot each, written and taken straight.

Small messages dominate latency, and for them the general machinery (an op object per message, queues, a
progress pass over every channel) costs more CPU than the bytes. A step with one partner each way is
``sendrecv_small``; a step that talks to many peers (``exchange_small``) posts all its sends together and then
reads whatever has arrived in one pass over its channels, with one fence per pass. Per message that leaves a
header, a copy and a clock entry: the same bytes, headers and times as the queued path, which takes over (and
explains) whenever something does not fit. A partner that is far behind is waited for on the doorbell
(``_await``), for at most ``NAP_S``.
"""

from __future__ import annotations

import time

import numpy as np

from minidist.runtime.channels import _FENCE, fence
from minidist.runtime.messages import _HEAD, _HEAD_SIZE, _bytes_of, _header_rest, wire_signature
from minidist.runtime.shm import C_HEAD, C_NACK, C_RWANT, C_TAIL, C_WANT, HDR_BYTES, SIG_MAX

NAP_S = 0.01  # a small collective's step naps this long on the doorbell before the general wait takes over


class SmallMessages:
    """The Transport's fast paths for a collective's small messages."""

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
