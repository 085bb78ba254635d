"""Fused kernels that run block by block (``fused.blockwise``): the result must not depend on the
block size, bitwise, whether the blocks divide the array or not, and non-contiguous inputs must
take the whole-array path."""

import numpy as np
import pytest

import minidist as md
from minidist.autograd import functional as F
from minidist.autograd import fused
from tests.gradcheck import gradcheck

rng = np.random.default_rng(11)


def run(op, x, g):
    """Output and input gradient of ``op`` at ``x`` for output gradient ``g``."""
    t = md.tensor(x, requires_grad=True)
    y = op(t)
    y.backward(g)
    return y.data, t.grad


def test_blockwise_visits_every_element_once_in_aligned_pieces(monkeypatch):
    monkeypatch.setattr(fused, "BLOCK", 7)
    a, b = np.arange(30.0).reshape(5, 6), np.zeros((5, 6))
    sizes = []

    def kernel(x, out):
        sizes.append(x.size)
        np.add(x, 1, out=out)

    fused.blockwise(kernel, a, b)
    assert sizes == [7, 7, 7, 7, 2]
    np.testing.assert_array_equal(b, a + 1)
    sizes.clear()
    fused.blockwise(kernel, a.T, b.T)  # not C-contiguous: one call on the whole arrays
    assert sizes == [30]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gelu_is_bitwise_independent_of_the_block_size(monkeypatch, dtype, layout):
    x = (rng.standard_normal((6, 50)) * 3).astype(dtype)
    g = rng.standard_normal((6, 50)).astype(dtype)
    if layout == "transposed":
        x, g = x.T, g.T
    whole = run(F.gelu, x, g)
    for block in (1, 7, 64, 299):
        monkeypatch.setattr(fused, "BLOCK", block)
        for got, want in zip(run(F.gelu, x, g), whole):
            np.testing.assert_array_equal(got, want)
        with md.no_grad():  # without a graph the derivative is not computed; the output is the same
            np.testing.assert_array_equal(F.gelu(md.tensor(x)).data, whole[0])


def test_gelu_gradient_with_small_blocks(monkeypatch):
    monkeypatch.setattr(fused, "BLOCK", 3)
    gradcheck(F.gelu, md.tensor(rng.standard_normal((4, 5)) * 2, requires_grad=True))


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_adamw_step_is_bitwise_independent_of_the_block_size(monkeypatch, decay):
    from minidist.optim import adamw_update_

    p0 = rng.standard_normal((37, 11)).astype(np.float32)
    g = rng.standard_normal((37, 11)).astype(np.float32)
    m0, v0 = rng.standard_normal((37, 11)).astype(np.float32), rng.random((37, 11)).astype(np.float32)

    def steps():
        p, m, v = p0.copy(), m0.copy(), v0.copy()
        for t in (1, 2, 3):
            adamw_update_(p, g, m, v, t, lr=1e-2, weight_decay=decay)
        return p, m, v

    whole = steps()
    for block in (1, 5, 100):
        monkeypatch.setattr(fused, "BLOCK", block)
        for got, want in zip(steps(), whole):
            np.testing.assert_array_equal(got, want)
