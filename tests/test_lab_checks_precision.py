"""Lab 21's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.parallel import Backend, Precision


def _max(e, m, ieee):
    bias = 2 ** (e - 1) - 1
    if ieee:
        return (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)
    return (2 - 2.0 ** (1 - m)) * 2.0 ** (2**e - 1 - bias)


def test_max_finite_names_the_slips(capsys):
    md.labs.check_max_finite(_max)
    assert "ok: max_finite" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="spends S.1111.111 on NaN"):
        md.labs.check_max_finite(lambda e, m, ieee: (2 - 2.0**-m) * 2.0 ** (2**e - 1 - (2 ** (e - 1) - 1))
                                 if not ieee else _max(e, m, ieee))
    with pytest.raises(CheckFailed, match="every mantissa bit set"):
        md.labs.check_max_finite(lambda e, m, ieee: 2.0 ** (2**e - 2 - (2 ** (e - 1) - 1)))
    with pytest.raises(CheckFailed, match="reserve the all-ones exponent"):
        md.labs.check_max_finite(lambda e, m, ieee: (2 - 2.0**-m) * 2.0 ** (2**e - 1 - (2 ** (e - 1) - 1)))


def _round(x, m, emin):
    _, e = np.frexp(x)
    q = np.ldexp(1.0, np.maximum(e - 1, emin) - m)
    return np.round(x / q) * q


def test_round_to_catches_ties_and_subnormals(capsys):
    md.labs.check_round_to(_round)
    assert "ok: round_to" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="halves to even"):
        md.labs.check_round_to(lambda x, m, emin: np.floor(x / (q := np.ldexp(1.0, np.maximum(np.frexp(x)[1] - 1, emin)
                                                                                - m)) + 0.5) * q)
    with pytest.raises(CheckFailed, match="clamp the exponent"):
        md.labs.check_round_to(lambda x, m, emin: np.round(x / (q := np.ldexp(1.0, np.frexp(x)[1] - 1 - m))) * q)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_round_to(lambda *a: (_ for _ in ()).throw(NotImplementedError))


def _spacing(x, m, emin):
    return np.ldexp(1.0, np.maximum(np.frexp(x)[1] - 1, emin) - m)


def test_round_to_ignores_the_sign_of_zero_and_hints_the_first_real_slip(capsys):
    # Rounding the magnitude and putting the sign back turns -0.0 into +0.0: still right.
    md.labs.check_round_to(lambda x, m, emin: np.sign(x) * np.round(np.abs(x) / _spacing(x, m, emin))
                           * _spacing(x, m, emin))
    md.labs.check_round_to(lambda x, m, emin: np.abs(_round(x, m, emin)) * np.where(x < 0, -1.0, 1.0))
    assert capsys.readouterr().out.count("ok: round_to") == 2
    with pytest.raises(CheckFailed, match="clamp the exponent") as flushed:
        md.labs.check_round_to(lambda x, m, emin: np.where(np.abs(x) < 2.0**emin, 0.0, _round(x, m, emin)))
    assert str(flushed.value).startswith("round_to(5.96")  # the smallest subnormal, not a zero
    with pytest.raises(CheckFailed, match="halves to even") as half_up:
        md.labs.check_round_to(lambda x, m, emin: np.floor(x / _spacing(x, m, emin) + 0.5) * _spacing(x, m, emin))
    assert str(half_up.value).startswith("round_to(2.98")  # half the smallest subnormal: a real tie


def _update(scale, inf, clean, n):
    if inf:
        return scale / 2, 0, False
    return (scale * 2, 0, True) if clean + 1 == n else (scale, clean + 1, True)


def test_loss_scale_update_explains_each_branch(capsys):
    md.labs.check_loss_scale_update(_update)
    assert "ok: loss_scale_update" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="halves the scale"):
        md.labs.check_loss_scale_update(lambda s, inf, c, n: _update(s, False, c, n) if inf else _update(s, inf, c, n))
    with pytest.raises(CheckFailed, match="scale doubles"):
        md.labs.check_loss_scale_update(lambda s, inf, c, n: _update(s, inf, c, n) if inf else (s, c + 1, True))


def test_a_crash_or_a_wrong_return_is_named_with_its_call():
    crash = r"round_to\(x of shape \(\d+,\), 10, -14\) \(fp16\) raised ValueError"
    with pytest.raises(CheckFailed, match=crash) as info:
        md.labs.check_round_to(lambda x, m, e: max(e, x))
    assert isinstance(info.value.__cause__, ValueError)  # the learner's frames are shown from it
    with pytest.raises(CheckFailed, match=r"return the tuple \(scale, clean_steps, step\)"):
        md.labs.check_loss_scale_update(lambda s, inf, c, n: None)
    with pytest.raises(CheckFailed, match=r"loss_scale_update\(65536.0, False, 0, 3\) raised ZeroDivisionError"):
        md.labs.check_loss_scale_update(lambda s, inf, c, n: 1 / 0)
    md.labs.check_loss_scale_update(lambda *a: list(_update(*a)))  # a list is as good as a tuple



def _step(ops, precision, gpu, matmul_fp8=1, other_fp8=(2, "bf16"), shrink=True, master=True, combine=max):
    """The reference, with a switch for each slip a learner makes."""
    total = 0.0
    for name, flops, nbytes in ops:
        if precision == "fp32" or (master and name == "optimizer.step"):
            size, peak = 4, "fp32"
        elif name.startswith("matmul"):
            size, peak = (matmul_fp8 if precision == "fp8" else 2), precision
        else:
            size, peak = other_fp8 if precision == "fp8" else (2, precision)
        total += combine(flops / gpu.peak(peak), nbytes * (size if shrink else 4) / 4 / gpu.hbm_bw)
    return total


def test_step_time_names_what_each_slip_leaves_out(capsys):
    md.labs.check_step_time(_step)
    assert "ok: step_time" in capsys.readouterr().out
    slips = {"a memory-bound op gains as much": dict(shrink=False),  # the old clock: the peak, fp32's bytes
             "fp32 master copy": dict(master=False),
             "the other ops stay in bf16": dict(other_fp8=(1, "fp8")),
             "1-byte operands": dict(matmul_fp8=2),
             "the slower of the two": dict(combine=lambda a, b: a + b)}
    for hint, kw in slips.items():
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_step_time(lambda ops, p, g, kw=kw: _step(ops, p, g, **kw))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_step_time(lambda *a: (_ for _ in ()).throw(NotImplementedError))


def _measured(kernels, precision, gpu, km):
    issued = clock = 0.0
    for op, kind, flops, nbytes, inner in kernels:
        if precision == "fp32" or op == "optimizer.step":
            size, fmt = 4, "fp32"
        elif op.startswith("matmul"):
            size, fmt = (1 if precision == "fp8" else 2), precision
        else:
            size, fmt = 2, ("bf16" if precision == "fp8" else precision)
        eff = km.gemm_efficiency["fp32" if fmt == "fp32" else "bf16"]
        moved = nbytes * size / 4 / (km.bandwidth[kind] * gpu.hbm_bw)
        if kind == "gemm":
            gpu_s = km.launch + km.gemm_launch + max(flops / (eff * inner / (inner + km.gemm_inner) * gpu.peak(fmt)),
                                                     moved)
        elif kind in km.vector:
            gpu_s = km.launch + max(flops / (km.vector[kind] * gpu.peak("fp32")), moved)
        else:
            gpu_s = km.launch + max(flops / (eff * gpu.peak(fmt)), moved)
        issued += km.host[kind]
        clock = max(clock, issued) + gpu_s
    return clock


def test_measured_step_time_names_each_idea_of_the_measured_device(capsys):
    md.labs.check_measured_step_time(_measured)
    assert "ok: measured_step_time" in capsys.readouterr().out
    slips = {
        "no fixed cost": ("km.launch on the GPU", lambda k, p, g, km: _measured(k, p, g, replace(
            km, launch=0.0, gemm_launch=0.0))),
        "no host": ("cannot start a kernel before the host", lambda k, p, g, km: _measured(k, p, g, replace(
            km, host={x: 0.0 for x in km.host}))),
        "vector at the format's peak": ("vector units", lambda k, p, g, km: _measured(k, p, g, replace(
            km, vector={}))),
        "no tile loss": ("inner length", lambda k, p, g, km: _measured(k, p, g, replace(km, gemm_inner=0.0))),
        "full bandwidth": ("of the HBM bandwidth", lambda k, p, g, km: _measured(k, p, g, replace(
            km, bandwidth={x: 1.0 for x in km.bandwidth}))),
        "optimizer in bf16": ("master copy", lambda k, p, g, km: _measured(
            [(("adam" if op == "optimizer.step" else op), *rest) for op, *rest in k], p, g, km)),
        "microseconds": ("seconds, not microseconds", lambda k, p, g, km: 1e6 * _measured(k, p, g, km)),
    }
    for message, fn in slips.values():
        with pytest.raises(CheckFailed, match=message):
            md.labs.check_measured_step_time(fn)
    with pytest.raises(CheckFailed, match="borrow bf16's fraction"):
        md.labs.check_measured_step_time(lambda k, p, g, km: km.gemm_efficiency[p])
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_measured_step_time(lambda *a: (_ for _ in ()).throw(NotImplementedError))


def test_the_measured_step_reference_is_the_simulators_step():
    """The check grades against what ``train`` measures on a measured device: every kernel listed as it is priced."""
    from minidist.hardware.kernels import split
    from minidist.labs.precision_checks import _measured_step
    from minidist.parallel import train

    km, listed = md.hardware.measured_kernels(), []

    class Listing(md.hardware.KernelModel):
        def kernels(self, name, flops, nbytes, fmt, peak, hbm_bw, fp32_peak, shape=()):
            if fmt == "fp32" and (flops or nbytes):
                listed.extend((name, kind, f, b, n if kind == "gemm" else 0)
                              for kind, f, b, n in split(name, flops, nbytes, shape))
            return super().kernels(name, flops, nbytes, fmt, peak, hbm_bw, fp32_peak, shape)

    cluster = md.Cluster("H200-141GB-SXM", kernels=Listing(**vars(km)))
    cfg = md.GPTConfig(vocab_size=64, seq_len=64, d_model=256, n_layers=1, n_heads=4)
    kernels = None
    for precision in (None, "bf16", "fp8"):  # the fp32 run first: its kernels are the list graded
        run = train(cfg, steps=1, global_batch=16, dtype="float32", backend=Backend("inprocess", shape_only=True),
                    precision=Precision(precision), cluster=cluster)
        kernels = kernels or list(listed)
        want = _measured_step(kernels, precision or "fp32", cluster.gpu, km)
        assert run.time[-1] == pytest.approx(want, rel=1e-12)
