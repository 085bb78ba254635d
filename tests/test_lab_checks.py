"""Every lab check accepts the right answer and rejects the typical wrong ones with a useful hint."""

import pytest

import minidist as md
from minidist.labs import CheckFailed


def _rejects(check, answer, *args, match=None, **kwargs):
    with pytest.raises(CheckFailed, match=match):
        check(answer, *args, **kwargs)


# --- lab 01: the extended roofline ---------------------------------------------------------------

def good_intensity(m, n, k, b):
    return 2 * m * n * k / (b * (m * k + k * n + m * n))


def test_matmul_intensity_accepts_and_rejects(capsys):
    md.labs.check_matmul_intensity(good_intensity)
    assert "ok" in capsys.readouterr().out
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: m * n * k / (b * (m * k + k * n + m * n)),
             match="factor of 2")
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: 2 * m * n * k / (m * k + k * n + m * n),
             match="per \\*byte\\*")
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: 2 * m * n * k / (b * (m * k + k * n)))
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: None, match="return")


def test_unfinished_exercise_is_named():
    def todo(*args):
        raise NotImplementedError

    _rejects(md.labs.check_matmul_intensity, todo, match="not done yet")


def test_attainable_accepts_and_rejects():
    def good(peak, bw, i, net_bw=None, i_net=None):
        b = min(peak, bw * i)
        return b if net_bw is None else min(b, net_bw * i_net)

    md.labs.check_attainable(good)
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw=None, i_net=None: max(peak, bw * i))
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw=None, i_net=None: min(peak, bw * i),
             match="network")
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw, i_net: min(peak, bw * i, net_bw * i_net))


def test_dp_network_intensity():
    md.labs.check_dp_network_intensity(lambda psi, b, p, s: 3 * b / (p * s))
    _rejects(md.labs.check_dp_network_intensity, lambda psi, b, p, s: 6 * b / (p * s))
    _rejects(md.labs.check_dp_network_intensity, lambda psi, b, p, s: 3 * b / p)


def test_accumulation_steps():
    md.labs.check_accumulation_steps(2, compute_ms=100, comm_ms=200)
    _rejects(md.labs.check_accumulation_steps, 1, compute_ms=100, comm_ms=200, match="still longer")
    _rejects(md.labs.check_accumulation_steps, 3, compute_ms=100, comm_ms=200, match="smallest")
    _rejects(md.labs.check_accumulation_steps, 1.5, compute_ms=100, comm_ms=200, match="whole")
