"""The memory equation: model state, activations, recomputation, offloading, KV caches
(book ch19-22, ch31a; labs 13, 14, 22).

Property: what a GPU must hold is a sum of terms, each of which a strategy can shard, drop or move.
Mixed-precision Adam keeps 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, m, v) = 16 bytes per
parameter; ZeRO shards the 12, then the 2 of grads, then the 2 of weights over the DP group.
Activations follow Korthikanti et al. 2022 (the book's ch6/ch27 coefficient): s b h (34 + 5 a s / h)
bytes per layer in 16-bit training. Units: bytes.
"""

from __future__ import annotations

import math

from minidist.estimate._check import choice, count, nonnegative, positive

RECOMPUTE = (None, "selective", "full")


def model_state_breakdown(params: float, zero_stage: int = 0, dp: int = 1, weight_bytes: float = 2,
                          grad_bytes: float = 2, optimizer_bytes: float = 12) -> dict[str, float]:
    """Bytes per GPU for weights, gradients and optimizer state under ZeRO stage 0-3 over ``dp`` ranks:
    stage 1 shards the optimizer, 2 also the grads, 3 also the weights (Rajbhandari et al. 2020)."""
    fn = "model_state_breakdown"
    P = nonnegative(fn, "params", params)
    stage = choice(fn, "zero_stage", zero_stage, (0, 1, 2, 3))
    d = count(fn, "dp", dp)
    w, g, o = (nonnegative(fn, n, v) for n, v in
               (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes), ("optimizer_bytes", optimizer_bytes)))
    return {
        "params": P * w / (d if stage >= 3 else 1),
        "grads": P * g / (d if stage >= 2 else 1),
        "optimizer": P * o / (d if stage >= 1 else 1),
    }


def model_state_bytes(params: float, zero_stage: int = 0, dp: int = 1, bytes_per_param: float = 16) -> float:
    """Bytes per GPU of weights + grads + optimizer state: 16 Psi (DDP), 4 Psi + 12 Psi/dp (ZeRO-1),
    2 Psi + 14 Psi/dp (ZeRO-2), 16 Psi/dp (ZeRO-3). ``bytes_per_param`` keeps 2 + 2 for weights and grads
    and gives the rest to the optimizer (16 Adam, 12 SGD with momentum, 8 plain SGD with fp32 master)."""
    fn = "model_state_bytes"
    b = positive(fn, "bytes_per_param", bytes_per_param)
    if b < 4:
        raise ValueError(f"{fn}: bytes_per_param must be >= 4 (2 weights + 2 grads), got {b!r}")
    return sum(model_state_breakdown(params, zero_stage, dp, 2, 2, b - 4).values())


def zero_memory_reduction(zero_stage: int, dp: int) -> float:
    """Factor by which ZeRO shrinks 16 Psi: 4P/(P+3), 8P/(P+7), P for stages 1-3 (1 for stage 0)."""
    return 16 / model_state_bytes(1.0, zero_stage, dp)


def activation_bytes(seq: int, batch: int, hidden: int, heads: int, layers: int, tp: int = 1, sp: bool = False,
                     recompute: str | None = None) -> float:
    """Activation bytes held for the backward pass, all ``layers`` together (Korthikanti et al. 2022):

    per layer, s b h times
    - no parallelism: 34 + 5 a s / h
    - tensor parallel t: 10 + 24/t + 5 a s/(h t) (LayerNorm and dropout inputs stay replicated)
    - t with sequence parallelism: (34 + 5 a s / h) / t
    - selective recompute (attention scores, softmax and dropout mask recomputed) drops the 5 a s / h term
    - full recompute keeps only each layer's input: 2 s b h (/ t with sp)
    """
    fn = "activation_bytes"
    s, b, h, a, L = (count(fn, n, v) for n, v in
                     (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads), ("layers", layers)))
    t = count(fn, "tp", tp)
    if a % t:
        raise ValueError(f"{fn}: tp={t} must divide heads={a}")
    choice(fn, "recompute", recompute, RECOMPUTE)
    sbh = s * b * h
    if recompute == "full":
        per_layer = 2 * sbh / (t if sp else 1)
    else:
        attn = 0.0 if recompute == "selective" else 5 * a * s / h
        per_layer = sbh * (34 + attn) / t if sp else sbh * (10 + 24 / t + attn / t)
    return L * per_layer


def attention_scores_bytes(seq: int, batch: int, heads: int, layers: int = 1, cp: int = 1,
                           bytes_per_elem: float = 2) -> float:
    """Bytes of materialised attention scores: layers b a (s/cp)^2 bytes_per_elem (ch17, ch19); ring
    attention over ``cp`` ranks keeps one (s/cp)^2 block per rank, a cp^2 saving."""
    fn = "attention_scores_bytes"
    s, b, a, L, c = (count(fn, n, v) for n, v in
                     (("seq", seq), ("batch", batch), ("heads", heads), ("layers", layers), ("cp", cp)))
    return L * b * a * (s / c) ** 2 * positive(fn, "bytes_per_elem", bytes_per_elem)


def optimal_checkpoint_interval(layers: int) -> int:
    """Integer k minimising (L/k + k) layer activations with a checkpoint every k layers: k* ~ sqrt(L)."""
    L = count("optimal_checkpoint_interval", "layers", layers)
    r = math.isqrt(L)
    return min((k for k in (r, r + 1) if k <= L), key=lambda k: L / k + k)


def checkpointed_activation_bytes(layers: int, layer_bytes: float, k: int,
                                  boundary_bytes: float | None = None) -> float:
    """Activation memory with a checkpoint every k layers (ch6, ch21): (L/k) boundary + k layer_bytes,
    the boundary (one layer's input) defaulting to a full layer, i.e. (L/k + k) M_layer."""
    fn = "checkpointed_activation_bytes"
    L, kk = count(fn, "layers", layers), count(fn, "k", k)
    m = nonnegative(fn, "layer_bytes", layer_bytes)
    bnd = m if boundary_bytes is None else nonnegative(fn, "boundary_bytes", boundary_bytes)
    return math.ceil(L / kk) * bnd + kk * m


def recompute_overhead(fraction_recomputed: float) -> float:
    """Extra compute of recomputing a fraction c of the forward pass: c/3 of a step (forward is 1/3)."""
    c = nonnegative("recompute_overhead", "fraction_recomputed", fraction_recomputed)
    if c > 1:
        raise ValueError(f"recompute_overhead: fraction_recomputed must be <= 1, got {c!r}")
    return c / 3


def kv_cache_bytes(seq: int, layers: int, kv_heads: int, head_dim: int, batch: int = 1, bytes_per_elem: float = 2,
                   window: int | None = None) -> float:
    """KV cache: 2 (K and V) kv_heads head_dim bytes per token per layer, times min(seq, window) tokens
    (ch31a). kv_heads = heads is MHA, fewer is GQA (1 is MQA); ``window`` is sliding-window attention."""
    fn = "kv_cache_bytes"
    s, L, g, d, b = (count(fn, n, v) for n, v in (("seq", seq), ("layers", layers), ("kv_heads", kv_heads),
                                                   ("head_dim", head_dim), ("batch", batch)))
    tokens = s if window is None else min(s, count(fn, "window", window))
    return 2 * g * d * positive(fn, "bytes_per_elem", bytes_per_elem) * tokens * L * b


def mla_kv_cache_bytes(seq: int, layers: int, latent_dim: int, rope_dim: int = 0, batch: int = 1,
                       bytes_per_elem: float = 2) -> float:
    """Multi-head latent attention caches one latent c_t (d_c) plus the decoupled RoPE key (d_rope)
    per token per layer: (d_c + d_rope) bytes_per_elem seq layers batch (DeepSeek-V2/V3)."""
    fn = "mla_kv_cache_bytes"
    s, L, c, b = (count(fn, n, v) for n, v in (("seq", seq), ("layers", layers), ("latent_dim", latent_dim),
                                               ("batch", batch)))
    r = count(fn, "rope_dim", rope_dim, minimum=0)
    return (c + r) * positive(fn, "bytes_per_elem", bytes_per_elem) * s * L * b


def offload_gpu_bytes(params: float) -> tuple[float, float]:
    """ZeRO-Offload keeps (steady, peak) = (2 Psi, 4 Psi) bytes on the GPU: fp16 weights, plus the fp16
    gradients while they stream to the CPU, which holds the fp32 master weights and Adam state (ch22)."""
    P = nonnegative("offload_gpu_bytes", "params", params)
    return 2 * P, 4 * P


def offload_min_tokens(peak_flops: float, link_bw: float) -> float:
    """Overlap condition of layer-wise offloading (ch22): moving a layer's 24 h^2 bytes takes no longer
    than its 24 B S h^2 FLOPs when B S >= F / B_link tokens per micro-batch."""
    return positive("offload_min_tokens", "peak_flops", peak_flops) / positive("offload_min_tokens", "link_bw", link_bw)


def prefetch_depth(layer_bytes: float, bw: float, t_compute: float) -> int:
    """Layers to prefetch so transfers keep up with compute: k* = ceil(S_layer / (B T_c)) (ch22)."""
    fn = "prefetch_depth"
    return max(1, math.ceil(nonnegative(fn, "layer_bytes", layer_bytes) / (positive(fn, "bw", bw)
                                                                           * positive(fn, "t_compute", t_compute))))
