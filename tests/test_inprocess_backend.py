"""Ranks as threads taking turns (``backend="inprocess"``): the simulator's results and clocks, bitwise.

Every collective x algorithm x dtype, point-to-point messages out of tag order, and training under the
composed layouts give the same values, simulated times and ledgers as one process per rank; numpy's own
checks pass inside the thread-ranks; failures are named at once (a rank that raises, a deadlock, ranks
that disagree, a rank that overstays the deadline) and the launcher's own state is left as it was.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import minidist as md
import minidist.dist as dist
from minidist.autograd import grad_mode
from minidist.autograd.cost import get_cost_hook
from minidist.hardware.cluster import Cluster
from minidist.parallel import ParallelConfig
from minidist.runtime import RankError, launch
from tests.test_collectives_correctness import _world
from tests.test_mpi_backend import _outputs

TOY = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=4)


def test_every_collective_algorithm_and_dtype_is_bitwise_the_simulator():
    cluster = Cluster(gpus_per_node=2)  # two nodes: the hierarchical all-reduce crosses them
    sim = launch(_outputs, 4, cluster=cluster)
    inp = launch(_outputs, 4, cluster=cluster, backend="inprocess")
    assert len(sim[0]) > 90
    for r in range(4):
        assert sim[r].keys() == inp[r].keys()
        for key, (want, t) in sim[r].items():
            got, t_in = inp[r][key]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), f"{key} on rank {r}"
            assert t_in == t, f"{key} on rank {r}: simulated time {t_in} in process, {t} simulated"
    assert inp.times == sim.times
    assert [e for e in inp.trace] == [e for e in sim.trace]


@pytest.mark.parametrize("p", [4, pytest.param(8, marks=pytest.mark.slow)])  # 8 ranks: 6 s, make test-slow
def test_every_algorithm_matches_numpy_in_process(p):
    res = launch(_world, p, args=(p,), cluster=Cluster(gpus_per_node=4 if p == 8 else 2), backend="inprocess")
    assert min(res) > 500  # checks made inside each rank, each against numpy


LAYOUTS = {
    "dp2 x tp2": ParallelConfig(dp=2, tp=2),
    "pp2 x dp2, 1f1b": ParallelConfig(pp=2, dp=2, microbatches=2),
    "pp2 zero bubble": ParallelConfig(pp=2, microbatches=4, schedule="zero_bubble"),
    "zero3 dp4": ParallelConfig(dp=4, zero_stage=3),
    "cp2 x dp2": ParallelConfig(cp=2, dp=2),
    "tp2 x pp2 x dp2": ParallelConfig(tp=2, pp=2, dp=2, microbatches=2),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_training_is_bitwise_the_simulator(name):
    pc = LAYOUTS[name]
    sim = md.parallel.train(TOY, pc, steps=2)
    inp = md.parallel.train(TOY, pc, steps=2, backend="inprocess")
    assert inp.losses == sim.losses and inp.time == sim.time
    assert inp.peak_memory == sim.peak_memory and inp.memory == sim.memory
    assert inp.comm_bytes == sim.comm_bytes
    for k in sim.params:
        assert inp.params[k].tobytes() == sim.params[k].tobytes(), k
        assert inp.grads[k].tobytes() == sim.grads[k].tobytes(), k


def test_experts_train_bitwise_the_simulator():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=4, n_experts=4, top_k=2)
    pc = ParallelConfig(dp=2, ep=2)
    sim = md.parallel.train(cfg, pc, steps=2)
    inp = md.parallel.train(cfg, pc, steps=2, backend="inprocess")
    assert inp.losses == sim.losses and inp.time == sim.time and inp.peak_memory == sim.peak_memory


def test_output_goes_to_each_rank_and_the_launcher_keeps_its_state():
    hook, enabled, threads = get_cost_hook(), grad_mode._enabled, threading.active_count()

    def fn():
        with md.no_grad():
            x = np.ones(4) * dist.get_rank()
            dist.all_reduce(x)  # turns change inside no_grad: each rank keeps its own grad mode
            assert not md.is_grad_enabled()
        print("rank", dist.get_rank(), "sum", x.sum())
        return md.is_grad_enabled()

    res = launch(fn, 3, backend="inprocess", quiet=True)
    assert res.values == [True, True, True]
    assert [s.strip() for s in res.stdout] == [f"rank {r} sum 12.0" for r in range(3)]
    assert get_cost_hook() is hook and grad_mode._enabled is enabled
    assert threading.active_count() == threads
    with pytest.raises(RuntimeError, match="inside a function run by md.launch"):
        dist.get_rank()


def test_a_rank_that_raises_is_named_and_the_others_stop():
    def fn():
        if dist.get_rank() == 2:
            raise ValueError("bad shard on rank two")
        dist.all_reduce(np.zeros(3))

    with pytest.raises(RankError, match="rank 2 failed with ValueError: bad shard on rank two") as e:
        launch(fn, 4, backend="inprocess", quiet=True)
    assert e.value.errors[0][0] == "RankAborted" and "Traceback" in str(e.value)


def test_a_deadlock_is_named_at_once():
    def fn():
        x = np.zeros(2)
        dist.recv(x, 1 - dist.get_rank())  # both receive first: nobody ever sends

    t = time.monotonic()
    with pytest.raises(RankError, match="DeadlockError: deadlock: no rank can move") as e:
        launch(fn, 2, backend="inprocess", quiet=True, timeout=60)
    assert time.monotonic() - t < 5
    assert "recv(src=1, tag=0)" in str(e.value) and "recv(src=0, tag=0)" in str(e.value)


def test_ranks_that_disagree_are_told_so():
    def fn():
        x = np.zeros(3 if dist.get_rank() == 0 else 4)
        dist.all_reduce(x, algorithm="ring")

    with pytest.raises(RankError, match="MismatchError"):
        launch(fn, 2, backend="inprocess", quiet=True)


def test_a_rank_looping_forever_is_stopped_at_the_deadline():
    def fn():
        if dist.get_rank() == 1:
            while True:
                pass
        dist.barrier()

    t = time.monotonic()
    with pytest.raises(RankError, match="deadline of 1 s"):
        launch(fn, 2, backend="inprocess", quiet=True, deadline=1.0)
    assert time.monotonic() - t < 4



@pytest.mark.parametrize("limit, why", [({"deadline": 1.0}, "at the launch's deadline of 1 s"),
                                        ({"timeout": 1.0}, r"at 1 s \(the timeout\) after rank 0 returned")])
def test_a_rank_that_never_gives_the_turn_back_is_abandoned_and_named(limit, why):
    """A rank blocked in C (a lock here; time.sleep alike) runs no Python, so no exception can stop it: the launch
    still ends soon after its limit, naming the rank and its line, and the abandoned thread blocks nothing."""
    release, before = threading.Event(), set(threading.enumerate())

    def fn():
        if dist.get_rank() == 1:
            release.wait()  # the line the error names
        return dist.get_rank()

    t = time.monotonic()
    with pytest.raises(RankError, match=f"rank 1 failed with DeadlineExceeded: rank 1 was still running its own code "
                                        f"{why} and was stopped; .* it is abandoned") as info:
        launch(fn, 3, backend="inprocess", quiet=True, **limit)
    assert time.monotonic() - t < 8
    assert "release.wait()  # the line the error names" in str(info.value)
    assert list(launch(fn, 1, backend="inprocess")) == [0]  # a later launch works, in the launcher's own state
    assert get_cost_hook() is None and md.is_grad_enabled()
    left = set(threading.enumerate()) - before
    assert [th.daemon for th in left] == [True]
    release.set()  # the abandoned thread ends by itself once its call returns, changing nothing
    for th in left:
        th.join(5)
        assert not th.is_alive()

def test_shape_only_messages_carry_no_bytes_and_cost_their_size():
    from minidist.autograd.shape_only import ShapeArray, empty
    from minidist.estimate.comm import collective_time

    def fn():
        x = empty((1 << 28,), np.float32)  # 1 GiB that holds nothing
        dist.all_reduce(x, algorithm="ring")
        return isinstance(x, ShapeArray), dist.now()

    cluster = Cluster(gpus_per_node=4)
    res = launch(fn, 4, backend="inprocess", cluster=cluster)
    assert all(v[0] for v in res.values)
    link = cluster.link(0, 1)
    want = collective_time("all_reduce", 4 << 28, 4, link.alpha, link.beta, "ring")
    assert res.values[0][1] == pytest.approx(want, rel=1e-12)
