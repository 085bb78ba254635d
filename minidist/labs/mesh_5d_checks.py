"""Checks for lab 16, 4D and 5D parallelism (book chapter 25, the lattice of strategies); lab 15's are in
``mesh_checks.py``.

Which axes two ranks of a mesh differ on is compared with their row-major coordinates. The derivations (the
placement of axes on nodes, the 5D memory composed from its parts) are graded on cases drawn from fixed seeds that
the notebooks never print, against references built from the formulas of the chapter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import _plain, attempt, fail, number, passed


def check_axes_between(fn: Callable[[int, int, tuple, tuple], tuple]) -> None:
    """``fn(a, b, shape, names)``: the names of every axis on which ranks a and b differ, in mesh order."""
    shape, names = (2, 2, 2, 2), ("pp", "dp", "cp", "tp")
    cases = [(0, 1, ("tp",)), (0, 2, ("cp",)), (0, 3, ("cp", "tp")), (1, 6, ("dp", "cp", "tp")), (0, 15, names),
             (5, 5, ()), (9, 8, ("tp",)), (12, 6, ("pp", "cp"))]
    for a, b, want in cases:
        got = attempt("axes_between", fn, a, b, shape, names)
        values = None if got is None else tuple(got)
        if values != want:
            hint = "write out the coordinates of both ranks in the row-major grid and compare them axis by axis"
            if values is not None and set(values) == set(want):
                hint = "list the axes in mesh order (the order of names)"
            elif want == () and values is None:
                hint = "a rank differs from itself on no axis: return an empty tuple"
            fail(f"axes_between({a}, {b}, {shape}, {names}) is wrong", want, got, hint)
        if not isinstance(got, tuple):
            # traffic() below keys a dict by this value, and a list there fails far from its cause
            fail(f"axes_between({a}, {b}, {shape}, {names}) has the right axes in the wrong type", "a tuple",
                 type(got).__name__, "return a tuple, e.g. tuple(...) around a list or generator: the result "
                 "is used as a dict key, and a list cannot be one")
    passed(f"axes_between: {len(cases)} pairs of ranks on a (pp, dp, cp, tp) = (2, 2, 2, 2) mesh")


def _ref_place_axes(blocking: dict, sizes: dict, gpus_per_node: int) -> tuple[tuple[str, ...], set[str]]:
    order = tuple(sorted(blocking, key=lambda a: blocking[a]))  # slowest (least waited for) first
    inside, span = set(), 1
    for axis in reversed(order):
        span *= sizes[axis]
        if gpus_per_node % span:
            break
        inside.add(axis)
    return order, inside


def _place_axes_cases() -> list[tuple]:
    """Traps first (a heavy axis too big for the node ahead of a light one that would fit; a product that stays
    below the node size without dividing it), then meshes drawn from a fixed seed."""
    cases = [({"tp": 9e9, "cp": 4e9, "pp": 1e8, "dp": 0.0}, {"tp": 16, "cp": 2, "pp": 4, "dp": 8}, 8),
             ({"tp": 7e9, "cp": 3e9, "dp": 1e7}, {"tp": 2, "cp": 3, "dp": 4}, 8),
             ({"cp": 5e9, "tp": 6e9, "ep": 2e9, "dp": 0.0}, {"cp": 2, "tp": 2, "ep": 2, "dp": 4}, 8),
             ({"ep": 8e9, "tp": 2e9, "pp": 3e8}, {"ep": 4, "tp": 4, "pp": 2}, 8)]
    rng = np.random.default_rng(2505)
    while len(cases) < 14:
        names = list(rng.permutation(["tp", "cp", "ep", "pp", "dp"])[:int(rng.integers(3, 6))])
        loads = rng.permutation([0.0, 2e7, 3e8, 4e9, 6e10])[:len(names)]
        sizes = {str(a): int(rng.choice([2, 2, 4, 8, 3])) for a in names}
        cases.append(({str(a): float(x) for a, x in zip(names, loads)}, sizes, int(rng.choice([4, 8, 16]))))
    return cases


def _place_axes_hint(blocking, sizes, g, order, inside, want_order, want_inside) -> str:
    if order != want_order:
        if order == want_order[::-1]:
            return "the mesh lists its axes from the slowest-varying (outermost) to the fastest (innermost)"
        return "order the axes by the traffic the layers wait for: the most waited-for axis varies fastest"
    extra, missing = inside - want_inside, want_inside - inside
    span = 1
    for axis in reversed(order):
        span *= sizes[axis]
        if axis in extra and span <= g and g % span:
            return (f"the axes up to {axis} span {span} consecutive ranks, which does not divide a node of {g}: "
                    f"list the ranks of a group that contains rank {g - 1}")
        if axis in extra:
            return ("ranks are numbered row-major: an axis's groups lie inside a node only if every faster axis's "
                    "groups do too")
    if missing:
        return f"the groups of {sorted(missing)} lie inside one node: count the consecutive ranks they span"
    return "an axis is inside the node when every one of its groups lies within one node"


def check_place_axes(fn: Callable[[dict, dict, int], tuple]) -> None:
    """``fn(blocking, sizes, gpus_per_node)``: ``(order, inside)``, the axes in mesh order (slowest first, the axis
    whose traffic the layers wait for most last) and the set of axes whose every group lies inside one node, with
    ranks numbered row-major in that order. Graded on meshes the notebook never prints."""
    cases = _place_axes_cases()
    for blocking, sizes, g in cases:
        shown = f"place_axes({_plain(blocking)}, {_plain(sizes)}, gpus_per_node={g})"
        got = attempt("place_axes", fn, dict(blocking), dict(sizes), g, shown=shown)
        if not (isinstance(got, tuple | list) and len(got) == 2):
            fail(f"{shown} returned the wrong thing", "a pair (order, inside)", got,
                 "return the axis order (a tuple of names) and the axes inside a node (a set of names)")
        want_order, want_inside = _ref_place_axes(blocking, sizes, g)
        try:
            order, inside = tuple(got[0]), {str(a) for a in got[1]}
        except TypeError:
            fail(f"{shown} returned the wrong thing", (want_order, want_inside), got,
                 "the order is a tuple of axis names, the inside a set of names")
        if order != want_order or inside != want_inside:
            fail(f"{shown} is wrong", (want_order, want_inside), (order, inside),
                 _place_axes_hint(blocking, sizes, g, order, inside, want_order, want_inside))
    passed(f"place_axes: {len(cases)} meshes, axes ordered by the traffic the layers wait for and packed into nodes")


def _ref_state_5d(n_dense, n_expert, layout, zero1, nbytes) -> dict[str, float]:
    w, g, o = nbytes
    tp, pp, dp, ep, cp = (layout.get(a, 1) for a in ("tp", "pp", "dp", "ep", "cp"))
    dense, expert = n_dense / (tp * pp), n_expert / (tp * pp * ep)
    dense_group, expert_group = (dp * ep * cp, dp * cp) if zero1 else (1, 1)
    return {"params": w * (dense + expert), "grads": g * (dense + expert),
            "optimizer": o * (dense / dense_group + expert / expert_group)}


def _state_5d_cases() -> list[tuple]:
    rng = np.random.default_rng(2525)
    cases = [(6e9, 0.0, {"tp": 4, "pp": 2, "dp": 8}, True, (2, 2, 12)),  # dense: the 3D formula
             (2e9, 30e9, {"ep": 8, "dp": 2}, False, (2, 2, 12))]        # experts alone
    while len(cases) < 12:
        layout = {a: int(rng.choice([1, 2, 4, 8])) for a in ("tp", "pp", "dp", "ep", "cp")}
        cases.append((float(rng.choice([1e9, 3e9, 5e9, 12e9])), float(rng.choice([0.0, 20e9, 136e9, 600e9])),
                      layout, bool(rng.integers(2)) or len(cases) % 3 == 0,
                      ((2, 2, 12), (8, 8, 16), (2, 4, 12))[len(cases) % 3]))
    return cases


def _state_5d_hint(category, args, want, got) -> str:
    nd, ne, layout, zero1, nbytes = args
    tp, pp, dp, ep, cp = (layout.get(a, 1) for a in ("tp", "pp", "dp", "ep", "cp"))
    w, g, o = nbytes
    per = {"params": w, "grads": g, "optimizer": o}[category]
    near = functools.partial(math.isclose, got, rel_tol=1e-6)
    if category == "optimizer" and not zero1 and near(_ref_state_5d(nd, ne, layout, True, nbytes)["optimizer"]):
        return "without ZeRO every copy of a weight keeps its own optimizer state"
    if category in ("params", "grads") or not zero1:
        if near(per * (nd + ne) / (tp * pp * ep)):
            return "ep shards only the experts: the dense weights are replicated over the ep ranks"
        if near(per * (nd + ne) / (tp * pp)):
            return "each ep rank holds 1/ep of the experts"
        if near(per * (nd / (tp * pp) + ne / ep)):
            return "tp and pp split the experts too (each expert is one block's MLP)"
        if near(want / (dp * cp)) or near(want / dp) or near(want / (dp * ep * cp)):
            return ("dp and cp split the tokens, not the weights: every dp and cp rank holds a full copy of its "
                    "share" + ("; ZeRO-1 shards only the optimizer state" if zero1 and category == "grads" else ""))
        return "tp and pp split every parameter, ep additionally splits the experts"
    dense, expert = nd / (tp * pp), ne / (tp * pp * ep)
    if near(o * (dense + expert)) or near(o * (dense + expert) / dp):
        return ("ZeRO-1 shards each weight's optimizer state over all the ranks that hold copies of that weight: "
                "every rank that differs from this one only in its dp, cp (and, for a dense weight, ep) coordinates")
    if near(o * (dense + expert) / (dp * ep * cp)):
        return "an expert's copies live only on the ranks with the same ep coordinate: ep does not copy experts"
    if near(o * (dense + expert) / (dp * cp)):
        return "a dense weight is copied on every ep rank too, so its optimizer state shards over ep as well"
    return "ZeRO-1 shards each weight's optimizer state over the ranks that sum its gradient"


def check_state_5d(fn: Callable[..., dict]) -> None:
    """``fn(n_dense, n_expert, layout, zero1, nbytes)``: bytes of model state on one GPU of a 5D layout (``layout``
    maps some of "tp", "pp", "dp", "ep", "cp" to degrees, the rest are 1), as ``{"params", "grads", "optimizer"}``
    with ``nbytes`` = bytes per parameter of each; ZeRO-1 when ``zero1``. Graded on layouts drawn from a seed."""
    cases = _state_5d_cases()
    for args in cases:
        nd, ne, layout, zero1, nbytes = args
        shown = f"state_5d({nd:.3g}, {ne:.3g}, {layout}, zero1={zero1}, nbytes={nbytes})"
        got = attempt("state_5d", fn, nd, ne, dict(layout), zero1, nbytes, shown=shown)
        want = _ref_state_5d(*args)
        if not isinstance(got, dict) or set(got) != set(want):
            fail(f"{shown} returned the wrong thing", "a dict with the keys 'params', 'grads', 'optimizer'", got,
                 "return bytes per category in a dict, as the simulator's memory ledger does")
        for category in ("params", "grads", "optimizer"):
            value = number(f"{shown}['{category}']", got[category])
            if not math.isclose(value, want[category], rel_tol=1e-6):
                fail(f"{shown}: {category} is wrong", want[category], value,
                     _state_5d_hint(category, args, want[category], value))
    passed(f"state_5d: {len(cases)} layouts of dense and expert weights, with and without ZeRO-1")
