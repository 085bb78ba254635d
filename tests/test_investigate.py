"""The five-phase investigation names each injected fault, and nothing in a healthy run: a straggler rank, a
slow link, buckets too small for the links' latency, unequal pipeline stages; with a prediction it triages."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.parallel import ParallelConfig, train
from minidist.profiling import investigate
from minidist.resilience import Faults

WIDE = md.GPTConfig(vocab_size=64, seq_len=32, d_model=128, n_layers=4, n_heads=4)
PIPE = md.GPTConfig(vocab_size=512, seq_len=16, d_model=32, n_layers=4, n_heads=4)
SCENARIOS = {
    "healthy": (WIDE, ParallelConfig(dp=4), {}, []),
    "straggler": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5), dict(faults=Faults(slow={2: 1.5})),
                  [("straggler", 2)]),
    "slow link": (WIDE, ParallelConfig(dp=4, bucket_bytes=4e5, algorithm="ring"),
                  dict(cluster=md.Cluster(slow_links={(1, 2): 8})), [("slow link", (1, 2))]),
    "small buckets": (WIDE, ParallelConfig(dp=4, bucket_bytes=2e4), {},
                      [("latency-bound communication", "all_reduce")]),
    "unequal stages": (PIPE, ParallelConfig(pp=2, microbatches=4), {}, [("stage imbalance", None)]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_injected_fault_is_found_by_the_procedure(name):
    cfg, pc, kw, expected = SCENARIOS[name]
    rep = investigate(train(cfg, pc, steps=2, global_batch=16, **kw))
    assert [(kind, subject) for kind, subject, _ in rep.causes] == expected, rep.lines()
    assert len(rep.fixes) == len(expected) and len(rep.lines()) >= 5


def test_triage_against_the_prediction():
    pc = ParallelConfig(dp=2)
    r = train(WIDE, pc, steps=2, global_batch=16, faults=Faults(slow={1: 2.0}))
    predicted = md.estimate.predict_train(WIDE, pc, 16).step_time
    rep = investigate(r, predicted_step=predicted)
    assert rep.slowdown > 0.2 and "against the prediction" in rep.lines()[0]
