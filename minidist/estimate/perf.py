"""Step time, memory and MFU of one parallel layout: the analytic performance model (book ch6, ch24-27;
labs 15-18, 25).

Property: a training step is a pipeline of identical micro-batch steps, so its time is a sum of
terms that each come from an earlier chapter: GEMM FLOPs at a calibrated efficiency plus a
bandwidth-bound overhead (roofline), TP/CP/EP/PP messages (alpha-beta on the link the group spans),
the pipeline bubble, and the DP gradient reduction (hierarchical all-reduce) minus what overlaps.

Model, for the slowest (last) pipeline stage and one micro-batch of b sequences (tokens t = b s / cp):
- FLOPs per layer forward = 2 (active layer weights) t + 4 b (s/cp) s h (attention, non-causal as in
  Megatron's count), / tp; passes: forward 1 + backward 2, +1 for each fully recomputed layer (all of
  the stage's, or ``recompute_layers`` of them as in Megatron's --recompute-num-layers); selective
  recompute and FlashAttention replay only the attention core and never store the s x s scores. The logits
  (2 t h V / tp per pass, never recomputed) sit on the last stage.
- compute time = FLOPs / (peak x gemm) + passes x overhead_bytes x (t h / tp) x layers / hbm_bw. The
  second term is everything that is not a large GEMM (norms, activations, softmax, launches), modelled
  as HBM traffic proportional to the activation size; it is why small hidden sizes run at low MFU.
  ``gemm`` and ``overhead_bytes`` are the two calibrated constants (see calibration.py).
- TP: 4 all-reduces of t h 2 bytes per layer (6 in a recomputed layer), ring on NVLink. Without sequence
  parallelism they are exposed; with it (``sp``) each is an all-gather before a GEMM and a reduce-scatter after
  one, which a ring decomposition overlaps with that GEMM (parallel/tensor/tp_overlap.py), so a share ``tp_overlap``
  (default half: the communication kernels take SMs from the GEMM) hides, never more than the layer's GEMMs.
- CP: ring attention passes K,V chunks (cp - 1) times forward and twice that backward; hidden behind
  the chunk's causal attention (half the non-causal count) when shorter. EP: 4 all-to-alls of t k h 2
  bytes per MoE layer (6 with full recompute), exposed except the share ``ep_overlap`` (all of it under
  DualPipe) that runs under compute. PP: an activation (t h 2 / tp bytes) forward and a gradient back
  per micro-batch and virtual stage, exposed.
- Pipeline: m t_mb of work spread over busy / (1 - bubble) (``pipeline_bubble``).
- DP: gradients of the local weights (2 bytes each, 4 with fp32 main gradients) reduced with the
  two-level all-reduce over the dp x cp group; a fraction ``dp_overlap`` of it hides behind the backward
  pass, never more than that compute. ZeRO-3 gathers each layer 2 + r times per micro-batch (forward,
  backward, and again for the recomputed share r) and reduce-scatters it once, on rings over the group
  at the per-GPU network bandwidth with p - 1 latencies per layer; ``dp_overlap`` of it hides behind
  all of the compute except the first layer's gather. Then a memory-bound optimizer step (36 bytes of
  HBM traffic per local sharded weight).
Memory per GPU, on the fullest stage (its layers plus the embedding matrix or the head): weights / grads
/ optimizer by ZeRO stage over dp x cp (two stages' worth under DualPipe), activations (Korthikanti) x
micro-batches in flight (dense coefficients, also for MoE models) plus one whole layer while full
recomputation rebuilds it, buffers (fp32 logits and their gradient; ZeRO-3's gathered layer x 2).
MFU is the book's 6 Psi tokens / (time P F) with Psi the
active weights; ``tflops_per_gpu`` adds the attention FLOPs. Rank order is tp (innermost), cp, dp
(ep borrows dp), pp (outermost), so tp stays inside a node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minidist.estimate.clusters import ClusterSpec
from minidist.estimate.comm import collective_time, hierarchical_all_reduce_time
from minidist.estimate.memory import activation_bytes, model_state_breakdown
from minidist.estimate.models import ModelConfig
from minidist.estimate.pipeline import inflight_microbatches, pipeline_bubble


@dataclass(frozen=True)
class Efficiency:
    """The calibrated constants: fraction of dense peak the GEMMs reach, and bytes of HBM traffic per
    activation element per layer per pass for the non-GEMM work."""

    gemm: float
    overhead_bytes: float


@dataclass(frozen=True)
class Layout:
    """One parallel configuration. ``gpus = tp * cp * pp * dp``; ``ep`` divides ``dp`` (experts are
    spread over data-parallel ranks). ``virtual`` is the interleaving depth of the schedule."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 1
    recompute: str | None = None
    micro_batch: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sp: bool = True
    flash: bool = True  # FlashAttention: never stores the s x s scores, recomputes them in the backward
    recompute_layers: int | None = None  # with recompute="full": how many layers per stage (None = all)
    fp32_grads: bool = False  # Megatron's main gradients in fp32: 18 bytes per parameter instead of 16
    tp_overlap: float = 0.5  # with sp: the share of TP communication hidden under the GEMMs it feeds

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def label(self) -> str:
        sched = self.schedule + (f"x{self.virtual}" if self.virtual > 1 else "") if self.pp > 1 else "-"
        return (f"tp{self.tp} cp{self.cp} pp{self.pp} dp{self.dp} ep{self.ep} zero{self.zero_stage} "
                f"rc={self.recompute_label()} mb{self.micro_batch} {sched}")

    def recompute_label(self) -> str:
        if self.recompute == "full" and self.recompute_layers is not None:
            return f"full:{self.recompute_layers}"
        return self.recompute or "none"


@dataclass
class Estimate:
    """Predicted step of one layout. Times in seconds, memory in bytes per GPU (the fullest stage)."""

    layout: Layout
    global_batch: int
    seq_len: int
    microbatches: int
    memory: dict[str, float]
    hbm_bytes: float
    fits: bool
    step_time: float
    compute: float
    exposed_comm: float
    bubble: float
    comm: dict[str, float] = field(default_factory=dict)
    mfu: float = 0.0
    tokens_per_s: float = 0.0
    tflops_per_gpu: float = 0.0  # model FLOPs incl. attention (Megatron's count: + 12 s h L per token)

    @property
    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute, "exposed_comm": self.exposed_comm, "bubble": self.bubble}


def _dp_reduce_time(nbytes: float, group: int, tp: int, cluster: ClusterSpec) -> float:
    """Two-level all-reduce of ``nbytes`` over a DP group whose members sit ``tp`` ranks apart."""
    if group <= 1:
        return 0.0
    per_node = max(1, min(group, cluster.gpus_per_node // tp))
    nodes = math.ceil(group / per_node)
    return hierarchical_all_reduce_time(nbytes, per_node, nodes, cluster.intra.alpha, cluster.intra.beta,
                                        cluster.inter.alpha, cluster.inter.beta)


def estimate_layout(model: ModelConfig, cluster: ClusterSpec, layout: Layout, global_batch: int, seq_len: int,
                    efficiency: Efficiency, *, dp_overlap: float = 0.8, dtype: str = "bf16",
                    hbm_usable: float = 0.9, ep_overlap: float | None = None) -> Estimate:
    """Predict one layout. Checks only that the batch splits into whole micro-batches; the planner applies
    the other filters (divisibility of heads and layers, memory). ``ep_overlap``: the share of the expert
    all-to-alls hidden behind compute (default: all of it under DualPipe, which is built for that, none
    otherwise)."""
    L, h, V, s = model.layers, model.hidden, model.vocab, seq_len
    tp, pp, dp, cp, ep, b = layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.micro_batch
    g = cluster.gpu
    peak, hbm_bw = g.peak(dtype), g.hbm_bw
    if global_batch < 1 or global_batch % (dp * b):
        raise ValueError(f"estimate_layout: global_batch={global_batch} must be a positive multiple of dp x "
                         f"micro_batch = {dp * b}")
    m = global_batch // (dp * b)
    layers_stage = math.ceil(L / pp)
    moe_layers = (model.moe_layers or L) if model.is_moe else 0
    moe_stage = math.ceil(moe_layers / pp)

    # --- compute per micro-batch on the last stage ---
    t = b * s / cp  # tokens this GPU processes per micro-batch
    layer_active = (model.active_params - model.embedding_params) / L
    dense_fwd = 2 * layer_active * t / tp
    attn_fwd = 4 * b * (s / cp) * s * h / tp
    # r = share of this stage's layers that are fully recomputed (one more forward each)
    r = 0.0
    if layout.recompute == "full":
        r = 1.0 if layout.recompute_layers is None else min(layout.recompute_layers, layers_stage) / layers_stage
    passes = 3 + r
    attn_passes = passes + (1.0 if layout.flash else (1 - r) if layout.recompute == "selective" else 0.0)
    layer_flops = dense_fwd * passes + attn_fwd * attn_passes
    logits_flops = 3 * 2 * t * h * V / tp
    stage_flops = layers_stage * layer_flops + logits_flops
    overhead = passes * efficiency.overhead_bytes * t * h / tp * layers_stage / hbm_bw
    t_compute = stage_flops / (peak * efficiency.gemm) + overhead

    # --- communication per micro-batch ---
    act_bytes = t * h * 2
    n_ar = 4 + 2 * r
    t_tp = n_ar * layers_stage * collective_time("all_reduce", act_bytes, tp, cluster.intra.alpha,
                                                 cluster.intra.beta) if tp > 1 else 0.0
    if layout.sp and t_tp:
        # sequence parallelism turns each all-reduce into an all-gather before a column-parallel GEMM and a
        # reduce-scatter after a row-parallel one; cut into ring steps, each message travels while the previous
        # shard's product runs (parallel/tensor/tp_overlap.py), so a share tp_overlap hides, never more than those GEMMs
        gemm_time = layers_stage * dense_fwd * passes / (peak * efficiency.gemm)
        t_tp -= min(layout.tp_overlap * t_tp, gemm_time)
    t_cp = 0.0
    if cp > 1:
        link = cluster.link_for(tp * cp)
        kv_chunk = 2 * b * (s / cp) * model.kv_heads * model.head_dim * 2 / tp
        ring = 3 * (cp - 1) * (link.alpha + kv_chunk / link.beta)  # forward once, backward twice
        # the ring hides behind the chunk's causal attention only: half the (query, key) pairs are masked and a
        # balanced (zigzag) ring skips them, so half of the non-causal count is there to overlap
        attn_time = 0.5 * attn_fwd * attn_passes / (peak * efficiency.gemm)
        t_cp = layers_stage * max(0.0, ring - attn_time)
    t_ep = 0.0
    if ep > 1:
        link = cluster.link_for(tp * cp * ep)
        n_a2a = 4 + 2 * r
        tokens_bytes = t * model.top_k * h * 2 / (tp if layout.sp else 1)
        t_ep = n_a2a * moe_stage * collective_time("all_to_all", tokens_bytes, ep, link.alpha, link.beta)
        hide = (1.0 if layout.schedule == "dualpipe" else 0.0) if ep_overlap is None else ep_overlap
        t_ep -= min(hide * t_ep, t_compute)  # DualPipe runs one direction's all-to-all under the other's compute
    t_pp = 0.0
    if pp > 1:
        link = cluster.inter if tp * cp * dp >= cluster.gpus_per_node else cluster.intra  # stage stride
        t_pp = 2 * layout.virtual * (link.alpha + act_bytes / tp / link.beta)
    t_mb = t_compute + t_tp + t_cp + t_ep + t_pp

    bubble_frac = pipeline_bubble(pp, m, layout.schedule, layout.virtual) if pp > 1 else 0.0
    busy = m * t_mb
    pipe = busy / (1 - bubble_frac)

    # --- data-parallel gradient reduction and optimizer ---
    # the fullest stage's weights: its layers plus the embedding matrix (first stage) or the head (last stage),
    # both on a lone stage (one matrix when tied); Megatron keeps a tied matrix on both ends of a pipeline
    layer_dense = (model.dense_params - model.embedding_params) / L
    ends = (1 if model.tied else 2) if pp == 1 else 1
    local_params = (layers_stage * layer_dense + ends * model.vocab * h) / tp + model.expert_params / (tp * pp * ep)
    shard = dp * cp
    grad_bytes = 4 if layout.fp32_grads else 2
    if layout.zero_stage == 3:
        # every micro-batch gathers the weights for the forward, again for the backward and once more for the
        # recomputed share, and reduce-scatters the gradients: 2 + r gathers, not the 1.5 all-reduces of the
        # DP count. The group's rings leave the node through each GPU's own NIC (one GPU of the group per node
        # once tp x cp fills it), so they run at the network's per-GPU bandwidth. Overlap hides them behind
        # the compute of the micro-batch, except the first layer's gather, which nothing precedes.
        # Each layer is its own unit (one gather, one reduce-scatter), so a ring's p - 1 latencies are paid per
        # layer: at a few thousand ranks that alone is seconds per step.
        link = cluster.link_for(tp * cp * shard)
        unit = local_params / layers_stage
        t_ag = collective_time("all_gather", unit * 2, shard, link.alpha, link.beta)
        t_rs = collective_time("reduce_scatter", unit * grad_bytes, shard, link.alpha, link.beta)
        t_dp = m * layers_stage * ((2 + r) * t_ag + t_rs)
        dp_exposed = t_dp - min(dp_overlap * t_dp, m * t_compute) + t_ag
    else:
        t_dp = _dp_reduce_time(local_params * grad_bytes, shard, tp, cluster)
        if layout.zero_stage == 2:
            # ZeRO-2 keeps only its shard of the gradient, so every micro-batch reduce-scatters its own (half an
            # all-reduce each) and the step ends with one all-gather of the updated weights (the other half)
            t_dp *= (m + 1) / 2
        # overlap hides at most the compute it runs under: the backward, 2/3 of it
        dp_exposed = t_dp - min(dp_overlap * t_dp, m * t_compute * 2 / 3)
    t_opt = 36 * local_params / (shard if layout.zero_stage >= 1 else 1) / hbm_bw

    step = pipe + dp_exposed + t_opt
    compute = m * t_compute + t_opt
    exposed = m * (t_tp + t_cp + t_ep + t_pp) + dp_exposed
    comm = {"tp": m * t_tp, "cp": m * t_cp, "ep": m * t_ep, "pp": m * t_pp, "dp": dp_exposed}

    # --- memory on the fullest stage ---
    state = model_state_breakdown(local_params, layout.zero_stage, shard, 2, grad_bytes, 12)
    if layout.schedule == "dualpipe" and pp > 1:  # each GPU holds two stages, one per direction (DeepSeek-V3)
        state = {k: 2 * v for k, v in state.items()}
    inflight = inflight_microbatches(pp, m, layout.schedule, layout.virtual) if pp > 1 else 1
    heads = model.heads
    rc = "selective" if layout.flash and layout.recompute is None else layout.recompute
    s_local = max(1, round(s / cp))
    acts = activation_bytes(s_local, b, h, heads, layers_stage, tp, layout.sp, rc)
    if layout.recompute == "full" and r < 1:  # the layers not recomputed keep their full activations
        kept = activation_bytes(s_local, b, h, heads, layers_stage, tp, layout.sp,
                                "selective" if layout.flash else None)
        acts = r * acts + (1 - r) * kept
    rebuilt = 0.0
    if layout.recompute == "full":  # the layer being rebuilt holds its whole activations during its backward:
        # one layer of one micro-batch at a time, however many micro-batches are in flight
        rebuilt = activation_bytes(s_local, b, h, heads, 1, tp, layout.sp, "selective" if layout.flash else None)
    buffers = 2 * 4 * t * V / tp
    if layout.zero_stage == 3:
        buffers += 2 * 2 * (layer_active + model.expert_params / max(1, moe_layers or 1) / ep) / tp
    memory = {**state, "activations": acts * inflight + rebuilt, "buffers": buffers}
    memory["total"] = sum(memory.values())
    tokens = global_batch * s
    return Estimate(
        layout=layout, global_batch=global_batch, seq_len=s, microbatches=m, memory=memory, hbm_bytes=g.hbm_bytes,
        fits=memory["total"] <= hbm_usable * g.hbm_bytes, step_time=step, compute=compute, exposed_comm=exposed,
        bubble=pipe - busy, comm=comm, mfu=6 * model.active_params * tokens / (step * layout.gpus * peak),
        tokens_per_s=tokens / step,
        tflops_per_gpu=(6 * model.active_params + 12 * s * h * L) * tokens / (step * layout.gpus) / 1e12)
