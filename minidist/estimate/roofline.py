"""The extended roofline (book ch2, ch3a; lab 01).

Property: a kernel cannot run faster than its slowest resource. Time is the max of FLOPs over peak
FLOP/s and bytes over the bandwidth that carries them; the same reasoning with network bytes gives
the "network ceiling" of a distributed step, and with storage bytes the data-loader ceiling.
Units: FLOPs, bytes, seconds, FLOP/s, bytes/s.
"""

from __future__ import annotations

from minidist.estimate._check import nonnegative, positive


def roofline_time(flops: float, bytes: float, peak_flops: float, mem_bw: float) -> float:
    """Seconds for a kernel: max(flops / peak_flops, bytes / mem_bw)."""
    fn = "roofline_time"
    f, b = nonnegative(fn, "flops", flops), nonnegative(fn, "bytes", bytes)
    return max(f / positive(fn, "peak_flops", peak_flops), b / positive(fn, "mem_bw", mem_bw))


def ridge_point(peak_flops: float, bw: float) -> float:
    """Arithmetic intensity (FLOPs/byte) where a kernel turns from bandwidth- to compute-bound: F / bw."""
    return positive("ridge_point", "peak_flops", peak_flops) / positive("ridge_point", "bw", bw)


def arithmetic_intensity(flops: float, bytes: float) -> float:
    """FLOPs per byte moved."""
    return nonnegative("arithmetic_intensity", "flops", flops) / positive("arithmetic_intensity", "bytes", bytes)


def attainable_flops(peak_flops: float, *ceilings: tuple[float, float]) -> float:
    """Extended roofline: min(F, bw_1 * I_1, bw_2 * I_2, ...) for (bandwidth, intensity) pairs, e.g.
    (hbm_bw, I_mem), (network_bw, I_net), (storage_bw, I_io)."""
    fn = "attainable_flops"
    best = positive(fn, "peak_flops", peak_flops)
    for i, (bw, intensity) in enumerate(ceilings):
        best = min(best, positive(fn, f"ceilings[{i}] bandwidth", bw) * nonnegative(fn, f"ceilings[{i}] intensity",
                                                                                      intensity))
    return best


def dp_network_intensity(batch_tokens: float, gpus: int, bytes_per_grad: float = 2) -> float:
    """FLOPs per byte communicated in data parallelism (ch2): (6 Psi B / P) / (2 Psi s) = 3 B / (P s).

    ``batch_tokens`` is the global batch in tokens (the book calls it "batch"), ``s`` bytes per gradient
    element; the factor 2 Psi s is the ring all-reduce volume for large P.
    """
    fn = "dp_network_intensity"
    return 3 * positive(fn, "batch_tokens", batch_tokens) / (positive(fn, "gpus", gpus)
                                                              * positive(fn, "bytes_per_grad", bytes_per_grad))


def dp_compute_comm_ratio(tokens_per_gpu: float, peak_flops: float, beta: float, bytes_per_grad: float = 2) -> float:
    """R = T_compute / T_comm = 3 b beta / (F s) for DP with b tokens per GPU (ch14); R > 1 needs
    b > F s / (3 beta). (The book says "samples"; the FLOP count 6 Psi b makes b tokens.)"""
    fn = "dp_compute_comm_ratio"
    return (3 * nonnegative(fn, "tokens_per_gpu", tokens_per_gpu) * positive(fn, "beta", beta)
            / (positive(fn, "peak_flops", peak_flops) * positive(fn, "bytes_per_grad", bytes_per_grad)))
