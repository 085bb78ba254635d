"""Comm.exchange: a step's small messages posted together and taken in one pass, with the times of one by one.

The direct algorithms (all-to-all, barrier, broadcast, scatter, gather) post their messages through
``Comm.exchange``. Its fast path writes every send straight into a slot and reads every receive that has
arrived in one pass; the general path posts ``isend``/``irecv`` one by one. Both must give the same bytes, the
same simulated end on every rank and the same link events, here on unequal links, skewed starts and uneven
blocks; and ranks that disagree must still be refused.
"""

import numpy as np
import pytest

import minidist.dist as dist
from minidist.hardware.cluster import Cluster
from minidist.hardware.specs import Link
from minidist.runtime import launch
from minidist.runtime.errors import RankError
from minidist.runtime.transport import Transport

INTRA, INTER = Link("intra", 2e-6, 4e8), Link("inter", 7e-6, 5e7)
CLUSTER = Cluster(gpus_per_node=2, intra_link=INTRA, inter_link=INTER)


def _direct_calls():
    p, r = dist.get_world_size(), dist.get_rank()
    dist.compute(flops=1e9 * ((3 * r) % p + 1))  # the ranks reach each call at different simulated times
    out = {}
    send = [3 + 5 * ((r * j + j) % 4) for j in range(p)]  # uneven blocks
    recv = [3 + 5 * ((j * r + r) % 4) for j in range(p)]
    x = np.concatenate([np.full(n, 10.0 * r + j) for j, n in enumerate(send)])
    y = np.empty(sum(recv))
    dist.all_to_all_single(y, x, recv, send, algorithm="direct")
    out["all_to_all"] = (y, dist.now())
    dist.barrier(algorithm="direct")
    out["barrier"] = (None, dist.now())
    b = np.arange(6.0) * (r + 1)
    dist.broadcast(b, src=p - 1, algorithm="direct")
    out["broadcast"] = (b, dist.now())
    piece = np.empty(4)
    chunks = [np.full(4, 100.0 + i) for i in range(p)] if r == 1 else None
    dist.scatter(piece, chunks, src=1, algorithm="direct")
    out["scatter"] = (piece, dist.now())
    glist = [np.empty(4) for _ in range(p)] if r == 0 else None
    dist.gather(np.full(4, r + 0.5), glist, dst=0, algorithm="direct")
    out["gather"] = (None if glist is None else np.concatenate(glist), dist.now())
    return out


@pytest.mark.parametrize("p", [3, 4])
def test_exchange_gives_the_bytes_and_times_of_one_message_at_a_time(monkeypatch, p):
    fast = launch(_direct_calls, p, cluster=CLUSTER, timeout=60)
    monkeypatch.setattr(Transport, "exchange_small", lambda self, *a, **k: None)  # the general path, one by one
    slow = launch(_direct_calls, p, cluster=CLUSTER, timeout=60)
    for r, (got, want) in enumerate(zip(fast, slow)):
        for name, (arr, t) in want.items():
            if arr is not None:
                np.testing.assert_array_equal(got[name][0], arr)
            assert got[name][1] == t, (r, name, got[name][1], t)
    assert fast.trace.events == slow.trace.events  # every message on the same link at the same times


def test_exchange_results_are_the_data():
    def fn():
        p, r = dist.get_world_size(), dist.get_rank()
        x = np.arange(2.0 * p) + 100 * r
        y = np.empty(2 * p)
        dist.all_to_all_single(y, x, algorithm="direct")
        b = np.full(3, float(r))
        dist.broadcast(b, src=2, algorithm="direct")
        return y, b

    p = 4
    for r, (y, b) in enumerate(launch(fn, p, timeout=60)):
        np.testing.assert_array_equal(y, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * s for s in range(p)]))
        np.testing.assert_array_equal(b, np.full(3, 2.0))


def test_ranks_that_disagree_in_an_exchange_are_refused():
    def fn():
        n = 6 if dist.get_rank() == 1 else 4  # rows of n: the signatures differ
        dist.all_to_all_single(np.zeros((3, n)), np.zeros((3, n)), algorithm="direct")

    with pytest.raises(RankError) as info:
        launch(fn, 3, timeout=30)
    for r, (name, msg, _) in info.value.errors.items():
        assert name == "MismatchError", (r, name, msg)
        assert "rank 1 called" in msg and "(6,)" in msg, msg
