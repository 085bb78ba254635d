"""Checkpoints, failures and restarts (chapter 26, lab 17).

A run killed at step k and restarted from its last checkpoint ends bitwise where the uninterrupted run
ends; a damaged checkpoint is named and skipped, never loaded; a checkpoint written under one layout
continues under another exactly as a run that started there from the same state.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, Resilience, build_mesh, parallelize
from minidist.parallel.checkpoint_sweep import SweepPoint, fitted_optimum
from minidist.parallel.data.flat_optim import FlatOptimizer
from minidist.parallel.memory import state_bytes_per_param
from minidist.parallel.rank_state import capture, merge, restore
from minidist.parallel.restart import step_loss
from minidist.resilience import CheckpointError, Faults, RankFailure, committed, latest, read
from minidist.resilience.store import commit, write_rank

DENSE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
HEADS4 = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=4)
MOE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2, d_ff=16)
STEPS = 6


def bitwise(a, b) -> bool:
    return a.losses == b.losses and all(np.array_equal(a.params[k], b.params[k]) for k in b.params)


def close(a, b, tol: float = 1e-10) -> float:
    return max(float(np.abs(a.params[k] - b.params[k]).max()) for k in b.params) < tol


LAYOUTS = [
    (DENSE, dict(dp=2, tp=2, pp=2, zero_stage=1, microbatches=2)),
    (DENSE, dict(dp=2, zero_stage=3)),
    (DENSE, dict(pp=2, dp=2, fsdp=True, microbatches=2, schedule="zb-h1")),
    (MOE, dict(ep=2, dp=2, zero_stage=2)),
    (DENSE, dict(dp=2, cp=2, offload="optimizer")),
]


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("cfg, layout", LAYOUTS, ids=["3d-zero1", "zero3", "pp-fsdp-zb", "moe-ep-zero2", "cp-offload"])
def test_a_killed_rank_restarts_from_the_last_checkpoint_and_ends_bitwise_equal(cfg, layout, async_, tmp_path):
    pc = ParallelConfig(**layout)
    ref = md.parallel.train(cfg, pc, steps=STEPS, global_batch=4)
    # the last rank dies as it starts step 5: the checkpoint of step 4 (sync) or 2 (async: 4 is not yet published)
    got = md.parallel.train(cfg, pc, steps=STEPS, global_batch=4,
                            resilience=Resilience(tmp_path, every=2, async_=async_, restart=True,
                                                  faults=Faults(kill=((pc.world_size - 1, 5),))))
    assert bitwise(got, ref)
    assert [(f["rank"], f["step"]) for f in got.failures] == [(pc.world_size - 1, 5)]
    assert got.lost_time > 0 and got.total_time > got.lost_time
    assert committed(tmp_path) == [4, 6]  # the two newest are kept


def test_failures_of_an_mtbf_process_are_survived(tmp_path):
    pc = ParallelConfig(dp=2)
    ref = md.parallel.train(DENSE, pc, steps=8, global_batch=4, resilience=Resilience(tmp_path / "ref", every=1))
    mtbf = 3 * ref.total_time / 8  # a failure every three checkpointed steps or so
    got = md.parallel.train(DENSE, pc, steps=8, global_batch=4,
                            resilience=Resilience(tmp_path / "run", every=1, restart=True,
                                                  faults=Faults(mtbf=mtbf, seed=1, restart_seconds=1e-6)))
    assert bitwise(got, ref) and len(got.failures) >= 1
    assert all(f["reason"] == "MTBF failure" for f in got.failures)


def test_without_restart_a_failure_is_reported_with_its_rank_and_step(tmp_path):
    with pytest.raises(RankFailure, match="rank 1 failed at step 2"):
        md.parallel.train(DENSE, ParallelConfig(dp=2), steps=3, global_batch=4,
                          resilience=Resilience(faults=Faults(kill=((1, 2),))))


def test_a_straggler_slows_every_step_down():
    pc = ParallelConfig(dp=2)
    fast = md.parallel.train(DENSE, pc, steps=2, global_batch=4)
    slow = md.parallel.train(DENSE, pc, steps=2, global_batch=4, resilience=Resilience(faults=Faults(slow={1: 3.0})))
    assert bitwise(slow, fast)  # the numbers do not change, the time does
    assert slow.time[1] > 1.5 * fast.time[1]


def _checkpoints(tmp_path, every=1, steps=3):
    return md.parallel.train(DENSE, ParallelConfig(dp=2), steps=steps, global_batch=4,
                             resilience=Resilience(tmp_path, every=every))


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_a_damaged_checkpoint_is_named_and_the_previous_one_is_used(damage, tmp_path):
    _checkpoints(tmp_path)
    assert committed(tmp_path) == [2, 3]
    victim = Path(tmp_path) / "step_00000003" / "rank_00001.npz"
    data = victim.read_bytes()
    if damage == "corrupt":
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    else:
        victim.unlink()
    with pytest.raises(CheckpointError, match=r"step 3: the file of rank 1 .*rank_00001\.npz"):
        read(tmp_path, 3)
    with pytest.warns(UserWarning, match="rank 1"):
        manifest, _ = latest(tmp_path, warn=lambda m: warnings.warn(m, stacklevel=2))
    assert manifest["step"] == 2
    ref = md.parallel.train(DENSE, ParallelConfig(dp=2), steps=5, global_batch=4)
    with pytest.warns(UserWarning, match="rank 1"):
        # pytest.warns records every warning and hands back the others, so pyproject's filter of the fork warning
        # (Python >= 3.12) would not apply to them: say it again inside
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="multiprocess.popen_fork")
        got = md.parallel.train(DENSE, ParallelConfig(dp=2), steps=5, global_batch=4,
                                resilience=Resilience(tmp_path, resume=True))
    assert bitwise(got, ref)


def test_a_write_cut_off_before_its_manifest_is_never_read(tmp_path):
    _checkpoints(tmp_path, every=2, steps=4)
    partial = Path(tmp_path) / ".step_00000006.tmp"  # a crash while rank 0 wrote step 6
    partial.mkdir()
    (partial / "rank_00000.npz").write_bytes(b"half a file")
    assert committed(tmp_path) == [2, 4]
    assert latest(tmp_path)[0]["step"] == 4


# -- resharding ----------------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, cfg, layout: ParallelConfig) -> None:
    """The state of checkpoint ``src`` loaded into ``layout`` and written again by it (no step taken)."""
    manifest, ranks = latest(src)
    full = merge(ranks)
    dcfg = md.GPTConfig(**{**cfg.__dict__, "dtype": "float64"})

    def rank():
        mesh = build_mesh(layout)
        opt = FlatOptimizer("adamw", lr=1e-3)
        par = parallelize(md.GPT(dcfg, seed=0), mesh, layout, opt, state_bytes_per_param("float64", "adamw"))
        tp = mesh.get_local_rank("tp"), mesh.size("tp")
        restore(par.reducer, opt, par.model, full, par.tp_axes, *tp)
        arrays, meta = capture(par.reducer, opt, par.model, par.tp_axes, *tp)
        meta.update({"losses": [], "windows": [], "lead": tp[0] == 0})
        write_rank(dst, manifest["step"], md.dist.get_rank(), arrays, meta)
        md.dist.barrier()
        if md.dist.get_rank() == 0:
            shared = {k: manifest[k] for k in ("rng", "losses", "times", "attempt", "clock")}
            dst_losses = manifest["losses"] + latest_losses(ranks)
            commit(dst, manifest["step"], md.dist.get_world_size(), {**shared, "losses": dst_losses})

    md.launch(rank, world_size=layout.world_size)


def latest_losses(ranks) -> list[float]:
    metas = [m for _, m in ranks]
    return [step_loss(m["losses"][s] for m in metas if m["lead"]) for s in range(len(metas[0]["losses"]))]


PAIRS = [
    (HEADS4, dict(dp=2, tp=2, pp=2, zero_stage=1, microbatches=2), dict(tp=4, dp=2)),
    (DENSE, dict(pp=2, dp=2, zero_stage=1, microbatches=2), dict(dp=2, zero_stage=3)),
    (DENSE, dict(dp=2, zero_stage=3), dict(pp=2, tp=2, microbatches=2)),
    (DENSE, dict(dp=4, fsdp=True), dict(pp=2, dp=2, zero_stage=2, microbatches=2)),
    (DENSE, dict(tp=2, sequence_parallel=True, cp=2), dict()),
    (MOE, dict(ep=2, dp=2, zero_stage=3), dict(ep=4)),
]


@pytest.mark.parametrize("cfg, before, after", PAIRS,
                         ids=["3d-to-tp4", "pp-to-zero3", "zero3-to-pp-tp", "fsdp-to-pp-zero2", "sp-cp-to-one",
                              "moe-ep2-to-ep4"])
def test_a_checkpoint_continues_under_another_layout(cfg, before, after, tmp_path):
    first, second = ParallelConfig(**before), ParallelConfig(**after)
    md.parallel.train(cfg, first, steps=3, global_batch=4, resilience=Resilience(tmp_path / "a", every=3))
    _rewrite(tmp_path / "a", tmp_path / "b", cfg, second)
    # the whole tensors survive any layout: loading and writing again changes no bit
    full_a, full_b = merge(latest(tmp_path / "a")[1]), merge(latest(tmp_path / "b")[1])
    for name in full_a:
        for kind in ("w", "m", "v"):
            assert np.array_equal(full_a[name][kind], full_b[name][kind]), (name, kind)
        assert full_a[name]["step"] == full_b[name]["step"]
    resharded = md.parallel.train(cfg, second, steps=STEPS, global_batch=4,
                                  resilience=Resilience(tmp_path / "a", resume=True))
    native = md.parallel.train(cfg, second, steps=STEPS, global_batch=4,
                               resilience=Resilience(tmp_path / "b", resume=True))
    assert bitwise(resharded, native)  # equal to the run that started on the new layout from the same state
    assert close(resharded, md.parallel.train(cfg, ParallelConfig(), steps=STEPS, global_batch=4))


def test_resume_refuses_a_different_model(tmp_path):
    _checkpoints(tmp_path, every=3, steps=3)
    other = md.GPTConfig(**{**DENSE.__dict__, "d_model": 32})
    with pytest.raises(md.RankError, match="shape"):
        md.parallel.train(other, ParallelConfig(), steps=4, global_batch=4,
                          resilience=Resilience(tmp_path, resume=True))
    shutil.rmtree(tmp_path)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        md.parallel.train(DENSE, ParallelConfig(), steps=4, global_batch=4, resilience=Resilience(every=2))


# -- failures survived in place, and the arithmetic of checkpoint intervals --------------------------


def test_in_place_failures_roll_back_and_end_bitwise_equal(tmp_path):
    ref = md.parallel.train(DENSE, ParallelConfig(dp=2), steps=12, global_batch=4)
    probe = md.parallel.train(DENSE, ParallelConfig(dp=2), steps=12, global_batch=4,
                              resilience=Resilience(tmp_path / "p", every=3))
    got = md.parallel.train(DENSE, ParallelConfig(dp=2), steps=12, global_batch=4,
                            resilience=Resilience(tmp_path / "r", every=3, restart=True,
                                                  faults=Faults(mtbf=probe.total_time / 4, seed=3, in_place=True)))
    assert bitwise(got, ref) and len(got.failures) >= 2
    # every failure throws away at most one interval of steps and one checkpoint
    worst = 3 * max(ref.time) + max(probe.checkpoint_blocked) / 4
    assert 0 < got.lost_time <= len(got.failures) * worst * 1.01
    assert got.total_time > probe.total_time + got.lost_time * 0.99


def test_the_fitted_optimum_of_a_sweep_recovers_the_curve_s_minimum():
    a, b, c = 0.5, 0.01, 0.02
    points = [SweepPoint(k, 0, (1 + a / k + b * k + c) * 10.0, 10.0, 0, 0.0) for k in (2, 4, 7, 11, 16, 25)]
    assert fitted_optimum(points) == pytest.approx(np.sqrt(a / b), rel=1e-9)
    with pytest.raises(ValueError, match="no interior minimum"):
        fitted_optimum([SweepPoint(k, 0, 10.0 * (1 + 1 / k - 0.01 * k), 10.0, 0, 0.0) for k in (2, 4, 8)])


def test_failure_arithmetic():
    assert md.resilience.system_mtbf(50_000 * 3600, 10_000) == pytest.approx(5 * 3600)
    m = 3600.0
    assert md.resilience.expected_completion(m, m) == pytest.approx((np.e - 1) * m)
    c = 60.0
    best = md.resilience.young_daly_interval(c, m)
    assert best == pytest.approx(np.sqrt(2 * c * m))
    grid = np.linspace(best / 3, best * 3, 2001)
    assert grid[np.argmin([md.resilience.overhead(i, c, m) for i in grid])] == pytest.approx(best, rel=2e-3)
    with pytest.raises(ValueError, match="mtbf"):
        Faults(mtbf=-1.0)
    with pytest.raises(ValueError, match="in_place"):
        Faults(kill=((0, 1),), in_place=True)


def test_a_steps_loss_is_the_same_from_the_ranks_and_from_a_checkpoint():
    # the ranks hand over numpy float64s, a checkpoint gives back Python floats; Python 3.12's sum() adds the
    # latter with compensation and the former one by one, which split 1e16 + 1 - 1e16 + 1 into 2.0 and 1.0
    shares = [1e16, 1.0, -1e16, 1.0]
    assert step_loss(np.array(shares)) == step_loss(shares) == step_loss(iter(shares)) == 2.0
