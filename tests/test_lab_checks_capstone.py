"""Lab 25's design check accepts any layout that keeps to the brief and names each constraint a layout breaks.

The designs here are the check's own references for a layout (numbers consistent with its simulated step), so
what is graded is the layout alone: three different valid ones pass; one over budget, one out of memory and one
on more GPUs than the brief has are each rejected by the name of the constraint. Each layout is simulated once
(the check caches by layout), shape-only with one rank per pipeline stage: about a second each.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs import capstone_checks as cc
from minidist.parallel import ParallelConfig

BRIEF = dict(model="llama3_8b", tokens=15e12, global_batch=512, cluster="dgx-h100", gpus_available=2048,
             gpu_mtbf_s=cc.GPU_MTBF_S, restart_s=15 * 60, state_bytes_per_param=14, deadline_days=30,
             budget_usd=2.6e6)
WHY = "a sentence that says what this layout buys"

VALID = {
    "tp8 dp128, sequence parallel": ParallelConfig(tp=8, dp=128, zero_stage=1, microbatches=4, sequence_parallel=True),
    "tp4 pp2 interleaved": ParallelConfig(tp=4, pp=2, dp=128, zero_stage=1, microbatches=4, sequence_parallel=True,
                                          schedule="interleaved", virtual_stages=2),
    "tp4 dp256, selective recompute": ParallelConfig(tp=4, dp=256, zero_stage=1, microbatches=2,
                                                     recompute="selective"),
}
OVER_BUDGET = ParallelConfig(tp=8, dp=256, zero_stage=1, microbatches=2)  # 2,048 GPUs: 15 days, about 3 M USD
OUT_OF_MEMORY = ParallelConfig(tp=4, dp=256, zero_stage=1, microbatches=2)  # every activation kept: 87 GB
TOO_MANY = ParallelConfig(tp=8, dp=512, zero_stage=1, microbatches=1, sequence_parallel=True)  # 4,096 GPUs


def _design(pc: ParallelConfig, brief: dict = BRIEF, **changes) -> md.labs.Design:
    """The design whose numbers all follow from ``pc``'s simulated step, as a learner's correct code computes."""
    step = cc._simulated(brief["model"], brief["cluster"], pc, brief["global_batch"])
    hw = cc._hardware(brief["cluster"])
    tokens_per_step = brief["global_batch"] * 8192
    gpus = pc.world_size
    stall, interval, overhead = cc._checkpoint(brief["state_bytes_per_param"] * step.num_params, gpus, 8,
                                               hw.host_link.beta, hw.storage_bw, brief["gpu_mtbf_s"],
                                               brief["restart_s"])
    days, usd = cc._days_and_cost(step.step_time, brief["tokens"], tokens_per_step, overhead, gpus,
                                  md.estimate.cluster(brief["cluster"]).usd_per_gpu_hour)
    d = md.labs.Design(pc, WHY, step.step_time, max(step.peaks),
                       cc._mfu(step.step_time, step.num_params, tokens_per_step, gpus, hw.gpu.peak("bf16")),
                       stall, interval, overhead, days, usd)
    return dataclasses.replace(d, **changes)


@pytest.mark.parametrize("name", list(VALID))
def test_any_layout_within_the_brief_is_accepted(name, capsys):
    md.labs.check_design(_design(VALID[name]), BRIEF)
    assert "accepted" in capsys.readouterr().out


def test_the_valid_layouts_differ():
    shapes = {(pc.tp, pc.pp, pc.dp, pc.recompute, pc.schedule) for pc in VALID.values()}
    assert len(shapes) == 3


def test_over_budget_is_named_with_the_amounts():
    with pytest.raises(CheckFailed, match=r"over budget: \d\.\d\d M USD > 2\.6 M USD") as info:
        md.labs.check_design(_design(OVER_BUDGET), BRIEF)
    assert "out of memory" not in str(info.value) and "past the deadline" not in str(info.value)


def test_out_of_memory_is_named_with_the_rank_and_its_peak():
    with pytest.raises(CheckFailed, match=r"out of memory: rank \d+ peaks at \d+\.\d GB > 80 GB") as info:
        md.labs.check_design(_design(OUT_OF_MEMORY), BRIEF)
    assert "over budget" not in str(info.value)


def test_more_gpus_than_the_brief_has_is_named():
    with pytest.raises(CheckFailed, match=r"too many GPUs: 4,096 > 2,048 available"):
        md.labs.check_design(_design(TOO_MANY), BRIEF)


def test_a_deadline_too_close_is_named():
    with pytest.raises(CheckFailed, match=r"past the deadline: \d+\.\d days > 10 days"):
        md.labs.check_design(_design(VALID["tp8 dp128, sequence parallel"]), dict(BRIEF, deadline_days=10))


@pytest.mark.parametrize("field, value, message", [
    ("step_time", 0.1, r"step_time 0\.1, but it is .*simulated step"),
    ("peak_memory", 1e9, "peak_memory 1e\\+09, but it is"),
    ("mfu", 0.6, "mfu 0.6, but"),
    ("overhead", 0.0, "overhead 0, but"),
    ("days", 1.0, "days 1, but"),
    ("cost_usd", 1.0, "cost_usd 1, but"),
])
def test_numbers_that_disagree_with_the_simulated_step_are_named(field, value, message):
    with pytest.raises(CheckFailed, match=message):
        md.labs.check_design(_design(VALID["tp8 dp128, sequence parallel"], **{field: value}), BRIEF)


def test_an_understated_cost_does_not_hide_the_budget():
    """The constraints are judged on the check's own numbers: writing a small cost does not pass a layout."""
    with pytest.raises(CheckFailed, match="over budget") as info:
        md.labs.check_design(_design(OVER_BUDGET, cost_usd=1e6), BRIEF)
    assert "cost_usd 1e+06, but" in str(info.value)


def test_fields_of_the_wrong_type_and_a_missing_reason_are_named():
    pc = VALID["tp8 dp128, sequence parallel"]
    with pytest.raises(CheckFailed, match=r"layout is str .*not an md.parallel.ParallelConfig"):
        md.labs.check_design(_design(pc, layout="tp8 dp128"), BRIEF)
    with pytest.raises(CheckFailed, match="say in a sentence or two"):
        md.labs.check_design(_design(pc, why=""), BRIEF)
    with pytest.raises(CheckFailed, match="takes an md.labs.Design, got dict"):
        md.labs.check_design({}, BRIEF)
    with pytest.raises(CheckFailed, match="missing"):
        md.labs.check_design(_design(pc), {"model": "llama3_8b"})


def test_a_layout_that_cannot_run_is_named():
    with pytest.raises(CheckFailed, match="the layout cannot run"):
        md.labs.check_design(md.labs.Design(ParallelConfig(dp=1024), WHY, 1.0, 1.0, 0.4, 1.0, 1.0, 0.01, 1.0, 1.0),
                             BRIEF)  # 512 sequences do not split over 1,024 data-parallel ranks


# --- the exercises -------------------------------------------------------------------------------------------


def test_mfu_of_accepts_the_reference_and_names_the_usual_slips(capsys):
    md.labs.check_mfu_of(cc._mfu)
    assert "ok: mfu_of" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="not a percentage"):
        md.labs.check_mfu_of(lambda *a: 100 * cc._mfu(*a))
    with pytest.raises(CheckFailed, match="backward pass as well"):
        md.labs.check_mfu_of(lambda *a: cc._mfu(*a) / 3)
    with pytest.raises(CheckFailed, match="all the GPUs"):
        md.labs.check_mfu_of(lambda s, n, t, g, p: cc._mfu(s, n, t, 1, p))


def _ckpt(**slip):
    def plan(state, gpus, per_node, host_bw, storage_bw, gpu_mtbf, restart):
        shard = state / gpus
        stall = shard / host_bw + (1 if slip.get("unshared") else per_node) * shard / storage_bw
        mtbf = gpu_mtbf if slip.get("one_gpu") else gpu_mtbf / gpus
        interval = math.sqrt(2 * stall * mtbf)
        lost = 0 if slip.get("no_restart") else restart
        return stall, interval, stall / interval + (interval / 2 + lost) / mtbf
    return plan


def test_checkpoint_plan_accepts_the_reference_and_names_the_usual_slips(capsys):
    md.labs.check_checkpoint_plan(cc._checkpoint)
    md.labs.check_checkpoint_plan(_ckpt())
    assert capsys.readouterr().out.count("ok: checkpoint_plan") == 2
    with pytest.raises(CheckFailed, match="share one drive"):
        md.labs.check_checkpoint_plan(_ckpt(unshared=True))
    with pytest.raises(CheckFailed, match="any one of its GPUs fails"):
        md.labs.check_checkpoint_plan(_ckpt(one_gpu=True))
    with pytest.raises(CheckFailed, match="also costs the restart"):
        md.labs.check_checkpoint_plan(_ckpt(no_restart=True))
    with pytest.raises(CheckFailed, match=r"return the tuple \(stall_s, interval_s, overhead\)"):
        md.labs.check_checkpoint_plan(lambda *a: 1.0)


def test_days_and_cost_accepts_the_reference_and_whole_steps_and_names_the_usual_slips(capsys):
    md.labs.check_days_and_cost(cc._days_and_cost)

    def whole_steps(step, tokens, per_step, overhead, gpus, price):
        seconds = math.ceil(tokens / per_step) * step * (1 + overhead)
        return seconds / 86400, gpus * seconds / 3600 * price

    md.labs.check_days_and_cost(whole_steps)
    assert capsys.readouterr().out.count("ok: days_and_cost") == 2
    with pytest.raises(CheckFailed, match="overhead"):
        md.labs.check_days_and_cost(lambda s, t, k, o, g, p: cc._days_and_cost(s, t, k, 0.0, g, p))
    with pytest.raises(CheckFailed, match="the job pays for all its GPUs"):
        md.labs.check_days_and_cost(lambda s, t, k, o, g, p: cc._days_and_cost(s, t, k, o, 1, p))


def test_busy_by_op_accepts_the_reference_and_names_the_usual_slips(capsys):
    md.labs.check_busy_by_op(cc._busy_by_op)
    assert "ok: busy_by_op: 3 runs, both devices" in capsys.readouterr().out

    def whole_run(run, rank):  # every step, not the last one
        out = {}
        for e in run.trace.filter(rank=rank, stream="compute"):
            out[e.name.split(".")[0]] = out.get(e.name.split(".")[0], 0.0) + e.end - e.start
        return out

    def by_name(run, rank):  # forward and backward apart
        lo, hi = run.windows[rank][-1]
        out = {}
        for e in run.trace.filter(rank=rank, stream="compute"):
            if lo <= e.start < hi:
                out[e.name] = out.get(e.name, 0.0) + e.end - e.start
        return out

    with pytest.raises(CheckFailed, match="only the last step"):
        md.labs.check_busy_by_op(whole_run)
    with pytest.raises(CheckFailed, match="count a backward with its forward"):
        md.labs.check_busy_by_op(by_name)
    with pytest.raises(CheckFailed, match="return a dict"):
        md.labs.check_busy_by_op(lambda run, rank: [])


def test_a_step_from_the_measured_device_is_told_which_device_grades_it():
    """The brief is judged on the ideal device; a design whose numbers come from the measured one is told so."""
    pc = VALID["tp4 pp2 interleaved"]
    measured = cc._simulated(BRIEF["model"], BRIEF["cluster"], pc, BRIEF["global_batch"], "measured")
    ideal = cc._simulated(BRIEF["model"], BRIEF["cluster"], pc, BRIEF["global_batch"])
    assert measured.step_time > 1.5 * ideal.step_time and measured.peaks == ideal.peaks
    with pytest.raises(CheckFailed, match="your step is the measured device's: the brief is judged on the ideal"):
        md.labs.check_design(_design(pc, step_time=measured.step_time), BRIEF)
