"""Checks for lab 22, overlap and architecture-aware efficiency (book chapters 30-31a): the time of a ring
decomposed under its matmuls, against the simulated clock's rule."""

from __future__ import annotations

import math
from collections.abc import Callable

from minidist.labs.check import check_cases


def check_collective_matmul_time(fn: Callable[[int, float, float], float]) -> None:
    """``fn(t, matmul, message)``: seconds of an all-gather-matmul cut into ``t`` ring steps, where one shard's
    product takes ``matmul`` and one shard's message ``message``."""
    cases = [((t, mm, msg), (t - 1) * max(mm, msg) + mm,
              "each of the first t-1 steps lasts as long as the longer of its matmul and its message; the last "
              "step only multiplies")
             for t, mm, msg in ((2, 3.0, 5.0), (4, 3.0, 5.0), (4, 5.0, 3.0), (8, 1.0, 1.0), (1, 2.0, 9.0))]

    def diagnose(args, expected, got):
        t, mm, msg = args
        if math.isclose(got, (t - 1) * msg + t * mm):
            return "that is the time without overlap: each step's message and matmul run one after the other"
        if math.isclose(got, t * max(mm, msg)):
            return "the last shard arrives with step t-1: no message is left to hide under the last matmul"
        if math.isclose(got, (t - 1) * (mm + msg) / 2 + mm) or math.isclose(got, max((t - 1) * msg, t * mm)):
            return ("the steps are chained: step s+1 can start only when both its shard has arrived and the "
                    "previous matmul is done")
        return None

    check_cases("collective_matmul_time", fn, cases, rel=1e-12, diagnose=diagnose)
