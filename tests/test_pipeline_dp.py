"""Pipeline parallelism inside data parallelism (chapter 16, lab 10): pp in {2, 4} x dp = 2, every schedule, m in
{1, 4, 8}: losses, gradients and weights after 2 AdamW steps equal the single-device run (float64)."""

import pytest

from minidist.parallel import ParallelConfig, train
from tests.test_pipeline import BATCH, SCHEDULES, STEPS, assert_same, config_for, single_device


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [pytest.param(1, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("schedule, v", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_pipeline_with_data_parallel_matches_single_device(schedule, v, m, pp):
    pc = ParallelConfig(pp=pp, dp=2, microbatches=m, schedule=schedule, virtual_stages=v)
    cfg = config_for(pp, v)
    res = train(cfg, pc, steps=STEPS, global_batch=BATCH)
    assert_same(res, single_device(cfg))
    if m == 4 and schedule == "1f1b":  # the gradient all-reduce stays inside each stage's dp group
        links = [e for e in res.trace if e.stream == "link" and e.nbytes > 0]
        for e in links:
            src, dst = (int(r) for r in e.name.split("->"))
            assert src // 2 == dst // 2 or src % 2 == dst % 2  # same stage (dp peers) or same replica (pp)


@pytest.mark.parametrize("sharding", [{"zero_stage": 3}, {"fsdp": True}], ids=["zero3", "fsdp"])
@pytest.mark.parametrize("schedule, v", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_pipeline_with_sharded_parameters_matches_single_device(schedule, v, sharding):
    """Each stage's units are gathered around their use inside the schedule's actions; under a zero-bubble
    schedule a unit's weights go once its input gradient exists and its gradient is reduced at the flush."""
    cfg = config_for(2, v)
    res = train(cfg, ParallelConfig(pp=2, dp=2, microbatches=4, schedule=schedule, virtual_stages=v, **sharding),
                steps=STEPS, global_batch=BATCH)
    assert_same(res, single_device(cfg))
