"""Tensor-parallel communication hidden behind the matmuls: the decomposed all-gather-matmul and
matmul-reduce-scatter equal the unfused collectives, each costs (t-1) max(matmul, message) + matmul on the
simulated clock, and training with ``tp_overlap=True`` reproduces one device while its step gets shorter."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.hardware.specs import Link
from minidist.parallel import ParallelConfig, train
from minidist.parallel.tensor.tensor_parallel import TPGroup, all_gather_along, reduce_scatter_along
from minidist.parallel.tensor.tp_overlap import all_gather_matmul, matmul_reduce_scatter
from minidist.profiling import run_budget

# a link on which one shard's message and one shard's matmul of these tiny shapes are of the same order
# (with NVLink's microseconds of latency every message would dwarf them)
SLOW = md.Cluster(intra_link=Link("low-latency link", 1e-8, 1.6e11))


def _start_together() -> float:
    """Wait (on the simulated clock) until the last rank is here: a barrier leaves ranks at different times."""
    latest = np.array([md.dist.now()])
    md.dist.all_reduce(latest, op=md.dist.ReduceOp.MAX)
    md.dist.compute(seconds=float(latest[0]) + 1e-6 - md.dist.now())
    return md.dist.now()


def _fused(kind: str, B: int, T: int, k: int, n: int):
    tp = TPGroup.of()
    rng = np.random.default_rng([7, tp.rank])
    if kind == "ag":
        x, w = rng.standard_normal((B, T // tp.size, k)), rng.standard_normal((k, n))
        t0 = _start_together()
        total, (y,) = all_gather_matmul(x, [w], tp)
        dt = md.dist.now() - t0
        plain = all_gather_along(x, tp, 1)
        return dt, bool(np.array_equal(total, plain)), float(np.abs(y - plain @ w).max())
    x, w = rng.standard_normal((B, T, k)), rng.standard_normal((k, n))
    t0 = _start_together()
    y = matmul_reduce_scatter(x, w, tp)
    dt = md.dist.now() - t0
    return dt, True, float(np.abs(y - reduce_scatter_along(x @ w, tp, 1)).max())


@pytest.mark.parametrize("kind", ["ag", "rs"])
@pytest.mark.parametrize("t", [2, 4])
def test_the_decomposed_ring_equals_the_collective_and_costs_the_overlapped_time(kind, t):
    B, T, k, n = 2, 8, 64, 96
    res = md.launch(_fused, t, args=(kind, B, T, k, n), cluster=SLOW)
    rows = B * T // t  # one shard's rows
    clock = md.hardware.clock.Clock(0, SLOW)
    matmul = clock.roofline(2 * rows * k * n, (rows * k + k * n + rows * n) * 8, np.float64)
    msg = SLOW.intra_link.alpha + rows * (k if kind == "ag" else n) * 8 / SLOW.intra_link.beta
    expected = (t - 1) * max(matmul, msg) + matmul
    for dt, same_gather, err in res.values:
        assert same_gather and err < 1e-12
        assert math.isclose(dt, expected, rel_tol=1e-9), (dt, expected, matmul, msg)
    assert matmul < msg < 3 * matmul  # the regime where hiding matters, and the max() is the message's


CFG = md.GPTConfig(vocab_size=48, seq_len=16, d_model=64, n_layers=2, n_heads=4, dtype="float64")


def _close(a, b, tol=1e-10):
    assert max(abs(x - y) for x, y in zip(a.losses, b.losses)) < tol
    assert max(float(np.abs(a.params[k] - b.params[k]).max()) for k in b.params) < tol
    assert max(float(np.abs(a.grads[k] - b.grads[k]).max()) for k in b.grads) < tol


def test_training_with_overlap_reproduces_one_device_and_hides_communication():
    one = train(CFG, ParallelConfig(), steps=2, global_batch=4, cluster=SLOW)
    sp = train(CFG, ParallelConfig(tp=2, sequence_parallel=True), steps=2, global_batch=4, cluster=SLOW)
    ov = train(CFG, ParallelConfig(tp=2, sequence_parallel=True, tp_overlap=True), steps=2, global_batch=4,
               cluster=SLOW)
    _close(ov, one)
    _close(ov, sp, 1e-12)
    assert ov.time[-1] < sp.time[-1]
    plain, hidden = run_budget(sp)[0], run_budget(ov)[0]
    assert hidden.overlap > plain.overlap + 0.2  # alpha_ov: the share of the shorter stream hidden
    exposed = [sum(v for k, v in b.parts.items() if k.startswith("exposed")) for b in (plain, hidden)]
    assert exposed[1] < exposed[0]
    for b in run_budget(sp) + run_budget(ov):  # the book's T = T_c + T_m - alpha_ov min(T_c, T_m), plus idle
        busy = b.compute + b.comm - b.overlap * min(b.compute, b.comm)
        assert math.isclose(busy + b.parts.get("idle", 0.0), b.total, rel_tol=1e-9)


@pytest.mark.parametrize("pc", [
    ParallelConfig(tp=2, dp=2, sequence_parallel=True, tp_overlap=True, zero_stage=1),
    pytest.param(ParallelConfig(tp=2, pp=2, sequence_parallel=True, tp_overlap=True, microbatches=2,
                                schedule="zb-h1"), marks=pytest.mark.slow),
    ParallelConfig(tp=4, sequence_parallel=True, tp_overlap=True, recompute="full"),
], ids=["dp-zero1", "pp-zero-bubble", "tp4-recompute"])
def test_overlap_composes(pc):
    one = train(CFG, ParallelConfig(), steps=2, global_batch=4)
    _close(train(CFG, pc, steps=2, global_batch=4), one)


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(ValueError, match="sequence_parallel=True"):
        ParallelConfig(tp=2, tp_overlap=True)
    with pytest.raises(ValueError, match="tp_overlap must be True or False"):
        ParallelConfig(tp=2, sequence_parallel=True, tp_overlap=1)


def _kinds_of_overlapped_collectives():
    from minidist.autograd.shape_only import ShapeArray, empty
    from minidist.parallel.tensor.tp_overlap import start_all_gather, start_reduce_scatter

    tp = TPGroup.of(algorithm="ring")
    x, w = empty((2, 8, 16), np.float32), empty((16, 12), np.float32)
    results = [start_all_gather(x, tp, 1)(), start_reduce_scatter(x, tp, 1)(), *all_gather_matmul(x, [w], tp)[1],
               matmul_reduce_scatter(empty((2, 8, 12), np.float32), empty((12, 16), np.float32), tp)]
    return [isinstance(r, ShapeArray) for r in results]


def test_shape_only_overlap_allocates_no_real_arrays():
    """A shape-only input gives shape-only results: a real buffer among them once made every later product a real
    float16 matmul (numpy has no fast one), and an 8B model's shape-only step with overlap took minutes, not 0.2 s."""
    res = md.launch(_kinds_of_overlapped_collectives, world_size=2, backend="inprocess")
    assert all(all(kinds) for kinds in res), list(res)
