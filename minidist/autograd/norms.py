"""Normalisation layers fused into one node: LayerNorm and RMSNorm over the last axis.

Their backward is worked out once by hand; it needs only the normalised input and 1/std, both
kept from the forward (chapter 15 lists why TP keeps these replicated; chapter 30 why they run
in float32 under mixed precision).
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.fused import needs_grad, record, same_float
from minidist.autograd.tensor import Tensor, as_tensor


def _check_affine(op: str, x: Tensor, p: Tensor | None, what: str) -> None:
    if p is not None and p.shape != x.shape[-1:]:
        raise ValueError(f"{op}: {what} has shape {p.shape} but the normalised axis of input {x.shape} "
                         f"needs shape {x.shape[-1:]}")


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise the last axis to zero mean and unit variance, then scale and shift."""
    weight = None if weight is None else as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    _check_affine("layer_norm", x, weight, "weight")
    _check_affine("layer_norm", x, bias, "bias")
    same_float("layer_norm", x, weight, bias)
    xd = x.data
    c = xd.shape[-1]
    xhat = xd - xd.mean(axis=-1, keepdims=True)
    sq = xhat * xhat
    rstd = sq.mean(axis=-1, keepdims=True)
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.divide(1.0, rstd, out=rstd)
    xhat *= rstd
    if weight is not None:
        y = np.multiply(xhat, weight.data, out=sq)
    else:
        y = xhat.copy()
    if bias is not None:
        y += bias.data
    if _cost._hook is not None:
        _cost.charge("layer_norm", 8 * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("layer_norm.backward", 10 * g.size, 3 * g.nbytes, g.dtype)
        gb = g.reshape(-1, c).sum(axis=0) if needs_grad(bias) else None
        a = g * xhat
        gw = a.reshape(-1, c).sum(axis=0) if needs_grad(weight) else None
        gx = None
        if x.requires_grad:
            # gx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)), gxhat = g * w
            if weight is not None:
                a *= weight.data
                gx = g * weight.data
            else:
                gx = g.copy()
            m2 = a.mean(axis=-1, keepdims=True)
            gx -= gx.mean(axis=-1, keepdims=True)
            np.multiply(xhat, m2, out=a)
            gx -= a
            gx *= rstd
        return gx, gw, gb

    return record(y, (x, weight, bias), grads, "layer_norm")


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Divide the last axis by its root mean square, then scale (no mean subtraction, no shift)."""
    weight = None if weight is None else as_tensor(weight)
    _check_affine("rms_norm", x, weight, "weight")
    same_float("rms_norm", x, weight)
    xd = x.data
    c = xd.shape[-1]
    rstd = 1.0 / np.sqrt((xd * xd).mean(axis=-1, keepdims=True) + eps)
    xhat = xd * rstd
    y = xhat * weight.data if weight is not None else xhat
    if _cost._hook is not None:
        _cost.charge("rms_norm", 5 * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("rms_norm.backward", 7 * g.size, 3 * g.nbytes, g.dtype)
        gw = (g * xhat).reshape(-1, c).sum(axis=0) if needs_grad(weight) else None
        gx = None
        if x.requires_grad:
            gxhat = g * weight.data if weight is not None else g
            gx = gxhat - xhat * (gxhat * xhat).mean(axis=-1, keepdims=True)
            gx *= rstd
        return gx, gw

    return record(y, (x, weight), grads, "rms_norm")
