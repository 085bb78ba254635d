"""Lab 13 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import math

import pytest

import minidist as md
from minidist.labs import CheckFailed


def state_good(psi, stage, p, w=2, g=2, o=12):
    return psi * (w / (p if stage >= 3 else 1) + g / (p if stage >= 2 else 1) + o / (p if stage >= 1 else 1))


def state_stage2_shards_weights(psi, stage, p, w=2, g=2, o=12):  # terms sharded in the wrong order
    return psi * (w / (p if stage >= 2 else 1) + g / (p if stage >= 3 else 1) + o / (p if stage >= 1 else 1))


def state_fixed_sizes(psi, stage, p, w=2, g=2, o=12):
    return state_good(psi, stage, p)


def test_model_state_bytes(capsys):
    md.labs.check_model_state_bytes(state_good)
    assert "ok: model_state_bytes" in capsys.readouterr().out
    for wrong, match in [
        (state_stage2_shards_weights, "stage 2: weights sharded \\(should be replicated\\), gradients replicated"),
        (lambda psi, stage, p, w=2, g=2, o=12: psi * (w + g + o), "optimizer state replicated \\(should be sharded\\)"),
        (state_fixed_sizes, "byte sizes passed in"),
        (lambda psi, stage, p, w=2, g=2, o=12: state_good(psi, min(stage + 1, 3), p, w, g, o), "at stage 0"),
        (lambda psi, stage, p, w=2, g=2, o=12: None, "return"),
    ]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_model_state_bytes(wrong)


def min_gpus_good(psi, stage, hbm):
    fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
    sharded = 16 * psi - fixed
    if sharded == 0:
        return 1 if fixed <= hbm else None
    if fixed >= hbm:
        return None
    return max(1, math.ceil(sharded / (hbm - fixed) - 1e-9))


def min_gpus_floor(psi, stage, hbm):
    p = min_gpus_good(psi, stage, hbm)
    fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
    return p if p is None or stage == 0 else max(1, math.floor((16 * psi - fixed) / (hbm - fixed)))


def min_gpus_no_none(psi, stage, hbm):
    fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
    return math.ceil((16 * psi - fixed) / (hbm - fixed)) if stage else 1


def test_min_gpus():
    md.labs.check_min_gpus(min_gpus_good)
    for wrong, match in [(min_gpus_floor, "round up, not down"), (min_gpus_no_none, "no number of GPUs helps"),
                         (lambda psi, stage, hbm: None, "expected")]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_min_gpus(wrong)

    def divides_by_zero(psi, stage, hbm):
        fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
        return math.ceil((16 * psi - fixed) / (hbm - fixed)) if stage else (1 if 16 * psi <= hbm else None)

    with pytest.raises(CheckFailed):
        md.labs.check_min_gpus(divides_by_zero)


def comm_good(psi, p, stage, s):
    return (3 if stage == 3 else 2) * (p - 1) / p * psi * s


def test_zero_comm_bytes():
    md.labs.check_zero_comm_bytes(comm_good)
    for wrong, match in [
        (lambda psi, p, stage, s: (3 if stage else 2) * (p - 1) / p * psi * s, "same bytes as DP|those of DP"),
        (lambda psi, p, stage, s: 2 * (p - 1) / p * psi * s, "gathers each layer's weights twice"),
        (lambda psi, p, stage, s: comm_good(psi, p, stage, s) * p / (p - 1), "\\(p-1\\)/p of the buffer"),
        (lambda psi, p, stage, s: comm_good(psi, p, stage, 1), "by s bytes"),
    ]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_zero_comm_bytes(wrong)


def test_zero3_forward_accepts_the_walk_and_names_each_usual_mistake():
    from functools import partial

    from minidist.labs.zero_checks import _zero3_forward

    md.labs.check_zero3_forward(_zero3_forward)
    with pytest.raises(CheckFailed, match="one communication stream"):
        md.labs.check_zero3_forward(partial(_zero3_forward, serial=False))
    with pytest.raises(CheckFailed, match="window of prefetch"):
        md.labs.check_zero3_forward(partial(_zero3_forward, window=False))
    with pytest.raises(CheckFailed, match="every gather waited for in full"):
        md.labs.check_zero3_forward(lambda c, g, k: sum(c) + sum(g))
    with pytest.raises(CheckFailed, match="window"):
        md.labs.check_zero3_forward(lambda c, g, k: _zero3_forward(c, g, k + 1))  # too deep a window
