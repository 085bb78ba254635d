"""Lab 05 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed

SUM, MAX, MIN, PRODUCT = md.ReduceOp.SUM, md.ReduceOp.MAX, md.ReduceOp.MIN, md.ReduceOp.PRODUCT


def identity_good(op, dtype):
    big = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    small = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    return {SUM: 0, PRODUCT: 1, MAX: small, MIN: big}[op]


def test_identity_accepts_and_rejects(capsys):
    md.labs.check_identity(identity_good)
    md.labs.check_identity(lambda op, dtype: op.identity(dtype))
    assert capsys.readouterr().out.count("ok: identity") == 2
    with pytest.raises(CheckFailed, match=r"identity\(ReduceOp.PRODUCT, float32\) = 0"):
        md.labs.check_identity(lambda op, dtype: 0 if op in (SUM, PRODUCT) else identity_good(op, dtype))
    with pytest.raises(CheckFailed, match="beyond np.finfo"):
        md.labs.check_identity(lambda op, dtype: (np.finfo(dtype).min if op is MAX else np.finfo(dtype).max)
                               if op in (MAX, MIN) and dtype.kind == "f" else identity_good(op, dtype))
    with pytest.raises(CheckFailed, match="no infinity"):
        md.labs.check_identity(lambda op, dtype: {SUM: 0, PRODUCT: 1, MAX: -np.inf, MIN: np.inf}[op])
    with pytest.raises(CheckFailed, match="below every value"):
        md.labs.check_identity(lambda op, dtype: 0 if op is MAX else identity_good(op, dtype))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_identity(lambda op, dtype: (_ for _ in ()).throw(NotImplementedError))


def _pad(x, p):
    n = x.size
    m = -(-n // p) * p
    buf = np.zeros(m, x.dtype)
    buf[:n] = x
    return buf, m // p


def rs_ag_good(x, op):
    p = md.dist.get_world_size()
    buf, c = _pad(x, p)
    mine = np.empty(c, x.dtype)
    md.dist.reduce_scatter_tensor(mine, buf, op=op)
    md.dist.all_gather_into_tensor(buf, mine)
    x[...] = buf[:x.size]


def rs_ag_returns(x, op):
    y = x.copy()
    rs_ag_good(y, op)
    return y


def rs_only(x, op):
    p, r = md.dist.get_world_size(), md.dist.get_rank()
    buf, c = _pad(x, p)
    mine = np.empty(c, x.dtype)
    md.dist.reduce_scatter_tensor(mine, buf, op=op)
    gathered = np.zeros_like(buf)
    md.dist.all_gather_into_tensor(gathered, buf[r * c:(r + 1) * c].copy())  # gathers the unreduced input
    buf[r * c:(r + 1) * c] = mine
    x[...] = buf[:x.size]


def rs_ag_no_padding(x, op):
    p = md.dist.get_world_size()
    mine = np.empty(x.size // p, x.dtype)
    md.dist.reduce_scatter_tensor(mine, x, op=op)
    md.dist.all_gather_into_tensor(x, mine)


def just_all_reduce(x, op):
    md.dist.all_reduce(x, op=op)


def rs_ag_always_sum(x, op):
    rs_ag_good(x, SUM)


def test_all_reduce_rs_ag_accepts(capsys):
    md.labs.check_all_reduce_rs_ag(rs_ag_good)
    assert "ok: all_reduce_rs_ag matches all_reduce on 2, 3, 4 ranks" in capsys.readouterr().out


def test_all_reduce_rs_ag_rejects_with_rank_and_hint():
    with pytest.raises(CheckFailed, match="x is unchanged: write it into x in place"):
        md.labs.check_all_reduce_rs_ag(rs_ag_returns)
    with pytest.raises(CheckFailed, match=r"rank 1: first wrong element(.|\n)*only this rank's own chunk is right"):
        md.labs.check_all_reduce_rs_ag(rs_only)
    with pytest.raises(CheckFailed, match="pad x to a multiple of p"):
        md.labs.check_all_reduce_rs_ag(rs_ag_no_padding)
    with pytest.raises(CheckFailed, match="called md.dist.all_reduce"):
        md.labs.check_all_reduce_rs_ag(just_all_reduce)
    with pytest.raises(CheckFailed, match="for n=12, op=MAX on 2 ranks: wrong on 2 of 2 ranks"):
        md.labs.check_all_reduce_rs_ag(rs_ag_always_sum)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_all_reduce_rs_ag(lambda x, op: (_ for _ in ()).throw(NotImplementedError))


def rs_ag_gathers_whole_inputs(x, op):
    """Right values, but it all-gathers every rank's whole (unreduced) input and reduces locally: p times the bytes."""
    p = md.dist.get_world_size()
    buf, c = _pad(x, p)
    mine = np.empty(c, x.dtype)
    md.dist.reduce_scatter_tensor(mine, buf.copy(), op=op)
    everything = np.empty(buf.size * p, x.dtype)
    md.dist.all_gather_into_tensor(everything, buf)
    x[...] = op.ufunc.reduce(everything.reshape(p, -1), axis=0)[:x.size]


def test_all_reduce_rs_ag_rejects_a_right_answer_that_moves_too_much(capsys):
    with pytest.raises(CheckFailed, match=r"on 2 ranks gives the right values but moves too much data(.|\n)*"
                                          r"all-gather only this rank's reduced block"):
        md.labs.check_all_reduce_rs_ag(rs_ag_gathers_whole_inputs)
    md.labs.check_all_reduce_rs_ag(rs_ag_good)  # the right one still passes the byte count
    assert "ok: all_reduce_rs_ag" in capsys.readouterr().out


def test_fp_prediction():
    md.labs.check_fp_prediction(1.0, 0.0)
    with pytest.raises(CheckFailed, match="rounds back to -1e20"):
        md.labs.check_fp_prediction(1.0, 1.0)
    with pytest.raises(CheckFailed, match="cancel exactly"):
        md.labs.check_fp_prediction(0.0, 0.0)
