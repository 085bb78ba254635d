"""Named clusters for the estimator, built from ``minidist.hardware.specs`` (book ch3, ch6; lab 02).

A :class:`ClusterSpec` is what the closed-form models need: the GPU, how many share a node, the
intra-node link (NVLink/NVSwitch, per GPU per direction) and the network link each GPU has (one
NIC per GPU, rail-optimised), plus a rental price. The simulated ``minidist.hardware`` topology is
a separate, richer object; this one is just the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.hardware.specs import GPU, Link, gpu, link


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu: GPU
    gpus_per_node: int
    intra: Link
    inter: Link
    usd_per_gpu_hour: float
    source: str

    def link_for(self, group_span: int) -> Link:
        """The link a group of consecutive ranks spanning ``group_span`` GPUs runs on."""
        return self.intra if group_span <= self.gpus_per_node else self.inter


def _h800_nvlink() -> Link:
    # The H800's NVLink is cut to 400 GB/s bidirectional: 200 GB/s per direction.
    return Link("NVLink-H800", link("NVLink4").alpha, 200e9)


CLUSTERS: dict[str, ClusterSpec] = {
    "dgx-a100": ClusterSpec("dgx-a100", gpu("A100-80GB-SXM"), 8, link("NVLink3"), link("IB-HDR200"), 2.0,
                            "DGX A100 as in Narayanan et al. 2021 (Selene): 8 A100 80GB per node, NVSwitch, "
                            "8x 200 Gb/s HDR InfiniBand per node; price: book ch5 (A100 on-demand $2-3/h)"),
    "dgx-h100": ClusterSpec("dgx-h100", gpu("H100-80GB-SXM"), 8, link("NVLink4"), link("IB-NDR400"), 4.0,
                            "DGX H100: 8 H100 SXM per node, NVLink4 900 GB/s bidirectional, 8x 400 Gb/s NDR "
                            "InfiniBand; price: the book's usual $4 per GPU-hour"),
    "h800": ClusterSpec("h800", gpu("H800-80GB-SXM"), 8, _h800_nvlink(), link("IB-NDR400"), 2.0,
                        "H800 nodes as in the DeepSeek-V3 report: 8 GPUs, NVLink 400 GB/s bidirectional, "
                        "400 Gb/s InfiniBand per GPU; price: $2 per GPU-hour (DeepSeek-V3 report, book ch35)"),
}


def cluster(name: str) -> ClusterSpec:
    """The named cluster, e.g. ``cluster("dgx-h100")``; ValueError lists the known names."""
    try:
        return CLUSTERS[name]
    except KeyError:
        raise ValueError(f"cluster: unknown name {name!r}; known: {sorted(CLUSTERS)}") from None
