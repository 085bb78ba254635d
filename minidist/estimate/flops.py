"""Parameter and FLOP counts, training time and MFU (book ch1, ch5-6, ch37; labs 01, 03).

Property: a dense transformer step costs about 2 FLOPs per parameter per token forward and 4 backward,
so C = 6 Psi D, and the time follows from C / (GPUs x peak x MFU). MFU here is the book's
6 Psi tokens/s / (P F) (model FLOPs only; recomputation does not count). Units: FLOPs, seconds, FLOP/s.
"""

from __future__ import annotations

import math

from minidist.estimate._check import count, fraction, nonnegative, positive


def transformer_params(layers: int, hidden: int, vocab: int, ffn: int | None = None, heads: int | None = None,
                       kv_heads: int | None = None, *, gated: bool | None = None, tied: bool = False) -> int:
    """Weight count of a decoder-only transformer (norms and biases, < 0.1%, are left out).

    Per layer: attention 2 h^2 (Q, O) + 2 h (kv_heads * h/heads) (K, V); MLP 2 h ffn, or 3 h ffn when
    gated (SwiGLU). Embeddings: V h in, V h out unless ``tied``. With the defaults (ffn = 4h, MHA,
    untied) this is the book's 12 L h^2 + 2 V h. ``gated`` defaults to True exactly when ``ffn`` is
    given (the LLaMA / Mistral family); pass gated=False for a GPT MLP with an explicit ffn.
    """
    fn = "transformer_params"
    L, h, V = count(fn, "layers", layers), count(fn, "hidden", hidden), count(fn, "vocab", vocab)
    if gated is None:
        gated = ffn is not None
    f = 4 * h if ffn is None else count(fn, "ffn", ffn)
    a = h if heads is None else count(fn, "heads", heads)
    if h % a:
        raise ValueError(f"{fn}: heads={a} must divide hidden={h}")
    kv = a if kv_heads is None else count(fn, "kv_heads", kv_heads)
    if a % kv:
        raise ValueError(f"{fn}: kv_heads={kv} must divide heads={a}")
    attn = 2 * h * h + 2 * h * kv * (h // a)
    mlp = (3 if gated else 2) * h * f
    return L * (attn + mlp) + (1 if tied else 2) * V * h


def moe_params(layers: int, hidden: int, vocab: int, ffn: int, heads: int, kv_heads: int, experts: int, top_k: int,
               shared_experts: int = 0, *, gated: bool = True, tied: bool = False) -> tuple[int, int]:
    """(total, active) weights of a mixture-of-experts transformer whose every layer has ``experts``
    gated MLPs of width ``ffn`` (+ ``shared_experts`` always active); a token uses ``top_k`` of them.
    Router weights (h x E per layer) are counted. Parameters grow with E, FLOPs per token with k (ch18)."""
    fn = "moe_params"
    E, k = count(fn, "experts", experts), count(fn, "top_k", top_k)
    if k > E:
        raise ValueError(f"{fn}: top_k={k} exceeds experts={E}")
    s = count(fn, "shared_experts", shared_experts, minimum=0)
    dense = transformer_params(layers, hidden, vocab, ffn, heads, kv_heads, gated=gated, tied=tied)
    expert = (3 if gated else 2) * hidden * ffn
    router = hidden * E
    base = dense - layers * expert  # attention + embeddings
    total = base + layers * ((E + s) * expert + router)
    active = base + layers * ((k + s) * expert + router)
    return total, active


def training_flops(params: float, tokens: float) -> float:
    """C = 6 Psi D FLOPs (2 forward + 4 backward per parameter per token)."""
    return 6 * nonnegative("training_flops", "params", params) * nonnegative("training_flops", "tokens", tokens)


def training_time(params: float, tokens: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Seconds: 6 Psi D / (P F MFU)."""
    fn = "training_time"
    return training_flops(params, tokens) / (count(fn, "gpus", gpus) * positive(fn, "peak_flops", peak_flops)
                                             * fraction(fn, "mfu", mfu, open_low=True))


def mfu(params: float, tokens_per_s: float, gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: 6 Psi (tokens/s) / (P F)."""
    fn = "mfu"
    return (6 * nonnegative(fn, "params", params) * nonnegative(fn, "tokens_per_s", tokens_per_s)
            / (count(fn, "gpus", gpus) * positive(fn, "peak_flops", peak_flops)))


def tokens_per_second(params: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Throughput at a given MFU: P F MFU / (6 Psi)."""
    fn = "tokens_per_second"
    return (count(fn, "gpus", gpus) * positive(fn, "peak_flops", peak_flops) * fraction(fn, "mfu", mfu)
            / (6 * positive(fn, "params", params)))


def step_time(params: float, batch_tokens: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Seconds per optimizer step: 6 Psi B / (MFU F P) (ch6)."""
    fn = "step_time"
    return (6 * nonnegative(fn, "params", params) * nonnegative(fn, "batch_tokens", batch_tokens)
            / (fraction(fn, "mfu", mfu, open_low=True) * positive(fn, "peak_flops", peak_flops)
               * count(fn, "gpus", gpus)))


def megatron_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool = True) -> float:
    """FLOPs per iteration of a GPT model as counted by Narayanan et al. 2021 (eq. 3):
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recomputation (4 passes over the layers), and
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without (3 passes). The logits layer is never recomputed."""
    fn = "megatron_flops"
    B, s, L, h, V = (count(fn, n, v) for n, v in
                     (("batch", batch), ("seq", seq), ("layers", layers), ("hidden", hidden), ("vocab", vocab)))
    if recompute:
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def padded_heads(heads: int, tp: int) -> int:
    """Heads after padding to a multiple of the TP degree: ceil(heads / tp) * tp (ch15); the extra
    heads are wasted compute, so valid TP degrees divide the head count."""
    fn = "padded_heads"
    h, t = count(fn, "heads", heads), count(fn, "tp", tp)
    return math.ceil(h / t) * t
