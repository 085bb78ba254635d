"""Lab 09 checks accept the right answers and reject the usual mistakes with the intended hint."""

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs.check import CheckFailed
from minidist.labs.tensor_checks import (
    check_column_parallel,
    check_megatron_mlp,
    check_row_parallel,
    check_tp_layer_bytes,
    check_tp_layer_time,
    gelu,
)


def _block(n, p, r):
    k = n // p
    return slice(r * k, (r + 1) * k)


def column_ok(x, w, b):
    c = _block(w.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return x @ w[:, c] + b[c]


def column_dense(x, w, b):
    return x @ w + b


def column_no_bias(x, w, b):
    c = _block(w.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return x @ w[:, c]


def column_slices_after(x, w, b):  # right numbers, all of the work
    c = _block(w.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return (x @ w + b)[:, c]


def column_np_dot_after(x, w, b):
    c = _block(w.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return np.dot(x, w)[:, c] + b[c]


def column_np_dot_ok(x, w, b):
    c = _block(w.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return np.dot(x, w[:, c]) + b[c]


def column_split_ok(x, w, b):  # np.split and np.concatenate on the counted weights work as on plain arrays
    p, r = md.dist.get_world_size(), md.dist.get_rank()
    c = _block(w.shape[1], p, r)
    halves = [w[:, c][:, :1], w[:, c][:, 1:]]  # slices of the weights: still counted, inside a list
    return x @ np.concatenate(halves, axis=1) + np.split(b, p)[r]


def column_gathers(x, w, b):
    y = column_ok(x, w, b)
    out = np.empty((md.dist.get_world_size(),) + y.shape)
    md.dist.all_gather_into_tensor(out, np.ascontiguousarray(y))
    return y


def row_ok(xb, w, b):
    rows = _block(w.shape[0], md.dist.get_world_size(), md.dist.get_rank())
    y = xb @ w[rows]
    md.dist.all_reduce(y)
    return y + b


def row_bias_everywhere(xb, w, b):
    rows = _block(w.shape[0], md.dist.get_world_size(), md.dist.get_rank())
    y = xb @ w[rows] + b
    md.dist.all_reduce(y)
    return y


def row_no_reduce(xb, w, b):
    rows = _block(w.shape[0], md.dist.get_world_size(), md.dist.get_rank())
    return xb @ w[rows] + b


def row_two_reduces(xb, w, b):
    y = row_ok(xb, w, b)
    md.dist.all_reduce(np.zeros(1))
    return y


def mlp_ok(x, w1, b1, w2, b2):
    h = gelu(column_ok(x, w1, b1))
    return row_ok(h, w2, b2)


def mlp_gathered(x, w1, b1, w2, b2):  # right numbers, an extra all-gather of the hidden activations
    p = md.dist.get_world_size()
    h = gelu(column_ok(x, w1, b1))
    full = np.empty((p,) + h.shape)
    md.dist.all_gather_into_tensor(full, np.ascontiguousarray(h))
    hidden = np.concatenate(list(full), axis=1)
    rows = _block(w2.shape[0], p, md.dist.get_rank())
    return row_ok(hidden[:, rows], w2, b2)


def mlp_dense_first_layer(x, w1, b1, w2, b2):  # right numbers: the first layer computed whole, then sliced
    c = _block(w1.shape[1], md.dist.get_world_size(), md.dist.get_rank())
    return row_ok(gelu(x @ w1 + b1)[:, c], w2, b2)


def mlp_bias_everywhere(x, w1, b1, w2, b2):
    return row_bias_everywhere(gelu(column_ok(x, w1, b1)), w2, b2)


def test_column_parallel(capsys):
    check_column_parallel(column_ok)
    assert capsys.readouterr().out.startswith("ok: column_parallel_linear")
    for wrong, hint in [(column_dense, "that is the dense layer"), (column_no_bias, "forgot the bias"),
                        (column_gathers, "no communication is needed"), (column_slices_after, "Slice W first"),
                        (column_np_dot_after, "Slice W first")]:
        with pytest.raises(CheckFailed, match=hint):
            check_column_parallel(wrong)
    check_column_parallel(column_np_dot_ok)
    check_column_parallel(column_split_ok)


def test_row_parallel(capsys):
    check_row_parallel(row_ok)
    assert capsys.readouterr().out.startswith("ok: row_parallel_linear")
    for wrong, hint in [(row_bias_everywhere, "add b once, after the all-reduce"),
                        (row_no_reduce, "only its partial sum"), (row_two_reduces, "number of all-reduces")]:
        with pytest.raises(CheckFailed, match=hint):
            check_row_parallel(wrong)


def test_megatron_mlp(capsys):
    check_megatron_mlp(mlp_ok)
    assert capsys.readouterr().out.startswith("ok: megatron_mlp")
    with pytest.raises(CheckFailed, match="need not be gathered"):
        check_megatron_mlp(mlp_gathered)
    with pytest.raises(CheckFailed, match="second bias was added on every rank"):
        check_megatron_mlp(mlp_bias_everywhere)
    with pytest.raises(CheckFailed, match="p times the work"):
        check_megatron_mlp(mlp_dense_first_layer)


def test_not_done_yet():
    def todo(x, w, b):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="not done yet"):
        check_column_parallel(todo)


def test_layer_formulas(capsys):
    check_tp_layer_bytes(lambda b, s, h, t, d: 4 * 2 * (t - 1) / t * b * s * h * d)
    check_tp_layer_time(lambda b, s, h, t, a, beta, d: 4 * (2 * (t - 1) * a + 2 * (t - 1) / t * b * s * h * d / beta))
    assert capsys.readouterr().out.count("ok:") == 2
    # the formula agrees with md.estimate's closed form
    assert math.isclose(4 * 2 * 7 / 8 * 4096 * 8192 * 2, md.estimate.tp_comm_bytes(1, 4096, 8192, 1, 8))
    with pytest.raises(CheckFailed, match="forward only"):
        check_tp_layer_bytes(lambda b, s, h, t, d: 2 * 2 * (t - 1) / t * b * s * h * d)
    with pytest.raises(CheckFailed, match="not n or 2n"):
        check_tp_layer_bytes(lambda b, s, h, t, d: 4 * b * s * h * d)
    with pytest.raises(CheckFailed, match="left out the latency"):
        check_tp_layer_time(lambda b, s, h, t, a, beta, d: 4 * 2 * (t - 1) / t * b * s * h * d / beta)


def _sp_mlp(bias_before_sum=False, all_reduce=False):
    from minidist.labs.tensor_checks import gelu

    def fn(x_shard, w1, b1, w2, b2):
        r, p = md.dist.get_rank(), md.dist.get_world_size()
        x = np.empty((p * x_shard.shape[0], x_shard.shape[1]))
        md.dist.all_gather_into_tensor(x, x_shard)
        c = w1.shape[1] // p
        h = gelu(x @ w1[:, r * c:(r + 1) * c] + b1[r * c:(r + 1) * c])
        k = w2.shape[0] // p
        part = h @ w2[r * k:(r + 1) * k] + (b2 if bias_before_sum else 0)
        if all_reduce:
            md.dist.all_reduce(part)
            return part[r * x_shard.shape[0]:(r + 1) * x_shard.shape[0]] + b2
        y = np.empty((x_shard.shape[0], w2.shape[1]))
        md.dist.reduce_scatter_tensor(y, part)
        return y if bias_before_sum else y + b2
    return fn


def test_sequence_parallel_mlp_wants_an_all_gather_and_a_reduce_scatter():
    md.labs.check_sequence_parallel_mlp(_sp_mlp())
    with pytest.raises(CheckFailed, match="bias was added before the sum"):
        md.labs.check_sequence_parallel_mlp(_sp_mlp(bias_before_sum=True))
    with pytest.raises(CheckFailed, match="reduce-scatter followed by an all-gather"):
        md.labs.check_sequence_parallel_mlp(_sp_mlp(all_reduce=True))
