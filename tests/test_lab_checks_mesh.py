"""Labs 15 and 16's checks accept the right answers and explain the usual wrong ones."""

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

    with pytest.raises(CheckFailed, match="differ in the last"):
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


def _axis_bytes(h, s, b, L, t, p, d, m, psi, backward=True, ring=True, stage_layers=True, both_ways=True,
                local_grads=True):
    act = 2 * b * s * h
    layers = L // p if stage_layers else L
    share = (t - 1) / t if ring else 1
    tp = (4 if backward else 2) * layers * m * 2 * share * act
    pp = (2 if both_ways else 1) * m * act if p > 1 else 0.0
    dp = 2 * (d - 1) / d * 2 * psi / ((t * p) if local_grads else 1)
    return {"tp": tp, "pp": pp, "dp": dp}


def test_axis_bytes_accepts_the_estimates_and_names_each_missing_idea(capsys):
    md.labs.check_axis_bytes(_axis_bytes)
    assert "ok: axis_bytes" in capsys.readouterr().out
    for wrong, says in ((dict(backward=False), "the backward pass has one for each"),
                        (dict(ring=False), "does not send a GPU's own piece"),
                        (dict(stage_layers=False), "only the layers of its own pipeline stage"),
                        (dict(both_ways=False), "sends both ways"),
                        (dict(local_grads=False), "tp and pp split the parameters")):
        with pytest.raises(CheckFailed, match=says):
            md.labs.check_axis_bytes(lambda *a, w=wrong: _axis_bytes(*a, **w))
    with pytest.raises(CheckFailed, match="keys 'tp', 'pp' and 'dp'"):
        md.labs.check_axis_bytes(lambda *a: list(_axis_bytes(*a).values()))


def _plan_3d(world, psi, layers, heads, g, hbm, zero1, node_rule="divides", state="right", order="fewest"):
    best = None
    for tp in range(1, g + 1):
        for pp in range(1, layers + 1):
            in_node = g % tp == 0 if node_rule == "divides" else tp <= g
            if not in_node or heads % tp or layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            local = psi / (tp * pp)
            gb = {"right": (4 * local + 12 * local / (dp if zero1 else 1)) / 1e9,
                  "dp_divides_all": 16 * local / dp / 1e9,
                  "zero_all": 16 * local / (dp if zero1 else 1) / 1e9}[state]
            key = {"fewest": (tp * pp, -tp), "most_tp_last": (tp * pp, tp), "most_dp_first": (-tp * pp, -tp)}[order]
            if gb <= hbm and (best is None or key < best[0]):
                best = (key, (tp, pp, dp))
    return None if best is None else best[1]


def test_plan_3d_accepts_the_search_and_names_each_rule_it_breaks(capsys):
    md.labs.check_plan_3d(_plan_3d)
    assert "ok: plan_3d" in capsys.readouterr().out
    for wrong, says in ((dict(node_rule="fits"), "some tp group spans two nodes"),
                        (dict(state="dp_divides_all"), "copies the model"),
                        (dict(state="zero_all"), "ZeRO-1 shards only the optimizer state"),
                        (dict(order="most_tp_last"), "at equal tp x pp prefer tp"),
                        (dict(order="most_dp_first"), "take the fewest tp x pp that fit")):
        with pytest.raises(CheckFailed, match=says):
            md.labs.check_plan_3d(lambda *a, w=wrong: _plan_3d(*a, **w))
    with pytest.raises(CheckFailed, match="the dp ranks share out the optimizer state"):
        md.labs.check_plan_3d(lambda w, psi, L, a, g, hbm, zero1: _plan_3d(w, psi, L, a, g, hbm, False))
    with pytest.raises(CheckFailed, match="a layout fits"):
        md.labs.check_plan_3d(lambda *a: None)
    with pytest.raises(CheckFailed, match="as a list"):
        md.labs.check_plan_3d(lambda *a: None if _plan_3d(*a) is None else list(_plan_3d(*a)))


def test_axes_between_wants_every_axis_in_mesh_order():
    def right(a, b, shape, names):
        return tuple(n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y)

    md.labs.check_axes_between(right)
    with pytest.raises(CheckFailed, match="mesh order"):
        md.labs.check_axes_between(lambda a, b, shape, names: tuple(reversed(right(a, b, shape, names))))
    with pytest.raises(CheckFailed, match="compare them axis by axis"):
        md.labs.check_axes_between(lambda a, b, shape, names: right(a, b, shape, names)[:1])


def test_axes_between_wants_a_tuple_because_the_lab_uses_it_as_a_dict_key():
    def right(a, b, shape, names):
        return tuple(n for n, x, y in zip(names, np.unravel_index(a, shape), np.unravel_index(b, shape)) if x != y)

    with pytest.raises(CheckFailed, match="return a tuple"):
        md.labs.check_axes_between(lambda a, b, shape, names: list(right(a, b, shape, names)))
    with pytest.raises(CheckFailed, match="compare them axis by axis"):  # wrong values are reported before the type
        md.labs.check_axes_between(lambda a, b, shape, names: list(right(a, b, shape, names)) + ["pp"])


def _place_axes(blocking, sizes, g, skip=False, below=False, fastest_first=False):
    order = tuple(sorted(blocking, key=blocking.get))
    inside, span = set(), 1
    for axis in reversed(order):
        fits = span * sizes[axis] <= g if below else g % (span * sizes[axis]) == 0
        if not fits:
            if skip:
                continue
            break
        span *= sizes[axis]
        inside.add(axis)
    return (order[::-1] if fastest_first else order), inside


def test_place_axes_accepts_row_major_packing_and_names_the_usual_mistakes(capsys):
    md.labs.check_place_axes(_place_axes)
    assert "ok: place_axes" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="only if every faster axis"):
        md.labs.check_place_axes(lambda *a: _place_axes(*a, skip=True))
    with pytest.raises(CheckFailed, match="which does not divide a node of 8"):
        md.labs.check_place_axes(lambda *a: _place_axes(*a, below=True))
    with pytest.raises(CheckFailed, match="from the slowest-varying"):
        md.labs.check_place_axes(lambda *a: _place_axes(*a, fastest_first=True))


def _state_5d(nd, ne, layout, zero1, nbytes, ep_dense=False, zero_group="right"):
    w, g, o = nbytes
    tp, pp, dp, ep, cp = (layout.get(a, 1) for a in ("tp", "pp", "dp", "ep", "cp"))
    dense = nd / (tp * pp * (ep if ep_dense else 1))
    expert = ne / (tp * pp * ep)
    groups = {"right": (dp * ep * cp, dp * cp), "dp_only": (dp, dp), "all": (dp * ep * cp, dp * ep * cp)}[zero_group]
    dg, eg = groups if zero1 else (1, 1)
    return {"params": w * (dense + expert), "grads": g * (dense + expert), "optimizer": o * (dense / dg + expert / eg)}


def test_state_5d_knows_what_each_axis_divides_and_where_zero_shards(capsys):
    md.labs.check_state_5d(_state_5d)
    assert "ok: state_5d" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="dense weights are replicated over the ep ranks"):
        md.labs.check_state_5d(lambda *a: _state_5d(*a, ep_dense=True))
    with pytest.raises(CheckFailed, match="ep does not copy experts"):
        md.labs.check_state_5d(lambda *a: _state_5d(*a, zero_group="all"))
    with pytest.raises(CheckFailed, match="over all the ranks that hold copies"):
        md.labs.check_state_5d(lambda *a: _state_5d(*a, zero_group="dp_only"))
    with pytest.raises(CheckFailed, match="without ZeRO every copy"):
        md.labs.check_state_5d(lambda nd, ne, lay, z, nb: _state_5d(nd, ne, lay, True, nb))


def test_mesh_groups_of_the_wrong_type_are_named_before_the_cells_below_trip_on_them():
    for wrong, got in ((lambda s, a: [np.array(g) for g in groups_right(s, a)], "list of ndarray of int64"),
                       (lambda s, a: [tuple(g) for g in groups_right(s, a)], "list of tuple of int"),
                       (lambda s, a: [[np.int64(r) for r in g] for g in groups_right(s, a)], "list of list of int64")):
        with pytest.raises(CheckFailed, match=rf"the right groups, as the wrong type(.|\n)*{got}(.|\n)*\.tolist\(\)"):
            md.labs.check_mesh_groups(wrong)
