"""Work: the handle of an asynchronous operation (``isend``, ``irecv``, ``async_op=True``).

``wait()`` does two things: it drives the messages to completion in real time, and it joins the
simulated streams, so the program continues at ``max(its own time, the operation's end)``. That is
how communication hidden behind compute costs ``max(compute, comm)`` instead of their sum.
"""

from __future__ import annotations


class Work:
    def __init__(self, ctx, ops=(), start: float = 0.0, end: float = 0.0, name: str = "", nbytes: float = 0.0,
                 record: bool = True) -> None:
        self._ctx, self._ops = ctx, list(ops)
        self.start, self._end, self.name, self.nbytes = start, end, name, nbytes
        self._record = record
        self._joined = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done, then join this rank's clock to the operation's end. Returns True."""
        if not self._joined:
            if self._ops:
                self._ctx.transport.wait(self._ops, timeout)
            end = max([self._end] + [op.end for op in self._ops])
            self._ctx.clock.join(end)
            if self._record:
                self._ctx.clock.recorder.record("comm", self.name, self.start, end, self.nbytes, 0.0)
            self._end = end
            self._joined = True
        return True

    def is_completed(self) -> bool:
        """True once the data has moved (a non-blocking check; does not advance the clock)."""
        if self._ops and not all(op.done for op in self._ops):
            self._ctx.transport.progress()
        return all(op.done for op in self._ops)

    def exception(self) -> None:
        """None, as torch's for a Work that has not failed: here a failure raises in ``wait`` instead."""
        return None

    def source_rank(self) -> int:
        """The global rank a receive's message came from (torch's ``Work.source_rank``)."""
        src = getattr(self, "source", None)
        if src is None:
            raise RuntimeError(f"{self.name}: source_rank() belongs to a receive's Work")
        return src

    @property
    def end_time(self) -> float:
        """Simulated time at which the operation completes (known once it has completed)."""
        return max([self._end] + [op.end for op in self._ops])

    def __repr__(self) -> str:
        return f"Work({self.name}, completed={self.is_completed()})"
