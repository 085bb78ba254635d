"""Every collective x every algorithm x world size 1..8 x dtype x op equals a plain numpy reference.

One launch per world size runs every check inside the ranks (hundreds of collective calls), on a
cluster with small nodes so that the hierarchical algorithm really spans nodes (and meets nodes
with unequal rank counts, where it falls back to the flat ring). Float sums and averages are
compared with a tolerance (the algorithms add in different orders); MIN, MAX and integers exactly.
"""

import numpy as np
import pytest

import minidist.dist as dist
from minidist.collectives import ALGORITHMS
from minidist.hardware.cluster import Cluster
from minidist.runtime import ReduceOp, launch
from tests.test_runtime_collectives import NP_OPS, OPS

DTYPES = (np.float32, np.float64, np.int64)
SHAPES = ((0,), (), (7,), (37,))  # empty, scalar, fewer and more elements than ranks
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def data(rank: int, seed: int, shape, dtype, op=ReduceOp.SUM) -> np.ndarray:
    """Rank ``rank``'s contribution: normal floats (factors near 1 for PRODUCT), small integers."""
    rng = np.random.default_rng(7919 * seed + rank)
    if np.dtype(dtype).kind == "f":
        x = rng.uniform(0.5, 1.5, shape) if op is ReduceOp.PRODUCT else rng.standard_normal(shape)
        return np.asarray(x, dtype)
    lo, hi = (1, 3) if op is ReduceOp.PRODUCT else (-50, 50)
    return np.asarray(rng.integers(lo, hi, shape), dtype)


def reference(op: ReduceOp, xs: list) -> np.ndarray:
    out = xs[0].copy()
    for x in xs[1:]:
        out = NP_OPS[op](out, x)
    return out / len(xs) if op is ReduceOp.AVG else out


def check_every_algorithm(group_ranks=None, dtypes=DTYPES) -> int:
    """Inside a rank: run every registered algorithm of every collective on the group; return #checks."""
    me = dist.get_rank()
    group = None if group_ranks is None else dist.new_group(group_ranks)
    ranks = list(range(dist.get_world_size())) if group is None else list(group.ranks)
    p, i = len(ranks), ranks.index(me)
    count = 0
    seed = 0

    def same(got, want, what, dtype=None, op=None):
        nonlocal count
        msg = f"{what} on rank {me} (p={p}, ranks={ranks})"
        exact = dtype is None or np.dtype(dtype).kind != "f" or op in (ReduceOp.MIN, ReduceOp.MAX)
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=msg)
        else:
            np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * p, err_msg=msg)
        assert np.asarray(got).dtype == np.dtype(dtype or np.asarray(want).dtype), msg
        count += 1

    for alg in sorted(ALGORITHMS["all_reduce"]):
        for dtype in dtypes:
            for shape in SHAPES:
                for op in OPS:
                    if op is ReduceOp.AVG and dtype is np.int64:
                        continue
                    seed += 1
                    xs = [data(r, seed, shape, dtype, op) for r in ranks]
                    x = xs[i].copy()
                    dist.all_reduce(x, op=op, group=group, algorithm=alg)
                    same(x, reference(op, xs), f"all_reduce[{alg}] {op.name} {dtype.__name__} {shape}", dtype, op)

    for alg in sorted(ALGORITHMS["reduce"]):
        for dtype in dtypes:
            for shape in SHAPES[1:]:
                for op in OPS:
                    if op is ReduceOp.AVG and dtype is np.int64:
                        continue
                    seed += 1
                    root = ranks[seed % p]
                    xs = [data(r, seed, shape, dtype, op) for r in ranks]
                    y = xs[i].copy()
                    dist.reduce(y, dst=root, op=op, group=group, algorithm=alg)
                    want = reference(op, xs) if me == root else xs[i]
                    same(y, want, f"reduce[{alg}] {op.name} {dtype.__name__} {shape} to {root}", dtype, op)

    for alg in sorted(ALGORITHMS["broadcast"]):
        for dtype in dtypes:
            for shape in SHAPES:
                seed += 1
                root = ranks[seed % p]
                b = data(me, seed, shape, dtype)
                dist.broadcast(b, src=root, group=group, algorithm=alg)
                same(b, data(root, seed, shape, dtype), f"broadcast[{alg}] {dtype.__name__} {shape} from {root}")

    for dtype in dtypes:
        for k in (0, 3):  # rows per rank; 0 = empty pieces
            seed += 1
            xs = [data(r, seed, (k, 2), dtype) for r in ranks]
            for alg in sorted(ALGORITHMS["gather"]):
                root = ranks[(seed + len(alg)) % p]
                glist = [np.full((k, 2), -1, dtype) for _ in ranks] if me == root else None
                dist.gather(xs[i], glist, dst=root, group=group, algorithm=alg)
                if me == root:
                    same(np.concatenate(glist), np.concatenate(xs), f"gather[{alg}] to {root}")
            for alg in sorted(ALGORITHMS["scatter"]):
                root = ranks[(seed + len(alg)) % p]
                out = np.full((k, 2), -1, dtype)
                dist.scatter(out, xs if me == root else None, src=root, group=group, algorithm=alg)
                same(out, xs[i], f"scatter[{alg}] from {root}")
            for alg in sorted(ALGORITHMS["all_gather"]):
                outs = [np.full((k, 2), -1, dtype) for _ in ranks]
                dist.all_gather(outs, xs[i], group=group, algorithm=alg)
                same(np.concatenate(outs), np.concatenate(xs), f"all_gather[{alg}] k={k}")
                cat = np.full((p * k, 2), -1, dtype)
                dist.all_gather_into_tensor(cat, xs[i], group=group, algorithm=alg)
                same(cat, np.concatenate(xs), f"all_gather_into_tensor[{alg}] k={k}")
            for alg in sorted(ALGORITHMS["reduce_scatter"]):
                for op in OPS:
                    if op is ReduceOp.AVG and dtype is np.int64:
                        continue
                    seed += 1
                    full = [data(r, seed, (p * k, 2), dtype, op) for r in ranks]
                    before = full[i].copy()
                    rs = np.full((k, 2), -1, dtype)
                    dist.reduce_scatter_tensor(rs, full[i], op=op, group=group, algorithm=alg)
                    want = reference(op, full)[i * k : (i + 1) * k]
                    same(rs, want, f"reduce_scatter_tensor[{alg}] {op.name} {dtype.__name__} k={k}", dtype, op)
                    same(full[i], before, "reduce_scatter_tensor leaves its input alone")

        for alg in sorted(ALGORITHMS["all_to_all"]):
            seed += 1
            even = [data(r, seed, (2 * p, 3), dtype) for r in ranks]
            out = np.full((2 * p, 3), -1, dtype)
            dist.all_to_all_single(out, even[i], group=group, algorithm=alg)
            same(out, np.concatenate([even[r][2 * i : 2 * i + 2] for r in range(p)]), f"all_to_all[{alg}] even")
            split = [[(a * 5 + 3 * b + seed) % 4 for b in range(p)] for a in range(p)]  # rows a sends to b
            sent = [np.split(data(ranks[a], seed + 1, (sum(split[a]), 3), dtype), np.cumsum(split[a])[:-1])
                    for a in range(p)]
            out = np.full((sum(split[a][i] for a in range(p)), 3), -1, dtype)
            dist.all_to_all_single(out, np.concatenate(sent[i]), [split[a][i] for a in range(p)], split[i],
                                   group=group, algorithm=alg)
            same(out, np.concatenate([sent[a][i] for a in range(p)]), f"all_to_all[{alg}] uneven {split}")
    return count


def _world(p: int) -> int:
    n = check_every_algorithm()
    if p >= 3:  # a group of the odd ranks: group-local indices differ from global ranks
        odd = [r for r in range(p) if r % 2]
        if dist.get_rank() in odd:
            n += check_every_algorithm(odd, dtypes=(np.float64,))
    return n


@pytest.mark.parametrize("p", [p if p in (1, 2, 3, 4, 8) else pytest.param(p, marks=pytest.mark.slow)
                               for p in range(1, 9)])
def test_every_algorithm_matches_numpy(p):
    # nodes of 2 ranks (4 for p = 8): the hierarchical all-reduce spans several nodes
    cluster = Cluster(gpus_per_node=4 if p == 8 else 2)
    res = launch(_world, p, args=(p,), cluster=cluster, timeout=120)
    assert min(res) > 500


@pytest.mark.parametrize("p", [2, 3, 4])
def test_every_algorithm_when_every_message_is_read_in_place(monkeypatch, p):
    """Sends read in place complete only when their receiver has read them (no buffering): an algorithm
    that relied on a send completing before its peer posts the receive would deadlock here."""
    from minidist.runtime import cma, transport

    if not cma.enabled():
        pytest.skip("cross-memory attach is not available on this machine")
    monkeypatch.setattr(transport, "RENDEZVOUS_BYTES", 0)
    res = launch(_world, p, args=(p,), cluster=Cluster(gpus_per_node=2), timeout=60)
    assert min(res) > 500
