"""Lab 24's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_mla_kv_saving():
    md.labs.check_mla_kv_saving(lambda h, d, c, r: 2 * h * d / (c + r))
    with pytest.raises(CheckFailed, match="both the keys and the values"):
        md.labs.check_mla_kv_saving(lambda h, d, c, r: h * d / (c + r))
    with pytest.raises(CheckFailed, match="decoupled RoPE key"):
        md.labs.check_mla_kv_saving(lambda h, d, c, r: 2 * h * d / c)


def test_receptive_field():
    md.labs.check_receptive_field(lambda L, w: L * (w - 1) + 1)
    with pytest.raises(CheckFailed, match="counts the position itself"):
        md.labs.check_receptive_field(lambda L, w: L * w)


def test_implied_step():
    md.labs.check_implied_step(lambda n, L, h, s, b, g, t: (6 * n + 12 * s * h * L) * b * s / (g * t * 1e12))
    with pytest.raises(CheckFailed, match="count attention too"):
        md.labs.check_implied_step(lambda n, L, h, s, b, g, t: 6 * n * b * s / (g * t * 1e12))
    with pytest.raises(CheckFailed, match="1e12 FLOP/s"):
        md.labs.check_implied_step(lambda n, L, h, s, b, g, t: (6 * n + 12 * s * h * L) * b * s / (g * t))
