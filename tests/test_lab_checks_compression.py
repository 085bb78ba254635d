"""Lab 19's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def _round(v, s, rng):
    low = np.floor(v * s)
    return (low + (rng.random(v.shape) < v * s - low)) / s


def test_stochastic_round_wants_unbiased_levels(capsys):
    md.labs.check_stochastic_round(_round)
    assert "ok: stochastic_round" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="unbiased"):
        md.labs.check_stochastic_round(lambda v, s, rng: np.round(v * s) / s)  # nearest: biased
    with pytest.raises(CheckFailed, match="off the levels"):
        md.labs.check_stochastic_round(lambda v, s, rng: v + 0 * rng.random(v.shape))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_stochastic_round(lambda *a: (_ for _ in ()).throw(NotImplementedError))


def test_stochastic_round_spots_level_indices():
    # xi instead of xi / s: right for one level, a factor s too large beyond.
    with pytest.raises(CheckFailed, match="divide by levels"):
        md.labs.check_stochastic_round(lambda v, s, rng: _round(v, s, rng) * s)
    with pytest.raises(CheckFailed, match="moved past its two neighbouring levels"):
        md.labs.check_stochastic_round(lambda v, s, rng: np.minimum(_round(v, s, rng) + 1 / s, 1.0))


def test_stochastic_round_wants_a_draw_per_entry():
    def shared(v, s, rng):  # unbiased entry by entry, but the whole vector rounds up or down together
        low = np.floor(v * s)
        return (low + (rng.random() < v * s - low)) / s

    with pytest.raises(CheckFailed, match="one random number per entry"):
        md.labs.check_stochastic_round(shared)


def _topk(g, r, k):
    acc = g + r
    idx = np.argsort(np.abs(acc))[-k:]
    sent = np.zeros_like(acc)
    sent[idx] = acc[idx]
    return sent, acc - sent


def test_topk_feedback_catches_the_forgotten_residual_and_magnitude(capsys):
    md.labs.check_topk_feedback(_topk)
    assert "ok: topk_feedback" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="grad \\+ residual"):
        md.labs.check_topk_feedback(lambda g, r, k: (_topk(g, 0 * r, k)[0], g + r - _topk(g, 0 * r, k)[0]))

    def by_value(g, r, k):
        acc = g + r
        idx = np.argsort(acc)[-k:]
        sent = np.zeros_like(acc)
        sent[idx] = acc[idx]
        return sent, acc - sent

    with pytest.raises(CheckFailed, match="magnitude"):
        md.labs.check_topk_feedback(by_value)
    with pytest.raises(CheckFailed, match="nothing may be lost"):
        md.labs.check_topk_feedback(lambda g, r, k: (_topk(g, r, k)[0], np.zeros_like(g)))


def test_powersgd_bytes_names_the_slips():
    md.labs.check_powersgd_bytes(lambda m, n, r, e: r * (m + n) * e)
    with pytest.raises(CheckFailed, match="dense matrix"):
        md.labs.check_powersgd_bytes(lambda m, n, r, e: m * n * e)
    with pytest.raises(CheckFailed, match="in bytes"):
        md.labs.check_powersgd_bytes(lambda m, n, r, e: r * (m + n))


def test_topk_feedback_names_a_compact_send_and_a_missing_pair():
    def compact(g, r, k):  # only the k values, not an array shaped like grad
        sent, res = _topk(g, r, k)
        return sent[sent != 0], res

    with pytest.raises(CheckFailed, match=r"both are shaped like grad"):
        md.labs.check_topk_feedback(compact)
    with pytest.raises(CheckFailed, match=r"return a pair"):
        md.labs.check_topk_feedback(lambda g, r, k: _topk(g, r, k)[0])
    with pytest.raises(CheckFailed, match=r"topk_feedback\(grad of shape \(10,\), residual, k=1\) raised IndexError"):
        md.labs.check_topk_feedback(lambda g, r, k: g[[99]])
