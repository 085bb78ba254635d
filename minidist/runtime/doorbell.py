"""A rank's doorbell: a pipe. Ringing writes a byte into it; sleeping waits, with a timeout, for one.

A process-shared POSIX semaphore would do the same job, but it has a name in /dev/shm from the moment
it is created until it is unlinked: a launcher killed in between (tests kill it at every moment)
leaves the name behind for good. A pipe is two file descriptors, and the kernel closes them with the
last process that holds them, so nothing a launch makes for waiting can outlive it.

Rings pile up as bytes; one wake-up swallows them all. A ring into a full pipe is dropped, which is
harmless: the bell is already ringing. Only a rank that is about to sleep gets rung (waiting.py),
so the write system call stays off the busy path.
"""

from __future__ import annotations

import os
import select


class Doorbell:
    """Ring from any process (``ring``); sleep on it in the owning rank (``sleep``)."""

    def __init__(self) -> None:
        self._rd, self._wr = os.pipe()
        os.set_blocking(self._rd, False)
        os.set_blocking(self._wr, False)
        self._poll = None

    def ring(self) -> None:
        try:
            os.write(self._wr, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of rings the sleeper has not swallowed yet: it will wake
        except OSError:
            pass  # closed by a launcher tearing down: nobody is left to wake

    def sleep(self, seconds: float) -> bool:
        """Wait until rung or ``seconds`` pass; True if rung (all rings so far are swallowed)."""
        if self._poll is None:  # poll, not select: select cannot watch descriptors numbered 1024 or more
            self._poll = select.poll()
            self._poll.register(self._rd, select.POLLIN)
        if not self._poll.poll(max(0, int(seconds * 1000 + 0.999))):
            return False
        try:
            os.read(self._rd, 1 << 16)
        except BlockingIOError:
            pass  # another thread of this rank swallowed the rings first
        return True

    def close(self) -> None:
        for fd in (self._rd, self._wr):
            try:
                os.close(fd)
            except OSError:
                pass
        self._rd = self._wr = -1

    def __getstate__(self):
        # Under spawn the descriptors travel to the child as duplicates (fork simply inherits them).
        from multiprocess.reduction import DupFd

        return DupFd(self._rd), DupFd(self._wr)

    def __setstate__(self, state) -> None:
        rd, wr = state
        self._rd, self._wr, self._poll = rd.detach(), wr.detach(), None
