"""Lab 20's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import math

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


def _nesterov(theta, delta, v, lr, mu):
    v = mu * v + delta
    return theta - lr * (delta + mu * v), v


def test_outer_step_tells_heavy_ball_from_nesterov(capsys):
    md.labs.check_outer_step(_nesterov)
    assert "ok: outer_step" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="heavy-ball"):
        md.labs.check_outer_step(lambda t, d, v, lr, mu: (t - lr * (mu * v + d), mu * v + d))
    with pytest.raises(CheckFailed, match="new velocity"):
        md.labs.check_outer_step(lambda t, d, v, lr, mu: (_nesterov(t, d, v, lr, mu)[0], v))
    with pytest.raises(CheckFailed, match="against the pseudo-gradient"):
        md.labs.check_outer_step(lambda t, d, v, lr, mu: (t + lr * (d + mu * (mu * v + d)), mu * v + d))


def test_outer_step_names_a_missing_pair_and_a_crash():
    with pytest.raises(CheckFailed, match=r"return a pair: \(new theta, new velocity\)"):
        md.labs.check_outer_step(lambda t, d, v, lr, mu: _nesterov(t, d, v, lr, mu)[0])
    with pytest.raises(CheckFailed, match=r"outer_step\(theta, delta, v, lr=.*\) raised ZeroDivisionError"):
        md.labs.check_outer_step(lambda t, d, v, lr, mu: 1 / 0)
