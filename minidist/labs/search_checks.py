"""Checks for lab 18, configuration search (book chapter 27).

The learner's filters (divisibility, model-state memory, the data-parallel communication ratio) are run on
many layouts and compared with references built on ``md.estimate``; the learner's search runs on a small
space with a counting evaluator, for two values of ``keep``, and must find what the two-level search finds within
the evaluations that search spends.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

from minidist.estimate.memory import model_state_bytes
from minidist.labs.check import attempt, check_cases, fail, passed


def _divisible(tp, cp, pp, dp, heads, layers, gpus, gpus_per_node, global_batch, micro_batch) -> bool:
    return (tp * cp * pp * dp == gpus and heads % tp == 0 and tp * cp <= gpus_per_node and layers % pp == 0
            and global_batch % (dp * micro_batch) == 0)


def check_divisible(fn: Callable[..., bool]) -> None:
    """``fn(tp, cp, pp, dp, heads=, layers=, gpus=, gpus_per_node=, global_batch=, micro_batch=)``."""
    ctx = dict(heads=12, layers=20, gpus=64, gpus_per_node=8, global_batch=96)
    hints = {
        "product": "the degrees must use every GPU exactly: tp x cp x pp x dp = gpus",
        "heads": "tensor parallelism splits the attention heads: heads % tp == 0",
        "node": "tp x cp stay inside one node (NVLink): tp x cp <= gpus_per_node",
        "layers": "every pipeline stage gets the same number of layers: layers % pp == 0",
        "batch": "each data-parallel rank takes whole micro-batches: global_batch % (dp x micro_batch) == 0",
    }
    n = 0
    for tp, cp, pp, dp, mb in itertools.product((1, 2, 3, 4, 8, 16), (1, 2, 4), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16),
                                                (1, 2, 4)):
        want = _divisible(tp, cp, pp, dp, micro_batch=mb, **ctx)
        got = attempt("divisible", functools.partial(fn, micro_batch=mb, **ctx), tp, cp, pp, dp,
                      shown=f"divisible({tp}, {cp}, {pp}, {dp}, micro_batch={mb}, ...)")
        if bool(got) != want:
            if want:  # a filter stricter than the rules: name the rules this layout only just meets
                near = []
                if tp * cp == ctx["gpus_per_node"]:
                    near.append(f"tp x cp = {tp * cp} fills the node exactly, and that is allowed")
                if ctx["heads"] % (tp * cp):
                    near.append("only tp splits the heads (cp splits the sequence)")
                stricter = "one of your conditions is stricter"
                hint = (f"{stricter} than the rules: " + "; or ".join(near) if len(near) > 1 else near[0] if near
                        else f"every constraint holds here: {stricter} than needed")
            elif tp * cp * pp * dp != ctx["gpus"]:
                hint = hints["product"]
            elif ctx["heads"] % tp:
                hint = hints["heads"]
            elif tp * cp > ctx["gpus_per_node"]:
                hint = hints["node"]
            elif ctx["layers"] % pp:
                hint = hints["layers"]
            else:
                hint = hints["batch"]
            fail(f"divisible(tp={tp}, cp={cp}, pp={pp}, dp={dp}, micro_batch={mb}) with {ctx}", want, got, hint)
        n += 1
    passed(f"divisible: {n} layouts")


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


def check_dp_comm_ratio(fn: Callable[[float, float, float], float]) -> None:
    """``fn(tokens_per_gpu, peak_flops, beta)``: data-parallel all-reduce time over compute time, large dp."""
    cases = [((8192.0, 989e12, 50e9), 2 * 989e12 / (3 * 8192 * 50e9), "2 F / (3 T beta)"),
             ((65536.0, 312e12, 25e9), 2 * 312e12 / (3 * 65536 * 25e9), "2 F / (3 T beta)"),
             ((1e6, 1e15, 1e11), 2e15 / (3e6 * 1e11), "2 F / (3 T beta)")]

    def diagnose(args, expected, got):
        t, f, b = args
        if math.isclose(got, f / (3 * t * b), rel_tol=1e-9):
            return "a ring all-reduce moves 2 (p-1)/p ~ 2 times the gradient bytes, and bf16 gradients are 2 bytes"
        if math.isclose(got, 4 * f / (3 * t * b), rel_tol=1e-9) or math.isclose(got, 2 * f / (t * b), rel_tol=1e-9):
            return "compute is 6 Psi FLOPs per token (forward 2, backward 4); communication 2 x 2 Psi bytes"
        return None

    check_cases("dp_comm_ratio", fn, cases, rel=1e-9, diagnose=diagnose)


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
