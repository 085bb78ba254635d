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


def test_kernel_time_check_accepts_the_measured_device_and_names_each_slip(capsys):
    from functools import partial

    from minidist.labs.roofline_checks import _kernel_time

    md.labs.check_kernel_time(_kernel_time)
    assert "ok: _kernel_time" in capsys.readouterr().out
    slips = [({"pipeline": "sum"}, "a max, not a sum"), ({"pipeline": "gpu"}, "waits for Python"),
             ({"launch": False}, "fixed `launch`"), ({"gemm_extra": False}, "gemm_launch"),
             ({"tiles": False}, "length / \\(length \\+ gemm_inner\\)"), ({"vector": False}, "fp32\\* peak"),
             ({"long_rows": False}, "long_rows times")]
    for kw, match in slips:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_kernel_time(partial(_kernel_time, **kw))


def test_kernel_time_check_rejects_the_ideal_roofline_and_hard_coded_numbers():
    from minidist.labs.roofline_checks import _kernel_time

    def ideal(p, gpu, kind, fmt, flops, nbytes, length=0):
        return max(flops / gpu.peak(fmt), nbytes / gpu.hbm_bw)

    with pytest.raises(CheckFailed, match="ideal roofline"):
        md.labs.check_kernel_time(ideal)

    fitted = md.hardware.measured_kernels().parameters()

    def h200_only(p, gpu, kind, fmt, flops, nbytes, length=0):  # ignores the parameters it is given
        return _kernel_time(fitted, md.hardware.gpu("H200-141GB-SXM"), kind, fmt, flops, nbytes, length)

    with pytest.raises(CheckFailed, match="faster host"):
        md.labs.check_kernel_time(h200_only)

    def stub(p, gpu, kind, fmt, flops, nbytes, length=0):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_kernel_time(stub)


def test_kernel_time_reference_is_the_measured_device():
    """The check's reference equals KernelModel.seconds on every one of the 91 measured kernels."""
    from minidist.labs.roofline_checks import _kernel_time

    model, h200 = md.hardware.measured_kernels(), md.hardware.gpu("H200-141GB-SXM")
    p = model.parameters()
    for m in md.hardware.load_measurements():
        want = model.seconds(m.name, m.flops, m.nbytes, m.fmt, h200.peak(m.fmt), h200.hbm_bw, h200.peak("fp32"),
                             m.shape)
        assert _kernel_time(p, h200, m.kind, m.fmt, m.flops, m.nbytes, m.length) == pytest.approx(want, rel=1e-12)


def test_half_roofline_work_check_accepts_the_knee_and_names_each_slip(capsys):
    def right(host, launch, eff):
        if eff <= 0.5:
            return math.inf
        return max(host / 2, launch / (2 - 1 / eff))

    md.labs.check_half_roofline_work(right)
    assert "ok: right" in capsys.readouterr().out
    wrong = [(lambda h, l, e: max(h / 2, l / (2 - 1 / e)), "never reaches half"),  # no case for e <= 1/2
             (lambda h, l, e: l / (2 - 1 / e) if e > 0.5 else math.inf, "the host needs"),
             (lambda h, l, e: (h + l) / (2 - 1 / e) if e > 0.5 else math.inf, "not their sum"),
             (lambda h, l, e: max(h / 2, l) if e > 0.5 else math.inf, "t / efficiency"),
             (lambda h, l, e: max(h, l / (2 - 1 / e)) if e > 0.5 else math.inf, "twice"),
             (lambda h, l, e: max(h / 2, l / (2 - 1 / e)) * 1e6 if e > 0.5 else math.inf, "units"),
             (lambda h, l, e: None, "inf|number")]
    for fn, match in wrong:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_half_roofline_work(fn)
