"""Checks for lab 25, the capstone (book chapters 34-37): a training-run design is accepted when its numbers agree
with each other and with the estimator, whatever layout, cluster size or checkpoint policy it chose."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from minidist.estimate import CALIBRATED, Layout, cluster, estimate_layout, model
from minidist.estimate.reliability import checkpoint_overhead, young_daly_interval
from minidist.labs.check import CheckFailed, check_cases, passed


@dataclass
class Design:
    """One training run, end to end. Times in seconds unless named otherwise; money in US dollars."""

    model: str  # a named model of md.estimate
    cluster: str  # a named cluster of md.estimate
    gpus: int
    layout: Layout
    global_batch: int  # sequences per step
    seq_len: int
    tokens: float  # to train on
    step_time: float  # predicted seconds per step
    mfu: float
    checkpoint_seconds: float  # what one checkpoint stalls training
    mtbf_s: float  # of the whole job's hardware
    checkpoint_interval_s: float
    overhead: float  # share of time lost to checkpoints and redone work
    days: float  # wall-clock, overhead included
    usd_per_gpu_hour: float
    cost_usd: float
    budget_usd: float
    deadline_days: float


def check_gpus_for(fn) -> None:
    """``fn(flops, peak, mfu, days)``: GPUs that deliver ``flops`` in ``days`` at ``mfu`` of ``peak`` FLOP/s each."""
    cases = [((f, p, u, d), f / (p * u * d * 86400), "FLOPs / (peak x MFU x seconds in the deadline)")
             for f, p, u, d in ((6.35e24, 989e12, 0.4, 60), (1e21, 312e12, 0.5, 1), (3.8e25, 989e12, 0.38, 54))]

    def diagnose(args, expected, got):
        if math.isclose(got, expected * 86400):
            return "days are 86,400 seconds each"
        if math.isclose(got, expected * 24):
            return "days are 86,400 seconds each, not 3,600"
        if math.isclose(got, expected * args[2] ** 2):
            return "divide by the MFU: the GPUs deliver only that share of their peak"
        if got == math.ceil(expected):
            return "return the exact quotient, not rounded: the next cell rounds it up to whole nodes"
        return None

    check_cases("gpus_for", fn, cases, rel=1e-9, diagnose=diagnose)


_NUMBERS = ("gpus", "global_batch", "seq_len", "tokens", "step_time", "mfu", "checkpoint_seconds", "mtbf_s",
            "checkpoint_interval_s", "overhead", "days", "usd_per_gpu_hour", "cost_usd", "budget_usd", "deadline_days")


def _fields_have_their_types(d) -> None:
    """A design is a Design whose layout is an md.estimate.Layout and whose numbers are numbers: said at once."""
    if not isinstance(d, Design):
        raise CheckFailed(f"design: check_design takes an md.labs.Design, got {type(d).__name__}")
    wrong = [f"layout is {type(d.layout).__name__} {d.layout!r:.40}, not an md.estimate.Layout (the chosen "
             f"Estimate's .layout)"] if not isinstance(d.layout, Layout) else []
    wrong += [f"{f} is {type(getattr(d, f)).__name__} {getattr(d, f)!r:.40}, not a number" for f in _NUMBERS
              if isinstance(getattr(d, f), bool) or not isinstance(getattr(d, f), numbers.Real)]
    if wrong:
        raise CheckFailed("design: fields of the wrong type:\n  - " + "\n  - ".join(wrong))


def _off(got: float, want: float, rel: float) -> bool:
    return not math.isclose(got, want, rel_tol=rel)


# One H100's mean time between failures as Meta's LLaMA 3 405B run saw it: 419 unexpected interruptions in 54 days
# on 16,384 GPUs (Dubey et al. 2024, section 3.3.4), about 50,000 hours.
GPU_MTBF_S = 16_384 * 54 * 86400 / 419
BRIEF_FIELDS = ("model", "cluster", "tokens", "budget_usd", "deadline_days")


def _facts(d: Design, cl, brief: dict | None, gpu_mtbf_s: float) -> list[str]:
    """What ``d`` must take as given (the brief, the cluster's price, the failure rate), not choose."""
    problems = []
    for field in BRIEF_FIELDS if brief else ():
        if field in brief and getattr(d, field) != brief[field]:
            problems.append(f"{field} {getattr(d, field)!r}, but the brief says {brief[field]!r}")
    if _off(d.usd_per_gpu_hour, cl.usd_per_gpu_hour, 1e-6):
        problems.append(f"usd_per_gpu_hour {d.usd_per_gpu_hour:g}, but a GPU-hour of {d.cluster} costs "
                        f"{cl.usd_per_gpu_hour:g} USD (the cluster's price)")
    want_mtbf = gpu_mtbf_s / d.gpus
    if _off(d.mtbf_s, want_mtbf, 0.1):
        hint = " (that is one GPU's MTBF)" if not _off(d.mtbf_s, gpu_mtbf_s, 0.1) else \
            " (that is it in hours; the design's times are in seconds)" if not _off(d.mtbf_s, want_mtbf / 3600, 0.1) \
            else ""
        problems.append(f"mtbf_s {d.mtbf_s:.4g} s{hint}, but {d.gpus:,} GPUs that each fail every "
                        f"{gpu_mtbf_s / 3600:,.0f} h fail {d.gpus:,} times as often as one")
    if d.checkpoint_interval_s <= d.checkpoint_seconds:
        problems.append(f"a checkpoint every {d.checkpoint_interval_s:.3g} s that stalls training "
                        f"{d.checkpoint_seconds:.3g} s leaves no time to train")
    return problems


def check_design(d: Design, brief: dict | None = None, gpu_mtbf_s: float = GPU_MTBF_S) -> None:
    """Every number of ``d`` recomputed from the ones it depends on; all disagreements reported at once.

    What the design takes as given is checked too: the fields of ``brief`` (model, cluster, tokens, budget_usd,
    deadline_days) when it is passed, the cluster's price, and the system MTBF, which is ``gpu_mtbf_s`` (one GPU's,
    by default the one Meta's LLaMA 3 run implies) divided by the number of GPUs.
    """
    _fields_have_their_types(d)
    try:
        mdl, cl = model(d.model), cluster(d.cluster)
    except ValueError as e:
        raise CheckFailed(f"design: {e}") from None
    problems = _facts(d, cl, brief, gpu_mtbf_s)
    lay = d.layout
    if lay.gpus != d.gpus:
        problems.append(f"the layout uses tp x cp x pp x dp = {lay.gpus} GPUs, the design {d.gpus}")
    est = None
    try:
        est = estimate_layout(mdl, cl, lay, d.global_batch, d.seq_len, CALIBRATED)
    except ValueError as e:
        problems.append(f"the estimator cannot price this layout: {e}")
    if est is not None:
        if not est.fits:
            problems.append(f"the layout needs {sum(est.memory.values()) / 1e9:.1f} GB per GPU, more than the "
                            f"{est.hbm_bytes / 1e9:.0f} GB usable: pick a layout the planner says fits")
        if _off(d.step_time, est.step_time, 0.02):
            problems.append(f"step_time {d.step_time:.3g} s, but the estimator predicts {est.step_time:.3g} s for "
                            f"this layout (take it from the plan's Estimate)")
        if _off(d.mfu, est.mfu, 0.02):
            problems.append(f"mfu {d.mfu:.3f}, the estimator says {est.mfu:.3f}")
    steps = d.tokens / (d.global_batch * d.seq_len)
    want_interval = young_daly_interval(d.checkpoint_seconds, d.mtbf_s)
    if _off(d.checkpoint_interval_s, want_interval, 0.05):
        problems.append(f"checkpoint_interval_s {d.checkpoint_interval_s:.4g}, but sqrt(2 C MTBF) with "
                        f"C = {d.checkpoint_seconds:.3g} s and MTBF = {d.mtbf_s:.4g} s is {want_interval:.4g} s")
    want_overhead = checkpoint_overhead(d.checkpoint_interval_s, d.checkpoint_seconds, d.mtbf_s)
    if _off(d.overhead, want_overhead, 0.05):
        problems.append(f"overhead {d.overhead:.4f}, but C / I + I / (2 MTBF) = {want_overhead:.4f}")
    want_days = steps * d.step_time * (1 + d.overhead) / 86400
    # tighter than the overhead (a fraction of a percent at scale), so that days without it are caught
    if _off(d.days, want_days, min(0.01, d.overhead / 4) if d.overhead > 0 else 0.01):
        bare = steps * d.step_time / 86400
        hint = " (that is without the overhead)" if not _off(d.days, bare, 1e-6) else ""
        problems.append(f"days {d.days:.5g}{hint}, but {steps:,.0f} steps of {d.step_time:.3g} s with "
                        f"{d.overhead:.2%} overhead take {want_days:.5g} days")
    want_cost = d.gpus * d.days * 24 * d.usd_per_gpu_hour
    if _off(d.cost_usd, want_cost, 0.02):
        problems.append(f"cost_usd {d.cost_usd:,.0f}, but {d.gpus} GPUs x {d.days:.4g} days x 24 h x "
                        f"${d.usd_per_gpu_hour}/h = {want_cost:,.0f}")
    if d.cost_usd > d.budget_usd:
        problems.append(f"the run costs {d.cost_usd:,.0f} USD, over the budget of {d.budget_usd:,.0f}")
    if d.days > d.deadline_days:
        problems.append(f"the run takes {d.days:.1f} days, past the deadline of {d.deadline_days:g}")
    if problems:
        raise CheckFailed("design: the numbers do not hold together:\n  - " + "\n  - ".join(problems))
    passed(f"design: {d.gpus} GPUs, {lay.label()}, {d.days:.1f} days, {d.cost_usd / 1e6:.2f} M USD, "
           f"checkpoint every {d.checkpoint_interval_s / 60:.1f} min: consistent")
