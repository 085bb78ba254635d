"""The simulated clock of one rank: a compute stream, a comm stream and the links it sends on.

Time is simulated, in seconds, and advances only when something is charged (chapters 2 and 4):

* compute: an op of ``flops`` FLOP moving ``nbytes`` bytes costs the roofline
  ``max(flops / peak[dtype], nbytes / hbm_bw)`` and runs on the compute stream, on the ideal device
  (``Cluster(kernels="roofline")``, the default). On a measured device (``kernels="measured"``) the op is the
  kernels an eager framework launches for it, each priced by ``hardware/kernels.py``: the host issues them on
  a third stream, ``host``, and a kernel starts once the GPU is free and the host has issued it;
* communication: a message of ``n`` bytes on link L costs ``alpha_L + n / beta_L`` (beta in bytes/s).
  A directed link carries one message at a time, so a message starts at
  ``max(ready, link free)``; its receive completes at ``max(receiver's clock, start + cost)``.

``compute`` and ``comm`` are the times up to which each stream has committed work. A synchronous
collective starts at ``max(compute, comm)`` and sets both to its end; an asynchronous one advances only
``comm`` and leaves ``compute`` free until ``Work.wait()`` joins them, which is why overlapped
communication costs ``max(compute, comm)`` rather than the sum.
"""

from __future__ import annotations

import numpy as np

from minidist.hardware.cluster import Cluster
from minidist.hardware.kernels import peak_format
from minidist.hardware.trace import Recorder


class Clock:
    """Simulated streams of rank ``rank`` on ``cluster``; every charge is recorded in ``recorder``."""

    def __init__(self, rank: int, cluster: Cluster, recorder: Recorder | None = None) -> None:
        self.rank = rank
        self.cluster = cluster
        self.compute = 0.0
        self.comm = 0.0
        self.recorder = recorder if recorder is not None else Recorder(rank)
        self._link_free: dict[int, float] = {}  # dst -> time the link rank -> dst is free again
        self._routes: dict[int, tuple] = {}  # dst -> (cluster, alpha, beta, trace name)
        self._peaks: dict[object, float] = {}
        self._formats: dict[object, tuple[str, float]] = {}
        self.kernels = cluster.kernel_model  # how an op is priced: the roofline, or a measured GPU's kernels
        self.host = 0.0  # the time up to which the host (Python, the launch calls) has issued kernels
        self.slowdown = 1.0  # a straggler's compute takes this many times longer (fault injection)
        # bytes on the wire per byte of the array sent: mixed precision sends 2-byte numbers that numpy holds in 4
        self.wire_scale = 1.0

    # -- time ------------------------------------------------------------------------------
    def now(self) -> float:
        """Time of this rank's program: the compute stream, which every sync op and wait() joins."""
        return self.compute

    def end(self) -> float:
        """Time at which all committed work (pending async communication included) is finished."""
        return max(self.compute, self.comm)

    # -- compute ---------------------------------------------------------------------------
    def peak(self, dtype) -> float:
        """Peak FLOP/s charged for ``dtype`` (the cluster's ``compute_dtype`` wins when set)."""
        try:
            return self._peaks[dtype]
        except KeyError:
            pass
        self._peaks[dtype] = p = self.format(dtype)[1]  # integer and bool ops: charged at the fp32 rate
        return p

    def roofline(self, flops: float, nbytes: float, dtype=np.float32) -> float:
        """Seconds for one op: max(flops / peak[dtype], nbytes / hbm_bw)."""
        return max(flops / self.peak(dtype), nbytes / self.cluster.gpu.hbm_bw)

    def format(self, dtype) -> tuple[str, float]:
        """The peak format charged for ``dtype`` ("fp32", "bf16", ...) and its FLOP/s."""
        try:
            return self._formats[dtype]
        except KeyError:
            pass
        name = self.cluster.compute_dtype or (dtype if isinstance(dtype, str) else np.dtype(dtype).name)
        fmt = self._formats[dtype] = peak_format(self.cluster.gpu, name)
        return fmt

    def charge_compute(self, name: str, flops: float, nbytes: float, dtype=np.float32, shape: tuple = ()) -> float:
        """Run one op on the compute stream; return its duration (from the stream's time to the op's end)."""
        start = self.compute
        if self.kernels.ideal:
            dt = max(flops / self.peak(dtype), nbytes / self.cluster.gpu.hbm_bw) * self.slowdown
            self.compute = start + dt
            self.recorder.record("compute", name, start, self.compute, nbytes, flops)
            return dt
        fmt, peak = self.format(dtype)
        gpu = self.cluster.gpu
        t = first = start
        for i, (host, seconds) in enumerate(self.kernels.kernels(name, flops, nbytes, fmt, peak, gpu.hbm_bw,
                                                                 gpu.peak("fp32"), shape)):
            self.host += host
            begin = t if t > self.host else self.host  # the GPU waits for the host to issue the kernel
            if i == 0:
                first = begin
            t = begin + seconds * self.slowdown
        self.compute = t
        self.recorder.record("compute", name, first, t, nbytes, flops)
        return t - start

    def hook(self, name: str, flops: float, nbytes: float, dtype, shape: tuple = ()) -> None:
        """The autograd cost hook: ``minidist.autograd.cost.set_cost_hook(clock.hook)``."""
        self.charge_compute(name, flops, nbytes, dtype, shape)

    def sleep(self, seconds: float, name: str = "idle") -> None:
        """Advance the compute stream by ``seconds`` (a stand-in for work the model does not cost)."""
        self.charge_compute_seconds(name, seconds)

    def charge_compute_seconds(self, name: str, seconds: float) -> None:
        start = self.compute
        self.compute = start + float(seconds)
        self.recorder.record("compute", name, start, self.compute, 0.0, 0.0)

    # -- communication ---------------------------------------------------------------------
    def message(self, dst: int, nbytes: int, ready: float) -> tuple[float, float]:
        """Book the link rank -> ``dst`` for a message ready at ``ready``: return (start, arrival)."""
        route = self._routes.get(dst)
        if route is None or route[0] is not self.cluster:  # small messages are common: look the link up once
            l = self.cluster.link(self.rank, dst)
            route = self._routes[dst] = (self.cluster, l.alpha, l.beta, f"{self.rank}->{dst}")
        if self.wire_scale != 1.0:
            nbytes = nbytes * self.wire_scale
        free = self._link_free.get(dst, 0.0)
        start = ready if ready > free else free
        arrival = start + route[1] + nbytes / route[2]
        self._link_free[dst] = arrival
        rec = self.recorder  # Recorder.record, inline: every message pays for it
        if rec.enabled:
            rec.events.append(("link", route[3], start, arrival, float(nbytes), 0.0))
        return start, arrival

    def begin_comm(self) -> float:
        """Start time of a comm-stream op issued now: after the program and after earlier comm work."""
        compute, comm = self.compute, self.comm
        return compute if compute > comm else comm  # max(), without a call: small collectives feel it

    def end_comm(self, name: str, start: float, end: float, nbytes: float, async_op: bool) -> None:
        """Commit a comm op [start, end]; a sync op also joins the compute stream."""
        if end > self.comm:
            self.comm = end
        if not async_op and end > self.compute:
            self.compute = end
        self.recorder.record("comm", name, start, end, nbytes, 0.0)

    def join(self, t: float) -> None:
        """Work.wait(): the program continues after time ``t``."""
        if t > self.compute:
            self.compute = t
        if t > self.comm:
            self.comm = t
