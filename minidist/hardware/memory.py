"""The memory ledger of one simulated device: what occupies HBM, by category, now and at peak.

Chapter 19's memory equation splits a training step's footprint into parameters, gradients,
optimizer state and activations (plus buffers for communication and scratch). The ledger keeps
that split for each rank: strategies ``alloc`` and ``free`` the bytes of the arrays they hold, by
category, when they allocate and release them (``minidist.parallel.memory`` says how, and what is
left out), and exceeding the simulated HBM capacity raises ``OutOfMemoryError`` with the breakdown,
so a learner sees *which* term of the equation did not fit.
"""

from __future__ import annotations

from contextlib import contextmanager

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB"


class OutOfMemoryError(MemoryError):
    """The simulated HBM is full; the message lists every category's bytes and the request."""


class MemoryLedger:
    """Bytes held per category on one rank, with current and peak values and an HBM capacity."""

    def __init__(self, capacity: float = float("inf"), rank: int = 0) -> None:
        self.capacity = float(capacity)
        self.rank = rank
        self.current: dict[str, float] = {c: 0.0 for c in CATEGORIES}
        self.peak: dict[str, float] = {c: 0.0 for c in CATEGORIES}
        self.total = 0.0
        self.peak_total = 0.0
        self.peak_breakdown: dict[str, float] = dict(self.current)  # categories at the moment of peak_total
        # (simulated seconds, bytes held) after every change, once a clock is attached (the memory timeline)
        self.timeline: list[tuple[float, float]] = []
        self._now = None

    def attach_clock(self, now) -> None:
        """Record the total after every change at ``now()`` (the rank's simulated time) in ``timeline``."""
        self._now = now

    def _record(self) -> None:
        if self._now is not None:
            self.timeline.append((self._now(), self.total))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_now"] = None  # the clock stays with the rank; the timeline travels
        return state

    def alloc(self, category: str, nbytes: float) -> None:
        """Hold ``nbytes`` more in ``category``; raise OutOfMemoryError (holding nothing) if HBM overflows."""
        nbytes = float(nbytes)
        if nbytes < 0:
            raise ValueError(f"MemoryLedger.alloc({category!r}, {nbytes}): bytes must be >= 0")
        if self.total + nbytes > self.capacity:
            parts = ", ".join(f"{c}={_gb(v)}" for c, v in self.current.items() if v)
            raise OutOfMemoryError(
                f"rank {self.rank}: out of simulated HBM allocating {_gb(nbytes)} for {category!r}: "
                f"{_gb(self.total)} held ({parts or 'nothing'}) + {_gb(nbytes)} > capacity {_gb(self.capacity)}"
            )
        cur = self.current.get(category, 0.0) + nbytes
        self.current[category] = cur
        if cur > self.peak.get(category, 0.0):
            self.peak[category] = cur
        self.total += nbytes
        if self.total > self.peak_total:
            self.peak_total = self.total
            self.peak_breakdown = dict(self.current)
        self._record()

    def free(self, category: str, nbytes: float) -> None:
        """Release ``nbytes`` from ``category`` (it must hold at least that much)."""
        nbytes = float(nbytes)
        held = self.current.get(category, 0.0)
        if nbytes < 0 or nbytes > held * (1 + 1e-12) + 1e-9:
            raise ValueError(f"MemoryLedger.free({category!r}, {nbytes:g}): only {held:g} bytes held there")
        self.current[category] = max(0.0, held - nbytes)
        self.total = max(0.0, self.total - nbytes)
        self._record()

    @contextmanager
    def hold(self, category: str, nbytes: float):
        """``with ledger.hold("activations", n): ...`` allocates on entry and frees on exit."""
        self.alloc(category, nbytes)
        try:
            yield self
        finally:
            self.free(category, nbytes)

    def reset_peak(self) -> None:
        self.peak = dict(self.current)
        self.peak_total = self.total
        self.peak_breakdown = dict(self.current)

    @property
    def free_bytes(self) -> float:
        return self.capacity - self.total

    def snapshot(self) -> dict:
        return {
            "rank": self.rank, "capacity": self.capacity, "total": self.total, "peak_total": self.peak_total,
            "current": dict(self.current), "peak": dict(self.peak), "peak_breakdown": dict(self.peak_breakdown),
        }

    def __repr__(self) -> str:
        parts = ", ".join(f"{c}={_gb(v)}" for c, v in self.current.items() if v)
        return (f"MemoryLedger(rank {self.rank}: {_gb(self.total)} of {_gb(self.capacity)} [{parts}], "
                f"peak {_gb(self.peak_total)})")
