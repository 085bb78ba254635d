"""Checks for lab 17, failures and checkpointing (book chapter 26).

The learner derives three results and each is graded on cases the notebook never prints, drawn from a fixed
seed: the expected completion time of a job that restarts from zero (compared with ``md.resilience``'s), the
exact expected overhead of checkpointing with a restore after each failure (compared with the renewal argument's
closed form) and the interval that minimises it (compared with the root of the derivative, found by bisection),
and the resharding plan that says which element range of which old rank's file each new rank reads. Hints name
the idea a wrong answer missed (the checkpoint inside the interval at risk, one restore per failure, the
first-order model's optimum), never the formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, close, fail, number, passed
from minidist.resilience.failures import expected_completion, young_daly_interval


def check_expected_completion(fn: Callable[[float, float], float]) -> None:
    """``fn(work, mtbf)``: expected seconds to finish ``work`` seconds when every failure restarts from zero."""
    rng = np.random.default_rng(17)
    cases = [((0.0, 10.0), 0.0, "no work takes no time")]
    for ratio in (0.01, 0.7, 2.3, 6.0):
        m = float(rng.uniform(600, 90_000))
        t = float(ratio * m * rng.uniform(0.9, 1.1))
        cases.append(((t, m), expected_completion(t, m),
                      "condition on the first failure: either none comes within T, or one comes at x < T, costs x "
                      "and the job starts over; solve the equation for the expectation"))

    def diagnose(args, expected, got):
        t, m = args
        if math.isclose(got, t * math.exp(t / m), rel_tol=1e-6):
            return ("a failure costs the time until it struck, x < T, not a whole T: average x over the failures "
                    "that land inside the job")
        if math.isclose(got, m * math.exp(t / m), rel_tol=1e-6):
            return "with no work (T = 0) the job must take no time: check your expression there"
        if any(math.isclose(got, v, rel_tol=1e-6) for v in (t / math.exp(-t / m), t + t * t / (2 * m))):
            return ("counting T per attempt, or half a T per failure, misses that a failure strikes early more "
                    "often than late: integrate over when it strikes")
        return None

    check_cases("expected_completion", fn, cases, rel=1e-9, diagnose=diagnose)


def exact_overhead(interval: float, checkpoint: float, restore: float, mtbf: float) -> float:
    """Expected extra time per second of work: each interval of work and its checkpoint must survive whole (a
    failure anywhere in them loses both), and every failure adds a restore during which nothing fails."""
    return (mtbf + restore) * math.expm1((interval + checkpoint) / mtbf) / interval - 1.0


def optimal_interval(checkpoint: float, mtbf: float) -> float:
    """The interval minimising :func:`exact_overhead`: the root x of (x - 1) e^(x + C/M) + 1 = 0 on (0, 1), times
    M, by bisection (the left side rises from 1 - e^(C/M) < 0 to 1). The restore time does not move it."""
    c = checkpoint / mtbf
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (mid - 1) * math.exp(mid + c) + 1 < 0:
            lo = mid
        else:
            hi = mid
    return mtbf * (lo + hi) / 2


def daly_interval(checkpoint: float, mtbf: float) -> float:
    """Daly's (2006) higher-order estimate of the best interval (the work between checkpoints)."""
    if checkpoint >= 2 * mtbf:
        return mtbf
    r = checkpoint / (2 * mtbf)
    return math.sqrt(2 * checkpoint * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - checkpoint


def _overhead_cases() -> list[tuple[float, float, float, float]]:
    rng = np.random.default_rng(1726)
    out = []
    for c_over_m, i_over_m in ((0.002, 0.05), (0.05, 0.4), (0.3, 0.8), (1.0, 0.5), (0.01, 3.0), (0.5, 0.02)):
        m = float(rng.uniform(1_000, 50_000))
        out.append((i_over_m * m * float(rng.uniform(0.8, 1.2)), c_over_m * m * float(rng.uniform(0.8, 1.2)),
                    float(rng.uniform(0.0, 0.5)) * m, m))
    return out


def check_expected_overhead(fn: Callable[[float, float, float, float], float]) -> None:
    """``fn(interval, checkpoint, restore, mtbf)``: expected extra seconds per second of work, exactly."""
    cases = [(args, exact_overhead(*args), "the same renewal argument as the job without checkpoints, applied to "
                                           "the stretch that must survive whole; then count the restores")
             for args in _overhead_cases()]

    def diagnose(args, expected, got):
        i, c, r, m = args
        slips = [
            (c / i + i / (2 * m), "that is the first-order model, good only when the interval and the checkpoint are "
                                  "short against the MTBF: derive the exact expectation with section 1's argument"),
            (exact_overhead(i, 0.0, r, m) - 0.0, "a failure during the checkpoint loses the interval too: the "
                                                 "stretch that must survive is the work and its checkpoint"),
            ((m + r) * math.expm1(i / m) / i - 1 + c / i, "the checkpoint is part of the stretch at risk, not a cost "
                                                          "added beside it"),
            (exact_overhead(i, c, 0.0, m), "every failure also costs a restore: how many failures does one interval "
                                           "meet on average?"),
            ((m * math.expm1((i + c) / m) + r) / i - 1, "one restore per failure, not one per interval"),
            (exact_overhead(i, c, r, m) + 1, "the overhead is the time beyond the work itself, per second of work"),
            ((exact_overhead(i, c, r, m) + 1) * i - i, "per second of work: divide by the interval"),
        ]
        for value, hint in slips:
            if math.isclose(got, value, rel_tol=1e-6):
                return hint
        return None

    check_cases("expected_overhead", fn, cases, rel=1e-9, diagnose=diagnose)


def check_checkpoint_interval(fn: Callable[[float, float, float], float]) -> None:
    """``fn(checkpoint, restore, mtbf)``: the interval minimising the exact expected overhead, to 0.1%."""
    rng = np.random.default_rng(2006)
    n = 0
    for c_over_m in (1e-4, 0.003, 0.08, 0.4, 1.0, 2.5):
        m = float(rng.uniform(2_000, 80_000))
        c, r = c_over_m * m * float(rng.uniform(0.8, 1.2)), float(rng.uniform(0.0, 0.3)) * m
        shown = f"best_checkpoint_interval({c:.6g}, {r:.6g}, {m:.6g})"
        got = number(f"{shown}: expected a number", attempt("best_checkpoint_interval", fn, c, r, m, shown=shown))
        want = optimal_interval(c, m)
        if not close(got, want, rel=1e-3):
            if close(got, young_daly_interval(c, m), rel=1e-3):
                hint = ("that is the first-order optimum, which drifts from the exact one as the checkpoint grows "
                        "against the MTBF: minimise your expected_overhead itself")
            elif close(got, daly_interval(c, m), rel=1e-3):
                hint = "Daly's series is an approximation of this optimum: minimise your expected_overhead itself"
            elif got > 0 and close(got, want, rel=0.05):
                hint = ("close, but not within 0.1%: refine the search around the best point (a grid alone is too "
                        "coarse; narrow the bracket until it is tight)")
            else:
                hint = ("search the interval (it is positive, and below a few MTBFs) for the smallest "
                        "expected_overhead; the overhead falls and then rises, so one bracket narrowed step by step "
                        "finds it")
            fail(f"{shown} (C/M = {c / m:.3g})", round(want, 6), got, hint)
        n += 1
    passed(f"best_checkpoint_interval: {n} checkpoint costs from 1e-4 to 2.5 MTBFs, each to 0.1%")


def reshard_reads(length: int, old: int, new: int) -> list[list[tuple[int, int, int]]]:
    """For each new rank, the (old rank, start, stop) ranges, local to the old rank's block, it reads in order."""
    a, b = length // old, length // new
    plan = []
    for j in range(new):
        lo, hi = j * b, (j + 1) * b
        plan.append([(r, max(lo, r * a) - r * a, min(hi, (r + 1) * a) - r * a)
                     for r in range(lo // a, (hi - 1) // a + 1)])
    return plan


def _as_plan(got, new: int, name: str) -> list[list[tuple[int, int, int]]]:
    if not isinstance(got, (list, tuple)) or len(got) != new:
        fail(name, f"a list of {new} lists (one per new rank)", got if not isinstance(got, (list, tuple)) else
             f"{len(got)} entries", "return one list of reads for every new rank, in rank order")
    out = []
    for j, reads in enumerate(got):
        try:
            out.append([tuple(int(x) for x in read) for read in reads])
        except (TypeError, ValueError):
            fail(f"{name}: new rank {j}", "a list of (old_rank, start, stop) triples", reads,
                 "each read is a triple of ints: which old rank's file, and the element range inside it")
        if any(len(t) != 3 for t in out[-1]):
            fail(f"{name}: new rank {j}", "(old_rank, start, stop) triples", reads, "three ints per read")
    return out


def check_reshard_plan(fn: Callable[[int, int, int], list]) -> None:
    """``fn(length, old, new)``: which element ranges of which old rank's block each new rank reads."""
    rng = np.random.default_rng(26)
    pairs = [(2, 4), (4, 2), (3, 2), (2, 3), (4, 6), (8, 3), (5, 5), (1, 4), (6, 4)]
    n = 0
    for old, new in pairs:
        length = math.lcm(old, new) * int(rng.integers(1, 4))
        name = f"reshard_plan(length={length}, old={old}, new={new})"
        plan = _as_plan(attempt("reshard_plan", fn, length, old, new, shown=name), new, name)
        want = reshard_reads(length, old, new)
        a = length // old
        for j, (got, exp) in enumerate(zip(plan, want)):
            if got == exp:
                continue
            if [(r, s + r * a, e + r * a) for r, s, e in exp] == got:
                hint = ("those are positions in the whole tensor; each old file holds only its own block, which "
                        "starts at 0: give offsets inside it")
            elif [t for t in got if t[1] < t[2]] == exp:
                hint = "read only from the files that overlap this rank's block (no empty ranges)"
            elif sorted(got) == exp:
                hint = "keep the reads in the order of the elements (old rank by old rank)"
            elif sum(e - s for _, s, e in got) != length // new:
                hint = (f"new rank {j} holds {length // new} elements; the ranges you read add up to "
                        f"{sum(e - s for _, s, e in got)}")
            else:
                hint = ("find where new rank's block begins and ends in the whole tensor, then which old blocks "
                        "cover that span and where it cuts each of them")
            fail(f"{name}: the reads of new rank {j}", exp, got, hint)
        n += 1
    passed(f"reshard_plan: {n} layouts, growing, shrinking and neither multiple of the other")
