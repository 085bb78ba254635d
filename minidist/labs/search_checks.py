"""Checks for lab 18, configuration search (book chapter 27).

The learner's filters (divisibility, model-state memory, the data-parallel communication ratio) are run on
many layouts and compared with references built on ``md.estimate``; the learner's search runs on a small
space with a counting evaluator and must find the exhaustive search's best with fewer evaluations.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from minidist.estimate.memory import model_state_bytes
from minidist.labs.check import CheckFailed, check_cases, fail, passed


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
        try:
            got = fn(tp, cp, pp, dp, micro_batch=mb, **ctx)
        except NotImplementedError:
            raise CheckFailed("divisible: the exercise is not done yet (it raised NotImplementedError)") from None
        if bool(got) != want:
            if tp * cp * pp * dp != ctx["gpus"]:
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


def check_search(fn: Callable, candidates: list, key: Callable, representative: Callable, evaluate: Callable) -> None:
    """``fn(candidates, key, representative, evaluate, keep)`` must return the best candidate (what an exhaustive
    search finds) while calling ``evaluate`` on fewer candidates than there are."""
    seen: list = []

    def counting(layout):
        seen.append(layout)
        return evaluate(layout)

    best = min(candidates, key=evaluate)
    try:
        got = fn(candidates, key, representative, counting, 3)
    except NotImplementedError:
        raise CheckFailed("two_level_search: the exercise is not done yet (it raised NotImplementedError)") from None
    if got is None or evaluate(got) != evaluate(best):
        fail("two_level_search did not return the best layout", best, got,
             "rank the groups by their representative's time, then evaluate every candidate of the best `keep`")
    distinct = len({id(x) for x in seen})
    if distinct >= len(candidates):
        fail("two_level_search evaluated every candidate: that is the grid, not a search", f"< {len(candidates)}",
             distinct, "evaluate one representative per group, and all candidates only of the best `keep` groups")
    passed(f"two_level_search: the best of {len(candidates)} layouts after {distinct} evaluations")
