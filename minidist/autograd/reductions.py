"""Reductions: sum, mean, max/min, var over any axes.

The adjoint of a reduction broadcasts the output gradient back over the reduced axes (a
read-only view, no copy); max and min send it to the positions that attained the extreme,
splitting it equally between ties.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import grad_mode as _gm
from minidist.autograd.tensor import Tensor, _const, _new


def _axes(axis: Any, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor with {ndim} dimensions")
        out.append(int(a) % builtins.max(ndim, 1))
    return tuple(out)


def _expand(g: np.ndarray, axes: tuple[int, ...], keepdims: bool, shape: tuple[int, ...]) -> np.ndarray:
    """Broadcast a reduced gradient back over the reduced axes (a read-only view, no copy)."""
    if not keepdims:
        g = np.expand_dims(g, axes) if axes else g
    return np.broadcast_to(g, shape)


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    xd = x.data
    axes = _axes(axis, xd.ndim, "sum")
    out = np.asanyarray(xd.sum(axis=axes, keepdims=keepdims))
    if _cost._hook is not None:
        _cost.charge("sum", xd.size, xd.nbytes + out.nbytes, xd.dtype)
    if not (_gm._enabled and x.requires_grad):
        return _const(out)
    shape = xd.shape

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("sum.backward", 0, g.nbytes + xd.nbytes, g.dtype)
        return (_expand(g, axes, keepdims, shape),)

    return _new(out, (x,), backward, "sum")


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    xd = x.data
    axes = _axes(axis, xd.ndim, "mean")
    out = np.asanyarray(xd.mean(axis=axes, keepdims=keepdims))
    count = int(np.prod([xd.shape[a] for a in axes])) if axes else 1
    if _cost._hook is not None:
        _cost.charge("mean", xd.size + out.size, xd.nbytes + out.nbytes, xd.dtype)
    if not (_gm._enabled and x.requires_grad):
        return _const(out)
    shape = xd.shape

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("mean.backward", xd.size, g.nbytes + xd.nbytes, g.dtype)
        return (_expand(g * (1.0 / count), axes, keepdims, shape).astype(xd.dtype, copy=False),)

    return _new(out, (x,), backward, "mean")


def _extreme(name: str, reduce: Callable) -> Callable:
    def op(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
        xd = x.data
        axes = _axes(axis, xd.ndim, name)
        kept = reduce(xd, axis=axes, keepdims=True)
        out = kept if keepdims else kept.reshape([s for i, s in enumerate(xd.shape) if i not in axes])
        if _cost._hook is not None:
            _cost.charge(name, xd.size, xd.nbytes + out.nbytes, xd.dtype)
        if not (_gm._enabled and x.requires_grad):
            return _const(out)

        def backward(g):
            if _cost._hook is not None:
                _cost.charge(name + ".backward", 3 * xd.size, 3 * xd.nbytes, g.dtype)
            # ties share the gradient equally, so the result is a valid subgradient
            hit = xd == kept
            count = hit.sum(axis=axes, keepdims=True)
            gk = g if keepdims else np.expand_dims(g, axes)
            return (hit * (gk / count).astype(xd.dtype, copy=False),)

        return _new(out, (x,), backward, name)

    op.__name__ = name
    return op


max = _extreme("max", np.max)
min = _extreme("min", np.min)


def var(x: Tensor, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance with ``ddof`` (0 = population variance, the one LayerNorm uses)."""
    xd = x.data
    axes = _axes(axis, xd.ndim, "var")
    count = int(np.prod([xd.shape[a] for a in axes])) if axes else 1
    mu = xd.mean(axis=axes, keepdims=True)
    dev = xd - mu
    out = np.asanyarray((dev * dev).sum(axis=axes, keepdims=keepdims) / (count - ddof)).astype(xd.dtype, copy=False)
    if _cost._hook is not None:
        _cost.charge("var", 4 * xd.size, xd.nbytes + out.nbytes, xd.dtype)
    if not (_gm._enabled and x.requires_grad):
        return _const(out)

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("var.backward", 2 * xd.size, 2 * xd.nbytes, g.dtype)
        gk = g if keepdims else np.expand_dims(g, axes)
        return (dev * (gk * (2.0 / (count - ddof))).astype(xd.dtype, copy=False),)

    return _new(out, (x,), backward, "var")
