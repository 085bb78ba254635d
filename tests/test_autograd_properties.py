"""Property-based tests (hypothesis): for random broadcastable shape pairs, every binary op's
forward equals numpy's, each gradient has its input's shape and equals the numeric gradient
summed over the broadcast dimensions."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidist as md
from minidist.autograd import functional as F
from tests.gradcheck import gradcheck

OPS = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power),
}

shape_pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3)


def values(shape, seed, positive=False):
    v = np.random.default_rng(seed).standard_normal(shape)
    return np.abs(v) + 0.5 if positive else v


@settings(max_examples=60, deadline=None)
@given(shapes=shape_pairs, op=st.sampled_from(sorted(OPS)), seed=st.integers(0, 2**16))
def test_binary_broadcasting_matches_numpy_and_central_differences(shapes, op, seed):
    (sa, sb), _ = shapes
    f, ref = OPS[op]
    a = md.tensor(values(sa, seed, positive=True), requires_grad=True)
    b = md.tensor(values(sb, seed + 1, positive=True), requires_grad=True)
    np.testing.assert_allclose(f(a, b).data, ref(a.data, b.data), rtol=1e-13)
    gradcheck(f, a, b)
    assert a.grad.shape == sa and b.grad.shape == sb


@settings(max_examples=30, deadline=None)
@given(batch=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3),
       m=st.integers(1, 3), k=st.integers(1, 3), n=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_batched_matmul_broadcasting(batch, m, k, n, seed):
    (ba, bb), _ = batch
    a = md.tensor(values(ba + (m, k), seed), requires_grad=True)
    b = md.tensor(values(bb + (k, n), seed + 1), requires_grad=True)
    np.testing.assert_allclose((a @ b).data, a.data @ b.data, rtol=1e-12)
    gradcheck(lambda x, y: x @ y, a, b)


@settings(max_examples=30, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), seed=st.integers(0, 2**16), data=st.data())
def test_reductions_and_softmax_on_random_shapes(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdims = data.draw(st.booleans())
    x = md.tensor(values(shape, seed), requires_grad=True)
    for name in ("sum", "mean", "max", "var"):
        got = getattr(x, name)(axis=axis, keepdims=keepdims)
        np.testing.assert_allclose(got.data, getattr(np, name)(x.data, axis=axis, keepdims=keepdims), rtol=1e-12)
        gradcheck(lambda t, name=name: getattr(t, name)(axis=axis, keepdims=keepdims), x)
    gradcheck(lambda t: F.softmax(t, axis), x)
    gradcheck(lambda t: F.log_softmax(t, axis), x)
