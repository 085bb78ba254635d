"""md.dist behaves as torch.distributed where code written for one would otherwise break on the other.

Each point is torch's documented behaviour (torch/distributed/distributed_c10d.py): the point-to-point
argument order (group before tag) and group_dst / group_src; a rank outside ``group`` returns at once with a
warning (recv returns -1, get_world_size -1); get_group_rank and get_global_rank refuse ranks that are not in
the group; scatter_list / gather_list only on the root; empty split lists; destroy_process_group.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import launch
from minidist.runtime.errors import RankError


def _outcomes(*calls) -> list:
    """What each call returns, or the text of the TypeError / ValueError it raises."""
    out = []
    for call in calls:
        try:
            out.append(call())
        except (TypeError, ValueError) as e:
            out.append(str(e))
    return out

@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_point_to_point_takes_torchs_argument_order(backend):
    def f():
        r, g = dist.get_rank(), dist.new_group([0, 1])
        x = np.full(3, float(r))
        if r == 0:
            dist.send(x, 1, g, 5)  # torch: send(tensor, dst, group, tag)
            dist.isend(x + 1, group=g, tag=6, group_dst=1).wait()
            return None
        a, b = np.zeros(3), np.zeros(3)
        got = dist.recv(a, 0, g, 5)
        w = dist.irecv(b, group=g, tag=6, group_src=0)
        w.wait()
        assert w.source_rank() == 0 and w.exception() is None
        return got, a.tolist(), b.tolist()

    res = launch(f, 2, backend=backend)
    assert res[1] == (0, [0.0] * 3, [1.0] * 3)


def test_point_to_point_misuse_is_named():
    def f():
        x = np.zeros(2)
        return _outcomes(lambda: dist.send(x, 1, 5),  # the tag where torch has the group
                         lambda: dist.recv(x),  # from any sender: torch allows it, minidist does not
                         lambda: dist.send(x, 1, group_dst=1),
                         lambda: dist.send(x, group=dist.new_group([0, 1]), group_dst=2))

    errs = launch(f, 2)[0]
    assert "group before tag: pass tag=5 by name" in errs[0]
    assert "receives only from a named sender" in errs[1]
    assert "not both" in errs[2]
    assert "group rank 2 is not part of ProcessGroup(ranks=[0, 1])" in errs[3]


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_a_rank_outside_the_group_returns_at_once_with_a_warning(backend):
    def f():
        r, g = dist.get_rank(), dist.new_group([0, 1])
        x = np.full(2, float(r + 1))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            results = (dist.all_reduce(x, group=g), dist.all_reduce(x, group=g, async_op=True),
                       dist.broadcast(x, src=0, group=g), dist.barrier(group=g))
            sent = dist.send(x, 0, group=g) if r == 2 else None
            got = dist.recv(x, 1, group=g) if r == 2 else None
        shown = [str(w.message) for w in seen]
        for w in results:
            if w is not None:
                w.wait()  # the members' async all-reduce
        nones = tuple(w is None for w in results)
        return x.tolist(), nones, sent, got, dist.get_world_size(g), dist.get_rank(g), shown

    res = launch(f, 3, backend=backend)
    assert res[0][0] == [6.0, 6.0] and res[1][0] == [6.0, 6.0]  # 1 + 2 summed twice, then rank 0 broadcasts
    x, results, sent, got, size, rank, shown = res[2]
    assert x == [3.0, 3.0] and results == (True,) * 4 and sent is None and got == -1  # untouched, like torch
    assert size == -1 and rank == -1 and res[0][4] == 2
    assert len(shown) == 6 and "rank 2 is not a member of ProcessGroup(ranks=[0, 1])" in shown[0]
    assert "md.dist.all_reduce" in shown[0] and "md.dist.barrier" in shown[3] and "md.dist.irecv" in shown[5]


def test_group_rank_lookups_refuse_ranks_outside_the_group():
    def f():
        g = dist.new_group([1, 3])
        out = _outcomes(lambda: dist.get_group_rank(g, 0), lambda: dist.get_global_rank(g, -1),
                        lambda: dist.get_global_rank(g, 2), lambda: dist.get_rank("dp"))
        out += [dist.get_group_rank(g, 3), dist.get_global_rank(g, 1), dist.get_group_rank(None, 2),
                dist.get_global_rank(dist.group.WORLD, 2), dist.get_process_group_ranks(g),
                dist.get_process_group_ranks(None), dist.get_world_size(dist.group.WORLD)]
        return out

    out = launch(f, 4)[0]
    assert "global rank 0 is not part of ProcessGroup(ranks=[1, 3])" in out[0]
    assert "group rank -1 is not part of" in out[1]  # not wrapped round to rank 3
    assert "group rank 2 is not part of" in out[2]
    assert "get_rank: group must be a ProcessGroup" in out[3]
    assert out[4:] == [1, 3, 2, 2, [1, 3], [0, 1, 2, 3], 4]


def test_scatter_and_gather_lists_belong_to_the_root_only():
    def f():
        r, errs = dist.get_rank(), []
        lists = [np.zeros(1) for _ in range(3)]
        if r:
            errs = _outcomes(lambda: dist.scatter(np.zeros(1), lists, src=0),
                             lambda: dist.gather(np.zeros(1), lists, dst=0))
        out = np.zeros(1)
        dist.scatter(out, [np.array([7.0 * i]) for i in range(3)] if r == 0 else [], src=0)  # [] is "none"
        got = [np.zeros(1) for _ in range(3)] if r == 0 else None
        dist.gather(out + 1, got, dst=0)
        return errs, out[0], None if got is None else [g[0] for g in got]

    res = launch(f, 3)
    assert res[0] == ([], 0.0, [1.0, 8.0, 15.0])
    errs = res[1][0]
    assert "scatter: scatter_list is given on rank 1, but only the source (src=0)" in errs[0]
    assert "gather: gather_list is given on rank 1, but only the destination (dst=0)" in errs[1]


def test_all_to_all_single_takes_empty_split_lists_as_none():
    def f():
        y = np.zeros(4)
        dist.all_to_all_single(y, np.arange(4.0) + 10 * dist.get_rank(), [], [])
        return y.tolist()

    assert list(launch(f, 2)) == [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_destroy_process_group_inside_a_launch_ends_this_ranks_group(backend):
    def f():
        x = np.ones(2)
        dist.all_reduce(x)
        dist.destroy_process_group(dist.new_group([0, 1]))  # a group: nothing to free
        before = dist.is_initialized()
        dist.destroy_process_group()
        after = dist.is_initialized()
        try:
            dist.all_reduce(x)
        except RuntimeError as e:
            return x.tolist(), before, after, str(e)

    for r, (x, before, after, err) in enumerate(launch(f, 2, backend=backend)):
        assert x == [2.0, 2.0] and before and not after
        assert f"md.dist.all_reduce: rank {r} called md.dist.destroy_process_group() earlier" in err


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_object_collectives_move_python_objects(backend):
    def f():
        r = dist.get_rank()
        objs = [{"a": 1}, "two", [3.0]] if r == 0 else [None] * 3
        dist.broadcast_object_list(objs, src=0)
        everyone = [None] * 3
        dist.all_gather_object(everyone, {"rank": r, "pad": "x" * 100 * r})  # pickles of different lengths
        got = [None] * 3 if r == 1 else None
        dist.gather_object(("from", r), got, dst=1)
        mine = [None]
        dist.scatter_object_list(mine, [f"to {i}" * (i + 1) for i in range(3)] if r == 2 else None, src=2)
        pair = [None] * 2
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            dist.all_gather_object(pair, r, group=dist.new_group([0, 2]))  # rank 1 is not a member
        return objs, [e["rank"] for e in everyone], got, mine[0], pair, [str(w.message) for w in seen]

    res = launch(f, 3, backend=backend)
    for r, (objs, ranks, got, mine, pair, warned) in enumerate(res):
        assert objs == [{"a": 1}, "two", [3.0]] and ranks == [0, 1, 2] and mine == f"to {r}" * (r + 1)
        assert got == ([("from", 0), ("from", 1), ("from", 2)] if r == 1 else None)
        assert pair == ([0, 2] if r != 1 else [None, None])
        assert bool(warned) == (r == 1) and (not warned or "all_gather_object: rank 1 is not a member" in warned[0])


def test_object_collectives_name_wrong_lists():
    def f():
        return _outcomes(lambda: dist.all_gather_object([None], 1), lambda: dist.broadcast_object_list((1, 2), src=0))

    errs = launch(f, 2)[0]
    assert "object_list must be a list of 2 (one per rank of the group), got a list of 1" in errs[0]
    assert "object_list must be a list (filled in place), got tuple" in errs[1]


def test_list_forms_of_all_to_all_and_reduce_scatter_equal_numpy_and_the_tensor_forms():
    p = 3

    def sent(j, i):  # what rank j sends rank i: j + 1 elements, so the lists are uneven
        return np.arange(j + 1, dtype=np.float64) + 10 * j + 100 * i

    def f(listed):
        r = dist.get_rank()
        recv = [np.zeros(j + 1) for j in range(p)]
        dist.all_to_all(recv, [sent(r, i) for i in range(p)])
        blocks = [np.arange(4.0) * (i + 1) + r for i in range(p)]
        y = np.zeros(4)
        t0 = dist.now()
        if listed:
            dist.reduce_scatter(y, blocks, op=dist.ReduceOp.AVG)
        else:
            dist.reduce_scatter_tensor(y, np.concatenate(blocks), op=dist.ReduceOp.AVG)
        return [a.tolist() for a in recv], y.tolist(), dist.now() - t0

    for r, (listed, tensor) in enumerate(zip(launch(f, p, args=(True,)), launch(f, p, args=(False,)))):
        assert listed[0] == [sent(j, r).tolist() for j in range(p)]
        want = np.mean([np.arange(4.0) * (r + 1) + q for q in range(p)], axis=0)
        assert listed[1] == tensor[1] and np.allclose(listed[1], want, rtol=0, atol=1e-12)
        assert listed[2] == tensor[2] > 0  # the same algorithm, charged the same


def test_batch_isend_irecv_runs_a_ring_without_deadlock():
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        a, b = np.full(2, float(r)), np.zeros(2)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, (r - 1) % p), dist.P2POp(dist.isend, a, (r + 1) % p)])
        for w in works:
            w.wait()
        try:
            dist.P2POp(dist.send, a, 0)
        except ValueError as e:
            return b[0], len(works), str(e)

    for r, (got, n, err) in enumerate(launch(f, 4)):
        assert got == (r - 1) % 4 and n == 2 and "op must be md.dist.isend or md.dist.irecv" in err


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_all_to_all_split_sizes_that_disagree_are_named(backend):
    def across():  # rank 1 sends rank 0 one row where rank 0 expects two
        splits = [2, 2] if dist.get_rank() == 0 else [1, 3]
        dist.all_to_all_single(np.zeros(4), np.arange(4.0), splits, splits)

    with pytest.raises(RankError) as e:
        launch(across, 2, backend=backend)
    text = str(e.value)
    assert "all_to_all_single: message from rank 1 to rank 0 does not fit" in text
    assert "rank 1's input_split_sizes entry for rank 0 must equal rank 0's output_split_sizes entry for rank 1" in text
    assert "tag -" not in text  # a collective's internal tags mean nothing to its caller

    def own():
        dist.all_to_all_single(np.zeros(4), np.arange(4.0), [1, 3], [2, 2])

    own_block = r"keeps input_split_sizes\[0\]=2 rows for itself but output_split_sizes\[0\]=1"
    with pytest.raises(RankError, match=own_block):
        launch(own, 2, backend=backend)


@pytest.mark.parametrize("alg", ["ring", "tree", "recursive_doubling", "halving_doubling", "direct"])
def test_bitwise_reduce_ops_combine_bits_like_numpy(alg):
    p = 3

    def value(r, dtype):
        if dtype is bool:
            return (np.arange(8) + r) % 3 > 0
        return (np.arange(8) * 37 + 11 * r).astype(dtype)

    def f():
        r, out = dist.get_rank(), {}
        for dtype in (np.int16, np.uint8, bool):
            for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
                x = value(r, dtype)
                dist.all_reduce(x, op=op, algorithm=alg)
                out[np.dtype(dtype).name, op.name] = x.tolist()
        errs = _outcomes(lambda: dist.all_reduce(np.zeros(2), op="band"),
                         lambda: dist.all_reduce(np.zeros(2, np.complex128), op=dist.ReduceOp.MAX))
        return out, errs

    res = launch(f, p)
    types = {"int16": np.int16, "uint8": np.uint8, "bool": bool}
    for (dtype, op), got in res[0][0].items():
        ufunc = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        assert got == ufunc.reduce([value(r, types[dtype]) for r in range(p)]).tolist(), (dtype, op)
        x = value(1, types[dtype])
        assert (ufunc(getattr(dist.ReduceOp, op).identity(dtype), x) == x).all()  # the identity leaves x as it is
    errs = res[0][1]
    assert "ReduceOp.BAND combines bits: it needs an integer or bool dtype, got float64" in errs[0]
    assert "ReduceOp.MAX is not defined on complex numbers" in errs[1]


def test_world_rank_lookups_check_their_rank():
    def f():
        return _outcomes(lambda: dist.get_global_rank(None, 4), lambda: dist.get_group_rank(dist.group.WORLD, -1),
                         lambda: dist.get_world_size("dp"))

    errs = launch(f, 2)[0]
    assert "get_global_rank: rank 4 is not part of the world of 2 ranks" in errs[0]
    assert "get_group_rank: rank -1 is not part of the world of 2 ranks" in errs[1]
    assert "get_world_size: group must be a ProcessGroup" in errs[2]


def test_a_rank_that_destroyed_its_group_still_closes_its_transport():
    # the MPI worker ends every rank with stop_rank(); it looked the rank up with current(), which refuses a
    # destroyed group, so a rank that called destroy_process_group() left without closing its transport
    from types import SimpleNamespace

    from minidist.runtime import context
    from minidist.runtime.mpi_worker import stop_rank

    calls = []
    transport = SimpleNamespace(flush=lambda: calls.append("flush"), close=lambda: calls.append("close"),
                                announce_finished=lambda: calls.append("announce"))
    context.set_current(SimpleNamespace(destroyed=True, transport=transport))
    try:
        stop_rank()
    finally:
        left = context._current
        context.set_current(None)
    assert calls == ["flush", "announce", "close"] and left is None


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_work_get_future_runs_a_communication_hook(backend):
    """A DDP communication hook's chain (torch's allreduce hook): all_reduce async, then divide in ``then``."""
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        grad = np.arange(4.0) + r
        fut = dist.all_reduce(grad, async_op=True).get_future()
        mean = fut.then(lambda f: f.value()[0] / p)
        assert mean.wait() is mean.value()
        buf = np.zeros(3)
        if r == 0:
            sent = dist.isend(np.full(3, 7.0), 1).get_future().wait()
            return mean.value().tolist(), [a.tolist() for a in sent]
        got = dist.irecv(buf, 0).get_future()
        chained = got.then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1)
        return mean.value().tolist(), chained.wait().tolist(), got.value()[0] is buf

    res = launch(f, 2, backend=backend)
    expected = ((np.arange(4.0) * 2 + 1) / 2).tolist()
    assert res[0] == (expected, [[7.0] * 3])
    assert res[1] == (expected, [15.0] * 3, True)


def test_a_future_refuses_a_value_before_its_receive_has_arrived():
    def f():
        if dist.get_rank() == 1:
            dist.barrier()  # rank 0 asks for the value while this rank has not sent yet
            dist.send(np.ones(2), 0)
            return None
        fut = dist.irecv(np.zeros(2), 1).get_future()
        with pytest.raises(RuntimeError, match=r"recv<-1 has not completed; call wait\(\) first"):
            fut.value()
        with pytest.raises(TypeError, match="callback must be callable"):
            fut.then(3)
        dist.barrier()
        return fut.wait()[0].tolist()

    assert launch(f, 2)[0] == [1.0, 1.0]


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_all_gather_takes_tensors_of_uneven_sizes(backend):
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        mine = np.arange(r + 1, dtype=np.float64) + 10 * r
        out = [np.zeros(i + 1) for i in range(p)]
        dist.all_gather(out, mine)
        return [a.tolist() for a in out]

    res = launch(f, 3, backend=backend)
    for r in range(3):
        assert res[r] == [[0.0], [10.0, 11.0], [20.0, 21.0, 22.0]]


def test_all_gather_of_uneven_sizes_names_a_place_sized_for_nobody():
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        out = [np.zeros(i + 1) for i in range(p)]
        if r == 0:
            out[2] = np.zeros(9)
        dist.all_gather(out, np.zeros(r + 1))

    with pytest.raises(RankError, match=r"all_gather: message from rank 2 to rank 0 does not fit: .*; rank 0's "
                                         r"tensor_list\[2\] must have as many elements as rank 2's tensor"):
        launch(f, 3, timeout=10)


def test_all_gather_of_uneven_sizes_keeps_this_ranks_own_place_checked():
    def f():
        r = dist.get_rank()
        out = [np.zeros(2), np.zeros(3)]  # each rank passes a tensor that does not fit its own place
        with pytest.raises(ValueError, match=rf"tensor_list\[{r}\] \(this rank's own place\) has shape=\({r + 2},\)"):
            dist.all_gather(out, np.zeros(r + 1))
        return True

    assert all(launch(f, 2).values)


def test_futures_run_callbacks_once_when_complete_and_list_outputs_flat_as_torch():
    def f():
        r = dist.get_rank()
        ran = []
        t = np.ones(2) * (r + 1)
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut.then(lambda f: ran.append("hook"))  # never waited on: torch runs it all the same
        boom = fut.then(lambda f: ran.append("boom") or 1 / 0)
        after = boom.then(lambda f: ran.append("after") or "runs anyway")  # torch runs it, the parent failed or not
        errors = []
        for chained in (boom, boom):
            try:
                chained.wait()
            except RuntimeError as e:
                errors.append(str(e))
        errors.append(after.wait())
        outs = [np.zeros(1), np.zeros(1)]
        flat = dist.all_gather(outs, np.full(1, float(r)), async_op=True).get_future().wait()
        first, second = fut.wait(), fut.wait()
        return (ran, errors, [a is b for a, b in zip(flat, outs)], first[0] is t, first is not second)

    res = launch(f, 2)
    for ran, errors, same, is_t, fresh in res:
        assert ran == ["hook", "boom", "after"]  # each callback once, as soon as its future was complete
        assert errors == ["Got the following error when running the callback: ZeroDivisionError: division by "
                          "zero"] * 2 + ["runs anyway"]
        assert same == [True, True] and is_t and fresh  # [t0, t1], not [[t0, t1]]: torch's flat list


def test_gather_object_refuses_a_list_on_other_ranks_as_gather_does():
    def f():
        r = dist.get_rank()
        refused = None
        if r == 1:  # refused before anything is sent, so the right call after it still meets rank 0's
            refused = _outcomes(lambda: dist.gather_object(r, [None, None], dst=0))[0]
        got = [None, None] if r == 0 else None
        dist.gather_object(("from", r), got, dst=0)
        return refused, got

    res = launch(f, 2)
    assert res[0] == (None, [("from", 0), ("from", 1)])
    assert "gather_object: object_gather_list is given on rank 1, but only the destination (dst=0)" in res[1][0]


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_send_and_recv_object_list_move_objects_point_to_point(backend):
    def f():
        r = dist.get_rank()
        if r == 0:
            dist.send_object_list([{"step": 3}, "x" * 1000, None], dst=2)
            dist.send_object_list([r], group=dist.new_group([0, 1]), group_dst=1)
            return None
        got = [None] * (3 if r == 2 else 1)
        sender = dist.recv_object_list(got, src=0)
        return sender, got

    res = launch(f, 3, backend=backend, timeout=30)
    assert res[2] == (0, [{"step": 3}, "x" * 1000, None]) and res[1] == (0, [0])


def test_object_lists_of_other_lengths_are_named():
    def f():
        if dist.get_rank() == 0:
            dist.send_object_list([1, 2, 3], dst=1)
        else:
            dist.recv_object_list([None, None], src=0)

    with pytest.raises(RankError, match=r"sent shape \(3,\).*into shape \(2,\)"):
        launch(f, 2, timeout=10)
    with pytest.raises(RankError, match="object_list must be a non-empty list"):
        launch(lambda: dist.send_object_list([], dst=1 - dist.get_rank()), 2, timeout=10)


@pytest.mark.parametrize("backend", ["sim", "inprocess"])
def test_get_backend_names_the_backend(backend):
    assert list(launch(dist.get_backend, 2, backend=backend)) == [backend, backend]


def test_monitored_barrier_passes_and_ends_a_missing_rank_within_its_timeout():
    import datetime
    import time

    def f(late):
        if dist.get_rank() == 1 and late:
            time.sleep(20)  # arrives long after the others' timeout
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
        return "passed"

    assert list(launch(f, 3, args=(False,), timeout=30)) == ["passed"] * 3
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        launch(f, 3, args=(True,), timeout=30)
    assert time.monotonic() - t0 < 6  # the barrier's 1 s, not the launch's 30 s nor rank 1's 20 s
    text = str(err.value)
    assert "CommTimeoutError" in text and "rank 1 is running its own code" in text
    with pytest.raises(RankError, match="timeout must be a positive number of seconds"):
        launch(lambda: dist.monitored_barrier(timeout=0), 2, timeout=10)
    assert list(launch(lambda: dist.monitored_barrier(timeout=np.int64(5)), 2, timeout=10)) == [None, None]


def test_monitored_barrier_ends_at_once_in_process_when_a_rank_never_arrives():
    import time

    def f():
        if dist.get_rank() != 1:  # rank 1 returns without the barrier
            dist.monitored_barrier(timeout=20)

    t0 = time.monotonic()
    with pytest.raises(RankError, match="rank 1"):
        launch(f, 3, backend="inprocess", timeout=30)
    assert time.monotonic() - t0 < 5


def test_an_object_that_cannot_be_pickled_is_named_with_its_call():
    import threading

    def f():
        if dist.get_rank() == 0:
            dist.send_object_list([1, threading.Lock()], dst=1)
        else:
            dist.recv_object_list([None, None], src=0)

    with pytest.raises(RankError, match=r"send_object_list: object_list\[1\] cannot be pickled, so it cannot travel "
                                        r"between ranks \(TypeError: cannot pickle '_thread.lock' object\)"):
        launch(f, 2, timeout=10)
    with pytest.raises(RankError, match=r"all_gather_object: obj cannot be pickled"):
        launch(lambda: dist.all_gather_object([None, None], threading.Lock()), 2, timeout=10)
