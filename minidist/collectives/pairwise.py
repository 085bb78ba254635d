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

from minidist.collectives.comm import Comm
from minidist.collectives.registry import register


@register("all_to_all", "pairwise")
def all_to_all(c: Comm, outs: list, ins: list) -> None:
    p, r = c.size, c.rank

    def keep_own() -> None:
        outs[r][...] = ins[r]

    if p == 1:
        keep_own()
        return
    if max(b.nbytes for b in ins) > c.in_place_bytes:
        _posted_early(c, outs, ins, keep_own)
        return
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        if k == 1:
            c.sendrecv_during(ins[dst], dst, outs[src], src, keep_own)
        else:
            c.sendrecv(ins[dst], dst, outs[src], src)


def _posted_early(c: Comm, outs: list, ins: list, keep_own) -> None:
    """The same steps, each message offered as soon as its simulated start is known.

    Step k starts (in simulated time) when step k-1 has ended, and that is known as soon as step
    k-1's header is in: its bytes can come later. So the receives are posted at the start and held,
    a step's send goes out as soon as the previous step's times are known (``wait_times``), and
    only the bytes of steps already timed are read while waiting for the next header (each straight
    from its sender's memory). This rank's own block is copied the first time a header is late.
    No rank waits for a peer to reach step k before it reads its block, which on fewer cores than
    ranks saves a wait per step; the simulated schedule is the one above, message for message.
    """
    p, r = c.size, c.rank
    recvs = [c.irecv(outs[(r - k) % p], (r - k) % p, held=True) for k in range(1, p)]
    sends, local = [], keep_own
    for k in range(1, p):
        sends.append(c.isend(ins[(r + k) % p], (r + k) % p))
        if c.wait_times(sends[-1], recvs[k - 1], meanwhile=local):
            local = None
    if local is not None:
        local()
    c.wait(*sends, *recvs)
