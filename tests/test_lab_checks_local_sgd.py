"""Lab 20's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_expected_slowest_names_the_slips(capsys):
    md.labs.check_expected_slowest(lambda p, m: m * sum(1 / i for i in range(1, p + 1)))
    assert "ok: expected_slowest" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="waits for the slowest"):
        md.labs.check_expected_slowest(lambda p, m: m)
    with pytest.raises(CheckFailed, match="H_p"):
        md.labs.check_expected_slowest(lambda p, m: m * math.log(p))
    with pytest.raises(CheckFailed, match="the gaps shrink"):
        md.labs.check_expected_slowest(lambda p, m: m * p)


def _outer(theta, replicas, v, lr, mu):
    delta = theta - np.mean(replicas, axis=0)
    v = mu * v + delta
    return theta - lr * (delta + mu * v), v


def test_outer_round_names_the_missing_idea(capsys):
    md.labs.check_outer_round(_outer)
    assert "ok: outer_round" in capsys.readouterr().out
    heavy_ball = lambda t, R, v, lr, mu: (t - lr * (mu * v + t - np.mean(R, 0)), mu * v + t - np.mean(R, 0))  # noqa: E731
    for wrong, said in (
            (heavy_ball, "heavy-ball"),
            (lambda t, R, v, lr, mu: _outer(t, [2 * t - r for r in R], v, lr, mu), "uphill"),
            (lambda t, R, v, lr, mu: _outer(t, [len(R) * r - (len(R) - 1) * t for r in R], v, lr, mu),
             "from their average"),
            (lambda t, R, v, lr, mu: (_outer(t, R, v, lr, mu)[0], v), "update it and return it"),
            (lambda t, R, v, lr, mu: (2 * t - _outer(t, R, v, lr, mu)[0], _outer(t, R, v, lr, mu)[1]),
             "moves against the pseudo-gradient"),
            (lambda t, R, v, lr, mu: (np.mean(R, 0), _outer(t, R, v, lr, mu)[1]), "plain averaging")):
        with pytest.raises(CheckFailed, match=said):
            md.labs.check_outer_round(wrong)


def test_outer_round_names_a_missing_pair_and_a_crash():
    with pytest.raises(CheckFailed, match=r"return a pair: \(new theta, new velocity\)"):
        md.labs.check_outer_round(lambda t, R, v, lr, mu: _outer(t, R, v, lr, mu)[0])
    with pytest.raises(CheckFailed, match=r"outer_round\(theta, 2 replicas, .*\) raised ZeroDivisionError"):
        md.labs.check_outer_round(lambda t, R, v, lr, mu: 1 / 0)


def _local(clock, smooth=True, end=True, never=math.inf):
    def fn(losses, period, c, s, target, window):
        n = np.arange(1, len(losses) + 1)
        w = window if smooth else 1
        hit = np.flatnonzero(np.convolve(losses, np.ones(w) / w, mode="valid") <= target)
        return never if hit.size == 0 else float(clock(n, period, c, s)[hit[0] + (w - 1 if end else 0)])
    return fn


def test_local_time_to_target_names_the_slips(capsys):
    right = lambda n, h, c, s: n * c + (n // h) * s  # noqa: E731
    md.labs.check_local_time_to_target(_local(right))
    assert "ok: time_to_target" in capsys.readouterr().out
    for wrong, said in ((_local(lambda n, h, c, s: n * c), "add their time"),
                        (_local(lambda n, h, c, s: n * (c + s)), "once per round"),
                        (_local(lambda n, h, c, s: n * c + n / h * s), "count whole rounds"),
                        (_local(lambda n, h, c, s: n * c + np.ceil(n / h) * s), "rounds completed by then"),
                        (_local(right, smooth=False), "one lucky batch"),
                        (_local(right, end=False), "last step of the first window"),
                        (_local(right, never=None), "takes forever")):
        with pytest.raises(CheckFailed, match=said):
            md.labs.check_local_time_to_target(wrong)
