"""One shared-memory segment per launch: an abort word, a status board, and a channel per rank pair.

Everything the ranks share lives in a single POSIX shared-memory segment, so the bytes of a message
are copied exactly once (sender -> segment) and the receiver reads or reduces them in place.

Layout (all offsets 64-byte aligned so any dtype can be viewed in place)::

    [abort: flag, message]
    [board: one record per rank: state, since, what it waits for, current collective signature]
    [channel src->dst for every ordered pair: head, tail, nack | nslots x (header, payload)]

The segment is unlinked as soon as every rank has it mapped (immediately under fork), so nothing
is left in /dev/shm even if the parent is killed.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct

import numpy as np

try:  # CPython's own binding; falls back to /dev/shm files on Linux
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

ABORT_BYTES = 4096
RECORD_BYTES = 2048
CTRL_BYTES = 1024
HDR_BYTES = 1024

# board record fields (int64 / float64 words, then byte areas)
R_STATE, R_SINCE, R_GROUP, R_SEQ, R_DESCLEN, R_SIGLEN = 0, 1, 2, 3, 4, 5
R_DESC_OFF, R_DESC_MAX = 64, 448
R_SIG_OFF, R_SIG_MAX = 512, RECORD_BYTES - 512
RUNNING, WAITING, FINISHED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", WAITING: "waiting", FINISHED: "finished", FAILED: "failed"}

# channel control words (each on its own cache line: the two sides write different ones)
C_HEAD, C_TAIL, C_NACK, C_NACKLEN = 0, 8, 16, 17
C_NACK_OFF = 192

# message header: tag, nbytes, start, arrival, msg index, ndim, shape[8], dtype, siglen, then sig bytes
HEADER = struct.Struct("<qqddqq8q16sq")
SIG_MAX = HDR_BYTES - HEADER.size


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


class Layout:
    """Offsets of every area for ``world`` ranks with ``nslots`` slots of ``slot_bytes`` payload each."""

    def __init__(self, world: int, slot_bytes: int, nslots: int) -> None:
        if slot_bytes % 64:
            raise ValueError(f"slot_bytes must be a multiple of 64, got {slot_bytes}")
        self.world, self.slot_bytes, self.nslots = world, slot_bytes, nslots
        self.board = ABORT_BYTES
        self.channels = _align(self.board + world * RECORD_BYTES, 4096)
        self.slot_stride = HDR_BYTES + slot_bytes
        self.channel_bytes = _align(CTRL_BYTES + nslots * self.slot_stride, 4096)
        self.size = self.channels + world * world * self.channel_bytes

    def record(self, rank: int) -> int:
        return self.board + rank * RECORD_BYTES

    def channel(self, src: int, dst: int) -> int:
        return self.channels + (src * self.world + dst) * self.channel_bytes

    def slot(self, src: int, dst: int, i: int) -> int:
        """Offset of slot ``i``'s header; its payload follows at + HDR_BYTES."""
        return self.channel(src, dst) + CTRL_BYTES + i * self.slot_stride


def default_layout(world: int) -> Layout:
    """Channel sizes: 8 slots of 512 KB per pair (pages are only touched when used)."""
    return Layout(world, slot_bytes=512 * 1024, nslots=8)


def create(size: int) -> tuple[mmap.mmap, str]:
    """Create and map a new segment; return (mapping, name). The caller unlinks it with ``unlink``."""
    name = f"/minidist_{os.getpid()}_{secrets.token_hex(4)}"
    if _posixshmem is not None:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    else:  # pragma: no cover
        fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        unlink(name)
        raise
    os.close(fd)
    return mm, name


def attach(name: str, size: int) -> mmap.mmap:
    if _posixshmem is not None:
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    else:  # pragma: no cover
        fd = os.open("/dev/shm" + name, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    try:
        if _posixshmem is not None:
            _posixshmem.shm_unlink(name)
        else:  # pragma: no cover
            os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass


class Board:
    """The shared abort word and per-rank status records (who waits for what, which collective)."""

    def __init__(self, mm: mmap.mmap, layout: Layout) -> None:
        self.mm, self.layout = mm, layout
        self.buf = np.frombuffer(mm, np.uint8)
        self.abort_words = np.frombuffer(mm, np.int64, 2, 0)
        self.words = [np.frombuffer(mm, np.int64, 8, layout.record(r)) for r in range(layout.world)]
        self.fwords = [np.frombuffer(mm, np.float64, 8, layout.record(r)) for r in range(layout.world)]

    # -- abort -----------------------------------------------------------------------------
    def aborted(self) -> str | None:
        if self.abort_words[0] == 0:
            return None
        n = int(self.abort_words[1])
        return bytes(self.buf[64 : 64 + n]).decode(errors="replace")

    def abort(self, message: str) -> None:
        if self.abort_words[0]:
            return
        data = message.encode()[: ABORT_BYTES - 64]
        self.buf[64 : 64 + len(data)] = np.frombuffer(data, np.uint8)
        self.abort_words[1] = len(data)
        self.abort_words[0] = 1

    # -- status ----------------------------------------------------------------------------
    def set_state(self, rank: int, state: int, since: float = 0.0, desc: str | None = None) -> None:
        w = self.words[rank]
        if desc is not None:
            data = desc.encode()[:R_DESC_MAX]
            off = self.layout.record(rank) + R_DESC_OFF
            self.buf[off : off + len(data)] = np.frombuffer(data, np.uint8)
            w[R_DESCLEN] = len(data)
            self.fwords[rank][R_SINCE] = since
        w[R_STATE] = state

    def state(self, rank: int) -> int:
        return int(self.words[rank][R_STATE])

    def describe(self, rank: int) -> tuple[int, float, str]:
        w = self.words[rank]
        n = int(w[R_DESCLEN])
        off = self.layout.record(rank) + R_DESC_OFF
        desc = bytes(self.buf[off : off + n]).decode(errors="replace")
        return int(w[R_STATE]), float(self.fwords[rank][R_SINCE]), desc

    # -- collective signatures (checked when a rank blocks inside a collective) ----------------
    def set_call(self, rank: int, group: int, seq: int, sig: bytes) -> None:
        w = self.words[rank]
        w[R_SEQ] = -1  # readers ignore the record while it is being rewritten
        sig = sig[:R_SIG_MAX]
        off = self.layout.record(rank) + R_SIG_OFF
        self.buf[off : off + len(sig)] = np.frombuffer(sig, np.uint8)
        w[R_SIGLEN] = len(sig)
        w[R_GROUP] = group
        w[R_SEQ] = seq

    def call(self, rank: int) -> tuple[int, int, bytes] | None:
        w = self.words[rank]
        seq = int(w[R_SEQ])
        if seq < 0:
            return None
        group, n = int(w[R_GROUP]), int(w[R_SIGLEN])
        off = self.layout.record(rank) + R_SIG_OFF
        sig = bytes(self.buf[off : off + n])
        if int(w[R_SEQ]) != seq:
            return None
        return group, seq, sig
