"""The ring's schedule is the book's: at reduce-scatter step k rank r sends chunk (r-k) mod p to r+1.

An instrumented Comm records, on every rank, which chunk of the buffer each message carries (from its
address inside the buffer) and a snapshot of the buffer after every step. Rank r contributes 2^r, so
a partially reduced chunk spells out, bit by bit, which ranks are already in it.
"""

import numpy as np
import pytest

import minidist.dist as dist
from minidist.collectives.comm import Comm
from minidist.runtime import launch


def _traced_all_reduce(algorithm: str, m: int):
    p, r = dist.get_world_size(), dist.get_rank()
    x = np.full(p * m, 1 << r, np.int64)  # chunk j is x[j*m:(j+1)*m]
    base = x.__array_interface__["data"][0]
    sends, snapshots = [], []
    isend, wait, sendrecv = Comm.isend, Comm.wait, Comm.sendrecv

    def chunk_of(buf):
        return (buf.__array_interface__["data"][0] - base) // (m * x.itemsize)

    def traced_isend(self, buf, peer, tag=0):
        sends.append((self.ranks[peer], int(chunk_of(buf)), buf.size))
        return isend(self, buf, peer, tag)

    def traced_wait(self, *handles):
        wait(self, *handles)
        snapshots.append(x.copy())

    def traced_sendrecv(self, sendbuf, dst, recvbuf, src, tag=0, op=None):
        sends.append((self.ranks[dst], int(chunk_of(sendbuf)), sendbuf.size))
        sendrecv(self, sendbuf, dst, recvbuf, src, tag, op)
        snapshots.append(x.copy())

    Comm.isend, Comm.wait, Comm.sendrecv = traced_isend, traced_wait, traced_sendrecv
    try:
        dist.all_reduce(x, algorithm=algorithm)
    finally:
        Comm.isend, Comm.wait, Comm.sendrecv = isend, wait, sendrecv
    return sends, snapshots, x


@pytest.mark.parametrize("p", [3, 4, 5])
def test_ring_all_reduce_follows_the_book_index_schedule(p):
    m = 2
    res = launch(_traced_all_reduce, p, args=("ring", m))
    everyone = (1 << p) - 1
    for r, (sends, snaps, x) in enumerate(res):
        assert len(sends) == 2 * (p - 1) and len(snaps) == 2 * (p - 1)
        for k in range(p - 1):  # reduce-scatter
            assert sends[k] == ((r + 1) % p, (r - k) % p, m), (r, k, sends[k])
            got = snaps[k][((r - k - 1) % p) * m]  # the chunk accumulated at step k
            want = sum(1 << ((r - j) % p) for j in range(k + 2))  # ranks r-k-1 .. r are in it
            assert got == want, (r, k, bin(got), bin(want))
        owned = (r + 1) % p
        assert snaps[p - 2][owned * m] == everyone  # after the reduce-scatter, chunk r+1 is complete
        for k in range(p - 1):  # all-gather
            assert sends[p - 1 + k] == ((r + 1) % p, (r - k + 1) % p, m), (r, k, sends[p - 1 + k])
        assert (x == everyone).all()


def test_bidirectional_ring_sends_half_each_way_every_step():
    p, m = 4, 4
    res = launch(_traced_all_reduce, p, args=("bidirectional_ring", m))
    for r, (sends, snaps, x) in enumerate(res):
        assert len(snaps) == 2 * (p - 1)  # as many steps as the ring ...
        assert len(sends) == 4 * (p - 1)  # ... but two messages per step, one each way
        assert {peer for peer, _, _ in sends[0::2]} == {(r + 1) % p}
        assert {peer for peer, _, _ in sends[1::2]} == {(r - 1) % p}
        assert {size for _, _, size in sends} == {m // 2}  # half a ring chunk
        assert (x == (1 << p) - 1).all()


def test_halving_doubling_partners_and_sizes():
    p, m = 8, 1
    res = launch(_traced_all_reduce, p, args=("halving_doubling", m))
    for r, (sends, _, x) in enumerate(res):
        peers = [peer for peer, _, _ in sends]
        sizes = [size for _, _, size in sends]
        assert peers == [r ^ 4, r ^ 2, r ^ 1, r ^ 1, r ^ 2, r ^ 4]
        assert sizes == [4, 2, 1, 1, 2, 4]  # halves shrink, then double back
        assert (x == (1 << p) - 1).all()
