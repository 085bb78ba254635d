"""Checks for lab 24, case studies (book chapters 34-36): the step time a reported throughput implies, the
key-value saving of latent attention and the reach of stacked sliding windows."""

from __future__ import annotations

import math
from collections.abc import Callable

from minidist.labs.check import check_cases


def check_mla_kv_saving(fn: Callable[[int, int, int, int], float]) -> None:
    """``fn(heads, head_dim, latent, rope)``: how many times fewer numbers per token and layer MLA caches than
    multi-head attention (keys and values of every head against one latent plus one decoupled RoPE key)."""
    cases = [((h, d, c, r), 2 * h * d / (c + r), "multi-head attention caches a key and a value per head; MLA caches "
              "the latent and the shared RoPE key")
             for h, d, c, r in ((128, 128, 512, 64), (32, 128, 512, 64), (16, 64, 256, 0), (8, 64, 128, 32))]

    def diagnose(args, expected, got):
        h, d, c, r = args
        if math.isclose(got, h * d / (c + r)):
            return "count both the keys and the values of every head: 2 h d numbers per token"
        if r and math.isclose(got, 2 * h * d / c):
            return "MLA also caches the decoupled RoPE key (d_rope numbers per token), shared by the heads"
        return None

    check_cases("mla_kv_saving", fn, cases, rel=1e-12, diagnose=diagnose)


def check_receptive_field(fn: Callable[[int, int], int]) -> None:
    """``fn(layers, window)``: how many positions (itself included) a token's output can depend on after
    ``layers`` layers of sliding-window attention, each attending to the ``window`` latest positions."""
    cases = [((L, w), L * (w - 1) + 1, "each layer reaches w - 1 positions further back (the window includes the "
              "position itself), and the reaches add up")
             for L, w in ((1, 4), (2, 4), (3, 3), (32, 4096), (4, 1))]

    def diagnose(args, expected, got):
        L, w = args
        if math.isclose(got, L * w):
            return ("the window counts the position itself: one layer reaches w - 1 positions back, so L layers "
                    "reach L (w - 1), plus the position itself")
        if math.isclose(got, w):
            return "the second layer attends to positions that already saw w - 1 positions before them"
        return None

    check_cases("receptive_field", fn, cases, rel=0, diagnose=diagnose)


def check_implied_step(fn: Callable[[float, int, int, int, int, int, float], float]) -> None:
    """``fn(params, layers, hidden, seq, global_batch, gpus, tflops_per_gpu)``: the seconds per step that a reported
    throughput implies, when the throughput counts ``6 N`` FLOPs per token plus attention's ``12 s h L``."""
    def ref(n, L, h, s, b, g, t):
        return (6 * n + 12 * s * h * L) * b * s / (g * t * 1e12)

    rows = ((405e9, 126, 16384, 8192, 2048, 16384, 400), (70e9, 80, 8192, 8192, 1024, 2048, 420),
            (8e9, 32, 4096, 8192, 512, 256, 380), (1e9, 24, 2048, 2048, 256, 8, 150))
    cases = [(r, ref(*r), "the FLOPs of a step, (6 N + 12 s h L) per token times the batch's tokens, shared by every "
              "GPU at the reported rate") for r in rows]

    def diagnose(args, expected, got):
        n, L, h, s, b, g, t = args
        if math.isclose(got, 6 * n * b * s / (g * t * 1e12)):
            return "the reported TFLOP/s count attention too: add 12 s h L FLOPs per token to the 6 N"
        if math.isclose(got, expected * 1e12) or math.isclose(got, expected / 1e12):
            return "TFLOP/s is 1e12 FLOP/s"
        if math.isclose(got, expected / s):
            return "a sequence is seq tokens: the batch holds global_batch x seq tokens"
        return None

    check_cases("implied_step", fn, cases, rel=1e-9, diagnose=diagnose)
