"""Looking rows up, joining and cutting tensors: embedding, cat, stack, split.

Their backward only moves gradients: a scatter-add into the looked-up rows (a token may appear
many times), or each piece's share of the joined gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import grad_mode as _gm
from minidist.autograd.engine import Partial
from minidist.autograd.fused import int_indices, needs_grad, record, same_float
from minidist.autograd.tensor import Tensor, _const, _new, as_tensor


def embedding(ids: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (V, C) picked by integer ``ids``; the backward scatter-adds into them."""
    idx = int_indices(ids, "embedding")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got shape {weight.shape}")
    v = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= v):
        raise IndexError(f"embedding: ids must be in [0, {v}), got range [{idx.min()}, {idx.max()}]")
    out = weight.data[idx]
    if _cost._hook is not None:
        _cost.charge("embedding", 0, idx.nbytes + 2 * out.nbytes, out.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("embedding.backward", g.size, 2 * g.nbytes + idx.nbytes, g.dtype)
        return (Partial(idx, g, add_at=True),)  # a token can appear many times

    return record(out, (weight,), grads, "embedding")


def _axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def cat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join along an existing axis; the backward hands each input its slice of the gradient."""
    ts = [as_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("cat: need at least one tensor")
    if all(t.dtype.kind == "f" for t in ts):
        same_float("cat", *ts)
    ax = _axis(axis, ts[0].ndim, "cat")
    try:
        out = np.concatenate([t.data for t in ts], axis=ax)
    except ValueError:
        raise ValueError(f"cat: shapes {[t.shape for t in ts]} do not match outside axis {axis}") from None
    if _cost._hook is not None:
        _cost.charge("cat", 0, 2 * out.nbytes, out.dtype)
    bounds = np.cumsum([0] + [t.shape[ax] for t in ts])
    lead = (slice(None),) * ax

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("cat.backward", 0, 2 * g.nbytes, g.dtype)
        return tuple(g[lead + (slice(bounds[i], bounds[i + 1]),)] if needs_grad(t) else None for i, t in enumerate(ts))

    return record(out, ts, grads, "cat")


concatenate = cat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join along a new axis."""
    ts = [as_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: need at least one tensor")
    if all(t.dtype.kind == "f" for t in ts):
        same_float("stack", *ts)
    try:
        out = np.stack([t.data for t in ts], axis=axis)
    except ValueError:
        raise ValueError(f"stack: all shapes must be equal, got {[t.shape for t in ts]}") from None
    if _cost._hook is not None:
        _cost.charge("stack", 0, 2 * out.nbytes, out.dtype)
    ax = axis % out.ndim
    lead = (slice(None),) * ax

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("stack.backward", 0, 2 * g.nbytes, g.dtype)
        return tuple(g[lead + (i,)] if needs_grad(t) else None for i, t in enumerate(ts))

    return record(out, ts, grads, "stack")


def split(x: Tensor, sizes_or_n: int | Sequence[int], axis: int = 0) -> tuple[Tensor, ...]:
    """Cut along ``axis``: an int is the NUMBER of equal pieces (numpy's rule, not torch's chunk
    size); a list gives each piece's size. Pieces are views; their gradients are written into one
    buffer.
    """
    ax = _axis(axis, x.ndim, "split")
    n_ax = x.shape[ax]
    if isinstance(sizes_or_n, (int, np.integer)):
        n = int(sizes_or_n)
        if n <= 0 or n_ax % n:
            raise ValueError(f"split: axis {axis} of shape {x.shape} (length {n_ax}) cannot be cut into {n} "
                             f"equal pieces")
        sizes = [n_ax // n] * n
    else:
        sizes = [int(s) for s in sizes_or_n]
        if sum(sizes) != n_ax:
            raise ValueError(f"split: sizes {sizes} sum to {sum(sizes)} but axis {axis} of shape {x.shape} "
                             f"has length {n_ax}")
    lead = (slice(None),) * ax
    record = _gm._enabled and x.requires_grad
    if _cost._hook is not None:
        _cost.charge("split", 0, 0, x.dtype)  # the pieces are views

    def piece_backward(g, idx):
        if _cost._hook is not None:
            _cost.charge("split.backward", g.size, 2 * g.nbytes, g.dtype)
        return (Partial(idx, g),)

    outs, start = [], 0
    for s in sizes:
        idx = lead + (slice(start, start + s),)
        start += s
        piece = x.data[idx]
        if record:
            outs.append(_new(piece, (x,), lambda g, idx=idx: piece_backward(g, idx), "split"))
        else:
            outs.append(_const(piece))
    return tuple(outs)


def chunk(x: Tensor, n: int, axis: int = 0) -> tuple[Tensor, ...]:
    """``n`` equal pieces along ``axis`` (same as ``split(x, n, axis)``)."""
    return split(x, n, axis)
