"""Primitive operations and their local derivatives, attached to ``Tensor`` at import.

Elementwise arithmetic, elementwise functions, casts and the matrix product live here;
reductions in ``reductions.py``, shape operations and indexing in ``shape_ops.py``. Each op
computes its forward with numpy, reports its cost (FLOPs and bytes read + written) to
``cost.charge`` when a hook is installed, and, if the result must be recorded, returns a tensor
whose ``_backward`` closure maps the output gradient to one gradient per parent. Closures keep
only what they need, never modify the incoming gradient in place, and sum broadcast dimensions
back with ``unbroadcast`` (one reduction).

FLOP convention: 1 per element for arithmetic, ``TRANSCENDENTAL`` (4) per element for exp, log,
tanh, sqrt and friends, ``2*m*n*k`` for a matrix product (one multiply and one add per term).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minidist.autograd import autocast as _autocast
from minidist.autograd import cost as _cost
from minidist.autograd import grad_mode as _gm
from minidist.autograd.tensor import Tensor, _const, _new, broadcast_error, operands, unbroadcast

TRANSCENDENTAL = 4


def _nb(x: Any) -> int:
    return x.nbytes if isinstance(x, np.ndarray) else 8


def _dtype_of(*xs: Any) -> np.dtype:
    for x in xs:
        if isinstance(x, np.ndarray):
            return x.dtype
    return np.dtype(np.float64)


def _rec(xt: Tensor | None, yt: Tensor | None = None) -> bool:
    return _gm._enabled and ((xt is not None and xt.requires_grad) or (yt is not None and yt.requires_grad))


# ---------------------------------------------------------------------------- binary elementwise
def _broadcast_apply(name: str, fn: Callable, xd: Any, yd: Any) -> np.ndarray:
    """``fn(xd, yd)``; when the shapes do not broadcast, an error that names the op and both shapes
    (numpy's own ValueError is kept when the shapes are not the problem)."""
    try:
        return fn(xd, yd)
    except ValueError:
        try:
            np.broadcast_shapes(np.shape(xd), np.shape(yd))
        except ValueError:
            raise broadcast_error(name, xd, yd) from None
        raise


def _parents(xt: Tensor | None, yt: Tensor | None) -> tuple:
    """The graph parents of a binary op: only its Tensor operands (a plain number or array is a constant)."""
    return (xt,) if yt is None else (yt,) if xt is None else (xt, yt)


def _for_parents(xt: Tensor | None, yt: Tensor | None, gx, gy) -> tuple:
    """A binary op's gradients, one per parent listed by ``_parents``."""
    if xt is None:
        return (gy,)
    if yt is None:
        return (gx,)
    return gx, gy


def _binary(name: str, fwd: Callable, grads: Callable, flops_fwd: int = 1, flops_bwd: int = 2,
            keeps_operands: bool = True) -> Callable:
    """Build a broadcasting binary op from its forward and ``grads(g, x, y, out, need_x, need_y)``.

    ``keeps_operands=False``: the gradients do not read x and y (add, sub), so the backward does not hold
    them, and a weight used here (a bias) does not stay alive through the graph.
    """

    def op(x: Any, y: Any) -> Tensor:
        xt, xd, yt, yd = operands(name, x, y)
        out = _broadcast_apply(name, fwd, xd, yd)
        operand_bytes = _nb(xd) + _nb(yd)
        if _cost._hook is not None:
            _cost.charge(name, flops_fwd * out.size, operand_bytes + out.nbytes, out.dtype)
        if not _rec(xt, yt):
            return _const(out)
        need_x = xt is not None and xt.requires_grad
        need_y = yt is not None and yt.requires_grad
        xs, ys = np.shape(xd), np.shape(yd)
        kept = (xd, yd) if keeps_operands else (None, None)

        def backward(g):
            if _cost._hook is not None:
                _cost.charge(name + ".backward", flops_bwd * g.size * (need_x + need_y),
                             g.nbytes * (1 + need_x + need_y) + operand_bytes, g.dtype)
            gx, gy = grads(g, kept[0], kept[1], out, need_x, need_y)
            gx = unbroadcast(gx, xs) if need_x else None
            gy = unbroadcast(gy, ys) if need_y else None
            return _for_parents(xt, yt, gx, gy)

        return _new(out, _parents(xt, yt), backward, name)

    op.__name__ = name
    return op


add = _binary("add", np.add, lambda g, x, y, o, nx, ny: (g, g), flops_bwd=0, keeps_operands=False)
sub = _binary("sub", np.subtract, lambda g, x, y, o, nx, ny: (g, -g if ny else None), flops_bwd=1,
              keeps_operands=False)
mul = _binary("mul", np.multiply, lambda g, x, y, o, nx, ny: (g * y if nx else None, g * x if ny else None),
              flops_bwd=1)
div = _binary("div", np.true_divide,
              lambda g, x, y, o, nx, ny: (g / y if nx else None, -g * o / y if ny else None))


def _pow_grads(g, x, y, o, nx, ny):
    gx = gy = None
    if nx:
        if y.__class__ is not np.ndarray and y == 2:
            gx = g * (2 * x)
        else:
            gx = g * (y * (x ** (y - 1)))
    if ny:
        with np.errstate(divide="ignore", invalid="ignore"):
            gy = g * o * np.log(np.where(x > 0, x, 1))
    return gx, gy


pow = _binary("pow", np.power, _pow_grads, flops_fwd=TRANSCENDENTAL, flops_bwd=TRANSCENDENTAL + 2)


def _cmp(name: str, fn: Callable) -> Callable:
    def op(x: Any, y: Any) -> Tensor:
        xt, xd, yt, yd = operands(name, x, y)
        out = _broadcast_apply(name, fn, xd, yd)
        if _cost._hook is not None:
            _cost.charge(name, out.size, _nb(xd) + _nb(yd) + out.nbytes, _dtype_of(xd, yd))
        return _const(out)

    op.__name__ = name
    return op


lt, le, gt, ge = _cmp("lt", np.less), _cmp("le", np.less_equal), _cmp("gt", np.greater), _cmp("ge", np.greater_equal)
eq, ne = _cmp("eq", np.equal), _cmp("ne", np.not_equal)


# ---------------------------------------------------------------------------- unary elementwise
def _unary(name: str, fwd: Callable, grad: Callable, flops: int = 1, flops_bwd: int = 2) -> Callable:
    """Build ``op(x)`` from its forward and ``grad(g, x, out)`` (the local derivative times g)."""

    def op(x: Tensor) -> Tensor:
        xd = x.data
        out = fwd(xd)
        if _cost._hook is not None:
            _cost.charge(name, flops * out.size, xd.nbytes + out.nbytes, out.dtype)
        if not (_gm._enabled and x.requires_grad):
            return _const(out)

        def backward(g):
            if _cost._hook is not None:
                _cost.charge(name + ".backward", flops_bwd * g.size, 3 * g.nbytes, g.dtype)
            return (grad(g, xd, out),)

        return _new(out, (x,), backward, name)

    op.__name__ = name
    return op


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| never overflows; this picks the stable branch per element
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


neg = _unary("neg", np.negative, lambda g, x, o: -g, flops_bwd=1)
exp = _unary("exp", np.exp, lambda g, x, o: g * o, TRANSCENDENTAL, 1)
log = _unary("log", np.log, lambda g, x, o: g / x, TRANSCENDENTAL, 1)
sqrt = _unary("sqrt", np.sqrt, lambda g, x, o: g * (0.5 / o), TRANSCENDENTAL, 2)
tanh = _unary("tanh", np.tanh, lambda g, x, o: g * (1 - o * o), TRANSCENDENTAL, 3)
sigmoid = _unary("sigmoid", _sigmoid, lambda g, x, o: g * (o * (1 - o)), TRANSCENDENTAL, 3)
relu = _unary("relu", lambda x: np.maximum(x, 0), lambda g, x, o: g * (x > 0), 1, 1)
abs = _unary("abs", np.abs, lambda g, x, o: g * np.sign(x), 1, 2)


def clip(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:
    """Clamp to [min, max]; the gradient passes where the input was inside the range."""
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    op = _unary("clip", lambda d: np.clip(d, min, max), lambda g, d, o: g * ((d >= lo) & (d <= hi)))
    return op(x)


def astype(x: Tensor, dtype: Any) -> Tensor:
    """Differentiable cast: the gradient is cast back to the input's dtype (mixed precision)."""
    dtype = np.dtype(dtype)
    if x.data.dtype == dtype:
        return x
    src = x.data.dtype
    out = x.data.astype(dtype)
    if _cost._hook is not None:
        _cost.charge("astype", out.size, x.data.nbytes + out.nbytes, dtype)
    if not (_gm._enabled and x.requires_grad) or dtype.kind != "f":
        return _const(out)

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("astype.backward", g.size, g.nbytes + g.size * src.itemsize, src)
        return (g.astype(src),)

    return _new(out, (x,), backward, "astype")


# ---------------------------------------------------------------------------- matmul
def matmul(x: Any, y: Any) -> Tensor:
    """Batched matrix product with numpy's rules (1-D operands are promoted, batch dims broadcast)."""
    xt, xd, yt, yd = operands("matmul", x, y)
    xd, yd = np.asanyarray(xd), np.asanyarray(yd)
    rnd, rnd_g = _autocast._round, _autocast._round_grad  # under autocast: operands, result, gradients rounded
    if rnd is not None:
        xd, yd = rnd(xd), rnd(yd)
    if xd.ndim == 0 or yd.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dimension, got shapes {xd.shape} and {yd.shape}")
    x2 = xd[None, :] if xd.ndim == 1 else xd  # promote 1-D like numpy does
    y2 = yd[:, None] if yd.ndim == 1 else yd
    k = x2.shape[-1]
    if k != y2.shape[-2]:
        raise ValueError(f"matmul: shapes {xd.shape} and {yd.shape} do not align: {k} != {y2.shape[-2]}")
    m, n = x2.shape[-2], y2.shape[-1]
    flat = y2.ndim == 2 and x2.ndim > 2  # (..., m, k) @ (k, n): one large GEMM beats a loop of small ones
    try:
        if flat:
            out2 = (x2.reshape(-1, k) @ y2).reshape(x2.shape[:-1] + (n,))
        else:
            out2 = x2 @ y2
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of shapes {xd.shape} and {yd.shape} cannot be broadcast") from None
    if rnd is not None:
        out2 = rnd(out2)
    out = out2
    if xd.ndim == 1:
        out = out[..., 0, :]
    if yd.ndim == 1:
        out = out[..., 0]
    batch = out2.size // (m * n) if m * n else 0
    gemm = (1, batch * m, k, n) if flat else (batch, m, k, n)  # flat: one product of all the rows
    if _cost._hook is not None:
        _cost.charge("matmul", 2 * batch * m * n * k, xd.nbytes + yd.nbytes + out.nbytes, out.dtype, gemm)
    if not _rec(xt, yt):
        return _const(out)
    need_x = xt is not None and xt.requires_grad
    need_y = yt is not None and yt.requires_grad
    in_bytes, x_shape, y_shape, x2_shape, y2_shape = xd.nbytes + yd.nbytes, xd.shape, yd.shape, x2.shape, y2.shape
    # A weight that a sharding strategy gathers again before its backward (ZeRO-3, FSDP: ``regathered``)
    # is read from its parameter then: keeping the array would pin the gathered buffer for the whole step.
    kept = [None if getattr(xt, "regathered", False) else x2, None if getattr(yt, "regathered", False) else y2]

    def backward(g):
        if _cost._hook is not None:
            # each input gradient reads g and the other operand and writes a tensor the size of its input
            _cost.charge("matmul.backward", 2 * batch * m * n * k * (need_x + need_y),
                         (g.nbytes + in_bytes) * (need_x + need_y), g.dtype, gemm)
        a = kept[0] if kept[0] is not None else np.asanyarray(xt.data).reshape(x2_shape)
        b = kept[1] if kept[1] is not None else np.asanyarray(yt.data).reshape(y2_shape)
        if rnd is not None:  # kept operands were rounded in the forward; a regathered weight is rounded now
            a = a if kept[0] is not None else rnd(a)
            b = b if kept[1] is not None else rnd(b)
            g = rnd_g(g)
        g2 = g.reshape(out2.shape)
        gx = gy = None
        if need_x:
            if flat:
                gx = (g2.reshape(-1, n) @ b.T).reshape(x2_shape)
            else:
                gx = unbroadcast(g2 @ np.swapaxes(b, -1, -2), x2_shape)
            gx = gx.reshape(x_shape)
        if need_y:
            if flat:
                gy = a.reshape(-1, k).T @ g2.reshape(-1, n)
            else:
                gy = unbroadcast(np.swapaxes(a, -1, -2) @ g2, y2_shape)
            gy = gy.reshape(y_shape)
        if rnd is not None:
            gx, gy = (None if gx is None else rnd_g(gx)), (None if gy is None else rnd_g(gy))
        return _for_parents(xt, yt, gx, gy)

    return _new(out, _parents(xt, yt), backward, "matmul")



# ---------------------------------------------------------------------------- attach to Tensor
def _attach() -> None:
    from minidist.autograd import reductions as r
    from minidist.autograd import shape_ops as s

    T = Tensor
    T.__add__ = add
    T.__radd__ = lambda self, other: add(other, self)
    T.__sub__ = sub
    T.__rsub__ = lambda self, other: sub(other, self)
    T.__mul__ = mul
    T.__rmul__ = lambda self, other: mul(other, self)
    T.__truediv__ = div
    T.__rtruediv__ = lambda self, other: div(other, self)
    T.__pow__ = pow
    T.__rpow__ = lambda self, other: pow(other, self)
    T.__matmul__ = matmul
    T.__rmatmul__ = lambda self, other: matmul(other, self)
    T.__neg__ = neg
    T.__lt__, T.__le__, T.__gt__, T.__ge__, T.__eq__, T.__ne__ = lt, le, gt, ge, eq, ne
    T.__getitem__ = s.getitem
    for f in (exp, log, sqrt, tanh, sigmoid, relu, abs, clip, astype, matmul, r.sum, r.mean, r.max, r.min, r.var,
              s.reshape, s.transpose, s.permute, s.swapaxes, s.unsqueeze, s.squeeze, s.flatten):
        setattr(T, f.__name__, f)
    T.view = s.reshape
    T.T = property(lambda self: s.transpose(self))


_attach()
