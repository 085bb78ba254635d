"""Context parallelism: attention over a sequence no device holds whole (chapter 17, lab 11).

Everything in a transformer except attention treats positions independently, so a sequence split
over ``cp`` devices runs every other layer locally. Attention needs every key for every query;
two ways to provide them, both exact:

* **Ring attention** (Liu et al. 2023) rests on the associative online-softmax merge
  (``online_softmax.py``): queries stay put while the key/value blocks travel around the ring.
  At each of the ``cp`` steps a rank posts ``isend`` of the block it holds to its successor and
  ``irecv`` of the next block from its predecessor, then merges the block it holds into its
  queries' states while the transfer runs (double buffering). A step costs
  ``max(block compute, block transfer)``; K and V pass through every rank once, so each rank
  sends ``2 (cp-1)/cp b s h_kv`` elements per layer forward. The backward rotates K/V again and
  sends each block's gradient accumulator along with it, home after a full turn.
* **Ulysses** (DeepSpeed) re-partitions heads and positions instead (``ulysses.py``).

Causal masking makes some (query block, key block) pairs entirely masked; they are skipped, not
computed. With the sequence cut into ``cp`` contiguous chunks rank ``r`` then works on ``r + 1``
of the ``cp`` blocks it sees, so the last rank sets the pace. The **zigzag** layout cuts the
sequence into ``2 cp`` chunks and gives rank ``r`` chunks ``r`` and ``2 cp - 1 - r``: one early, one
late, and every rank computes the same number of block pairs at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import dist
from minidist.autograd import Function
from minidist.autograd.shape_only import c_order
from minidist.parallel.context.online_softmax import (
    _group,
    block_grads,
    block_state,
    causal_relation,
    finalize,
    merge,
)
from minidist.parallel.context.ulysses import check_attention_args, ulysses_attention

LAYOUTS = ("contiguous", "zigzag")
METHODS = ("ring", "ulysses")
_TAG_KV, _TAG_BWD_KV, _TAG_BWD_DKV = 17_000, 17_001, 17_002


@dataclass(frozen=True)
class CPGroup:
    """This rank's place in its context-parallel group and how the sequence is laid out on it.

    ``ranks``: the group's global ranks in group order (ring neighbours are found there). With
    ``size == 1`` nothing is communicated, so the functions also run outside ``md.launch``.
    """

    group: object = None
    size: int = 1
    rank: int = 0
    layout: str = "contiguous"
    ranks: tuple[int, ...] = (0,)
    algorithm: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"context parallel: layout must be one of {LAYOUTS}, got {self.layout!r}")

    @classmethod
    def of(cls, group=None, layout: str = "contiguous", algorithm: str | None = None) -> CPGroup:
        """The group of this rank (inside ``md.launch``; ``group=None``: all ranks)."""
        ranks = tuple(group.ranks) if group is not None else tuple(range(dist.get_world_size()))
        return cls(group, len(ranks), dist.get_rank(group), layout, ranks, algorithm)

    # -- the layout ----------------------------------------------------------------------
    def chunks(self, seq_len: int, rank: int | None = None) -> list[tuple[int, int]]:
        """The [lo, hi) position ranges ``rank`` holds, in local order."""
        r = self.rank if rank is None else rank
        p, pieces = self.size, self.size * (2 if self.layout == "zigzag" else 1)
        if seq_len % pieces:
            raise ValueError(f"context parallel: seq_len={seq_len} is not divisible into {pieces} chunks "
                             f"(cp={p}, layout={self.layout!r})")
        c = seq_len // pieces
        if self.layout == "contiguous":
            return [(r * c, (r + 1) * c)]
        return [(r * c, (r + 1) * c), ((2 * p - 1 - r) * c, (2 * p - r) * c)]

    def positions(self, seq_len: int, rank: int | None = None) -> np.ndarray:
        """Global positions held by ``rank`` (this rank by default), in local order."""
        return np.concatenate([np.arange(lo, hi) for lo, hi in self.chunks(seq_len, rank)])

    def shard(self, x: np.ndarray, axis: int = 1) -> np.ndarray:
        """This rank's positions of a full-sequence array (e.g. token ids (B, T), axis 1)."""
        return np.take(np.asarray(x), self.positions(np.shape(x)[axis]), axis=axis)

    def unshard(self, pieces: list[np.ndarray], axis: int = 1) -> np.ndarray:
        """Reassemble the full sequence from every rank's piece (in group order)."""
        n = sum(np.shape(p)[axis] for p in pieces)
        order = np.concatenate([self.positions(n, r) for r in range(self.size)])
        return np.take(np.concatenate(pieces, axis=axis), np.argsort(order), axis=axis)

    def _peer(self, offset: int) -> int:
        return self.ranks[(self.rank + offset) % self.size]


# -- ring attention ------------------------------------------------------------------------
def _pairs(cp: CPGroup, seq_len: int, src: int, causal: bool):
    """(local query slice, local key slice of ``src``'s block, mask or None) for every pair not skipped."""
    def local(chunks):
        out, off = [], 0
        for lo, hi in chunks:
            out.append(((lo, hi), slice(off, off + hi - lo)))
            off += hi - lo
        return out

    for qr, qs in local(cp.chunks(seq_len)):
        for kr, ks in local(cp.chunks(seq_len, src)):
            rel = causal_relation(qr, kr) if causal else "full"
            if isinstance(rel, str) and rel == "skip":
                continue
            yield qs, ks, None if isinstance(rel, str) else rel


def _rotate(cp: CPGroup, send: np.ndarray, recv: np.ndarray, tag: int) -> list:
    """Post this step's transfer: ``send`` to the successor, the predecessor's block into ``recv``."""
    return [dist.isend(send, cp._peer(1), tag=tag), dist.irecv(recv, cp._peer(-1), tag=tag)]


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class RingAttention(Function):
    """Exact attention with the key/value blocks rotating around the context-parallel ring."""

    @staticmethod
    def forward(ctx, q, k, v, cp, is_causal, scale):
        qd, kd, vd = q.data, k.data, v.data
        q5, _, _ = _group(qd, kd, "ring_attention")
        d, p, T = kd.shape[-1], cp.size, qd.shape[2] * cp.size
        kv = c_order(np.concatenate([kd, vd], axis=-1))  # one message per step
        spare = np.empty_like(kv)
        states = {}
        for t in range(p):
            src = (cp.rank - t) % p
            works = _rotate(cp, kv, spare, _TAG_KV) if t < p - 1 else []
            kv5 = kv[:, :, None]
            for qs, ks, mask in _pairs(cp, T, src, is_causal):
                st = block_state(q5[..., qs, :], kv5[..., ks, :d], kv5[..., ks, d:], scale, mask)
                key = (qs.start, qs.stop)
                states[key] = merge(states[key], st) if key in states else st
            _wait(works)
            if works:
                kv, spare = spare, kv
        outs, lses = [], []
        for lo, hi in sorted(states):  # every query sees at least its own key under a causal mask
            o, lse = finalize(states[(lo, hi)])
            outs.append(o)
            lses.append(lse)
        out = np.concatenate(outs, axis=-2)
        ctx.save_for_backward(qd, kd, vd, out, np.concatenate(lses, axis=-1))
        ctx.args = (cp, is_causal, scale)
        return out.reshape(qd.shape[:-1] + (vd.shape[-1],))

    @staticmethod
    def backward(ctx, g):
        qd, kd, vd, out, lse = ctx.saved_tensors
        cp, is_causal, scale = ctx.args
        q5, _, _ = _group(qd, kd, "ring_attention")
        d, p, T = kd.shape[-1], cp.size, qd.shape[2] * cp.size
        do = g.data.reshape(out.shape)
        delta = (do * out).sum(axis=-1)
        dq = np.zeros_like(q5)
        kv = c_order(np.concatenate([kd, vd], axis=-1))
        spare, acc_in = np.empty_like(kv), np.empty_like(kv)
        acc = np.zeros_like(kv)  # gradient of the block held now, summed over the ranks it has visited
        sent: list = []
        for t in range(p):
            src = (cp.rank - t) % p
            works = _rotate(cp, kv, spare, _TAG_BWD_KV) if t < p - 1 else []
            if t > 0:  # the accumulator of this block arrives from the predecessor while we compute
                works.append(_rotate_recv(cp, acc_in, _TAG_BWD_DKV))
            mine = np.zeros_like(kv)
            kv5 = kv[:, :, None]
            for qs, ks, mask in _pairs(cp, T, src, is_causal):
                a, b, c = block_grads(q5[..., qs, :], kv5[..., ks, :d], kv5[..., ks, d:], do[..., qs, :],
                                      lse[..., qs], delta[..., qs], scale, mask)
                dq[..., qs, :] += a
                mine[..., ks, :d] += b.sum(axis=2)
                mine[..., ks, d:] += c.sum(axis=2)
            _wait(works + sent)
            acc = mine + acc_in if t > 0 else mine
            if p > 1:  # pass the accumulator on; after the last step this sends it home
                sent = [_rotate_send(cp, acc, _TAG_BWD_DKV)]
            if t < p - 1:
                kv, spare = spare, kv
        if p > 1:
            home = np.empty_like(kv)
            _wait([_rotate_recv(cp, home, _TAG_BWD_DKV)] + sent)
            acc = home
        return dq.reshape(qd.shape), acc[..., :d], acc[..., d:], None, None, None


def _rotate_send(cp: CPGroup, arr: np.ndarray, tag: int):
    return dist.isend(arr, cp._peer(1), tag=tag)


def _rotate_recv(cp: CPGroup, arr: np.ndarray, tag: int):
    return dist.irecv(arr, cp._peer(-1), tag=tag)


def ring_attention(q, k, v, cp: CPGroup, is_causal: bool = True, scale: float | None = None):
    """Attention of this rank's queries over the whole sequence (ring attention).

    ``q`` (B, H, T/cp, d), ``k``/``v`` (B, G, T/cp, d): this rank's positions (``cp.positions``) of
    every head; G may be smaller than H (grouped-query attention: the smaller K/V is what travels).
    Returns this rank's rows of ``softmax(q k^T scale + causal mask) v``.
    """
    default = check_attention_args(q, k, v, cp, "ring_attention")
    sc = default if scale is None else float(scale)
    return RingAttention.apply(q, k, v, cp, bool(is_causal), sc)


# -- the model -----------------------------------------------------------------------------
def attention_core(cp: CPGroup, method: str = "ring"):
    """A core for ``CausalSelfAttention.core``: causal attention of local queries over the whole
    sequence, held in pieces by the cp group (ring attention or Ulysses)."""
    fn = ring_attention if method == "ring" else ulysses_attention

    def core(q, k, v):
        return fn(q, k, v, cp, is_causal=True)

    return core


def context_parallelize(model, cp: CPGroup, method: str = "ring"):
    """Make every attention layer of ``model`` (a GPT) attend across the cp group; returns the model.

    The weights are untouched (context parallelism replicates them). The position embedding is
    re-indexed so that row i of the local sequence gets the embedding of ``cp.positions(T)[i]``:
    the model then runs unchanged on ``cp.shard(idx)`` (see :func:`forward`).
    """
    if method not in METHODS:
        raise ValueError(f"context_parallelize: method must be one of {METHODS}, got {method!r}")
    window = getattr(model.config, "window", None)
    if window is not None:
        raise ValueError(f"context_parallelize: the model uses sliding-window attention (window={window}); ring and "
                         f"Ulysses attention implement the full causal mask only")
    for block in model.blocks:
        block.attn.core = attention_core(cp, method)

    def local_positions(_wpe, args):  # the model asks for rows 0..t-1 of its local sequence
        ids = np.asarray(args[0])
        return (cp.positions(ids.size * cp.size)[ids],)

    model.wpe.register_forward_pre_hook(local_positions)
    object.__setattr__(model, "cp_group", cp)
    return model


def forward(model, idx: np.ndarray, targets: np.ndarray | None, cp: CPGroup):
    """``GPT.forward`` on this rank's shard of the sequence: ``(logits, loss)`` of the local tokens.

    ``idx``/``targets`` are ``cp.shard(...)`` of the full (B, T) arrays. The loss is the mean over
    the local tokens; every rank holds the same number, so the global loss is the mean over the
    group and the weight gradients are the group's average (an all-reduce, like data parallelism).
    """
    if getattr(model, "cp_group", None) is not cp:
        raise ValueError("context parallel forward: call context_parallelize(model, cp) first")
    return model(idx, targets)  # attention and the position embedding already see the whole sequence
