"""Address space for shape-only arrays (``shape_only.py``): ranges no memory ever backs.

Property: a shape-only array needs an address, not memory. numpy decides view or copy (``may_share_memory``,
which the autograd charges by) from addresses and strides, so every live shape-only array gets a range of its own;
the ranges come from unreserved mappings the kernel neither counts nor backs, so a 405B step's arrays fit in
a laptop's memory, and a range is reused once the last view of its array has gone.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref

# Linux's MAP_NORESERVE (Python names it from 3.12 on): address space the kernel neither counts nor backs, so
# a 34 GB attention score matrix maps on a 24 GB machine
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
_NOHUGE, _HUGE = getattr(mmap, "MADV_NOHUGEPAGE", None), 2 * 2**20


def _mapping(nbytes: int) -> mmap.mmap:
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | _NORESERVE
    m = mmap.mmap(-1, max(int(nbytes), 1), flags=flags)
    if nbytes >= _HUGE and _NOHUGE is not None:  # a touched byte would otherwise cost a whole 2 MB huge page
        m.madvise(_NOHUGE)
    return m


class AddressSpace:
    """Address ranges for shape-only arrays: each live array has its own, none is ever backed by memory.

    A mapping per array (``mmap``, then ``munmap`` when it dies) took a fifth of a shape-only 405B step, which
    makes about 400,000 arrays. Ranges are cut instead from large unreserved mappings, one size class per power
    of two, and handed to numpy as a ctypes array at the range's address. That object becomes the array's base,
    kept alive by every view of it, so a weak reference to it says when the last view has gone and the range
    may be handed out again. No two live arrays overlap, so numpy's view-or-copy answers (``may_share_memory``,
    which the autograd charges by) are those of separate allocations.
    """

    SMALLEST, CHUNK = 12, 1 << 28  # a page; classes below 256 MB share mappings of that much address space

    def __init__(self) -> None:
        self._free: dict[int, list[int]] = {}  # size class -> addresses free to hand out
        self._lent: dict[int, tuple] = {}  # id(weak reference) -> (the reference, class, address)
        self._maps: list[mmap.mmap] = []  # kept for the life of the process: the ranges are recycled, not unmapped
        # one ctypes type per class (ctypes keeps every array type it makes, and sizes are many), up to the 128 TB
        # of a process's address space
        self._types = [ctypes.c_char * (1 << k) for k in range(48)]

    def take(self, nbytes: int):
        """A writable buffer of ``nbytes`` at an address no live shape-only array uses."""
        k = max(self.SMALLEST, (nbytes - 1).bit_length())
        try:  # rank threads take and give back concurrently: pop and append are atomic, a test-then-pop is not
            addr = self._free[k].pop()
        except (KeyError, IndexError):
            addr = self._grow(k)
        buf = self._types[k].from_address(addr)  # the whole range: numpy uses what the shape needs
        ref = weakref.ref(buf, self._give_back)
        self._lent[id(ref)] = (ref, k, addr)
        return buf

    def _give_back(self, ref) -> None:
        _, k, addr = self._lent.pop(id(ref))
        self._free[k].append(addr)

    def _grow(self, k: int) -> int:
        size = 1 << k
        count = max(1, self.CHUNK >> k)
        m = _mapping(size * count)
        self._maps.append(m)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self._free.setdefault(k, []).extend(range(base + size, base + size * count, size))
        return base
