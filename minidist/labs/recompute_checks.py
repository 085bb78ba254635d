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

from minidist.labs.check import attempt, check_cases, fail, passed


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
