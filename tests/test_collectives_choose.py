"""The default algorithm: trees for rooted ops, log p steps below the crossover, the ring above it,
hierarchical across nodes with a slower network."""

import numpy as np
import pytest

import minidist as md
import minidist.dist as dist
from minidist.collectives import choose, crossover_bytes
from minidist.hardware.cluster import Cluster
from minidist.runtime import launch


class FakeComm:
    """What ``choose`` looks at: the group's size, its ranks' nodes and the cluster."""

    def __init__(self, size, cluster, ranks=None):
        self.size, self.cluster = size, cluster
        self.ranks = list(range(size)) if ranks is None else ranks

    def node(self, i):
        return self.cluster.node_of(self.ranks[i])


H100 = Cluster.dgx_h100()


@pytest.mark.parametrize("p", [3, 4, 8, 64])
def test_crossover_is_the_estimates_ring_tree_crossover(p):
    l = H100.intra_link
    assert crossover_bytes(p, l.alpha, l.beta) == pytest.approx(md.estimate.ring_tree_crossover_bytes(p, l.alpha,
                                                                                                       l.beta))


def test_rooted_ops_use_trees_and_all_to_all_pairwise():
    c = FakeComm(8, H100)
    for coll in ("broadcast", "reduce", "scatter", "gather"):
        assert choose(coll, 1 << 20, c) == "tree"
    assert choose("all_to_all", 1 << 20, c) == "pairwise"
    assert choose("barrier", 0, c) == "direct"


def test_small_messages_take_log_p_steps_large_ones_the_ring():
    c = FakeComm(8, H100)
    n_star = crossover_bytes(8, H100.intra_link.alpha, H100.intra_link.beta)
    assert 5e5 < n_star < 1e6  # NCCL switches from tree to ring between 256 kB and 4 MB
    assert choose("all_reduce", int(n_star * 0.9), c) == "recursive_doubling"  # log p steps
    assert choose("all_reduce", int(n_star * 1.1), c) == "ring"
    # all_gather / reduce_scatter pass one rank's piece: the full size is 8 times that
    assert choose("all_gather", int(n_star * 0.9 / 8), c) == "halving_doubling"
    assert choose("reduce_scatter", int(n_star * 1.1 / 8), c) == "ring"
    # p = 2: one whole-buffer swap below alpha beta, the ring (two half-buffer steps) above
    ab = H100.intra_link.alpha * H100.intra_link.beta
    assert choose("all_reduce", int(ab * 0.9), FakeComm(2, H100)) == "recursive_doubling"
    assert choose("all_reduce", int(ab * 1.1), FakeComm(2, H100)) == "ring"
    assert choose("all_gather", 8, FakeComm(2, H100)) == "ring"


def test_latency_bound_all_reduce_takes_the_cheaper_of_doubling_and_rabenseifner():
    from minidist.collectives import _latency_bound_all_reduce

    a, b = 1e-5, 1e9
    for p in (3, 4, 6, 8):
        q = 1 << (p.bit_length() - 1)
        for n in (8, 10_000, 100_000, 10**6):
            got = _latency_bound_all_reduce(p, n, a, b)
            t = {alg: md.estimate.collective_time("all_reduce", n, p, a, b, "halving_doubling")
                 if alg == "halving_doubling" else
                 (q.bit_length() - 1 + (2 if q < p else 0)) * (a + n / b)
                 for alg in ("halving_doubling", "recursive_doubling")}
            assert t[got] == min(t.values()), (p, n, got, t)
    assert _latency_bound_all_reduce(8, 8, a, b) == "recursive_doubling"
    assert _latency_bound_all_reduce(8, 10**6, a, b) == "halving_doubling"


def test_hierarchical_when_the_group_spans_nodes_with_a_slower_network():
    two_nodes = FakeComm(16, H100)  # 2 x 8
    assert choose("all_reduce", 1 << 28, two_nodes) == "hierarchical"
    assert choose("all_reduce", 1 << 10, two_nodes) == "recursive_doubling"  # latency-bound
    uneven = FakeComm(12, H100)  # 8 + 4 ranks: no common chunk layout
    assert choose("all_reduce", 1 << 28, uneven) == "ring"
    flat = FakeComm(16, Cluster.uniform(1e-6, 1e10, gpus_per_node=8))  # nodes, but no slower network
    assert choose("all_reduce", 1 << 28, flat) == "ring"
    assert choose("all_gather", 1 << 28, two_nodes) == "ring"


ALPHA, BETA = 1e-5, 1e8


def _default_all_reduce(sizes):
    out = []
    for n in sizes:
        t0 = dist.now()
        dist.all_reduce(np.ones(n, np.float32))
        out.append(dist.now() - t0)
        dist.barrier()
    return out


def test_the_default_is_what_dist_uses():
    p = 4
    n_star = crossover_bytes(p, ALPHA, BETA)
    small, large = int(n_star / 4) // 64 * 64, int(n_star * 4) // 64 * 64  # bytes, 16 floats per rank
    res = launch(_default_all_reduce, p, args=([small // 4, large // 4],), cluster=Cluster.uniform(ALPHA, BETA))
    t_small, t_large = res[0]
    assert t_small == pytest.approx(2 * (ALPHA + small / BETA), rel=1e-9)  # recursive doubling: 2 swaps
    assert t_large == pytest.approx(md.estimate.collective_time("all_reduce", large, p, ALPHA, BETA, "ring"),
                                    rel=1e-9)
