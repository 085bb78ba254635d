"""The first step of a run is timed like the others: the setup (the broadcast of the initial weights) leaves the
ranks' clocks apart, and the time an early rank then waits for the latest is the setup's, not the step's. So is the
step right after a checkpoint: its publish barrier releases the ranks one after another (and ranks copy out shares
of different sizes), and the wait for the last is the checkpoint's."""

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
    assert got.time[:2] == ref.time[:2] and got.time == pytest.approx(ref.time, rel=1e-9)


@pytest.mark.parametrize("pc", [LAYOUTS["zero1-dp3"], LAYOUTS["ring-dp4"]], ids=["zero1-dp3", "ring-dp4"])
def test_the_step_after_a_checkpoint_takes_as_long_as_the_others(pc, tmp_path):
    r = train(DENSE, pc, steps=6, global_batch=12, resilience=Resilience(tmp_path, every=2))
    # the publish barrier of the checkpoint after step 2 lets the ranks go at different times ...
    left = [max(e.end for e in r.trace.filter(rank=q, name="barrier") if e.end < r.windows[q][2][1])
            for q in range(pc.world_size)]
    assert max(left) > min(left)
    # ... and step 2 begins, on every rank, once the last has left it: every step takes as long as step 1
    assert {w[2][0] for w in r.windows} == {max(left)}
    assert all(t == pytest.approx(r.time[1], rel=1e-9) for t in r.time)  # the steps do identical work
    assert r.time == pytest.approx(train(DENSE, pc, steps=6, global_batch=12).time, rel=1e-9)
    # the checkpoints' cost stays visible: an early rank's wait for the last is in its blocked time, and the run's
    # total time is the setup, the steps and the checkpoints
    assert min(r.checkpoint_blocked) > 0
    assert r.total_time == pytest.approx(r.windows[0][0][0] + sum(r.time) + max(r.checkpoint_blocked), rel=1e-9)


def test_after_an_asynchronous_checkpoint_too(tmp_path):
    pc = ParallelConfig(dp=2, pp=2, microbatches=4)  # the stages copy out shares of different sizes
    r = train(DENSE, pc, steps=6, global_batch=8, resilience=Resilience(tmp_path, every=2, async_=True))
    assert r.time == pytest.approx(train(DENSE, pc, steps=6, global_batch=8).time, rel=1e-9)
