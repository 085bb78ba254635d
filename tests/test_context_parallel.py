"""Context parallelism (chapter 17, lab 11): the online-softmax merge, ring attention, Ulysses.

The single-device attention is the oracle: every layout (cp 2 and 4, contiguous and zigzag,
causal or not, grouped-query heads) must give the same outputs and the same q, k, v gradients in
float64. The traffic must equal the closed forms of ``md.estimate``, the ring must hide its
transfers behind block compute when compute dominates, and zigzag must balance the causal work.
"""

import numpy as np
import pytest

import minidist as md
from minidist.autograd import cost
from minidist.autograd import functional as F
from minidist.nn import repeat_kv
from minidist.parallel.context.context_parallel import CPGroup, ring_attention, ulysses_attention
from minidist.parallel.context.online_softmax import (
    block_state,
    blockwise_attention,
    causal_relation,
    finalize,
    identity_state,
    merge,
)

TOL = dict(rtol=1e-11, atol=1e-12)


def _rand(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


# -- the merge -----------------------------------------------------------------------------
def _states(seed, n_blocks=3, tq=5, d=4, masked_rows=True):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, tq, d)) * 3  # large scores: the rescaling matters
    out = []
    for i in range(n_blocks):
        tk = int(rng.integers(1, 6))
        k, v = rng.normal(size=(2, tk, d)) * 3, rng.normal(size=(2, tk, d))
        mask = rng.random((tq, tk)) < 0.7
        if masked_rows and i == 0:
            mask[0] = False  # a query that sees nothing in this block
        out.append(((k, v, mask), block_state(q, k, v, 0.5, mask)))
    return q, out


def _close(a, b):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, **TOL)


@pytest.mark.parametrize("seed", range(6))
def test_merge_is_associative_and_commutative_with_identity(seed):
    _, blocks = _states(seed)
    a, b, c = (s for _, s in blocks)
    _close(merge(merge(a, b), c), merge(a, merge(b, c)))
    _close(merge(a, b), merge(b, a))
    e = identity_state(a.m.shape, a.o.shape[-1])
    _close(merge(e, a), a)
    _close(merge(a, e), a)
    assert np.isneginf(merge(e, e).m).all() and not np.isnan(merge(e, e).o).any()


@pytest.mark.parametrize("seed", range(4))
def test_merged_blocks_equal_softmax_over_the_concatenation(seed):
    q, blocks = _states(seed)
    k = np.concatenate([b[0][0] for b in blocks], axis=1)
    v = np.concatenate([b[0][1] for b in blocks], axis=1)
    mask = np.concatenate([b[0][2] for b in blocks], axis=1)
    for order in ([0, 1, 2], [2, 0, 1]):
        st = identity_state(q.shape[:-1], v.shape[-1])
        for i in order:
            st = merge(st, blocks[i][1])
        out, lse = finalize(st)
        x = np.where(mask, 0.5 * q @ np.swapaxes(k, -1, -2), -np.inf)
        ref_lse = np.log(np.exp(x).sum(-1))
        np.testing.assert_allclose(out, np.exp(x - ref_lse[..., None]) @ v, **TOL)
        np.testing.assert_allclose(lse, ref_lse, **TOL)


def test_causal_relation_classifies_blocks():
    assert causal_relation((0, 4), (4, 8)) == "skip"
    assert causal_relation((4, 8), (0, 4)) == "full"
    assert causal_relation((4, 8), (4, 5)) is not None and not isinstance(causal_relation((4, 8), (4, 8)), str)
    np.testing.assert_array_equal(causal_relation((2, 4), (2, 4)), [[True, False], [True, True]])
    assert causal_relation((3, 4), (0, 4)) == "full"  # the last key is the query itself


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 3, 16])
def test_blockwise_attention_equals_sdpa_with_gqa(causal, block):
    B, H, G, T, d = 2, 4, 2, 10, 8
    q, k, v = (md.tensor(_rand(i, B, h, T, d), requires_grad=True) for i, h in enumerate((H, G, G)))
    w = md.tensor(_rand(9, B, H, T, d))
    (blockwise_attention(q, k, v, block, causal) * w).sum().backward()
    got = [x.grad.copy() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), is_causal=causal)
    (ref * w).sum().backward()
    np.testing.assert_allclose(blockwise_attention(q, k, v, block, causal).data, ref.data, **TOL)
    for a, x in zip(got, (q, k, v)):
        np.testing.assert_allclose(a, x.grad, **TOL)


def test_blockwise_causal_skips_the_masked_blocks():
    names = []
    q, k, v = (md.tensor(_rand(i, 1, 2, 12, 4)) for i in range(3))
    previous = cost.set_cost_hook(lambda name, *a: names.append(name))
    try:
        blockwise_attention(q, k, v, 3, is_causal=True)
        causal = names.count("attention.block")
        names.clear()
        blockwise_attention(q, k, v, 3, is_causal=False)
        full = names.count("attention.block")
    finally:
        cost.set_cost_hook(previous)
    assert (causal, full) == (4 * 5 // 2, 16)  # n (n + 1) / 2 of the n^2 block pairs


# -- ring attention and Ulysses vs one device ----------------------------------------------
B, H, T, D = 2, 4, 16, 8


def _distributed(method, p, layout, causal, G=H):
    Q, K, V, W = _rand(1, B, H, T, D), _rand(2, B, G, T, D), _rand(3, B, G, T, D), _rand(4, B, H, T, D)

    def fn():
        cp = CPGroup.of(None, layout)
        pos = cp.positions(T)
        q, k, v = (md.tensor(np.ascontiguousarray(a[:, :, pos]), requires_grad=True) for a in (Q, K, V))
        attn = ring_attention if method == "ring" else ulysses_attention
        o = attn(q, k, v, cp, is_causal=causal)
        (o * md.tensor(W[:, :, pos])).sum().backward()
        return pos, o.data, q.grad, k.grad, v.grad

    res = md.launch(fn, world_size=p)
    q, k, v = (md.tensor(a, requires_grad=True) for a in (Q, K, V))
    o = F.scaled_dot_product_attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G), is_causal=causal)
    (o * md.tensor(W)).sum().backward()
    return res, (o.data, q.grad, k.grad, v.grad)


@pytest.mark.parametrize("method,layout", [("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous"),
                                           ("ulysses", "zigzag")])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_context_parallel_attention_equals_one_device(method, layout, p, causal):
    res, (o, gq, gk, gv) = _distributed(method, p, layout, causal)
    seen = np.zeros(T, int)
    for pos, oo, q_grad, k_grad, v_grad in res:
        seen[pos] += 1
        np.testing.assert_allclose(oo, o[:, :, pos], **TOL)
        for got, ref in ((q_grad, gq), (k_grad, gk), (v_grad, gv)):
            np.testing.assert_allclose(got, ref[:, :, pos], **TOL)
    assert (seen == 1).all()  # the layout is a partition of the sequence


@pytest.mark.parametrize("method,G,p", [("ring", 1, 4), ("ring", 2, 2), ("ulysses", 2, 4), ("ulysses", 2, 2)])
def test_grouped_query_heads(method, G, p):
    res, (o, gq, gk, gv) = _distributed(method, p, "zigzag", True, G=G)
    for pos, oo, q_grad, k_grad, v_grad in res:
        np.testing.assert_allclose(oo, o[:, :, pos], **TOL)
        np.testing.assert_allclose(q_grad, gq[:, :, pos], **TOL)
        np.testing.assert_allclose(k_grad, gk[:, :, pos], **TOL)
        np.testing.assert_allclose(v_grad, gv[:, :, pos], **TOL)


def test_layout_shard_unshard_and_errors():
    cp = CPGroup(size=4, rank=1, layout="zigzag", ranks=(0, 1, 2, 3))
    assert cp.chunks(16) == [(2, 4), (12, 14)]
    x = np.arange(32).reshape(2, 16)
    pieces = [CPGroup(size=4, rank=r, layout="zigzag", ranks=(0, 1, 2, 3)).shard(x) for r in range(4)]
    np.testing.assert_array_equal(cp.unshard(pieces), x)
    with pytest.raises(ValueError, match="seq_len=12 is not divisible into 8 chunks"):
        cp.chunks(12)
    with pytest.raises(ValueError, match="layout must be one of"):
        CPGroup(layout="spiral")
    q = md.tensor(np.zeros((1, 3, 4, 2)))
    with pytest.raises(ValueError, match="3 heads cannot be split over cp=2"):
        ulysses_attention(q, q, q, CPGroup(size=2, ranks=(0, 1)))
    with pytest.raises(ValueError, match="must be"):
        ring_attention(q, md.tensor(np.zeros((1, 3, 5, 2))), q, CPGroup())


# -- what it costs -------------------------------------------------------------------------
def _forward_cost(method, p, layout="contiguous", causal=True, cluster=None, G=H, backward=False):
    Q, K, V = _rand(1, B, H, T, D), _rand(2, B, G, T, D), _rand(3, B, G, T, D)

    def fn():
        cp = CPGroup.of(None, layout)
        pos = cp.positions(T)
        q, k, v = (md.tensor(np.ascontiguousarray(a[:, :, pos]), requires_grad=backward) for a in (Q, K, V))
        attn = ring_attention if method == "ring" else ulysses_attention
        t0 = md.dist.now()
        o = attn(q, k, v, cp, is_causal=causal)
        if backward:
            t1 = md.dist.now()
            o.sum().backward()
            return t1, md.dist.now()
        return t0, md.dist.now()

    return md.launch(fn, world_size=p, cluster=cluster)


@pytest.mark.parametrize("p", [2, 4])
def test_ring_forward_sends_the_closed_form(p):
    for G in (H, 1):
        res = _forward_cost("ring", p, G=G)
        sent = [sum(e.nbytes for e in res.trace.filter(rank=r, stream="link")) for r in range(p)]
        expected = md.estimate.cp_ring_bytes_per_layer(B, T, G * D, p, dtype_bytes=8)
        assert sent == [expected] * p
        assert len(res.trace.filter(rank=0, stream="link")) == p - 1  # K and V travel as one message per step


@pytest.mark.parametrize("p", [2, 4])
def test_ring_backward_rotates_kv_and_sends_gradients_home(p):
    res = _forward_cost("ring", p, backward=True)
    block = B * H * (T // p) * D * 8 * 2  # K and V of one rank
    for r in range(p):
        t1, t2 = res[r]
        sent = sum(e.nbytes for e in res.trace.filter(rank=r, stream="link") if e.start >= t1)
        assert sent == (p - 1) * block + p * block  # K/V go round once more; dK/dV make a full turn


@pytest.mark.parametrize("p", [2, 4])
def test_ulysses_forward_is_four_all_to_alls_of_the_closed_form(p):
    res = _forward_cost("ulysses", p)
    for r in range(p):
        sent = sum(e.nbytes for e in res.trace.filter(rank=r, stream="link"))
        assert sent == pytest.approx(md.estimate.ulysses_bytes_per_layer(B, T, H * D, p, dtype_bytes=8), rel=1e-12)
        assert len(res.trace.filter(rank=r, stream="comm", name="all_to_all")) == 4


def _block_compute(res, r):
    return [e for e in res.trace.filter(rank=r, stream="compute") if e.name == "attention.block"]


@pytest.mark.parametrize("p", [2, 4])
def test_ring_hides_transfers_when_compute_dominates(p):
    # Fast links: every transfer is shorter than the block it hides behind, so the forward takes
    # exactly its compute time (sum over steps of max(compute, transfer) = sum of compute).
    fast = md.Cluster.uniform(alpha=1e-9, beta=1e15)
    res = _forward_cost("ring", p, causal=False, cluster=fast)
    links = res.trace.filter(stream="link")
    for r in range(p):
        t0, t1 = res[r]
        busy = sum(e.duration for e in _block_compute(res, r))
        assert t1 - t0 == pytest.approx(busy, rel=1e-9)
        mine = [e for e in links if e.rank == r]
        assert mine and all(e.duration < busy / p for e in mine)
        # every transfer runs inside a block computation of the sending rank
        blocks = _block_compute(res, r)
        assert all(any(b.start <= e.start and e.end <= b.end for b in blocks) for e in mine)
    # Slow links: now the transfers set the pace, (p-1) of them, plus the last step's compute.
    slow = md.Cluster.uniform(alpha=1e-3, beta=1e9)
    res = _forward_cost("ring", p, causal=False, cluster=slow)
    nbytes = B * H * (T // p) * D * 8 * 2
    t0, t1 = res[0]
    last = _block_compute(res, 0)[-1].duration
    assert t1 - t0 == pytest.approx((p - 1) * (1e-3 + nbytes / 1e9) + last, rel=1e-9)


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    p = 4
    flops = {}
    for layout in ("contiguous", "zigzag"):
        res = _forward_cost("ring", p, layout=layout, causal=True)
        flops[layout] = [sum(e.flops for e in _block_compute(res, r)) for r in range(p)]
        if layout == "contiguous":  # rank r computes r + 1 of its p blocks, the rest are skipped
            assert [len(_block_compute(res, r)) for r in range(p)] == [1, 2, 3, 4]
        else:  # own step: 2 diagonal pairs and 1 full one; every other step: 2 full pairs
            assert [len(_block_compute(res, r)) for r in range(p)] == [2 * p + 1] * p
    c, z = flops["contiguous"], flops["zigzag"]
    assert c[-1] == pytest.approx(4 * c[0])
    assert max(z) == min(z)
    assert sum(z) == pytest.approx(sum(c) * (2 * p + 1) / (2 * (p + 1)))  # smaller blocks: less wasted diagonal
