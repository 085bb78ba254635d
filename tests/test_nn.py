"""nn layers: forward against direct numpy, gradients against central differences (float64)."""

import numpy as np
import pytest

import minidist as md
from minidist import nn
from tests.gradcheck import gradcheck

F64 = "float64"


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1 + np.exp(-x))


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * w
    return y + b if b is not None else y


def rms_norm(x, w, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def attend(q, k, v, n_heads, n_kv):
    """Grouped-query causal attention on projected q (B,T,H*hd), k and v (B,T,G*hd), head by head."""
    B, T, d = q.shape
    hd = d // n_heads
    out = np.zeros((B, T, d))
    mask = np.tril(np.ones((T, T), bool))
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        s = q[..., h * hd:(h + 1) * hd] @ k[..., g * hd:(g + 1) * hd].transpose(0, 2, 1) / np.sqrt(hd)
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[..., h * hd:(h + 1) * hd] = p @ v[..., g * hd:(g + 1) * hd]
    return out


def attention_ref(m, x):
    return lin(m.wo, attend(lin(m.wq, x), lin(m.wk, x), lin(m.wv, x), m.n_heads, m.n_kv_heads))


def lin(m, x):
    y = x @ m.weight.data
    return y + m.bias.data if m.bias is not None else y


def numeric_gradcheck(loss_fn, tensors, n_entries=6, h=1e-6, rtol=1e-5, atol=1e-8, seed=0):
    """Compare the autograd gradient of a scalar loss_fn() with central differences at a few sampled
    entries of each tensor (for models too big for tests.gradcheck's every-element check)."""
    for t in tensors:
        t.grad = None
    loss_fn().backward()
    rng = np.random.default_rng(seed)
    for t in tensors:
        assert t.grad is not None, "no gradient reached a tensor"
        analytic = t.grad.copy()
        flat = t.data.reshape(-1)
        for i in rng.choice(flat.size, size=min(n_entries, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + h
            fp = float(loss_fn().data)
            flat[i] = old - h
            fm = float(loss_fn().data)
            flat[i] = old
            num = (fp - fm) / (2 * h)
            assert abs(num - analytic.reshape(-1)[i]) <= atol + rtol * abs(num), (
                f"entry {i} of a {t.shape} tensor: numeric {num}, analytic {analytic.reshape(-1)[i]}")


def module_gradcheck(m, x):
    """Every element of the input and of every parameter against central differences (tests/gradcheck.py)."""
    gradcheck(lambda x, *params: m(x), x, *m.parameters())


def x64(*shape, seed=2):
    return md.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


# ---------------------------------------------------------------- forward against numpy


def test_linear_forward_layout_and_grad():
    m = nn.Linear(5, 3, rng=0, dtype=F64)
    assert m.weight.shape == (5, 3) and m.bias.shape == (3,)
    x = x64(2, 4, 5)
    np.testing.assert_allclose(m(x).data, x.data @ m.weight.data + m.bias.data, rtol=1e-12)
    module_gradcheck(m, x)
    nb = nn.Linear(5, 3, bias=False, rng=0)
    assert nb.bias is None and [n for n, _ in nb.named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="in_features=5"):
        m(x64(2, 4))


def test_embedding_forward_and_grad():
    m = nn.Embedding(7, 4, rng=0, dtype=F64)
    ids = np.array([[1, 3, 3], [6, 0, 1]])
    np.testing.assert_array_equal(m(ids).data, m.weight.data[ids])
    gradcheck(lambda w: m(ids), m.weight)
    with pytest.raises(IndexError, match=r"\[0, 7\)"):
        m(np.array([[7]]))


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_forward_and_grad(bias):
    m = nn.LayerNorm(6, bias=bias, dtype=F64)
    rng = np.random.default_rng(3)
    m.weight.data[:] = rng.standard_normal(6)
    if bias:
        m.bias.data[:] = rng.standard_normal(6)
    x = x64(3, 6)
    np.testing.assert_allclose(m(x).data, layer_norm(x.data, m.weight.data, m.bias.data if bias else None),
                               rtol=1e-10, atol=1e-12)
    module_gradcheck(m, x)


def test_rmsnorm_forward_and_grad():
    m = nn.RMSNorm(6, dtype=F64)
    m.weight.data[:] = np.random.default_rng(3).standard_normal(6)
    x = x64(2, 3, 6)
    np.testing.assert_allclose(m(x).data, rms_norm(x.data, m.weight.data), rtol=1e-10)
    module_gradcheck(m, x)


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_mlp_forward_and_grad(kind):
    m = nn.MLP(4, 8, kind, rng=0, dtype=F64)
    x = x64(2, 3, 4)
    if kind == "gelu":
        expected = lin(m.fc2, gelu_tanh(lin(m.fc1, x.data)))
    else:
        expected = lin(m.w_down, silu(lin(m.w_gate, x.data)) * lin(m.w_up, x.data))
    np.testing.assert_allclose(m(x).data, expected, rtol=1e-10)
    module_gradcheck(m, x)
    with pytest.raises(ValueError, match="kind"):
        nn.MLP(4, 8, "relu")


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (4, 1)])
def test_attention_forward_and_grad(n_heads, n_kv):
    m = nn.CausalSelfAttention(8, n_heads, n_kv, rng=0, dtype=F64)
    assert m.wk.weight.shape == (8, 8 // n_heads * n_kv)
    x = x64(2, 5, 8)
    np.testing.assert_allclose(m(x).data, attention_ref(m, x.data), rtol=1e-10, atol=1e-12)
    module_gradcheck(m, x)


def test_attention_is_causal():
    m = nn.CausalSelfAttention(8, 2, rng=0, dtype=F64)
    x = np.random.default_rng(0).standard_normal((1, 6, 8))
    y = m(md.tensor(x)).data
    x2 = x.copy()
    x2[0, 4:] += 10.0  # change the future
    y2 = m(md.tensor(x2)).data
    np.testing.assert_allclose(y[0, :4], y2[0, :4], rtol=1e-12)
    assert not np.allclose(y[0, 4:], y2[0, 4:])


def test_attention_bad_heads():
    with pytest.raises(ValueError, match="n_heads"):
        nn.CausalSelfAttention(10, 4)
    with pytest.raises(ValueError, match="n_kv_heads"):
        nn.CausalSelfAttention(8, 4, 3)


@pytest.mark.parametrize("mlp,norm", [("gelu", "layernorm"), ("swiglu", "rmsnorm")])
def test_block_forward_and_grad(mlp, norm):
    cfg = nn.GPTConfig(vocab_size=11, seq_len=8, d_model=8, n_layers=1, n_heads=4, n_kv_heads=2, mlp=mlp,
                       norm=norm, dtype=F64)
    b = nn.Block(cfg, np.random.default_rng(0))
    for p in b.parameters():  # non-trivial norm weights so every parameter matters
        if p.ndim == 1:
            p.data[:] = np.random.default_rng(p.size).standard_normal(p.shape)
    x = x64(2, 5, 8)

    def norm_ref(mod, v):
        return layer_norm(v, mod.weight.data, mod.bias.data) if norm == "layernorm" else rms_norm(v, mod.weight.data)

    if mlp == "gelu":
        ff = lambda v: lin(b.mlp.fc2, gelu_tanh(lin(b.mlp.fc1, v)))  # noqa: E731
    else:
        ff = lambda v: lin(b.mlp.w_down, silu(lin(b.mlp.w_gate, v)) * lin(b.mlp.w_up, v))  # noqa: E731

    h = x.data + attention_ref(b.attn, norm_ref(b.ln1, x.data))
    expected = h + ff(norm_ref(b.ln2, h))
    np.testing.assert_allclose(b(x).data, expected, rtol=1e-9, atol=1e-11)
    module_gradcheck(b, x)


def test_dropout_train_and_eval():
    d = nn.Dropout(0.5, rng=0)
    x = md.tensor(np.ones((200, 50)))
    y = d(x).data
    assert set(np.unique(y)) <= {0.0, 2.0}
    assert 0.4 < (y == 0).mean() < 0.6
    d.eval()
    assert d(x) is x
    with pytest.raises(ValueError):
        nn.Dropout(1.0)


def _linear_from(weight, bias):
    m = nn.Linear(*weight.shape, bias=bias is not None, dtype=weight.dtype)
    m.weight.data[...] = weight
    if bias is not None:
        m.bias.data[...] = bias
    return m


@pytest.mark.parametrize("n_kv", [4, 2])
def test_attention_splits_by_heads_for_tensor_parallelism(n_kv):
    # The layout promise that tensor parallelism relies on: give each of 2 ranks a contiguous block of
    # query heads (columns of wq), the kv heads they read (columns of wk, wv) and the matching rows of wo;
    # the sum of the two partial outputs is the full output.
    d, H, tp = 8, 4, 2
    full = nn.CausalSelfAttention(d, H, n_kv, rng=0, dtype=F64)
    x = x64(2, 5, d)
    hd, q_cols, kv_cols = d // H, d // tp, n_kv * (d // H) // tp
    total = 0
    for r in range(tp):
        qs, ks = slice(r * q_cols, (r + 1) * q_cols), slice(r * kv_cols, (r + 1) * kv_cols)
        shard = nn.CausalSelfAttention(d, H, n_kv, dtype=F64)
        shard.wq = _linear_from(full.wq.weight.data[:, qs], full.wq.bias.data[qs])
        shard.wk = _linear_from(full.wk.weight.data[:, ks], full.wk.bias.data[ks])
        shard.wv = _linear_from(full.wv.weight.data[:, ks], full.wv.bias.data[ks])
        # The output bias is added once, after the sum (by rank 0 here).
        shard.wo = _linear_from(full.wo.weight.data[qs, :], full.wo.bias.data if r == 0 else np.zeros(d))
        assert shard.wq.weight.shape == (d, H // tp * hd)
        total = total + shard(x).data
    np.testing.assert_allclose(total, full(x).data, rtol=1e-10, atol=1e-12)


def test_nn_functional_is_the_autograd_functional():
    for name in ("softmax", "log_softmax", "layer_norm", "rms_norm", "gelu", "silu", "cross_entropy",
                 "scaled_dot_product_attention", "embedding", "dropout"):
        assert getattr(md.nn.functional, name) is getattr(md.autograd.functional, name)
