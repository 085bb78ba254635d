"""Checks for lab 22, overlap and architecture-aware efficiency (book chapters 31 and 31a): the time of a ring
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


def check_kv_numbers_per_token(fn: Callable[[int, int, int, int | None], int]) -> None:
    """``fn(n_heads, n_kv_heads, head_dim, kv_latent)``: numbers one layer caches per token: keys and values of
    the key-value heads, or the latent alone when ``kv_latent`` is not None."""
    cases = [((h, g, d, c), (c if c is not None else 2 * g * d),
              "a key and a value per key-value head; latent attention keeps only its latent")
             for h, g, d, c in ((8, 8, 16, None), (8, 2, 16, None), (8, 1, 16, None), (8, 8, 16, 24),
                                (32, 8, 128, None))]

    def diagnose(args, expected, got):
        h, g, d, c = args
        if c is None and math.isclose(got, 2 * h * d):
            return "grouped-query heads share keys and values: count n_kv_heads, not n_heads"
        if c is None and math.isclose(got, g * d):
            return "both the key and the value are cached"
        if c is not None and math.isclose(got, 2 * g * d):
            return "with a latent, the keys and values are rebuilt from it: only the latent is cached"
        return None

    check_cases("kv_numbers_per_token", fn, cases, rel=0, diagnose=diagnose)


def check_dualpipev_bubble(fn: Callable[[int, int], float]) -> None:
    """``fn(p, m)``: the idle share of DualPipeV's span with equal F, I and W costs."""
    cases = [((p, m), (p - 1) / (6 * m + p - 1), "each rank does 3 m stage-times of work (F, I, W per micro-batch) and "
              "idles (p - 1) / 2 of them: the fill and the drain are made of half-stage chunks")
             for p, m in ((2, 4), (4, 8), (8, 16), (4, 32))]

    def diagnose(args, expected, got):
        p, m = args
        if math.isclose(got, (p - 1) / (3 * m + p - 1)):
            return "that is zero bubble's: on the V each chunk is half a stage, so the fill and drain take half as long"
        if math.isclose(got, (p - 1) / (6 * m)):
            return "that is bubble / work; the question asks for the idle share of the whole span"
        return None

    check_cases("dualpipev_bubble", fn, cases, rel=1e-12, diagnose=diagnose)
