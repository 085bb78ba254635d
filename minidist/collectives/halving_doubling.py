"""Recursive halving and doubling (Rabenseifner): ring bandwidth with tree latency.

Property: all-reduce = all-gather o reduce-scatter (associativity and commutativity, book chapter
12, lab 06), and both halves can be done in log2 p exchange steps instead of p-1. For p = 2^k:

* reduce-scatter by recursive halving: at distance d = p/2, p/4, ..., 1 rank r swaps half of its
  current block with partner r xor d and adds in the half it keeps; rank r ends with chunk r.
  Cost k alpha + (p-1)/p n/beta (the halves shrink n/2, n/4, ..., n/p).
* all-gather by recursive doubling: the same steps backwards, d = 1, 2, ..., p/2, each rank sending
  everything it has.  Cost k alpha + (p-1)/p n/beta.
* all-reduce = both: 2k alpha + 2(p-1)/p n/beta.

Other p. All-reduce folds the r = p - 2^k extra ranks first: rank 2^k + j adds its whole buffer into
rank j, the 2^k ranks run the algorithm above, and rank j hands the result back, which adds
2(alpha + n/beta). For small buffers ``recursive_doubling`` swaps the whole buffer at every distance
instead: k (alpha + n/beta), half the latency for more bytes.

Reduce-scatter and all-gather cannot fold (a folded rank would still need its own chunk delivered),
so for other p they use the same distances on a rotated numbering (Bruck's schedule): at distance d
rank r exchanges with r - d and r + d (mod p) and the block shrinks or grows by d chunks, which
reaches every rank in ceil(log2 p) steps with the same (p-1)/p n/beta of traffic:
ceil(log2 p) alpha + (p-1)/p n/beta.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.comm import Comm, Pieces
from minidist.collectives.registry import register
from minidist.collectives.ring import span, split
from minidist.runtime.ops import ReduceOp


def _pow2(p: int) -> bool:
    return p & (p - 1) == 0


def _block(chunks: list[np.ndarray], lo: int, hi: int) -> np.ndarray:
    """Chunks lo..hi-1 (consecutive views of one flat buffer) as one view."""
    if hi - lo == 1:
        return chunks[lo]
    if type(chunks) is Pieces:
        return chunks.run(lo, hi)
    return span(chunks[lo:hi])


def halving(c: Comm, chunks: list[np.ndarray], op: ReduceOp) -> None:
    """Recursive halving reduce-scatter over p = 2^k ranks: rank r ends with chunks[r] reduced."""
    p, r = c.size, c.rank
    lo, hi = 0, p
    d = p // 2
    while d:
        partner, mid = r ^ d, lo + d
        if r & d:  # keep the upper half of the current block
            send, keep, lo = (lo, mid), (mid, hi), mid
        else:
            send, keep, hi = (mid, hi), (lo, mid), mid
        c.sendrecv(_block(chunks, *send), partner, _block(chunks, *keep), partner, op=op)
        d //= 2


def doubling(c: Comm, chunks: list[np.ndarray]) -> None:
    """Recursive doubling all-gather over p = 2^k ranks, starting from rank r holding chunks[r]."""
    p, r = c.size, c.rank
    d = 1
    while d < p:
        partner = r ^ d
        mine, theirs = r & ~(d - 1), partner & ~(d - 1)
        c.sendrecv(_block(chunks, mine, mine + d), partner, _block(chunks, theirs, theirs + d), partner)
        d *= 2


def _folded(c: Comm, buf: np.ndarray, op: ReduceOp, body) -> None:
    """Run ``body(inner_comm)`` on the largest power of two q <= p, the other p - q ranks folded in."""
    p, r = c.size, c.rank
    if p == 1:
        return
    q = 1 << (p.bit_length() - 1)
    if r >= q:  # a remainder rank: fold into rank r - q, get the answer back at the end
        c.send(buf, r - q)
        c.recv(buf, r - q)
        return
    if r < p - q:
        c.recv(buf, r + q, op=op)
    body(c.sub(range(q)) if q < p else c)
    if r < p - q:
        c.send(buf, r + q)


@register("all_reduce", "halving_doubling")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    def rabenseifner(inner: Comm) -> None:
        chunks = split(buf, inner.size)
        halving(inner, chunks, op)
        doubling(inner, chunks)

    _folded(c, buf, op, rabenseifner)


@register("all_reduce", "recursive_doubling")
def all_reduce_doubling(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    """The latency-optimal all-reduce for small buffers: log2 p exchanges of the whole buffer.

    At distance d = 1, 2, ..., q/2 rank r swaps its running result with r xor d and combines the two
    (both partners compute the same values, as x + y == y + x exactly). Cost on p = 2^k ranks:
    k (alpha + n/beta), half the latency of Rabenseifner for k times the bytes; other p fold first,
    adding 2 (alpha + n/beta).
    """
    if c.size & (c.size - 1):
        _folded(c, buf, op, lambda inner: _doubling(inner, buf, op))
    else:  # a power of two: nothing to fold (the common case, kept short for small buffers)
        _doubling(c, buf, op)


def _doubling(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    d, r = 1, c.rank
    while d < c.size:
        c.sendrecv(buf, r ^ d, buf, r ^ d, op=op)  # ours leaves before theirs is added
        d *= 2


def _rotated(chunks: list[np.ndarray], start: int) -> np.ndarray:
    """A private flat copy of the chunks in the order start, start+1, ... (mod p)."""
    return np.concatenate(chunks[start:] + chunks[:start])


@register("reduce_scatter", "halving_doubling")
def reduce_scatter(c: Comm, out: np.ndarray, ins: list, op: ReduceOp) -> None:
    p, r = c.size, c.rank
    if _pow2(p):
        halving(c, ins, op)
        out[...] = ins[r]
        return
    # Bruck's schedule, reversed: before the step at distance d rank r holds partial sums for chunks
    # r .. r+2d-1 (mod p; all p at first); it passes the upper part to r + d, keeps r .. r+d-1 and
    # adds in what r - d passes it for those.
    m = out.size
    tmp = _rotated(ins, r)  # tmp[j*m:(j+1)*m] is chunk (r + j) mod p
    d = 1 << ((p - 1).bit_length() - 1)
    while d:
        cnt = min(d, p - d)
        c.sendrecv(tmp[d * m : (d + cnt) * m], (r + d) % p, tmp[: cnt * m], (r - d) % p, op=op)
        d //= 2
    out[...] = tmp[:m]


@register("all_gather", "halving_doubling")
def all_gather(c: Comm, outs: list, inp: np.ndarray) -> None:
    p, r = c.size, c.rank
    whole = span(outs)
    if _pow2(p) and whole is not None:
        outs[r][...] = inp
        doubling(c, outs)
        return
    # Bruck's schedule: rank r collects chunks r, r+1, ... (mod p) at the front of a private buffer;
    # at distance d it sends the first min(d, p-d) of them to r - d and appends what r + d sends.
    m = inp.size
    tmp = np.empty(p * m, inp.dtype)
    tmp[:m] = inp
    d = 1
    while d < p:
        cnt = min(d, p - d)
        c.sendrecv(tmp[: cnt * m], (r - d) % p, tmp[d * m : (d + cnt) * m], (r + d) % p)
        d *= 2
    for j in range(p):
        outs[(r + j) % p][...] = tmp[j * m : (j + 1) * m]
