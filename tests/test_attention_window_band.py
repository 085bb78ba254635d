"""Sliding-window attention on the band: O(T w) kept, not O(T^2).

Query i attends to keys i - w + 1 .. i only, so causal self-attention with ``window=w < T`` computes and keeps
the band (..., T, w) of scores instead of the (..., T, T) square. The band must give what the masked square
gives (outputs and the gradients of q, k and v, float64, to 1e-12) for every (T, w), with batch and head
broadcasting as the model uses them; w >= T, a cache's shapes and an ``attn_mask`` keep the square. The
ledger then shows it: a small GPT's activation bytes grow linearly in the sequence length at a fixed window,
and quadratically without one, exactly by the probabilities the band leaves out.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.autograd import cost as _cost
from minidist.parallel import Backend, ParallelConfig
from tests.gradcheck import gradcheck

sdpa = md.nn.functional.scaled_dot_product_attention


def square(q, k, v, window):
    """The reference: the full (T, T) scores under an explicit boolean mask (the square's path)."""
    T = q.shape[-2]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return sdpa(q, k, v, attn_mask=(j <= i) & (j > i - window))


def run(fn, qd, kd, vd, g):
    q, k, v = (md.tensor(a, requires_grad=True) for a in (qd, kd, vd))
    out = fn(q, k, v)
    (out * md.tensor(g)).sum().backward()
    return out.data, q.grad, k.grad, v.grad


SHAPES = {  # q, k (v has dv = 3 columns): heads of their own, k and v shared by the heads, no batch at all
    "B,H": ((2, 3), (2, 3)),
    "shared kv": ((2, 4), (2, 1)),
    "2-D": ((), ()),
    "k without batch": ((3,), ()),
}


@pytest.mark.parametrize("T,window", [(2, 1), (6, 1), (6, 2), (6, 5), (9, 4), (16, 3), (16, 15), (31, 8)])
@pytest.mark.parametrize("shapes", list(SHAPES.values()), ids=list(SHAPES))
def test_the_band_gives_what_the_masked_square_gives(T, window, shapes):
    qb, kb = shapes
    rng = np.random.default_rng(T * 100 + window)
    qd, kd, vd = rng.standard_normal(qb + (T, 4)), rng.standard_normal(kb + (T, 4)), rng.standard_normal(kb + (T, 3))
    g = rng.standard_normal(np.broadcast_shapes(qb, kb) + (T, 3))
    band = run(lambda q, k, v: sdpa(q, k, v, is_causal=True, window=window), qd, kd, vd, g)
    ref = run(lambda q, k, v: square(q, k, v, window), qd, kd, vd, g)
    for name, a, b in zip(("out", "dq", "dk", "dv"), band, ref):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=name)


def test_grouped_query_heads_in_the_model_match_the_square():
    """The model's GQA core repeats each kv head for its group: the band's gradients flow back through it."""
    B, H, G, T, hd, w = 2, 4, 2, 10, 3, 4
    rng = np.random.default_rng(0)
    qd, kd, vd = rng.standard_normal((B, H, T, hd)), rng.standard_normal((B, G, T, hd)), rng.standard_normal(
        (B, G, T, hd))
    g = rng.standard_normal((B, H, T, hd))
    band = run(lambda q, k, v: md.nn.attention.causal_attention(q, k, v, window=w), qd, kd, vd, g)
    rep = md.nn.attention.repeat_kv
    ref = run(lambda q, k, v: square(q, rep(k, H // G), rep(v, H // G), w), qd, kd, vd, g)
    for a, b in zip(band, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("window", [1, 3])
def test_the_band_against_central_differences(window):
    rng = np.random.default_rng(window)
    q, k = md.tensor(rng.standard_normal((2, 2, 7, 3)), requires_grad=True), md.tensor(
        rng.standard_normal((2, 1, 7, 3)), requires_grad=True)
    v = md.tensor(rng.standard_normal((2, 1, 7, 2)), requires_grad=True)
    gradcheck(lambda q, k, v: sdpa(q, k, v, is_causal=True, window=window), q, k, v)


def charged(fn):
    """(name, flops, bytes) of every op ``fn`` charges."""
    log = []
    with _cost.cost_hook(lambda name, flops, nbytes, dtype: log.append((name, flops, nbytes))):
        fn()
    return log


def test_the_band_is_charged_t_w_pairs_and_a_window_of_t_or_more_is_the_square():
    rng = np.random.default_rng(1)
    T, d = 12, 4
    q, k, v = (md.tensor(rng.standard_normal((2, T, d)), requires_grad=True) for _ in range(3))
    dense = charged(lambda: sdpa(q, k, v, is_causal=True))[0][1]
    full = sdpa(q, k, v, is_causal=True).data
    for w in (T, T + 1, 100):  # no band narrower than the square: the square's path, bit for bit
        assert np.array_equal(sdpa(q, k, v, is_causal=True, window=w).data, full)
        assert charged(lambda w=w: sdpa(q, k, v, is_causal=True, window=w))[0][1] == dense
    for w in (1, 5, T - 1):
        log = charged(lambda w=w: sdpa(q, k, v, is_causal=True, window=w).sum().backward())
        forward, backward = (f for name, f, _ in log if name.startswith("scaled_dot_product_attention"))
        assert forward == dense * w / T  # T w pairs instead of T^2: the charge scales by w / T
        assert backward == (2 * 2 * T * w * (2 * d + 2 * d) + 4 * 2 * T * w)


def test_cached_and_masked_calls_keep_the_square():
    """Fewer queries than keys (a cache) or an explicit mask: the square with the window's mask, as before."""
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
    t = md.tensor
    got = sdpa(t(q), t(k), t(v), is_causal=True, window=2).data  # top-left: query i sees keys i-1, i
    i, j = np.arange(3)[:, None], np.arange(8)[None, :]
    ref = sdpa(t(q), t(k), t(v), attn_mask=(j <= i) & (j > i - 2)).data
    np.testing.assert_array_equal(got, ref)
    mask = np.ones((8, 8), bool)
    qq = rng.standard_normal((8, 4))
    masked = sdpa(t(qq), t(k), t(v), is_causal=True, window=2, attn_mask=mask).data
    np.testing.assert_allclose(masked, sdpa(t(qq), t(k), t(v), is_causal=True, window=2).data, rtol=0, atol=1e-12)


def test_the_band_refuses_batches_that_do_not_broadcast():
    x, y = md.tensor(np.zeros((2, 5, 4))), md.tensor(np.zeros((3, 5, 4)))
    with pytest.raises(ValueError, match="batch dimensions of q"):
        sdpa(x, y, y, is_causal=True, window=2)


# ---------------------------------------------------------------- the ledger


def activations(seq_len, window):
    cfg = md.GPTConfig(vocab_size=48, seq_len=seq_len, d_model=16, n_layers=2, n_heads=2, dtype="float64",
                       window=window)
    return md.parallel.train(cfg, ParallelConfig(), steps=1, global_batch=1, backend="inprocess").memory[0][
        "activations"]


def test_the_ledgers_activations_grow_linearly_with_a_window_and_quadratically_without():
    S, w = 32, 8
    windowed = [activations(n, w) for n in (S, 2 * S, 4 * S)]
    full = [activations(n, None) for n in (S, 2 * S, 4 * S)]
    second = lambda a: a[2] - 3 * a[1] + 2 * a[0]  # noqa: E731  zero for c0 + c1 S, 6 c2 S^2 for c2 S^2
    assert second(windowed) == 0
    probs = 2 * 2 * 8  # the square's probabilities: layers x heads x float64 bytes per (query, key) pair
    assert second(full) == 6 * probs * S**2
    for n, a, b in zip((S, 2 * S, 4 * S), windowed, full):  # the band keeps T w pairs instead of T^2
        assert b - a == probs * (n * n - n * w)


def test_a_windowed_model_runs_shape_only_and_measures_what_the_data_run_measures():
    cfg = md.GPTConfig(vocab_size=48, seq_len=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, window=5)
    for pc in (ParallelConfig(), ParallelConfig(tp=2, recompute="full")):
        data = md.parallel.train(cfg, pc, steps=2, global_batch=2)
        shapes = md.parallel.train(cfg, pc, steps=2, global_batch=2, backend=Backend("inprocess", shape_only=True))
        assert shapes.time == pytest.approx(data.time, rel=1e-12, abs=0)
        assert shapes.memory == data.memory and shapes.peak_breakdown == data.peak_breakdown
        assert all(np.isnan(shapes.losses)) and np.isfinite(data.losses).all()
