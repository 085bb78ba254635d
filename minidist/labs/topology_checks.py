"""Checks for lab 07, topology-aware collectives (book chapter 13a)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist import dist
from minidist.estimate import collective_time, hierarchical_all_reduce_time
from minidist.hardware.cluster import Cluster
from minidist.hardware.specs import Link
from minidist.labs.check import attempt, fail, number, passed
from minidist.labs.ranks import compare_ranks, run_ranks


def _two_level(gpus_per_node: int, alpha_intra: float, beta_intra: float, alpha_inter: float, beta_inter: float):
    intra = Link("intra", alpha_intra, beta_intra)
    inter = Link("inter", alpha_inter, beta_inter)
    return Cluster("H100-80GB-SXM", gpus_per_node, intra, inter)


def _run_hier(fn, n, gpus_per_node):
    r = dist.get_rank()
    x = (np.arange(n, dtype=np.float64) + 1.0) * (r + 1)
    t0 = dist.now()
    fn(x, gpus_per_node)
    return x, dist.now() - t0


def check_hierarchical_all_reduce(fn: Callable[[np.ndarray, int], None]) -> None:
    """``fn(x, gpus_per_node)`` sums ``x`` over all ranks in place, in three phases, at the two-level cost."""
    consts = (1e-6, 300e9, 5e-6, 50e9)
    for G, N in [(2, 2), (4, 2), (2, 3)]:
        p, n = G * N, 24 * G * N
        cluster = _two_level(G, *consts)
        res = run_ranks("hierarchical_all_reduce", _run_hier, p, args=(fn, n, G), cluster=cluster,
                        hint="build the intra-node group from the ranks of your node and the inter-node group from the "
                             "ranks with your local index on every node")
        want = (np.arange(n, dtype=np.float64) + 1.0) * sum(range(1, p + 1))

        def diagnose(rank, got, w, G=G, N=N, n=n):
            base = np.arange(n, dtype=np.float64) + 1.0
            if got.shape == base.shape and np.array_equal(got, base * (rank + 1)):
                return ("x is unchanged: leave the sum in x itself (the last all-gather's output is x); returning "
                        "a result does not count")
            node_sums = [base * sum(range(a * G + 1, a * G + G + 1)) for a in range(N)]
            inter = ("the inter-node group holds one rank per node, the ones with your local index (local, "
                     "local + G, local + 2G, ...)")
            if np.allclose(got, node_sums[rank // G]):
                return ("each rank holds only its node's sum: the inter-node all-reduce of the shard is missing. "
                        f"Between the two intra-node phases all-reduce the 1/G shard across nodes; {inter}")
            # every rank's shard summed with every other rank's, whatever its index: no inter-node group
            mixed = sum(np.array_split(s, G)[j] for s in node_sums for j in range(G))
            if got.shape == base.shape and np.allclose(got, np.tile(mixed, G)):
                return f"the shards were all-reduced over every rank, mixing different chunks: {inter}"
            # the shards of one node summed with each other: the intra-node group used in place of the inter-node one
            own = sum(np.array_split(node_sums[rank // G], G))
            if got.shape == base.shape and np.allclose(got, np.tile(own, G)):
                return ("the shards were all-reduced inside the node (the intra-node group again), adding different "
                        f"chunks together and nothing from the other nodes: {inter}")
            return ("check the groups: the intra-node group is the G ranks of your node, the inter-node group the N "
                    "ranks with your local index on every node, and each phase runs on its own group")

        compare_ranks("hierarchical_all_reduce", [v[0] for v in res], [want] * p,
                      context=f"on {N} nodes of {G} GPUs", diagnose=diagnose, rtol=1e-12)
        t = max(v[1] for v in res)
        ideal = hierarchical_all_reduce_time(n * 8, G, N, *consts)
        if not math.isclose(t, ideal, rel_tol=1e-9):
            flat = collective_time("all_reduce", n * 8, p, consts[2], consts[3], "ring")
            hint = ("the phases should be: reduce-scatter inside the node (ring), all-reduce of the 1/G shard across "
                    "nodes (ring), all-gather inside the node (ring); pass algorithm='ring' to each")
            if math.isclose(t, flat, rel_tol=1e-6):
                hint = "that is the time of a flat ring over every rank: " + hint
            fail(f"hierarchical_all_reduce on {N} nodes of {G} GPUs is correct but its simulated time is off",
                 f"{ideal * 1e6:.3f} us (two-level formula)", f"{t * 1e6:.3f} us", hint)
    passed("hierarchical_all_reduce: correct on 2x2, 2x4 and 3x2 clusters, at the two-level formula's cost")


def check_two_level_times(flat_fn: Callable, hier_fn: Callable) -> None:
    """``flat_fn(n, G, N, a1, b1, a2, b2)`` = a flat ring paced by its slowest hop; ``hier_fn`` = the two-level time."""
    for args in [(2e9, 8, 8, 1e-6, 300e9, 5e-6, 50e9), (10e9, 8, 512, 1e-6, 900e9, 5e-6, 50e9),
                 (1e6, 4, 2, 1e-6, 450e9, 2e-6, 50e9)]:
        n, G, N, a1, b1, a2, b2 = args
        for name, fn, want, hint in [
            ("flat_ring_time", flat_fn, collective_time("all_reduce", n, G * N, a2, b2, "ring"),
             "every step waits for the slowest hop, which crosses the network: use the inter-node alpha and beta "
             "with p = G N"),
            ("hierarchical_time", hier_fn, hierarchical_all_reduce_time(n, G, N, a1, b1, a2, b2),
             "2(G-1) a1 + 2(G-1)/G n/b1 inside the node, plus a ring all-reduce of n/G across N nodes"),
        ]:
            got = attempt(name, fn, *args)
            if not math.isclose(number(f"{name}{args}", got), want, rel_tol=1e-9):
                fail(f"{name}{args}", want, got, hint)
    passed("flat_ring_time and hierarchical_time match the closed forms")


def edges_leaving(order: list[int], G: int, closed: bool = True) -> dict[int, int]:
    """node -> how many edges of the ring ``order`` leave it (``closed``: with the edge from the last GPU back to the
    first); the reference of ``check_flows_per_nic`` and, open, the slip it names."""
    out: dict[int, int] = {}
    for a, b in zip(order, order[1:] + order[:1] if closed else order[1:]):
        if a // G != b // G:
            out[a // G] = out.get(a // G, 0) + 1
    return out


def check_flows_per_nic(fn: Callable[[list[int], int], int]) -> None:
    """``fn(order, gpus_per_node)``: most ring edges leaving any one node, with one NIC per node."""

    def ref(order, G):
        return max(edges_leaving(order, G).values(), default=0)

    cases = [(list(range(16)), 8, "natural order: one edge leaves each node"),
             ([0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15], 8, "interleaved: every edge crosses nodes"),
             (list(range(8)), 8, "one node: nothing crosses the network"),
             ([0, 2, 4, 6, 1, 3, 5, 7], 2, "every edge crosses nodes: count, for each node, the edges that leave it"),
             ([0, 1, 4, 3, 5, 2], 2, "count, for each node, the ring edges that leave it; the busiest node sets C"),
             # the busiest node (GPUs 2, 3) owes one of its two edges to the one that closes the ring
             ([0, 1, 2, 4, 5, 3], 2, "count, for each node, the ring edges that leave it; the busiest node sets C")]
    for order, G, hint in cases:
        got = attempt("flows_per_nic", fn, list(order), G)
        want = ref(order, G)
        if got != want:
            leaving = edges_leaving(order, G)
            if got == max(edges_leaving(order, G, closed=False).values(), default=0):
                hint = ("count the edge that closes the ring, from the last GPU back to the first: "
                        "zip(order, order[1:] + order[:1])")
            elif leaving and got in (sum(leaving.values()) // len({a // G for a in order}),
                                     sum(leaving.values()) / len({a // G for a in order})):
                hint = ("that is the average over the nodes; the busiest NIC paces every step, so return the largest "
                        "count of any one node")
            fail(f"flows_per_nic({order}, {G})", want, got, hint)
    passed("flows_per_nic counts the ring edges that share a node's NIC")
