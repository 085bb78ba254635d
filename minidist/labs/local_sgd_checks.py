"""Checks for lab 20, asynchrony and local SGD (book chapter 29): the expected slowest of p exponential step
times, and DiLoCo's outer Nesterov step against ``md.parallel.LocalSGD``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, passed
from minidist.parallel.local_sgd import LocalSGD


def check_expected_slowest(fn: Callable[[int, float], float]) -> None:
    """``fn(p, mean)``: E[max of p independent exponential step times of mean ``mean``] = mean x H_p."""
    cases = [((p, m), m * sum(1 / i for i in range(1, p + 1)), "mean x (1 + 1/2 + ... + 1/p)")
             for p, m in ((1, 2.0), (2, 1.0), (8, 0.5), (64, 1.0), (1024, 3.0))]

    def diagnose(args, expected, got):
        p, m = args
        if math.isclose(got, m):
            return "a synchronous step waits for the slowest of the p replicas, not a typical one"
        if math.isclose(got, m * math.log(p), rel_tol=1e-9) or math.isclose(got, m * p):
            return "the maximum of p exponentials has mean H_p = 1 + 1/2 + ... + 1/p times the mean (about ln p + 0.58)"
        return None

    check_cases("expected_slowest", fn, cases, rel=1e-9, diagnose=diagnose)


def check_outer_step(fn: Callable) -> None:
    """``fn(theta, delta, velocity, lr, momentum) -> (new_theta, new_velocity)``: Nesterov on the pseudo-gradient."""
    rng = np.random.default_rng(0)
    for lr, mu in ((0.7, 0.9), (1.0, 0.5), (0.3, 0.0)):
        theta, delta, v = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)
        want_v = v.copy()
        want = LocalSGD(4, lr, mu, nesterov=True).outer_step(theta, delta, want_v) if mu else theta - lr * delta
        if not mu:
            want_v = v * 0 + delta
        shown = f"outer_step(theta, delta, v, lr={lr}, momentum={mu})"
        out = attempt("outer_step", fn, theta.copy(), delta.copy(), v.copy(), lr, mu, shown=shown)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(shown, "(new theta, new velocity)", out, "return a pair: (new theta, new velocity)")
        got, got_v = out
        if not np.allclose(got_v, want_v):
            fail(f"outer_step(lr={lr}, momentum={mu}): the new velocity", want_v.round(4), np.round(got_v, 4),
                 "velocity <- momentum x velocity + delta (delta is the averaged displacement theta - mean theta_i)")
        if not np.allclose(got, want):
            plain = theta - lr * want_v
            hint = ("that is heavy-ball momentum; Nesterov looks ahead: step along delta + momentum x velocity"
                    if np.allclose(got, plain) else
                    "theta moves against the pseudo-gradient: theta - lr x (delta + momentum x velocity)")
            fail(f"outer_step(lr={lr}, momentum={mu}): the new parameters", want.round(4), np.round(got, 4), hint)
    passed("outer_step: DiLoCo's Nesterov step")
