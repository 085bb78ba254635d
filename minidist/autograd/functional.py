"""Fused operations with hand-written backward (re-exported as ``minidist.nn.functional``).

Composing softmax or layer norm from primitives works, but records a dozen nodes and keeps a
dozen intermediates alive. Here each of these functions is one node: the forward keeps only what
its backward needs (softmax keeps its output, layer norm the normalised input and 1/std,
attention its probabilities) and the backward is the derivative worked out by hand. Every one is
checked against central differences in ``tests/test_autograd_functional.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd import grad_mode as _gm
from minidist.autograd import ops
from minidist.autograd import random as _random
from minidist.autograd.engine import Partial
from minidist.autograd.ops import TRANSCENDENTAL, matmul, relu, sigmoid, tanh
from minidist.autograd.tensor import Tensor, _const, _new, as_tensor, broadcast_error, operands, unbroadcast

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "gelu", "silu", "relu", "sigmoid", "tanh",
           "embedding", "cross_entropy", "dropout", "where", "masked_fill", "scaled_dot_product_attention",
           "cat", "concatenate", "split", "chunk", "stack", "matmul"]


def _record(out: np.ndarray, inputs: Sequence[Tensor | None], grads: Callable[[np.ndarray], Sequence], name: str
            ) -> Tensor:
    """Record ``out`` as a node over the ``inputs`` that require grad.

    ``grads(g)`` returns one gradient per input (None where not needed or not a tensor).
    """
    if not _gm._enabled:
        return _const(out)
    need = [t is not None and t.requires_grad for t in inputs]
    if not any(need):
        return _const(out)
    parents = tuple(t for t, n in zip(inputs, need) if n)
    if all(need):
        return _new(out, parents, grads, name)
    return _new(out, parents, lambda g: tuple(gr for gr, n in zip(grads(g), need) if n), name)


def _needs(t: Tensor | None) -> bool:
    return t is not None and t.requires_grad and _gm._enabled


def _same_float(op: str, *ts: Tensor | None) -> np.dtype:
    dtypes = {t.data.dtype for t in ts if t is not None}
    if len(dtypes) > 1:
        raise TypeError(f"{op}: cannot mix dtypes {' and '.join(sorted(str(d) for d in dtypes))}; "
                        f"cast with .astype() first")
    return dtypes.pop()


# ---------------------------------------------------------------------------- softmax family
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum: subtracting the max changes nothing mathematically and avoids overflow."""
    x = as_tensor(x)
    xd = x.data
    y = xd - xd.max(axis=axis, keepdims=True)
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    if _cost._hook is not None:
        _cost.charge("softmax", (TRANSCENDENTAL + 3) * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("softmax.backward", 4 * g.size, 3 * g.nbytes, g.dtype)
        gx = g * y
        gx -= y * gx.sum(axis=axis, keepdims=True)  # y * (g - <g, y>)
        return (gx,)

    return _record(y, (x,), grads, "softmax")


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    x = as_tensor(x)
    xd = x.data
    y = xd - xd.max(axis=axis, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=axis, keepdims=True))
    if _cost._hook is not None:
        _cost.charge("log_softmax", (TRANSCENDENTAL + 3) * y.size, xd.nbytes + y.nbytes, y.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("log_softmax.backward", (TRANSCENDENTAL + 2) * g.size, 3 * g.nbytes, g.dtype)
        return (g - np.exp(y) * g.sum(axis=axis, keepdims=True),)

    return _record(y, (x,), grads, "log_softmax")


# ---------------------------------------------------------------------------- normalisation
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
    _same_float("layer_norm", x, weight, bias)
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
        gb = g.reshape(-1, c).sum(axis=0) if _needs(bias) else None
        a = g * xhat
        gw = a.reshape(-1, c).sum(axis=0) if _needs(weight) else None
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

    return _record(y, (x, weight, bias), grads, "layer_norm")


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Divide the last axis by its root mean square, then scale (no mean subtraction, no shift)."""
    weight = None if weight is None else as_tensor(weight)
    _check_affine("rms_norm", x, weight, "weight")
    _same_float("rms_norm", x, weight)
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
        gw = (g * xhat).reshape(-1, c).sum(axis=0) if _needs(weight) else None
        gx = None
        if x.requires_grad:
            gxhat = g * weight.data if weight is not None else g
            gx = gxhat - xhat * (gxhat * xhat).mean(axis=-1, keepdims=True)
            gx *= rstd
        return gx, gw

    return _record(y, (x, weight), grads, "rms_norm")


# ---------------------------------------------------------------------------- activations
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

    return _record(y, (x,), grads, "gelu")


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

    return _record(y, (x,), grads, "silu")


# ---------------------------------------------------------------------------- lookup and loss
def _ids(ids: Any, op: str) -> np.ndarray:
    d = ids.data if isinstance(ids, Tensor) else np.asarray(ids)
    if d.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got dtype {d.dtype}")
    return d


def embedding(ids: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (V, C) picked by integer ``ids``; the backward scatter-adds into them."""
    idx = _ids(ids, "embedding")
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

    return _record(out, (weight,), grads, "embedding")


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """-log softmax(logits)[target], fused: the gradient is softmax - onehot, no log-probs stored.

    ``logits`` (..., V), ``targets`` (...) integers; ``"mean"`` averages over non-ignored targets.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    x = logits.data
    t = _ids(targets, "cross_entropy")
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
            out = np.asarray(losses.sum() / count, dtype=x.dtype)
    elif reduction == "sum":
        out = np.asarray(losses.sum(), dtype=x.dtype)
    else:
        out = losses.reshape(t.shape).astype(x.dtype, copy=False)
    if _cost._hook is not None:
        _cost.charge("cross_entropy", (TRANSCENDENTAL + 4) * x.size, x.nbytes + t.nbytes + out.nbytes, x.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("cross_entropy.backward", 3 * x.size, 2 * x.nbytes, x.dtype)
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

    return _record(out, (logits,), grads, "cross_entropy")


# ---------------------------------------------------------------------------- masking and dropout
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

    return _record(y, (x,), grads, "dropout")


def _bool_mask(mask: Any, op: str) -> np.ndarray:
    m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"{op}: the mask/condition must be boolean, got dtype {m.dtype}")
    return m


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``cond`` is True, else ``b`` (broadcasting; gradients flow to the chosen side)."""
    c = _bool_mask(cond, "where")
    at, ad, bt, bd = operands("where", a, b)
    try:
        out = np.where(c, ad, bd)
    except ValueError:
        raise ValueError(f"where: shapes {c.shape}, {np.shape(ad)} and {np.shape(bd)} cannot be broadcast "
                         f"together") from None
    if _cost._hook is not None:
        _cost.charge("where", out.size, c.nbytes + np.asarray(ad).nbytes + np.asarray(bd).nbytes + out.nbytes,
                     out.dtype)
    ash, bsh = np.shape(ad), np.shape(bd)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("where.backward", 2 * g.size, 3 * g.nbytes, g.dtype)
        zero = g.dtype.type(0)
        ga = unbroadcast(np.where(c, g, zero), ash) if _needs(at) else None
        gb = unbroadcast(np.where(c, zero, g), bsh) if _needs(bt) else None
        return ga, gb

    return _record(out, (at, bt), grads, "where")


def masked_fill(x: Tensor, mask: Any, value: float) -> Tensor:
    """``value`` where ``mask`` is True (e.g. -inf above the diagonal), ``x`` elsewhere."""
    m = _bool_mask(mask, "masked_fill")
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

    return _record(out, (x,), grads, "masked_fill")


# ---------------------------------------------------------------------------- attention
@functools.lru_cache(maxsize=64)
def _future(tq: int, tk: int) -> np.ndarray:
    """The causal mask, top-left aligned: True where key j > query i (cached, read-only)."""
    m = np.triu(np.ones((tq, tk), dtype=bool), k=1)
    m.flags.writeable = False
    return m


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                 attn_mask: Any = None, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v for (..., T, d) inputs, as one node.

    ``is_causal`` uses the top-left convention (like torch): query i sees keys j <= i, whatever
    Tq and Tk are. ``attn_mask``: boolean (True = may attend) or additive float, broadcast to
    (..., Tq, Tk); it is not differentiated. A query that may attend to nothing gets NaN.
    Batch dimensions broadcast (e.g. k, v of shape (B, 1, T, d) shared by all heads).
    """
    _same_float("scaled_dot_product_attention", q, k, v)
    qd, kd, vd = q.data, k.data, v.data
    if qd.ndim < 2 or kd.ndim < 2 or vd.ndim < 2 or qd.shape[-1] != kd.shape[-1] or kd.shape[-2] != vd.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {qd.shape}, k {kd.shape}, v {vd.shape} need "
                         f"q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv)")
    d, tq, tk, dv = qd.shape[-1], qd.shape[-2], kd.shape[-2], vd.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qs = qd * qd.dtype.type(sc)  # scaling q (T*d) is cheaper than scaling the scores (T*T)
    try:
        s = qs @ np.swapaxes(kd, -1, -2)
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and k {kd.shape} "
                         f"cannot be broadcast") from None
    if is_causal:
        np.copyto(s, -np.inf, where=_future(tq, tk))
    if attn_mask is not None:
        am = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        if am.dtype == np.bool_:
            s = np.where(am, s, -np.inf).astype(s.dtype, copy=False)
        else:
            s = s + am.astype(s.dtype, copy=False)
    p = s
    p -= p.max(axis=-1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=-1, keepdims=True)
    try:
        out = p @ vd
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and v {vd.shape} "
                         f"cannot be broadcast") from None
    pairs = p.size
    if _cost._hook is not None:
        _cost.charge("scaled_dot_product_attention", 2 * pairs * (d + dv) + (TRANSCENDENTAL + 4) * pairs,
                     qd.nbytes + kd.nbytes + vd.nbytes + out.nbytes, out.dtype)

    def grads(g):
        if _cost._hook is not None:
            _cost.charge("scaled_dot_product_attention.backward", 2 * pairs * (2 * d + 2 * dv) + 4 * pairs,
                         qd.nbytes + kd.nbytes + vd.nbytes + 2 * p.nbytes + g.nbytes * 4, g.dtype)
        gv = unbroadcast(np.swapaxes(p, -1, -2) @ g, vd.shape) if _needs(v) else None
        ds = g @ np.swapaxes(vd, -1, -2)
        ds -= (ds * p).sum(axis=-1, keepdims=True)
        ds *= p  # softmax backward: p * (dp - <dp, p>)
        gq = None
        if _needs(q):
            gq = ds @ kd
            gq *= gq.dtype.type(sc)
            gq = unbroadcast(gq, qd.shape)
        gk = unbroadcast(np.swapaxes(ds, -1, -2) @ qs, kd.shape) if _needs(k) else None
        return gq, gk, gv

    return _record(out, (q, k, v), grads, "scaled_dot_product_attention")


# ---------------------------------------------------------------------------- joining and splitting
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
        _same_float("cat", *ts)
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
        return tuple(g[lead + (slice(bounds[i], bounds[i + 1]),)] if _needs(t) else None for i, t in enumerate(ts))

    return _record(out, ts, grads, "cat")


concatenate = cat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join along a new axis."""
    ts = [as_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: need at least one tensor")
    if all(t.dtype.kind == "f" for t in ts):
        _same_float("stack", *ts)
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
        return tuple(g[lead + (i,)] if _needs(t) else None for i, t in enumerate(ts))

    return _record(out, ts, grads, "stack")


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


def _attach() -> None:
    Tensor.softmax = softmax
    Tensor.log_softmax = log_softmax
    Tensor.gelu = gelu
    Tensor.silu = silu
    Tensor.masked_fill = masked_fill


_attach()
