"""A cluster: which GPU each rank is, which link joins two ranks, and where the host memory sits.

Topology is two-level, like the machines in the book's chapters 3 and 13a: ``gpus_per_node`` ranks
share a node joined by a fast intra-node link (NVLink), and nodes are joined by a slower network
(InfiniBand). Rank ``r`` lives on node ``r // gpus_per_node``. The clock asks ``cluster.link(src, dst)``
for the latency ``alpha`` (s) and bandwidth ``beta`` (bytes/s, one direction) of every message.
Each ordered pair of ranks is its own directed link (a full crossbar inside the node and one NIC
per GPU across nodes, as in a DGX); an algorithm shares a link only when it sends twice to one peer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from minidist.hardware.kernels import ROOFLINE, KernelModel, measured_kernels
from minidist.hardware.specs import GPU, Link, gpu, link


def _as_gpu(g: str | GPU) -> GPU:
    return g if isinstance(g, GPU) else gpu(g)


def _as_link(l: str | Link) -> Link:
    return l if isinstance(l, Link) else link(l)


@dataclass(frozen=True)
class Cluster:
    """GPUs grouped in nodes, with an intra-node link, an inter-node link and a host (CPU) tier.

    ``nodes=None`` means "as many nodes as the launch needs". ``hbm_bytes`` overrides the GPU's
    memory (handy to provoke an out-of-memory in a lab); ``compute_dtype`` (e.g. ``"bf16"``) charges
    every op at that dtype's peak whatever numpy dtype actually runs. ``host_bytes`` is CPU memory
    per node and ``host_link`` the PCIe link each GPU uses to reach it (offloading, chapter 22).
    ``storage_bw`` is the bytes/s a node writes to checkpoint storage, shared by its GPUs (default: one
    NVMe drive's 7 GB/s, the storage tier of the book's memory hierarchy, chapter 22). ``slow_links``
    ({(src, dst): factor}) divides one directed link's bandwidth, to stage a degraded cable (chapter 33).
    ``oversubscription`` k stages a k:1 oversubscribed fabric: the uplinks from the nodes' switches carry 1/k of
    what their NICs can send, so when every GPU sends across nodes at once, as a data-parallel ring does, each
    gets 1/k of its NIC. The model is that worst case, applied to every inter-node message (a lone message on a
    real fabric would not slow down).
    ``kernels`` prices compute: ``"roofline"`` (the ideal device of the closed forms, the default), ``"measured"``
    (the kernels of a real GPU running eager PyTorch, fitted to one H200: ``hardware/kernels.py``; other GPUs
    keep their own peaks and bandwidth and borrow the H200's fractions and fixed costs), or a ``KernelModel``.
    """

    gpu: GPU
    gpus_per_node: int = 8
    intra_link: Link = None  # type: ignore[assignment]
    inter_link: Link = None  # type: ignore[assignment]
    nodes: int | None = None
    hbm_bytes: float | None = None
    compute_dtype: str | None = None
    host_bytes: float = 2e12
    host_link: Link = None  # type: ignore[assignment]
    storage_bw: float = 7e9
    slow_links: tuple = ()  # ((src, dst), factor) pairs: that directed link's bandwidth divided by factor
    oversubscription: float = 1.0  # k:1 between the nodes' switches and the spine: inter-node bandwidth / k
    kernels: object = "roofline"  # "roofline", "measured" or a KernelModel: how an op's time is priced

    def __init__(
        self,
        gpu: str | GPU = "H100-80GB-SXM",
        gpus_per_node: int = 8,
        intra_link: str | Link = "NVLink4",
        inter_link: str | Link = "IB-NDR400",
        nodes: int | None = None,
        hbm_bytes: float | None = None,
        compute_dtype: str | None = None,
        host_bytes: float = 2e12,
        host_link: str | Link = "PCIe5-x16",
        storage_bw: float = 7e9,
        slow_links=(),
        oversubscription: float = 1.0,
        kernels: str | KernelModel = "roofline",
    ) -> None:
        if gpus_per_node < 1:
            raise ValueError(f"Cluster: gpus_per_node must be >= 1, got {gpus_per_node}")
        if nodes is not None and nodes < 1:
            raise ValueError(f"Cluster: nodes must be >= 1 or None, got {nodes}")
        set_ = object.__setattr__
        set_(self, "gpu", _as_gpu(gpu))
        set_(self, "gpus_per_node", int(gpus_per_node))
        set_(self, "intra_link", _as_link(intra_link))
        set_(self, "inter_link", _as_link(inter_link))
        set_(self, "nodes", None if nodes is None else int(nodes))
        set_(self, "hbm_bytes", hbm_bytes)
        set_(self, "compute_dtype", compute_dtype)
        set_(self, "host_bytes", float(host_bytes))
        set_(self, "host_link", _as_link(host_link))
        if not storage_bw > 0:
            raise ValueError(f"Cluster: storage_bw must be > 0 bytes/s, got {storage_bw!r}")
        set_(self, "storage_bw", float(storage_bw))
        pairs = tuple(sorted(dict(slow_links).items())) if slow_links else ()
        for pair, factor in pairs:
            if not (len(pair) == 2 and all(isinstance(r, int) and r >= 0 for r in pair) and pair[0] != pair[1]
                    and factor >= 1):
                raise ValueError(f"Cluster: slow_links maps (src, dst) rank pairs to a factor >= 1, got "
                                 f"{pair!r}: {factor!r}")
        set_(self, "slow_links", pairs)
        if not (isinstance(oversubscription, (int, float)) and oversubscription >= 1):
            raise ValueError(f"Cluster: oversubscription must be a number >= 1 (k for a k:1 fabric), got "
                             f"{oversubscription!r}")
        set_(self, "oversubscription", float(oversubscription))
        if not (kernels in ("roofline", "measured") or isinstance(kernels, KernelModel)):
            raise ValueError(f"Cluster: kernels must be 'roofline' (the ideal device), 'measured' (a real GPU's "
                             f"kernels, fitted to an H200) or an md.hardware.KernelModel, got {kernels!r}")
        set_(self, "kernels", kernels)

    @property
    def kernel_model(self) -> KernelModel:
        """The ``KernelModel`` that prices this cluster's compute."""
        if isinstance(self.kernels, KernelModel):
            return self.kernels
        return ROOFLINE if self.kernels == "roofline" else measured_kernels()

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def dgx_h100(cls, nodes: int | None = None, **kw) -> Cluster:
        """DGX H100: 8 x H100-SXM per node, NVLink4 inside, one IB NDR400 NIC per GPU across nodes."""
        return cls("H100-80GB-SXM", 8, "NVLink4", "IB-NDR400", nodes=nodes, **kw)

    @classmethod
    def dgx_a100(cls, nodes: int | None = None, **kw) -> Cluster:
        """DGX A100: 8 x A100-SXM per node, NVLink3 inside, one IB HDR200 NIC per GPU across nodes."""
        kw.setdefault("host_bytes", 1e12)
        kw.setdefault("host_link", "PCIe4-x16")
        return cls("A100-80GB-SXM", 8, "NVLink3", "IB-HDR200", nodes=nodes, **kw)

    @classmethod
    def uniform(
        cls, alpha: float = 1e-5, beta: float = 1e9, gpus_per_node: int = 1 << 30, gpu: str | GPU = "H100-80GB-SXM",
        **kw,
    ) -> Cluster:
        """Every pair of ranks joined by the same link (alpha s, beta bytes/s): the closed forms' world."""
        l = Link(f"uniform(alpha={alpha:g}, beta={beta:g})", float(alpha), float(beta))
        return cls(gpu, gpus_per_node, l, l, **kw)

    # -- topology --------------------------------------------------------------------------
    @property
    def hbm(self) -> float:
        """Simulated HBM capacity per rank, bytes."""
        return float(self.gpu.hbm_bytes if self.hbm_bytes is None else self.hbm_bytes)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def ranks_on_node(self, rank: int, world: int) -> int:
        """How many of ``world`` ranks share ``rank``'s node (the last node may be partly filled)."""
        return min(self.gpus_per_node, world - self.node_of(rank) * self.gpus_per_node)

    def same_node(self, a: int, b: int) -> bool:
        return a // self.gpus_per_node == b // self.gpus_per_node

    def link(self, src: int, dst: int) -> Link:
        """The link a message from global rank ``src`` to global rank ``dst`` travels on."""
        if src == dst:
            raise ValueError(f"Cluster.link: rank {src} has no link to itself")
        base = self.intra_link if self.same_node(src, dst) else self.inter_link
        if self.oversubscription > 1 and base is self.inter_link:  # every NIC's share when all send at once
            base = Link(f"{base.name} ({self.oversubscription:g}:1 oversubscribed)", base.alpha,
                        base.beta / self.oversubscription)
        for pair, factor in self.slow_links:  # a degraded cable or port (chapter 33's investigations)
            if pair == (src, dst):
                return Link(f"{base.name} (slowed {factor:g}x)", base.alpha, base.beta / factor)
        return base

    def capacity(self) -> int | None:
        """Ranks this cluster can hold (None when the node count is left open)."""
        return None if self.nodes is None else self.nodes * self.gpus_per_node

    def for_world(self, world_size: int) -> Cluster:
        """This cluster sized for ``world_size`` ranks (fills in ``nodes``; checks it fits)."""
        need = math.ceil(world_size / self.gpus_per_node)
        if self.nodes is None:
            return replace(self, nodes=need)
        if world_size > self.nodes * self.gpus_per_node:
            raise ValueError(
                f"launch: world_size={world_size} does not fit the cluster "
                f"({self.nodes} nodes x {self.gpus_per_node} GPUs = {self.nodes * self.gpus_per_node})"
            )
        return self

    def __repr__(self) -> str:
        nodes = "?" if self.nodes is None else self.nodes
        kernels = "" if self.kernels == "roofline" else f", kernels={getattr(self.kernels, 'name', self.kernels)!r}"
        return (
            f"Cluster({nodes} x {self.gpus_per_node} {self.gpu.name}{kernels}, intra={self.intra_link.name} "
            f"(alpha={self.intra_link.alpha:g} s, beta={self.intra_link.beta:g} B/s), inter={self.inter_link.name} "
            f"(alpha={self.inter_link.alpha:g} s, beta={self.inter_link.beta:g} B/s))"
        )
