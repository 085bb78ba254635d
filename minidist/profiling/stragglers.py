"""Stragglers by robust z-score: the rank whose step is far from the others' (book ch33, lab 23).

Property: with p - 1 healthy ranks and one slow one, the mean and standard deviation are dragged by the
straggler itself (with 8 ranks no plain z-score can exceed (p - 1) / sqrt(p) = 2.5), but the median and the
median absolute deviation are not; z = (x - median) / (1.4826 MAD) puts a normal sample's spread at 1.
"""

from __future__ import annotations

import numpy as np


def robust_z(values) -> np.ndarray:
    """(x - median) / (1.4826 x MAD), with the MAD floored at 1e-9 of the median (identical healthy ranks)."""
    x = np.asarray(values, dtype=float)
    med = np.median(x)
    mad = 1.4826 * np.median(np.abs(x - med))
    return (x - med) / max(mad, 1e-9 * abs(med), 1e-300)


def stragglers(per_rank_seconds, threshold: float = 3.5) -> list[int]:
    """Ranks whose time has a robust z-score above ``threshold`` (Iglewicz and Hoaglin's 3.5)."""
    return [int(r) for r in np.flatnonzero(robust_z(per_rank_seconds) > threshold)]


def compute_time_per_rank(result, step: int = -1) -> list[float]:
    """Each rank's busy compute time in one step of an ``md.parallel.train`` result (what a slow GPU stretches;
    the step time itself is the same on every rank once they synchronise)."""
    return result.trace.busy_within([w[step] for w in result.windows])
