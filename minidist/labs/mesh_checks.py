"""Checks for labs 15 and 16, the device mesh, 3D, 4D and 5D parallelism (book chapters 23-25).

The groups of a mesh axis are compared with numpy slices of ``arange(P).reshape(shape)`` and with the
bijection theorem (each axis of size d_k gives P / d_k disjoint groups that cover every rank once). A
redistribution between placements runs on simulated ranks and is judged on the tensor it produces
and on the bytes it sends (a Replicate -> Shard step must send nothing, the others no more than one
all-gather or one all-to-all). The 3D memory formula is checked against the book's worked examples
of chapter 24.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, attempt, check_cases, fail, passed
from minidist.labs.ranks import run_ranks


def _ref_groups(shape, axis: int) -> list[list[int]]:
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    moved = np.moveaxis(ranks, axis, -1).reshape(-1, shape[axis])
    return sorted(sorted(int(r) for r in row) for row in moved)


def check_mesh_groups(fn: Callable[[tuple, int], list]) -> None:
    """``fn(shape, axis)``: the process groups along ``axis`` of a row-major mesh, each a list of ranks."""
    cases = [((2, 2, 2), 2), ((2, 2, 2), 0), ((8, 4, 8), 1), ((8, 4, 8), 2), ((3, 5), 0), ((4,), 0), ((2, 3, 4), 1)]
    for shape, axis in cases:
        name = f"mesh_groups({shape}, axis={axis})"
        try:
            got = fn(shape, axis)
        except NotImplementedError:
            raise CheckFailed("mesh_groups: the exercise is not done yet (it raised NotImplementedError)") from None
        except Exception as e:
            raise CheckFailed(f"{name} raised {type(e).__name__}: {e}") from e
        if got is None:
            fail(name, "a list of groups", got, "did you forget to `return` the groups?")
        try:
            groups = sorted(sorted(int(r) for r in g) for g in got)
        except TypeError:
            fail(name, "a list of lists of ranks", got, "return one list of global ranks per group")
        want = _ref_groups(shape, axis)
        if groups == want:
            if not (type(got) is list and all(type(g) is list and all(type(r) is int for r in g) for g in got)):
                fail(f"{name}: the right groups, as the wrong type", "a list of lists of Python ints",
                     f"{type(got).__name__} of {type(got[0]).__name__}" + (f" of {type(got[0][0]).__name__}"
                                                                         if len(got[0]) else ""),
                     "convert with .tolist(): the cells below look groups up with `in`, which a numpy array "
                     "cannot answer and a tuple never matches a list in")
            continue
        P, d = int(np.prod(shape)), shape[axis]
        sizes = sorted({len(g) for g in groups})
        if len(groups) != P // d:
            hint = (f"an axis of size {d} in a mesh of {P} ranks gives {P // d} groups (one for every setting of "
                    f"the other coordinates), got {len(groups)}")
            if len(groups) == d and sizes == [P // d]:
                hint += "; you grouped by the coordinate along the axis instead of by the other coordinates"
        elif sizes != [d]:
            hint = f"every group along axis {axis} has {d} ranks (the axis's size), got sizes {sizes}"
        else:
            hint = ("the ranks of a group differ only in their coordinate along the axis: fix the others and let "
                    "that one run (np.moveaxis(ranks, axis, -1) puts it last)")
        fail(f"{name} is wrong", want[:4], groups[:4], hint)
    passed(f"mesh_groups: {len(cases)} meshes, every axis splits the world into disjoint groups")


def check_axis_of(fn: Callable[[int, int, tuple, tuple], str | None]) -> None:
    """``fn(a, b, shape, names)``: the name of the one axis on which ranks a and b differ, or None."""
    shape, names = (2, 2, 2), ("pp", "dp", "tp")
    cases = [(0, 1, "tp"), (0, 2, "dp"), (0, 4, "pp"), (5, 7, "dp"), (6, 7, "tp"), (3, 7, "pp"), (0, 3, None),
             (1, 6, None), (2, 2, None)]
    for a, b, want in cases:
        got = attempt("axis_of", fn, a, b, shape, names)
        if got != want:
            hint = ("a rank's coordinates are np.unravel_index(rank, shape): ranks 0 and 1 differ in the last "
                    "(fastest) axis")
            if want is None:
                hint = "ranks that differ on two axes (or on none) share no group: return None"
            fail(f"axis_of({a}, {b}, {shape}, {names}) is wrong", want, got, hint)
    passed(f"axis_of: {len(cases)} pairs of ranks on a (pp, dp, tp) = (2, 2, 2) mesh")


def _redistribute_body(fn, full, src, dst):
    from minidist import dist

    p, r = dist.get_world_size(), dist.get_rank()
    local = {"R": full, "S0": np.array_split(full, p, 0)[r], "S1": np.array_split(full, p, 1)[r]}[src].copy()
    t0 = dist.now()
    out = fn(local, src, dst)
    return out, dist.now() - t0


def _head(row: np.ndarray) -> str:
    return np.array2string(row[:4], separator=", ")[:-1] + (", ...]" if row.size > 4 else "]")


def _first_wrong_row(got: np.ndarray, want: np.ndarray) -> str:
    i = int(np.flatnonzero((got != want).any(axis=1))[0])
    return f"right shape {want.shape}, wrong values: row {i} is {_head(got[i])}, expected {_head(want[i])}"


def check_redistribute(fn: Callable[[np.ndarray, str, str], np.ndarray]) -> None:
    """``fn(local, src, dst)`` on every rank: this rank's piece under placement ``dst`` ("R", "S0", "S1"), given
    its piece under ``src``. Checked for the tensor each rank ends with and for the traffic: R -> S is free, and
    the bytes on the links may not clearly exceed one all-gather (S -> R) or one all-to-all (S0 <-> S1)."""
    # large enough that a few bytes of shape metadata stay well inside the tolerance on the traffic
    full = np.arange(192, dtype=np.float64).reshape(8, 24) + 0.5
    for src, dst in [("S0", "R"), ("S1", "R"), ("R", "S0"), ("R", "S1"), ("S0", "S1"), ("S1", "S0")]:
        for p in (2, 4):
            res = run_ranks("redistribute", _redistribute_body, p, args=(fn, full, src, dst), timeout=5.0)
            want = {"R": [full] * p, "S0": np.array_split(full, p, 0), "S1": np.array_split(full, p, 1)}[dst]
            for r, (got, _) in enumerate(res.values):
                got = None if got is None else np.asarray(got)
                if got is None or got.shape != want[r].shape or not np.array_equal(got, want[r]):
                    hint = {"R": "Shard -> Replicate is an all-gather: every rank needs every piece",
                            "S0": "rank r keeps rows [r n/p, (r+1) n/p) of the full tensor",
                            "S1": "rank r keeps columns [r n/p, (r+1) n/p) of the full tensor"}[dst]
                    if src[0] == "S" and dst[0] == "S":
                        hint = ("one all-to-all: split your piece along the new dimension into p chunks, send chunk "
                                "j to rank j, and join what arrives along the old dimension")
                    what = f"redistribute {src} -> {dst} on {p} ranks: rank {r} holds the wrong piece"
                    if got is not None and got.shape == want[r].shape and got.ndim == 2:
                        raise CheckFailed(f"{what}: {_first_wrong_row(got, want[r])}\n  hint: {hint}")
                    fail(what, f"shape {want[r].shape}", f"shape {None if got is None else got.shape}", hint)
            spent = max(t for _, t in res.values)
            if src == "R" and spent > 0:
                fail(f"redistribute R -> {dst} on {p} ranks communicated", "no communication (0 s)",
                     f"{spent * 1e6:.2f} us", "a replicated tensor already holds every shard: keep your own slice")
            if src != "R" and spent == 0:
                fail(f"redistribute {src} -> {dst} on {p} ranks sent nothing", "a collective", "no communication",
                     "a shard holds only part of the data: the other ranks' parts must travel")
            if src == "R":
                continue
            # bytes, not time: at this size latency dominates, and an all-gather can finish as early as an all-to-all
            moved = sum(e.nbytes for e in res.trace if e.stream == "link")
            if dst == "R":
                least, how = full.nbytes * (p - 1), "one all-gather"
                hint = ("an all-gather sends each piece once to every other rank; a sum (all_reduce) of zero-padded "
                        "copies moves about twice as much")
            else:
                least, how = full.nbytes * (p - 1) / p, "one all-to-all"
                hint = ("each rank already holds its share of what it will keep: send the other ranks only the part "
                        "of your piece that they own, not the whole piece to everyone")
            if moved > 1.5 * least:
                raise CheckFailed(
                    f"redistribute {src} -> {dst} on {p} ranks moved {moved:,.0f} bytes over the links; {how} of "
                    f"this {full.nbytes:,}-byte tensor moves {least:,.0f} ({moved / least:.1f}x as much)"
                    f"\n  hint: {hint}")
    passed("redistribute: S -> R by all-gather, R -> S for free, S0 <-> S1 by one all-to-all (2 and 4 ranks)")


def _ref_state_gb(psi, tp, pp, dp, zero1):
    local = psi / (tp * pp)
    return (2 * local + 2 * local + 12 * local / (dp if zero1 else 1)) / 1e9


def check_state_per_gpu(fn: Callable[[float, int, int, int, bool], float]) -> None:
    """``fn(psi, tp, pp, dp, zero1)``: GB of model state (2 + 2 + 12 bytes per parameter) on one GPU of a 3D layout."""
    cases = [((175e9, 4, 8, 32, False), _ref_state_gb(175e9, 4, 8, 32, False),
              "the book's chapter 24 exercise: about 87 GB without ZeRO"),
             ((175e9, 4, 8, 32, True), _ref_state_gb(175e9, 4, 8, 32, True), "with ZeRO-1 over dp = 32: about 24 GB"),
             ((175e9, 8, 16, 8, False), _ref_state_gb(175e9, 8, 16, 8, False), "Megatron's 175B layout: TP 8, PP 16"),
             ((7e9, 1, 1, 64, True), _ref_state_gb(7e9, 1, 1, 64, True), "pure data parallelism with ZeRO-1")]

    def diagnose(args, expected, got):
        psi, tp, pp, dp, zero1 = args
        if zero1 and math.isclose(got, _ref_state_gb(psi, tp, pp, dp, False), rel_tol=1e-9):
            return "ZeRO-1 shards the 12 optimizer bytes over the dp ranks"
        if math.isclose(got, expected * 1e9, rel_tol=1e-9):
            return "answer in GB (1e9 bytes)"
        if math.isclose(got, _ref_state_gb(psi, tp, pp, 1, zero1) / dp, rel_tol=1e-9) or \
                math.isclose(got, 16 * psi / (tp * pp * dp) / 1e9, rel_tol=1e-9):
            return "data parallelism replicates the weights and gradients: only tp and pp divide them"
        return "tp and pp split the parameters, so each GPU holds psi / (tp pp) of them, at 2 + 2 + 12 bytes"

    check_cases("state_per_gpu", fn, cases, rel=1e-6, diagnose=diagnose)


def check_axes_between(fn: Callable[[int, int, tuple, tuple], tuple]) -> None:
    """``fn(a, b, shape, names)``: the names of every axis on which ranks a and b differ, in mesh order."""
    shape, names = (2, 2, 2, 2), ("pp", "dp", "cp", "tp")
    cases = [(0, 1, ("tp",)), (0, 2, ("cp",)), (0, 3, ("cp", "tp")), (1, 6, ("dp", "cp", "tp")), (0, 15, names),
             (5, 5, ()), (9, 8, ("tp",)), (12, 6, ("pp", "cp"))]
    for a, b, want in cases:
        got = attempt("axes_between", fn, a, b, shape, names)
        values = None if got is None else tuple(got)
        if values != want:
            hint = "compare np.unravel_index(a, shape) with np.unravel_index(b, shape) axis by axis"
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


def check_params_per_gpu(fn: Callable[[float, float, int, int, int], float]) -> None:
    """``fn(n_dense, n_expert, tp, pp, ep)``: parameters on one GPU of a 5D layout."""
    def ref(nd, ne, tp, pp, ep):
        return nd / (tp * pp) + ne / (tp * pp * ep)

    cases = [((5e9, 136e9, 4, 4, 8), ref(5e9, 136e9, 4, 4, 8), "Mixtral 8x22B's layout: TP 4, PP 4, EP 8"),
             ((70e9, 0, 8, 8, 1), ref(70e9, 0, 8, 8, 1), "a dense 70B on TP 8, PP 8: the book's 1.09B per GPU"),
             ((1e6, 8e6, 1, 1, 4), ref(1e6, 8e6, 1, 1, 4), "expert parallelism alone"),
             ((3e6, 12e6, 2, 2, 2), ref(3e6, 12e6, 2, 2, 2), "every axis at once")]

    def diagnose(args, expected, got):
        nd, ne, tp, pp, ep = args
        if math.isclose(got, (nd + ne) / (tp * pp * ep), rel_tol=1e-9):
            return "ep shards only the experts: the dense weights are replicated over the ep ranks"
        if math.isclose(got, nd / (tp * pp) + ne / (tp * pp), rel_tol=1e-9):
            return "each ep rank holds 1/ep of the experts"
        if math.isclose(got, nd / (tp * pp) + ne / ep, rel_tol=1e-9):
            return "tp and pp split the experts too (each expert is a block's MLP)"
        return "tp and pp split every parameter, ep additionally splits the experts"

    check_cases("params_per_gpu", fn, cases, diagnose=diagnose)
