"""Faster ways to compute the same numbers: each is checked bitwise against the plain numpy it replaces."""

import numpy as np
import pytest

import minidist as md
from minidist.autograd import functional as F
from minidist.autograd.engine import scatter_add

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
