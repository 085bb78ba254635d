"""What a message is, in a rank's queues and on the wire.

``SendOp`` and ``RecvOp`` are a posted send and receive (what ``isend``/``irecv`` return and ``wait`` waits for);
a receive takes its bytes chunk by chunk from the slots (``consume``) or in one read of the sender's memory
(``take_from``, cross-memory attach). A message nobody asked for yet is kept aside as a ``_Stash``; the rest of a
refused one is dropped through a ``_Discard``. The header a message carries in its first slot is packed here
(``shm.HEADER``; a small message's unchanging part once per shape, dtype and signature), and so is the signature's
form on the wire.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

import numpy as np

from minidist.runtime import cma
from minidist.runtime.shm import HEADER, SIG_MAX

if TYPE_CHECKING:
    from minidist.runtime.transport import Transport


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
