"""Lab 25's design check accepts any self-consistent design and names every number that disagrees."""

from __future__ import annotations

import dataclasses
import math

import pytest

import minidist as md
from minidist.labs import CheckFailed


def _design(**changes) -> md.labs.Design:
    est = md.estimate.plan("llama3_70b", "dgx-h100", 4096, top=3)[2]  # not the top one: any layout that fits
    C, M = 0.3, 45_000.0
    interval = md.estimate.young_daly_interval(C, M)
    overhead = md.estimate.checkpoint_overhead(interval, C, M)
    days = 15e12 / (est.global_batch * est.seq_len) * est.step_time * (1 + overhead) / 86400
    d = md.labs.Design("llama3_70b", "dgx-h100", 4096, est.layout, est.global_batch, est.seq_len, 15e12,
                       est.step_time, est.mfu, C, M, interval, overhead, days, 4.0, 4096 * days * 24 * 4.0,
                       25e6, 60)
    return dataclasses.replace(d, **changes)


def test_a_consistent_design_passes(capsys):
    md.labs.check_design(_design())
    assert "consistent" in capsys.readouterr().out


@pytest.mark.parametrize("changes, message", [
    (dict(cost_usd=1e6), "cost_usd"),
    (dict(step_time=1.0), "the estimator predicts"),
    (dict(gpus=2048), "GPUs, the design 2048"),
    (dict(checkpoint_interval_s=60.0), "sqrt\\(2 C MTBF\\)"),
    (dict(days=10.0), "days 10"),
    (dict(budget_usd=1e6), "over the budget"),
    (dict(deadline_days=20), "past the deadline"),
    (dict(layout=md.estimate.Layout(tp=1, pp=2, dp=2048, zero_stage=0)), "usable"),
    (dict(layout=md.estimate.Layout(tp=1, dp=4096)), "cannot price"),
    (dict(usd_per_gpu_hour=2.0), "costs 4 USD"),
    (dict(mtbf_s=md.labs.capstone_checks.GPU_MTBF_S), "one GPU's MTBF"),
    (dict(mtbf_s=45_000.0 / 3600), "in hours"),
    (dict(mtbf_s=4_500.0), "4,096 times as often"),
    (dict(checkpoint_seconds=600.0, checkpoint_interval_s=500.0), "no time to train"),
])
def test_each_inconsistency_is_named(changes, message):
    with pytest.raises(CheckFailed, match=message):
        md.labs.check_design(_design(**changes))


def test_the_brief_is_taken_as_given():
    brief = dict(model="llama3_70b", tokens=15e12, cluster="dgx-h100", budget_usd=25e6, deadline_days=60)
    md.labs.check_design(_design(), brief)
    for field, value in (("tokens", 1.5e12), ("budget_usd", 1e9), ("deadline_days", 90)):
        with pytest.raises(CheckFailed, match=f"{field} .*, but the brief says"):
            md.labs.check_design(_design(**{field: value}), brief)


def test_every_disagreement_is_reported_at_once():
    with pytest.raises(CheckFailed) as info:
        md.labs.check_design(_design(cost_usd=1.0, mfu=0.9))
    assert "cost_usd" in str(info.value) and "mfu" in str(info.value)


def test_gpus_for_explains_the_usual_mistakes():
    md.labs.check_gpus_for(lambda f, p, u, d: f / (p * u * d * 86400))
    with pytest.raises(CheckFailed, match="not 3,600"):
        md.labs.check_gpus_for(lambda f, p, u, d: f / (p * u * d * 3600))
    with pytest.raises(CheckFailed, match="not rounded"):
        md.labs.check_gpus_for(lambda f, p, u, d: math.ceil(f / (p * u * d * 86400)))
    with pytest.raises(CheckFailed, match="divide by the MFU"):
        md.labs.check_gpus_for(lambda f, p, u, d: f * u / (p * d * 86400))


def test_days_without_the_overhead_are_caught():
    d = _design()
    bare = d.days / (1 + d.overhead)
    assert d.overhead < 0.02  # the old 2% tolerance let this through
    with pytest.raises(CheckFailed, match=r"days .* \(that is without the overhead\)"):
        md.labs.check_design(_design(days=bare))


def test_fields_of_the_wrong_type_are_named_before_anything_is_computed():
    with pytest.raises(CheckFailed, match=r"layout is str .*not an md.estimate.Layout"):
        md.labs.check_design(_design(layout="tp8 pp4"))
    with pytest.raises(CheckFailed, match=r"gpus is str '4096', not a number"):
        md.labs.check_design(_design(gpus="4096"))
    with pytest.raises(CheckFailed, match="takes an md.labs.Design, got dict"):
        md.labs.check_design({})
