"""The softmax family and the cross-entropy loss, each fused into one node.

Softmax is invariant to adding a constant to every input, so subtracting the row maximum before
``exp`` changes nothing mathematically and keeps every exponent <= 0 (no overflow). Its
Jacobian-vector product needs only the output: ``dx = y * (g - sum(g * y))``. Cross-entropy
fused with log-softmax has the famous gradient ``softmax(x) - onehot(target)``, so no
log-probabilities are ever stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.fused import int_indices, record
from minidist.autograd.ops import TRANSCENDENTAL
from minidist.autograd.tensor import Tensor, as_tensor


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum: subtracting the max changes nothing mathematically and avoids overflow."""
    x = as_tensor(x)
    xd = x.data
    y = xd - xd.max(axis=axis, keepdims=True)
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    if _cost._hook is not None:
        _cost.charge("softmax", (TRANSCENDENTAL + 3) * y.size, xd.nbytes + y.nbytes, y.dtype, y.shape)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("softmax.backward", 4 * g.size, 3 * g.nbytes, g.dtype, g.shape)
        gx = g * y
        gx -= y * gx.sum(axis=axis, keepdims=True)  # y * (g - <g, y>)
        return (gx,)

    return record(y, (x,), grads, "softmax")


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    x = as_tensor(x)
    xd = x.data
    y = xd - xd.max(axis=axis, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=axis, keepdims=True))
    if _cost._hook is not None:
        _cost.charge("log_softmax", (TRANSCENDENTAL + 3) * y.size, xd.nbytes + y.nbytes, y.dtype, y.shape)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("log_softmax.backward", (TRANSCENDENTAL + 2) * g.size, 3 * g.nbytes, g.dtype)
        return (g - np.exp(y) * g.sum(axis=axis, keepdims=True),)

    return record(y, (x,), grads, "log_softmax")


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """-log softmax(logits)[target], fused: the gradient is softmax - onehot, no log-probs stored.

    ``logits`` (..., V), ``targets`` (...) integers; ``"mean"`` averages over non-ignored targets.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    x = logits.data
    t = int_indices(targets, "cross_entropy")
    if t.shape != x.shape[:-1]:
        raise ValueError(f"cross_entropy: logits of shape {x.shape} need targets of shape {x.shape[:-1]}, "
                         f"got {t.shape}")
    v = x.shape[-1]
    x2, t2 = x.reshape(-1, v), t.reshape(-1)
    valid = t2 != ignore_index
    tt = np.where(valid, t2, 0)
    if tt.size and (tt.min() < 0 or tt.max() >= v):
        raise IndexError(f"cross_entropy: targets must be in [0, {v}) or ignore_index={ignore_index}")
    rows = np.arange(t2.size)
    sh = x2 - x2.max(axis=1, keepdims=True)
    e = np.exp(sh)
    s = e.sum(axis=1, keepdims=True)
    losses = (np.log(s[:, 0]) - sh[rows, tt]) * valid
    count = int(valid.sum())
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.asanyarray(losses.sum() / count, dtype=x.dtype)
    elif reduction == "sum":
        out = np.asanyarray(losses.sum(), dtype=x.dtype)
    else:
        out = losses.reshape(t.shape).astype(x.dtype, copy=False)
    if _cost._hook is not None:
        _cost.charge("cross_entropy", (TRANSCENDENTAL + 4) * x.size, x.nbytes + t.nbytes + out.nbytes, x.dtype,
                     x.shape)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("cross_entropy.backward", 3 * x.size, 2 * x.nbytes, x.dtype, x.shape)
        if reduction == "none":
            w = g.reshape(-1) * valid
        elif reduction == "mean":
            w = valid * (g / count)
        else:
            w = valid * g
        w = w.astype(x.dtype, copy=False)
        gx = e * (w[:, None] / s)  # softmax * weight
        gx[rows, tt] -= w  # minus one-hot * weight
        return (gx.reshape(x.shape),)

    return record(out, (logits,), grads, "cross_entropy")
