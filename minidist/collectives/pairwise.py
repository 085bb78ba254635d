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
    """The same steps with every receive posted at the start, as MPI libraries do for large blocks.

    Each block is then read from its sender's memory as soon as the sender starts step k, instead of
    when the receiver reaches step k: on fewer cores than ranks that removes a wait per step. The
    simulated schedule is unchanged: step k still starts when step k-1 ended (``wait`` moves the
    cursor to the latest of the step's completions and the cursor).
    """
    p, r = c.size, c.rank
    first = c.isend(ins[(r + 1) % p], (r + 1) % p)  # offered before any receive is posted (see Comm.sendrecv)
    recvs = {k: c.irecv(outs[(r - k) % p], (r - k) % p) for k in range(1, p)}
    for k in range(1, p):
        send = first if k == 1 else c.isend(ins[(r + k) % p], (r + k) % p)
        if k == 1:
            keep_own()
        c.wait(send, recvs[k])
