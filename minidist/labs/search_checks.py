"""Checks for lab 18, configuration search (book chapter 27).

The learner's pruning (every layout the hard constraints allow, enumerated on machines the notebook never shows),
model-state memory and the exposed data-parallel communication (the planner's own overlap rule) are compared with
references built on ``md.estimate``'s formulas on unseen cases; the learner's search runs on a small
space with a counting evaluator, for two values of ``keep``, and must find what the two-level search finds within
the evaluations that search spends.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from minidist.estimate.memory import model_state_bytes
from minidist.labs.check import attempt, check_cases, fail, passed


def _divisible(tp, cp, pp, dp, heads, layers, gpus, gpus_per_node, global_batch, micro_batch) -> bool:
    return (tp * cp * pp * dp == gpus and heads % tp == 0 and tp * cp <= gpus_per_node and layers % pp == 0
            and global_batch % (dp * micro_batch) == 0)


def reference_layouts(gpus: int, heads: int, layers: int, gpus_per_node: int, global_batch: int,
                      micro_batches=(1, 2, 4, 8)) -> set[tuple[int, int, int, int, int]]:
    """Every (tp, cp, pp, dp, micro_batch) with tp and cp powers of two, pp from 1 to ``layers``, that the hard
    constraints allow."""
    powers = [2**i for i in range(gpus_per_node.bit_length())]
    out = set()
    for tp, cp, mb in itertools.product(powers, powers, micro_batches):
        for pp in range(1, layers + 1):
            if gpus % (tp * cp * pp):
                continue
            dp = gpus // (tp * cp * pp)
            if _divisible(tp, cp, pp, dp, heads, layers, gpus, gpus_per_node, global_batch, mb):
                out.add((tp, cp, pp, dp, mb))
    return out


def _why_not(layout: tuple, ctx: dict) -> str:
    """The rule a layout breaks, in words."""
    tp, cp, pp, dp, mb = layout
    if tp * cp * pp * dp != ctx["gpus"]:
        return "the degrees must use every GPU exactly once"
    if ctx["heads"] % tp:
        return f"tensor parallelism splits the attention heads, and {ctx['heads']} heads do not split {tp} ways"
    if tp * cp > ctx["gpus_per_node"]:
        return (f"tp x cp = {tp * cp} leaves the node of {ctx['gpus_per_node']} GPUs: both talk inside every layer and "
                "need NVLink")
    if ctx["layers"] % pp:
        return f"{ctx['layers']} layers do not make {pp} equal pipeline stages"
    if ctx["global_batch"] % (dp * mb):
        return (f"{ctx['global_batch']} sequences do not split into whole micro-batches of {mb} on each of {dp} "
                "data-parallel ranks")
    return "it breaks no rule"


_LAYOUT_CASES = [dict(gpus=96, heads=12, layers=20, gpus_per_node=8, global_batch=96),
                 dict(gpus=64, heads=40, layers=36, gpus_per_node=4, global_batch=128),
                 dict(gpus=1024, heads=56, layers=60, gpus_per_node=8, global_batch=1536),
                 dict(gpus=48, heads=32, layers=24, gpus_per_node=16, global_batch=24)]


def check_layouts(fn: Callable[..., list]) -> None:
    """``fn(gpus, heads=, layers=, gpus_per_node=, global_batch=)``: every allowed (tp, cp, pp, dp, micro_batch)."""
    total = 0
    for ctx in _LAYOUT_CASES:
        shown = (f"layouts({ctx['gpus']}, heads={ctx['heads']}, layers={ctx['layers']}, "
                 f"gpus_per_node={ctx['gpus_per_node']}, global_batch={ctx['global_batch']})")
        got = attempt("layouts", lambda c=ctx: fn(c["gpus"], heads=c["heads"], layers=c["layers"],
                                                  gpus_per_node=c["gpus_per_node"],
                                                  global_batch=c["global_batch"]), shown=shown)
        try:
            mine = [tuple(int(x) for x in lay) for lay in got]
        except (TypeError, ValueError):
            fail(shown, "a list of (tp, cp, pp, dp, micro_batch) tuples", got, "return the allowed layouts as tuples")
        if any(len(lay) != 5 for lay in mine):
            fail(shown, "(tp, cp, pp, dp, micro_batch) tuples", mine[:3], "five ints per layout, in that order")
        if len(set(mine)) != len(mine):
            dup = next(lay for lay in mine if mine.count(lay) > 1)
            fail(f"{shown} lists a layout twice", "each layout once", dup, "enumerate each combination once")
        want = reference_layouts(**ctx)
        extra = sorted(set(mine) - want)
        missing = sorted(want - set(mine))
        if extra:
            fail(f"{shown} allows {extra[0]} (tp, cp, pp, dp, micro_batch)", "not allowed", "allowed",
                 _why_not(extra[0], ctx))
        if missing:
            tp, cp, pp, dp, mb = lay = missing[0]
            fills = any(t * c == ctx["gpus_per_node"] for t, c, *_ in mine)
            splits = any(ctx["heads"] % (t * c) for t, c, *_ in mine)
            near = []
            if tp * cp == ctx["gpus_per_node"] and not fills:
                near.append("tp x cp may fill the node exactly")
            if ctx["heads"] % (tp * cp) and not splits:
                near.append("only tp splits the heads (cp splits the sequence)")
            if near:
                hint = "; and ".join(near)
            elif cp > 1 and all(c == 1 for _, c, *_ in mine):
                hint = "context parallelism is a degree too: try every power of two for cp"
            elif pp > 1 and pp not in {p for _, _, p, *_ in mine}:
                hint = f"pipeline degrees are any divisor of the layers, such as {pp}, not only powers of two"
            elif mb not in {m for *_, m in mine}:
                hint = f"try every micro-batch size of 1, 2, 4 and 8 (here {mb})"
            else:
                hint = "this layout meets every rule: one of your conditions is stricter than the rules"
            fail(f"{shown} misses {lay} (tp, cp, pp, dp, micro_batch)", "allowed", "missing", hint)
        total += len(want)
    passed(f"layouts: {len(_LAYOUT_CASES)} machines, {total} allowed layouts found exactly")


def check_state_bytes(fn: Callable[[float, int, int, int, int], float]) -> None:
    """``fn(params, tp, pp, dp, zero_stage)``: weights + gradients + Adam state per GPU in mixed precision."""
    cases = []
    for params, tp, pp, dp, z in [(7e9, 1, 1, 8, 0), (70e9, 8, 4, 16, 1), (405e9, 8, 16, 128, 1), (13e9, 2, 1, 64, 2),
                                  (175e9, 8, 1, 128, 3)]:
        cases.append(((params, tp, pp, dp, z), model_state_bytes(params / (tp * pp), z, dp),
                      "16 bytes per parameter (2 + 2 + 12), the weights split over tp x pp, then ZeRO over dp"))

    def diagnose(args, expected, got):
        params, tp, pp, dp, z = args
        if math.isclose(got * 1e9, expected, rel_tol=1e-9) or math.isclose(got * 2**30, expected, rel_tol=1e-9):
            return "return bytes, not GB or GiB"
        if math.isclose(got, model_state_bytes(params, z, dp), rel_tol=1e-9):
            return "tp and pp each hold a part of the weights: divide the parameters by tp x pp first"
        if math.isclose(got, 16 * params / (tp * pp * dp), rel_tol=1e-9):
            return "ZeRO-1 shards only the optimizer (12 bytes); stage 2 adds the gradients, stage 3 the weights"
        return None

    check_cases("state_bytes", fn, cases, rel=1e-9, diagnose=diagnose)


def reference_dp_exposed(tokens: float, dp: int, peak_flops: float, beta: float, overlap: float) -> float:
    """Exposed gradient all-reduce over compute, per parameter held: 6 T / F of compute, a ring of bf16 gradients
    moving 2 (p - 1) / p x 2 bytes, a share ``overlap`` hidden under the backward (2/3 of the compute) at most."""
    compute = 6 * tokens / peak_flops
    comm = 2 * (dp - 1) / dp * 2 / beta
    return (comm - min(overlap * comm, 2 / 3 * compute)) / compute


def check_dp_exposed(fn: Callable[[float, int, float, float, float], float]) -> None:
    """``fn(tokens_per_replica, dp, peak_flops, beta, overlap)``: the exposed all-reduce time over compute time."""
    rng = np.random.default_rng(27)
    cases = []
    for dp, overlap, tokens in ((8, 0.8, 65536.0), (64, 0.8, 4096.0), (512, 0.5, 2048.0), (2, 0.0, 4096.0),
                                (3, 1.0, 1024.0), (1024, 0.9, 262144.0)):
        peak, beta = float(rng.uniform(100e12, 2000e12)), float(rng.uniform(10e9, 100e9))
        cases.append(((tokens, dp, peak, beta, overlap), reference_dp_exposed(tokens, dp, peak, beta, overlap),
                      "compute per parameter held, the ring's traffic per parameter held, then what overlap hides"))

    def diagnose(args, expected, got):
        t, p, f, b, o = args
        compute, ring = 6 * t / f, 2 * (p - 1) / p * 2 / b
        slips = [
            ((4 / b - min(o * 4 / b, 2 / 3 * compute)) / compute,
             "a ring all-reduce over p ranks sends each GPU's share p - 1 times in each of its two phases, not p"),
            (ring * (1 - o) / compute, "overlap can hide the all-reduce only while the backward runs: never more "
                                       "than the backward's time"),
            ((ring - min(o * ring, compute)) / compute, "only the backward produces gradients to reduce: the forward "
                                                        "third of the compute cannot hide them"),
            (ring / compute, "a share `overlap` of the all-reduce runs under the backward pass"),
            ((2 * ring - min(o * 2 * ring, 2 / 3 * compute)) / compute, "bf16 gradients are 2 bytes each"),
            ((ring - min(o * ring, 2 / 3 * 2 * t / f)) / compute,
             "the backward is two thirds of the compute (4 of the 6 FLOPs per parameter and token)"),
        ]
        for value, hint in slips:
            if math.isclose(got, value, rel_tol=1e-6):
                return hint
        return None

    check_cases("dp_exposed", fn, cases, rel=1e-9, diagnose=diagnose)


def _short(c) -> str:
    """A layout as its degrees and tuning knobs; anything else as a short repr."""
    if all(hasattr(c, f) for f in ("dp", "tp", "cp", "pp", "zero_stage", "microbatches", "schedule", "recompute")):
        pipe = f" m{c.microbatches} {c.schedule}" if c.pp > 1 else ""
        return (f"dp{c.dp} tp{c.tp} cp{c.cp} pp{c.pp} ZeRO-{c.zero_stage}{pipe}"
                f"{' recompute' if c.recompute else ''}")
    text = repr(c)
    return text if len(text) <= 80 else text[:77] + "..."


def _two_level_reference(candidates: list, key: Callable, representative: Callable, evaluate: Callable,
                         keep: int) -> tuple[int, float, object]:
    """(evaluation budget, best acceptable time, the worst acceptable answer) of the two-level search with ``keep``
    families.

    The budget is one representative per family plus every member of the ``keep`` best families, as the lab's own
    search spends it. Families whose representatives tie at the cut may go either way: all of them count towards the
    budget, and the answer may come from any choice among them.
    """
    groups: dict = {}
    for c in candidates:
        groups.setdefault(key(c), []).append(c)
    score = {k: evaluate(representative(g)) for k, g in groups.items()}
    cut = sorted(score.values())[min(keep, len(score)) - 1]
    better = [k for k in groups if score[k] < cut]
    tied = sorted((k for k in groups if score[k] == cut), key=lambda k: min(map(evaluate, groups[k])))
    budget = len(groups) + sum(len(groups[k]) for k in better + tied)

    def best_of(ks: list):
        return min((c for k in ks for c in groups[k]), key=evaluate)

    need = keep - len(better)
    return budget, evaluate(best_of(better + tied)), best_of(better + tied[len(tied) - need:])


def _counting(evaluate: Callable, seen: list) -> Callable:
    def counting(layout):
        seen.append(layout)
        return evaluate(layout)

    return counting


def check_search(fn: Callable, candidates: list, key: Callable, representative: Callable, evaluate: Callable) -> None:
    """``fn(candidates, key, representative, evaluate, keep)`` must return what a two-level search with ``keep``
    families finds, calling ``evaluate`` on no more candidates than that search does. Run with keep = 1 and 3."""
    for keep in (1, 3):
        seen: list = []
        counting = _counting(evaluate, seen)
        budget, lowest, want = _two_level_reference(candidates, key, representative, evaluate, keep)
        got = attempt("two_level_search", fn, candidates, key, representative, counting, keep,
                      shown=f"two_level_search(candidates, key, representative, evaluate, keep={keep})")
        name = f"two_level_search(keep={keep})"
        if got is None or not any(got is c or got == c for c in candidates):
            fail(f"{name} did not return a candidate", "one of the candidates", _short(got),
                 "return the best candidate itself, not its time or its family's key")
        distinct = len({id(x) for x in seen})
        if distinct >= len(candidates):
            fail(f"{name} evaluated every candidate: that is the grid, not a search", f"at most {budget}", distinct,
                 "evaluate one representative per family, and all candidates only of the best `keep` families")
        if distinct > budget:
            fail(f"{name} evaluated {distinct} of {len(candidates)} candidates", f"at most {budget}", distinct,
                 "one evaluation per family (its representative), then only the members of the best `keep` "
                 f"families (here {keep})")
        if not lowest <= evaluate(got) <= evaluate(want):
            fail(f"{name} did not return the best candidate of the {keep} most promising "
                 f"famil{'y' if keep == 1 else 'ies'}",
                 f"{_short(want)} ({evaluate(want):.4g})", f"{_short(got)} ({evaluate(got):.4g})",
                 "rank the families by their representative's time, then take the fastest of all members of the "
                 "best `keep`")
        if keep == 3:
            passed(f"two_level_search: the best of {len(candidates)} layouts after {distinct} evaluations "
                   f"(at most {budget} allowed), keep = 1 checked too")
