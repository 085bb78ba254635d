"""The online softmax: attention over key blocks merged by an associative operation (chapter 17, lab 11).

Softmax attention of one query over keys split into blocks A and B is not a sum of the blocks'
outputs, because each block's softmax normalises by its own denominator. Keep per query the
*state* of a block instead: its running maximum score ``m``, the denominator ``s`` measured against
that maximum, and the unnormalised output ``o``:

    m = max_j x_j        s = sum_j exp(x_j - m)        o = sum_j exp(x_j - m) v_j

Two states combine by rescaling both to the larger maximum,

    m = max(m_A, m_B)    s = s_A e^(m_A - m) + s_B e^(m_B - m)    o = o_A e^(m_A - m) + o_B e^(m_B - m)

and the output is ``o / s``. This merge is associative and commutative with identity
``(-inf, 0, 0)``, so blocks can be visited in any order and grouped in any way: one device can
stream over them (FlashAttention), or devices can each hold some and pass the others around
(ring attention, ``context_parallel.py``). Only states of size O(queries) ever meet; the
(queries x keys) score matrix never exists in one place.

The backward needs no state merging: with the final log-sum-exp ``lse = m + log s`` each block
recomputes its probabilities ``p = exp(x - lse)`` exactly, so every block's gradient contribution
is independent of the others.

Arrays are numpy; batch dimensions broadcast (a key block of shape (B, G, 1, Tk, d) serves G
groups of query heads, which is how grouped-query attention keeps its smaller K/V).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from minidist.autograd import Function, cost
from minidist.autograd.ops import TRANSCENDENTAL


class SoftmaxState(NamedTuple):
    """Per query: running max ``m`` (..., Tq), denominator ``s`` (..., Tq), unnormalised output ``o`` (..., Tq, dv)."""

    m: np.ndarray
    s: np.ndarray
    o: np.ndarray


def identity_state(shape: tuple[int, ...], dv: int, dtype=np.float64, like: np.ndarray | None = None) -> SoftmaxState:
    """The neutral element of :func:`merge` for queries of batch shape ``shape`` (..., Tq), arrays like ``like``."""
    return SoftmaxState(np.full(shape, -np.inf, dtype, like=like), np.zeros(shape, dtype, like=like),
                        np.zeros(shape + (dv,), dtype, like=like))


def _finite(m: np.ndarray) -> np.ndarray:
    # A query that has seen no key yet has m = -inf; rescaling against 0 instead of -inf keeps
    # exp(-inf - 0) = 0 and avoids exp(-inf + inf) = nan.
    return np.where(np.isneginf(m), 0.0, m)


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Combine the states of two disjoint key blocks seen by the same queries (associative)."""
    m = np.maximum(a.m, b.m)
    mf = _finite(m)
    ca, cb = np.exp(a.m - mf), np.exp(b.m - mf)
    return SoftmaxState(m, a.s * ca + b.s * cb, a.o * ca[..., None] + b.o * cb[..., None])


def _scores(q: np.ndarray, k: np.ndarray, scale: float, mask: np.ndarray | None) -> np.ndarray:
    x = (q * q.dtype.type(scale)) @ np.swapaxes(k, -1, -2)
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    return x


def block_state(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                mask: np.ndarray | None = None) -> SoftmaxState:
    """The state of queries ``q`` (..., Tq, d) over one key block ``k`` (..., Tk, d), ``v`` (..., Tk, dv).

    ``mask`` (Tq, Tk), True where a query may see a key; a row with no visible key gives the identity.
    """
    x = _scores(q, k, scale, mask)
    m = x.max(axis=-1)
    p = np.exp(x - _finite(m)[..., None])
    charge_block("attention.block", q, k, v)
    return SoftmaxState(m, p.sum(axis=-1), p @ v)


def finalize(state: SoftmaxState | tuple) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)``: the normalised output o / s and the log-sum-exp m + log s (kept for the backward).

    Any ``(m, s, o)`` triple will do, a plain tuple included (what a merge written by hand returns)."""
    m, s, o = state
    with np.errstate(divide="ignore"):
        return o / s[..., None], m + np.log(s)


def block_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, lse: np.ndarray, delta: np.ndarray,
                scale: float, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key block's share of the attention gradients: ``(dq, dk, dv)``.

    ``lse`` is the final log-sum-exp of each query and ``delta = rowsum(dO * O)``; then
    ``p = exp(x - lse)`` are the exact probabilities of this block and
    ``dv = p^T dO``, ``ds = p (dO v^T - delta)``, ``dq = ds k scale``, ``dk = ds^T q scale``.
    dk and dv keep the broadcast shape of ``q``; the caller sums over broadcast axes.
    """
    x = _scores(q, k, scale, mask)
    p = np.exp(x - lse[..., None])
    dv = np.swapaxes(p, -1, -2) @ do
    ds = do @ np.swapaxes(v, -1, -2)
    ds -= delta[..., None]
    ds *= p
    sc = q.dtype.type(scale)
    dq = (ds @ k) * sc
    dk = (np.swapaxes(ds, -1, -2) @ q) * sc
    charge_block("attention.block.backward", q, k, v, backward=True)
    return dq, dk, dv


def charge_block(name: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, backward: bool = False) -> None:
    """Report one block's FLOPs and bytes to the simulated clock (no-op outside ``md.launch``)."""
    if cost._hook is None:
        return
    batch = int(np.prod(np.broadcast_shapes(q.shape[:-2], k.shape[:-2])))
    tq, tk, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    pairs = batch * tq * tk
    if backward:  # recompute the scores, then four products
        flops = 2 * pairs * d + 2 * pairs * (2 * d + 2 * dv) + (TRANSCENDENTAL + 4) * pairs
        nbytes = 2 * (q.nbytes + k.nbytes + v.nbytes) + 2 * q.nbytes
    else:
        flops = 2 * pairs * (d + dv) + (TRANSCENDENTAL + 4) * pairs
        nbytes = q.nbytes + k.nbytes + v.nbytes + q.nbytes // d * dv
    cost.charge(name, flops, nbytes, q.dtype)


def causal_relation(q_range: tuple[int, int], k_range: tuple[int, int]) -> str | np.ndarray:
    """How queries at positions [q0, q1) see keys at [k0, k1) under a causal mask.

    ``"skip"`` (every key is in every query's future: the block contributes nothing, so it is not
    computed), ``"full"`` (every key is visible: no mask) or the boolean (Tq, Tk) mask of a block
    that straddles the diagonal.
    """
    (q0, q1), (k0, k1) = q_range, k_range
    if k0 > q1 - 1:
        return "skip"
    if k1 - 1 <= q0:
        return "full"
    return _diagonal_mask(q1 - q0, k1 - k0, q0 - k0)


@lru_cache(maxsize=256)
def _diagonal_mask(tq: int, tk: int, offset: int) -> np.ndarray:
    """Key j visible to query i when j <= i + offset: only the sizes and the offset matter, and every step of
    every layer meets the same few blocks (a 2,048 x 2,048 mask costs ~0.1 ms), so each is built once, read-only."""
    mask = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset
    mask.flags.writeable = False
    return mask


def block_ranges(n: int, block: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of ``block`` positions covering ``n`` (the last may be shorter)."""
    if block < 1:
        raise ValueError(f"blockwise_attention: block_size must be >= 1, got {block}")
    return [(lo, min(lo + block, n)) for lo in range(0, n, block)]


def _group(q: np.ndarray, k: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray, int]:
    """View q (B, H, T, d) as (B, G, H/G, T, d) and k (B, G, T, d) as (B, G, 1, T, d) (grouped-query heads)."""
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{op}: q {q.shape} and k {k.shape} must be (B, H, T, d) and (B, G, T, d)")
    H, G = q.shape[1], k.shape[1]
    if H % G:
        raise ValueError(f"{op}: {H} query heads are not a multiple of {G} key/value heads")
    B, _, T, d = q.shape
    return q.reshape(B, G, H // G, T, d), k[:, :, None], H // G


class BlockwiseAttention(Function):
    """Attention computed block by block with the online softmax (one device, FlashAttention's schedule)."""

    @staticmethod
    def forward(ctx, q, k, v, block_size, is_causal, scale):
        qd, kd, vd = q.data, k.data, v.data
        q5, k5, _ = _group(qd, kd, "blockwise_attention")
        v5 = vd[:, :, None]
        T, S = qd.shape[2], kd.shape[2]
        qb, kb = block_ranges(T, block_size), block_ranges(S, block_size)
        outs, lses = [], []
        for q0, q1 in qb:
            st = identity_state(q5.shape[:3] + (q1 - q0,), vd.shape[-1], qd.dtype, like=qd)
            for k0, k1 in kb:
                rel = causal_relation((q0, q1), (k0, k1)) if is_causal else "full"
                if isinstance(rel, str) and rel == "skip":
                    continue
                mask = None if isinstance(rel, str) else rel
                st = merge(st, block_state(q5[..., q0:q1, :], k5[..., k0:k1, :], v5[..., k0:k1, :], scale, mask))
            o, lse = finalize(st)
            outs.append(o)
            lses.append(lse)
        out = np.concatenate(outs, axis=-2)
        ctx.save_for_backward(qd, kd, vd, out, np.concatenate(lses, axis=-1))
        ctx.args = (qb, kb, is_causal, scale)
        return out.reshape(qd.shape[:-1] + (vd.shape[-1],))

    @staticmethod
    def backward(ctx, g):
        qd, kd, vd, out, lse = ctx.saved_tensors
        qb, kb, is_causal, scale = ctx.args
        q5, k5, _ = _group(qd, kd, "blockwise_attention")
        v5 = vd[:, :, None]
        do = g.data.reshape(out.shape)
        delta = (do * out).sum(axis=-1)
        dq, dk, dv = np.zeros_like(q5), np.zeros(kd.shape, kd.dtype, like=kd), np.zeros(vd.shape, vd.dtype, like=vd)
        for q0, q1 in qb:
            for k0, k1 in kb:
                rel = causal_relation((q0, q1), (k0, k1)) if is_causal else "full"
                if isinstance(rel, str) and rel == "skip":
                    continue
                mask = None if isinstance(rel, str) else rel
                a, b, c = block_grads(q5[..., q0:q1, :], k5[..., k0:k1, :], v5[..., k0:k1, :], do[..., q0:q1, :],
                                      lse[..., q0:q1], delta[..., q0:q1], scale, mask)
                dq[..., q0:q1, :] += a
                dk[..., k0:k1, :] += b.sum(axis=2)
                dv[..., k0:k1, :] += c.sum(axis=2)
        return dq.reshape(qd.shape), dk, dv, None, None, None


def blockwise_attention(q, k, v, block_size: int, is_causal: bool = False, scale: float | None = None):
    """softmax(q k^T scale) v for q (B, H, T, d), k/v (B, G, S, d) with G dividing H, computed over
    blocks of ``block_size`` queries and keys merged by the online softmax; fully masked blocks are
    skipped. Equal to ``scaled_dot_product_attention`` (with k, v repeated to H heads)."""
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return BlockwiseAttention.apply(q, k, v, int(block_size), bool(is_causal), sc)
