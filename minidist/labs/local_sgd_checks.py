"""Checks for lab 20, asynchrony and local SGD (book chapter 29): the expected slowest of p exponential step
times, DiLoCo's outer round (average the replicas, Nesterov on the pseudo-gradient) against
``md.parallel.LocalSGD``, and the simulated time a run that synchronises every H steps takes to reach a target loss;
each on cases the notebook does not show."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, close, fail, number, passed
from minidist.parallel.asynchronous.local_sgd import LocalSGD


def check_expected_slowest(fn: Callable[[int, float], float]) -> None:
    """``fn(p, mean)``: E[max of p independent exponential step times of mean ``mean``] = mean x H_p."""
    every_gap = ("the last replica finishes after every gap between consecutive finishers: add their expected "
                 "lengths, one per replica")
    cases = [((p, m), m * sum(1 / i for i in range(1, p + 1)), every_gap)
             for p, m in ((1, 2.0), (2, 1.0), (8, 0.5), (64, 1.0), (1024, 3.0), (3, 0.25))]

    def diagnose(args, expected, got):
        p, m = args
        if math.isclose(got, m):
            return "a synchronous step waits for the slowest of the p replicas, not a typical one"
        if math.isclose(got, m * math.log(p), rel_tol=1e-9):
            return "ln p is only what H_p approaches for large p; " + every_gap
        if math.isclose(got, m * p):
            return ("the gaps shrink as more replicas are still running: the first of p to finish comes p times "
                    "sooner than one replica alone would; " + every_gap)
        return None

    check_cases("expected_slowest", fn, cases, rel=1e-9, diagnose=diagnose)


def _outer_round(theta, replicas, velocity, lr, momentum):
    delta = theta - np.mean(replicas, axis=0)
    v = velocity.copy()
    if momentum:
        new = LocalSGD(4, lr, momentum, nesterov=True).outer_step(theta, delta, v)
    else:
        new, v = theta - lr * delta, velocity * 0 + delta
    return new, v


def check_outer_round(fn: Callable) -> None:
    """``fn(theta, replicas, velocity, lr, momentum) -> (new_theta, new_velocity)``: average the replicas' parameters
    into the pseudo-gradient theta - mean, then Nesterov momentum on it (plain local SGD when momentum is 0)."""
    rng = np.random.default_rng(29)
    for p, lr, mu in ((2, 0.7, 0.9), (3, 1.0, 0.5), (5, 0.4, 0.0), (4, 1.0, 0.0)):
        theta = rng.standard_normal(6)
        replicas = [theta - 0.3 * rng.standard_normal(6) for _ in range(p)]
        v = rng.standard_normal(6)
        want, want_v = _outer_round(theta, replicas, v, lr, mu)
        shown = f"outer_round(theta, {p} replicas, velocity, lr={lr}, momentum={mu})"
        out = attempt("outer_round", fn, theta.copy(), [r.copy() for r in replicas], v.copy(), lr, mu, shown=shown)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(shown, "(new theta, new velocity)", out, "return a pair: (new theta, new velocity)")
        got, got_v = (np.asarray(x, float) for x in out)
        if got.shape != theta.shape or got_v.shape != theta.shape:
            fail(f"{shown}: the shapes returned", (theta.shape, theta.shape), (got.shape, got_v.shape),
                 "both are parameter vectors, shaped like theta")
        delta = theta - np.mean(replicas, axis=0)  # what the replicas' average moved, seen as a gradient
        if not np.allclose(got_v, want_v):
            if np.allclose(got_v, mu * v - delta):
                hint = ("the pseudo-gradient points the way a gradient does, uphill: from where the replicas ended "
                        "back towards where they started")
            elif np.allclose(got_v, mu * v + p * delta) or np.allclose(got_v, mu * v + theta - sum(replicas)):
                hint = "the all-reduce sums the replicas; the displacement is from their average"
            elif np.allclose(got_v, v):
                hint = "the velocity carries this round's pseudo-gradient into the next rounds: update it and return it"
            else:
                hint = "the velocity decays by the momentum and gathers this round's pseudo-gradient"
            fail(f"{shown}: the new velocity", want_v.round(4), np.round(got_v, 4), hint)
        if not np.allclose(got, want):
            if mu and np.allclose(got, theta - lr * want_v):
                hint = ("that is heavy-ball momentum; Nesterov looks ahead: the step also takes this round's "
                        "pseudo-gradient on top of the momentum")
            elif np.allclose(got, 2 * theta - want):
                hint = "the outer step moves against the pseudo-gradient, as a gradient step does"
            elif np.allclose(got, np.mean(replicas, axis=0)):
                hint = ("that is plain averaging; the outer optimiser takes a step of size lr along the "
                        "pseudo-gradient (and its momentum)")
            else:
                hint = "the outer step: a Nesterov step along the pseudo-gradient with the given lr and momentum"
            fail(f"{shown}: the new parameters", want.round(4), np.round(got, 4), hint)
    passed("outer_round: the replicas averaged, Nesterov on the pseudo-gradient, on 4 fresh cases")


def _local_clock(steps: int, period: int, step_time: float, sync_time: float) -> np.ndarray:
    s = np.arange(1, steps + 1)
    return s * step_time + (s // period) * sync_time


def _local_time_to_target(losses, period, step_time, sync_time, target, window):
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    if hit.size == 0:
        return math.inf
    return float(_local_clock(len(losses), period, step_time, sync_time)[hit[0] + window - 1])


def _local_cases():
    rng = np.random.default_rng(2029)
    for steps, period, window, reach in ((120, 10, 8, True), (200, 7, 10, True), (90, 1, 5, True),
                                         (150, 25, 6, False), (300, 40, 20, True)):
        s = np.arange(steps)
        losses = 2 + 1.5 * np.exp(-s / (steps / 3)) + 0.25 * rng.standard_normal(steps)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        target = float(np.quantile(smooth, 0.35)) if reach else float(smooth.min() - 0.05)
        step_time, sync_time = float(rng.uniform(1e-3, 3e-3)), float(rng.uniform(5e-3, 5e-2))
        yield list(losses), period, step_time, sync_time, round(target, 4), window


def _local_diagnosis(losses, period, c, s, target, window, got) -> str | None:
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    raw = np.flatnonzero(np.asarray(losses) <= target)
    steps = np.arange(1, len(losses) + 1)
    if window > 1 and raw.size and close(got, _local_clock(len(losses), period, c, s)[raw[0]]):
        return ("one lucky batch is not the target reached: a training loss is noisy, so judge the mean of the "
                f"last {window} steps' losses")
    if hit.size == 0:
        return None
    k = hit[0] + window - 1  # the step (0-based) at which the target is reached
    n = steps[k]
    if close(got, n * c):
        return "every completed round ends with a synchronisation: add their time"
    if close(got, n * (c + s)):
        return "the replicas synchronise once per round of `period` steps, not after every step"
    if close(got, n * c + n / period * s):
        return "a synchronisation happens only when a round is complete: count whole rounds"
    if close(got, n * c + math.ceil(n / period) * s):
        return "a round that has not finished has not synchronised yet: count the rounds completed by then"
    if window > 1 and close(got, _local_clock(len(losses), period, c, s)[hit[0]]):
        return ("the mean of a window is known only once its last step has run: count the time up to the last "
                "step of the first window below the target")
    if close(got, n) or close(got, n - 1):
        return "that is a step count; the answer is simulated seconds"
    return None


def check_local_time_to_target(fn: Callable) -> None:
    """``fn(losses, period, step_time, sync_time, target, window)``: simulated seconds until the mean of the last
    ``window`` losses first reaches ``target`` (at or below), counting ``step_time`` per step and ``sync_time`` per
    completed round of ``period`` steps; infinity if it never does."""
    n = 0
    for losses, period, c, s, target, window in _local_cases():
        shown = (f"time_to_target({len(losses)} losses, period={period}, step_time={c:.3g}, sync_time={s:.3g}, "
                 f"target={target}, window={window})")
        got = attempt("time_to_target", fn, list(losses), period, c, s, target, window, shown=shown)
        want = _local_time_to_target(losses, period, c, s, target, window)
        if math.isinf(want):
            if got is None or not (isinstance(got, (int, float, np.floating)) and math.isinf(got) and got > 0):
                lucky = isinstance(got, (int, float, np.floating)) and \
                    _local_diagnosis(losses, period, c, s, target, window, got)
                fail(f"{shown}: a run that never gets there", math.inf, got,
                     lucky or "a run that never reaches the target takes forever: return infinity (math.inf), so "
                              "that comparing and sorting times still works")
            n += 1
            continue
        got = number(f"{shown}: expected a number of seconds", got)
        if not close(got, want, rel=1e-9):
            fail(f"{shown} is wrong", want, got, _local_diagnosis(losses, period, c, s, target, window, got)
                 or "the first step where the mean of the last `window` losses is at or below the target; its time "
                    "is the steps run so far plus the synchronisations completed so far")
        n += 1
    passed(f"time_to_target: {n} runs, one that never gets there")
