"""Lab 06 ring check: a right value obtained without building the ring is rejected."""

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def ring_good(x, rebind: bool = False):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    chunks = np.array_split(x, p)
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        incoming = np.empty_like(chunks[(r - k - 1) % p])
        handle = md.dist.isend(chunks[(r - k) % p], right)
        md.dist.recv(incoming, left)
        handle.wait()
        if rebind:  # chunks[i] = chunks[i] + incoming: a new array in the list, x never sees the sum
            chunks[(r - k - 1) % p] = chunks[(r - k - 1) % p] + incoming
        else:
            chunks[(r - k - 1) % p] += incoming
    for k in range(p - 1):
        handle = md.dist.isend(chunks[(r - k + 1) % p], right)
        md.dist.recv(chunks[(r - k) % p], left)
        handle.wait()


def ring_from_the_library(x):
    md.dist.all_reduce(x, algorithm="ring")  # right values, right time, but nothing built


def ring_from_library_halves(x):
    p = md.dist.get_world_size()
    c = -(-x.size // p)
    buf = np.zeros(c * p)
    buf[:x.size] = x
    mine = np.empty(c)
    md.dist.reduce_scatter_tensor(mine, buf, algorithm="ring")
    md.dist.all_gather_into_tensor(buf, mine, algorithm="ring")
    x[...] = buf[:x.size]


def test_ring_check_rejects_library_collectives_and_accepts_the_ring(capsys):
    for fn in (ring_from_the_library, ring_from_library_halves):
        with pytest.raises(CheckFailed, match=r"called a library collective(.|\n)*isend of one chunk"):
            md.labs.check_ring_all_reduce(fn)
    md.labs.check_ring_all_reduce(ring_good)
    assert "ok: ring_all_reduce" in capsys.readouterr().out


def test_a_sum_that_rebinds_a_chunk_is_told_to_add_in_place():
    with pytest.raises(CheckFailed, match=r"still hold its own input: the sums never reached x(.|\n)*only rebinds"):
        md.labs.check_ring_all_reduce(lambda x: ring_good(x, rebind=True))


def _halving_doubling(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    lo, hi, steps, d = 0, len(x), [], p // 2
    while d >= 1:
        peer, mid = r ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r < peer else ((mid, hi), (lo, mid))
        incoming = np.empty(keep[1] - keep[0])
        h = md.dist.isend(x[give[0]:give[1]], peer)
        md.dist.recv(incoming, peer)
        h.wait()
        x[keep[0]:keep[1]] += incoming
        steps.append((peer, keep, give))
        lo, hi = keep
        d //= 2
    for peer, keep, give in reversed(steps):
        h = md.dist.isend(x[keep[0]:keep[1]], peer)
        md.dist.recv(x[give[0]:give[1]], peer)
        h.wait()


def _whole_buffer_doubling(x):
    """Right sums, log2 p exchanges of the whole buffer: the tree's bandwidth term."""
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    d = 1
    while d < p:
        incoming = np.empty_like(x)
        h = md.dist.isend(x.copy(), r ^ d)
        md.dist.recv(incoming, r ^ d)
        h.wait()
        x += incoming
        d *= 2


def test_halving_doubling_check_accepts_the_algorithm_and_names_a_whole_buffer_exchange():
    md.labs.check_halving_doubling_all_reduce(_halving_doubling)
    with pytest.raises(CheckFailed, match="send the half you are giving up"):
        md.labs.check_halving_doubling_all_reduce(_whole_buffer_doubling)
