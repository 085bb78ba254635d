"""Dropout and masking: choose, per element, which values flow (and so which gradients flow back)."""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import random as _random
from minidist.autograd.fused import bool_mask, needs_grad, record
from minidist.autograd.tensor import Tensor, broadcast_error, operands, unbroadcast


def dropout(x: Tensor, p: float = 0.5, training: bool = True, rng: None | int | np.random.Generator = None
            ) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p) (inverted dropout).

    ``rng``: None uses the default generator (``minidist.autograd.random``, replayed by
    ``checkpoint``); an int seed always gives the same mask; a Generator is advanced.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    xd = x.data
    gen = _random.resolve(rng)
    if p == 1.0:
        mask = np.zeros_like(xd)
    else:
        draw = gen.random(xd.shape, dtype=np.float64 if xd.dtype == np.float64 else np.float32)
        mask = ((draw >= p) * (1.0 / (1.0 - p))).astype(xd.dtype, copy=False)
    y = xd * mask
    if _cost._hook is not None:
        _cost.charge("dropout", 2 * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("dropout.backward", g.size, 3 * g.nbytes, g.dtype)
        return (g * mask,)

    return record(y, (x,), grads, "dropout")


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``cond`` is True, else ``b`` (broadcasting; gradients flow to the chosen side)."""
    c = bool_mask(cond, "where")
    at, ad, bt, bd = operands("where", a, b)
    try:
        out = np.where(c, ad, bd)
    except ValueError:
        raise ValueError(f"where: shapes {c.shape}, {np.shape(ad)} and {np.shape(bd)} cannot be broadcast "
                         f"together") from None
    if _cost._hook is not None:
        _cost.charge("where", out.size, c.nbytes + np.asanyarray(ad).nbytes + np.asanyarray(bd).nbytes + out.nbytes,
                     out.dtype)
    ash, bsh = np.shape(ad), np.shape(bd)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("where.backward", 2 * g.size, 3 * g.nbytes, g.dtype)
        zero = g.dtype.type(0)
        ga = unbroadcast(np.where(c, g, zero), ash) if needs_grad(at) else None
        gb = unbroadcast(np.where(c, zero, g), bsh) if needs_grad(bt) else None
        return ga, gb

    return record(out, (at, bt), grads, "where")


def masked_fill(x: Tensor, mask: Any, value: float) -> Tensor:
    """``value`` where ``mask`` is True (e.g. -inf above the diagonal), ``x`` elsewhere."""
    m = bool_mask(mask, "masked_fill")
    xd = x.data
    try:
        out = np.where(m, xd.dtype.type(value), xd)
    except ValueError:
        raise broadcast_error("masked_fill", xd, m) from None
    if _cost._hook is not None:
        _cost.charge("masked_fill", out.size, xd.nbytes + m.nbytes + out.nbytes, out.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("masked_fill.backward", g.size, 2 * g.nbytes, g.dtype)
        return (unbroadcast(np.where(m, g.dtype.type(0), g), xd.shape),)

    return record(out, (x,), grads, "masked_fill")
