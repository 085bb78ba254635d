"""The cost of a run (book ch5-6; lab 03).

Property: GPU time dominates cost, and GPU time is FLOPs divided by the FLOP/s you actually sustain:
GPU-hours = 6 Psi D / (F MFU 3600). Units: FLOPs, FLOP/s, hours, US dollars.
"""

from __future__ import annotations

from minidist.estimate._check import fraction, nonnegative, positive


def gpu_hours(flops: float, peak_flops: float, mfu: float) -> float:
    """GPU-hours to execute ``flops`` model FLOPs at ``mfu`` of ``peak_flops`` per GPU."""
    fn = "gpu_hours"
    return nonnegative(fn, "flops", flops) / (positive(fn, "peak_flops", peak_flops)
                                              * fraction(fn, "mfu", mfu, open_low=True) * 3600)


def training_cost(flops: float, peak_flops: float, mfu: float, usd_per_gpu_hour: float) -> float:
    """Dollars of GPU time: GPU-hours x rate (network, storage and people come on top, ch5)."""
    return gpu_hours(flops, peak_flops, mfu) * nonnegative("training_cost", "usd_per_gpu_hour", usd_per_gpu_hour)


def gpus_for_budget(budget_usd: float, usd_per_gpu_hour: float, hours: float) -> float:
    """How many GPUs a budget rents for ``hours``: budget / rate / hours (round down to a layout)."""
    fn = "gpus_for_budget"
    return nonnegative(fn, "budget_usd", budget_usd) / (positive(fn, "usd_per_gpu_hour", usd_per_gpu_hour)
                                                        * positive(fn, "hours", hours))


def required_mfu(flops: float, seconds: float, gpus: int, peak_flops: float) -> float:
    """MFU needed to execute ``flops`` in ``seconds`` on ``gpus``: C / (T P F)."""
    fn = "required_mfu"
    return nonnegative(fn, "flops", flops) / (positive(fn, "seconds", seconds) * positive(fn, "gpus", gpus)
                                              * positive(fn, "peak_flops", peak_flops))


def spot_effective_rate(spot_rate: float, preempt_probability: float, lost_fraction: float) -> float:
    """Effective spot price per useful hour: C_spot / (1 - p_preempt f_lost) (ch5)."""
    fn = "spot_effective_rate"
    loss = fraction(fn, "preempt_probability", preempt_probability) * fraction(fn, "lost_fraction", lost_fraction)
    if loss >= 1:
        raise ValueError(f"{fn}: preempt_probability * lost_fraction must be < 1")
    return nonnegative(fn, "spot_rate", spot_rate) / (1 - loss)


def break_even_hours(tco_usd: float, usd_per_gpu_hour: float) -> float:
    """GPU-hours of renting that cost as much as owning one GPU: TCO / rate."""
    return nonnegative("break_even_hours", "tco_usd", tco_usd) / positive("break_even_hours", "usd_per_gpu_hour",
                                                                          usd_per_gpu_hour)


def cost_per_token(usd_per_gpu_hour: float, gpus: int, tokens_per_s: float) -> float:
    """Dollars per trained token: P rate / (3600 tokens/s)."""
    fn = "cost_per_token"
    return (nonnegative(fn, "usd_per_gpu_hour", usd_per_gpu_hour) * positive(fn, "gpus", gpus)
            / (3600 * positive(fn, "tokens_per_s", tokens_per_s)))
