"""Binomial trees: reach p ranks in ceil(log2 p) rounds by doubling the informed set every round.

Property: associativity lets a reduction be regrouped as a tree, so the number of sequential steps
drops from p-1 to log2 p (book chapter 12, lab 06). Ranks are numbered relative to the root,
v = (rank - root) mod p. In round k (k = 0, 1, ...) every informed v < 2^k sends to v + 2^k; the
other collectives walk the same tree (reduce and gather backwards, scatter with halving blocks).

Costs on uniform links (T = alpha + n/beta, lg = ceil(log2 p), c = n/p for scatter/gather):

* broadcast: lg T, since the root sends its lg messages one after another;
* scatter:   lg alpha + (p-1) c/beta, since the root sends half, a quarter, ... of the blocks;
* reduce:    lg T when p is a power of two; in general floor(log2 p) T, the depth of the tree,
  because a rank receives from its children on separate links at the same time (the estimate's
  ceil(log2 p) assumes a receiver that takes one message at a time);
* gather:    lg alpha + (p-1) c/beta when p is a power of two (earlier otherwise, for the same reason);
* all_reduce = reduce to the root, then broadcast: 2 lg T for p a power of two.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.comm import Comm
from minidist.collectives.registry import register
from minidist.runtime.ops import ReduceOp


def _rounds(p: int) -> int:
    return (p - 1).bit_length()  # ceil(log2 p)


def _subtree(v: int, p: int) -> int:
    """How many ranks the subtree of relative rank v holds: v itself and every v + j, j < lowbit(v)."""
    if v == 0:
        return p
    return min(v & -v, p - v)


@register("broadcast", "tree")
def broadcast(c: Comm, buf: np.ndarray, root: int) -> None:
    p = c.size
    v = (c.rank - root) % p
    for k in range(_rounds(p)):
        bit = 1 << k
        if v < bit and v + bit < p:
            c.send(buf, (c.rank + bit) % p)
        elif bit <= v < 2 * bit:
            c.recv(buf, (c.rank - bit) % p)


@register("reduce", "tree")
def reduce(c: Comm, buf: np.ndarray, root: int, op: ReduceOp) -> None:
    p = c.size
    v = (c.rank - root) % p
    for k in range(_rounds(p)):
        bit = 1 << k
        if v & bit:  # my subtree is complete: hand it to the parent and leave
            c.send(buf, (c.rank - bit) % p)
            return
        if v + bit < p:
            c.recv(buf, (c.rank + bit) % p, op=op)


@register("all_reduce", "tree")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    reduce(c, buf, 0, op)
    broadcast(c, buf, 0)


@register("scatter", "tree")
def scatter(c: Comm, out: np.ndarray, chunks, root: int) -> None:
    p, m = c.size, out.size
    v = (c.rank - root) % p
    size = _subtree(v, p)
    if v == 0:  # the blocks in relative order, so that every subtree's blocks are contiguous
        tmp = np.concatenate([chunks[(root + i) % p] for i in range(p)]) if p > 1 else chunks[root].copy()
    else:
        tmp = np.empty(size * m, out.dtype)
        c.recv(tmp, (c.rank - (v & -v)) % p)
    for k in reversed(range(_rounds(size))):  # the far half first: it has the longest way to go
        bit = 1 << k
        if bit < size:
            cnt = min(bit, size - bit)
            c.send(tmp[bit * m : (bit + cnt) * m], (c.rank + bit) % p)
    out[...] = tmp[:m]


@register("gather", "tree")
def gather(c: Comm, inp: np.ndarray, chunks, root: int) -> None:
    p, m = c.size, inp.size
    v = (c.rank - root) % p
    size = _subtree(v, p)
    tmp = np.empty(size * m, inp.dtype)
    tmp[:m] = inp
    for k in range(_rounds(size)):
        bit = 1 << k
        if bit < size:
            cnt = min(bit, size - bit)
            c.recv(tmp[bit * m : (bit + cnt) * m], (c.rank + bit) % p)
    if v:
        c.send(tmp, (c.rank - (v & -v)) % p)
    else:
        for i in range(p):
            chunks[(root + i) % p][...] = tmp[i * m : (i + 1) * m]
