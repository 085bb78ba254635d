"""Offloading: keep optimizer state (and the weights) in host memory, stream over PCIe (chapter 22, lab 14).

The property: the optimizer update is elementwise and runs once per step, so it does not need the
GPU's bandwidth; it can run where the memory is plentiful (host DRAM, ZeRO-Offload), provided the
gradients go down the PCIe link and the new weights come back. The GPU then holds no optimizer
state at all.

Timing on the simulated clock, per piece of the model this rank updates (a bucket or a layer's
shard): device-to-host copy of its gradient (``alpha + n/beta`` on the cluster's ``host_link``), the
update on the CPU (memory-bound: the bytes it touches over the host's DRAM bandwidth), and the
host-to-device copy of the new weights. The two directions of PCIe and the CPU are separate
resources and two pinned host buffers are cycled (double buffering), so piece i+1 travels while
piece i is updated. Events appear on a ``host`` stream in the trace.

With ``offload="optimizer+params"`` the weight shards live on the host too (ZeRO-Infinity style):
each layer's shard is copied to the device just before its all-gather (prefetched with it), and
the weights updated on the host never need to come back.
"""

from __future__ import annotations

import numpy as np

from minidist.hardware.memory import MemoryLedger
from minidist.hardware.specs import STORAGE


class HostTier:
    """This rank's share of its node's host memory (a ledger) and its PCIe link, both directions."""

    def __init__(self, clock, cluster, rank: int, world: int) -> None:
        on_node = cluster.ranks_on_node(rank, world)  # they share the node's host memory
        self.ledger = MemoryLedger(cluster.host_bytes / on_node, rank)
        self.clock, self.link = clock, cluster.host_link
        self.free = {"d2h": 0.0, "h2d": 0.0, "cpu": 0.0}

    def transfer(self, direction: str, nbytes: float, ready: float, name: str) -> float:
        """Copy ``nbytes`` over PCIe (``"d2h"`` or ``"h2d"``) once ``ready``; returns the arrival time."""
        start = max(ready, self.free[direction])
        end = start + self.link.alpha + nbytes / self.link.beta
        self.free[direction] = end
        self.clock.recorder.record("host", f"{direction}:{name}", start, end, float(nbytes), 0.0)
        return end

    def cpu(self, nbytes: float, ready: float, name: str) -> float:
        """A memory-bound CPU kernel touching ``nbytes`` of host DRAM; returns its end time."""
        start = max(ready, self.free["cpu"])
        end = start + nbytes / STORAGE["cpu_dram_bw"]
        self.free["cpu"] = end
        self.clock.recorder.record("host", f"cpu:{name}", start, end, float(nbytes), 0.0)
        return end


class HostOptimizer:
    """The optimizer step on the host tier, pipelined piece by piece over two pinned buffers."""

    def __init__(self, opt, clock, tier: HostTier, state_bytes: dict, params_on_host: bool = False) -> None:
        self.opt, self.clock, self.tier, self.sb = opt, clock, tier, state_bytes
        self.params_on_host = params_on_host
        self.ledger = tier.ledger

    def setup(self, pieces) -> None:
        n = sum(p.size for p, _ in pieces)
        self.ledger.alloc("optimizer", n * self.sb["optimizer"])
        self.ledger.alloc("buffers", 2 * max(g.nbytes for _, g in pieces))  # the two pinned staging buffers

    def step(self, pieces, skip: frozenset[int] = frozenset()) -> float:
        """Update every piece but ``skip`` (the numbers), and charge the pipelined transfers and CPU work (the time)."""
        self.opt.step(pieces, skip)
        t = self.clock.now()
        moved = 7 if self.opt.kind == "adamw" else 4  # arrays read + written per element
        slot_free = [t, t]  # when each pinned buffer is free again
        end = t
        for i, (p, g) in enumerate(pieces):
            down = self.tier.transfer("d2h", g.nbytes, slot_free[i % 2], f"grad.{i}")
            done = self.tier.cpu(moved * p.nbytes, down, f"{self.opt.kind}.{i}")
            if self.params_on_host:
                slot_free[i % 2] = end = max(end, done)
            else:
                up = self.tier.transfer("h2d", p.nbytes, done, f"param.{i}")
                slot_free[i % 2] = end = max(end, up)
        self.clock.join(end)
        return end - t


class HostParams:
    """Weight shards that live on the host: ``fetch(ui)`` copies one to the device before its gather."""

    def __init__(self, shards: list[np.ndarray], tier: HostTier, clock) -> None:
        self.shards, self.tier, self.clock = shards, tier, clock
        self.tier.ledger.alloc("params", sum(s.nbytes for s in shards))
        self._arrival: dict[int, float] = {}

    def fetch(self, ui: int) -> np.ndarray:
        """Start copying shard ``ui`` to the device; the gather that uses it is queued behind the copy."""
        ready = self.clock.begin_comm()
        arrival = self.tier.transfer("h2d", self.shards[ui].nbytes, ready, f"shard.{ui}")
        self.clock.comm = max(self.clock.comm, arrival)  # the comm stream waits for its input
        self._arrival[ui] = arrival
        return self.shards[ui]

    def wait(self, ui: int) -> None:
        """The program needs shard ``ui`` now (single device: no gather to wait on)."""
        t = self._arrival.pop(ui, None)
        if t is not None:
            self.clock.join(t)
