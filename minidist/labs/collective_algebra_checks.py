"""Checks for lab 05, the algebra of collectives (book ch11).

Identity elements, AllReduce rebuilt as AllGather after ReduceScatter (run on simulated ranks and
compared rank by rank with ``md.dist.all_reduce``), and a prediction about float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, attempt, fail, number, passed
from minidist.labs.ranks import compare_ranks, run_ranks
from minidist.runtime.ops import ReduceOp

_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN)


def _probe(dtype) -> np.ndarray:
    """Values an identity must leave unchanged, extremes included."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        big = np.finfo(dtype).max
        return np.array([-np.inf, -big, -2.5, 0.0, 1.0, 3.0, big, np.inf], dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, -5, 0, 1, 7, info.max], dtype)


def check_identity(fn: Callable[[ReduceOp, np.dtype], object]) -> None:
    """``fn(op, dtype)`` returns e with ``e op x == x`` for every x of that dtype (infinities included)."""
    for dtype in (np.float32, np.float64, np.int32, np.int64):
        xs = _probe(dtype)
        for op in _OPS:
            e = attempt("identity", fn, op, np.dtype(dtype), shown=f"identity({op}, {np.dtype(dtype).name})")
            want = op.identity(dtype)
            where = f"identity({op}, {np.dtype(dtype).name})"
            if e is None:
                fail(f"{where} returned None", want, e, "did you forget to `return`?")
            ev = np.asarray(e)
            if np.dtype(dtype).kind == "i" and (ev.dtype.kind == "f" and not (np.isfinite(ev) and ev == np.round(ev))):
                fail(f"{where} is not an integer", want, e,
                     "integers have no infinity: use the smallest or largest value, np.iinfo(dtype).min / .max")
            if np.dtype(dtype).kind == "i" and not np.iinfo(dtype).min <= ev <= np.iinfo(dtype).max:
                fail(f"{where} does not fit the dtype", want, e, "use np.iinfo(dtype).min / .max")
            with np.errstate(all="ignore"):
                got = op.ufunc(np.full(xs.shape, ev, dtype=dtype), xs)
            bad = ~((got == xs) | (np.isnan(got) & np.isnan(xs)))
            if bad.any():
                x, gx = xs[bad][0].item(), got[bad][0].item()
                hint = {ReduceOp.SUM: "x + e == x for every x", ReduceOp.PRODUCT: "x * e == x for every x",
                        ReduceOp.MAX: "max(e, x) == x needs e below every value of the dtype",
                        ReduceOp.MIN: "min(e, x) == x needs e above every value of the dtype"}[op]
                if op in (ReduceOp.MAX, ReduceOp.MIN) and np.dtype(dtype).kind == "f":
                    hint += "; floats include -inf and +inf, which are beyond np.finfo(dtype).min / .max"
                fail(f"{where} = {e!r} is not an identity: {op.name.lower()}({e!r}, {x!r}) gives {gx!r}",
                     want, e, hint)
    passed("identity elements of SUM, PRODUCT, MAX, MIN for float32, float64, int32, int64")


def _inputs(rank: int, n: int) -> np.ndarray:
    """Small integers (so float sums are exact), different on every rank, negative ones included."""
    return ((np.arange(n) * 7 + 13 * rank + 3) % 11 - 5).astype(np.float32)


def _allreduce_body(fn, cases):
    from minidist import dist

    r = dist.get_rank()
    out = []
    for n, op in cases:
        x = _inputs(r, n)
        ret = fn(x, op)
        out.append((x, None if ret is None else np.asarray(ret)))
    return out


def check_all_reduce_rs_ag(fn: Callable[[np.ndarray, ReduceOp], None], world_sizes=(2, 3, 4)) -> None:
    """``fn(x, op)`` must leave on every rank, in ``x``, what ``all_reduce(x, op)`` would, using only
    ``reduce_scatter_tensor`` and ``all_gather_into_tensor``; lengths not divisible by p included."""
    cases = [(12, ReduceOp.SUM), (12, ReduceOp.MAX), (10, ReduceOp.SUM), (5, ReduceOp.MIN)]
    for p in world_sizes:
        res = run_ranks("all_reduce_rs_ag", _allreduce_body, p, args=(fn, cases),
                        hint="reduce_scatter_tensor needs an input of p equal blocks: pad x to a multiple of p "
                             "first (and cut the padding off at the end)")
        names = {e.name for e in res.trace.filter(stream="comm")}
        if any(nm.startswith("all_reduce") for nm in names):
            fail(f"all_reduce_rs_ag on {p} ranks called md.dist.all_reduce", "reduce_scatter + all_gather only",
                 sorted(names), "the point is to build all-reduce from the two halves")
        if not any(nm.startswith("reduce_scatter") for nm in names) or \
                not any(nm.startswith("all_gather") for nm in names):
            fail(f"all_reduce_rs_ag on {p} ranks must use a reduce-scatter and an all-gather",
                 "both reduce_scatter_tensor and all_gather_into_tensor", sorted(names))
        for k, (n, op) in enumerate(cases):
            ins = [_inputs(r, n) for r in range(p)]
            want = [op.ufunc.reduce(np.stack(ins), axis=0)] * p
            got = [res.values[r][k][0] for r in range(p)]
            returned = [res.values[r][k][1] for r in range(p)]

            def diagnose(r, g, w, ins=ins, returned=returned, n=n, p=p):
                ret = returned[r]
                if np.array_equal(g, ins[r]) and ret is not None and ret.shape == w.shape and np.array_equal(ret, w):
                    return "the right result was returned but x is unchanged: write it into x in place (x[...] = ...)"
                if np.array_equal(g, ins[r]):
                    return "x is unchanged: write the result into x in place (x[...] = ...)"
                c = -(-n // p)  # chunk length after padding
                mine = slice(r * c, min(n, (r + 1) * c))
                if np.array_equal(g[mine], w[mine]):
                    return ("only this rank's own chunk is right: after the reduce-scatter, all-gather every "
                            "rank's reduced chunk")
                return None

            compare_ranks("all_reduce_rs_ag", got, want, diagnose=diagnose,
                          context=f"for n={n}, op={op.name} on {p} ranks",
                          hint="rank i must end with the reduction over all ranks of every element; reduce-scatter "
                               "gives rank i block i of it, the all-gather must then share every block")
        # right values are not enough: the two halves must move no more than a ring all-reduce would
        itemsize = np.dtype(np.float32).itemsize
        want_bytes = sum(2 * (p - 1) * -(-n // p) * itemsize for n, _ in cases)
        sent = [sum(e.nbytes for e in res.trace.filter(rank=r, stream="link")) for r in range(p)]
        worst = max(range(p), key=lambda r: sent[r])
        if sent[worst] > want_bytes * (1 + 1e-9):
            fail(f"all_reduce_rs_ag on {p} ranks gives the right values but moves too much data: rank {worst} sent "
                 f"{sent[worst]:,.0f} bytes over the {len(cases)} cases",
                 f"{want_bytes:,} bytes = 2 (p-1)/p of each padded buffer",
                 f"{sent[worst]:,.0f} bytes",
                 "all-gather only this rank's reduced block (ceil(n/p) elements), not the whole x: the reduce-scatter "
                 "has already done the reduction, so nothing is left to combine locally")
    passed(f"all_reduce_rs_ag matches all_reduce on {', '.join(map(str, world_sizes))} ranks "
           f"(SUM, MAX, MIN; lengths 12, 10 and 5, padded when p does not divide them)")


def check_fp_prediction(left: float, right: float) -> None:
    """float32: ``(1e20 + -1e20) + 1`` and ``1e20 + (-1e20 + 1)``."""
    a, b, one = np.float32(1e20), np.float32(-1e20), np.float32(1)
    want_l, want_r = float((a + b) + one), float(a + (b + one))
    if left is Ellipsis or right is Ellipsis:
        raise CheckFailed("fp_prediction: the exercise is not done yet (fill in left and right)")
    left = number("left, (1e20 + -1e20) + 1 in float32", left)
    right = number("right, 1e20 + (-1e20 + 1) in float32", right)
    if left != want_l:
        fail("(1e20 + -1e20) + 1 in float32", want_l, left, "1e20 and -1e20 cancel exactly, then 1 is added to 0")
    if right != want_r:
        fail("1e20 + (-1e20 + 1) in float32", want_r, right,
             f"float32 values near 1e20 are {float(np.spacing(a)):.3g} apart, so -1e20 + 1 rounds back to -1e20")
    passed("(1e20 + -1e20) + 1 = 1 but 1e20 + (-1e20 + 1) = 0 in float32: addition is not associative")
