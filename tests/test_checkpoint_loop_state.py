"""A checkpoint holds what the step loop carries besides weights and moments - the dynamic loss scaler's state and
the routing biases of auxiliary-loss-free MoE balancing - so a run resumed or restarted from it is the uninterrupted
run, bitwise; and a rank process that really dies (not an injected fault) restarts like an injected failure."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

import minidist as md
from minidist.parallel import AdamW, ParallelConfig, Precision, Resilience, train
from minidist.parallel.rank_state import merge_loop
from minidist.resilience import Faults, latest
from minidist.runtime import RankError

TRAIN = importlib.import_module("minidist.parallel.train")  # the module (md.parallel.train is the function)

DENSE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
BIAS = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2, d_ff=16,
                    aux_loss_coef=0.0, moe_balance="bias", bias_update=0.05)
# lr=1 makes fp16 gradients overflow at steps 3 and 4: the scale backs off twice, so a resumed run that restarted
# the scaler would scale (and skip) differently
FP16 = dict(precision=Precision("fp16"), optimizer=AdamW(lr=1.0))
STEPS = 6


def same(a, b) -> None:
    assert a.losses == b.losses
    assert all(np.array_equal(a.params[k], b.params[k]) for k in b.params)
    assert a.loss_scales == b.loss_scales and a.skipped_steps == b.skipped_steps
    # every step timed as in the uninterrupted run, those after a checkpoint or a resume's setup included
    assert a.time == pytest.approx(b.time, rel=1e-9)


def route_biases(root) -> dict:
    """The routing biases the newest checkpoint in ``root`` holds, layer by layer."""
    _, ranks = latest(root)
    return merge_loop([meta for _, meta in ranks])["route_bias"]


CASES = [(DENSE, ParallelConfig(dp=2), FP16), (DENSE, ParallelConfig(dp=2, zero_stage=1), FP16),
         (BIAS, ParallelConfig(dp=2), {}), (BIAS, ParallelConfig(dp=2, ep=2), {})]
IDS = ["fp16-dp2", "fp16-zero1", "bias-dp2", "bias-dp2-ep2"]


@pytest.mark.parametrize("cfg, pc, kw", CASES, ids=IDS)
def test_a_run_resumed_from_step_k_is_the_uninterrupted_run(cfg, pc, kw, tmp_path):
    ref = train(cfg, pc, steps=STEPS, global_batch=8, resilience=Resilience(tmp_path / "ref", every=2), **kw)
    if kw:
        assert ref.skipped_steps == 2 and len(set(ref.loss_scales)) == 3  # the scale moved before the checkpoint
    train(cfg, pc, steps=4, global_batch=8, resilience=Resilience(tmp_path / "run", every=2), **kw)
    got = train(cfg, pc, steps=STEPS, global_batch=8, resilience=Resilience(tmp_path / "run", every=2, resume=True),
                **kw)
    same(got, ref)
    if cfg is BIAS:  # the biases moved, and the resumed run moved them exactly as the uninterrupted one
        want = route_biases(tmp_path / "ref")
        assert len(want) == 2 and all(np.any(np.asarray(b)) for b in want.values())
        assert route_biases(tmp_path / "run") == want


@pytest.mark.parametrize("cfg, pc, kw", [CASES[0], CASES[3]], ids=[IDS[0], IDS[3]])
def test_an_injected_failure_restarts_into_the_uninterrupted_run(cfg, pc, kw, tmp_path):
    # the uninterrupted run checkpoints at the same steps: under ep the ranks end a step at different times, so a
    # step that begins with them together (after a checkpoint, or a restart's setup) is not timed like the others
    ref = train(cfg, pc, steps=STEPS, global_batch=8, resilience=Resilience(tmp_path / "ref", every=2), **kw)
    got = train(cfg, pc, steps=STEPS, global_batch=8,
                resilience=Resilience(tmp_path / "run", every=2, restart=True,
                                      faults=Faults(kill=((pc.world_size - 1, 5),))),
                **kw)
    same(got, ref)
    assert [(f["rank"], f["step"]) for f in got.failures] == [(pc.world_size - 1, 5)]


def test_an_in_place_rollback_restores_the_loss_scale(tmp_path):
    pc = ParallelConfig(dp=2)
    ref = train(DENSE, pc, steps=8, global_batch=8, **FP16)
    probe = train(DENSE, pc, steps=8, global_batch=8, resilience=Resilience(tmp_path / "p", every=2), **FP16)
    got = train(DENSE, pc, steps=8, global_batch=8,
                resilience=Resilience(tmp_path / "r", every=2, restart=True,
                                      faults=Faults(mtbf=probe.total_time / 3, seed=3, in_place=True)), **FP16)
    assert len(got.failures) >= 1
    same(got, ref)


def _dies_once(marker: str, rank: int, step: int):
    """A stand-in for ``get_batch`` that makes ``rank``'s process exit as it draws step ``step``'s batch, once."""
    real = TRAIN.get_batch
    calls = {"n": 0}

    def get_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step + 1 and md.dist.get_rank() == rank and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # a real death: no exception, no report, no note of when
        return real(*args, **kwargs)
    return get_batch


@pytest.mark.parametrize("checkpoints", [True, False], ids=["from-checkpoint", "from-start"])
def test_a_rank_that_really_dies_restarts_into_the_uninterrupted_run(checkpoints, tmp_path, monkeypatch):
    pc = ParallelConfig(dp=2)
    ref = train(DENSE, pc, steps=STEPS, global_batch=8)
    monkeypatch.setattr(TRAIN, "get_batch", _dies_once(str(tmp_path / "died"), 1, 3))
    kw = dict(checkpoint_dir=tmp_path / "ck", every=2) if checkpoints else {}
    got = train(DENSE, pc, steps=STEPS, global_batch=8, resilience=Resilience(restart=True, **kw))
    assert (tmp_path / "died").exists()
    same(got, ref)
    assert [(f["rank"], f["step"]) for f in got.failures] == [(1, None)]
    assert "exit code 1" in got.failures[0]["reason"] and got.lost_time == 0


def test_without_restart_a_real_death_is_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(TRAIN, "get_batch", _dies_once(str(tmp_path / "died"), 1, 1))
    with pytest.raises(RankError, match="exit code 1"):
        train(DENSE, ParallelConfig(dp=2), steps=3, global_batch=8)


def test_a_rank_that_raises_is_an_error_even_with_restart(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the rank's code")
    monkeypatch.setattr(TRAIN, "get_batch", broken)
    with pytest.raises(RankError, match="a bug in the rank's code"):
        train(DENSE, ParallelConfig(dp=2), steps=3, global_batch=8, resilience=Resilience(restart=True))
