"""Checks for lab 13, the memory equation and ZeRO (book chapters 19-20).

The learner's per-GPU model-state formula is compared with ``md.estimate.model_state_breakdown`` for
mixed precision (2 + 2 + 12 bytes) and for the package's float64 AdamW (8 + 8 + 16); a wrong answer
is matched against every other choice of which terms are sharded, so the hint can say "stage 2
shards the gradients, not the weights". The smallest GPU count and the bytes sent per step are
checked against the closed forms, with the book's worked example among the cases.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, attempt, check_cases, close, fail, learner_name, number, passed

TERMS = ("weights", "gradients", "optimizer state")


def _state(psi, p, sharded, sizes) -> float:
    return sum(psi * s / (p if sh else 1) for s, sh in zip(sizes, sharded))


def _ref_state(psi, stage, p, w, g, o) -> float:
    from minidist.estimate import model_state_breakdown

    return sum(model_state_breakdown(psi, stage, p, w, g, o).values())


def check_model_state_bytes(fn: Callable[..., float]) -> None:
    """``fn(psi, stage, p, w_bytes, g_bytes, o_bytes)``: bytes of weights + gradients + optimizer state per GPU."""
    cases = [(13e9, 0, 8, 2, 2, 12), (13e9, 1, 8, 2, 2, 12), (13e9, 2, 8, 2, 2, 12), (13e9, 3, 32, 2, 2, 12),
             (7e9, 1, 64, 2, 2, 12), (7e9, 2, 4, 2, 2, 12), (7e9, 3, 6, 2, 2, 12),
             (1000, 1, 4, 8, 8, 16), (1000, 2, 4, 8, 8, 16), (1000, 3, 2, 8, 8, 16), (1000, 0, 4, 8, 8, 16),
             (7e9, 2, 8, 2, 4, 12), (7e9, 3, 8, 2, 4, 12)]  # fp32 gradients beside bf16 weights: w != g
    truth = {0: (False, False, False), 1: (False, False, True), 2: (False, True, True), 3: (True, True, True)}
    for args in cases:
        psi, stage, p, w, g, o = args
        want = _ref_state(*args)
        got = attempt("model_state_bytes", fn, *args)
        if got is None:
            fail(f"model_state_bytes{args}", want, got, "did you forget to `return` the value?")
        if math.isclose(float(got), want, rel_tol=1e-9):
            continue
        hint = ("stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the weights; "
                "a sharded term is divided by p")
        for sharded in itertools.product((False, True), repeat=3):
            if math.isclose(float(got), _state(psi, p, sharded, (w, g, o)), rel_tol=1e-9):
                wrong = [f"{t} {'sharded' if s else 'replicated'} (should be {'sharded' if t_ else 'replicated'})"
                         for t, s, t_ in zip(TERMS, sharded, truth[stage]) if s != t_]
                hint = f"at stage {stage}: " + ", ".join(wrong) + "; " + hint
                break
        else:
            if math.isclose(float(got), _ref_state(psi, stage, p, 2, 2, 12), rel_tol=1e-9):
                hint = "use the byte sizes passed in (w_bytes, g_bytes, o_bytes), not 2, 2 and 12"
        fail(f"model_state_bytes(psi={psi:g}, stage={stage}, p={p}, w={w}, g={g}, o={o}) is wrong",
             want, got, hint)
    passed("model_state_bytes matches the ZeRO formulas for stages 0-3 (16 bytes and float64's 32 bytes)")


def _ref_min_gpus(psi, stage, hbm):
    """Smallest p with 16-byte model state fitting in hbm, or None (a float tolerance guards exact fits)."""
    fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
    sharded = 16 * psi - fixed
    if sharded == 0:  # stage 0: nothing to divide
        return 1 if fixed <= hbm else None
    if fixed >= hbm:
        return None
    return max(1, math.ceil(sharded / (hbm - fixed) - 1e-9))


def check_min_gpus(fn: Callable[[float, int, float], int | None]) -> None:
    """``fn(psi, stage, hbm_bytes)``: fewest GPUs whose 16-byte model state per GPU fits in ``hbm_bytes``; None if
    no number of GPUs is enough."""
    cases = [(13e9, 0, 80e9), (13e9, 1, 80e9), (13e9, 2, 80e9), (13e9, 3, 80e9), (70e9, 1, 80e9),
             (70e9, 2, 80e9), (70e9, 3, 80e9), (1e9, 0, 80e9), (1e9, 3, 80e9), (175e9, 2, 80e9), (5e9, 3, 80e9),
             (30e9, 2, 80e9)]
    for psi, stage, hbm in cases:
        want = _ref_min_gpus(psi, stage, hbm)
        try:
            got = fn(psi, stage, hbm)
        except NotImplementedError:
            raise CheckFailed("min_gpus: the exercise is not done yet (it raised NotImplementedError)") from None
        except ZeroDivisionError as e:
            raise CheckFailed(f"min_gpus({psi:g}, {stage}, {hbm:g}) raised ZeroDivisionError: {e}\n  hint: when "
                              "the replicated part alone fills the GPU, no p helps: return None") from None
        if got == want and (got is None or isinstance(got, numbers.Integral) or float(got).is_integer()):
            continue
        fixed = {0: 16, 1: 4, 2: 2, 3: 0}[stage] * psi
        hint = "solve fixed + sharded / p <= hbm for the smallest whole p"
        if want is None:
            hint = (f"the replicated part alone is {fixed / 1e9:g} GB, already more than {hbm / 1e9:g} GB: no number "
                    "of GPUs helps, return None")
        elif want == 1 and got != 1:
            hint = "when one GPU is enough, the answer is 1"
        elif isinstance(got, (int, float)) and want is not None and got == want - 1:
            hint = "round up, not down: with one GPU fewer the state does not fit"
        elif isinstance(got, float) and not float(got).is_integer():
            hint = "a number of GPUs is a whole number: round up"
        fail(f"min_gpus(psi={psi:g}, stage={stage}, hbm={hbm:g})", want, got, hint)
    passed("min_gpus finds the fewest GPUs for every stage (and None when sharding cannot help)")


def check_zero_comm_bytes(fn: Callable[[float, int, int, float], float]) -> None:
    """``fn(psi, p, stage, s)``: bytes each GPU sends per step (ring collectives), ``s`` bytes per element."""
    from minidist.estimate import zero_comm_bytes

    cases = [((7e9, 8, 0, 2), zero_comm_bytes(7e9, 8, 0, 2), "plain DP: one ring all-reduce of the gradients"),
             ((7e9, 8, 1, 2), zero_comm_bytes(7e9, 8, 1, 2), "reduce-scatter + all-gather"),
             ((7e9, 8, 2, 2), zero_comm_bytes(7e9, 8, 2, 2), "reduce-scatter + all-gather"),
             ((7e9, 8, 3, 2), zero_comm_bytes(7e9, 8, 3, 2), "two all-gathers and a reduce-scatter"),
             ((1e6, 4, 3, 8), zero_comm_bytes(1e6, 4, 3, 8), "float64"),
             ((1e6, 2, 1, 8), zero_comm_bytes(1e6, 2, 1, 8), "float64")]

    def diagnose(args, want, got):
        psi, p, stage, s = args
        dp = zero_comm_bytes(psi, p, 0, s)
        if stage in (1, 2) and math.isclose(got, 1.5 * dp, rel_tol=1e-9):
            return ("stages 1 and 2 replace the all-reduce by a reduce-scatter (gradients) and an all-gather "
                    "(updated weights): a ring all-reduce is exactly those two, so the bytes are those of DP")
        if stage == 3 and math.isclose(got, dp, rel_tol=1e-9):
            return ("stage 3 gathers each layer's weights twice (forward and backward) and reduce-scatters its "
                    "gradients: three passes of (p-1)/p Psi s")
        if math.isclose(got, want * p / (p - 1), rel_tol=1e-9):
            return "a ring pass sends (p-1)/p of the buffer per GPU, not all of it"
        if math.isclose(got, want / s, rel_tol=1e-9):
            return "multiply the element count by s bytes"
        return None

    check_cases("zero_comm_bytes", fn, cases, diagnose=diagnose)


def _zero3_forward(compute, gather, prefetch: int, *, serial: bool = True, window: bool = True) -> float:
    """The reference (a flag off gives a usual mistake): layer i's all-gather is issued at the start (i <= prefetch)
    or when layer i - prefetch - 1 has finished (its slot in the window of gathered layers frees), runs on the one
    communication stream, and layer i computes once its weights are there and layer i - 1 is done."""
    comm_free, prev_end, done = 0.0, 0.0, []
    for i, (c, g) in enumerate(zip(compute, gather)):
        issue = 0.0 if (i <= prefetch or not window) else done[i - prefetch - 1]
        arrived = (max(comm_free, issue) if serial else issue) + g
        comm_free = arrived
        prev_end = max(prev_end, arrived) + c
        done.append(prev_end)
    return prev_end


def check_zero3_forward(fn: Callable) -> None:
    """``fn(compute, gather, prefetch)``: the forward time of ZeRO-3 with all-gathers issued ``prefetch`` ahead."""
    rng = np.random.default_rng(13)
    cases = [([1.0] * 4, [1.0] * 4, 0), ([1.0] * 4, [0.5] * 4, 1), ([2.0, 1.0, 3.0], [1.5, 1.5, 1.5], 1)]
    for L, k in [(6, 0), (7, 1), (8, 2), (5, 3), (9, 1)]:
        cases.append((rng.uniform(0.2, 2.0, L).round(3).tolist(), rng.uniform(0.2, 2.0, L).round(3).tolist(), k))
    name = learner_name(fn, "zero3_forward")
    for compute, gather, k in cases:
        call = f"{name}(compute={compute}, gather={gather}, prefetch={k})"
        got = number(f"{call}: expected a number", attempt(name, fn, list(compute), list(gather), k, shown=call))
        want = _zero3_forward(compute, gather, k)
        if close(got, want, rel=1e-9):
            continue
        hint = ("walk the layers in order: a layer computes when its weights have arrived and the layer before has "
                "finished; its all-gather is issued either at the start or when a slot of the window frees")
        if close(got, sum(compute) + sum(gather)):
            hint = "that is every gather waited for in full: with prefetch, a gather runs while earlier layers compute"
        elif close(got, _zero3_forward(compute, gather, k, serial=False)):
            hint = "the all-gathers share one communication stream: a gather cannot start before the previous one ends"
        elif close(got, _zero3_forward(compute, gather, k, window=False)):
            hint = ("the gathered layers must fit in a window of prefetch + 1: layer i's gather waits for layer "
                    "i - prefetch - 1 to finish and release its weights")
        elif close(got, _zero3_forward(compute, gather, k + 1)) or (k and close(got, _zero3_forward(compute,
                                                                                                   gather, k - 1))):
            hint = "count the window again: with prefetch 0 a layer's gather starts only when the layer before is done"
        fail(f"{call} is wrong", want, got, hint)
    passed(f"{name}: {len(cases)} forwards, uneven layers and prefetch depths 0-3")
