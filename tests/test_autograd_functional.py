"""Fused functional ops (one node each, hand-written backward): central differences, reference
values computed with plain numpy, and the semantics other layers rely on; plus custom Functions
and recomputation."""

import math

import numpy as np
import pytest

import minidist as md
from minidist.autograd import Function, checkpoint, cost
from minidist.autograd import functional as F
from tests.gradcheck import gradcheck

rng = np.random.default_rng(7)


def leaf(*shape, scale=1.0):
    return md.tensor(rng.standard_normal(shape) * scale, requires_grad=True)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------------------- gradient checks
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
    x = leaf(2, 3, 4)
    gradcheck(lambda a: F.softmax(a, axis), x)
    gradcheck(lambda a: F.log_softmax(a, axis), x)
    np.testing.assert_allclose(F.softmax(x, axis).data, np_softmax(x.data, axis), rtol=1e-12)
    np.testing.assert_allclose(F.log_softmax(x, axis).data, np.log(np_softmax(x.data, axis)), rtol=1e-10)


def test_softmax_is_stable_for_large_inputs():
    x = md.tensor(np.array([1000.0, 1001.0, -1000.0]))
    assert np.all(np.isfinite(F.softmax(x).data)) and np.all(np.isfinite(F.log_softmax(x).data))


@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm(affine):
    x = leaf(2, 3, 5)
    w = leaf(5) if affine != "none" else None
    b = leaf(5) if affine == "both" else None
    inputs = [t for t in (x, w, b) if t is not None]
    gradcheck(lambda *t: F.layer_norm(t[0], *(list(t[1:]) + [None] * (3 - len(t)))), *inputs)
    mu, var = x.data.mean(-1, keepdims=True), x.data.var(-1, keepdims=True)
    want = (x.data - mu) / np.sqrt(var + 1e-5)
    if w is not None:
        want = want * w.data
    if b is not None:
        want = want + b.data
    np.testing.assert_allclose(F.layer_norm(x, w, b).data, want, rtol=1e-12)


def test_rms_norm():
    x, w = leaf(3, 4, 6), leaf(6)
    gradcheck(F.rms_norm, x, w)
    gradcheck(lambda a: F.rms_norm(a, None), x)
    want = x.data / np.sqrt((x.data ** 2).mean(-1, keepdims=True) + 1e-6) * w.data
    np.testing.assert_allclose(F.rms_norm(x, w).data, want, rtol=1e-12)


def test_norm_weight_shape_error():
    with pytest.raises(ValueError, match=r"layer_norm.*\(4,\).*\(2, 5\)"):
        F.layer_norm(leaf(2, 5), leaf(4))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(approximate):
    x = leaf(4, 5, scale=2)
    gradcheck(lambda a: F.gelu(a, approximate=approximate), x)
    d = x.data
    if approximate == "tanh":
        want = 0.5 * d * (1 + np.tanh(math.sqrt(2 / math.pi) * (d + 0.044715 * d ** 3)))
    else:
        want = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in d.ravel()]).reshape(d.shape)
    np.testing.assert_allclose(F.gelu(x, approximate).data, want, rtol=1e-12)


def test_silu_relu_sigmoid_tanh():
    x = leaf(3, 4, scale=3)
    for f in (F.silu, F.sigmoid, F.tanh):
        gradcheck(f, x)
    np.testing.assert_allclose(F.silu(x).data, x.data / (1 + np.exp(-x.data)), rtol=1e-12)
    np.testing.assert_allclose(F.sigmoid(md.tensor(np.array([-800.0, 0.0, 800.0]))).data, [0, 0.5, 1])
    np.testing.assert_array_equal(F.relu(x).data, np.maximum(x.data, 0))


def test_embedding_with_repeated_ids():
    w = leaf(5, 3)
    ids = np.array([[0, 2, 2], [4, 0, 2]])
    gradcheck(lambda t: F.embedding(ids, t), w)
    np.testing.assert_array_equal(F.embedding(md.tensor(ids), w).data, w.data[ids])
    with pytest.raises(IndexError, match="embedding"):
        F.embedding(np.array([5]), w)


def np_cross_entropy(x, t, ignore_index=-100):
    logp = np.log(np_softmax(x))
    keep = t != ignore_index
    return -(np.take_along_axis(logp, np.where(keep, t, 0)[..., None], -1)[..., 0]) * keep, keep


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    x = leaf(2, 3, 7)
    t = rng.integers(0, 7, size=(2, 3))
    t[0, 1] = -100
    gradcheck(lambda a: F.cross_entropy(a, t, reduction=reduction), x)
    losses, keep = np_cross_entropy(x.data, t)
    want = {"mean": losses.sum() / keep.sum(), "sum": losses.sum(), "none": losses}[reduction]
    np.testing.assert_allclose(F.cross_entropy(x, md.tensor(t), reduction=reduction).data, want, rtol=1e-12)


def test_cross_entropy_custom_ignore_index_and_errors():
    x = leaf(4, 5)
    t = np.array([1, 3, 3, 0])
    got = F.cross_entropy(x, t, ignore_index=3)
    losses, keep = np_cross_entropy(x.data, t, ignore_index=3)
    np.testing.assert_allclose(got.data, losses.sum() / 2)
    with pytest.raises(ValueError, match=r"cross_entropy.*\(4, 5\).*\(3,\)"):
        F.cross_entropy(x, np.array([1, 2, 3]))
    with pytest.raises(IndexError):
        F.cross_entropy(x, np.array([1, 2, 3, 5]))


def test_cross_entropy_float32_stays_float32():
    x = md.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    loss = F.cross_entropy(x, np.array([0, 1, 2]))
    loss.backward()
    assert loss.dtype == np.float32 and x.grad.dtype == np.float32


def test_dropout_seeded_and_scaled():
    x = leaf(50, 40)
    a = F.dropout(x, 0.3, rng=11)
    b = F.dropout(x, 0.3, rng=11)
    c = F.dropout(x, 0.3, rng=12)
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)
    kept = a.data != 0
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_allclose(a.data[kept], x.data[kept] / 0.7)
    gradcheck(lambda t: F.dropout(t, 0.3, rng=5), x)
    assert F.dropout(x, 0.3, training=False) is x and F.dropout(x, 0.0) is x
    np.testing.assert_array_equal(F.dropout(x, 1.0).data, 0)
    g = np.random.default_rng(3)
    assert not np.array_equal(F.dropout(x, 0.5, rng=g).data, F.dropout(x, 0.5, rng=g).data)


def test_where_and_masked_fill():
    a, b = leaf(3, 4), leaf(4)
    cond = rng.random((3, 4)) > 0.5
    gradcheck(lambda p, q: F.where(cond, p, q), a, b)
    gradcheck(lambda p: F.where(cond, p, 0.0), a)
    np.testing.assert_array_equal(F.where(cond, a, b).data, np.where(cond, a.data, b.data))
    gradcheck(lambda p: F.masked_fill(p, cond, -5.0), a)
    gradcheck(lambda p: p.masked_fill(md.tensor(cond[0]), 2.0), a)
    np.testing.assert_array_equal(F.masked_fill(a, cond, 7.0).data, np.where(cond, 7.0, a.data))
    with pytest.raises(TypeError, match="boolean"):
        F.where(np.ones(3), a, b)


def np_attention(q, k, v, causal=False, mask=None, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    return np_softmax(s) @ v


@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 6), (6, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention(tq, tk, causal):
    q, k, v = leaf(2, 2, tq, 4), leaf(2, 2, tk, 4), leaf(2, 2, tk, 3)
    f = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    gradcheck(f, q, k, v)
    np.testing.assert_allclose(f(q, k, v).data, np_attention(q.data, k.data, v.data, causal), rtol=1e-10)


def test_attention_causal_is_top_left():
    # with Tq < Tk, query 0 sees key 0 only (top-left), not the first Tk - Tq + 1 keys (bottom-right)
    q, k = md.tensor(rng.standard_normal((2, 4))), md.tensor(rng.standard_normal((4, 4)))
    v = md.tensor(np.eye(4))
    p = F.scaled_dot_product_attention(q, k, v, is_causal=True).data
    np.testing.assert_allclose(p[0], [1, 0, 0, 0], atol=1e-15)
    assert p[1, 2] == 0 and p[1, 3] == 0 and p[1, 1] > 0


def test_attention_masks_scale_and_broadcast_heads():
    q, k, v = leaf(2, 3, 5, 4), leaf(2, 1, 5, 4), leaf(2, 1, 5, 4)  # one k/v head shared by 3 query heads
    bool_mask = rng.random((5, 5)) > 0.3
    np.fill_diagonal(bool_mask, True)
    add_mask = rng.standard_normal((5, 5))
    for mask in (bool_mask, add_mask):
        f = lambda a, b, c, m=mask: F.scaled_dot_product_attention(a, b, c, attn_mask=m, scale=0.3)  # noqa: E731
        gradcheck(f, q, k, v)
        np.testing.assert_allclose(f(q, k, v).data, np_attention(q.data, k.data, v.data, mask=mask, scale=0.3),
                                   rtol=1e-10)
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        F.scaled_dot_product_attention(leaf(2, 5, 4), leaf(2, 5, 3), leaf(2, 5, 3))


def test_cat_stack_split():
    a, b, c = leaf(2, 3), leaf(2, 1), leaf(2, 2)
    gradcheck(lambda *t: F.cat(t, axis=1), a, b, c)
    gradcheck(lambda *t: F.concatenate(t, axis=-1), a, b, c)
    np.testing.assert_array_equal(F.cat([a, b], 1).data, np.concatenate([a.data, b.data], 1))
    d = leaf(2, 3)
    gradcheck(lambda *t: F.stack(t, axis=1), a, d)
    gradcheck(lambda *t: F.stack(t, axis=-1), a, d)
    x = leaf(2, 6)
    gradcheck(lambda t: F.cat([p * (i + 1) for i, p in enumerate(F.split(t, 3, axis=1))], 0), x)
    gradcheck(lambda t: F.split(t, [1, 5], axis=-1)[1], x)  # unused pieces get zero gradient
    assert [p.shape for p in F.split(x, [1, 2, 3], axis=1)] == [(2, 1), (2, 2), (2, 3)]
    with pytest.raises(ValueError, match="split"):
        F.split(x, 4, axis=1)
    with pytest.raises(ValueError, match="cat"):
        F.cat([a, leaf(3, 3)], axis=1)


def test_matmul_in_functional():
    a, b = leaf(3, 4), leaf(4, 2)
    gradcheck(F.matmul, a, b)


def test_fused_ops_are_single_nodes_and_report_costs():
    x = leaf(2, 4, 8)
    w, b = leaf(8), leaf(8)
    names = []
    with cost.cost_hook(lambda name, *rest: names.append(name)):
        y = F.layer_norm(x, w, b)
        loss = F.cross_entropy(F.gelu(y), np.zeros((2, 4), dtype=np.int64))
        loss.backward()
    assert names == ["layer_norm", "gelu", "cross_entropy", "cross_entropy.backward", "gelu.backward",
                     "layer_norm.backward"]
    assert y._parents == ()  # freed, and it had exactly one node


# ---------------------------------------------------------------------------- custom functions
class MulAdd(Function):
    @staticmethod
    def forward(ctx, x, y, alpha):
        ctx.save_for_backward(x, y)
        ctx.alpha = alpha
        return x.data * y.data + alpha

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x, None


class SumAndDiff(Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + y, x - y

    @staticmethod
    def backward(ctx, gs, gd):
        return gs + gd, gs.data - gd.data


def test_function_apply_custom_op():
    x, y = leaf(3, 2), leaf(3, 2)
    out = MulAdd.apply(x, y, 2.0)
    assert out.grad_fn == "MulAdd"
    np.testing.assert_allclose(out.data, x.data * y.data + 2)
    gradcheck(lambda a, b: MulAdd.apply(a, b, 2.0), x, y)
    gradcheck(lambda a, b: MulAdd.apply(a, b, 0.0) * a, x, y)
    with md.no_grad():
        assert not MulAdd.apply(x, y, 1.0).requires_grad


def test_function_with_two_outputs_and_unused_output():
    x, y = leaf(4), leaf(4)
    gradcheck(lambda a, b: SumAndDiff.apply(a, b)[0] * SumAndDiff.apply(a, b)[1], x, y)
    x.grad = y.grad = None
    s, _ = SumAndDiff.apply(x, y)
    s.sum().backward()  # the difference output received no gradient: backward sees zeros
    np.testing.assert_allclose(x.grad, 1)
    np.testing.assert_allclose(y.grad, 1)


def test_function_identity_forward_allreduce_style_backward():
    calls = []

    class CopyToParallel(Function):  # tensor parallelism's f: identity forward, reduce in backward
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            calls.append(g.shape)
            g.data *= 2  # stands in for an in-place all-reduce over 2 ranks
            return g

    x = leaf(3)
    y = CopyToParallel.apply(x)
    assert y is not x and y.data is x.data
    z = y + 1
    z.sum().backward()  # add hands the same gradient array to y and to nobody else...
    np.testing.assert_allclose(x.grad, 2)
    assert calls == [(3,)]
    a, b = leaf(3), leaf(3)
    shared = a + CopyToParallel.apply(b)  # ...here the same array flows to a and into the Function
    shared.sum().backward()
    np.testing.assert_allclose(a.grad, 1)  # the in-place doubling did not leak into a's gradient
    np.testing.assert_allclose(b.grad, 2)


# ---------------------------------------------------------------------------- recomputation
def _block(params, seed_dropout):
    w1, b1, w2, g = params

    def fn(h):
        h = F.layer_norm(h, g, None)
        h = F.gelu(h @ w1 + b1)
        h = F.dropout(h, 0.2, rng=seed_dropout)
        return h @ w2

    return fn


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpoint_gradients_equal_plain_run_exactly(dtype):
    def make():
        r = np.random.default_rng(0)
        ps = [r.standard_normal((8, 16)), r.standard_normal(16), r.standard_normal((16, 8)), r.standard_normal(8)]
        return [md.tensor(p.astype(dtype), requires_grad=True) for p in ps]

    x0 = np.random.default_rng(1).standard_normal((4, 5, 8)).astype(dtype)
    results = []
    for use_checkpoint in (False, True):
        md.autograd.manual_seed(123)
        layers = [make() for _ in range(3)]
        x = md.tensor(x0, requires_grad=True)
        h = x
        for i, ps in enumerate(layers):
            fn = _block(ps, seed_dropout=None if i == 1 else 100 + i)  # layer 1 uses the default generator
            h = checkpoint(fn, h) if use_checkpoint else fn(h)
        F.cross_entropy(h, np.zeros((4, 5), dtype=np.int64)).backward()
        results.append([x.grad] + [p.grad for ps in layers for p in ps])
    for plain, ckpt in zip(*results):
        np.testing.assert_array_equal(plain, ckpt)


def test_checkpoint_keeps_no_intermediates_and_reruns_forward():
    calls = []
    w = leaf(4, 4)

    def fn(h):
        calls.append(md.is_grad_enabled())
        return (h @ w).tanh() @ w

    x = md.tensor(rng.standard_normal((2, 4)))  # the input itself does not require grad
    y = checkpoint(fn, x)
    assert y._parents == ()  # nothing recorded inside: only the inputs are kept
    y.sum().backward()
    assert calls == [False, True]
    w2 = md.tensor(w.data, requires_grad=True)
    (((x @ w2).tanh()) @ w2).sum().backward()
    np.testing.assert_array_equal(w.grad, w2.grad)


def test_checkpoint_multiple_outputs_and_gradcheck():
    w = leaf(3, 3)
    gradcheck(lambda a, b: checkpoint(lambda p, q: ((p @ q).tanh(), p * 2), a, b)[0].exp(), leaf(2, 3), w)
    a = leaf(2, 3)
    u, v = checkpoint(lambda p: (p.exp(), p * 3), a)
    (u.sum() + v.sum()).backward()
    np.testing.assert_allclose(a.grad, np.exp(a.data) + 3)
    with md.no_grad():
        assert not checkpoint(lambda p: p * 2, a).requires_grad
    a.grad = None
    checkpoint(lambda p, scale=1.0: p * scale, a, scale=5.0).sum().backward()
    np.testing.assert_allclose(a.grad, 5.0)
