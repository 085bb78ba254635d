"""Scaled dot-product attention fused into one node (chapters 17 and 31a build on it).

The forward keeps the attention probabilities P; the backward is four matrix products and one
softmax backward: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``,
``dQ = dS K * scale``, ``dK = dS^T Q * scale``. The row sums need no pass over the scores:
``rowsum(dP * P) = rowsum(dO * O)`` (FlashAttention's trick), since ``O = P V``.

Sliding-window attention (``window=w``, Jiang et al. 2023, Mistral 7B) is the causal mask with the
distant past masked too: query i attends to keys i - w + 1 .. i only. Its output, and so its
gradients, depend on no other key, so the w scores of that *band* are all there is to compute and
all the backward must keep. Self-attention over one sequence (``Tq == Tk``, ``w < T``) therefore
runs on the band (``_banded``): scores (..., T, w) instead of (..., T, T), so the probabilities kept
for the backward, the FLOPs and the bytes charged are O(T w), not O(T^2). Column c of the band is
key i - w + 1 + c (the diagonal is the last column); the first w - 1 queries have fewer keys, and
their missing ones are masked entries with probability 0. The backward is the same five formulas
restricted to the band: ``dV`` and ``dK`` scatter each band entry back to its key's row. Every other
windowed call (queries and keys of different lengths, an ``attn_mask`` given too, ``w >= T``) masks
the full square as before: a masked score has probability 0, so the formulas give it no gradient.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.fused import needs_grad, record, rowdot, same_float
from minidist.autograd.ops import TRANSCENDENTAL
from minidist.autograd.shape_only import ShapeArray, empty
from minidist.autograd.tensor import Tensor, ones, unbroadcast


@functools.lru_cache(maxsize=64)
def _future(tq: int, tk: int) -> np.ndarray:
    """The causal mask, top-left aligned: True where key j > query i (cached, read-only)."""
    m = np.triu(np.ones((tq, tk), dtype=bool), k=1)
    m.flags.writeable = False
    return m


@functools.lru_cache(maxsize=64)
def _outside_window(tq: int, tk: int, window: int) -> np.ndarray:
    """The sliding-window mask, top-left aligned: True where key j > query i or j <= i - window."""
    m = np.triu(np.ones((tq, tk), dtype=bool), k=1) | np.tril(np.ones((tq, tk), dtype=bool), k=-window)
    m.flags.writeable = False
    return m


@functools.lru_cache(maxsize=64)
def _before_start(window: int) -> np.ndarray:
    """The band's padding, (w - 1, w): True where query i's column c is key i - w + 1 + c < 0 (cached, read-only)."""
    m = np.add.outer(np.arange(window - 1), np.arange(window)) < window - 1  # i + c < w - 1
    m.flags.writeable = False
    return m


def _shape(p: np.ndarray, d: int, dv: int) -> tuple:
    """What a measured device needs to split attention into kernels: (batch x heads, tq, keys per query, d, dv)."""
    tq, tk = p.shape[-2], p.shape[-1]
    return (p.size // max(tq * tk, 1), tq, tk, d, dv)


def _charge_forward(pairs: int, d: int, dv: int, inputs_bytes: int, out: np.ndarray, p: np.ndarray) -> None:
    """The forward's cost for ``pairs`` (query, key) scores: the square's T^2 per head or the band's T w."""
    if _cost._hook is not None:
        _cost.charge("scaled_dot_product_attention", 2 * pairs * (d + dv) + (TRANSCENDENTAL + 4) * pairs,
                     inputs_bytes + out.nbytes, out.dtype, _shape(p, d, dv))


def _charge_backward(pairs: int, d: int, dv: int, inputs_bytes: int, p: np.ndarray, g: np.ndarray) -> None:
    """The backward's: four products over the pairs and the softmax's, reading the kept probabilities twice."""
    if _cost._hook is not None:
        _cost.charge("scaled_dot_product_attention.backward", 2 * pairs * (2 * d + 2 * dv) + 4 * pairs,
                     inputs_bytes + 2 * p.nbytes + g.nbytes * 4, g.dtype, _shape(p, d, dv))


def check_window(window: Any, who: str) -> int | None:
    """``window`` as an int >= 1, or None (full causal attention); ``who`` names the caller in the error."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"{who}: window must be None or an int >= 1 (keys per query, itself included), "
                         f"got {window!r}")
    return int(window)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                 attn_mask: Any = None, scale: float | None = None, window: int | None = None
                                 ) -> Tensor:
    """softmax(q k^T * scale + mask) v for (..., T, d) inputs, as one node.

    ``is_causal`` uses the top-left convention (like torch): query i sees keys j <= i, whatever
    Tq and Tk are. ``window=w`` (with ``is_causal``) is sliding-window attention, Mistral's
    convention: query i sees the w keys i - w < j <= i, itself included, so ``window=1`` attends
    to itself only and ``window >= Tq`` is plain causal attention (Jiang et al. 2023, Mistral 7B). On
    self-attention (Tq == Tk > window, no ``attn_mask``) only the band of T x window scores is computed
    and kept (module doc).
    ``attn_mask``: boolean (True = may attend) or additive float, broadcast to (..., Tq, Tk); it is
    not differentiated. A query that may attend to nothing gets NaN.
    Batch dimensions broadcast (e.g. k, v of shape (B, 1, T, d) shared by all heads).
    """
    same_float("scaled_dot_product_attention", q, k, v)
    window = check_window(window, "scaled_dot_product_attention")
    if window is not None and not is_causal:
        raise ValueError("scaled_dot_product_attention: window needs is_causal=True (a sliding window looks back "
                         "from each query)")
    qd, kd, vd = q.data, k.data, v.data
    if qd.ndim < 2 or kd.ndim < 2 or vd.ndim < 2 or qd.shape[-1] != kd.shape[-1] or kd.shape[-2] != vd.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {qd.shape}, k {kd.shape}, v {vd.shape} need "
                         f"q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv)")
    d, tq, tk, dv = qd.shape[-1], qd.shape[-2], kd.shape[-2], vd.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qs = qd * qd.dtype.type(sc)  # scaling q (T*d) is cheaper than scaling the scores (T*T)
    if is_causal and window is not None and window < tk and tq == tk and attn_mask is None:
        return _banded(q, k, v, qs, sc, window)
    try:
        s = qs @ np.swapaxes(kd, -1, -2)
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and k {kd.shape} "
                         f"cannot be broadcast") from None
    if is_causal and not isinstance(s, ShapeArray):  # shape-only scores have no values to mask (a 405B
        # sequence's mask alone is 64 MB of booleans, which every rank thread would build at once)
        # a window that reaches here (queries and keys of different lengths, or a mask given too) masks
        # scores, it does not skip them: the cost charged below stays that of dense attention
        np.copyto(s, -np.inf, where=_future(tq, tk) if window is None or window >= tq else
                  _outside_window(tq, tk, window))
    if attn_mask is not None:
        am = attn_mask.data if isinstance(attn_mask, Tensor) else np.asanyarray(attn_mask)
        if am.dtype == np.bool_:
            s = np.where(am, s, -np.inf).astype(s.dtype, copy=False)
        else:
            s = s + am.astype(s.dtype, copy=False)
    p = s
    # Row-wise reductions over Tk keys: fmax finds the same maximum as max (numpy's max loop is
    # slower on short rows; a NaN score makes the row NaN either way) and the row sums are one
    # matrix-vector product with ones.
    p -= np.fmax.reduce(p, axis=-1, keepdims=True)
    np.exp(p, out=p)
    p /= (p @ ones(tk, p.dtype))[..., None]
    try:
        out = p @ vd
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and v {vd.shape} "
                         f"cannot be broadcast") from None
    pairs = p.size
    _charge_forward(pairs, d, dv, qd.nbytes + kd.nbytes + vd.nbytes, out, p)

    def grads(g):
        _charge_backward(pairs, d, dv, qd.nbytes + kd.nbytes + vd.nbytes, p, g)
        gv = unbroadcast(np.swapaxes(p, -1, -2) @ g, vd.shape) if needs_grad(v) else None
        ds = g @ np.swapaxes(vd, -1, -2)
        # softmax backward: ds = p * (dp - <dp, p>), and <dp, p> = sum_j (g . v_j) p_j = g . out,
        # a dot product over dv per query instead of a pass over the (Tq, Tk) scores
        ds -= rowdot(g, out)[..., None]
        ds *= p
        gq = None
        if needs_grad(q):
            gq = ds @ kd
            gq *= gq.dtype.type(sc)
            gq = unbroadcast(gq, qd.shape)
        gk = unbroadcast(np.swapaxes(ds, -1, -2) @ qs, kd.shape) if needs_grad(k) else None
        return gq, gk, gv

    return record(out, (q, k, v), grads, "scaled_dot_product_attention")


def _windows(x: np.ndarray, window: int) -> np.ndarray:
    """(..., T, n) -> the view (..., T, n, w) whose [..., i, :, c] is row i - w + 1 + c of ``x`` (zeros before row 0).

    One copy of ``x`` with w - 1 rows of zeros in front, read w rows at a time without copying again: the keys
    (or values) of each query's band, ready for one batched matmul with that query.
    """
    pad = [(0, 0)] * (x.ndim - 2) + [(window - 1, 0), (0, 0)]
    return np.lib.stride_tricks.sliding_window_view(np.pad(x, pad), window, axis=-2)


def _scatter(band: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The adjoint of ``_windows``' gather: row j gets ``sum band[..., i, c] * x[..., i, :]`` over the band
    entries (i, c) that are key j = i - w + 1 + c. (..., T, w) and (..., T, n) -> (..., T, n)."""
    t, w = band.shape[-2:]
    acc = np.zeros(np.broadcast_shapes(band.shape[:-2], x.shape[:-2]) + (t, x.shape[-1]), np.result_type(band, x))
    for c in range(w):  # one diagonal of the (T, T) square per column: O(T n) each, O(T w n) in all
        lag = w - 1 - c  # column c is key i - lag; the first ``lag`` queries' entries are padding, skipped
        acc[..., :t - lag, :] += band[..., lag:, c, None] * x[..., lag:, :]
    return acc


def _banded(q: Tensor, k: Tensor, v: Tensor, qs: np.ndarray, sc: float, window: int) -> Tensor:
    """Causal sliding-window self-attention (Tq == Tk == T, w < T) computed and kept on the band (..., T, w).

    Query i attends to keys i - w + 1 .. i only, so its output, and the gradients it sends to q, k and v,
    depend on those w scores alone: the band is all that must be computed, and the band's probabilities are
    all the backward must keep (O(T w) memory instead of the square's O(T^2)). Equal to the masked square up
    to the order of the sums (float64: ~1e-15).
    """
    qd, kd, vd = q.data, k.data, v.data
    t, d, dv, w = qd.shape[-2], qd.shape[-1], vd.shape[-1], window
    try:
        bqk = np.broadcast_shapes(qd.shape[:-2], kd.shape[:-2])
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and k {kd.shape} "
                         f"cannot be broadcast") from None
    try:
        bout = np.broadcast_shapes(bqk, vd.shape[:-2])
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dimensions of q {qd.shape} and v {vd.shape} "
                         f"cannot be broadcast") from None
    shape_only = isinstance(qd, ShapeArray) or isinstance(kd, ShapeArray) or isinstance(vd, ShapeArray)
    if shape_only:  # the band's shapes without its values (a loop over w diagonals would only cost time)
        p, out = empty(bqk + (t, w), qd.dtype), empty(bout + (t, dv), qd.dtype)
    else:
        p = (qs[..., None, :] @ _windows(kd, w))[..., 0, :]  # scores (..., T, w): q_i . k_{i-w+1+c}
        # the first w - 1 queries' band reaches before key 0: those columns are padding, masked
        np.copyto(p[..., :w - 1, :], -np.inf, where=_before_start(w))
        p -= np.fmax.reduce(p, axis=-1, keepdims=True)
        np.exp(p, out=p)
        p /= (p @ ones(w, p.dtype))[..., None]
        out = (p[..., None, :] @ np.swapaxes(_windows(vd, w), -1, -2))[..., 0, :]
    pairs = p.size  # the band's (query, key) pairs, padding included: T w per head, not T^2
    _charge_forward(pairs, d, dv, qd.nbytes + kd.nbytes + vd.nbytes, out, p)

    def grads(g):
        # the closure keeps p (the band), q, k, v, qs and out, as the square's does; the padded copies of k
        # and v are rebuilt here rather than kept, so the band is the only O(T w) array the ledger counts
        _charge_backward(pairs, d, dv, qd.nbytes + kd.nbytes + vd.nbytes, p, g)
        if shape_only:
            return tuple(empty(x.data.shape, g.dtype) if needs_grad(x) else None for x in (q, k, v))
        gv = unbroadcast(_scatter(p, g), vd.shape) if needs_grad(v) else None
        ds = (g[..., None, :] @ _windows(vd, w))[..., 0, :]  # dP on the band: g_i . v_{i-w+1+c}
        # softmax backward as in the square: ds = p * (dp - <dp, p>), with <dp, p> = g . out
        ds -= rowdot(g, out)[..., None]
        ds *= p
        gq = None
        if needs_grad(q):
            gq = (ds[..., None, :] @ np.swapaxes(_windows(kd, w), -1, -2))[..., 0, :]
            gq *= gq.dtype.type(sc)
            gq = unbroadcast(gq, qd.shape)
        gk = unbroadcast(_scatter(ds, qs), kd.shape) if needs_grad(k) else None
        return gq, gk, gv

    return record(out, (q, k, v), grads, "scaled_dot_product_attention")
