"""Lab 19's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import math

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
    with pytest.raises(CheckFailed, match="the residual is part of what competes"):
        md.labs.check_topk_feedback(lambda g, r, k: (_topk(g, 0 * r, k)[0], g + r - _topk(g, 0 * r, k)[0]))

    def by_value(g, r, k):
        acc = g + r
        idx = np.argsort(acc)[-k:]
        sent = np.zeros_like(acc)
        sent[idx] = acc[idx]
        return sent, acc - sent

    with pytest.raises(CheckFailed, match="magnitude"):
        md.labs.check_topk_feedback(by_value)

    def by_grad(g, r, k):  # ranked by this step's gradient alone, values accumulated: the residual never competes
        acc = g + r
        idx = np.argsort(np.abs(g))[-k:]
        sent = np.zeros_like(acc)
        sent[idx] = acc[idx]
        return sent, acc - sent

    with pytest.raises(CheckFailed, match="the residual is part of what competes") as told:
        md.labs.check_topk_feedback(by_grad)
    assert "np.abs" not in str(told.value)

    def gradient_values(g, r, k):  # the right places, this step's values only
        sent, res = _topk(g, r, k)
        sent[sent != 0] = g[sent != 0]
        return sent, g + r - sent

    with pytest.raises(CheckFailed, match="the right entries, the wrong values"):
        md.labs.check_topk_feedback(gradient_values)
    with pytest.raises(CheckFailed, match="nothing may be lost"):
        md.labs.check_topk_feedback(lambda g, r, k: (_topk(g, r, k)[0], np.zeros_like(g)))


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


def _powersgd(grads, q):
    p = np.linalg.qr(sum(g @ q for g in grads))[0]
    q = sum(g.T @ p for g in grads)
    return p @ q.T, q


def test_powersgd_step_names_the_missing_idea(capsys):
    md.labs.check_powersgd_step(_powersgd)
    assert "ok: powersgd_step" in capsys.readouterr().out

    def gram_schmidt(grads, q):  # another orthonormalisation: the same basis up to the signs of its columns
        p = sum(g @ q for g in grads)
        cols = []
        for j in range(p.shape[1]):
            v = p[:, j] - sum((c @ p[:, j]) * c for c in cols)
            cols.append(-v / np.linalg.norm(v))
        p = np.stack(cols, 1)
        q = sum(g.T @ p for g in grads)
        return p @ q.T, q

    md.labs.check_powersgd_step(gram_schmidt)

    def no_basis(grads, q):
        p = sum(g @ q for g in grads)
        q = sum(g.T @ p for g in grads)
        return p @ q.T, q

    def mean(grads, q):
        approx, q = _powersgd(grads, q)
        return approx / len(grads), q / len(grads)

    def own_basis(grads, q):
        parts = [np.linalg.qr(g @ q)[0] for g in grads]
        return sum(p @ (g.T @ p).T for p, g in zip(parts, grads)), q

    def first_replica(grads, q):
        p = np.linalg.qr(sum(g @ q for g in grads))[0]
        return p @ (grads[0].T @ p).T, grads[0].T @ p

    for wrong, said in ((no_basis, "orthonormal"), (mean, "a sum, not a mean"), (own_basis, "share one basis"),
                        (first_replica, "summed over the replicas too"),
                        (lambda g, q: (_powersgd(g, q)[0], q), "warm start"),
                        (lambda g, q: _powersgd(g, q)[0], "return a pair")):
        with pytest.raises(CheckFailed, match=said):
            md.labs.check_powersgd_step(wrong)


def _time_to_target(losses, times, target, window):
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    return math.inf if hit.size == 0 else float(np.cumsum(times)[hit[0] + window - 1])


def _variant(smooth=True, end=True, never=math.inf, seconds=True):
    def fn(losses, times, target, window):
        w = window if smooth else 1
        hit = np.flatnonzero(np.convolve(losses, np.ones(w) / w, mode="valid") <= target)
        if hit.size == 0:
            return never
        i = hit[0] + (w - 1 if end else 0)
        return float(np.cumsum(times)[i]) if seconds else i + 1
    return fn


def test_time_to_target_names_the_slips(capsys):
    md.labs.check_time_to_target(_time_to_target)
    assert "ok: time_to_target" in capsys.readouterr().out
    for wrong, said in ((_variant(smooth=False), "one lucky batch"), (_variant(end=False), "last step of the first"),
                        (_variant(never=None), "takes forever"), (_variant(never=0.0), "takes forever"),
                        (_variant(seconds=False), "step count")):
        with pytest.raises(CheckFailed, match=said):
            md.labs.check_time_to_target(wrong)

    def mean_step(losses, times, target, window):
        t = _time_to_target(losses, times, target, window)
        return t if math.isinf(t) else float(np.searchsorted(np.cumsum(times), t) + 1) * float(np.mean(times))

    with pytest.raises(CheckFailed, match="different durations"):
        md.labs.check_time_to_target(mean_step)
