"""MFU and HFU of a simulated step, from the FLOPs its trace charged (book ch3, ch32; labs 03, 23).

Property: both divide FLOPs by what the GPUs could have done in the step, ``ranks x step time x peak``; they
differ only in the numerator. Hardware FLOPs utilisation counts every FLOP executed, recomputed forwards
included; model FLOPs utilisation counts only the FLOPs the model needs (the same step without recomputation),
so recomputation raises HFU and lowers MFU, and MFU / HFU is the share of the arithmetic that was not redone.
"""

from __future__ import annotations


def step_flops(result, step: int = -1) -> float:
    """FLOPs every rank charged to its compute stream during one step of an ``md.parallel.train`` result."""
    total = 0.0
    for r, w in enumerate(result.windows):
        lo, hi = w[step]
        total += sum(e.flops for e in result.trace.events
                     if e.rank == r and e.stream == "compute" and lo <= e.start < hi)
    return total


def utilization(result, peak: float, model_flops: float | None = None, step: int = -1) -> dict[str, float]:
    """``hfu`` (executed FLOPs) and, given ``model_flops`` (e.g. ``step_flops`` of the same layout without
    recomputation), ``mfu``, against ``peak`` FLOP/s per rank over the step time (the slowest rank's)."""
    if not peak > 0:
        raise ValueError(f"utilization: peak must be > 0 FLOP/s, got {peak!r}")
    capacity = len(result.windows) * result.time[step] * peak
    out = {"hfu": step_flops(result, step) / capacity}
    if model_flops is not None:
        out["mfu"] = model_flops / capacity
    return out
