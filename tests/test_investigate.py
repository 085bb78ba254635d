"""The five-phase investigation names each injected fault, and nothing in a healthy run: a straggler rank, a
slow link, buckets too small for the links' latency, unequal pipeline stages; with a prediction it triages."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.parallel import Backend, ParallelConfig, Resilience, train
from minidist.profiling import investigate
from minidist.resilience import Faults

WIDE = md.GPTConfig(vocab_size=64, seq_len=32, d_model=128, n_layers=4, n_heads=4)
PIPE = md.GPTConfig(vocab_size=512, seq_len=16, d_model=32, n_layers=4, n_heads=4)
SCENARIOS = {
    "healthy": (WIDE, ParallelConfig(dp=4), {}, []),
    "straggler": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5),
                  dict(resilience=Resilience(faults=Faults(slow={2: 1.5}))), [("straggler", 2)]),
    "slow link": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5, algorithm="ring"),
                  dict(cluster=md.Cluster(slow_links={(1, 2): 8})), [("slow link", (1, 2))]),
    "small buckets": (WIDE, ParallelConfig(dp=4, bucket_bytes=2e4), {},
                      [("latency-bound communication", "all_reduce")]),
    "unequal stages": (PIPE, ParallelConfig(pp=2, microbatches=4), {}, [("stage imbalance", None)]),
    # two GPUs per node: half the ring's links cross nodes; "rated" is the spec sheet the investigator reads
    "healthy, two nodes": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5),
                           dict(cluster=md.Cluster(gpus_per_node=2), rated=md.Cluster(gpus_per_node=2)), []),
    "oversubscribed fabric": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5),
                              dict(cluster=md.Cluster(gpus_per_node=2, oversubscription=4),
                                   rated=md.Cluster(gpus_per_node=2)),
                              [("oversubscribed fabric", "inter-node links")]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_injected_fault_is_found_by_the_procedure(name):
    cfg, pc, kw, expected = SCENARIOS[name]
    kw = dict(kw)
    rated = kw.pop("rated", None)
    rep = investigate(train(cfg, pc, steps=2, global_batch=16, **kw), cluster=rated)
    assert [(kind, subject) for kind, subject, _ in rep.causes] == expected, rep.lines()
    assert len(rep.fixes) == len(expected) and len(rep.lines()) >= 5


def test_triage_against_the_prediction():
    pc = ParallelConfig(dp=2)
    r = train(WIDE, pc, steps=2, global_batch=16, resilience=Resilience(faults=Faults(slow={1: 2.0})))
    predicted = md.estimate.predict_train(WIDE, pc, 16).step_time
    rep = investigate(r, predicted_step=predicted)
    assert rep.slowdown > 0.2 and "against the prediction" in rep.lines()[0]


def test_a_hung_rank_is_named_from_the_timeout_report():
    with pytest.raises(md.runtime.RankError) as info:
        train(WIDE, ParallelConfig(dp=4), steps=2, global_batch=16, resilience=Resilience(faults=Faults(hang={2: 1})),
              backend=Backend(timeout=2))
    rep = investigate(info.value)
    assert [(kind, subject) for kind, subject, _ in rep.causes] == [("hung rank", 2)], rep.lines()
    assert rep.step is None and "timeout" in rep.lines()[1] and "stack" in rep.fixes[0]


def test_a_failure_that_is_not_a_hang_is_not_called_one():
    def boom():
        raise ValueError("a bug")

    with pytest.raises(md.runtime.RankError) as info:
        md.launch(boom, 2)
    assert investigate(info.value).kinds() == ["failure"]


def test_oversubscription_slows_only_the_links_between_nodes():
    c = md.Cluster(gpus_per_node=2, oversubscription=4)
    assert c.link(0, 1) == md.Cluster(gpus_per_node=2).link(0, 1)
    assert c.link(1, 2).beta == md.Cluster().inter_link.beta / 4
    with pytest.raises(ValueError, match="oversubscription"):
        md.Cluster(oversubscription=0.5)


@pytest.mark.parametrize("cause", md.profiling.CAUSES)
def test_a_mystery_run_carries_the_fault_its_seed_draws(cause):
    m = md.profiling.mystery_run(5, cause)
    kind, subject, remedy = m.reveal()
    assert kind == cause and remedy in md.profiling.REMEDIES and 2 <= m.world_size <= 8
    assert len(m.run.windows) == m.world_size and "predicted" in repr(m) and cause not in repr(m)
    slower = m.run.time[-1] / m.predicted_step
    if cause in ("straggler", "slow link"):  # broken hardware: slower than the estimate of the layout
        assert slower > 1.2
    else:  # the configuration's own cost (or no time at all): the estimate has it already
        assert slower == pytest.approx(1.0, rel=1e-9)
    peaks = m.run.peak_memory
    if cause == "memory spike":
        assert peaks[subject] > 1.2 * min(peaks) and sorted(peaks)[-2] == min(peaks)
    if cause == "slow link":
        assert md.profiling.slow_links(m.run.trace) == [subject]


def test_mystery_runs_are_drawn_from_the_seed():
    kinds = [md.profiling.mystery_run(s).reveal()[0] for s in (2, 18, 7, 8, 3, 12)]  # lab 23's runs A to F
    assert sorted(kinds) == sorted(md.profiling.CAUSES)
    assert md.profiling.mystery_run(3).reveal() == md.profiling.mystery_run(3).reveal()
    with pytest.raises(ValueError, match="cause must be one of"):
        md.profiling.mystery_run(1, "gremlins")


def test_a_memory_spike_is_held_through_the_step_on_one_rank_only():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    # timing-only faults run shape-only
    kw = dict(steps=2, global_batch=8, backend=Backend("inprocess", shape_only=True))
    plain = train(cfg, ParallelConfig(dp=2), **kw)
    spiked = train(cfg, ParallelConfig(dp=2), resilience=Resilience(faults=Faults(spike={1: 1e6})), **kw)
    assert spiked.peak_memory[0] == plain.peak_memory[0]
    assert spiked.peak_memory[1] == pytest.approx(plain.peak_memory[1] + 1e6)
    assert spiked.time == plain.time and spiked.peak_breakdown[1]["buffers"] >= 1e6
    assert Faults(slow={1: 2.0}, spike={0: 1.0}).timing_only and not Faults(kill=((0, 1),)).timing_only
    with pytest.raises(ValueError, match="spike maps a rank"):
        Faults(spike={0: -1.0})
    with pytest.raises(ValueError, match="outside the 2 ranks"):
        train(cfg, ParallelConfig(dp=2), resilience=Resilience(faults=Faults(spike={2: 1.0})), **kw)
    with pytest.raises(ValueError, match="cannot checkpoint, restart"):
        train(cfg, ParallelConfig(dp=2), resilience=Resilience(faults=Faults(kill=((0, 1),))), **kw)
