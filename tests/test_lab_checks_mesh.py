"""Lab 15's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def groups_right(shape, axis):
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    return np.moveaxis(ranks, axis, -1).reshape(-1, shape[axis]).tolist()


def test_mesh_groups_accepts_slices_and_names_the_usual_mistakes(capsys):
    md.labs.check_mesh_groups(groups_right)
    assert "ok: mesh_groups" in capsys.readouterr().out

    def by_own_coordinate(shape, axis):  # groups of ranks that share the coordinate *along* the axis
        ranks = np.arange(int(np.prod(shape))).reshape(shape)
        return [np.take(ranks, i, axis=axis).reshape(-1).tolist() for i in range(shape[axis])]

    with pytest.raises(CheckFailed, match="grouped by the coordinate along the axis"):
        md.labs.check_mesh_groups(by_own_coordinate)

    def contiguous(shape, axis):  # blocks of consecutive ranks: right only for the last axis
        n = int(np.prod(shape))
        return np.arange(n).reshape(-1, shape[axis]).tolist()

    with pytest.raises(CheckFailed, match="differ only in their coordinate along the axis"):
        md.labs.check_mesh_groups(contiguous)


def test_axis_of_accepts_coordinates_and_rejects_two_axis_pairs():
    def right(a, b, shape, names):
        d = [n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y]
        return d[0] if len(d) == 1 else None

    md.labs.check_axis_of(right)

    def first_difference(a, b, shape, names):
        d = [n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y]
        return d[0] if d else None

    with pytest.raises(CheckFailed, match="differ on two axes"):
        md.labs.check_axis_of(first_difference)

    def column_major(a, b, shape, names):
        return right(a, b, shape[::-1], names[::-1])

    with pytest.raises(CheckFailed, match="unravel_index"):
        md.labs.check_axis_of(column_major)


def _redistribute(local, src, dst, free_copy=False):
    p, r = md.dist.get_world_size(), md.dist.get_rank()
    if src == "R":
        if free_copy:
            return np.array_split(local, p, axis=int(dst[1]))[r].copy()
        pieces = [np.empty_like(local) for _ in range(p)]
        md.dist.all_gather(pieces, local)  # needless traffic
        return np.array_split(local, p, axis=int(dst[1]))[r].copy()
    if src[0] == "S" and dst[0] == "S" and free_copy:
        return _swap_by_all_to_all(local, int(src[1]), int(dst[1]))
    pieces = [np.empty_like(local) for _ in range(p)]
    md.dist.all_gather(pieces, np.ascontiguousarray(local))
    full = np.concatenate(pieces, axis=int(src[1]))
    return full if dst == "R" else np.array_split(full, p, axis=int(dst[1]))[r].copy()


def _swap_by_all_to_all(local, old, new):
    # chunks flattened into one buffer in destination order; the check's tensor splits evenly
    p = md.dist.get_world_size()
    chunks = np.array_split(local, p, axis=new)
    send = np.concatenate([c.reshape(-1) for c in chunks])
    out = np.empty_like(send)
    md.dist.all_to_all_single(out, send)
    return np.concatenate([b.reshape(chunks[0].shape) for b in np.split(out, p)], axis=old)


def test_redistribute_checks_the_pieces_and_that_replicate_to_shard_is_free():
    md.labs.check_redistribute(lambda local, src, dst: _redistribute(local, src, dst, free_copy=True))
    with pytest.raises(CheckFailed, match="R -> S0 on 2 ranks communicated"):
        md.labs.check_redistribute(_redistribute)

    def rows_for_columns(local, src, dst):
        out = _redistribute(local, src, dst, free_copy=True)
        if dst == "S1" and src == "R":
            p, r = md.dist.get_world_size(), md.dist.get_rank()
            return np.array_split(local, p, axis=0)[r].copy()
        return out

    with pytest.raises(CheckFailed, match="keeps columns"):
        md.labs.check_redistribute(rows_for_columns)


def test_redistribute_rejects_shard_to_shard_by_all_gather():
    def gather_then_slice(local, src, dst):  # right pieces, but every rank receives the whole tensor
        return _redistribute(local, src, dst, free_copy=src == "R")

    with pytest.raises(CheckFailed, match=r"S0 -> S1 on 2 ranks moved 1,536 bytes .* one all-to-all of this "
                                          r"1,536-byte tensor moves 768"):
        md.labs.check_redistribute(gather_then_slice)


def test_redistribute_rejects_an_all_reduce_of_zero_padded_pieces():
    def padded_sum(local, src, dst):
        if src == "R" or (src[0] == "S" and dst[0] == "S"):
            return _redistribute(local, src, dst, free_copy=True)
        p, r, axis = md.dist.get_world_size(), md.dist.get_rank(), int(src[1])
        shape = list(local.shape)
        shape[axis] *= p
        buf = np.zeros(shape)
        index = [slice(None), slice(None)]
        index[axis] = slice(r * local.shape[axis], (r + 1) * local.shape[axis])
        buf[tuple(index)] = local
        md.dist.all_reduce(buf)
        return buf

    with pytest.raises(CheckFailed, match="one all-gather of this 1,536-byte tensor"):
        md.labs.check_redistribute(padded_sum)


def test_redistribute_says_which_values_differ_when_the_shape_is_right():
    def reversed_join(local, src, dst):
        out = _redistribute(local, src, dst, free_copy=True)
        if src[0] == "S" and dst[0] == "S":
            parts = np.array_split(out, md.dist.get_world_size(), axis=int(src[1]))
            return np.concatenate(parts[::-1], axis=int(src[1]))
        return out

    with pytest.raises(CheckFailed, match=r"right shape \(8, 12\), wrong values: row 0 is \[96\.5"):
        md.labs.check_redistribute(reversed_join)


def test_state_per_gpu_knows_what_each_axis_divides():
    def right(psi, tp, pp, dp, zero1):
        local = psi / (tp * pp)
        return (4 * local + 12 * local / (dp if zero1 else 1)) / 1e9

    md.labs.check_state_per_gpu(right)
    with pytest.raises(CheckFailed, match="ZeRO-1 shards the 12 optimizer bytes"):
        md.labs.check_state_per_gpu(lambda psi, tp, pp, dp, zero1: right(psi, tp, pp, dp, False))
    with pytest.raises(CheckFailed, match="replicates the weights and gradients"):
        md.labs.check_state_per_gpu(lambda psi, tp, pp, dp, zero1: 16 * psi / (tp * pp * dp) / 1e9)


def test_axes_between_wants_every_axis_in_mesh_order():
    def right(a, b, shape, names):
        return tuple(n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y)

    md.labs.check_axes_between(right)
    with pytest.raises(CheckFailed, match="mesh order"):
        md.labs.check_axes_between(lambda a, b, shape, names: tuple(reversed(right(a, b, shape, names))))
    with pytest.raises(CheckFailed, match="unravel_index"):
        md.labs.check_axes_between(lambda a, b, shape, names: right(a, b, shape, names)[:1])


def test_axes_between_wants_a_tuple_because_the_lab_uses_it_as_a_dict_key():
    def right(a, b, shape, names):
        return tuple(n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y)

    with pytest.raises(CheckFailed, match="return a tuple"):
        md.labs.check_axes_between(lambda a, b, shape, names: list(right(a, b, shape, names)))
    with pytest.raises(CheckFailed, match="unravel_index"):  # wrong values are reported before the type
        md.labs.check_axes_between(lambda a, b, shape, names: list(right(a, b, shape, names)) + ["pp"])


def test_params_per_gpu_knows_ep_splits_only_the_experts():
    md.labs.check_params_per_gpu(lambda nd, ne, tp, pp, ep: nd / (tp * pp) + ne / (tp * pp * ep))
    with pytest.raises(CheckFailed, match="dense weights are replicated over the ep ranks"):
        md.labs.check_params_per_gpu(lambda nd, ne, tp, pp, ep: (nd + ne) / (tp * pp * ep))
    with pytest.raises(CheckFailed, match="1/ep of the experts"):
        md.labs.check_params_per_gpu(lambda nd, ne, tp, pp, ep: (nd + ne) / (tp * pp))


def test_mesh_groups_of_the_wrong_type_are_named_before_the_cells_below_trip_on_them():
    for wrong, got in ((lambda s, a: [np.array(g) for g in groups_right(s, a)], "list of ndarray of int64"),
                       (lambda s, a: [tuple(g) for g in groups_right(s, a)], "list of tuple of int"),
                       (lambda s, a: [[np.int64(r) for r in g] for g in groups_right(s, a)], "list of list of int64")):
        with pytest.raises(CheckFailed, match=rf"the right groups, as the wrong type(.|\n)*{got}(.|\n)*\.tolist\(\)"):
            md.labs.check_mesh_groups(wrong)
