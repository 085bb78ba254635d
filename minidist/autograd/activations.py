"""Smooth activations fused into one node: GELU (tanh or erf form) and SiLU."""

from __future__ import annotations

import math

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import ops
from minidist.autograd.fused import record
from minidist.autograd.ops import TRANSCENDENTAL
from minidist.autograd.tensor import Tensor, as_tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """x * Phi(x). ``"tanh"``: GPT-2's tanh approximation; ``"none"``: the exact erf form.

    numpy has no vectorised erf, so ``"none"`` evaluates ``math.erf`` per element: exact but slow.
    """
    x = as_tensor(x)
    xd = x.data
    if approximate == "tanh":
        # t = tanh(c (x + a x^3)), y = x (1 + t) / 2; written in place: each pass over a large
        # activation costs as much as the arithmetic
        t = xd * xd
        t *= _GELU_A * _SQRT_2_OVER_PI
        t += _SQRT_2_OVER_PI
        t *= xd
        np.tanh(t, out=t)
        y = t + 1
        y *= xd
        y *= 0.5
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
            # dy/dx = (1 + t)/2 + (1 - t^2) * c x (1 + 3 a x^2) / 2
            d = t * t
            np.subtract(1, d, out=d)
            w = xd * xd
            w *= 1.5 * _GELU_A * _SQRT_2_OVER_PI
            w += 0.5 * _SQRT_2_OVER_PI
            w *= xd
            d *= w
            np.multiply(t, 0.5, out=w)
            d += w
            d += 0.5
        else:
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
