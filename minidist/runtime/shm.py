"""One shared-memory segment per launch: an abort word, a status board, and a channel per rank pair.

Everything the ranks share lives in a single POSIX shared-memory segment, so the bytes of a message
are copied exactly once (sender -> segment) and the receiver reads or reduces them in place
(messages too large for a channel skip the segment: see ``cma.py``).

Layout (all offsets 64-byte aligned so any dtype can be viewed in place)::

    [abort: flag, message]
    [board: one record per rank: state, since, what it waits for, pid, current collective signatures]
    [channel src->dst for every ordered pair: head, tail, sleep flags, nack | nslots x (header, payload)]

Under fork the segment is an anonymous shared mapping that the ranks inherit: it has no name to
leak. Under spawn and forkserver a rank is a fresh program and cannot inherit a mapping, but it can
inherit a file descriptor: the segment is opened by name and unlinked at once (``create_unnamed``),
and its descriptor travels to each rank as multiprocess passes a pipe (``Inherited``). POSIX keeps
an unlinked segment alive while a descriptor or a mapping holds it, and frees it when the last goes,
so whatever dies and however (a SIGKILL of the launcher's whole process group, which also takes any
helper that could have unlinked a name: a terminal's kill, a Jupyter kernel restart), nothing is
left in /dev/shm. Keeping the name until every rank has mapped it, and unlinking it then, would leave
it for good if the group were killed while spawned ranks import (seconds); a reaper process would
die with the group unless it left it. The name exists only between two system calls of the parent
(``shm_open``, ``shm_unlink``). The pages still count against /dev/shm's room (``named_segment_room``).
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
R_STATE, R_SINCE, R_DESCLEN, R_NAP, R_PID, R_PROBE = 0, 1, 4, 5, 6, 7  # R_PID, R_PROBE: see cma.py
R_DESC_OFF, R_DESC_MAX = 64, 384  # words 2, 3, 56-63 and the one after the G table: deadlock.py
# then a table of the last collective called on each group: key, seq, crc, siglen, signature text
G_OFF, G_SLOTS, G_BYTES = 512, 29, 256
G_SIG_MAX = G_BYTES - 32
RUNNING, WAITING, FINISHED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", WAITING: "waiting", FINISHED: "finished", FAILED: "failed"}

# channel control words (each on its own cache line: the two sides write different ones)
# C_WANT: the sender sleeps until this channel moves; C_RWANT: the receiver sleeps until data arrives;
# C_CMA: the receiver can read the sender's memory directly (1) or cannot (2), see cma.py
C_HEAD, C_TAIL, C_RWANT, C_CMA, C_NACK, C_NACKLEN, C_WANT = 0, 8, 9, 10, 16, 17, 24
C_NACK_OFF = 192

# message header: tag, nbytes, start, arrival, msg index, ndim, shape[8], dtype, siglen, address of the
# sender's buffer when the receiver is to read it from there (0: the bytes follow in the slots), then sig bytes
HEADER = struct.Struct("<qqddqq8q16sqq")
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


SEGMENT_BUDGET = 4 << 30  # bytes of address space the channels may reserve (and at most a quarter of the RAM)
MIN_SLOT_BYTES, MIN_SLOTS = 4096, 2


def segment_budget() -> int:
    """How large a launch's segment may be: ``SEGMENT_BUDGET``, or a quarter of the machine's memory if less.

    Pages are only touched when used, but the kernel still weighs the whole mapping when it is made: Linux
    refuses one larger than its memory and swap (a bare ``OSError: Cannot allocate memory``)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        ram = 0
    return min(SEGMENT_BUDGET, ram // 4) if ram > 0 else SEGMENT_BUDGET


def size_text(nbytes: float) -> str:
    """Bytes for a person: '1.5 GB', '270 MB', '832 KB'."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}" if nbytes < 10 * scale else f"{nbytes / scale:,.0f} {unit}"
    return f"{nbytes / 1024:,.0f} KB"


def named_segment_room() -> int | None:
    """Bytes free where named segments live (/dev/shm on Linux), or None where that cannot be read.

    The kernel lets a segment be sized past that room (its pages are only promised), then kills with SIGBUS
    the first rank that touches a page beyond it: a container's /dev/shm is 64 MB unless raised."""
    try:
        st = os.statvfs("/dev/shm")
    except (AttributeError, OSError):
        return None
    return st.f_bavail * st.f_frsize


def default_layout(world: int, budget: int | None = None) -> Layout:
    """Channel sizes: 8 slots of 512 KB per ordered pair of ranks, smaller when that would not fit ``budget``.

    A pair's channel is its own (no lock anywhere), so the segment grows as world²: 8 ranks reserve 270 MB,
    64 ranks would reserve 17 GB. Above the budget the slots shrink first (down to 4 KB), then their number
    (down to 2). Smaller channels change only how bytes travel: fewer messages take the one-slot fast path,
    and those that fill every slot are read in place where cross-memory attach is allowed, or go in more
    rounds. The simulated times do not depend on it.
    """
    budget = segment_budget() if budget is None else budget
    slot, nslots = 512 * 1024, 8
    lay = Layout(world, slot, nslots)
    while lay.size > budget and (slot > MIN_SLOT_BYTES or nslots > MIN_SLOTS):
        if slot > MIN_SLOT_BYTES:
            slot //= 2
        else:
            nslots //= 2
        lay = Layout(world, slot, nslots)
    if lay.size > budget:
        raise ValueError(
            f"launch: {world} ranks as processes need {size_text(lay.size)} of shared memory for their "
            f"channels even with {nslots} slots of {slot // 1024} KB per pair ({world * world:,} ordered pairs), "
            f"more than the {size_text(budget)} this machine allows a launch; pass backend='inprocess' (ranks "
            f"as threads of this process, the same results and clocks), with shape-only arrays for thousands")
    return lay


def new_name() -> str:
    """A fresh segment name (the creating process's pid in it, so a leak says whose it was)."""
    return f"/minidist_{os.getpid()}_{secrets.token_hex(4)}"


def create_unnamed(size: int) -> tuple[mmap.mmap, int]:
    """Create and map a new segment that has no name left; return (mapping, descriptor).

    The name is unlinked before anything else happens, so no death of any process can leave it behind; the
    caller closes the descriptor once every process that needs it has it (``Inherited``)."""
    name = new_name()
    if _posixshmem is not None:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    else:  # pragma: no cover
        fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    unlink(name)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size), fd
    except BaseException:
        os.close(fd)
        raise


class Inherited:
    """A segment's descriptor on its way to a process multiprocess starts fresh (spawn, forkserver).

    Pickled while the process is being started, it asks multiprocess to pass the descriptor on, as it passes
    a pipe (``reduction.DupFd``); the process maps it with ``map_inherited``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocess import reduction

        return _inherit, (reduction.DupFd(self.fd),)


def _inherit(dup) -> Inherited:
    return Inherited(dup.detach())


def map_inherited(seg: Inherited, size: int) -> mmap.mmap:
    """Map the segment ``seg`` carries in this process and close its descriptor (the mapping keeps it alive)."""
    try:
        return mmap.mmap(seg.fd, size)
    finally:
        os.close(seg.fd)


def unlink(name: str) -> None:
    try:
        if _posixshmem is not None:
            _posixshmem.shm_unlink(name)
        else:  # pragma: no cover
            os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass


class Board:
    """The shared abort word and per-rank status records (who waits for what, which collective).

    Single words are read and written through ``memoryview`` casts of the segment: far cheaper than
    numpy scalar indexing, and they are on the path of every message.
    """

    def __init__(self, mm: mmap.mmap, layout: Layout) -> None:
        self.mm, self.layout = mm, layout
        self.buf = np.frombuffer(mm, np.uint8)
        self.q = memoryview(mm).cast("q")  # int64 words of the whole segment
        self.d = memoryview(mm).cast("d")  # the same bytes as float64
        self.rec = [layout.record(r) // 8 for r in range(layout.world)]  # word index of each record
        self._tables: dict[int, np.ndarray] = {}
        self._slot_of: dict[int, int] = {}  # this process's own group slots (only the owner writes them)
        self._last: dict[int, tuple] = {}  # group key -> (signature object, word) of the call last published
        self._hint: dict[tuple[int, int], int] = {}  # (rank, key) -> where that rank's row was last seen

    # -- abort -----------------------------------------------------------------------------
    def aborted(self) -> str | None:
        if self.q[0] == 0:
            return None
        n = self.q[1]
        return bytes(self.buf[64 : 64 + n]).decode(errors="replace")

    def abort(self, message: str, mismatch: bool = False) -> None:
        """Stop every rank at its next wait; ``mismatch`` marks a disagreement about a collective call."""
        if self.q[0]:
            return
        data = message.encode()[: ABORT_BYTES - 64]
        self.buf[64 : 64 + len(data)] = np.frombuffer(data, np.uint8)
        self.q[1] = len(data)
        self.q[0] = 2 if mismatch else 1

    def abort_is_mismatch(self) -> bool:
        return self.q[0] == 2

    # -- status ----------------------------------------------------------------------------
    def set_state(self, rank: int, state: int, since: float = 0.0, desc: str | None = None) -> None:
        w = self.rec[rank]
        if desc is not None:
            self.set_desc(rank, desc)
            self.d[w + R_SINCE] = since
        self.q[w + R_STATE] = state

    def set_desc(self, rank: int, desc: str) -> None:
        """What ``rank`` waits for, in words (read only by reports after a timeout)."""
        data = desc.encode()[:R_DESC_MAX]
        off = self.layout.record(rank) + R_DESC_OFF
        self.buf[off : off + len(data)] = np.frombuffer(data, np.uint8)
        self.q[self.rec[rank] + R_DESCLEN] = len(data)

    def set_waiting(self, rank: int, since: float) -> None:
        """Mark ``rank`` as waiting without a description yet (it is written if the wait lasts)."""
        w = self.rec[rank]
        self.q[w + R_DESCLEN] = 0
        self.d[w + R_SINCE] = since
        self.q[w + R_STATE] = WAITING

    def state(self, rank: int) -> int:
        return self.q[self.rec[rank] + R_STATE]

    def set_napping(self, rank: int, on: bool) -> None:
        """``rank`` sleeps in ``agree`` until its peers announce their call (``publish`` rings it)."""
        self.q[self.rec[rank] + R_NAP] = 1 if on else 0

    def napping(self, rank: int) -> bool:
        return self.q[self.rec[rank] + R_NAP] != 0

    def describe(self, rank: int) -> tuple[int, float, str]:
        w = self.rec[rank]
        n = self.q[w + R_DESCLEN]
        off = self.layout.record(rank) + R_DESC_OFF
        desc = bytes(self.buf[off : off + n]).decode(errors="replace") or "a communication call"
        return self.q[w + R_STATE], self.d[w + R_SINCE], desc

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
        q = self.q
        last = self._last.get(key)
        if last is not None and last[0] is sig:  # the same call as last time on this group: only the number moves
            q[last[1] + 1] = seq
            return
        slot = self._slot_of.get(key)
        if slot is None:  # a new group: a free slot, else recycle the oldest
            used = len(self._slot_of)
            slot = used if used < G_SLOTS else self._evict()
            self._slot_of[key] = slot
        w = (self.layout.record(rank) + G_OFF + slot * G_BYTES) // 8
        crc = zlib.crc32(sig)
        self._last[key] = (sig, w)
        q[w + 1] = -1  # readers skip the slot while it is rewritten
        text = sig[:G_SIG_MAX]
        off = w * 8 + 32
        self.buf[off : off + len(text)] = np.frombuffer(text, np.uint8)
        q[w + 2], q[w + 3], q[w] = crc, len(text), key
        q[w + 1] = seq

    def _evict(self) -> int:
        key = next(iter(self._slot_of))
        self._last.pop(key, None)
        return self._slot_of.pop(key)

    def _row(self, rank: int, key: int) -> int | None:
        """Word index of ``rank``'s row for group ``key`` (remembered, checked, searched if it moved)."""
        hint = self._hint.get((rank, key))
        if hint is not None and self.q[hint] == key:
            return hint
        hits = np.flatnonzero(self._table(rank)[:, 0] == key)
        if not len(hits):
            return None
        w = (self.layout.record(rank) + G_OFF + int(hits[0]) * G_BYTES) // 8
        self._hint[rank, key] = w
        return w

    def lookup_crc(self, rank: int, key: int) -> tuple[int, int] | None:
        """(seq, crc of the signature) of ``rank``'s latest call on group ``key``, or None: the cheap check."""
        w = self._row(rank, key)
        if w is None:
            return None
        q = self.q
        seq = q[w + 1]
        if seq < 0:
            return None
        crc = q[w + 2]
        if q[w + 1] != seq or q[w] != key:
            return None
        return seq, crc

    def lookup(self, rank: int, key: int) -> tuple[int, int, str] | None:
        """(seq, crc, signature text) of ``rank``'s latest call on group ``key``, or None."""
        w = self._row(rank, key)
        if w is None:
            return None
        q = self.q
        seq = q[w + 1]
        if seq < 0:
            return None
        crc, n = q[w + 2], q[w + 3]
        text = bytes(self.buf[w * 8 + 32 : w * 8 + 32 + n]).decode(errors="replace")
        if q[w + 1] != seq or q[w] != key:
            return None
        return seq, crc, text
