"""Bidirectional ring: two half-size rings turning in opposite directions at the same time.

Property: links are full duplex (book chapter 12, lab 06). A plain ring only ever sends to the right,
so the link to the left neighbour idles. Cut the buffer in two halves: the first half runs the ring
all-reduce clockwise (to r+1), the second counter-clockwise (to r-1), step by step together. Each
step moves n/(2p) on each of the two directed links out of a rank, so the bandwidth term halves
while the number of steps stays 2(p-1):

    T = 2(p-1) alpha + (p-1)/p n/beta        (p >= 3)

The book's table quotes (p-1) alpha for the latency; that needs a different schedule (partial sums
converging on each chunk's owner from both sides) and is not what two half-rings cost. With p = 2
both directions use the same pair of links, so the algorithm is the plain ring: 2 alpha + n/beta.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import ring
from minidist.collectives.comm import Comm
from minidist.collectives.registry import register
from minidist.runtime.ops import ReduceOp


def _step(c: Comm, send_a, recv_a, send_b, recv_b, op) -> None:
    """Clockwise half (tag 0) and counter-clockwise half (tag 1) in one step."""
    r, p = c.rank, c.size
    right, left = (r + 1) % p, (r - 1) % p
    # sends first (see Comm.sendrecv)
    hs = (c.isend(send_a, right, 0), c.isend(send_b, left, 1),
          c.irecv(recv_a, left, 0, op), c.irecv(recv_b, right, 1, op))
    c.wait(*hs)


@register("all_reduce", "bidirectional_ring")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    p = c.size
    if p <= 2:
        ring.all_reduce(c, buf, op)
        return
    half = buf.shape[0] // 2
    a, b = ring.split(buf[:half], p), ring.split(buf[half:], p)
    r = c.rank
    m = (-r) % p  # my position on the mirrored ring, where "to the right" means to rank r-1
    for k in range(p - 1):  # reduce-scatter, the book's schedule on each ring
        _step(c, a[(r - k) % p], a[(r - k - 1) % p], b[(m - k) % p], b[(m - k - 1) % p], op)
    for k in range(p - 1):  # all-gather
        _step(c, a[(r - k + 1) % p], a[(r - k) % p], b[(m - k + 1) % p], b[(m - k) % p], None)
