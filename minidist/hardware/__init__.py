"""Hardware: GPU and link constants, clusters and their topology, simulated clocks, memory ledger, trace."""

from minidist.hardware.clock import Clock
from minidist.hardware.cluster import Cluster
from minidist.hardware.kernels import (
    ROOFLINE,
    KernelModel,
    Measurement,
    fit_kernels,
    load_measurements,
    measured_kernels,
)
from minidist.hardware.memory import CATEGORIES, MemoryLedger, OutOfMemoryError
from minidist.hardware.specs import GPU, GPUS, LINKS, STORAGE, Link, gpu, link
from minidist.hardware.trace import Event, Trace

__all__ = [
    "CATEGORIES", "GPU", "GPUS", "LINKS", "STORAGE", "Clock", "Cluster", "Event", "Link", "MemoryLedger",
    "OutOfMemoryError", "Trace", "gpu", "link", "ROOFLINE", "KernelModel", "Measurement", "fit_kernels",
    "load_measurements", "measured_kernels",
]
