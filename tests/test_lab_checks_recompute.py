"""Lab 14 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import math

import pytest

import minidist as md
from minidist.labs import CheckFailed


def ckpt_good(L, k, layer, inp):
    return math.ceil(L / k) * inp + k * layer


def best_good(L, layer, inp):
    return min(range(1, L + 1), key=lambda k: (ckpt_good(L, k, layer, inp), k))


def test_checkpointed_bytes(capsys):
    md.labs.check_checkpointed_bytes(ckpt_good)
    assert "ok: checkpointed_bytes" in capsys.readouterr().out
    for wrong, match in [
        (lambda L, k, m, b: (L / k + k) * m, "only the segment's input"),
        (lambda L, k, m, b: (L // k) * b + k * m, "ceil\\(L/k\\)"),
        (lambda L, k, m, b: math.ceil(L / k) * b, "add its k layers"),
        (lambda L, k, m, b: L * m, "without checkpointing"),
        (lambda L, k, m, b: None, "return"),
    ]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_checkpointed_bytes(wrong)


def test_best_interval(capsys):
    md.labs.check_best_interval(best_good)
    # any minimiser is accepted: the largest k among ties too
    md.labs.check_best_interval(lambda L, m, b: max(range(1, L + 1), key=lambda k: (-ckpt_good(L, k, m, b), k)))
    assert capsys.readouterr().out.count("ok: best_interval") == 2
    with pytest.raises(CheckFailed, match="sqrt\\(L\\) is optimal only"):
        md.labs.check_best_interval(lambda L, m, b: round(math.sqrt(L)))
    with pytest.raises(CheckFailed, match="outside 1..L"):
        md.labs.check_best_interval(lambda L, m, b: 0)
    with pytest.raises(CheckFailed, match="whole number"):
        md.labs.check_best_interval(lambda L, m, b: math.sqrt(L * b / m))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_best_interval(lambda L, m, b: (_ for _ in ()).throw(NotImplementedError))


def test_overlap_tokens():
    md.labs.check_overlap_tokens(lambda f, b: f / b)
    assert 312e12 / 32e9 == 9750  # the book's A100 + PCIe Gen4 figure
    with pytest.raises(CheckFailed, match="upside down"):
        md.labs.check_overlap_tokens(lambda f, b: b / f)
    with pytest.raises(CheckFailed, match="24 h\\^2 cancels"):
        md.labs.check_overlap_tokens(lambda f, b: 3 * f / b)
