"""Ring collectives: every rank talks only to its neighbours, and the data goes round in p-1 steps.

Property: the reduction is associative and commutative, so all-reduce = all-gather o reduce-scatter
(book chapters 11-12, lab 06). Cut the buffer into p chunks; in the reduce-scatter phase each step
passes one chunk to the right while the left neighbour's chunk is added in, so after p-1 steps
every rank owns one fully reduced chunk; the all-gather phase passes the finished chunks round once
more. Each rank sends 2(p-1)/p of the buffer, which is the cut-set lower bound, hence

    T = 2(p-1) alpha + 2(p-1)/p n/beta        (reduce-scatter or all-gather alone: half of it)

The index schedule is the book's: at reduce-scatter step k rank r sends chunk (r-k) mod p to r+1 and
accumulates chunk (r-k-1) mod p from r-1; afterwards rank r owns chunk (r+1) mod p; at all-gather
step k it sends chunk (r-k+1) mod p. ``shift`` rotates that schedule (reduce_scatter wants rank r to
end with chunk r), and ``hierarchical.py`` reuses the two phases inside a node.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.comm import Comm, Pieces, pieces
from minidist.collectives.registry import register
from minidist.runtime.ops import ReduceOp


def split(buf: np.ndarray, parts: int) -> Pieces:
    """``parts`` consecutive views of flat ``buf``, sizes differing by at most one element."""
    n = buf.shape[0]
    return pieces(buf, [(i + 1) * n // parts - i * n // parts for i in range(parts)])


def span(views: list[np.ndarray]) -> np.ndarray | None:
    """One flat view covering ``views`` if they lie back to back in memory (same dtype), else None."""
    if type(views) is Pieces and views.whole.flags.writeable:
        return views.run(0, len(views))
    first = views[0]
    if first.ndim != 1 or not first.flags.c_contiguous:
        return None
    addr, total = first.__array_interface__["data"][0], 0
    for v in views:
        if v.dtype != first.dtype or v.ndim != 1 or not v.flags.c_contiguous or not v.flags.writeable:
            return None
        if v.size and v.__array_interface__["data"][0] != addr + total:
            return None
        total += v.nbytes
    return np.lib.stride_tricks.as_strided(first, shape=(total // first.itemsize,), strides=(first.itemsize,))


def reduce_scatter_phase(c: Comm, chunks: list[np.ndarray], op: ReduceOp, shift: int = 0) -> int:
    """p-1 ring steps; return the index of the chunk this rank then owns fully reduced: (r+1+shift) mod p."""
    p, r = c.size, c.rank
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        c.sendrecv(chunks[(r - k + shift) % p], right, chunks[(r - k - 1 + shift) % p], left, op=op)
    return (r + 1 + shift) % p


def all_gather_phase(c: Comm, chunks: list[np.ndarray], shift: int = 0, first: int = 0) -> None:
    """p-1 ring steps starting from rank r owning chunk (r+1+shift) mod p; every rank ends with all.

    ``first`` skips steps a caller has already made."""
    p, r = c.size, c.rank
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(first, p - 1):
        c.sendrecv(chunks[(r - k + 1 + shift) % p], right, chunks[(r - k + shift) % p], left)


@register("all_reduce", "ring")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    if c.size == 1:
        return
    chunks = split(buf, c.size)
    reduce_scatter_phase(c, chunks, op)
    all_gather_phase(c, chunks)


@register("reduce_scatter", "ring")
def reduce_scatter(c: Comm, out: np.ndarray, ins: list, op: ReduceOp) -> None:
    # shift -1: rank r finishes with chunk r, which is what reduce_scatter promises
    mine = reduce_scatter_phase(c, ins, op, shift=-1)
    out[...] = ins[mine]


@register("all_gather", "ring")
def all_gather(c: Comm, outs: list, inp: np.ndarray) -> None:
    p, r = c.size, c.rank

    def keep_own() -> None:
        outs[r][...] = inp

    if p == 1:
        keep_own()
        return
    # step 0 sends our input itself, so copying it into our own block overlaps the neighbour's read
    c.sendrecv_during(inp, (r + 1) % p, outs[(r - 1) % p], (r - 1) % p, keep_own)
    all_gather_phase(c, outs, shift=-1, first=1)


@register("broadcast", "ring")
def broadcast(c: Comm, buf: np.ndarray, root: int) -> None:
    """A pipelined chain root -> root+1 -> ...: the buffer travels in p pieces so that every link
    works at once. Rank v holds piece i at step v+i, so the last rank is done after 2(p-1) steps:
    2(p-1)(alpha + n/(p beta)), about 2n/beta for large n (a binomial tree pays log2(p) n/beta)."""
    p = c.size
    if p == 1:
        return
    v = (c.rank - root) % p  # position along the chain
    nxt, prv = (c.rank + 1) % p, (c.rank - 1) % p
    pending = None
    for piece in split(buf, p):
        if v > 0:
            c.recv(piece, prv)
        if v < p - 1:
            c.wait(pending)  # one piece in flight per link keeps the pipeline honest
            pending = c.isend(piece, nxt)
    c.wait(pending)
