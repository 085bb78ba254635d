"""Lab 01's checks reject the plausible wrong answers, not only the obviously wrong ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs.check import CheckFailed


def test_accumulation_steps_function_accepts_the_ceiling(capsys):
    md.labs.check_accumulation_steps(lambda compute, comm: math.ceil(comm / compute))
    md.labs.check_accumulation_steps(lambda compute, comm: int(np.ceil(comm / compute)))
    assert "ok: accumulation_steps" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, match", [
    (lambda compute, comm: int(comm // compute), "round comm / compute up"),  # floor: right only for 200 / 100
    (lambda compute, comm: round(comm / compute), "still longer"),
    (lambda compute, comm: int(comm / compute) + 1, "not the smallest"),
    (lambda compute, comm: comm / compute, "whole number"),
    (lambda compute, comm: 2, "still longer"),  # the lab's one case, hard-coded
])
def test_accumulation_steps_function_rejects_floor_round_and_off_by_one(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        md.labs.check_accumulation_steps(wrong)


def test_accumulation_steps_stub_is_reported_as_not_done():
    def stub(compute, comm):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_accumulation_steps(stub)


def test_accumulation_steps_still_judges_a_single_value():
    md.labs.check_accumulation_steps(3, compute_ms=100, comm_ms=250)
    with pytest.raises(CheckFailed, match="round comm / compute up"):
        md.labs.check_accumulation_steps(2, compute_ms=100, comm_ms=250)


@pytest.mark.parametrize("wrong, match", [
    (lambda psi, b, p, s: 6 * psi * b / (2 * psi * s), "divide the FLOPs by P"),
    (lambda psi, b, p, s: 2 * psi * b / p / (2 * psi * s), "6 Psi FLOPs per token"),
    (lambda psi, b, p, s: 6 * psi * b / p / (2 * (p - 1) / p * psi * s), "large-P ring volume"),
    (lambda psi, b, p, s: 6 * psi * b / p / (2 * psi), "2 Psi s bytes"),
])
def test_dp_network_intensity_names_the_slip(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        md.labs.check_dp_network_intensity(wrong)
    md.labs.check_dp_network_intensity(lambda psi, b, p, s: 3 * b / (p * s))


def test_tiled_intensity_check_accepts_the_blocks_and_names_each_slip():
    from functools import partial

    from minidist.labs.roofline_checks import _tiled

    md.labs.check_tiled_intensity(_tiled)
    with pytest.raises(CheckFailed, match="C is written once|written too"):
        md.labs.check_tiled_intensity(partial(_tiled, output=False))
    with pytest.raises(CheckFailed, match="the last blocks are smaller"):
        md.labs.check_tiled_intensity(partial(_tiled, edges=False))
    with pytest.raises(CheckFailed, match="untiled ideal"):
        md.labs.check_tiled_intensity(lambda m, n, k, t, b: 2 * m * n * k / (b * (m * k + k * n + m * n)))
