"""Checks for lab 23, profiling and investigation (book chapters 32-33): the overlap fraction, bus bandwidth and
the robust z-score, against ``md.profiling``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, passed
from minidist.profiling import bus_factor, robust_z


def check_overlap_fraction(fn: Callable[[float, float, float], float]) -> None:
    """``fn(t_compute, t_comm, t_step)``: alpha_ov from T = T_c + T_m - alpha_ov min(T_c, T_m)."""
    cases = [((c, m, t), (c + m - t) / min(c, m), "solve T = T_c + T_m - alpha min(T_c, T_m) for alpha")
             for c, m, t in ((10.0, 4.0, 14.0), (3.0, 8.0, 9.5), (10.0, 4.0, 10.0), (10.0, 4.0, 12.0))]

    def diagnose(args, expected, got):
        c, m, t = args
        if math.isclose(got, (c + m - t) / max(c, m)):
            return "divide by the shorter stream: at most all of it can hide under the longer one"
        if math.isclose(got, (c + m - t) / t):
            return "alpha is a share of the shorter stream's time, not of the step"
        return None

    check_cases("overlap_fraction", fn, cases, rel=1e-12, diagnose=diagnose)


def check_bus_bandwidth(fn: Callable[[float, str, int], float]) -> None:
    """``fn(algbw, collective, p)``: nccl-tests' bus bandwidth."""
    cases = [((1e9, op, p), 1e9 * bus_factor(op, p), "busbw = algbw x (what each rank must move) / (buffer)")
             for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast") for p in (2, 8)]

    def diagnose(args, expected, got):
        algbw, op, p = args
        if op == "all_reduce" and math.isclose(got, algbw * (p - 1) / p):
            return "an all-reduce is a reduce-scatter then an all-gather: 2 (p-1)/p"
        if op in ("all_gather", "reduce_scatter") and math.isclose(got, algbw * 2 * (p - 1) / p):
            return "an all-gather alone moves (p-1)/p of the buffer through each rank"
        return None

    check_cases("bus_bandwidth", fn, cases, rel=1e-12, diagnose=diagnose)


def check_robust_z(fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """``fn(values)``: (x - median) / (1.4826 MAD), the MAD kept above a tiny floor."""
    rng = np.random.default_rng(0)
    samples = [np.r_[np.full(7, 1.0) + rng.normal(0, 0.01, 7), 1.5], rng.normal(5, 2, 20), np.array([3.0, 1, 2, 8])]
    for x in samples:
        got = _call_robust_z(fn, x)
        want = robust_z(x)
        # rtol 1e-4: 0.6745 (x - median) / MAD, Iglewicz and Hoaglin's form of the same score, is as good
        if got.shape != x.shape or not np.allclose(got, want, rtol=1e-4):
            plain = (x - x.mean()) / x.std()
            if got.shape != x.shape:
                hint = f"return one score per value: an array of shape {x.shape}, not {got.shape}"
            elif np.allclose(got, plain):
                hint = ("that is the plain z-score: the outlier drags the mean and the standard deviation; use the "
                        "median and the median absolute deviation")
            elif np.allclose(np.abs(got), np.abs(want), rtol=1e-4):
                hint = "keep the sign: a value below the median has a negative score (no abs of x - median)"
            else:
                hint = "scale the MAD so that it estimates a standard deviation (see the text)"
            fail(f"robust_z({np.round(x, 3).tolist()})", np.round(want, 3).tolist(), np.round(got, 3).tolist(), hint)
    same = np.array([2.0, 2.0, 2.0, 5.0])  # most ranks identical, as in a simulation: the MAD is 0
    got = _call_robust_z(fn, same)
    if got.shape != same.shape or not (np.all(np.isfinite(got)) and np.all(got[:3] == 0) and got[3] > 3.5):
        fail(f"robust_z({same.tolist()})", "0 for the three equal ranks, a large finite z for the last",
             np.round(got, 3).tolist(), "when most ranks are identical the MAD is 0: keep it above a tiny floor "
             "(say a billionth of the median)")
    passed("robust_z: median and MAD")


def _call_robust_z(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # a MAD of 0 is part of the test: its nan and inf are judged, not warned
        got = attempt("robust_z", fn, x.copy(), shown=f"robust_z({np.round(x, 3).tolist()})")
    try:
        return np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        fail(f"robust_z({np.round(x, 3).tolist()})", "an array of floats, one per value", got,
             "return one score per value, as an array")
