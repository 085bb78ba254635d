"""Failures and checkpoint intervals (book ch26, ch34; lab 17).

Property: failures of independent components add their rates, so a cluster's MTBF shrinks as 1/N;
checkpointing every I seconds costs T_ckpt / I of the time and loses I/2 of work per failure on
average, and the sum is smallest at Young/Daly's I* = sqrt(2 T_ckpt MTBF). Units: seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from minidist.estimate._check import count as _count
from minidist.estimate._check import nonnegative, positive


def young_daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Optimal seconds between checkpoints: sqrt(2 T_ckpt MTBF)."""
    return math.sqrt(2 * nonnegative("young_daly_interval", "checkpoint_s", checkpoint_s)
                     * positive("young_daly_interval", "mtbf_s", mtbf_s))


def system_mtbf(component_mtbf_s: float | Sequence[float], count: int | Sequence[int]) -> float:
    """MTBF of a system of independent parts: 1 / sum(n_i / MTBF_i); one kind of part gives MTBF / n."""
    fn = "system_mtbf"
    ms = [component_mtbf_s] if isinstance(component_mtbf_s, (int, float)) else list(component_mtbf_s)
    ns = [count] if isinstance(count, (int, float)) else list(count)
    if len(ms) != len(ns) or not ms:
        raise ValueError(f"{fn}: component_mtbf_s and count must have the same non-zero length, got {len(ms)} and "
                         f"{len(ns)}")
    rate = sum(_count(fn, f"count[{i}]", n) / positive(fn, f"component_mtbf_s[{i}]", m)
               for i, (m, n) in enumerate(zip(ms, ns)))
    return 1 / rate


def checkpoint_overhead(interval_s: float, checkpoint_s: float, mtbf_s: float) -> float:
    """Fraction of time lost: T_ckpt / I (writing) + I / (2 MTBF) (re-doing half an interval per failure)."""
    fn = "checkpoint_overhead"
    return (nonnegative(fn, "checkpoint_s", checkpoint_s) / positive(fn, "interval_s", interval_s)
            + interval_s / (2 * positive(fn, "mtbf_s", mtbf_s)))


def expected_completion_without_checkpoints(work_s: float, mtbf_s: float) -> float:
    """Expected wall time of ``work_s`` seconds of work that restarts from zero on every failure
    (exponential failures, rate 1/MTBF): (e^(T/MTBF) - 1) MTBF."""
    fn = "expected_completion_without_checkpoints"
    T, M = nonnegative(fn, "work_s", work_s), positive(fn, "mtbf_s", mtbf_s)
    return math.expm1(T / M) * M


def failure_overhead(failures_per_day: float, recovery_s: float) -> float:
    """Fraction of each day spent recovering: failures/day x recovery seconds / 86,400."""
    fn = "failure_overhead"
    return nonnegative(fn, "failures_per_day", failures_per_day) * nonnegative(fn, "recovery_s", recovery_s) / 86400


def checkpoint_blocking_time(shard_bytes: float, copy_bw: float, storage_bw: float,
                             asynchronous: bool = False) -> float:
    """Seconds training stalls per checkpoint: copy to host (S / B_copy), plus the write to storage
    (S / B_storage) unless the write is asynchronous (ch26)."""
    fn = "checkpoint_blocking_time"
    s = nonnegative(fn, "shard_bytes", shard_bytes)
    t = s / positive(fn, "copy_bw", copy_bw)
    return t if asynchronous else t + s / positive(fn, "storage_bw", storage_bw)
