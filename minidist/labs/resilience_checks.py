"""Checks for lab 17, failures and checkpointing (book chapter 26).

The learner's formulas are compared with ``md.resilience``'s (expected completion without checkpoints,
the Young-Daly interval), with hints for the usual slips (forgetting the factor 2, using the rate for the
MTBF); the resharding function is run on random tensor-parallel blocks and compared with splitting the
whole matrix again.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, check_cases, fail, passed
from minidist.resilience.failures import expected_completion, young_daly_interval


def check_expected_completion(fn: Callable[[float, float], float]) -> None:
    """``fn(work, mtbf)``: expected seconds to finish ``work`` seconds when every failure restarts from zero."""
    cases = [((60.0, 6000.0), expected_completion(60.0, 6000.0), "a short job barely notices failures: about T"),
             ((3600.0, 3600.0), expected_completion(3600.0, 3600.0), "M (e^{T/M} - 1): e^1 - 1 = 1.718 MTBFs"),
             ((5 * 3600.0, 3600.0), expected_completion(5 * 3600.0, 3600.0), "five MTBFs of work: e^5 - 1 = 147"),
             ((0.0, 10.0), 0.0, "no work takes no time")]

    def diagnose(args, expected, got):
        t, m = args
        if math.isclose(got, t * math.exp(t / m), rel_tol=1e-6):
            return "the renewal argument gives M (e^{T/M} - 1), not T e^{T/M}"
        if math.isclose(got, m * math.exp(t / m), rel_tol=1e-6):
            return "subtract the 1: with T = 0 the job takes no time"
        return None

    check_cases("expected_completion", fn, cases, rel=1e-9, diagnose=diagnose)


def check_young_daly(fn: Callable[[float, float], float]) -> None:
    """``fn(checkpoint_seconds, mtbf)``: the checkpoint interval minimising C / I + I / (2 MTBF)."""
    cases = [((60.0, 4 * 3600.0), young_daly_interval(60.0, 4 * 3600.0), "sqrt(2 C MTBF)"),
             ((1.0, 50.0), young_daly_interval(1.0, 50.0), "sqrt(2 x 1 x 50) = 10"),
             ((300.0, 17_280.0), young_daly_interval(300.0, 17_280.0), "sqrt(2 C MTBF)")]

    def diagnose(args, expected, got):
        c, m = args
        if math.isclose(got, math.sqrt(c * m), rel_tol=1e-6):
            return "you lost the factor 2: d/dI (C/I + I/(2M)) = 0 gives I^2 = 2 C M"
        if math.isclose(got, math.sqrt(2 * c / m), rel_tol=1e-6):
            return "the failure rate is 1 / MTBF: sqrt(2 C / lambda) = sqrt(2 C MTBF)"
        return None

    check_cases("young_daly", fn, cases, rel=1e-9, diagnose=diagnose)


def check_reshard(fn: Callable[[list, int, int], list]) -> None:
    """``fn(blocks, new_tp, axis)``: the blocks of ``new_tp`` ranks from the blocks of the old tp ranks."""
    rng = np.random.default_rng(0)
    n = 0
    for shape, axis, old, new in [((8, 6), 1, 2, 1), ((8, 6), 1, 2, 3), ((8, 12), 1, 4, 2), ((16, 4), 0, 8, 4),
                                  ((16, 4), 0, 4, 8), ((6,), 0, 3, 2)]:
        whole = rng.standard_normal(shape)
        blocks = np.split(whole, old, axis=axis)
        name = f"reshard({old} blocks of {blocks[0].shape} -> tp={new}, axis={axis})"
        try:
            got = fn([b.copy() for b in blocks], new, axis)
        except NotImplementedError:
            raise CheckFailed("reshard: the exercise is not done yet (it raised NotImplementedError)") from None
        except Exception as e:
            raise CheckFailed(f"{name} raised {type(e).__name__}: {e}") from e
        want = np.split(whole, new, axis=axis)
        if got is None or len(got) != new:
            fail(name, f"{new} blocks", None if got is None else f"{len(got)} blocks",
                 "return one block per new tensor-parallel rank")
        for r, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            if g.shape != w.shape or not np.array_equal(g, w):
                hint = ("join the old blocks along the split axis (np.concatenate(blocks, axis)) and cut the whole "
                        "into new_tp equal blocks along the same axis")
                if g.shape == w.shape:
                    at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(g != w)[0]), w.shape))
                    fail(f"{name}: block of rank {r} has the right shape {w.shape} but not the right numbers; "
                         f"at {at}", round(float(w[at]), 4), round(float(g[at]), 4),
                         "keep the blocks in rank order and split along the same axis")
                fail(f"{name}: block of rank {r}", f"shape {w.shape}", f"shape {g.shape}", hint)
        n += 1
    passed(f"reshard: {n} layouts, TP 8 -> 4 is concatenating pairs and 4 -> 8 is cutting in halves")
