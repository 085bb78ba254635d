"""Lab 22's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_collective_matmul_time_explains_the_usual_mistakes(capsys):
    md.labs.check_collective_matmul_time(lambda t, mm, msg: (t - 1) * max(mm, msg) + mm)
    assert "ok: collective_matmul_time" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="without overlap"):
        md.labs.check_collective_matmul_time(lambda t, mm, msg: (t - 1) * msg + t * mm)
    with pytest.raises(CheckFailed, match="no message is left"):
        md.labs.check_collective_matmul_time(lambda t, mm, msg: t * max(mm, msg))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_collective_matmul_time(lambda t, mm, msg: (_ for _ in ()).throw(NotImplementedError))


def test_kv_numbers_per_token():
    md.labs.check_kv_numbers_per_token(lambda h, g, d, c: c if c is not None else 2 * g * d)
    with pytest.raises(CheckFailed, match="count n_kv_heads"):
        md.labs.check_kv_numbers_per_token(lambda h, g, d, c: c if c is not None else 2 * h * d)
    with pytest.raises(CheckFailed, match="only the latent"):
        md.labs.check_kv_numbers_per_token(lambda h, g, d, c: 2 * g * d)


def test_dualpipev_bubble():
    md.labs.check_dualpipev_bubble(lambda p, m: (p - 1) / (6 * m + p - 1))
    with pytest.raises(CheckFailed, match="zero bubble's"):
        md.labs.check_dualpipev_bubble(lambda p, m: (p - 1) / (3 * m + p - 1))
