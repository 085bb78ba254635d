"""Keep freed memory inside the process, so the next activation does not page-fault it in again.

A training step allocates a fresh numpy array for almost every intermediate and frees most of them
moments later. glibc's malloc gives large freed blocks back to the kernel (``munmap``, or trimming
the top of the heap), so the next array of that size is mapped again and the kernel zero-fills
each 4 KiB page on first touch. For the GPT step of ``tests/bench/bench_autograd.py`` that was about
20,000 page faults and 25 ms of a 220 ms step. Raising malloc's mmap and trim thresholds keeps the
freed blocks in the heap for the next allocation, the same trade PyTorch's caching allocator makes
for GPU memory: the process keeps its peak heap instead of returning it between steps.

Applied once, when ``minidist.autograd`` is imported, on Linux with glibc only. Set the
environment variable ``MINIDIST_KEEP_FREED_MEMORY=0`` to leave malloc's defaults alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap (32 MiB is glibc's largest allowed mmap threshold on
# 64-bit); larger ones are still mapped and unmapped one by one.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the top of the heap is returned to the kernel only beyond this (the largest int).
TRIM_THRESHOLD = 2**31 - 1


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse; return True if the settings were applied."""
    if not sys.platform.startswith("linux") or os.environ.get("MINIDIST_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (present on glibc only; musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
