"""Shape operations and indexing: reshape, transpose and friends move no numbers, so their
adjoint moves the gradient back the same way; indexing scatters the gradient into the rows or
slices it read (accumulating where an integer index repeats).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import grad_mode as _gm
from minidist.autograd.engine import Partial
from minidist.autograd.tensor import Tensor, _const, _new


def _shape_arg(shape: tuple) -> tuple:
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def reshape(x: Tensor, *shape: Any) -> Tensor:
    shape = _shape_arg(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} into shape {tuple(shape)}") from None
    if _cost._hook is not None:  # a view moves no data (a non-contiguous input is copied: count that)
        _cost.charge("reshape", 0, 0 if np.may_share_memory(out, x.data) else 2 * out.nbytes, out.dtype)
    if not (_gm._enabled and x.requires_grad):
        return _const(out)
    src = x.data.shape

    def backward(g):
        gx = g.reshape(src)
        if _cost._hook is not None:
            _cost.charge("reshape.backward", 0, 0 if np.may_share_memory(gx, g) else 2 * g.nbytes, g.dtype)
        return (gx,)

    return _new(out, (x,), backward, "reshape")


def transpose(x: Tensor, *axes: Any) -> Tensor:
    """Permute axes with numpy's rule: no argument reverses them; otherwise give all of them.

    (torch's ``transpose(dim0, dim1)`` is ``swapaxes`` here.)
    """
    axes = _shape_arg(axes)
    nd = x.data.ndim
    if not axes:
        axes = tuple(range(nd - 1, -1, -1))
    if len(axes) != nd or sorted(a % nd for a in axes) != list(range(nd)):
        raise ValueError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape {x.shape}; "
                         f"use swapaxes(a, b) to exchange two axes")
    out = x.data.transpose(axes)
    if _cost._hook is not None:
        _cost.charge("transpose", 0, 0, out.dtype)  # a view: no data moves
    if not (_gm._enabled and x.requires_grad):
        return _const(out)
    inverse = tuple(np.argsort([a % nd for a in axes]))

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("transpose.backward", 0, 0, g.dtype)
        return (g.transpose(inverse),)

    return _new(out, (x,), backward, "transpose")


def permute(x: Tensor, *axes: Any) -> Tensor:
    """Reorder the axes; all of them must be given (torch's name for numpy's transpose)."""
    if not axes:
        raise ValueError(f"permute: give the new order of all {x.ndim} axes")
    return transpose(x, *axes)


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    nd = x.data.ndim
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, *perm)


def unsqueeze(x: Tensor, axis: int) -> Tensor:
    shape = list(x.shape)
    shape.insert(axis % (x.ndim + 1), 1)
    return reshape(x, *shape)


def squeeze(x: Tensor, axis: Any = None) -> Tensor:
    return reshape(x, *np.squeeze(np.empty(x.shape, dtype=np.bool_), axis=axis).shape)


def flatten(x: Tensor, start: int = 0, end: int = -1) -> Tensor:
    nd = x.ndim
    s, e = start % nd, end % nd
    shape = x.shape
    return reshape(x, *shape[:s], int(np.prod(shape[s:e + 1])), *shape[e + 1:])


def _index_arg(idx: Any) -> Any:
    if isinstance(idx, Tensor):
        return idx.data
    if isinstance(idx, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    return idx


def _is_int_array(i: Any) -> bool:
    return (isinstance(i, np.ndarray) and i.dtype.kind in "iu") or isinstance(i, list)


def getitem(x: Tensor, idx: Any) -> Tensor:
    """``x[idx]``: slices, ints, None, Ellipsis, integer arrays and boolean masks."""
    idx = _index_arg(idx)
    try:
        out = x.data[idx]
    except IndexError as e:
        raise IndexError(f"getitem: {e} (tensor shape {x.shape})") from None
    if _cost._hook is not None:
        view = isinstance(out, np.ndarray) and np.may_share_memory(out, x.data)
        _cost.charge("getitem", 0, 0 if view else 2 * np.asanyarray(out).nbytes, x.data.dtype)
    if not (_gm._enabled and x.requires_grad):
        return _const(out)
    parts = idx if isinstance(idx, tuple) else (idx,)
    repeats = any(_is_int_array(i) for i in parts)  # integer arrays may hit a row twice

    def backward(g):
        if _cost._hook is not None:
            _cost.charge("getitem.backward", g.size, 2 * g.nbytes, g.dtype)
        return (Partial(idx, g, add_at=repeats),)

    return _new(np.asanyarray(out), (x,), backward, "getitem")
