"""Lab 23's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.profiling import bus_factor, robust_z


def test_overlap_fraction_divides_by_the_shorter_stream(capsys):
    md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / min(c, m))
    assert "ok: overlap_fraction" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="shorter stream"):
        md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / max(c, m))
    with pytest.raises(CheckFailed, match="not of the step"):
        md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / t)


def test_bus_bandwidth_factors():
    md.labs.check_bus_bandwidth(lambda a, op, p: a * bus_factor(op, p))
    with pytest.raises(CheckFailed, match="reduce-scatter then an all-gather"):
        md.labs.check_bus_bandwidth(lambda a, op, p: a * (p - 1) / p if op != "broadcast" else a)


def test_robust_z_refuses_the_plain_z_score():
    md.labs.check_robust_z(robust_z)
    with pytest.raises(CheckFailed, match="plain z-score"):
        md.labs.check_robust_z(lambda x: (x - x.mean()) / x.std())
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_robust_z(lambda x: (_ for _ in ()).throw(NotImplementedError))
    assert np.isfinite(robust_z(np.ones(4))).all()
