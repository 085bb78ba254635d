"""Lab 17's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_expected_completion_names_the_usual_slips(capsys):
    md.labs.check_expected_completion(lambda t, m: m * math.expm1(t / m))
    assert "ok: expected_completion" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="not T e"):
        md.labs.check_expected_completion(lambda t, m: t * math.exp(t / m))
    with pytest.raises(CheckFailed, match="subtract the 1"):
        md.labs.check_expected_completion(lambda t, m: m * math.exp(t / m))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_expected_completion(lambda t, m: (_ for _ in ()).throw(NotImplementedError))


def test_young_daly_catches_the_lost_factor_and_the_rate():
    md.labs.check_young_daly(lambda c, m: math.sqrt(2 * c * m))
    with pytest.raises(CheckFailed, match="factor 2"):
        md.labs.check_young_daly(lambda c, m: math.sqrt(c * m))
    with pytest.raises(CheckFailed, match="1 / MTBF"):
        md.labs.check_young_daly(lambda c, m: math.sqrt(2 * c / m))


def test_reshard_wants_concatenate_then_split():
    md.labs.check_reshard(lambda blocks, t, axis: np.split(np.concatenate(blocks, axis=axis), t, axis=axis))
    with pytest.raises(CheckFailed, match="blocks"):
        md.labs.check_reshard(lambda blocks, t, axis: blocks)  # kept the old layout
    with pytest.raises(CheckFailed, match="same axis"):  # joined along the wrong axis: right shapes only when square
        md.labs.check_reshard(lambda blocks, t, axis: np.split(np.concatenate(blocks[::-1], axis=axis), t, axis=axis))


def test_reshard_with_the_right_shapes_shows_a_wrong_number_not_two_equal_shapes():
    with pytest.raises(CheckFailed, match=r"right shape \(8, 6\) but not the right numbers; at \(0, 0\)") as info:
        md.labs.check_reshard(lambda blocks, t, axis: np.split(np.concatenate(blocks[::-1], axis), t, axis))
    assert "shape (8, 6)\n  got:      'shape" not in str(info.value)
