"""Every collective against a plain numpy reference, world sizes 1..8 (chapter 11, labs 05-07).

``check_collectives(algorithm)`` runs inside a rank and checks every collective (every op, several
dtypes, roots, groups, uneven all-to-all) against numpy; other algorithm files reuse it.
"""

import functools
import time

import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import RankError, ReduceOp, launch

DTYPES = (np.float32, np.float64, np.int64)
OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)
NP_OPS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
          ReduceOp.MAX: np.maximum}


def data(rank: int, seed: int, shape, dtype, low=-20, high=20) -> np.ndarray:
    """What rank ``rank`` contributes: small integers, so every summation order is exact."""
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.integers(low, high, size=shape).astype(dtype)


def reference(op: ReduceOp, xs: list) -> np.ndarray:
    out = functools.reduce(NP_OPS[op], xs)
    return out / len(xs) if op is ReduceOp.AVG else out


def check_collectives(algorithm: str | None = None, group_ranks=None) -> int:
    """Run every collective on ``group_ranks`` (default: all) and compare with numpy; return #checks."""
    me = dist.get_rank()
    group = None if group_ranks is None else dist.new_group(group_ranks)
    ranks = list(range(dist.get_world_size())) if group is None else list(group.ranks)
    p, i = len(ranks), ranks.index(me)
    kw = {"group": group, "algorithm": algorithm}
    n = 0

    def eq(got, want, what):
        nonlocal n
        np.testing.assert_array_equal(got, want, err_msg=f"{what} on rank {me} (p={p}, algorithm={algorithm})")
        n += 1

    seed = 0
    for dtype in DTYPES:
        for shape in [(7,), (3, 5), (0,), ()]:
            for op in OPS:
                if op is ReduceOp.AVG and dtype is np.int64:
                    continue
                seed += 1
                lo, hi = (1, 3) if op is ReduceOp.PRODUCT else (-20, 20)
                xs = [data(r, seed, shape, dtype, lo, hi) for r in ranks]
                x = xs[i].copy()
                dist.all_reduce(x, op=op, **kw)
                eq(x, reference(op, xs), f"all_reduce {op} {dtype.__name__} {shape}")
                root = ranks[seed % p]
                y = xs[i].copy()
                dist.reduce(y, dst=root, op=op, **kw)
                eq(y, reference(op, xs) if me == root else xs[i], f"reduce {op} to {root}")
            root = ranks[(seed + 1) % p]
            b = data(me, seed, shape, dtype)
            dist.broadcast(b, src=root, **kw)
            eq(b, data(root, seed, shape, dtype), f"broadcast from {root}")

        # dim-0 collectives, shapes (k, 3) per rank
        for k in (1, 2):
            seed += 1
            xs = [data(r, seed, (k, 3), dtype) for r in ranks]
            outs = [np.zeros((k, 3), dtype) for _ in ranks]
            dist.all_gather(outs, xs[i], **kw)
            for r in range(p):
                eq(outs[r], xs[r], "all_gather")
            cat = np.zeros((p * k, 3), dtype)
            dist.all_gather_into_tensor(cat, xs[i], **kw)
            eq(cat, np.concatenate(xs), "all_gather_into_tensor")
            root = ranks[seed % p]
            glist = [np.zeros((k, 3), dtype) for _ in ranks] if me == root else None
            dist.gather(xs[i], glist, dst=root, **kw)
            if me == root:
                eq(np.concatenate(glist), np.concatenate(xs), f"gather to {root}")
            chunks = [data(root, seed + 100 + r, (k, 3), dtype) for r in range(p)]
            out = np.zeros((k, 3), dtype)
            dist.scatter(out, chunks if me == root else None, src=root, **kw)
            eq(out, chunks[i], f"scatter from {root}")
            for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
                if op is ReduceOp.AVG and dtype is np.int64:
                    continue
                full = [data(r, seed + 7, (p * k, 3), dtype) for r in ranks]
                rs = np.zeros((k, 3), dtype)
                before = full[i].copy()
                dist.reduce_scatter_tensor(rs, full[i], op=op, **kw)
                eq(rs, reference(op, full)[i * k : (i + 1) * k], f"reduce_scatter_tensor {op}")
                eq(full[i], before, "reduce_scatter_tensor leaves its input alone")

        # all-to-all: even and uneven splits (some empty)
        seed += 1
        even = [data(r, seed, (2 * p, 2), dtype) for r in ranks]
        out = np.zeros((2 * p, 2), dtype)
        dist.all_to_all_single(out, even[i], **kw)
        eq(out, np.concatenate([even[r][2 * i : 2 * i + 2] for r in range(p)]), "all_to_all_single even")
        split = [[(a + 2 * b) % 3 for b in range(p)] for a in range(p)]  # split[a][b]: rows a sends to b
        mine = data(me, seed + 1, (sum(split[i]), 2), dtype)
        sent = {r: np.split(data(ranks[r], seed + 1, (sum(split[r]), 2), dtype), np.cumsum(split[r])[:-1])
                for r in range(p)}
        out = np.zeros((sum(split[a][i] for a in range(p)), 2), dtype)
        dist.all_to_all_single(out, mine, [split[a][i] for a in range(p)], split[i], **kw)
        eq(out, np.concatenate([sent[a][i] for a in range(p)]), "all_to_all_single uneven")

    # non-contiguous buffers and Tensors go through the same paths
    x = np.zeros((4, 6))
    x[:, ::2] = me + 1
    dist.all_reduce(x[:, ::2], **kw)
    eq(x[:, ::2], np.full((4, 3), float(sum(r + 1 for r in ranks))), "all_reduce on a strided view")
    eq(x[:, 1::2], np.zeros((4, 3)), "strided all_reduce leaves the gaps alone")
    dist.barrier(**kw)
    return n


def _all_sizes(p):
    n = check_collectives("direct")
    if p >= 3:  # a group of the odd ranks ... and one in a different order of creation
        odd = [r for r in range(p) if r % 2]
        if dist.get_rank() in odd:
            n += check_collectives("direct", odd)
    return n


@pytest.mark.parametrize("p", range(1, 9))
def test_every_collective_direct_matches_numpy(p):
    res = launch(_all_sizes, p, args=(p,))
    assert min(res) > 100


def test_default_algorithm_and_async_op_work():
    def f():
        x = np.full(4, float(dist.get_rank()))
        w = dist.all_reduce(x, async_op=True)
        assert w.wait() is True and w.is_completed()
        y = np.zeros(2)
        dist.broadcast(y, 1)
        return x.tolist()

    assert list(launch(f, 3)) == [[3.0] * 4] * 3


def test_unknown_algorithm_and_bad_arguments_are_named():
    def f():
        msgs = []
        for call in (
            lambda: dist.all_reduce(np.zeros(3), algorithm="nope"),
            lambda: dist.all_gather_into_tensor(np.zeros(5), np.zeros(2)),
            lambda: dist.reduce_scatter_tensor(np.zeros(2), np.zeros(5)),
            lambda: dist.all_to_all_single(np.zeros(4), np.zeros(4), [1, 1], [3, 1]),
            lambda: dist.all_reduce(np.zeros(3, np.int64), op=ReduceOp.AVG),
            lambda: dist.broadcast(np.zeros(3), src=7),
            lambda: dist.all_gather([np.zeros(2)], np.zeros(2)),
            lambda: dist.all_reduce(np.zeros(3), op="nand"),
        ):
            try:
                call()
            except (ValueError, TypeError, ZeroDivisionError) as e:
                msgs.append(str(e))
        return msgs

    msgs = launch(f, 2)[0]
    assert "unknown algorithm 'nope'" in msgs[0]
    assert "all_gather_into_tensor" in msgs[1] and "(5,)" in msgs[1] and "(4,)" in msgs[1]
    assert "reduce_scatter_tensor" in msgs[2] and "(5,)" in msgs[2]
    assert "all_to_all_single" in msgs[3] and "output_split_sizes=[1, 1]" in msgs[3]
    assert "AVG" in msgs[4] and "int64" in msgs[4]
    assert "src=7" in msgs[5]
    assert "tensor_list" in msgs[6]
    assert "all_reduce: unknown reduce op 'nand'" in msgs[7]


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after agreeing calls"])
@pytest.mark.parametrize("bad", ["shape", "dtype", "op", "root", "algorithm"])
def test_disagreeing_ranks_raise_on_every_rank(bad, warm):
    """Also after the same call succeeded a few times (each rank then has that call's plan remembered)."""
    def f():
        r = dist.get_rank()
        odd = r == 2
        for _ in range(3 if warm else 0):  # the good call, made alike by every rank
            y = np.zeros(4, np.float32)
            if bad == "root":
                dist.broadcast(y, src=0)
            else:
                dist.all_reduce(y, algorithm="direct" if bad == "algorithm" else None)
        x = np.zeros(5 if odd and bad == "shape" else 4, np.float64 if odd and bad == "dtype" else np.float32)
        if bad == "root":
            dist.broadcast(x, src=2 if odd else 0)
        elif bad == "algorithm":
            from minidist.collectives import ALGORITHMS, register

            if "direct2" not in ALGORITHMS["all_reduce"]:
                register("all_reduce", "direct2")(ALGORITHMS["all_reduce"]["direct"])
            dist.all_reduce(x, algorithm="direct2" if odd else "direct")
        else:
            dist.all_reduce(x, op=ReduceOp.MAX if odd and bad == "op" else ReduceOp.SUM)

    with pytest.raises(RankError) as info:
        launch(f, 4, timeout=20)
    e = info.value
    assert set(e.errors) == {0, 1, 2, 3}
    for r, (name, msg, _) in e.errors.items():
        assert name == "MismatchError", (r, name, msg)
        assert "rank 2 called" in msg and "on ranks [0, 1, 2, 3]" in msg
        want = {"shape": "shape=(5,)", "dtype": "float64", "op": "op=MAX", "root": "src=2",
                "algorithm": "'direct2'"}[bad]
        assert want in msg, msg


def _broadcast_against_all_reduce():
    x = np.zeros(4)
    if dist.get_rank() == 2:
        time.sleep(0.3)  # the others are asleep in the broadcast by now
        dist.all_reduce(x)  # a call that wakes no one when it announces itself
    else:
        dist.broadcast(x, src=0)


def test_a_rooted_call_against_an_all_hear_all_call_is_caught_at_once():
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(_broadcast_against_all_reduce, 3, timeout=30)
    assert time.monotonic() - t0 < 3  # not the 30 s timeout
    assert {name for name, _, _ in info.value.errors.values()} == {"MismatchError"}
    assert "rank 2 called all_reduce" in str(info.value) and "broadcast(" in str(info.value)
