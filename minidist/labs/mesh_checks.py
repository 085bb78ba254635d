"""Checks for lab 15, the device mesh and 3D parallelism (book chapters 23-24, the fleet law); lab 16's (4D and 5D)
are in ``mesh_5d_checks.py``.

The groups of a mesh axis are compared with numpy slices of ``arange(P).reshape(shape)`` and with the
bijection theorem (each axis of size d_k gives P / d_k disjoint groups that cover every rank once). A
redistribution between placements runs on simulated ranks and is judged on the tensor it produces
and on the bytes it sends (a Replicate -> Shard step must send nothing, the others no more than one
all-gather or one all-to-all). The derivations (bytes per axis, the 3D planner, the terms of the fleet law read
off a trace) are graded on cases drawn from fixed seeds that the notebooks never print, against references built
on ``md.estimate`` where it has the formula.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, attempt, busy_and_both, fail, number, numbers_of, passed
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
            hint = ("the ranks of a group differ only in their coordinate along the axis: fix all the other "
                    "coordinates and let that one run")
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
            hint = ("a rank's coordinates are its index in the row-major grid: ranks 0 and 1 differ in the last "
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


def _ref_axis_bytes(h, s, b, L, t, p, d, m, psi) -> dict[str, float]:
    from minidist import estimate

    return {"tp": m * estimate.tp_comm_bytes(b, s, h, L // p, t),
            "pp": 2 * m * estimate.pp_activation_bytes(b, s, h) if p > 1 else 0.0,
            "dp": estimate.dp_all_reduce_bytes(psi / (t * p), d)}


def _axis_bytes_cases() -> list[tuple]:
    """Layouts the notebook never prints: drawn once from a fixed seed, with one axis of size one now and then."""
    rng = np.random.default_rng(1524)
    cases = []
    for i in range(12):
        h = int(rng.choice([1024, 2048, 4096, 5120, 8192]))
        s, b = int(rng.choice([1024, 2048, 4096])), int(rng.choice([1, 2, 4]))
        t = 1 if i == 3 else int(rng.choice([2, 4, 8]))
        p = 1 if i == 5 else int(rng.choice([4, 8]))
        d = 1 if i == 7 else int(rng.choice([2, 4, 16, 64]))
        L = p * int(rng.integers(2, 9))
        m = int(rng.choice([4, 8, 16, 32]))
        psi = float(12 * L * h * h)
        cases.append((h, s, b, L, t, p, d, m, psi))
    return cases


def _axis_bytes_hint(axis: str, args: tuple, want: float, got: float) -> str:
    h, s, b, L, t, p, d, m, psi = args
    near = functools.partial(math.isclose, got, rel_tol=1e-6)
    if axis == "tp":
        if t == 1:
            return "a tp group of one GPU has nobody to talk to: with t = 1 nothing moves"
        if near(want * t / (t - 1)):
            return ("a ring all-reduce does not send a GPU's own piece: each of its two passes sends all the "
                    "pieces but one")
        if near(want / 2) or near(want / 4):
            return ("count every all-reduce: the backward pass has one for each of the forward's, and a ring "
                    "all-reduce is two passes (a reduce-scatter, then an all-gather)")
        if near(want * p):
            return "this GPU runs only the layers of its own pipeline stage"
        if near(want / m):
            return "every micro-batch passes through every layer, and each pass all-reduces again"
        return "per layer and micro-batch, tp all-reduces the activations (b s h values of 2 bytes) in both passes"
    if axis == "pp":
        if p == 1:
            return "with a single stage there is no boundary to cross: nothing moves"
        if near(want / 2):
            return "a middle stage sends both ways: activations forward to the next stage, gradients back"
        if near(want * (p - 1)) or near(want * (p - 1) / 2):
            return "count what one GPU sends, not the whole pipeline"
        if near(want / m):
            return "every micro-batch crosses the boundary, once each way"
        return "one micro-batch's activation at a stage boundary is b s h values of 2 bytes"
    if d == 1:
        return "a dp group of one GPU has no gradients to sum with anyone: nothing moves"
    if near(want * t * p):
        return "this GPU reduces only the gradients of its own parameters, and tp and pp split the parameters"
    if near(want * d / (d - 1)):
        return "a ring all-reduce does not send a GPU's own piece: each pass sends all the pieces but one"
    if near(want / 2):
        return "a ring all-reduce is two passes: a reduce-scatter, then an all-gather"
    if near(want * 2):
        return "gradients travel in 2 bytes per value"
    return "dp all-reduces this GPU's gradients once per step, with a ring"


def check_axis_bytes(fn: Callable[..., dict]) -> None:
    """``fn(h, s, b, L, t, p, d, m, psi)``: bytes one GPU (of a middle pipeline stage) sends per training step on
    each axis of a (tp, pp, dp) = (t, p, d) layout, as ``{"tp": ..., "pp": ..., "dp": ...}``; 2-byte values, ring
    all-reduces. Graded on layouts drawn from a fixed seed, some with an axis of size one."""
    cases = _axis_bytes_cases()
    for args in cases:
        shown = "axis_bytes(h={}, s={}, b={}, L={}, t={}, p={}, d={}, m={}, psi={:.3g})".format(*args)
        got = attempt("axis_bytes", fn, *args, shown=shown)
        if not isinstance(got, dict) or set(got) != {"tp", "pp", "dp"}:
            fail(f"{shown} returned the wrong thing", "a dict with the keys 'tp', 'pp' and 'dp'", got,
                 "return one number of bytes per axis, in a dict keyed by the axis names")
        want = _ref_axis_bytes(*args)
        for axis in ("tp", "pp", "dp"):
            value = number(f"{shown}['{axis}']", got[axis])
            if not math.isclose(value, want[axis], rel_tol=1e-6, abs_tol=1e-6):
                fail(f"{shown}: the {axis} bytes are wrong", want[axis], value,
                     _axis_bytes_hint(axis, args, want[axis], value))
    passed(f"axis_bytes: {len(cases)} layouts, bytes per GPU per step on tp, pp and dp")


def _state_gb(psi: float, tp: int, pp: int, dp: int, zero1: bool) -> float:
    local = psi / (tp * pp)
    return (4 * local + 12 * local / (dp if zero1 else 1)) / 1e9


def _ref_plan_3d(world, psi, layers, heads, gpus_per_node, hbm_gb, zero1):
    best = None
    for tp in range(1, gpus_per_node + 1):
        for pp in range(1, layers + 1):
            if gpus_per_node % tp or heads % tp or layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if _state_gb(psi, tp, pp, dp, zero1) <= hbm_gb:
                best = min(best or (tp * pp, -tp, (tp, pp, dp)), (tp * pp, -tp, (tp, pp, dp)))
    return None if best is None else best[2]


def _plan_3d_cases() -> list[tuple]:
    """Fixed traps (heads that admit a tp of 6 on nodes of 8, layers that no power of two divides, a model that
    fits nowhere) and clusters drawn from a fixed seed; none is the 175B example the notebook prints."""
    cases = [(384, 28e9, 32, 12, 8, 80.0, False),   # tp 6 would do, but a group of 6 straddles nodes of 8
             (960, 60e9, 30, 48, 8, 80.0, False),   # pp must divide 30 layers: 3, 5, 6, 10 ...
             (128, 2e12, 32, 32, 8, 80.0, False),   # nothing fits
             (64, 1.3e9, 24, 16, 8, 40.0, False),   # fits on one GPU: pure data parallelism
             (512, 70e9, 80, 64, 8, 80.0, True),
             (512, 70e9, 80, 64, 8, 80.0, False)]
    rng = np.random.default_rng(2415)
    while len(cases) < 16:
        world = int(rng.choice([64, 128, 256, 384, 512, 1024, 2048]))
        layers = int(rng.choice([24, 30, 32, 40, 48, 60, 64, 80, 96, 126]))
        heads = int(rng.choice([12, 16, 20, 24, 32, 40, 48, 64, 96, 128]))
        case = (world, float(rng.choice([3e9, 8e9, 13e9, 34e9, 70e9, 175e9, 340e9, 530e9])), layers, heads,
                int(rng.choice([4, 8])), float(rng.choice([40.0, 80.0, 141.0])), bool(rng.integers(2)))
        if _ref_plan_3d(*case) is not None or len(cases) % 4 == 0:
            cases.append(case)
    return cases


def _plan_3d_hint(case, got, want) -> tuple[str, str]:
    """(what is wrong, hint) for a learner's layout ``got`` that differs from the reference ``want``."""
    world, psi, layers, heads, g, hbm, zero1 = case
    if got is None:
        return (f"a layout fits: {want} needs {_state_gb(psi, *want, zero1):.1f} GB per GPU",
                "try every degree that divides what it must divide (tp = 1 and pp = layers included)")
    if not (isinstance(got, tuple | list) and len(got) == 3 and all(isinstance(x, int | np.integer) for x in got)):
        return "not a layout", "return (tp, pp, dp) as a tuple of three ints, or None when nothing fits"
    tp, pp, dp = (int(x) for x in got)
    if min(tp, pp, dp) < 1 or tp * pp * dp != world:
        return f"tp x pp x dp = {tp * pp * dp}, not the {world} GPUs", "a layout uses every GPU of the world once"
    if heads % tp:
        return f"tp = {tp} does not divide the {heads} heads", "each tp rank computes whole attention heads"
    if layers % pp:
        return f"pp = {pp} does not divide the {layers} layers", "each pipeline stage holds whole layers"
    if g % tp:
        return (f"tp = {tp} on nodes of {g} GPUs: some tp group spans two nodes",
                f"a tp group is {tp} neighbouring ranks; write out the groups that meet rank {g - 1} and rank {g}")
    need = _state_gb(psi, tp, pp, dp, zero1)
    if need > hbm:
        hint = "a GPU keeps 2 + 2 + 12 bytes for every parameter of its share of the model"
        if 16 * psi / world / 1e9 <= hbm:  # it would fit if dp divided every byte
            hint = ("ZeRO-1 shards only the optimizer state over dp; weights and gradients stay whole on each dp "
                    "rank" if zero1 else
                    "data parallelism copies the model: without ZeRO a dp rank holds the whole state of its share")
        what = f"{tuple(got)} needs {need:.1f} GB of model state per GPU, more than the {hbm:g} GB it has"
        if want is None:
            what = f"no layout fits: {what}"
        return what, hint
    if want is None:
        return "no layout fits", "check the memory of your layout"
    if zero1 and tuple(got) == _ref_plan_3d(world, psi, layers, heads, g, hbm, False):
        return (f"{want} fits too ({_state_gb(psi, *want, zero1):.1f} GB with ZeRO-1), with fewer GPUs per replica",
                "with ZeRO-1 the dp ranks share out the optimizer state, so a smaller split of the model may fit")
    if tp * pp > want[0] * want[1]:
        return (f"{want} also fits ({_state_gb(psi, *want, zero1):.1f} GB), with {want[0] * want[1]} GPUs per "
                f"model replica instead of {tp * pp}",
                "every extra model-parallel split adds communication: take the fewest tp x pp that fit")
    return (f"{want} fits with the same tp x pp and a wider tp",
            "at equal tp x pp prefer tp: it runs on the node's links, while every pipeline stage adds bubble")


def check_plan_3d(fn: Callable[..., tuple | None]) -> None:
    """``fn(world, psi, layers, heads, gpus_per_node, hbm_gb, zero1)``: the (tp, pp, dp) layout whose model state
    (2 + 2 + 12 bytes per parameter, ZeRO-1 over dp when ``zero1``) fits ``hbm_gb`` GB per GPU with the fewest GPUs
    per replica (tp x pp), ties to the larger tp; tp divides the heads and stays inside a node, pp divides the
    layers; None when nothing fits. Graded on clusters the notebook never prints."""
    cases = _plan_3d_cases()
    for case in cases:
        shown = "plan_3d(world={}, psi={:.3g}, layers={}, heads={}, gpus_per_node={}, hbm_gb={:g}, zero1={})".format(
            *case)
        got = attempt("plan_3d", fn, *case, shown=shown)
        want = _ref_plan_3d(*case)
        same = got is None if want is None else (isinstance(got, tuple | list) and len(got) == 3
                                                 and tuple(int(x) for x in got) == want)
        if not same:
            what, hint = _plan_3d_hint(case, got, want)
            fail(f"{shown}: {what}", want, got, hint)
        if got is not None and not isinstance(got, tuple):
            fail(f"{shown}: the right layout as a {type(got).__name__}", "a tuple (tp, pp, dp)", got,
                 "return a tuple: the cells below compare layouts with ==")
    passed(f"plan_3d: {len(cases)} clusters and models, {sum(_ref_plan_3d(*c) is None for c in cases)} of them "
           f"too big for any layout")


def _law_terms_cases() -> list[tuple[list, list]]:
    """Streams of one rank in one step, shuffled: compute kernels back to back with gaps, collectives that may be in
    flight two at a time (so a stream's own events overlap), one case with no communication at all."""
    rng = np.random.default_rng(3107)
    cases = []
    for i in range(10):
        starts = np.cumsum(rng.uniform(0.1, 1.0, 12))
        compute = [(float(s), float(s + d)) for s, d in zip(starts, rng.uniform(0.05, 0.9, 12))]
        comm = [] if i == 4 else [(float(s), float(s + d)) for s, d in
                                  zip(rng.uniform(0, starts[-1], 5), rng.uniform(0.2, 2.0, 5))]
        order_a, order_b = rng.permutation(len(compute)), rng.permutation(len(comm))
        cases.append(([compute[j] for j in order_a], [comm[j] for j in order_b]))
    return cases


def check_law_terms(fn: Callable[[list, list], tuple]) -> None:
    """``fn(compute, comm)``, each a list of (start, end) events of one stream of one rank in one step (in any
    order, possibly overlapping): ``(t_compute, t_comm, t_overlap)``, the time each stream is busy and the time both
    are busy at once. Graded on event lists the notebook never prints."""
    cases = _law_terms_cases()
    for compute, comm in cases:
        shown = f"law_terms(<{len(compute)} compute events>, <{len(comm)} comm events>)"
        got = attempt("law_terms", fn, list(compute), list(comm), shown=shown)
        values = numbers_of(shown, got, ("t_compute", "t_comm", "t_overlap"))
        want = busy_and_both(compute, comm)
        for name, value, ref in zip(("t_compute", "t_comm", "t_overlap"), values, want):
            if math.isclose(value, ref, rel_tol=1e-9, abs_tol=1e-12):
                continue
            events = compute if name == "t_compute" else comm
            naive = sum(e - s for s, e in events)
            raw = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in compute for s2, e2 in comm)
            hint = "the busy time of a stream is the length of the union of its events"
            if name != "t_overlap" and math.isclose(value, naive, rel_tol=1e-9):
                hint = ("two events of one stream can overlap in time (two collectives in flight at once): count "
                        "every instant once")
            elif name == "t_overlap" and math.isclose(value, min(want[0], want[1]), rel_tol=1e-9):
                hint = "overlap is the time during which both streams are busy at the same instant"
            elif name == "t_overlap" and math.isclose(value, raw, rel_tol=1e-9):
                hint = ("an instant where two collectives overlap a kernel counts once: merge each stream's events "
                        "before you intersect them")
            elif name == "t_overlap":
                hint = "overlap is the time during which both streams are busy at the same instant"
            fail(f"{shown}: {name} is wrong", ref, value, hint)
    passed(f"law_terms: {len(cases)} steps of events, busy time of each stream and their overlap")
