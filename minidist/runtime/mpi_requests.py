"""What one rank's MPI engine keeps per operation in flight (``mpi_transport.py`` is the engine).

Property: every operation a wait can name is a record with ``done``, its simulated ``end``, an ``error`` and a
``describe()`` that says which call it is: a send (its MPI requests, and the buffers they read kept alive until
they finish), a receive (its buffer, the reduction it applies, the signature it expects), a message whose header
has arrived and whose bytes are on their way, and a request of MPI's own collective. ``__slots__``: a rank makes
one per message. Beside them ``NoBoard``, the engine's stand-in for the simulator's board.
"""

from __future__ import annotations


class SendOp:
    __slots__ = ("peer", "tag", "name", "reqs", "keep", "start", "end", "done", "error")

    def __init__(self, peer, tag, name, reqs, keep, start, end):
        self.peer, self.tag, self.name, self.reqs, self.keep = peer, tag, name, reqs, keep
        self.start, self.end = start, end
        self.done, self.error = False, None

    def describe(self) -> str:
        if self.tag >= 0:
            return f"{self.name}(dst={self.peer}, tag={self.tag})"
        return f"{self.name} (send to rank {self.peer})"


class RecvOp:
    __slots__ = ("peer", "tag", "buf", "flat", "ufunc", "sig", "name", "post", "nbytes", "end", "done", "error")

    def __init__(self, peer, tag, buf, ufunc, sig, name, post):
        self.peer, self.tag, self.buf, self.ufunc = peer, tag, buf, ufunc
        self.sig, self.name, self.post = sig, name, post
        self.flat = buf.reshape(-1)
        self.nbytes = buf.nbytes
        self.end, self.done, self.error = 0.0, False, None

    def describe(self) -> str:
        if self.tag >= 0:
            return f"{self.name}(src={self.peer}, tag={self.tag})"
        return f"{self.name} (recv from rank {self.peer})"


class Incoming:
    """A message whose header has arrived: its bytes are on their way into ``data`` (or the receive's buffer)."""

    __slots__ = ("hdr", "sig", "data", "req", "target", "arrived")

    def __init__(self, hdr, sig, data, req, target):
        self.hdr, self.sig, self.data, self.req, self.target = hdr, sig, data, req, target
        self.arrived = req is None


class NativeOp:
    """A request of MPI's own collective, waited for like a message."""

    __slots__ = ("req", "name", "finished", "end", "error")

    def __init__(self, req, name):
        self.req, self.name, self.finished, self.end, self.error = req, name, False, 0.0, None

    @property
    def done(self) -> bool:
        if not self.finished:
            self.finished = self.req.Test()
        return self.finished

    def describe(self) -> str:
        return self.name


class NoBoard:
    """The simulator's board has no MPI counterpart: a disagreement is raised by the rank that sees it."""

    def abort(self, message: str, mismatch: bool = False) -> None:
        pass
