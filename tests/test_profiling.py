"""Profiling from the trace: every instant of every rank's step attributed once, overlap measured where the
strategies create it, the slow rank named, a link's alpha and beta recovered, and the trace exported as valid
Chrome trace-event JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, Resilience, train
from minidist.profiling import fit_alpha_beta, link_samples, run_budget, stragglers
from minidist.profiling.stragglers import compute_time_per_rank
from minidist.resilience import Faults

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)


@pytest.mark.parametrize("pc", [ParallelConfig(dp=2, bucket_bytes=2000),
                                pytest.param(ParallelConfig(tp=2, dp=2), marks=pytest.mark.slow),
                                ParallelConfig(pp=2, microbatches=4), ParallelConfig(dp=2, zero_stage=3),
                                pytest.param(ParallelConfig(cp=2, dp=2), marks=pytest.mark.slow)],
                         ids=["dp", "tp", "pp", "zero3", "cp"])
def test_every_instant_of_every_rank_is_attributed_once(pc):
    r = train(CFG, pc, steps=2, global_batch=8)
    budgets = run_budget(r)
    assert max(b.total for b in budgets) == r.time[-1]  # the step time is the slowest rank's window
    for b in budgets:
        assert math.isclose(sum(b.parts.values()), b.total, rel_tol=1e-12)
        assert math.isclose(sum(v for k, v in b.parts.items() if k.startswith("compute:")), b.compute, rel_tol=1e-12)
        assert {"compute:forward", "compute:backward", "compute:optimizer"} <= set(b.parts)
        assert 0 <= b.overlap <= 1


def test_overlap_appears_where_the_strategies_create_it():
    wide = md.GPTConfig(vocab_size=64, seq_len=32, d_model=128, n_layers=4, n_heads=4)

    def budget(**kw):
        return run_budget(train(wide, ParallelConfig(dp=2, **kw), steps=2, global_batch=16))[0]

    one, some, many = budget(bucket_bytes=1e9), budget(bucket_bytes=4e5), budget(bucket_bytes=2e4)
    assert one.overlap < 0.01 < 0.5 < some.overlap  # one bucket waits for the whole backward; smaller ones start early
    assert some.parts["exposed:all_reduce"] < one.parts["exposed:all_reduce"] / 2 and some.total < one.total
    assert many.parts["exposed:all_reduce"] > some.parts["exposed:all_reduce"]  # too small: latency per bucket
    none, ahead = budget(zero_stage=3, prefetch=0), budget(zero_stage=3, prefetch=1)
    assert ahead.overlap > none.overlap and ahead.total < none.total


def test_the_slow_rank_is_named_and_a_healthy_run_has_none():
    pc = ParallelConfig(dp=4)
    assert stragglers(compute_time_per_rank(train(CFG, pc, steps=2, global_batch=8))) == []
    slow = train(CFG, pc, steps=2, global_batch=8, resilience=Resilience(faults=Faults(slow={2: 1.5})))
    assert stragglers(compute_time_per_rank(slow)) == [2]


def _messages():
    rank = md.dist.get_rank()
    for n in (8, 1024, 65536, 1 << 20):
        buf = np.zeros(n // 8)
        if rank == 0:
            md.dist.send(buf, 1)
        else:
            md.dist.recv(buf, 0)


def test_alpha_beta_fit_recovers_the_link():
    cluster = md.Cluster()
    res = md.launch(_messages, 2, cluster=cluster)
    alpha, beta = fit_alpha_beta(*link_samples(res.trace, 0, 1))
    link = cluster.intra_link
    assert math.isclose(alpha, link.alpha, rel_tol=1e-6) and math.isclose(beta, link.beta, rel_tol=1e-6)
    with pytest.raises(ValueError, match="at least two message sizes"):
        fit_alpha_beta([8, 8], [1e-6, 1e-6])


def test_trace_exports_as_valid_chrome_trace_json(tmp_path):
    r = train(CFG, ParallelConfig(dp=2, tp=2), steps=1, global_batch=4)
    path = tmp_path / "trace.json"
    r.trace.to_chrome(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    ranks = {e.rank for e in r.trace}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(rk, f"rank {rk}") for rk in ranks}
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(r.trace)
    for e in spans:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], float) and e["ts"] >= 0 and e["dur"] >= 0
    assert {e["ph"] for e in events} <= {"M", "X"}


def test_recomputation_raises_hfu_and_leaves_mfu_the_share_not_redone():
    from minidist.profiling import step_flops, utilization

    plain = train(CFG, ParallelConfig(dp=2), steps=2, global_batch=8)
    redo = train(CFG, ParallelConfig(dp=2, recompute="full"), steps=2, global_batch=8)
    peak = md.Cluster().gpu.peak("float64")
    same = utilization(plain, peak, model_flops=step_flops(plain))
    assert same["mfu"] == same["hfu"] > 0
    u = utilization(redo, peak, model_flops=step_flops(plain))
    assert u["hfu"] > u["mfu"] and 0.7 < u["mfu"] / u["hfu"] < 0.8  # one more forward of the blocks: 3F -> ~4F


def _all_reduces():
    for n in (1 << 10, 1 << 24):
        md.dist.all_reduce(np.zeros(n // 8), algorithm="ring")


def test_collective_table_bus_bandwidth_approaches_the_link_and_matches_alpha_beta():
    from minidist.profiling import collective_table, format_table

    alpha, beta, p = 1e-6, 1e9, 4
    res = md.launch(_all_reduces, p, cluster=md.Cluster.uniform(alpha, beta))
    ring = lambda name, n: 2 * (p - 1) * (alpha + n / p / beta)  # noqa: E731
    rows = collective_table(res.trace, 0, p, predict=ring)
    assert [r["bytes"] for r in rows] == [1 << 10, 1 << 24]
    for r in rows:
        assert math.isclose(r["seconds"], r["predicted"], rel_tol=1e-9)
    assert rows[0]["busbw"] < 0.3 * beta < 0.99 * beta < rows[1]["busbw"] <= beta  # latency-bound, then the link
    assert "busbw GB/s" in format_table(rows).splitlines()[0]


def test_exposed_communication_is_named_by_the_mesh_axis_it_crossed():
    from minidist.profiling import axis_of

    pc = ParallelConfig(dp=2, tp=2)
    r = train(CFG, pc, steps=2, global_batch=8)
    axis = axis_of(lambda rank: md.parallel.build_mesh(pc, rank))
    assert axis(0, 1) == "tp" and axis(0, 2) == "dp" and axis(0, 3) == "dp+tp"
    for b in run_budget(r, axis=axis):
        exposed = {k.split("@")[1] for k in b.parts if k.startswith("exposed:")}
        assert exposed == {"tp", "dp"}, b.parts
        assert math.isclose(sum(b.parts.values()), b.total, rel_tol=1e-12)


def _ring_all_reduces():
    for _ in range(3):
        md.dist.all_reduce(np.zeros(1 << 17), algorithm="ring")


def test_a_slow_link_is_named_and_told_apart_from_a_slow_rank():
    from minidist.profiling import slow_links

    healthy = md.launch(_ring_all_reduces, 4)
    degraded = md.launch(_ring_all_reduces, 4, cluster=md.Cluster(slow_links={(1, 2): 4}))
    assert slow_links(healthy.trace) == [] and slow_links(degraded.trace) == [(1, 2)]
    assert degraded.time > 2 * healthy.time  # every rank waits: the ring goes at its slowest link's pace
    compute = [degraded.trace.busy(r, "compute") for r in range(4)]
    assert stragglers(compute) == []  # no rank computes slower: it is not a straggler
    with pytest.raises(ValueError, match="slow_links maps"):
        md.Cluster(slow_links={(1, 1): 2})


def test_the_memory_timeline_reaches_the_ledger_peak_and_shows_zero3_gathering():
    ddp = train(CFG, ParallelConfig(dp=2), steps=2, global_batch=8)
    zero3 = train(CFG, ParallelConfig(dp=2, zero_stage=3), steps=2, global_batch=8)
    for r in (ddp, zero3):
        for timeline, peak in zip(r.memory_timeline, r.peak_memory):
            times = [t for t, _ in timeline]
            assert times == sorted(times) and max(b for _, b in timeline) == peak

    def rises(timeline):
        return sum(b1 > b0 for (_, b0), (_, b1) in zip(timeline, timeline[1:]))

    assert rises(zero3.memory_timeline[0]) > rises(ddp.memory_timeline[0])  # a gather before every use


def test_the_collective_table_of_one_step():
    from minidist.profiling import collective_table

    r = train(CFG, ParallelConfig(dp=2, bucket_bytes=2000), steps=2, global_batch=8)
    every = collective_table(r.trace, 0, 2)
    last = collective_table(r.trace, 0, 2, window=r.windows[0][-1])
    assert 0 < len(last) < len(every) and {x["name"] for x in last} == {"all_reduce"}  # not the first broadcast
    assert [x["bytes"] for x in last] == [x["bytes"] for x in every[-len(last):]]
