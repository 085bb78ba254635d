"""One simulated rank's streams in closed form: what ``minidist.hardware.clock.Clock`` does, without data
(book ch4, ch14; lab 18).

Property: the simulated clock is a pair of running maxima. Compute ops and synchronous collectives advance
the program (a synchronous collective also waits for the communication stream); asynchronous collectives
advance the communication stream only, and ``wait`` joins the two. So the time of a step is a formula of
the op costs and the order they are issued in, which ``predict.py`` walks. On a measured device a third
running sum, the host's, issues each kernel: a kernel starts at the later of the compute stream and the host.
"""

from __future__ import annotations


class Streams:
    """One rank's compute and communication streams and its outgoing links (``hardware.clock.Clock`` in
    closed form)."""

    def __init__(self) -> None:
        self.compute = 0.0
        self.comm = 0.0
        self.host = 0.0  # the time up to which the host has issued kernels (measured devices only)
        self.terms: dict[str, float] = {}
        self.link_free: dict[tuple, float] = {}  # by (axis, peer): a ring successor is not a pipeline peer

    def add(self, term: str, seconds: float) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + seconds

    def run(self, seconds: float, term: str) -> None:
        self.compute += seconds
        self.add(term, seconds)

    def kernels(self, kernels: list[tuple[float, float]], term: str) -> None:
        """One op's kernels, ``(host seconds, GPU seconds)`` each (``hardware.Clock.charge_compute``): a kernel
        starts once the GPU is free and the host has issued it."""
        t = start = self.compute
        for host, gpu in kernels:
            self.host += host
            t = (t if t > self.host else self.host) + gpu
        self.compute = t
        self.add(term, t - start)

    def sync(self, seconds: float, term: str) -> None:
        """A synchronous collective: after the program and after earlier communication."""
        start = max(self.compute, self.comm)
        self.add(term, start - self.compute + seconds)  # waiting for the comm stream counts as exposed
        self.compute = self.comm = start + seconds

    def launch(self, seconds: float) -> float:
        """An asynchronous collective on the communication stream; returns its end."""
        self.comm = max(self.compute, self.comm) + seconds
        return self.comm

    def wait(self, end: float, term: str) -> None:
        """``Work.wait()``: the program and the communication stream continue after ``end``."""
        if end > self.compute:
            self.add(term, end - self.compute)
            self.compute = end
        self.comm = max(self.comm, end)

    def send(self, dst: tuple, seconds: float) -> float:
        """``isend``: the message leaves when the rank and the link are free; returns its arrival."""
        start = max(self.compute, self.comm, self.link_free.get(dst, 0.0))
        self.link_free[dst] = start + seconds
        return start + seconds

    def recv(self, arrival: float, term: str) -> None:
        """A blocking receive: after the program, the communication stream and the message."""
        self.wait(max(self.compute, self.comm, arrival), term)
