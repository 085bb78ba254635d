"""Communication of each parallelism strategy per step (book ch13-18, ch20, ch25; labs 08-13).

Property: each strategy partitions something different, and so moves something different: DP the
gradients (all-reduce, Psi-sized), ZeRO-3 also the weights (1.5x DP), TP the activations of every
layer (all-reduce inside the node), PP one activation per micro-batch per stage boundary
(point to point), CP the keys and values (ring), EP the routed tokens (all-to-all).
All volumes are bytes *sent per GPU* unless the name says otherwise; ``dtype_bytes`` is the element size.
"""

from __future__ import annotations

import math

from minidist.estimate._check import choice, count, nonnegative, positive


def dp_all_reduce_bytes(params: float, dp: int, dtype_bytes: float = 2) -> float:
    """Gradient all-reduce per step: 2(dp-1)/dp Psi s bytes per GPU (ring); -> 2 Psi s for large dp."""
    fn = "dp_all_reduce_bytes"
    d = count(fn, "dp", dp)
    return 2 * (d - 1) / d * nonnegative(fn, "params", params) * positive(fn, "dtype_bytes", dtype_bytes)


def zero_comm_bytes(params: float, dp: int, zero_stage: int, dtype_bytes: float = 2) -> float:
    """Per-step volume per GPU with ZeRO: stages 0-2 = DP (reduce-scatter grads + all-gather weights,
    2(dp-1)/dp Psi s); stage 3 gathers the weights twice (forward and backward) and reduce-scatters
    the grads: 3(dp-1)/dp Psi s, 1.5x DP (Rajbhandari et al. 2020)."""
    fn = "zero_comm_bytes"
    choice(fn, "zero_stage", zero_stage, (0, 1, 2, 3))
    base = dp_all_reduce_bytes(params, dp, dtype_bytes)
    return base * 1.5 if zero_stage == 3 else base


def zero3_comm_time(params: float, layers: int, alpha: float, beta: float, dtype_bytes: float = 2) -> float:
    """ZeRO-3 step communication in the large-dp limit (ch20): 3 collectives per layer (AG forward,
    AG backward, RS) cost 3 L alpha + 3 Psi s / beta."""
    fn = "zero3_comm_time"
    return (3 * count(fn, "layers", layers) * nonnegative(fn, "alpha", alpha)
            + 3 * nonnegative(fn, "params", params) * positive(fn, "dtype_bytes", dtype_bytes) / positive(fn, "beta",
                                                                                                          beta))


def tp_all_reduces_per_layer(recompute: str | None = None) -> int:
    """Megatron TP: 2 all-reduces forward (attention and MLP outputs) + 2 backward; a full
    recomputation replays the forward ones (6). With sequence parallelism each becomes a
    reduce-scatter + all-gather pair of the same cost."""
    choice("tp_all_reduces_per_layer", "recompute", recompute, (None, "selective", "full"))
    return 6 if recompute == "full" else 4


def tp_comm_bytes(batch: int, seq: int, hidden: int, layers: int, tp: int, dtype_bytes: float = 2,
                  recompute: str | None = None, sequence_parallel: bool = False) -> float:
    """Bytes each GPU sends for TP in one micro-batch: n_AR L 2(t-1)/t b s h s_dtype (n_AR = 4, or 6
    with full recomputation); the book's "4 L x B S H 2" counts the messages, this counts ring traffic.

    With sequence parallelism each all-reduce becomes a reduce-scatter + all-gather pair (the same
    bytes), and the backward all-gathers the input of the two column-parallel regions again, because
    only its sequence shard was kept (Korthikanti et al. 2022): one all-reduce's worth more per layer,
    (n_AR + 1) L 2(t-1)/t b s h s_dtype."""
    fn = "tp_comm_bytes"
    b, s, h, L, t = (count(fn, n, v) for n, v in
                     (("batch", batch), ("seq", seq), ("hidden", hidden), ("layers", layers), ("tp", tp)))
    n = tp_all_reduces_per_layer(recompute) + (1 if sequence_parallel else 0)
    return n * L * 2 * (t - 1) / t * b * s * h * positive(fn, "dtype_bytes", dtype_bytes)


def layernorm_stats_bytes(batch: int, seq: int) -> float:
    """Parallel LayerNorm (ch15) all-reduces two fp32 scalars (sum x, sum x^2) per token: 8 b s bytes."""
    return 8 * count("layernorm_stats_bytes", "batch", batch) * count("layernorm_stats_bytes", "seq", seq)


def pp_activation_bytes(batch: int, seq: int, hidden: int, dtype_bytes: float = 2, tp: int = 1) -> float:
    """One micro-batch's activation at a stage boundary: b s h s_dtype (/ tp with Megatron's
    scatter-gather optimisation, which sends one TP shard over the network and all-gathers it)."""
    fn = "pp_activation_bytes"
    return (count(fn, "batch", batch) * count(fn, "seq", seq) * count(fn, "hidden", hidden)
            * positive(fn, "dtype_bytes", dtype_bytes) / count(fn, "tp", tp))


def pp_comm_bytes_total(activation: float, stages: int, microbatches: int) -> float:
    """Whole-pipeline point-to-point volume per step: 2 (p-1) m activation bytes (activations forward,
    their gradients backward, over p-1 boundaries)."""
    fn = "pp_comm_bytes_total"
    return 2 * (count(fn, "stages", stages) - 1) * count(fn, "microbatches", microbatches) * nonnegative(
        fn, "activation", activation)


def cp_ring_bytes_per_layer(batch: int, seq: int, kv_hidden: int, cp: int, dtype_bytes: float = 2) -> float:
    """Ring attention forward, per layer per GPU: K and V chunks of every other rank pass through,
    2 (cp-1)/cp b s h_kv s_dtype bytes (h_kv = kv_heads x head_dim; = hidden for MHA)."""
    fn = "cp_ring_bytes_per_layer"
    c = count(fn, "cp", cp)
    return (2 * (c - 1) / c * count(fn, "batch", batch) * count(fn, "seq", seq) * count(fn, "kv_hidden", kv_hidden)
            * positive(fn, "dtype_bytes", dtype_bytes))


def ulysses_bytes_per_layer(batch: int, seq: int, hidden: int, cp: int, dtype_bytes: float = 2) -> float:
    """DeepSpeed-Ulysses, per layer per GPU: 4 all-to-alls (Q, K, V in, output back) of the local
    b (s/P) h shard, each sending (P-1)/P of it: 4 (P-1) b s h s_dtype / P^2 (ch17)."""
    fn = "ulysses_bytes_per_layer"
    P = count(fn, "cp", cp)
    return (4 * (P - 1) * count(fn, "batch", batch) * count(fn, "seq", seq) * count(fn, "hidden", hidden)
            * positive(fn, "dtype_bytes", dtype_bytes) / P ** 2)


def ep_all_to_all_bytes(tokens: float, hidden: int, top_k: int, ep: int, dtype_bytes: float = 2) -> float:
    """Expert parallelism, per MoE layer per GPU, forward: dispatch + combine all-to-alls, each sending
    the (ep-1)/ep of this rank's ``tokens`` x top_k routed copies that live on other ranks:
    2 (ep-1)/ep tokens k h s_dtype. The backward pass repeats it."""
    fn = "ep_all_to_all_bytes"
    e = count(fn, "ep", ep)
    return (2 * (e - 1) / e * nonnegative(fn, "tokens", tokens) * count(fn, "top_k", top_k)
            * count(fn, "hidden", hidden) * positive(fn, "dtype_bytes", dtype_bytes))


def expert_capacity(tokens: int, experts: int, capacity_factor: float = 1.25, top_k: int = 1) -> int:
    """Tokens an expert accepts per batch: C = ceil(cf T k / E) (ch18); the rest are dropped or overflow."""
    fn = "expert_capacity"
    return math.ceil(positive(fn, "capacity_factor", capacity_factor) * count(fn, "tokens", tokens)
                     * count(fn, "top_k", top_k) / count(fn, "experts", experts) - 1e-9)


def dropped_tokens(loads: list[float], capacity: float) -> list[float]:
    """Per-expert drops: max(0, load - capacity)."""
    c = nonnegative("dropped_tokens", "capacity", capacity)
    return [max(0.0, nonnegative("dropped_tokens", f"loads[{i}]", x) - c) for i, x in enumerate(loads)]
