"""Attention architectures of chapter 31a: sliding-window attention, multi-head latent attention (MLA) and the
KV cache that decodes with them.

Sliding window and MLA against dense numpy references (outputs and gradients, float64); the KV cache
reproduces the full forward's logits token by token and holds exactly the bytes of the closed form; the
parallel layouts either train like one device or are refused by name.
"""

import pickle

import numpy as np
import pytest

import minidist as md
from minidist import nn
from minidist.parallel import ParallelConfig, train
from tests.gradcheck import gradcheck
from tests.test_nn import lin, module_gradcheck, x64

F64 = "float64"


def tiny(**kw):
    base = dict(vocab_size=13, seq_len=12, d_model=16, n_layers=2, n_heads=4, dtype=F64)
    base.update(kw)
    return nn.GPTConfig(**base)


def window_mask(T, window):
    """(T, T) True where query i may attend key j: i - window < j <= i (None: j <= i)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= i) & ((j > i - window) if window is not None else True)


def attention_numpy(q, k, v, mask):
    """softmax(q k^T / sqrt(d) masked) v and its backward for an upstream gradient, in plain numpy."""
    sc = 1 / np.sqrt(q.shape[-1])
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) * sc, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)

    def backward(g):
        dv = np.swapaxes(p, -1, -2) @ g
        dp = g @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        return ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, dv

    return p @ v, backward


def attend_heads(q, k, v, n_heads, n_kv, mask):
    """Grouped-query attention on projected q (B, T, H*hd), k, v (B, T, G*hd), head by head, under ``mask``."""
    hd = q.shape[-1] // n_heads
    out = np.zeros_like(q)
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        qs, ks = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
        out[..., qs] = attention_numpy(q[..., qs], k[..., ks], v[..., ks], mask)[0]
    return out


# ---------------------------------------------------------------- sliding window: the core


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_sliding_window_output_and_gradients_match_dense_reference(window):
    rng = np.random.default_rng(window)
    B, H, T, d = 2, 3, 7, 4
    qd, kd, vd, g = (rng.standard_normal((B, H, T, d)) for _ in range(4))
    q, k, v = (md.tensor(a.copy(), requires_grad=True) for a in (qd, kd, vd))
    out = md.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, window=window)
    ref, backward = attention_numpy(qd, kd, vd, window_mask(T, window))
    np.testing.assert_allclose(out.data, ref, rtol=1e-12, atol=1e-13)
    (out * md.tensor(g)).sum().backward()
    for got, want in zip((q.grad, k.grad, v.grad), backward(g)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # and against central differences, every element
    gradcheck(lambda q, k, v: md.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, window=window),
              *(md.tensor(a[:1, :1], requires_grad=True) for a in (qd, kd, vd)))


def test_window_of_the_sequence_length_or_more_is_full_causal_attention_exactly():
    rng = np.random.default_rng(0)
    q, k, v = (md.tensor(rng.standard_normal((2, 2, 6, 4))) for _ in range(3))
    sdpa = md.nn.functional.scaled_dot_product_attention
    full = sdpa(q, k, v, is_causal=True).data
    for window in (6, 7, 100):
        assert np.array_equal(sdpa(q, k, v, is_causal=True, window=window).data, full)
    assert not np.allclose(sdpa(q, k, v, is_causal=True, window=5).data, full)
    idx = rng.integers(0, 13, (2, 12))
    logits = nn.GPT(tiny(), seed=1)(idx)[0].data
    assert np.array_equal(nn.GPT(tiny(window=12), seed=1)(idx)[0].data, logits)


def test_window_is_validated_by_name():
    x = md.tensor(np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="scaled_dot_product_attention: window needs is_causal"):
        md.nn.functional.scaled_dot_product_attention(x, x, x, window=2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="GPTConfig: window must be None or an int >= 1"):
            tiny(window=bad)
    with pytest.raises(ValueError, match="CausalSelfAttention: window"):
        nn.CausalSelfAttention(8, 2, window=0)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_windowed_attention_composes_with_grouped_query_heads(n_kv):
    m = nn.CausalSelfAttention(8, 4, n_kv, rng=0, dtype=F64, window=2)
    x = x64(2, 5, 8)
    ref = lin(m.wo, attend_heads(lin(m.wq, x.data), lin(m.wk, x.data), lin(m.wv, x.data), 4, n_kv, window_mask(5, 2)))
    np.testing.assert_allclose(m(x).data, ref, rtol=1e-10, atol=1e-12)
    module_gradcheck(m, x)
    assert "window=2" in repr(m)


def test_gpt_with_a_window_trains():
    cfg = tiny(window=3, n_kv_heads=2)
    model = nn.GPT(cfg, seed=0)
    assert all(b.attn.window == 3 for b in model.blocks)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2)
    x = np.random.default_rng(0).integers(0, 13, (4, 12))
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        losses.append(float(loss.data))
    assert losses[-1] < 0.8 * losses[0], losses
    pickle.loads(pickle.dumps(model))  # the windowed core is a partial of a module-level function


# ---------------------------------------------------------------- multi-head latent attention


def latent_reference(m, x, mask):
    c = lin(m.w_dkv, x)
    return lin(m.wo, attend_heads(lin(m.wq, x), lin(m.w_uk, c), lin(m.w_uv, c), m.n_heads, m.n_heads, mask))


@pytest.mark.parametrize("window", [None, 2])
def test_latent_attention_matches_numpy_and_gradients(window):
    m = nn.LatentSelfAttention(8, 2, 3, rng=0, dtype=F64, window=window)
    x = x64(2, 5, 8)
    np.testing.assert_allclose(m(x).data, latent_reference(m, x.data, window_mask(5, window)), rtol=1e-10,
                               atol=1e-12)
    module_gradcheck(m, x)


def test_gpt_picks_latent_attention_and_counts_its_parameters():
    d, c, L, V, T = 16, 6, 2, 13, 12
    cfg = tiny(kv_latent=c)
    model = nn.GPT(cfg, seed=0)
    assert all(isinstance(b.attn, nn.LatentSelfAttention) for b in model.blocks)
    attn = (d * d + d) * 2 + (d * c + c) + 2 * (c * d + d)  # wq, wo; w_dkv; w_uk, w_uv
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    norms = 2 * 2 * d
    assert model.num_parameters() == V * d + T * d + L * (attn + mlp + norms) + 2 * d + d * V
    dense = nn.GPT(tiny(), seed=0).num_parameters()
    assert dense - model.num_parameters() == L * ((2 * d * d + 2 * d) - (3 * c * d + c + 2 * d))


def test_kv_latent_is_validated_by_name():
    with pytest.raises(ValueError, match="GPTConfig: kv_latent must be None or an int >= 1"):
        tiny(kv_latent=0)
    with pytest.raises(ValueError, match=r"n_kv_heads \(2\) must equal n_heads \(4\)"):
        tiny(kv_latent=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="LatentSelfAttention: kv_latent"):
        nn.LatentSelfAttention(8, 2, 0)


def test_the_key_up_projection_can_be_absorbed_into_the_query():
    # the docstring's inference trick: q . (c_kv W_uk) = (q W_uk^T) . c_kv for every head
    m = nn.LatentSelfAttention(8, 2, 3, bias=False, rng=0, dtype=F64)
    x = np.random.default_rng(1).standard_normal((5, 8))
    q, c = x @ m.wq.weight.data, x @ m.w_dkv.weight.data
    w_uk = m.w_uk.weight.data
    for h in range(2):
        cols = slice(4 * h, 4 * h + 4)
        np.testing.assert_allclose(q[:, cols] @ (c @ w_uk[:, cols]).T, (q[:, cols] @ w_uk[:, cols].T) @ c.T,
                                   rtol=1e-12)


# ---------------------------------------------------------------- the KV cache

VARIANTS = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "mla": dict(kv_latent=6),
    "window": dict(window=3),
    "window_gqa": dict(window=4, n_kv_heads=2),
    "window_mla": dict(window=3, kv_latent=5),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_decoding_with_the_cache_reproduces_the_full_forward(name):
    cfg = tiny(**VARIANTS[name])
    model = nn.GPT(cfg, seed=1)
    idx = np.random.default_rng(0).integers(0, 13, (2, 12))
    with md.no_grad():
        full = model(idx)[0].data
        cache = nn.KVCache(cfg)
        for t in range(12):
            step = model(idx[:, t:t + 1], cache=cache)[0].data
            np.testing.assert_allclose(step[:, 0], full[:, t], rtol=0, atol=1e-10, err_msg=f"position {t}")
            assert cache.position == t + 1
            assert cache.nbytes == nn.kv_cache_bytes(cfg, 2, t + 1, 8)
        # a prompt of several tokens at once, longer than the window, then the rest
        cache = nn.KVCache(cfg)
        first, rest = model(idx[:, :7], cache=cache)[0].data, model(idx[:, 7:], cache=cache)[0].data
    np.testing.assert_allclose(np.concatenate([first, rest], 1), full, rtol=0, atol=1e-10)


# numbers cached per token and layer: K and V of n_kv_heads heads of head_dim 4, or the latent
PER_TOKEN = {"mha": 2 * 4 * 4, "gqa": 2 * 2 * 4, "mqa": 2 * 1 * 4, "mla": 6, "window": 2 * 4 * 4,
             "window_gqa": 2 * 2 * 4, "window_mla": 5}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cache_bytes_measured_in_float32_equal_the_closed_form(name):
    cfg = tiny(**VARIANTS[name], dtype="float32")
    model, cache, B = nn.GPT(cfg, seed=0), nn.KVCache(cfg), 3
    window = cfg.window or cfg.seq_len
    with md.no_grad():
        for t in range(1, cfg.seq_len + 1):
            model(np.full((B, 1), t % 13), cache=cache)
            closed = cfg.n_layers * B * min(t, window) * PER_TOKEN[name] * 4
            assert cache.nbytes == nn.kv_cache_bytes(cfg, B, t, 4) == closed, f"{t} tokens"


def test_a_windowed_cache_stops_growing_at_the_window():
    cfg = tiny(window=3, n_kv_heads=2)
    model = nn.GPT(cfg, seed=0)
    cache = nn.KVCache(cfg)
    sizes = []
    with md.no_grad():
        for t in range(10):
            model(np.full((1, 1), t % 13), cache=cache)
            sizes.append(cache.nbytes)
    assert sizes[:3] == [nn.kv_cache_bytes(cfg, 1, t, 8) for t in (1, 2, 3)] and sizes[0] < sizes[1] < sizes[2]
    assert set(sizes[2:]) == {sizes[2]}
    assert all(len(layer) == 3 and layer.start == 7 for layer in cache.layers)


def test_kv_cache_bytes_agrees_with_the_estimator():
    gqa, mla, win = tiny(n_kv_heads=2), tiny(kv_latent=6), tiny(window=5)
    assert nn.kv_cache_bytes(gqa, 3, 10, 2) == md.estimate.kv_cache_bytes(10, 2, 2, 4, batch=3, bytes_per_elem=2)
    assert nn.kv_cache_bytes(mla, 3, 10, 2) == md.estimate.mla_kv_cache_bytes(10, 2, 6, batch=3, bytes_per_elem=2)
    assert nn.kv_cache_bytes(win, 3, 10, 2) == md.estimate.kv_cache_bytes(10, 2, 4, 4, batch=3, bytes_per_elem=2,
                                                                          window=5)
    with pytest.raises(ValueError, match="kv_cache_bytes: tokens"):
        nn.kv_cache_bytes(gqa, 1, -1, 2)


@pytest.mark.parametrize("name", ["gqa", "mla", "window"])
def test_generate_with_the_cache_gives_the_same_tokens(name):
    model = nn.GPT(tiny(**VARIANTS[name]), seed=2)
    start = np.array([[1, 2, 3], [4, 5, 6]])
    greedy = model.generate(start, 9, temperature=0)
    np.testing.assert_array_equal(model.generate(start, 9, temperature=0, cache=True), greedy)
    np.testing.assert_array_equal(model.generate(start, 9, rng=3, cache=True), model.generate(start, 9, rng=3))
    assert model.training


def test_cache_errors_are_clear():
    cfg = tiny()
    model = nn.GPT(cfg, seed=0)
    with pytest.raises(ValueError, match="must fit in config.seq_len=12"):
        model.generate(np.zeros((1, 4), np.int64), 10, cache=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        model(np.zeros((1, 2), np.int64), cache=nn.KVCache(cfg))
    with md.no_grad():
        cache = nn.KVCache(cfg)
        model(np.zeros((1, 10), np.int64), cache=cache)
        with pytest.raises(ValueError, match="3 token.* after 10 cached exceeds config.seq_len=12"):
            model(np.zeros((1, 3), np.int64), cache=cache)
    with pytest.raises(ValueError, match="capacity_factor=None"):
        nn.KVCache(tiny(n_experts=2, top_k=1, capacity_factor=1.0))


# ---------------------------------------------------------------- parallel layouts and the estimator

PCFG = dict(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=4)
WINDOWED = md.GPTConfig(**PCFG, n_kv_heads=2, window=3)
LATENT = md.GPTConfig(**PCFG, kv_latent=6)


def assert_same_run(cfg, pc):
    ref = train(cfg, ParallelConfig(), steps=2, global_batch=4)
    got = train(cfg, pc, steps=2, global_batch=4)
    np.testing.assert_allclose(got.losses, ref.losses, rtol=0, atol=1e-10)
    assert set(got.grads) == set(ref.grads)
    for key in ref.grads:
        np.testing.assert_allclose(got.grads[key], ref.grads[key], rtol=0, atol=1e-10, err_msg=key)


@pytest.mark.parametrize("cfg,pc", [
    (WINDOWED, ParallelConfig(tp=2)),
    (WINDOWED, ParallelConfig(tp=2, sequence_parallel=True, recompute="selective")),
    (LATENT, ParallelConfig(dp=2)),
    (LATENT, ParallelConfig(pp=2, microbatches=2)),
    (LATENT, ParallelConfig(cp=2)),  # the latent is per token: a cp rank projects its own positions
], ids=["window-tp2", "window-tp2-sp-selective", "mla-dp2", "mla-pp2", "mla-cp2"])
def test_layouts_that_compose_train_like_one_device(cfg, pc):
    assert_same_run(cfg, pc)


@pytest.mark.parametrize("cfg,pc,match", [
    (WINDOWED, ParallelConfig(cp=2), "ring and Ulysses attention implement the full causal mask only"),
    (WINDOWED, ParallelConfig(cp=2, cp_method="ulysses"), "sliding-window attention .window=3. does not compose"),
    (LATENT, ParallelConfig(tp=2), "latent attention .kv_latent=6. does not compose with tensor parallelism"),
    (LATENT, ParallelConfig(sequence_parallel=True), "w_dkv"),
])
def test_unimplemented_attention_layouts_are_refused(cfg, pc, match):
    with pytest.raises(ValueError, match=match):
        train(cfg, pc, steps=1, global_batch=4)


def test_parallelizing_directly_refuses_too():
    from minidist.parallel.context.context_parallel import context_parallelize
    from minidist.parallel.tensor.tensor_parallel_model import tensor_parallelize

    with pytest.raises(ValueError, match="context_parallelize: the model uses sliding-window attention"):
        context_parallelize(nn.GPT(WINDOWED), cp=None)
    with pytest.raises(ValueError, match="tensor_parallelize: latent attention"):
        tensor_parallelize(nn.GPT(LATENT), tp=None)


def test_the_estimator_refuses_what_it_does_not_model():
    from minidist.estimate import predict_train

    with pytest.raises(ValueError, match="not modelled yet: sliding-window attention"):
        predict_train(md.GPTConfig(**PCFG, window=3), ParallelConfig(), 4)
    with pytest.raises(ValueError, match=r"not modelled yet: latent attention \(kv_latent\)"):
        predict_train(LATENT, ParallelConfig(), 4)
