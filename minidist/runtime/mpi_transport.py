"""Point-to-point messages over MPI: the same messages, headers and simulated times as over shared memory.

The engine for real machines (``md.launch(..., backend="mpi")``, or a script under ``mpiexec`` that calls
``md.dist.init(backend="mpi")``). It offers a rank's collectives exactly what ``transport.py`` offers, so
minidist's own algorithms are the code that crosses the network.

A message is two MPI messages between the same pair of ranks on a private duplicate of COMM_WORLD: its
header (``shm.HEADER``: minidist tag, size, dtype, shape, simulated start and arrival, the call's signature)
on MPI tag 0, then its bytes on MPI tag 1; a small one (``INLINE`` bytes at most) is one, its bytes after
its header. MPI keeps messages of one pair and one MPI tag in order, and the
receiver posts its payload receives in the order the headers came, so every payload lands where its header
said. Matching on minidist's tag happens here, as in ``transport.py``: a receive takes the first message
with its tag; a message nobody asked for yet is set aside (its bytes received into a private buffer) until
someone does. The sender books its link on the simulated clock (``Clock.message``) and the header carries the
times, so every rank's clock advances exactly as under the simulator, and every result is bitwise the same.

Waits poll MPI's non-blocking requests (MPI moves data only while polled: a spin of a few milliseconds
when every rank has a core, then naps that grow to 0.2 ms) and time out like the simulator's. A rank that has
finished sends every peer an empty FIN message, so a wait on a message to or from it ends within a second,
naming the peer, as under the simulator (an eager send completes without its receiver: only a message
large enough to wait for its receiver is caught). What MPI cannot tell: another rank's state otherwise (a
timeout report names this rank's wait only) and a refusal back to the sender (the receiver that finds a
message that does not fit raises, and the MPI launcher stops every rank).
"""

from __future__ import annotations

import os
import time

import numpy as np

from minidist.runtime.errors import CommTimeoutError, MismatchError, PeerExitedError, misfit
from minidist.runtime.mpi_requests import Incoming, NativeOp, NoBoard, RecvOp, SendOp
from minidist.runtime.shm import HEADER, SIG_MAX
from minidist.runtime.transport import oversubscribed, spin_seconds, unreceived, wire_signature

_BYTE = None  # MPI.BYTE, set when the first transport is made (mpi4py is optional)
HDR_TAG, DATA_TAG, FIN_TAG = 0, 1, 2  # FIN: an empty message each rank sends every peer once it has finished
INLINE = 4096  # a message of at most this many bytes travels inside its header's MPI message: one message, not two
HDR_BYTES = HEADER.size + SIG_MAX + INLINE
SPIN = 2e-3  # seconds a wait polls before napping (yielding the core at each look when ranks outnumber cores)
NAP_MAX = 200e-6  # MPI moves a message (and a collective's schedule) only while it is polled
LOOK = 0.05  # seconds between looks for a peer's FIN while a wait is stuck
GRACE = 0.5  # seconds a wait goes on after its peer's FIN before blaming it: what the peer sent last may still land


class MPITransport:
    """The message engine of one rank over an MPI communicator (same interface as ``transport.Transport``)."""

    backend = "mpi"  # what md.dist.get_backend() answers

    rendezvous_bytes = 1 << 62  # no in-place reads across machines: algorithms take their small-message path

    def __init__(self, comm, clock, timeout: float) -> None:
        global _BYTE
        from mpi4py import MPI  # optional: imported only by a rank that runs under MPI

        _BYTE = MPI.BYTE
        self.comm = comm.Dup()  # our messages never meet the user's own MPI calls
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.clock, self.timeout = clock, timeout
        self.board = NoBoard()
        self.coll = None
        self.sends: list[SendOp] = []
        self.recv_q: dict[int, list[RecvOp]] = {}  # posted receives whose message has not been seen
        self.hdr_req: dict[int, tuple] = {}  # src -> (request, buffer) of the next header from src
        self.incoming: list[Incoming] = []  # payloads on their way
        self.stash: dict[int, list[Incoming]] = {}  # messages nobody asked for yet, by sender
        self.failed: list = []
        self.finished_peers: dict[int, float] = {}  # peer -> when its FIN was seen
        self.fin_sends: list = []
        self.native: dict[tuple, object] = {}  # group ranks -> communicator, for MPI's own collectives
        # MPI moves a message only while some rank polls, so a wait polls before it naps; when ranks outnumber
        # cores it gives the core away at each look (a peer on the same core runs at once), as the simulator does
        self.spin = SPIN if spin_seconds() > 0 else 0.0
        self.yield_while_spinning = oversubscribed(self.world) and hasattr(os, "sched_yield")

    # -- posting ---------------------------------------------------------------------------
    def isend(self, arr: np.ndarray, dst: int, tag: int, ready: float, sig: bytes = b"", name: str = "send",
              eager: bool = False) -> SendOp:
        n = arr.nbytes
        start, end = self.clock.message(dst, n, ready)
        wsig = wire_signature(sig)
        shape = arr.shape[:8]
        inline = n <= INLINE
        at = HEADER.size + len(wsig)
        hdr = bytearray(at + n if inline else at)
        HEADER.pack_into(hdr, 0, tag, n, start, end, 0, len(arr.shape), *shape, *(0,) * (8 - len(shape)),
                         arr.dtype.str.encode(), len(wsig), 0)
        hdr[HEADER.size : at] = wsig
        payload = arr.reshape(-1).view(np.uint8) if n else None
        if inline and n:
            np.frombuffer(hdr, np.uint8, n, at)[:] = payload
        reqs = [self.comm.Isend([hdr, len(hdr), _BYTE], dst, HDR_TAG)]
        if not inline:
            reqs.append(self.comm.Isend([payload, n, _BYTE], dst, DATA_TAG))
        op = SendOp(dst, tag, name, reqs, (hdr, payload), start, end)
        self.sends.append(op)
        return op

    def irecv(self, arr: np.ndarray, src: int, tag: int, ready: float, ufunc=None, sig: bytes = b"",
              name: str = "recv", held: bool = False) -> RecvOp:
        op = RecvOp(src, tag, arr, ufunc, sig, name, ready)
        st = self.stash.get(src)
        if st:
            for i, m in enumerate(st):
                if m.hdr[0] == tag:
                    del st[i]
                    self._match(op, m)
                    return op
        self.recv_q.setdefault(src, []).append(op)
        self._pull(src)
        return op

    def sendrecv_small(self, *args, **kwargs) -> None:
        return None  # no shortcut over MPI: the general path

    # -- matching ----------------------------------------------------------------------------
    def _check(self, op: RecvOp, hdr, sig: bytes) -> str | None:
        tag, nbytes, ndim = hdr[0], hdr[1], hdr[5]
        dtype = np.dtype(hdr[14].rstrip(b"\0").decode())
        if sig != op.sig and sig != wire_signature(op.sig):
            theirs = sig.decode(errors="replace") or "a point-to-point send"
            mine = op.sig.decode(errors="replace") or "a point-to-point recv"
            return (f"ranks disagree about a collective call: rank {op.peer} called {theirs}; "
                    f"rank {self.rank} called {mine}")
        if dtype != op.flat.dtype or nbytes != op.nbytes:
            shape = tuple(hdr[6 : 6 + min(ndim, 8)])
            return misfit(op.name, op.peer, self.rank, tag, (shape, dtype, nbytes),
                          (op.buf.shape, op.buf.dtype, op.nbytes))
        return None

    def _match(self, op: RecvOp, m: Incoming) -> None:
        """A stashed message meets its receive."""
        problem = self._check(op, m.hdr, m.sig)
        if problem:
            self._fail(op, problem)
        elif m.arrived:
            self._deliver(op, m.hdr, m.data)
        else:
            m.target = op  # its bytes are still coming: delivered when they arrive

    def _deliver(self, op: RecvOp, hdr, data) -> None:
        if data is not None and data.size:
            if op.ufunc is None:
                op.flat.view(np.uint8)[:] = data
            else:
                op.ufunc(op.flat, data.view(op.flat.dtype), out=op.flat)
        arrival = hdr[3]
        op.end = arrival if arrival > op.post else op.post
        op.done = True

    def _claim(self, src: int, tag: int):
        """The first receive posted for ``src`` with ``tag``, taken off its queue (None if none is waiting)."""
        q = self.recv_q.get(src, [])
        op = next((o for o in q if o.tag == tag), None)
        if op is not None:
            q.remove(op)
            if not q:
                del self.recv_q[src]
        return op

    def _header(self, src: int, buf: bytearray) -> None:
        hdr = HEADER.unpack_from(buf, 0)
        tag, n, siglen = hdr[0], hdr[1], hdr[15]
        sig = bytes(buf[HEADER.size : HEADER.size + siglen])
        op = self._claim(src, tag)
        if 0 < n <= INLINE:  # its bytes came with it
            at = HEADER.size + siglen
            data = np.frombuffer(buf, np.uint8, n, at)
            if op is not None:
                problem = self._check(op, hdr, sig)
                if problem:
                    self._fail(op, problem)
                else:
                    self._deliver(op, hdr, data)
            else:
                self.stash.setdefault(src, []).append(Incoming(hdr, sig, data, None, None))
            return
        discard = False
        if op is not None:
            problem = self._check(op, hdr, sig)
            if problem:
                self._fail(op, problem)
                op, discard = None, True  # its bytes are still taken (and dropped): the sender's request completes
            elif n == 0:
                self._deliver(op, hdr, None)
                return
            elif op.ufunc is None:  # straight into the receive's buffer
                req = self.comm.Irecv([op.flat.view(np.uint8), n, _BYTE], src, DATA_TAG)
                self.incoming.append(Incoming(hdr, sig, None, req, op))
                return
        data = np.empty(n, np.uint8)
        req = self.comm.Irecv([data, n, _BYTE], src, DATA_TAG) if n else None
        m = Incoming(hdr, sig, data, req, op)
        if op is None and not discard:
            self.stash.setdefault(src, []).append(m)
        if req is not None:
            self.incoming.append(m)
        elif op is not None:
            self._deliver(op, hdr, data)

    def _pull(self, src: int) -> bool:
        """Take every header from ``src`` that has arrived while receives from it are waiting."""
        moved = False
        while src in self.recv_q:
            posted = self.hdr_req.get(src)
            if posted is None:
                buf = bytearray(HDR_BYTES)
                posted = self.hdr_req[src] = (self.comm.Irecv([buf, HDR_BYTES, _BYTE], src, HDR_TAG), buf)
            if not posted[0].Test():
                break
            del self.hdr_req[src]
            self._header(src, posted[1])
            moved = True
        return moved

    def _fail(self, op, problem: str) -> None:
        op.error = problem
        op.done = True
        self.failed.append(op)

    # -- progress ----------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = False
        if self.sends:
            left = []
            for op in self.sends:
                if all(r.Test() for r in op.reqs):
                    op.done, op.keep = True, None
                    moved = True
                else:
                    left.append(op)
            self.sends = left
        for src in list(self.recv_q):
            moved |= self._pull(src)
        if self.incoming:
            left = []
            for m in self.incoming:
                if m.req.Test():
                    m.arrived, moved = True, True
                    if m.target is not None and not m.target.done:
                        self._deliver(m.target, m.hdr, m.data)
                else:
                    left.append(m)
            self.incoming = left
        return moved

    def pending(self) -> bool:
        return bool(self.sends or self.recv_q or self.incoming)

    def wait(self, ops, timeout: float | None = None, yielding: bool = False) -> None:
        """Drive MPI until every op is done; after ``timeout`` seconds raise CommTimeoutError naming the wait.

        ``yielding``: between polls give the core away instead of napping (MPI's own collectives advance
        their schedules only while polled, one step per poll, so a nap per step would stretch them).
        """
        timeout = self.timeout if timeout is None else timeout
        t0 = time.monotonic()
        nap, next_look = 0.0, t0
        while True:
            moved = self.progress()
            if self.failed:
                self._raise_failed(ops)
            if all(op.done for op in ops):
                return
            now = time.monotonic()
            if now - t0 > self.spin and now >= next_look:
                next_look = now + LOOK
                self._blame_finished_peers(ops, now)
            if now - t0 >= timeout:
                what = ", ".join(op.describe() for op in ops if not op.done)
                if self.coll is not None:
                    what = f"{self.coll[3].decode(errors='replace')}: {what}"
                raise CommTimeoutError(
                    f"rank {self.rank} waited {now - t0:.1f} s in {what} (MPI backend: the other ranks' states "
                    f"are not visible from here)", {self.rank: "waiting"})
            if moved:
                nap = 0.0
            elif yielding or (self.yield_while_spinning and now - t0 <= self.spin):
                os.sched_yield()
            elif now - t0 > self.spin:  # polled long enough: nap, longer each time, up to NAP_MAX
                nap = min(NAP_MAX, nap * 2 or 10e-6)
                time.sleep(nap)

    def _blame_finished_peers(self, ops, now: float) -> None:
        """A send to or a receive from a peer that has finished can never complete: say so once its FIN is
        GRACE seconds old (the peer's last messages, sent before its FIN, land meanwhile)."""
        for op in ops:
            peer = getattr(op, "peer", None)
            if op.done or peer is None:
                continue
            seen = self.finished_peers.get(peer)
            if seen is None and self.comm.Iprobe(source=peer, tag=FIN_TAG):
                self.finished_peers[peer] = seen = now
            if seen is not None and now - seen >= GRACE:
                way = "receive" if isinstance(op, SendOp) else "send"
                raise PeerExitedError(f"rank {self.rank} waits in {op.describe()} but rank {peer} has finished and "
                                      f"will never {way} it" + (unreceived(peer, op.tag) if way == "receive" else ""))

    def announce_finished(self) -> None:
        """Tell every peer this rank has finished (empty messages, complete without their receivers)."""
        for r in range(self.world):
            if r != self.rank:
                self.fin_sends.append(self.comm.Isend([b"", 0, _BYTE], r, FIN_TAG))

    def wait_times(self, ops, meanwhile=None) -> bool:
        """Here a receive's header and bytes come together (an ``irecv``'s ``held`` changes nothing): wait for
        all, leaving ``meanwhile`` to the caller."""
        self.wait(ops)
        return False

    def _raise_failed(self, ops) -> None:
        for op in ops:
            if op.error is not None and op in self.failed:
                self.failed.remove(op)
                raise MismatchError(op.error)

    def flush(self) -> None:
        """Finish every send and receive still in flight (the rank's function returned with some)."""
        if self.failed:
            op = self.failed.pop(0)
            raise MismatchError(op.error)
        ops = list(self.sends) + [op for q in self.recv_q.values() for op in q]
        ops += [m.target for m in self.incoming if m.target is not None]
        if ops:
            self.wait(ops)

    def close(self) -> None:
        """Cancel the header receives nobody will answer (communicators are left to MPI_Finalize: freeing
        them is collective, and ranks leave at different moments)."""
        for req, _ in self.hdr_req.values():
            req.Cancel()
            req.Wait()
        self.hdr_req.clear()
        for req in self.fin_sends:  # empty messages: out at once, received or not
            req.Wait()
        self.fin_sends.clear()

    # -- collectives: the simulator's board, MPI's own communicators -------------------------
    def publish(self, ranks, key: int, seq: int, sig: bytes, wake: bool = True) -> None:
        self.coll = (ranks, key, seq, sig)

    def agree(self, ranks, key: int, seq: int, sig: bytes, what: str) -> None:
        """Nothing to compare: every message carries the call's signature, checked by its receiver."""

    def ring_all(self) -> None:
        pass

    def spin_native(self, req) -> bool:
        """Poll a request of MPI's own collective back to back for the spin time (as MPI's blocking call polls; its
        schedule advances only while polled); whether it completed. Not when ranks outnumber cores: a peer on
        this core must run, so ``wait_native`` yields at each look instead."""
        test = req.Test
        if test():
            return True
        if self.spin and not self.yield_while_spinning:
            end = time.monotonic() + self.spin
            while True:
                for _ in range(32):
                    if test():
                        return True
                if time.monotonic() > end:
                    return False
                if self.sends or self.incoming:
                    self.progress()
        return False

    def wait_native(self, req, name: str) -> None:
        """Wait for a request of MPI's own collective (``spin_native`` first), with the timeout of any wait."""
        if not self.spin_native(req):
            self.wait([NativeOp(req, name)], yielding=True)

    def group_comm(self, ranks: tuple):
        """The MPI communicator of a process group (made by its members on first use, then kept)."""
        c = self.native.get(ranks)
        if c is None:
            grp = self.comm.Get_group().Incl(list(ranks))
            c = self.native[ranks] = self.comm.Create_group(grp)
            grp.Free()
        return c
