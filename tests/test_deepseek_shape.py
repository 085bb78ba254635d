"""DeepSeek-V3's shape in minidist's GPT: latent attention with a query latent, head widths of their own and the
decoupled key (here unrotated: minidist has no rotary embedding), and dense layers before the expert layers.

Each piece equals a direct numpy computation from the module's own weights, and ``gpt_config`` builds the
published model (671B parameters, 37B active) from ``md.estimate.model("deepseek_v3")``.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.autograd.shape_only import building
from minidist.estimate import model
from minidist.nn import MLP, LatentSelfAttention, MoE
from minidist.nn.kv_cache import KVCache, kv_cache_bytes
from minidist.parallel.at_scale import active_params, gpt_config, model_flops_per_token

MLA = dict(q_latent=12, head_dim=6, v_head_dim=4, rope_dim=2)


def rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def lin(layer, x):
    return x @ layer.weight.data + (0 if layer.bias is None else layer.bias.data)


def mla_reference(att: LatentSelfAttention, x: np.ndarray) -> np.ndarray:
    """DeepSeek-V3's multi-head latent attention written out, without the rotation of the rope parts."""
    B, T, _ = x.shape
    H, d, r, dv = att.n_heads, att.head_dim, att.rope_dim, att.v_head_dim
    q = lin(att.w_uq, rms(lin(att.w_dq, x), att.q_norm.weight.data)).reshape(B, T, H, d + r)
    c = rms(lin(att.w_dkv, x), att.kv_norm.weight.data)
    k_nope = lin(att.w_uk, c).reshape(B, T, H, d)
    k_rope = np.broadcast_to(lin(att.w_kr, x)[:, :, None, :], (B, T, H, r))  # one per token, shared by the heads
    k = np.concatenate([k_nope, k_rope], -1)
    v = lin(att.w_uv, c).reshape(B, T, H, dv)
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d + r)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.einsum("bhts,bshd->bthd", p, v).reshape(B, T, H * dv)
    return lin(att.wo, y)


def test_latent_attention_with_query_latent_and_decoupled_key_equals_numpy():
    att = LatentSelfAttention(16, 4, 8, bias=False, rng=0, dtype="float64", **MLA)
    shapes = {n: p.shape for n, p in att.named_parameters()}
    assert shapes == {"w_dq.weight": (16, 12), "q_norm.weight": (12,), "w_uq.weight": (12, 4 * 8),
                      "w_dkv.weight": (16, 8), "w_kr.weight": (16, 2), "kv_norm.weight": (8,),
                      "w_uk.weight": (8, 4 * 6), "w_uv.weight": (8, 4 * 4), "wo.weight": (4 * 4, 16)}
    x = np.random.default_rng(1).normal(size=(2, 5, 16))
    for p in (att.q_norm.weight, att.kv_norm.weight):  # norms away from 1, so they count
        p.data = np.random.default_rng(2).uniform(0.5, 1.5, p.shape)
    y = att(md.tensor(x))
    np.testing.assert_allclose(y.data, mla_reference(att, x), rtol=1e-12, atol=1e-12)


def test_the_decoupled_key_gets_its_gradient():
    """The shared key's gradient sums over the heads that read it: central differences agree."""
    att = LatentSelfAttention(8, 2, 4, bias=True, rng=3, dtype="float64", rope_dim=2, head_dim=3)
    x = np.random.default_rng(4).normal(size=(1, 4, 8))
    att(md.tensor(x)).sum().backward()
    w, eps = att.w_kr.weight, 1e-6
    for i, j in ((0, 0), (5, 1)):
        old = w.data[i, j]
        w.data[i, j] = old + eps
        up = mla_reference_plain(att, x)
        w.data[i, j] = old - eps
        down = mla_reference_plain(att, x)
        w.data[i, j] = old
        assert w.grad[i, j] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9)


def mla_reference_plain(att, x):
    with md.no_grad():
        return float(att(md.tensor(x)).data.sum())


def test_decoding_with_a_cache_equals_the_full_forward():
    cfg = md.GPTConfig(vocab_size=32, seq_len=12, d_model=16, n_layers=2, n_heads=4, kv_latent=8, q_latent=12,
                       qk_head_dim=6, v_head_dim=4, rope_dim=2, mlp="swiglu", norm="rmsnorm", bias=False,
                       dtype="float64")
    gpt = md.nn.GPT(cfg, seed=0)
    prompt = np.array([[1, 2, 3]])
    assert (gpt.generate(prompt, 6, temperature=0) == gpt.generate(prompt, 6, temperature=0, cache=True)).all()
    kv = KVCache(cfg)
    with md.no_grad():
        gpt(prompt, cache=kv)
    assert kv.nbytes == kv_cache_bytes(cfg, 1, 3, 8) == 2 * 3 * (8 + 2) * 8  # the latent and the decoupled key


def test_the_first_layers_are_dense():
    cfg = md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=3, n_heads=2, n_experts=4, top_k=2, d_ff=8,
                       dense_layers=1, dense_d_ff=40, dtype="float64")
    gpt = md.nn.GPT(cfg, seed=0)
    assert isinstance(gpt.blocks[0].mlp, MLP) and gpt.blocks[0].mlp.fc1.weight.shape == (16, 40)
    assert all(isinstance(b.mlp, MoE) for b in gpt.blocks[1:]) and cfg.n_moe_layers == 2
    x = np.random.default_rng(0).normal(size=(2, 8, 16))
    mlp = gpt.blocks[0].mlp
    h = lin(mlp.fc1, x)
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    np.testing.assert_allclose(mlp(md.tensor(x)).data, lin(mlp.fc2, gelu), rtol=1e-12, atol=1e-12)
    _, loss = gpt(np.zeros((2, 8), int), np.zeros((2, 8), int))
    loss.backward()
    assert np.isfinite(loss.data)
    with pytest.raises(ValueError, match="dense_layers"):
        md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=3, n_heads=2, dense_layers=1)
    with pytest.raises(ValueError, match="need kv_latent"):
        md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=3, n_heads=2, rope_dim=2)


def test_gpt_config_builds_deepseek_v3():
    cfg = gpt_config(model("deepseek_v3"))
    assert (cfg.n_layers, cfg.dense_layers, cfg.dense_d_ff, cfg.d_ff, cfg.n_experts, cfg.top_k, cfg.shared_expert) \
        == (61, 3, 18432, 2048, 256, 8, True)
    assert (cfg.d_model, cfg.n_heads, cfg.kv_latent, cfg.q_latent, cfg.qk_head_dim, cfg.v_head_dim, cfg.rope_dim) \
        == (7168, 128, 512, 1536, 128, 128, 64)
    with building():
        gpt = md.nn.GPT(cfg)
    n = sum(p.data.size for p in gpt.parameters())
    # the report's 671B (main model, without the multi-token prediction module) plus learned positions; 37B active
    assert n == pytest.approx(671e9, rel=1e-3)
    assert active_params(cfg, n) == pytest.approx(37e9, rel=0.03)
    # attention's score and value products count the heads' own widths: 6 s L H (192 + 128) per token
    six_n, with_attention = model_flops_per_token(cfg, n)
    assert with_attention - six_n == 6 * 4096 * 61 * 128 * (128 + 64 + 128)
