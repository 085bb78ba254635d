"""Cross-memory attach: copy bytes straight out of another rank's memory (Linux ``process_vm_readv``).

Through the shared channel a message is copied twice (sender -> slot, slot -> receiver) and a
message larger than the channel makes the sender wait for free slots again and again. With
cross-memory attach the sender only publishes where its buffer is; the receiver copies (or
reduces) from it directly, in one pass, and tells the sender when it is done (MPI implementations
call this the rendezvous protocol).

The kernel allows it between processes of the same user unless a policy forbids it (Yama
``ptrace_scope`` >= 1, seccomp, some containers). Each receiver therefore probes each sender once:
it reads a known word from the sender's memory, and channels where that fails keep the two-copy
path. ``MINIDIST_CMA=0`` turns the fast path off everywhere.
"""

from __future__ import annotations

import ctypes
import os
import sys

MAGIC = 0x6D696E6964697374  # the probe word: "minidist" in ASCII


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]
    return fn


_readv = _bind()


def enabled() -> bool:
    """Whether this platform has the system call and ``MINIDIST_CMA=0`` did not turn it off."""
    return _readv is not None and os.environ.get("MINIDIST_CMA", "1") != "0"


def read(pid: int, remote: int, local: int, nbytes: int) -> str | None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to our address ``local``.

    Returns None on success, else what went wrong (the other process is gone, or it is not allowed).
    """
    done = 0
    while done < nbytes:
        loc, rem = _IOVec(local + done, nbytes - done), _IOVec(remote + done, nbytes - done)
        got = _readv(pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            return os.strerror(err) if got < 0 else "no bytes could be read"
        done += got
    return None
