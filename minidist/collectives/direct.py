"""Direct (naive) collectives: one root talks to everybody, one peer after another.

The first algorithm anyone writes, and the baseline the others are measured against (chapter 12).
Reductions go to group rank 0 (or the given root), which then sends the result back out: the
root's links carry everything, so the cost grows with the group size. With the root handling
its peers in turn, a fan-out costs ``(p-1)(alpha + n/beta)``; a fan-in overlaps on the peers'
separate links but the root still reduces the pieces in rank order (deterministic rounding).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.comm import Comm
from minidist.collectives.registry import register
from minidist.runtime.ops import ReduceOp


def _others(c: Comm, root: int):
    return [i for i in range(c.size) if i != root]


@register("broadcast", "direct")
def broadcast(c: Comm, buf: np.ndarray, root: int) -> None:
    if c.rank == root:  # one peer after another: each send starts when the one before it has arrived
        c.exchange([(buf, i) for i in _others(c, root)], chain=True)
    else:
        c.recv(buf, root)


@register("reduce", "direct")
def reduce(c: Comm, buf: np.ndarray, root: int, op: ReduceOp) -> None:
    if c.rank == root:
        for i in _others(c, root):
            c.recv(buf, i, op=op)
    else:
        c.send(buf, root)


@register("all_reduce", "direct")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    reduce(c, buf, 0, op)
    broadcast(c, buf, 0)


@register("scatter", "direct")
def scatter(c: Comm, out: np.ndarray, chunks, root: int) -> None:
    if c.rank == root:
        c.exchange([(chunks[i], i) for i in _others(c, root)], chain=True)
        out[...] = chunks[root]
    else:
        c.recv(out, root)


@register("gather", "direct")
def gather(c: Comm, inp: np.ndarray, chunks, root: int) -> None:
    if c.rank == root:  # the peers' links work at once: the root takes each piece as it comes
        c.exchange([], [(chunks[i], i) for i in _others(c, root)])
        chunks[root][...] = inp
    else:
        c.send(inp, root)


@register("all_gather", "direct")
def all_gather(c: Comm, outs: list, inp: np.ndarray) -> None:
    gather(c, inp, outs if c.rank == 0 else None, 0)
    for i in range(c.size):
        broadcast(c, outs[i], 0)


@register("reduce_scatter", "direct")
def reduce_scatter(c: Comm, out: np.ndarray, ins: list, op: ReduceOp) -> None:
    for piece in ins:  # reduce every piece at the root (pieces are views of one flat buffer)
        reduce(c, piece, 0, op)
    scatter(c, out, ins if c.rank == 0 else None, 0)


@register("all_to_all", "direct")
def all_to_all(c: Comm, outs: list, ins: list) -> None:
    # no root here: every rank posts all its sends, then takes its receives as they come
    others = [i for i in range(c.size) if i != c.rank]
    outs[c.rank][...] = ins[c.rank]
    c.exchange([(ins[i], i) for i in others], [(outs[i], i) for i in others])


_EMPTY = np.zeros(0, np.uint8)


@register("barrier", "direct")
def barrier(c: Comm) -> None:
    token = np.zeros(0, np.uint8)
    if c.rank == 0:  # hear from everyone (in whatever order they come), then release them one after another
        c.exchange([], [(token, i) for i in range(1, c.size)])
        c.exchange([(_EMPTY, i) for i in range(1, c.size)], chain=True)
    else:
        c.send(_EMPTY, 0)
        c.recv(token, 0)
