"""Work: the handle of an asynchronous operation (``isend``, ``irecv``, ``async_op=True``).

``wait()`` does two things: it drives the messages to completion in real time, and it joins the
simulated streams, so the program continues at ``max(its own time, the operation's end)``. That is
how communication hidden behind compute costs ``max(compute, comm)`` instead of their sum.
"""

from __future__ import annotations


class Work:
    def __init__(self, ctx, ops=(), start: float = 0.0, end: float = 0.0, name: str = "", nbytes: float = 0.0,
                 record: bool = True, result: list | None = None) -> None:
        self._ctx, self._ops = ctx, list(ops)
        self._result = [] if result is None else list(result)
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

    def get_future(self) -> Future:
        """A Future whose value is the list of tensors the operation writes (torch's ``Work.get_future``),
        so that code chaining ``.then(...)`` on a collective, as a DDP communication hook does, runs here."""
        return Future(self)

    @property
    def end_time(self) -> float:
        """Simulated time at which the operation completes (known once it has completed)."""
        return max([self._end] + [op.end for op in self._ops])

    def __repr__(self) -> str:
        return f"Work({self.name}, completed={self.is_completed()})"


class Future:
    """The completion of a Work as a value, with the calls of torch.futures.Future that communication hooks use.

    ``wait()`` waits for the operation and returns the list of tensors it wrote (a list output's tensors one by
    one, as torch lists them); ``then(fn)`` gives a Future of ``fn(this future)``. A callback runs once, as soon
    as its future is complete: at once for a collective (here finished when it returns), at the first ``wait()``
    for a point-to-point operation still in flight. A callback that raises makes its future (and those chained
    after it) raise a RuntimeError naming the error, as torch's does."""

    def __init__(self, work: Work, parent: Future | None = None, callback=None) -> None:
        self._work, self._parent, self._callback = work, parent, callback
        self._settled, self._value, self._error = False, None, None

    def _settle(self) -> None:
        if self._settled:
            return
        if self._parent is None:
            self._work.wait()
            self._value = self._work._result
        else:
            self._parent._settle()
            try:
                self._value = self._callback(self._parent)
            except Exception as e:  # torch wraps it so, once, and every later wait raises the same
                self._error = RuntimeError(f"Got the following error when running the callback: "
                                           f"{type(e).__name__}: {e}")
                self._error.__cause__ = e
        self._settled = True

    def done(self) -> bool:
        """True once the operation has completed."""
        return self._work.is_completed()

    def wait(self):
        """Wait for the operation (and this future's callback); return the value."""
        self._settle()
        if self._error is not None:
            raise self._error
        return list(self._value) if self._parent is None else self._value

    def value(self):
        """The value of a completed future (torch: only after ``wait()`` or inside a callback)."""
        if not self._settled and not self.done():
            raise RuntimeError(f"Future.value(): {self._work.name} has not completed; call wait() first")
        return self.wait()

    def then(self, callback) -> Future:
        """A Future of ``callback(self)``, run as soon as this future is complete."""
        if not callable(callback):
            raise TypeError(f"Future.then: callback must be callable, got {callback!r:.60}")
        child = Future(self._work, self, callback)
        if self._settled or self.done():  # complete already: the callback runs now, as torch runs it
            child._settle()
        return child

    def __repr__(self) -> str:
        return f"Future({self._work.name}, done={self.done()})"
