"""Starting a launch's ranks as processes: the shared segment, the open files, the start method (``launch.py``).

Property: a launch either starts every rank or says which limit stopped it, and leaves nothing behind. The shared
memory is anonymous or unlinked at birth, so no segment outlives the launcher however it ends; the open-files limit
is raised before the first rank starts (or the launch says how to); a rank the system refuses is reported with the
limit that is the likely cause; ranks started fresh (spawn, forkserver) run with one BLAS thread and do not re-run
the launching script.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from contextlib import contextmanager

from multiprocess import spawn as mp_spawn

from minidist.runtime import shm

_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
START_METHODS = ("fork", "spawn", "forkserver")


class Segment:
    """The launch's shared memory, never left behind.

    Under fork the ranks inherit an anonymous shared mapping. Under spawn and forkserver they inherit a
    descriptor of a segment whose name was unlinked the moment it was created (``shm.create_unnamed``; the
    module docstring of shm.py says why not a name kept until the ranks map it). Either way nothing is left in
    /dev/shm whoever is killed and when, the launcher's whole process group included.
    """

    def __init__(self, size: int, fork: bool) -> None:
        self.fd = -1
        if fork:
            self.mm = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
        else:
            self.mm, self.fd = shm.create_unnamed(size)

    def for_rank(self):
        """What ``rank_main`` maps: the mapping itself under fork, else the descriptor to pass on."""
        return self.mm if self.fd < 0 else shm.Inherited(self.fd)

    def close(self) -> None:
        """Close the descriptor once every rank has been started (their own copies and mappings keep it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def channel_layout(world: int, named: bool) -> shm.Layout:
    """The channels' layout, within the room a named segment has (spawn): touching a page past it would kill."""
    budget = shm.segment_budget()
    room = shm.named_segment_room() if named else None
    if room is not None and room * 9 // 10 < budget:
        try:
            return shm.default_layout(world, room * 9 // 10)
        except ValueError as e:
            raise ValueError(f"{e}; the limit here is /dev/shm, with {shm.size_text(room)} free (a container's "
                             f"default is 64 MB; `docker run --shm-size=1g` raises it); start_method='fork' does not "
                             f"use /dev/shm") from None
    return shm.default_layout(world, budget)


# a rank's doorbell, report pipe and exit sentinel take 5 files in the launcher, and a forked rank inherits them all
FILES_PER_RANK = 6


def open_files() -> int:
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d))
        except OSError:
            pass
    return 64


def enough_files(world: int) -> None:
    """Make sure this process may open the files a launch of ``world`` ranks needs, raising its soft limit if
    the hard one allows; else say how to. A forked rank inherits them all, so it needs as many.

    Without this, 64 ranks under macOS's default limit of 256 (or 256 under Linux's 1024) fail half-started
    with a bare ``OSError: Too many open files``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX, refused earlier
        return
    need = open_files() + FILES_PER_RANK * world + 32
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    target = 2 * need if hard == resource.RLIM_INFINITY else min(hard, 2 * need)
    if target >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return
        except (ValueError, OSError):
            pass
    raise OSError(errno.EMFILE, files_text(world, need, soft, hard))


AS_THREADS = "backend='inprocess' (ranks as threads of this process: the same results and clocks)"  # the way out
_FILES_WAY_OUT = "raise it before starting Python or Jupyter (`ulimit -n {n}` in the shell), or pass " + AS_THREADS


def files_text(world: int, need: int, soft: int, hard: int) -> str:
    import resource

    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return (f"launch: {world} ranks as processes need about {need} open files in this process ({FILES_PER_RANK} per "
            f"rank: its doorbell, report pipe and exit sentinel pipe), but the limit is {soft} and its hard limit "
            f"({limit}) does not let minidist raise it; " + _FILES_WAY_OUT.format(n=2 * need))


def start_failed(e: OSError, rank: int, world: int) -> OSError | None:
    """The error for a rank the system would not start, saying which limit is the likely cause (None: no limit)."""
    if e.errno == errno.EMFILE:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        text = (f"launch: this process ran out of open files (its limit is {soft}) while setting up rank {rank} of "
                f"{world}, {FILES_PER_RANK} files per rank; " + _FILES_WAY_OUT.format(n=max(4096, 2 * soft)))
    elif e.errno in (errno.EAGAIN, errno.ENOMEM):
        text = (f"launch: the system would not start rank {rank} of {world} ({e.strerror}): a limit on processes "
                f"(`ulimit -u`, a container's pid limit) or on memory was reached; use fewer ranks, or {AS_THREADS}")
    else:
        return None
    return OSError(e.errno, text)


def default_start_method() -> str:
    """fork on Linux (fast), spawn elsewhere; ``MINIDIST_START_METHOD`` overrides it, so that code meant for macOS or
    Windows can be tried on Linux (``make test-portability`` runs the notebooks so)."""
    chosen = os.environ.get("MINIDIST_START_METHOD")
    if chosen:
        if chosen not in START_METHODS:
            raise ValueError(f"launch: MINIDIST_START_METHOD must be 'fork', 'spawn' or 'forkserver', got {chosen!r}")
        return chosen
    return "fork" if sys.platform.startswith("linux") else "spawn"


@contextmanager
def spawning():
    """While ranks are started fresh (spawn, forkserver): one BLAS thread each, and no re-run of ``__main__``.

    A spawned child normally re-runs the parent's script before its target, which is why Python asks scripts
    to guard their top level with ``if __name__ == "__main__"``. A rank needs nothing from the script: ``fn``
    arrives by value with the globals it uses (pickling.py), as it must from a notebook, which has no file to
    re-run. So a script without the guard works under spawn (macOS's and Windows' default) as under fork, and
    its top level (loading data, say) runs once, not once per rank.
    """
    saved_env = {k: os.environ.get(k) for k in _BLAS_ENV}
    os.environ.update({k: "1" for k in _BLAS_ENV})
    plain = mp_spawn.get_preparation_data

    def without_main(name):
        data = plain(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = plain
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
