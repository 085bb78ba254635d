"""Ulysses: context parallelism by trading a sequence shard for a head shard (chapter 17, lab 11).

Attention mixes positions but never heads, the mirror image of everything else in a block. So with
the sequence cut over ``cp`` ranks, an all-to-all turns "every head, my positions" into "my ``H/cp``
heads, every position"; each rank then runs ordinary attention on its heads, and the inverse
all-to-all turns the output back (DeepSpeed-Ulysses, Jacobs et al. 2023). Four all-to-alls per layer
(q, k, v and the output), each moving (cp-1)/cp of a local shard: ``4 (cp-1) b s h / cp^2`` elements
per rank, and the head count must divide by ``cp``.
"""

from __future__ import annotations

import math

import numpy as np

from minidist import dist
from minidist.autograd import Function
from minidist.autograd import functional as F
from minidist.collectives import offered
from minidist.nn.attention import repeat_kv


def check_attention_args(q, k, v, cp, op: str) -> float:
    """Refuse what a context-parallel attention cannot take; return the default scale 1/sqrt(d)."""
    if not all(hasattr(cp, a) for a in ("size", "group", "positions")):  # a context_parallel.CPGroup
        raise TypeError(f"{op}: cp must be a CPGroup, got {type(cp).__name__}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3] or q.shape[2] != k.shape[2]:
        raise ValueError(f"{op}: q {q.shape}, k {k.shape}, v {v.shape} must be (B, H, T_local, d) and "
                         f"(B, G, T_local, d) with the same local sequence length")
    return 1.0 / math.sqrt(q.shape[-1])


def _seq_to_heads(x: np.ndarray, cp) -> np.ndarray:
    """(B, H, T/p, d) -> (B, H/p, T, d): my head block at every position, sequence in group-rank order."""
    B, H, t, d = x.shape
    p = cp.size
    inp = np.require(x.reshape(B, p, H // p, t, d).swapaxes(0, 1), requirements="C")  # block j goes to rank j
    out = np.empty_like(inp)
    dist.all_to_all_single(out, inp, group=cp.group, algorithm=offered("all_to_all", cp.algorithm))
    return np.require(out.transpose(1, 2, 0, 3, 4), requirements="C").reshape(B, H // p, p * t, d)


def _heads_to_seq(x: np.ndarray, cp) -> np.ndarray:
    """(B, H/p, T, d) -> (B, H, T/p, d): the inverse all-to-all."""
    B, h, T, d = x.shape
    p = cp.size
    inp = np.require(x.reshape(B, h, p, T // p, d).transpose(2, 0, 1, 3, 4), requirements="C")  # chunk j to rank j
    out = np.empty_like(inp)
    dist.all_to_all_single(out, inp, group=cp.group, algorithm=offered("all_to_all", cp.algorithm))
    return np.require(out.swapaxes(0, 1), requirements="C").reshape(B, p * h, T // p, d)


class SeqToHeads(Function):
    """All-to-all from sequence-sharded to head-sharded; its backward is the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x, cp):
        ctx.cp = cp
        return _seq_to_heads(x.data, cp)

    @staticmethod
    def backward(ctx, g):
        return _heads_to_seq(g.data, ctx.cp), None


class HeadsToSeq(Function):
    """All-to-all from head-sharded back to sequence-sharded; its backward is the forward all-to-all."""

    @staticmethod
    def forward(ctx, x, cp):
        ctx.cp = cp
        return _heads_to_seq(x.data, cp)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_heads(g.data, ctx.cp), None


def ulysses_attention(q, k, v, cp, is_causal: bool = True, scale: float | None = None):
    """Attention of this rank's positions by re-sharding heads (DeepSpeed-Ulysses): same contract as
    ``ring_attention`` (``context_parallel.py``). Needs ``H % cp == 0``; K/V with fewer heads than ``cp`` divides are
    repeated to H heads first (then they travel at full size)."""
    check_attention_args(q, k, v, cp, "ulysses_attention")
    H, G = q.shape[1], k.shape[1]
    if H % cp.size:
        raise ValueError(f"ulysses_attention: {H} heads cannot be split over cp={cp.size} ranks")
    if cp.size == 1:
        return F.scaled_dot_product_attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G), is_causal=is_causal,
                                              scale=scale)
    if G % cp.size:
        k, v, G = repeat_kv(k, H // G), repeat_kv(v, H // G), H
    qh, kh, vh = SeqToHeads.apply(q, cp), SeqToHeads.apply(k, cp), SeqToHeads.apply(v, cp)
    if H != G:
        kh, vh = repeat_kv(kh, H // G), repeat_kv(vh, H // G)
    T = qh.shape[2]
    mask = None
    causal = is_causal
    if is_causal and cp.layout != "contiguous":  # the gathered sequence is in group-rank order, not position order
        order = np.concatenate([cp.positions(T, r) for r in range(cp.size)])
        mask, causal = order[None, :] <= order[:, None], False
    y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, attn_mask=mask, scale=scale)
    return HeadsToSeq.apply(y, cp)
