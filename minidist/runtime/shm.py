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
import zlib

import numpy as np

try:  # CPython's own binding; falls back to /dev/shm files on Linux
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

ABORT_BYTES = 4096
RECORD_BYTES = 8192
CTRL_BYTES = 1024
HDR_BYTES = 1024

# board record fields (int64 / float64 words, then byte areas)
R_STATE, R_SINCE, R_DESCLEN = 0, 1, 4
R_DESC_OFF, R_DESC_MAX = 64, 448
# then a table of the last collective called on each group: key, seq, crc, siglen, signature text
G_OFF, G_SLOTS, G_BYTES = 512, 29, 256
G_SIG_MAX = G_BYTES - 32
RUNNING, WAITING, FINISHED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", WAITING: "waiting", FINISHED: "finished", FAILED: "failed"}

# channel control words (each on its own cache line: the two sides write different ones)
C_HEAD, C_TAIL, C_NACK, C_NACKLEN, C_WANT = 0, 8, 16, 17, 24  # C_WANT: the sender sleeps on this channel
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
        self._tables: dict[int, np.ndarray] = {}
        self._slot_of: dict[int, int] = {}  # this process's own group slots (only the owner writes them)

    # -- abort -----------------------------------------------------------------------------
    def aborted(self) -> str | None:
        if self.abort_words[0] == 0:
            return None
        n = int(self.abort_words[1])
        return bytes(self.buf[64 : 64 + n]).decode(errors="replace")

    def abort(self, message: str, mismatch: bool = False) -> None:
        """Stop every rank at its next wait; ``mismatch`` marks a disagreement about a collective call."""
        if self.abort_words[0]:
            return
        data = message.encode()[: ABORT_BYTES - 64]
        self.buf[64 : 64 + len(data)] = np.frombuffer(data, np.uint8)
        self.abort_words[1] = len(data)
        self.abort_words[0] = 2 if mismatch else 1

    def abort_is_mismatch(self) -> bool:
        return int(self.abort_words[0]) == 2

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

    # -- collective calls: per rank and group, the latest call's number and signature ----------
    def _table(self, rank: int) -> np.ndarray:
        t = self._tables.get(rank)
        if t is None:
            off = self.layout.record(rank) + G_OFF
            t = self._tables[rank] = np.frombuffer(self.mm, np.int64, G_SLOTS * G_BYTES // 8, off).reshape(
                G_SLOTS, G_BYTES // 8)
        return t

    def publish(self, rank: int, key: int, seq: int, sig: bytes) -> None:
        """Record that ``rank`` entered call number ``seq`` on group ``key`` with signature ``sig``."""
        t = self._table(rank)
        slot = self._slot_of.get(key)
        if slot is None:  # a new group: a free slot, else recycle the oldest
            used = len(self._slot_of)
            slot = used if used < G_SLOTS else self._evict()
            self._slot_of[key] = slot
        row = t[slot]
        row[1] = -1  # readers skip the slot while it is rewritten
        text = sig[:G_SIG_MAX]
        off = self.layout.record(rank) + G_OFF + slot * G_BYTES + 32
        self.buf[off : off + len(text)] = np.frombuffer(text, np.uint8)
        row[2], row[3], row[0] = zlib.crc32(sig), len(text), key
        row[1] = seq

    def _evict(self) -> int:
        key = next(iter(self._slot_of))
        return self._slot_of.pop(key)

    def lookup(self, rank: int, key: int) -> tuple[int, int, str] | None:
        """(seq, crc, signature text) of ``rank``'s latest call on group ``key``, or None."""
        t = self._table(rank)
        hits = np.flatnonzero(t[:, 0] == key)
        if not len(hits):
            return None
        row = t[hits[0]]
        seq = int(row[1])
        if seq < 0:
            return None
        crc, n = int(row[2]), int(row[3])
        off = self.layout.record(rank) + G_OFF + int(hits[0]) * G_BYTES + 32
        text = bytes(self.buf[off : off + n]).decode(errors="replace")
        if int(row[1]) != seq:
            return None
        return seq, crc, text
