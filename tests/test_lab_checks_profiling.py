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


def test_robust_z_takes_either_form_of_the_score_and_needs_a_floor_under_the_mad():
    def mad(x):
        return np.median(np.abs(x - np.median(x)))

    md.labs.check_robust_z(lambda x: 0.6745 * (x - np.median(x)) / max(mad(x), 1e-9 * abs(np.median(x))))
    with pytest.raises(CheckFailed, match="estimates a standard deviation"):
        md.labs.check_robust_z(lambda x: (x - np.median(x)) / max(mad(x), 1e-9))
    with pytest.raises(CheckFailed, match="tiny floor"):
        md.labs.check_robust_z(lambda x: (x - np.median(x)) / (1.4826 * mad(x)))


def test_robust_z_refuses_the_plain_z_score():
    md.labs.check_robust_z(robust_z)
    with pytest.raises(CheckFailed, match="plain z-score"):
        md.labs.check_robust_z(lambda x: (x - x.mean()) / x.std())
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_robust_z(lambda x: (_ for _ in ()).throw(NotImplementedError))
    assert np.isfinite(robust_z(np.ones(4))).all()


def test_robust_z_names_a_crash_a_scalar_and_a_lost_sign():
    with pytest.raises(CheckFailed, match=r"robust_z\(\[.*\]\) raised \w*TypeError"):
        md.labs.check_robust_z(lambda x: x + "a")
    with pytest.raises(CheckFailed, match=r"return one score per value: an array of shape \(8,\), not \(\)"):
        md.labs.check_robust_z(lambda x: float(np.median(x)))
    with pytest.raises(CheckFailed, match="keep the sign"):
        md.labs.check_robust_z(lambda x: np.abs(robust_z(x)))
