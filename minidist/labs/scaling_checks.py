"""Checks for lab 04, scaling laws and batch size."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, fail, numbers_of, passed


def _call(name: str, fn: Callable, *args):
    return attempt(name, fn, *args)


def check_power_law_fit(fn: Callable[[np.ndarray, np.ndarray], tuple[float, float, float]]) -> None:
    """``fn(N, L)`` must recover (A, alpha, L_inf) from exact synthetic data."""
    N = np.logspace(3, 6, 6)
    for A, alpha, l_inf in [(50.0, 0.5, 1.0), (400.0, 0.34, 1.69), (8.0, 0.2, 0.0)]:
        L = A / N**alpha + l_inf
        got = _call("fit_power_law", fn, N, L)
        gA, galpha, gl = numbers_of("fit_power_law", got, ("A", "alpha", "L_inf"))
        pred = gA / N**galpha + gl
        if not np.allclose(pred, L, rtol=2e-3):
            hint = "fit log(L - L_inf) against log N, not log L against log N" if abs(gl) < 1e-9 < l_inf else \
                "alpha is minus the slope of log(L - L_inf) vs log N; A is exp(intercept)"
            if np.allclose(pred, L, rtol=5e-2) and gl < l_inf:
                hint = (f"close: the best L_inf is {l_inf:g}, yours {gl:.4g}; scan a finer grid of L_inf (a few "
                        f"hundred values from 0 to just below the smallest loss)")
            fail(f"fit_power_law on exact data L = {A}/N^{alpha} + {l_inf} does not reproduce L",
                 np.round(L, 4).tolist(), np.round(pred, 4).tolist(), hint)
    passed("fit_power_law recovers three synthetic power laws")


def check_compute_optimal(fn: Callable[[float], tuple[float, float]]) -> None:
    """``fn(C)`` must satisfy 6 N D = C and the first-order condition alpha A / N^alpha = beta B / D^beta."""
    A, alpha, B, beta = 406.4, 0.34, 410.7, 0.28
    for C in (1e21, 5.76e23, 3.8e25):
        got = _call("compute_optimal", fn, C)
        n, d = numbers_of(f"compute_optimal({C:.3g})", got, ("N*", "D*"))
        if not math.isclose(6 * n * d, C, rel_tol=1e-6):
            fail(f"compute_optimal({C:.3g}) violates the budget 6 N D = C", C, 6 * n * d,
                 "N* and D* must use up the budget exactly: D* = C / (6 N*)")
        lhs, rhs = alpha * A / n**alpha, beta * B / d**beta
        if not math.isclose(lhs, rhs, rel_tol=1e-6):
            fail(f"compute_optimal({C:.3g}) is not at the optimum: alpha A / N^alpha != beta B / D^beta", lhs, rhs,
                 "the exponent of C/6 in N* is beta/(alpha+beta), in D* alpha/(alpha+beta)")
    passed("compute_optimal uses the whole budget and balances the marginal returns")


def check_noise_scale(fn: Callable) -> None:
    """``fn(b_small, sq_small, b_big, sq_big)`` solves E|g_B|^2 = |G|^2 + tr(Sigma)/B at two batch sizes."""
    for g2, tr, bs, bb in [(0.5, 20.0, 2, 64), (3.0, 3.0, 1, 8), (1e-3, 1.0, 16, 1024)]:
        got = _call("noise_scale", fn, bs, g2 + tr / bs, bb, g2 + tr / bb)
        want = (g2, tr, tr / g2)
        got = numbers_of(f"noise_scale({bs}, ..., {bb}, ...)", got, ("|G|^2", "tr(Sigma)", "B_noise"))
        if not np.allclose(got, want, rtol=1e-9):
            hint = "subtract the two equations to eliminate |G|^2 (gives tr Sigma), then substitute back"
            if np.allclose(got[:2], want[:2], rtol=1e-9) and np.isclose(got[2], g2 / tr, rtol=1e-9):
                hint = "B_noise = tr(Sigma) / |G|^2, noise over signal: yours is upside down"
            fail(f"noise_scale({bs}, ..., {bb}, ...) with |G|^2 = {g2}, tr(Sigma) = {tr}", want, got, hint)
    passed("noise_scale solves the two-batch equations")
