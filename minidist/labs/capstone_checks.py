"""Checks for lab 25, the capstone (book chapters 34-37): a training run the learner designs, graded against the
brief's constraints (GPUs available, memory, deadline, budget), whatever layout it chose.

The step the design rests on is simulated here again, at full scale and shape-only, one rank per pipeline stage
(``md.parallel.train(backend=Backend("inprocess", shape_only=True, representatives=True))``): the check trusts
no number it can measure. The brief is judged on the ideal device (``Cluster(kernels="roofline")``), the one its
deadline and budget were set for: every op at the roofline, every message, bubble and byte of the layout simulated. The
measured device prices the unfused eager kernels of one H200 (attention written out, products at 0.78 of peak);
there even a step with no message and no bubble stays below the MFU the budget needs (about 31%), so a design
costed on it is told which device grades it. Each layout is simulated once per process (``_simulated`` caches
by layout, per device), so a notebook or a test that grades several designs of one layout pays for one simulation.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from minidist.estimate import cluster, model
from minidist.hardware.cluster import Cluster
from minidist.labs.check import CheckFailed, attempt, fail, numbers_of, passed
from minidist.parallel import Backend, ParallelConfig, Precision, train
from minidist.parallel.at_scale import gpt_config

# One H100's mean time between interruptions as Meta's LLaMA 3 405B run saw it: 419 unexpected interruptions in
# 54 days on 16,384 GPUs (Dubey et al. 2024, section 3.3.4), about 50,000 hours.
GPU_MTBF_S = 16_384 * 54 * 86400 / 419
BRIEF_KEYS = ("model", "tokens", "global_batch", "cluster", "gpus_available", "gpu_mtbf_s", "restart_s",
              "state_bytes_per_param", "deadline_days", "budget_usd")


@dataclass
class Design:
    """One training run, end to end: the layout chosen (its GPU count is ``layout.world_size``), why, and what
    follows from it. Times in seconds unless named otherwise, memory in bytes, money in US dollars."""

    layout: ParallelConfig
    why: str  # a sentence or two: what the layout buys
    step_time: float  # simulated seconds per step, full scale
    peak_memory: float  # bytes on the fullest rank of that simulated step
    mfu: float  # a fraction
    checkpoint_seconds: float  # what one checkpoint stalls training
    checkpoint_interval_s: float
    overhead: float  # time lost to checkpoints, failures and restarts, per second of training
    days: float  # wall-clock, overhead included
    cost_usd: float


# --- references (the check's own answers) -------------------------------------------------------------------


def _mfu(step_s: float, params: float, tokens_per_step: float, gpus: int, peak: float) -> float:
    return 6 * params * tokens_per_step / (step_s * gpus * peak)


def _checkpoint(state_bytes, gpus, gpus_per_node, host_bw, storage_bw, gpu_mtbf_s, restart_s):
    shard = state_bytes / gpus
    stall = shard / host_bw + gpus_per_node * shard / storage_bw  # the node's GPUs share its drive
    mtbf = gpu_mtbf_s / gpus
    interval = math.sqrt(2 * stall * mtbf)
    return stall, interval, stall / interval + (interval / 2 + restart_s) / mtbf


def _days_and_cost(step_s, tokens, tokens_per_step, overhead, gpus, usd_per_gpu_hour):
    seconds = tokens / tokens_per_step * step_s * (1 + overhead)
    return seconds / 86400, gpus * seconds / 3600 * usd_per_gpu_hour


# --- the exercises ------------------------------------------------------------------------------------------


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def check_mfu_of(fn) -> None:
    """``fn(step_seconds, params, tokens_per_step, gpus, peak)``: the model FLOPs utilisation of a step."""
    rng = np.random.default_rng(25)
    n = 0
    for _ in range(4):
        args = (float(rng.uniform(0.2, 8)), float(rng.uniform(1e9, 4e11)), float(2 ** rng.integers(20, 25)),
                int(8 * 2 ** rng.integers(4, 11)), float(rng.choice([312e12, 989.4e12, 1978.9e12])))
        want = _mfu(*args)
        got = attempt("mfu_of", fn, *args)
        got = numbers_of(f"mfu_of{args}", (got,), ("mfu",))[0]
        if _close(got, want):
            n += 1
            continue
        hint = "the MFU counts the FLOPs the model needs per step, over what all the GPUs could do in that time"
        if _close(got, 100 * want):
            hint = "a fraction, not a percentage"
        elif _close(got, want / 3):
            hint = "training a token takes the backward pass as well as the forward one, twice the forward's work"
        elif _close(got, want / 6 * 2) or _close(got, want / 6):
            hint = "count every multiply and every add of every pass, forward and backward"
        elif _close(got, want * args[3]):
            hint = "the step ran on all the GPUs: each one's peak counts"
        fail(f"mfu_of{args} is wrong", want, got, hint)
    passed(f"mfu_of: {n} cases")


_CKPT_NAMES = ("stall_s", "interval_s", "overhead")


def check_checkpoint_plan(fn) -> None:
    """``fn(state_bytes, gpus, gpus_per_node, host_bw, storage_bw, gpu_mtbf_s, restart_s)`` ->
    ``(stall_s, interval_s, overhead)``: every GPU writes its share of the state, through its host link to its
    node's drive (shared by the node's GPUs); the job fails when any GPU does; the interval minimises the time
    lost; the overhead counts the stalls, the work redone and the restarts."""
    rng = np.random.default_rng(2526)
    n = 0
    for _ in range(5):
        args = (float(rng.uniform(1e10, 1e13)), int(8 * 2 ** rng.integers(3, 11)), int(rng.choice([4, 8])),
                float(rng.choice([16e9, 32e9, 64e9])), float(rng.uniform(2e9, 2e10)),
                float(rng.uniform(0.5, 2) * GPU_MTBF_S), float(rng.uniform(60, 3600)))
        want = _checkpoint(*args)
        got = numbers_of(f"checkpoint_plan{args}", attempt("checkpoint_plan", fn, *args), _CKPT_NAMES)
        # the interval and overhead to 2%: here C/M is about 1e-5, where lab 17's exact optimum and Young's
        # first-order one differ by well under 1%, so either derivation passes
        bad = [i for i in range(3) if not _close(got[i], want[i], 1e-6 if i == 0 else 0.02)]
        if not bad:
            n += 1
            continue
        state, gpus, per_node, host_bw, storage_bw, gpu_mtbf, restart = args
        shard = state / gpus
        i = bad[0]
        hint = {0: "the stall: each GPU's share of the state crosses its host link, then its node's drive",
                1: "the interval that makes the time lost smallest, for this stall and this job's MTBF",
                2: "the overhead: what the stalls cost, plus what each failure costs, per second of training"}[i]
        if i == 0 and _close(got[0], shard / host_bw + shard / storage_bw):
            hint = "a node's GPUs share one drive: it writes all of their shares"
        elif i == 0 and _close(got[0], state / host_bw + per_node * state / storage_bw):
            hint = "every GPU writes only its share of the state"
        elif i == 1 and any(_close(got[1], math.sqrt(2 * want[0] * m)) for m in (gpu_mtbf, gpu_mtbf * gpus)):
            hint = "the job stops when any one of its GPUs fails: its MTBF is not one GPU's"
        elif i == 1 and _close(got[1], math.sqrt(want[0] * gpu_mtbf / gpus)):
            hint = "not quite the minimum: write the time lost per second as a function of the interval and " \
                   "set its derivative to zero"
        elif i == 2 and _close(got[2], want[2] - restart * gpus / gpu_mtbf):
            hint = "each failure also costs the restart (rescheduling, reloading the checkpoint)"
        elif i == 2 and _close(got[2], want[2] - want[0] / want[1]):
            hint = "the stalls themselves cost time: one per interval"
        fail(f"checkpoint_plan{args}: {_CKPT_NAMES[i]} is wrong", want[i], got[i], hint)
    passed(f"checkpoint_plan: {n} cases")


# a whole number of steps (at least 6,000 in these cases) is as good an answer as the exact quotient; an overhead
# left out (0.5% or more) is not
_STEPS_TOL = 1e-3


def check_days_and_cost(fn) -> None:
    """``fn(step_seconds, tokens, tokens_per_step, overhead, gpus, usd_per_gpu_hour)`` -> ``(days, usd)``."""
    rng = np.random.default_rng(2527)
    n = 0
    for _ in range(4):
        args = (float(rng.uniform(0.2, 10)), float(rng.uniform(1e11, 3e13)), float(2 ** rng.integers(19, 25)),
                float(rng.uniform(0.005, 0.2)), int(8 * 2 ** rng.integers(3, 12)), float(rng.choice([2.0, 2.5, 4.0])))
        want = _days_and_cost(*args)
        got = numbers_of(f"days_and_cost{args}", attempt("days_and_cost", fn, *args), ("days", "usd"))
        if all(math.isclose(g, w, rel_tol=_STEPS_TOL) for g, w in zip(got, want)):
            n += 1
            continue
        step, tokens, per_step, overhead, gpus, price = args
        bare = _days_and_cost(step, tokens, per_step, 0.0, gpus, price)
        i = 0 if not math.isclose(got[0], want[0], rel_tol=_STEPS_TOL) else 1
        hint = "days: how many steps, each how long, with the time lost to failures on top" if i == 0 else \
            "the bill: every GPU of the job is paid for every hour of the run"
        if math.isclose(got[i], bare[i], rel_tol=_STEPS_TOL):
            hint = "the run also loses time to checkpoints, failures and restarts (the overhead)"
        elif i == 0 and math.isclose(got[0], want[0] * 24, rel_tol=_STEPS_TOL):
            hint = "days, not hours"
        elif i == 1 and math.isclose(got[1], want[1] / gpus, rel_tol=_STEPS_TOL):
            hint = "the price is per GPU-hour: the job pays for all its GPUs"
        elif i == 1 and math.isclose(got[1], want[1] / 24, rel_tol=_STEPS_TOL):
            hint = "the price is per hour, and a day has 24 of them"
        fail(f"days_and_cost{args}: {('days', 'usd')[i]} is wrong", want[i], got[i], hint)
    passed(f"days_and_cost: {n} cases")


def _busy_by_op(run, rank: int = 0) -> dict:
    """Seconds of ``rank``'s compute stream in the run's last step, by op (a backward counted with its forward)."""
    lo, hi = run.windows[rank][-1]
    out: dict = {}
    for e in run.trace.filter(rank=rank, stream="compute"):
        if e.end > lo and e.start < hi:
            op = e.name.split(".")[0]
            out[op] = out.get(op, 0.0) + min(e.end, hi) - max(e.start, lo)
    return out


def check_busy_by_op(fn) -> None:
    """``fn(run, rank)`` -> ``{op: seconds}``: the busy time of ``rank``'s compute stream in ``run``'s last step,
    by op, an op's backward (``"matmul.backward"``) counted with the op (``"matmul"``). Graded on shape-only runs
    of its own, on both devices, with more than one step and more than one pipeline stage."""
    from minidist.nn import GPTConfig

    cfg = GPTConfig(vocab_size=96, seq_len=32, d_model=48, n_layers=4, n_heads=4, n_kv_heads=2, mlp="swiglu",
                    norm="rmsnorm", bias=False, d_ff=96)
    n = 0
    for kernels, pc, steps, rank in (("roofline", ParallelConfig(dp=2, tp=2), 2, 1),
                                     ("measured", ParallelConfig(pp=2, dp=2, microbatches=2), 2, 2),
                                     ("measured", ParallelConfig(tp=2, recompute="full"), 1, 0)):
        run = train(cfg, pc, steps=steps, global_batch=8, cluster=Cluster(kernels=kernels),
                    backend=Backend("inprocess", shape_only=True))
        want = _busy_by_op(run, rank)
        got = attempt("busy_by_op", fn, run, rank)
        case = f"busy_by_op(a run of {pc.world_size} ranks on the {kernels} device, {steps} step(s), rank {rank})"
        if not isinstance(got, dict):
            raise CheckFailed(f"{case}: return a dict {{op: seconds}}, got {type(got).__name__}")
        names = [k for k in got if isinstance(k, str) and "." in k]
        if names:
            fail(f"{case}: op names", sorted(want), sorted(got),
                 f"{names[0]!r} is part of an op: count a backward with its forward (the name before the '.')")
        if set(got) != set(want):
            fail(f"{case}: the ops", sorted(want), sorted(got), "every op the rank's compute stream ran in the step")
        bad = [k for k in want if not math.isclose(float(got[k]), want[k], rel_tol=1e-9, abs_tol=1e-15)]
        if bad:
            k = bad[0]
            total = sum(e.end - e.start for e in run.trace.filter(rank=rank, stream="compute")
                        if e.name.split(".")[0] == k)
            hint = "the seconds of the op's events on this rank's compute stream, within the last step's window"
            if math.isclose(float(got[k]), total, rel_tol=1e-9) and steps > 1:
                hint = "only the last step: run.windows[rank][-1] is its (start, end)"
            fail(f"{case}: {k}", want[k], got[k], hint)
        n += 1
    passed(f"busy_by_op: {n} runs, both devices")


# --- the design -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    step_time: float
    peaks: tuple  # bytes, one per rank
    num_params: int


def _hardware(cluster_name: str, hbm_bytes: float | None = None, kernels: str = "roofline") -> Cluster:
    """The simulator's cluster for a cluster of md.estimate: the same GPU, node size and links; the ideal device
    unless ``kernels="measured"``."""
    spec = cluster(cluster_name)
    return Cluster(spec.gpu, spec.gpus_per_node, spec.intra, spec.inter, hbm_bytes=hbm_bytes, kernels=kernels)


def _simulate(model_name: str, cluster_name: str, pc: ParallelConfig, global_batch: int,
              kernels: str = "roofline") -> _Step:
    roomy = _hardware(cluster_name, 1e15, kernels)  # a layout that does not fit still runs, so its peak is named
    res = train(gpt_config(model(model_name)), pc, steps=1, global_batch=global_batch, cluster=roomy,
                dtype="float16", precision=Precision("bf16"),
                backend=Backend("inprocess", shape_only=True, representatives=True, timeout=300))
    return _Step(float(res.time[0]), tuple(float(p) for p in res.peak_memory), int(res.num_params))


_simulate_cached = functools.lru_cache(maxsize=64)(_simulate)


def _simulated(model_name: str, cluster_name: str, pc: ParallelConfig, global_batch: int,
               kernels: str = "roofline") -> _Step:
    """One full-scale shape-only step of ``pc`` on a cluster with room for any layout (cached by layout), on the
    ideal device unless ``kernels="measured"``."""
    try:
        hash(pc)
    except TypeError:  # a field that cannot be hashed (a compressor holding a list, say): simulated every time
        return _simulate(model_name, cluster_name, pc, global_batch, kernels)
    return _simulate_cached(model_name, cluster_name, pc, global_batch, kernels)


def _brief_of(brief) -> dict:
    if not isinstance(brief, dict) or any(k not in brief for k in BRIEF_KEYS):
        missing = [k for k in BRIEF_KEYS if not isinstance(brief, dict) or k not in brief]
        raise CheckFailed(f"design: check_design(design, brief) takes the lab's BRIEF; missing {missing}")
    return brief


def _fields_have_their_types(d) -> None:
    """A design is a Design whose layout is a ParallelConfig and whose numbers are numbers: said at once."""
    if not isinstance(d, Design):
        raise CheckFailed(f"design: check_design takes an md.labs.Design, got {type(d).__name__}")
    wrong = [] if isinstance(d.layout, ParallelConfig) else \
        [f"layout is {type(d.layout).__name__} {d.layout!r:.40}, not an md.parallel.ParallelConfig"]
    if not isinstance(d.why, str) or len(d.why.split()) < 5:
        wrong.append(f"why is {d.why!r:.40}: say in a sentence or two what the layout buys")
    for f in ("step_time", "peak_memory", "mfu", "checkpoint_seconds", "checkpoint_interval_s", "overhead", "days",
              "cost_usd"):
        v = getattr(d, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            wrong.append(f"{f} is {type(v).__name__} {v!r:.40}, not a finite number")
    if wrong:
        raise CheckFailed("design: fields of the wrong type:\n  - " + "\n  - ".join(wrong))


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def check_design(d: Design, brief: dict) -> None:
    """Grade design ``d`` against ``brief``: first the constraints, each named (GPUs available, memory, deadline,
    budget), from the check's own simulation of the layout and its own cost model; then every number of ``d``
    that disagrees with them. Any layout that keeps within the brief passes."""
    _fields_have_their_types(d)
    b = _brief_of(brief)
    pc, spec = d.layout, cluster(b["cluster"])
    gpus = pc.world_size
    try:
        step = _simulated(b["model"], b["cluster"], pc, b["global_batch"])
    except (ValueError, TypeError, RuntimeError) as e:  # refused up front, or a rank failed (RankError)
        raise CheckFailed(f"design: the layout cannot run: {str(e)[:600]}") from None
    hw = _hardware(b["cluster"])
    hbm, peak = hw.hbm, hw.gpu.peak("bf16")
    tokens_per_step = b["global_batch"] * gpt_config(model(b["model"])).seq_len
    mfu = _mfu(step.step_time, step.num_params, tokens_per_step, gpus, peak)
    ckpt = _checkpoint(b["state_bytes_per_param"] * step.num_params, gpus, spec.gpus_per_node,
                       hw.host_link.beta, hw.storage_bw, b["gpu_mtbf_s"], b["restart_s"])
    days, cost = _days_and_cost(step.step_time, b["tokens"], tokens_per_step, ckpt[2], gpus, spec.usd_per_gpu_hour)
    fullest = int(np.argmax(step.peaks))

    broken = []
    if gpus > b["gpus_available"]:
        broken.append(f"too many GPUs: {gpus:,} > {b['gpus_available']:,} available")
    if step.peaks[fullest] > hbm:
        broken.append(f"out of memory: rank {fullest} peaks at {_gb(step.peaks[fullest])} > {hbm / 1e9:.0f} GB")
    if days > b["deadline_days"]:
        broken.append(f"past the deadline: {days:.1f} days > {b['deadline_days']:g} days")
    if cost > b["budget_usd"]:
        broken.append(f"over budget: {cost / 1e6:.2f} M USD > {b['budget_usd'] / 1e6:g} M USD")

    off = []
    checks = (("step_time", step.step_time, "seconds: the simulated step of this layout (its time[0])"),
              ("peak_memory", step.peaks[fullest], f"bytes: rank {fullest}'s peak, the fullest"),
              ("mfu", mfu, "from the simulated step"),
              ("checkpoint_seconds", ckpt[0], "your checkpoint_plan's stall for this job"),
              ("checkpoint_interval_s", ckpt[1], "your checkpoint_plan's interval for this job"),
              ("overhead", ckpt[2], "your checkpoint_plan's overhead for this job"),
              ("days", days, "your days_and_cost for this step and overhead"),
              ("cost_usd", cost, "your days_and_cost for this step and overhead"))
    for name, want, what in checks:
        got = float(getattr(d, name))
        if not math.isclose(got, want, rel_tol=1e-4):
            off.append(f"{name} {got:.4g}, but it is {want:.4g} ({what})")

    if off and not math.isclose(float(d.step_time), step.step_time, rel_tol=1e-4):
        try:  # a step from the measured device: say which device the brief is judged on
            measured = _simulated(b["model"], b["cluster"], pc, b["global_batch"], "measured").step_time
        except (ValueError, TypeError, RuntimeError):
            measured = math.nan
        if math.isclose(float(d.step_time), measured, rel_tol=1e-4):
            off.append("your step is the measured device's: the brief is judged on the ideal device "
                       "(md.Cluster(...) with the default kernels=\"roofline\"), the one its limits were set for")
    if broken or off:
        parts = ["design: " + ("the plan breaks the brief" if broken else "the plan keeps to the brief, but")]
        parts += [f"  - {p}" for p in broken]
        if off:
            parts.append("  and its numbers disagree with the layout's simulated step:" if broken else
                         "  its numbers disagree with the layout's simulated step:")
            parts += [f"  - {p}" for p in off]
        raise CheckFailed("\n".join(parts))
    passed(f"design: {gpus:,} GPUs, rank {fullest} peaks at {_gb(step.peaks[fullest])} of {hbm / 1e9:.0f}, "
           f"MFU {mfu:.1%}, {days:.1f} days of {b['deadline_days']:g}, {cost / 1e6:.2f} M USD of "
           f"{b['budget_usd'] / 1e6:g}: accepted")
