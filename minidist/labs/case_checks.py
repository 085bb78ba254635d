"""Checks for lab 24, case studies (book chapters 34-36): the step time a reported throughput implies, the memory
of serving a model (weights plus a key-value cache under multi-head, grouped-query or latent attention), and the
reach of stacked attention windows.

Each check draws its cases from a fixed seed (models and contexts the notebook never prints) and recognises the
usual slips: a cache that forgets the values, a latent counted twice, only the active experts held, a window that
counts the position itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, number, passed

# --- the step a reported throughput implies -------------------------------------------------------------------


def check_implied_step(fn: Callable[[float, int, int, int, int, int, float], float]) -> None:
    """``fn(params, layers, hidden, seq, global_batch, gpus, tflops_per_gpu)``: the seconds per step that a reported
    throughput implies, when the throughput counts ``6 N`` FLOPs per token plus attention's ``12 s h L``."""
    def ref(n, L, h, s, b, g, t):
        return (6 * n + 12 * s * h * L) * b * s / (g * t * 1e12)

    rows = ((70e9, 80, 8192, 8192, 1024, 2048, 420), (8e9, 32, 4096, 8192, 512, 256, 380),
            (1e9, 24, 2048, 2048, 256, 8, 150), (175e9, 96, 12288, 2048, 1536, 1536, 163))
    cases = [(r, ref(*r), "the FLOPs of a step (the parameters' and attention's, per token, times the batch's "
              "tokens) shared by every GPU at the reported rate") for r in rows]

    def diagnose(args, expected, got):
        n, L, h, s, b, g, t = args
        if math.isclose(got, 6 * n * b * s / (g * t * 1e12)):
            return "the reported TFLOP/s count attention's score products too, not only the 6 N of the weights"
        if math.isclose(got, expected * 1e12) or math.isclose(got, expected / 1e12):
            return "TFLOP/s is 1e12 FLOP/s"
        if math.isclose(got, expected / s):
            return "a sequence is seq tokens: the batch holds global_batch x seq tokens"
        return None

    check_cases("implied_step", fn, cases, rel=1e-9, diagnose=diagnose)


# --- serving memory: weights and the key-value cache ---------------------------------------------------------


def _serving_ref(m, context: int, batch: int, weight_bytes: float = 2, cache_bytes: float = 2) -> float:
    per = m.mla_latent + (m.mla_rope or 0) if m.mla_latent else 2 * m.kv_heads * m.head_dim
    return m.params * weight_bytes + batch * context * m.layers * per * cache_bytes


def _serving_cases() -> list[tuple]:
    """Variants of the named models that none of them is (drawn from a fixed seed): each attention kind (multi-head,
    grouped-query, latent), dense and mixture-of-experts, with (context, batch, weight_bytes, cache_bytes)."""
    from dataclasses import replace

    from minidist.estimate import model

    rng = np.random.default_rng(24)
    out = []
    for name in ("gpt3_175b", "llama3_70b", "deepseek_v3", "mixtral_8x22b", "chinchilla_70b", "deepseek_v3",
                 "llama3_8b", "mixtral_8x7b"):
        m = model(name)
        heads = int(rng.choice([32, 48, 64]))
        changes = dict(name=f"{name}-variant", layers=int(rng.integers(20, 100)), heads=heads,
                       hidden=heads * int(rng.choice([64, 96, 128])), params=float(rng.integers(5, 900)) * 1e9)
        if m.kv_heads != m.heads and not m.mla_latent:  # grouped-query: fewer key-value heads than heads
            changes["kv_heads"] = heads // int(rng.choice([4, 8]))
        else:
            changes["kv_heads"] = heads
        if m.mla_latent:
            changes.update(mla_latent=int(rng.choice([256, 384, 512])), mla_rope=int(rng.choice([32, 64])))
        changes["active_params"] = changes["params"] * (float(rng.uniform(0.05, 0.3)) if m.is_moe else 1.0)
        out.append((replace(m, **changes), int(rng.integers(1, 64)) * 1024, int(rng.integers(1, 33)),
                    float(rng.choice([1, 2])), float(rng.choice([1, 2]))))
    return out


def _serving_diagnose(m, context, batch, wb, cb, expected, got) -> str | None:
    weights = m.params * wb
    kv = expected - weights
    if math.isclose(got, m.active_params * wb + kv) and m.is_moe:
        return ("every expert's weights must be in memory: a token uses top_k of them, but the next token may be "
                "routed to any other")
    if math.isclose(got, weights):
        return "the key-value cache of the batch's sequences comes on top of the weights"
    if math.isclose(got, kv):
        return "the weights are held too: params x weight_bytes"
    if math.isclose(got, weights + kv / batch):
        return "each sequence of the batch keeps its own cache"
    if not m.mla_latent and math.isclose(got, weights + kv / 2):
        return "every cached head keeps a key AND a value for each position"
    if not m.mla_latent and m.kv_heads != m.heads and math.isclose(got, weights + kv * m.heads / m.kv_heads):
        return ("grouped-query attention caches only the key-value heads (kv_heads); the query heads of a group "
                "share them")
    if m.mla_latent:
        per = m.mla_latent + (m.mla_rope or 0)
        if math.isclose(got, weights + 2 * kv):
            return ("latent attention caches one compressed latent per position, from which the keys AND the values "
                    "are rebuilt: it is not doubled")
        if m.mla_rope and math.isclose(got, weights + kv * m.mla_latent / per):
            return "latent attention also caches the decoupled rotary key (mla_rope numbers, one shared by the heads)"
        if math.isclose(got, weights + kv * 2 * m.kv_heads * m.head_dim / per):
            return "that is multi-head attention's cache: a latent-attention model (mla_latent set) keeps the latent"
    if math.isclose(got, weights + kv / m.layers):
        return "every layer keeps its own cache"
    if math.isclose(got, weights + kv / cb) and cb != 1:
        return "the cache is in bytes too: multiply by cache_bytes"
    return None


def check_serving_memory(fn: Callable[..., float]) -> None:
    """``fn(m, context, batch, weight_bytes=2, cache_bytes=2)``: the bytes a model of ``md.estimate.model`` needs to
    serve ``batch`` sequences of ``context`` tokens: its weights plus every sequence's key-value cache, under
    multi-head (``kv_heads == heads``), grouped-query (fewer ``kv_heads``) or latent attention (``mla_latent``, with
    the decoupled rotary key of ``mla_rope`` numbers)."""
    n = 0
    for m, context, batch, wb, cb in _serving_cases():
        kind = "latent" if m.mla_latent else "multi-head" if m.kv_heads == m.heads else "grouped-query"
        shown = (f"serving_memory(<{kind} attention, {'MoE, ' if m.is_moe else ''}{m.layers} layers, heads "
                 f"{m.heads}, kv_heads {m.kv_heads}, head_dim {m.head_dim}"
                 + (f", mla_latent {m.mla_latent}, mla_rope {m.mla_rope}" if m.mla_latent else "")
                 + f", params {m.params:.3g}>, context={context}, batch={batch}, weight_bytes={wb:g}, "
                   f"cache_bytes={cb:g})")
        expected = _serving_ref(m, context, batch, wb, cb)
        got = number(f"{shown}: expected a number", attempt("serving_memory", fn, m, context, batch, wb, cb,
                                                            shown=shown))
        if not math.isclose(got, expected, rel_tol=1e-9):
            fail(f"{shown} is wrong", expected, got,
                 _serving_diagnose(m, context, batch, wb, cb, expected, got)
                 or "the weights, plus what one position leaves in one layer's cache (it depends on the kind of "
                    "attention) for every position, layer and sequence")
        n += 1
    passed(f"serving_memory: {n} models (multi-head, grouped-query and latent attention)")


# --- the reach of stacked windows -----------------------------------------------------------------------------


def _reach_ref(windows, context):
    if any(w is None for w in windows):
        return context
    return min(context, 1 + sum(w - 1 for w in windows))


def check_receptive_field(fn: Callable[[list, int], int]) -> None:
    """``fn(windows, context)``: how many positions (itself included) the last token of a ``context``-token sequence
    can depend on after layers whose windows are ``windows`` (``None``: full causal attention), a window of ``w``
    letting position ``i`` attend to ``i - w + 1`` ... ``i``."""
    rng = np.random.default_rng(36)
    mixed = [int(w) for w in rng.choice([3, 5, 9, 17, 33], size=7)]
    cases = [([4, 4], 100), ([6, 6, 6], 1000), (mixed, 10_000), ([1, 1, 1], 50), ([7], 3), ([5, 5, 5, 5, 5], 12),
             ([9, None, 9], 500), ([None], 64), ([2, 3, 4, 5], 1000)]
    full = [((list(w), c), _reach_ref(w, c), "each layer lets a position look a little further back than the "
             "positions it attends to could, and the sequence has a start") for w, c in cases]

    def diagnose(args, expected, got):
        windows, context = args
        if None in windows:
            return ("a layer of full causal attention lets the last token attend to every earlier position: nothing "
                    "before it in the sequence is out of reach")
        raw = 1 + sum(w - 1 for w in windows)
        if raw > context and math.isclose(got, raw):
            return "the reach cannot go back past the first token of the sequence: there are only context positions"
        if math.isclose(got, min(context, sum(windows))):
            return ("the window counts the position itself, so a layer adds fewer new positions than its window "
                    "holds; the token itself is counted once, not once per layer")
        if math.isclose(got, min(context, max(windows))):
            return "the second layer attends to positions that already saw the positions before them"
        return None

    check_cases("receptive_field", fn, full, rel=0, diagnose=diagnose)
