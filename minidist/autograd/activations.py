"""Smooth activations fused into one node: GELU (tanh or erf form) and SiLU."""

from __future__ import annotations

import math

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import ops
from minidist.autograd.fused import blockwise, needs_grad, record
from minidist.autograd.ops import TRANSCENDENTAL
from minidist.autograd.tensor import Tensor, as_tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715
_erf = np.frompyfunc(math.erf, 1, 1)


# The tanh form as in-place kernels on one block (see ``fused.blockwise``): every pass writes into
# a buffer that already exists, and on a cache-sized block the next pass finds it in cache.
def _gelu_tanh(x: np.ndarray, y: np.ndarray, d: np.ndarray | None = None) -> None:
    """y = x h with h = (1 + t) / 2 and t = tanh(c (x + a x^3)); and, if asked, d = dy/dx."""
    x2 = x * x  # scratch of one block, like t
    t = x2 * (_GELU_A * _SQRT_2_OVER_PI)
    t += _SQRT_2_OVER_PI
    t *= x
    np.tanh(t, out=t)
    np.multiply(t, 0.5, out=y)
    y += 0.5  # h, exactly (1 + t) * 0.5 since halving is exact
    if d is not None:
        # dy/dx = h + x (1 - t^2) c (1 + 3 a x^2) / 2 = h (1 + (1 - t) x c (1 + 3 a x^2))
        x2 *= 3 * _GELU_A * _SQRT_2_OVER_PI
        x2 += _SQRT_2_OVER_PI
        x2 *= x
        np.subtract(1, t, out=d)
        d *= x2
        d += 1
        d *= y
    y *= x


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """x * Phi(x). ``"tanh"``: GPT-2's tanh approximation; ``"none"``: the exact erf form.

    numpy has no vectorised erf, so ``"none"`` evaluates ``math.erf`` per element: exact but slow.
    """
    x = as_tensor(x)
    xd = x.data
    if approximate == "tanh":
        # The backward keeps the local derivative dy/dx, computed here while t = tanh(...) of the
        # block is still in cache: the backward is then one multiply instead of a dozen passes.
        # It takes the memory of t, which the backward would otherwise need.
        y = np.empty_like(xd, order="C")  # a shape-only input gives a shape-only output
        if needs_grad(x):
            dydx = np.empty_like(xd, order="C")
            blockwise(_gelu_tanh, xd, y, dydx)
        else:
            blockwise(_gelu_tanh, xd, y)
    elif approximate == "none":
        cdf = (0.5 * (1.0 + _erf(xd / math.sqrt(2.0)).astype(np.float64))).astype(xd.dtype)
        y = xd * cdf
    else:
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    if _cost._hook is not None:
        _cost.charge("gelu", (TRANSCENDENTAL + 7) * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("gelu.backward", 10 * g.size, 3 * g.nbytes, g.dtype)
        if approximate == "tanh":
            return ((dydx * g).astype(xd.dtype, copy=False),)
        d = cdf + xd * (np.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi))
        d *= g
        return (d.astype(xd.dtype, copy=False),)

    return record(y, (x,), grads, "gelu")


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) (a.k.a. swish), used by SwiGLU MLPs."""
    x = as_tensor(x)
    xd = x.data
    s = ops._sigmoid(xd)
    y = xd * s
    if _cost._hook is not None:
        _cost.charge("silu", (TRANSCENDENTAL + 3) * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("silu.backward", 5 * g.size, 3 * g.nbytes, g.dtype)
        return (g * (s * (1 + xd * (1 - s))),)

    return record(y, (x,), grads, "silu")
