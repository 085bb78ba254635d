"""Pairwise-exchange all-to-all: p-1 steps, in step k rank r sends to r+k and receives from r-k.

Property: an all-to-all is a transpose of the (sender, receiver) block matrix; it reduces nothing, so
every block must travel on its own (book chapter 11, used by expert and Ulysses parallelism, lab 12).
Stepping through the shifts k = 1 .. p-1 gives every rank exactly one message in and one out per
step, so no link is asked to carry two blocks at once and no rank floods the network:

    T = (p-1) (alpha + n/(p beta))        n = the data each rank holds (p equal blocks)

Blocks may have different sizes (uneven splits, some empty); a step then lasts as long as its
largest block.
"""

from __future__ import annotations

from minidist.collectives import register
from minidist.collectives.comm import Comm


@register("all_to_all", "pairwise")
def all_to_all(c: Comm, outs: list, ins: list) -> None:
    p, r = c.size, c.rank
    outs[r][...] = ins[r]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        c.sendrecv(ins[dst], dst, outs[src], src)
