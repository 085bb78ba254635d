"""The first step of a run is timed like the others: the setup (the broadcast of the initial weights) leaves the
ranks' clocks apart, and the time an early rank then waits for the latest is the setup's, not the step's."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.parallel import ParallelConfig, Resilience, train

DENSE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
LAYOUTS = {"ring-dp4": ParallelConfig(dp=4, algorithm="ring"), "zero1-dp3": ParallelConfig(dp=3, zero_stage=1),
           "zero2-dp3": ParallelConfig(dp=3, zero_stage=2)}


@pytest.mark.parametrize("pc", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_step_0_takes_as_long_as_step_1(pc):
    r = train(DENSE, pc, steps=3, global_batch=12)
    # the setup's broadcast ends at different times on different ranks ...
    ends = [max(e.end for e in r.trace.filter(rank=q, name="broadcast")) for q in range(pc.world_size)]
    assert max(ends) > min(ends)
    # ... and step 0 begins, on every rank, once the last has finished it: it takes as long as the next steps
    assert {w[0][0] for w in r.windows} == {max(ends)}
    assert r.time[0] == pytest.approx(r.time[1], rel=1e-9)
    assert r.time[1] == pytest.approx(r.time[2], rel=1e-9)


def test_a_resumed_run_times_its_first_step_like_the_others(tmp_path):
    pc = LAYOUTS["zero1-dp3"]
    ref = train(DENSE, pc, steps=4, global_batch=12, resilience=Resilience(tmp_path / "ref", every=2))
    train(DENSE, pc, steps=2, global_batch=12, resilience=Resilience(tmp_path / "run", every=2))
    got = train(DENSE, pc, steps=4, global_batch=12, resilience=Resilience(tmp_path / "run", every=2, resume=True))
    assert got.time[2] == pytest.approx(got.time[3], rel=1e-9)  # its setup: the broadcast and the checkpoint's read
    assert got.time[:2] == ref.time[:2] and got.time[3] == pytest.approx(ref.time[3], rel=1e-9)
