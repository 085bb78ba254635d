"""Normalisation layers fused into one node: LayerNorm and RMSNorm over the last axis.

Their backward is worked out once by hand; it needs only the normalised input and 1/std, both
kept from the forward (chapter 15 lists why TP keeps these replicated; chapter 30 why they run
in float32 under mixed precision).
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.fused import needs_grad, record, rowdot, same_float
from minidist.autograd.tensor import Tensor, as_tensor, ones


def _check_affine(op: str, x: Tensor, p: Tensor | None, what: str) -> None:
    if p is not None and p.shape != x.shape[-1:]:
        raise ValueError(f"{op}: {what} has shape {p.shape} but the normalised axis of input {x.shape} "
                         f"needs shape {x.shape[-1:]}")


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise the last axis to zero mean and unit variance, then scale and shift.

    Sums over the last axis are matrix-vector products (``x @ ones``, ``g @ w``): on rows of a few
    hundred numbers one BLAS call is several times faster than numpy's reduction loop, which
    restarts for every row. Sums of squares are row dot products (``fused.rowdot``).
    """
    weight = None if weight is None else as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    _check_affine("layer_norm", x, weight, "weight")
    _check_affine("layer_norm", x, bias, "bias")
    same_float("layer_norm", x, weight, bias)
    xd = x.data
    if xd.dtype.kind != "f":
        xd = xd.astype(np.float64)
    shape, c = xd.shape, xd.shape[-1]
    x2 = xd.reshape(-1, c)
    mean = x2 @ ones(c, xd.dtype)
    mean /= c
    xhat = x2 - mean[:, None]
    rstd = rowdot(xhat, xhat)
    rstd /= c
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.divide(1.0, rstd, out=rstd)
    rstd = rstd[:, None]
    xhat *= rstd
    y = xhat * weight.data if weight is not None else xhat.copy()
    if bias is not None:
        y += bias.data
    y = y.reshape(shape)
    if _cost._hook is not None:
        _cost.charge("layer_norm", 8 * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("layer_norm.backward", 10 * g.size, 3 * g.nbytes, g.dtype)
        g2 = g.reshape(-1, c)
        column_sum = ones(g2.shape[0], g2.dtype)
        gb = column_sum @ g2 if needs_grad(bias) else None
        a = g2 * xhat
        gw = column_sum @ a if needs_grad(weight) else None
        gx = None
        if x.requires_grad:
            # gx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) with gxhat = g * w, so
            # both row means are products with w: mean(gxhat) = g @ w / c, mean(gxhat * xhat) = a @ w / c
            w = weight.data if weight is not None else ones(c, g2.dtype)
            m1 = g2 @ w
            m1 /= c
            m2 = a @ w
            m2 /= c
            gx = g2 * w
            gx -= m1[:, None]
            np.multiply(xhat, m2[:, None], out=a)
            gx -= a
            gx *= rstd
            gx = gx.reshape(shape)
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
