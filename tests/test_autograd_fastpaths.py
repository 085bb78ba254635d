"""Faster ways to compute the same numbers: each is checked bitwise against the plain numpy it replaces."""

import numpy as np
import pytest

import minidist as md
from minidist.autograd import functional as F
from minidist.autograd.engine import scatter_add
from tests.gradcheck import gradcheck

rng = np.random.default_rng(5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_of_rows_equals_add_at_bitwise(dtype):
    index = rng.integers(-7, 7, (5, 40))  # many repeats, negative indices count from the end
    value = rng.standard_normal((5, 40, 3, 4)).astype(dtype)
    start = rng.standard_normal((7, 3, 4)).astype(dtype)  # a buffer that already holds a contribution
    want, got = start.copy(), start.copy()
    np.add.at(want, index, value)
    scatter_add(got, index, value)
    np.testing.assert_array_equal(got, want)


def test_scatter_add_other_indices_fall_back_to_add_at():
    buf = np.zeros((4, 6))
    scatter_add(buf.T, [0, 0, 5], np.ones((3, 4)))  # a list, into a non-contiguous buffer
    np.testing.assert_array_equal(buf[:, 0], 2.0)
    np.testing.assert_array_equal(buf[:, 5], 1.0)
    with pytest.raises(IndexError):
        scatter_add(np.zeros((4, 2)), np.array([4]), np.ones((1, 2)))
    with pytest.raises(IndexError):
        scatter_add(np.zeros((4, 2)), np.array([-5]), np.ones((1, 2)))


def test_embedding_gradient_counts_every_occurrence():
    w = md.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    ids = np.array([[0, 4, 0], [4, 4, 1]])
    g = rng.standard_normal((2, 3, 3))
    F.embedding(ids, w).backward(g)
    want = np.zeros((5, 3))
    np.add.at(want, ids, g)
    np.testing.assert_array_equal(w.grad, want)


@pytest.mark.parametrize("vecdot", [True, False])
def test_rowdot_with_and_without_numpy_vecdot(monkeypatch, vecdot):
    from minidist.autograd import fused

    if not vecdot:
        monkeypatch.setattr(fused, "_vecdot", None)  # numpy < 2: einsum
    a, b = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    np.testing.assert_allclose(fused.rowdot(a, b), (a * b).sum(-1), rtol=1e-13)
    x = md.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w, bias = (md.tensor(rng.standard_normal(4), requires_grad=True) for _ in range(2))
    gradcheck(F.layer_norm, x, w, bias)


def test_unbroadcast_of_a_bias_is_the_sum_over_leading_axes():
    from minidist.autograd.tensor import unbroadcast

    g = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for shape in [(5,), (4, 5), (1, 5), (3, 1, 5)]:
        want = g.sum(axis=tuple(range(g.ndim - len(shape))), keepdims=True)
        want = want.sum(axis=tuple(i for i, n in enumerate(want.shape) if i >= g.ndim - len(shape) and
                                   shape[i - (g.ndim - len(shape))] == 1), keepdims=True).reshape(shape)
        np.testing.assert_allclose(unbroadcast(g, shape), want, rtol=1e-5, atol=1e-6)
    assert unbroadcast(g.T, (2,)).shape == (2,)  # a non-contiguous gradient takes numpy's sum
