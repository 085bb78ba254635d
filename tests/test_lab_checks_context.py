"""Lab 11 checks accept a right answer and reject the usual mistakes with the intended hint."""

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.context_checks import check_cp_volumes, check_ring_attention, check_softmax_merge
from minidist.parallel.context.online_softmax import block_state, finalize


def good_merge(a, b):
    m = np.maximum(a[0], b[0])
    mf = np.where(np.isneginf(m), 0.0, m)
    ca, cb = np.exp(a[0] - mf), np.exp(b[0] - mf)
    return m, a[1] * ca + b[1] * cb, a[2] * ca[..., None] + b[2] * cb[..., None]


def naive_merge(a, b):  # nan when both maxima are -inf
    m = np.maximum(a[0], b[0])
    with np.errstate(invalid="ignore"):  # that nan is the mistake the check must catch
        ca, cb = np.exp(a[0] - m), np.exp(b[0] - m)
    return m, a[1] * ca + b[1] * cb, a[2] * ca[..., None] + b[2] * cb[..., None]


def unscaled_o(a, b):
    m, s, _ = good_merge(a, b)
    return m, s, a[2] + b[2]


def test_merge_check_accepts_and_rejects(capsys):
    check_softmax_merge(good_merge)
    assert "ok: merge: 3 random cases" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="exp\\(-inf - \\(-inf\\)\\) is nan"):
        check_softmax_merge(naive_merge)
    with pytest.raises(CheckFailed, match="o is rescaled by the same factors"):
        check_softmax_merge(unscaled_o)
    with pytest.raises(CheckFailed, match="not done yet"):
        check_softmax_merge(lambda a, b: (_ for _ in ()).throw(NotImplementedError()))


def _ring(q, k, v, overlap=True, extra_send=False, rotate=True):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    d = k.shape[-1]
    kv = np.concatenate([k, v], axis=-1)
    spare = np.empty_like(kv)
    state = None
    for t in range(p):
        last = t == p - 1 and not extra_send
        works = []
        if rotate and not last:
            if overlap:
                works = [md.dist.isend(kv, (r + 1) % p), md.dist.irecv(spare, (r - 1) % p)]
            else:
                h = md.dist.isend(kv, (r + 1) % p)
                md.dist.recv(spare, (r - 1) % p)
                h.wait()
        st = block_state(q, kv[..., :d], kv[..., d:], 1 / math.sqrt(d))
        state = st if state is None else good_merge(state, st)
        for w in works:
            w.wait()
        if rotate and not last:
            kv, spare = spare, kv
    return finalize(type(st)(*state))[0]


def test_ring_check_accepts_and_rejects(capsys):
    check_ring_attention(_ring)
    assert "ok: my_ring_attention" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="only attends to this rank's own keys"):
        check_ring_attention(lambda q, k, v: _ring(q, k, v, rotate=False))
    with pytest.raises(CheckFailed, match="does not hide its transfers"):
        check_ring_attention(lambda q, k, v: _ring(q, k, v, overlap=False))
    with pytest.raises(CheckFailed, match="wrong"):
        check_ring_attention(lambda q, k, v: _ring(q, k, v, extra_send=True))


def test_volume_check_accepts_and_rejects(capsys):
    def ring(b, s, h, p, sz):
        return 2 * (p - 1) / p * b * s * h * sz

    def uly(b, s, h, p, sz):
        return 4 * (p - 1) * b * s * h * sz / p**2

    check_cp_volumes(ring, uly)
    assert capsys.readouterr().out.count("ok:") == 2
    with pytest.raises(CheckFailed, match="both K and V travel"):
        check_cp_volumes(lambda b, s, h, p, sz: ring(b, s, h, p, sz) / 2, uly)
    with pytest.raises(CheckFailed, match="not passed on"):
        check_cp_volumes(lambda b, s, h, p, sz: 2 * b * s * h * sz, uly)
    with pytest.raises(CheckFailed, match="divide by p\\^2"):
        check_cp_volumes(ring, lambda b, s, h, p, sz: uly(b, s, h, p, sz) * p)
