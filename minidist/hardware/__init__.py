"""Hardware: GPU and link constants, clusters and their topology, simulated clocks, memory ledger, trace."""

from minidist.hardware.specs import GPU, GPUS, LINKS, STORAGE, Link, gpu, link

__all__ = ["GPU", "GPUS", "LINKS", "STORAGE", "Link", "gpu", "link"]
