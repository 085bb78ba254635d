"""The hints the checks give for the slips learners make most: units, types, a forgotten factor, a rounded answer.

Each case is a learner's plausible wrong answer (found by walking the labs as a learner); the check must name the
slip, not a generic formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.check import attempt, check_cases, number, numbers_of


def _says(check, *args, match: str) -> None:
    with pytest.raises(CheckFailed, match=match):
        check(*args)


def test_a_power_of_a_thousand_is_named_as_a_unit():
    with pytest.raises(CheckFailed, match="off by a factor of 1e\\+06: check the units"):
        check_cases("send_time", lambda n: n / 1e9 * 1e6, [((1e6,), 1e-3, "n / beta")])


def test_a_list_or_none_where_a_number_belongs_is_named():
    with pytest.raises(CheckFailed, match="give one number"):
        check_cases("f", lambda n: [n], [((1.0,), 1.0, "")])
    with pytest.raises(CheckFailed, match="forget to `return`"):
        check_cases("f", lambda n: None, [((1.0,), 1.0, "")])
    assert number("x", np.float32(2.5)) == 2.5 and number("x", np.array(3)) == 3.0
    with pytest.raises(CheckFailed, match=r"3 numbers: \(a, b, c\)(.|\n)*return the tuple \(a, b, c\)"):
        numbers_of("f", 1.0, ("a", "b", "c"))


def test_a_none_argument_that_crashes_the_learners_code_is_named():
    def attainable(peak, bw, i, net_bw=None, i_net=None):
        return min(peak, bw * i, net_bw * i_net)

    with pytest.raises(CheckFailed, match="a value is None here: an optional argument"):
        attempt("attainable", attainable, 1.0, 1.0, 1.0, None, None)
    with pytest.raises(CheckFailed, match="a value is None here: an optional argument"):
        md.labs.check_attainable(attainable)


def test_alpha_beta_in_microseconds_and_gigabytes_per_second():
    from minidist.labs.alpha_beta_checks import reference_fit

    def in_us(sizes, times):
        a, b = reference_fit(sizes, times)
        return a * 1e6, b / 1e9

    _says(md.labs.check_fit_alpha_beta, in_us, match="return SI units")


def test_noise_scale_upside_down():
    def upside_down(bs, ss, bb, sb):
        tr = (ss - sb) / (1 / bs - 1 / bb)
        g2 = ss - tr / bs
        return g2, tr, g2 / tr

    _says(md.labs.check_noise_scale, upside_down, match="yours is upside down")


def test_accumulation_steps_without_a_return():
    _says(md.labs.check_accumulation_steps, lambda c, m: None, match="forget to `return`")


def test_dp_thresholds_name_the_backward_only_form_and_milliseconds():
    _says(md.labs.check_dp_min_tokens, lambda f, b, s: f * s / (2 * b), match="the backward alone")
    from minidist.estimate import collective_time

    _says(md.labs.check_bucketed_time,
          lambda n, k, p, a, b: 1e3 * k * collective_time("all_reduce", n / k, p, a, b, "ring"),
          match="return seconds, not milliseconds")


def test_layer_bytes_without_dtype_bytes():
    def no_dtype(b, s, h, t, d):
        return 4 * 2 * (t - 1) / t * b * s * h

    _says(md.labs.check_tp_layer_bytes, no_dtype, match="multiply by dtype_bytes")


def test_min_gpus_of_zero_when_one_is_enough():
    from minidist.labs.zero_checks import _ref_min_gpus

    def zero_for_one(psi, stage, hbm):
        want = _ref_min_gpus(psi, stage, hbm)
        return 0 if want == 1 else want

    _says(md.labs.check_min_gpus, zero_for_one, match="when one GPU is enough, the answer is 1")


def test_best_interval_takes_a_numpy_integer(capsys):
    from minidist.labs.recompute_checks import _ref_bytes

    def best(L, m, b):
        return np.argmin([_ref_bytes(L, k, m, b) for k in range(1, L + 1)]) + 1  # np.int64

    md.labs.check_best_interval(best)
    assert "ok: best_interval" in capsys.readouterr().out


def test_overlap_tokens_rounded_up_is_told_to_stay_real():
    _says(md.labs.check_overlap_tokens, lambda f, b: math.ceil(f / b), match="the threshold itself, a real number")


def test_sandbox_mfu_typed_in_rounded():
    args = dict(n_params=1e6, tokens=1000, seconds=1.0, peak=1.2e10)
    want = 6e9 / 1.2e10
    with pytest.raises(CheckFailed, match="close, but rounded"):
        md.labs.check_sandbox_mfu(round(want * 1.005, 3), **args)
    with pytest.raises(CheckFailed, match="not in percent"):
        md.labs.check_sandbox_mfu(round(100 * want, 2), **args)
    with pytest.raises(CheckFailed, match="sandbox_mfu is one number"):
        md.labs.check_sandbox_mfu([want], **args)


def test_run_estimate_returning_one_number_is_told_the_tuple():
    _says(md.labs.check_run_estimate, lambda *a: 1.0,
          match=r"return the tuple \(step seconds, tokens per second, days, dollars\)")


def test_megatron_mlp_of_the_wrong_shape_says_shape():
    def wide(x, w1, b1, w2, b2):
        return np.zeros((x.shape[0], 2 * w2.shape[1]))

    _says(md.labs.check_megatron_mlp, wide, match="result has the wrong shape")


def _both_send_first():
    x = np.ones(4)
    md.dist.send(x, 1 - md.dist.get_rank())
    md.dist.recv(x, 1 - md.dist.get_rank())


def _assigns_the_all_reduce():
    y = md.dist.all_reduce(np.ones(3))
    return y * 2


def test_rank_failures_name_a_deadlock_an_assigned_collective_and_the_learners_line():
    from minidist.labs.ranks import DEADLOCK_HINT, run_ranks

    with pytest.raises(CheckFailed, match="never finished") as info:
        run_ranks("shift", _both_send_first, 2, timeout=10)
    assert DEADLOCK_HINT in str(info.value)  # a DeadlockError, long before the timeout
    with pytest.raises(CheckFailed, match="they work in place and return None") as info:
        run_ranks("shift", _assigns_the_all_reduce, 1)
    text = str(info.value)
    assert "shift on 1 rank: rank 0 raised TypeError" in text
    assert "where your code raised it, on rank 0:" in text and "return y * 2" in text
    assert "minidist/runtime" not in text
