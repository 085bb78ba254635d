"""On uniform links every algorithm's simulated time equals its closed form (relative error < 1e-9).

The time is not computed by the algorithms: it emerges from their messages (alpha + n/beta each, one
message at a time per directed link). One 8-rank launch measures every (collective, algorithm, group
size 1..8, size) on the groups {0..p-1}: before each call the members move their clocks to a common
start time, and the call's duration is the latest member's end minus that start.
"""

import math

import numpy as np
import pytest

import minidist as md
import minidist.dist as dist
from minidist.estimate import collective_time, hierarchical_all_reduce_time
from minidist.hardware.cluster import Cluster
from minidist.hardware.specs import Link
from minidist.runtime import launch

ALPHA, BETA = 1e-5, 1e8
ELEMS = (840 * 2, 840 * 16)  # float32 elements: divisible by 2p for every p <= 8
SPACING = 0.01  # seconds between start times; every call here is far shorter
REL = 1e-9


def _pow2(p):
    return p & (p - 1) == 0


def _measure(cases, sizes=ELEMS):
    """Inside a rank: run ``cases`` (name, p, fn(group, n) -> nbytes) for every size; return durations."""
    me = dist.get_rank()
    out, t = {}, 0.0
    for name, p, fn in cases:
        for n in sizes:
            t += SPACING
            if me >= p:
                continue
            group = dist.new_group(range(p))
            dist.compute(seconds=t - dist.now(), name="align")
            nbytes = fn(group, n)
            out[name, p, nbytes] = dist.now() - t
    return out


def _cases():
    f4 = np.float32

    def ar(alg):
        def fn(g, n):
            x = np.ones(n, f4)
            dist.all_reduce(x, group=g, algorithm=alg)
            return x.nbytes
        return fn

    def rs(alg):
        def fn(g, n):
            p = g.size()
            out = np.empty(n // p, f4)
            dist.reduce_scatter_tensor(out, np.ones(n, f4), group=g, algorithm=alg)
            return 4 * n  # the full input
        return fn

    def ag(alg, into_tensor):
        def fn(g, n):
            p = g.size()
            x = np.ones(n // p, f4)
            if into_tensor:
                dist.all_gather_into_tensor(np.empty(n, f4), x, group=g, algorithm=alg)
            else:
                dist.all_gather([np.empty(n // p, f4) for _ in range(p)], x, group=g, algorithm=alg)
            return 4 * n  # the full output
        return fn

    def a2a(g, n):
        out = np.empty(n, f4)
        dist.all_to_all_single(out, np.ones(n, f4), group=g, algorithm="pairwise")
        return 4 * n  # what each rank holds

    def rooted(coll, alg):
        def fn(g, n):
            p, root = g.size(), g.ranks[-1]  # a root other than 0: the tree is relative to it
            if coll == "broadcast":
                dist.broadcast(np.ones(n, f4), src=root, group=g, algorithm=alg)
            elif coll == "reduce":
                dist.reduce(np.ones(n, f4), dst=root, group=g, algorithm=alg)
            elif coll == "scatter":
                chunks = [np.ones(n // p, f4) for _ in range(p)] if dist.get_rank() == root else None
                dist.scatter(np.empty(n // p, f4), chunks, src=root, group=g, algorithm=alg)
            else:
                glist = [np.empty(n // p, f4) for _ in range(p)] if dist.get_rank() == root else None
                dist.gather(np.ones(n // p, f4), glist, dst=root, group=g, algorithm=alg)
            return 4 * n
        return fn

    cases = []
    for p in range(1, 9):
        for alg in ("ring", "tree", "halving_doubling", "recursive_doubling", "bidirectional_ring", "hierarchical"):
            cases.append((("all_reduce", alg), p, ar(alg)))
        for alg in ("ring", "halving_doubling"):
            cases.append((("reduce_scatter", alg), p, rs(alg)))
            cases.append((("all_gather", alg), p, ag(alg, True)))
            cases.append((("all_gather_list", alg), p, ag(alg, False)))
        cases.append((("all_to_all", "pairwise"), p, a2a))
        for coll in ("broadcast", "reduce", "scatter", "gather"):
            cases.append(((coll, "tree"), p, rooted(coll, "tree")))
        cases.append((("broadcast", "ring"), p, rooted("broadcast", "ring")))
    return cases


def _run_all():
    return _measure(_cases())


@pytest.fixture(scope="module")
def measured():
    res = launch(_run_all, 8, cluster=Cluster.uniform(ALPHA, BETA), timeout=120)
    merged = {}
    for per_rank in res:
        for key, dt in per_rank.items():
            merged[key] = max(merged.get(key, 0.0), dt)
    assert all(dt < SPACING for dt in merged.values())
    return merged


def _cases_for(measured, coll, alg):
    got = sorted((p, n, dt) for (c, p, n), dt in measured.items() if c == (coll, alg))
    assert len(got) == 8 * len(ELEMS), (coll, alg)
    return got


ESTIMATED = [("all_reduce", "ring"), ("all_reduce", "halving_doubling"), ("all_reduce", "bidirectional_ring"),
             ("all_reduce", "hierarchical"), ("reduce_scatter", "ring"), ("reduce_scatter", "halving_doubling"),
             ("all_gather", "ring"), ("all_gather", "halving_doubling"), ("all_gather_list", "ring"),
             ("all_gather_list", "halving_doubling"), ("all_to_all", "pairwise"), ("broadcast", "tree"),
             ("scatter", "tree")]


@pytest.mark.parametrize("coll,alg", ESTIMATED)
def test_simulated_time_equals_the_estimate_for_every_p(measured, coll, alg):
    op = "all_gather" if coll == "all_gather_list" else coll
    model = "ring" if alg == "hierarchical" else alg  # one node: the hierarchical all-reduce is the ring
    for p, n, dt in _cases_for(measured, coll, alg):
        want = collective_time(op, n, p, ALPHA, BETA, model)
        assert dt == pytest.approx(want, rel=REL, abs=1e-15), (coll, alg, p, n, dt, want)


@pytest.mark.parametrize("coll", ["all_reduce", "reduce", "gather"])
def test_tree_fan_in_equals_the_estimate(measured, coll):
    """Reduce and gather receive from several children at once on separate links, so for p not a power
    of two the reduce finishes after floor(log2 p) rounds (the estimate says so); the estimate of gather
    is exact for powers of two and an upper bound otherwise."""
    for p, n, dt in _cases_for(measured, coll, "tree"):
        want = collective_time(coll, n, p, ALPHA, BETA, "tree")
        if coll != "gather" or _pow2(p):
            assert dt == pytest.approx(want, rel=REL, abs=1e-15), (coll, p, n, dt, want)
        else:
            assert dt < want, (coll, p, n, dt, want)
        step = ALPHA + n / BETA
        if coll == "reduce":
            assert dt == pytest.approx(math.floor(math.log2(p)) * step, rel=REL, abs=1e-15)
        if coll == "all_reduce":  # reduce, then the broadcast's ceil(log2 p) rounds
            lg = (p - 1).bit_length()
            assert dt == pytest.approx((math.floor(math.log2(p)) + lg) * step, rel=REL, abs=1e-15)


def test_recursive_doubling_all_reduce_costs_log_p_whole_buffer_exchanges(measured):
    for p, n, dt in _cases_for(measured, "all_reduce", "recursive_doubling"):
        q = 1 << (p.bit_length() - 1)
        step = ALPHA + n / BETA
        want = (q.bit_length() - 1) * step + (2 * step if q < p else 0.0)  # folding costs two more
        assert dt == pytest.approx(want, rel=REL, abs=1e-15), (p, n, dt, want)


def test_ring_broadcast_is_a_pipelined_chain(measured):
    for p, n, dt in _cases_for(measured, "broadcast", "ring"):
        want = 2 * (p - 1) * (ALPHA + n / (p * BETA))
        assert dt == pytest.approx(want, rel=REL, abs=1e-15), (p, n, dt, want)


def test_bus_bandwidth_of_the_simulated_ring_tends_to_beta(measured):
    """nccl-tests factors: busbw = n/T * 2(p-1)/p (all-reduce), (p-1)/p (all-gather, reduce-scatter);
    the latency term is what keeps it below beta."""
    for coll, factor in (("all_reduce", lambda p: 2 * (p - 1) / p), ("all_gather", lambda p: (p - 1) / p),
                         ("reduce_scatter", lambda p: (p - 1) / p)):
        for p, n, dt in _cases_for(measured, coll, "ring"):
            if p == 1:
                continue
            bw = md.estimate.bus_bandwidth(coll, n, p, dt)
            assert bw == pytest.approx(n / dt * factor(p), rel=1e-12)
            steps = 2 * (p - 1) if coll == "all_reduce" else p - 1
            # T = steps alpha + factor n/beta, so busbw = beta x (the bandwidth share of T)
            assert bw == pytest.approx(BETA * (factor(p) * n / BETA) / (steps * ALPHA + factor(p) * n / BETA),
                                       rel=1e-9)
            assert bw < BETA


# -- the two-level all-reduce on clusters whose network is slower than the node's links ----------------
INTRA = Link("fast", 2e-6, 4e8)
INTER = Link("slow", 1.5e-5, 5e7)


def _hier():
    def ar(g, n):
        x = np.ones(n, np.float32)
        dist.all_reduce(x, group=g, algorithm="hierarchical")
        return x.nbytes

    return _measure([(("all_reduce", "hierarchical"), p, ar) for p in (2, 4, 6, 8)])


@pytest.mark.parametrize("gpus_per_node", [2, 4])
def test_hierarchical_all_reduce_equals_the_two_level_formula(gpus_per_node):
    cluster = Cluster(gpus_per_node=gpus_per_node, intra_link=INTRA, inter_link=INTER)
    res = launch(_hier, 8, cluster=cluster, timeout=60)
    checked = 0
    for key in res[0]:
        _, p, n = key
        if p > gpus_per_node and p % gpus_per_node:
            continue  # unequal nodes: the flat ring (checked for correctness elsewhere)
        dt = max(r[key] for r in res if key in r)
        g, nodes = min(p, gpus_per_node), max(1, p // gpus_per_node)
        want = hierarchical_all_reduce_time(n, g, nodes, INTRA.alpha, INTRA.beta, INTER.alpha, INTER.beta)
        assert dt == pytest.approx(want, rel=REL), (gpus_per_node, p, n, dt, want)
        checked += 1
    assert checked >= 6


BIG_BLOCK = 1_100_000  # float32s per block: 4.4 MB, larger than a channel, so read in place (cma.py)


def _large_blocks():
    p, r = dist.get_world_size(), dist.get_rank()
    x = (np.arange(p * BIG_BLOCK, dtype=np.float32) % 1000) + 1000 * r  # block j goes to rank j
    out = np.empty_like(x)
    t0 = dist.now()
    dist.all_to_all_single(out, x, algorithm="pairwise")
    t_a2a = dist.now() - t0
    y = np.empty(p * BIG_BLOCK, np.float32)
    t0 = dist.now()
    dist.all_gather_into_tensor(y, x[:BIG_BLOCK], algorithm="ring")
    return out, y, t_a2a, dist.now() - t0


@pytest.mark.parametrize("p", [2, 3])
def test_blocks_read_in_place_keep_results_and_the_formula(p):
    """Large all-to-all blocks are received posted-early and the all-gather copies its own block while
    the neighbour reads it: the bytes and the simulated times must be those of the plain schedule."""
    res = launch(_large_blocks, p, cluster=Cluster.uniform(ALPHA, BETA), timeout=120)
    base = np.arange(p * BIG_BLOCK, dtype=np.float32) % 1000
    blocks = [base[j * BIG_BLOCK : (j + 1) * BIG_BLOCK] for j in range(p)]
    for r, (out, y, t_a2a, t_ag) in enumerate(res):
        np.testing.assert_array_equal(out, np.concatenate([blocks[r] + 1000 * j for j in range(p)]))
        np.testing.assert_array_equal(y, np.concatenate([blocks[0] + 1000 * j for j in range(p)]))
        nbytes = 4 * p * BIG_BLOCK
        assert t_a2a == pytest.approx(collective_time("all_to_all", nbytes, p, ALPHA, BETA, "pairwise"), rel=REL)
        assert t_ag == pytest.approx(collective_time("all_gather", nbytes, p, ALPHA, BETA, "ring"), rel=REL)


def _skewed_all_to_all():
    p, r = dist.get_world_size(), dist.get_rank()
    dist.compute(flops=1e9 * ((3 * r) % p + 1))  # the ranks reach the call at different simulated times
    send = [100 + 2000 * ((r * j + j) % 4) for j in range(p)]  # uneven blocks: steps of different lengths
    recv = [100 + 2000 * ((j * r + r) % 4) for j in range(p)]
    x = np.concatenate([np.full(n, 10.0 * r + j, np.float32) for j, n in enumerate(send)])
    out = np.empty(sum(recv), np.float32)
    dist.all_to_all_single(out, x, recv, send, algorithm="pairwise")
    return out, dist.now()


@pytest.mark.parametrize("p", [3, 4])
def test_all_to_all_posted_early_keeps_the_stepwise_schedule(monkeypatch, p):
    """Above ``in_place_bytes`` the pairwise all-to-all offers each step's message as soon as the step's
    simulated start is known (headers first, bytes later). Its results and every rank's simulated end must
    be those of the plain step-by-step exchange, here on unequal links, unequal blocks and skewed starts."""
    from minidist.runtime import transport

    cluster = Cluster(gpus_per_node=2, intra_link=INTRA, inter_link=INTER)
    plain = launch(_skewed_all_to_all, p, cluster=cluster, timeout=60)
    monkeypatch.setattr(transport, "RENDEZVOUS_BYTES", 0)  # every block is now 'large': the posted-early path
    early = launch(_skewed_all_to_all, p, cluster=cluster, timeout=60)
    for r, ((want, t_want), (got, t_got)) in enumerate(zip(plain, early)):
        np.testing.assert_array_equal(got, want)
        assert t_got == pytest.approx(t_want, rel=1e-12), (r, t_got, t_want)
