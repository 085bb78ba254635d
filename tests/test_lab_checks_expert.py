"""Lab 12 checks accept a right answer and reject the usual mistakes with the intended hint."""

import numpy as np
import pytest

from minidist.labs import CheckFailed
from minidist.labs.expert_checks import (
    check_aux_loss,
    check_capacity_keep,
    check_dispatch_splits,
    check_top_k_routing,
)


def route(logits, k, renorm=True, order=True):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    e = np.argsort(-p, axis=-1)[:, :k]
    if not order:
        e = np.sort(e, -1)
    g = np.take_along_axis(p, e, -1)
    return e, g / g.sum(-1, keepdims=True) if renorm and (k > 1 or renorm == "always") else g


def keep(experts, E, cap, token_major=False):
    used = [0] * E
    out = np.zeros(experts.shape, bool)
    order = [(n, j) for n in range(len(experts)) for j in range(experts.shape[1])] if token_major else \
        [(n, j) for j in range(experts.shape[1]) for n in range(len(experts))]
    for n, j in order:
        e = experts[n, j]
        if used[e] < cap:
            used[e] += 1
            out[n, j] = True
    return out


def splits(experts, kept, E, ep):
    return [int(kept[experts // (E // ep) == q].sum()) for q in range(ep)]


def aux(probs, experts):
    N, E = probs.shape
    f = np.bincount(experts.reshape(-1), minlength=E) / experts.size
    return E * (f * probs.mean(0)).sum()


def test_checks_accept_right_answers(capsys):
    check_top_k_routing(route)
    check_capacity_keep(keep)
    check_dispatch_splits(splits)
    check_aux_loss(aux)
    assert capsys.readouterr().out.count("ok:") == 4


def test_routing_mistakes():
    with pytest.raises(CheckFailed, match="raw probabilities"):
        check_top_k_routing(lambda x, k: route(x, k, renorm=False) if k > 1 else route(x, k))
    with pytest.raises(CheckFailed, match="with k = 1 keep the raw probability") as one:  # the lab text, and MoE's
        check_top_k_routing(lambda x, k: route(x, k, renorm="always"))
    assert "route(k=1): gates of token 0" in str(one.value) and "every gate is 1" in str(one.value)
    assert "these are the raw probabilities" not in str(one.value)
    with pytest.raises(CheckFailed, match="with k = 1 keep the raw probability") as half:
        check_top_k_routing(lambda x, k: (route(x, k)[0], route(x, k)[1] / 2) if k == 1 else route(x, k))
    assert "every gate is 1" not in str(half.value)
    with pytest.raises(CheckFailed, match="decreasing probability"):
        check_top_k_routing(lambda x, k: route(x, k, order=False))
    with pytest.raises(CheckFailed, match="not done yet"):
        check_top_k_routing(lambda x, k: (_ for _ in ()).throw(NotImplementedError()))


def test_capacity_mistakes():
    with pytest.raises(CheckFailed, match="serve all first choices"):
        check_capacity_keep(lambda e, E, c: keep(e, E, c, token_major=True))
    with pytest.raises(CheckFailed, match="but the capacity is"):
        check_capacity_keep(lambda e, E, c: keep(e, E, c + 1))


def test_split_and_aux_mistakes():
    with pytest.raises(CheckFailed, match="dropped assignments are not sent"):
        check_dispatch_splits(lambda e, kept, E, ep: splits(e, np.ones_like(kept), E, ep))
    with pytest.raises(CheckFailed, match="contiguous blocks"):
        check_dispatch_splits(lambda e, kept, E, ep: [int(kept[e % ep == q].sum()) for q in range(ep)])
    with pytest.raises(CheckFailed, match="multiply by E"):
        check_aux_loss(lambda p, e: aux(p, e) / p.shape[1])
    with pytest.raises(CheckFailed, match="divide the counts by N k"):
        check_aux_loss(lambda p, e: aux(p, e) * e.shape[1])


def test_aux_without_minlength_is_caught_by_an_expert_nobody_chose():
    def short_count(probs, experts):  # np.bincount without minlength: one entry short when the last expert is idle
        E = probs.shape[1]
        f = np.bincount(experts.reshape(-1)) / experts.size
        return E * float((f * probs.mean(0)[: len(f)]).sum()) + (0.0 if len(f) == E else 1.0)

    with pytest.raises(CheckFailed, match=r"np.bincount\(\.\.\., minlength=E\)"):
        check_aux_loss(short_count)

    def broadcast_error(probs, experts):
        return probs.shape[1] * float((np.bincount(experts.reshape(-1)) / experts.size * probs.mean(0)).sum())

    with pytest.raises(CheckFailed, match=r"raised ValueError(.|\n)*minlength=E"):
        check_aux_loss(broadcast_error)
