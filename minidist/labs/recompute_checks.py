"""Checks for lab 14, activation recomputation and offloading (book chapters 21-22).

Activation memory with a checkpoint every k layers is checked against
``md.estimate.checkpointed_activation_bytes``, where a kept checkpoint is one layer's *input*, not a
whole layer's activations. The best interval is checked by the memory it gives, so any minimiser is
accepted; answering sqrt(L) when inputs are much smaller than a layer gets its own hint. The
offloading overlap condition is checked against its closed form.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

from minidist.labs.check import attempt, check_cases, fail, learner_name, passed


def _ref_bytes(L, k, layer_bytes, input_bytes):
    from minidist.estimate import checkpointed_activation_bytes

    return checkpointed_activation_bytes(L, layer_bytes, k, input_bytes)


def check_checkpointed_bytes(fn: Callable[[int, int, float, float], float]) -> None:
    """``fn(L, k, layer_bytes, input_bytes)``: peak activation bytes with a checkpoint every k layers."""
    cases = [((32, 1, 3.8e9, 6.7e7), "full recomputation: every layer input kept, one layer rebuilt at a time"),
             ((32, 4, 3.8e9, 6.7e7), "8 segments of 4 layers"),
             ((9, 3, 1e6, 1e6), "the book's picture: a checkpoint as big as a layer"),
             ((10, 3, 1e6, 2e4), "4 segments (the last one has a single layer): round L/k up"),
             ((8, 8, 5e5, 1e4), "one segment: only the first input is kept, and all 8 layers are rebuilt")]

    def diagnose(args, want, got):
        L, k, m, b = args
        if math.isclose(got, (L // k) * b + k * m, rel_tol=1e-9):
            return "when k does not divide L there are ceil(L/k) segments, each keeping its input"
        if math.isclose(got, math.ceil(L / k) * m + k * m, rel_tol=1e-9) or \
                math.isclose(got, (L / k) * m + k * m, rel_tol=1e-9):
            return "a checkpoint keeps only the segment's input (input_bytes), not a whole layer's activations"
        if math.isclose(got, math.ceil(L / k) * b, rel_tol=1e-9):
            return "during the backward one segment is rebuilt: add its k layers of activations"
        if math.isclose(got, L * m, rel_tol=1e-9):
            return "that is the memory without checkpointing"
        return None

    check_cases("checkpointed_bytes", fn, [(a, _ref_bytes(*a), h) for a, h in cases], diagnose=diagnose)


def check_best_interval(fn: Callable[[int, float, float], int]) -> None:
    """``fn(L, layer_bytes, input_bytes)``: a k in 1..L with the least checkpointed activation memory."""
    cases = [(9, 1e6, 1e6), (32, 3.8e9, 3.8e9), (100, 1.0, 1.0), (32, 3.8e9, 6.7e7), (9, 1.28e6, 3.3e4),
             (64, 1e6, 2.5e5), (48, 1e6, 1.2e5)]
    for L, m, b in cases:
        k = attempt("best_interval", fn, L, m, b)
        best = min(_ref_bytes(L, j, m, b) for j in range(1, L + 1))
        if isinstance(k, bool) or not (isinstance(k, numbers.Integral) or (isinstance(k, float) and k.is_integer())):
            fail(f"best_interval({L}, {m:g}, {b:g}) must return a whole number of layers", "an int in 1..L", k,
                 "a checkpoint interval is a number of layers")
        k = int(k)
        if not 1 <= k <= L:
            fail(f"best_interval({L}, {m:g}, {b:g}) is outside 1..L", f"1..{L}", k)
        got = _ref_bytes(L, k, m, b)
        if not math.isclose(got, best, rel_tol=1e-12):
            hint = "evaluate ceil(L/k) input_bytes + k layer_bytes for every k and keep the smallest"
            if k in (math.isqrt(L), round(math.sqrt(L)), math.ceil(math.sqrt(L))) and b < m:
                hint = (f"sqrt(L) is optimal only when a checkpoint costs as much as a layer; here an input is "
                        f"{m / b:.0f} times smaller than a layer, so the optimum moves to smaller k; " + hint)
            fail(f"best_interval({L}, layer_bytes={m:g}, input_bytes={b:g}) gives {got:g} bytes",
                 f"a k reaching {best:g} bytes", k, hint)
    passed("best_interval finds the least memory, with checkpoints as big as a layer and much smaller")


def check_overlap_tokens(fn: Callable[[float, float], float]) -> None:
    """``fn(peak_flops, link_bw)``: tokens per micro-batch above which a layer's compute hides its weight transfer."""
    cases = [((312e12, 32e9), 312e12 / 32e9, "A100 on a 32 GB/s link (the book's PCIe figure)"),
             ((989e12, 32e9), 989e12 / 32e9, "H100 behind the same 32 GB/s link"),
             ((989e12, 7e9), 989e12 / 7e9, "H100 reading from NVMe (7 GB/s)")]

    def diagnose(args, want, got):
        f, b = args
        if got in (math.ceil(want), math.floor(want)):
            return "return the threshold itself, a real number: the cells below compare it, unrounded"
        if math.isclose(got, b / f, rel_tol=1e-9):
            return "upside down: a faster link (larger bandwidth) must lower the threshold"
        for factor in (2, 3, 12, 24):
            if math.isclose(got, want * factor, rel_tol=1e-9) or math.isclose(got, want / factor, rel_tol=1e-9):
                return ("a layer moves 24 h^2 bytes (12 h^2 bf16 weights) and computes 24 B S h^2 FLOPs (forward): "
                        "the 24 h^2 cancels")
        return None

    check_cases("overlap_tokens", fn, cases, diagnose=diagnose)


def _exact_peak(L: int, k: int, layer_bytes: float, input_bytes: float) -> float:
    """The backward rebuilds segment j (last first) holding inputs 0..j and j's layers: the largest such sum."""
    n = math.ceil(L / k)
    return max((j + 1) * input_bytes + min(k, L - j * k) * layer_bytes for j in range(n))


def check_exact_peak(fn: Callable[[int, int, float, float], float]) -> None:
    """``fn(L, k, layer_bytes, input_bytes)``: the peak the backward really reaches, segment by segment."""
    cases = [(12, 4, 1e6, 1e5), (10, 3, 1e6, 2e4), (10, 4, 5e5, 4e5), (7, 7, 1e6, 1e5), (11, 1, 1e6, 1e5),
             (13, 5, 2e5, 3e5), (17, 6, 1e6, 9e5), (5, 2, 1e6, 1e6), (30, 7, 3.8e9, 6.7e7)]
    name = learner_name(fn, "exact_peak")
    for L, k, lb, ib in cases:
        got = attempt(name, fn, L, k, lb, ib)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(f"{name}{(L, k, lb, ib)}: expected a number", "bytes", got)
        want = _exact_peak(L, k, lb, ib)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        hint = ("walk the backward: it rebuilds the segments from the last to the first; while segment j is rebuilt, "
                "which inputs are still kept, and how many layers does that segment have?")
        if math.isclose(got, _ref_bytes(L, k, lb, ib), rel_tol=1e-9):
            hint = ("that is M(k), an upper bound: when the last segment is shorter, the backward handles it first "
                    "and releases its input before any full segment is rebuilt")
        elif math.isclose(got, want - ib, rel_tol=1e-9):
            hint = "while a segment is rebuilt, its own kept input is still alive (it is what the rebuild starts from)"
        fail(f"{name}{(L, k, lb, ib)} is wrong", want, got, hint)
    passed(f"{name}: {len(cases)} stacks, with and without a shorter last segment")


def _best_plan(ops: list[tuple[str, float, float]], need: float) -> tuple[float, float]:
    """(least extra FLOPs, bytes freed by such a set) over every subset freeing at least ``need`` bytes."""
    best = (math.inf, 0.0)
    for mask in range(1 << len(ops)):
        chosen = [op for i, op in enumerate(ops) if mask >> i & 1]
        freed, cost = sum(o[1] for o in chosen), sum(o[2] for o in chosen)
        if freed >= need and cost < best[0]:
            best = (cost, freed)
    return best


def check_plan_recompute(fn: Callable[[list, float], list]) -> None:
    """``fn(ops, need)``: names of the saved tensors to drop and rebuild, freeing >= ``need`` bytes at least cost."""
    import numpy as np

    rng = np.random.default_rng(21)
    # greedy by bytes per FLOP takes x then y (3 FLOPs); y alone (2) is enough
    cases = [([("x", 9.0, 1.0), ("y", 10.0, 2.0), ("z", 1.0, 0.5)], 10.0),
             ([("u", 4.0, 4.0), ("v", 3.0, 1.0), ("w", 3.0, 1.0)], 6.0)]
    for n in (5, 7, 9, 11):
        ops = [(f"t{i}", float(rng.integers(1, 40)), float(rng.integers(0, 30))) for i in range(n)]
        cases.append((ops, 0.6 * sum(o[1] for o in ops)))
    cases.append(([("p", 5.0, 2.0), ("q", 5.0, 2.0)], 11.0))  # impossible: nothing frees enough
    name = learner_name(fn, "plan_recompute")
    for ops, need in cases:
        call = f"{name}(<{len(ops)} tensors>, need={need:g})"
        got = attempt(name, fn, list(ops), need, shown=call)
        best_cost, _ = _best_plan(ops, need)
        if best_cost == math.inf:
            if got is not None:
                fail(f"{call}: no set of tensors frees {need:g} bytes", None, got,
                     "when even dropping everything is not enough, return None")
            continue
        if got is None or isinstance(got, str) or not all(isinstance(x, str) for x in got):
            fail(f"{call} must return a list of tensor names", "e.g. ['t0', 't3']", got)
        known = {o[0]: o for o in ops}
        unknown = [x for x in got if x not in known]
        if unknown or len(set(got)) != len(got):
            fail(f"{call}: each name once, from the list given", sorted(known), list(got))
        freed, cost = sum(known[x][1] for x in got), sum(known[x][2] for x in got)
        if freed < need:
            fail(f"{call} frees too little", f">= {need:g} bytes", f"{freed:g} bytes",
                 "the plan must free at least `need` bytes")
        if cost > best_cost + 1e-9:
            fail(f"{call} costs more than it must", f"{best_cost:g} extra FLOPs", f"{cost:g}",
                 "ranking tensors by bytes per FLOP can miss the cheapest set (a cheap tensor may make a costly "
                 "one unnecessary): compare whole sets, there are few enough tensors")
    passed(f"{name}: {len(cases)} layers, every plan frees enough at the least recompute cost")
