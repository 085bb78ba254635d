"""One step of a published training run, timed on thousands of simulated GPUs without data (book ch34, lab 24).

Property: what a step costs (the time of every op and message, every byte the ledger books) is a function of
the shapes, the dtypes and the layout, never of the values; and two ranks that differ only in their dp, ep or
tp coordinate (or cp under Ulysses) run the same ops on the same shapes at the same moments. So the step of a
16,384-GPU run is the step of one rank per pipeline stage (per ring-attention rank too), each running
shape-only arrays (``autograd/shape_only.py``) in one process (``backend="inprocess"``), its peers' messages
mirrored from its own (``mesh.representatives``).
Nothing here is a formula: the same ``md.parallel.train`` as on 8 devices runs, every op and message charged.

``simulate_step`` runs it and reports the step the way papers do: seconds, MFU (model FLOPs ``6 N`` per token
over the GPUs' peak) and TFLOP/s per GPU counting attention too (``6 N + 12 s h L`` per token, the convention
of Megatron-LM and the Llama 3 report), with the fullest rank's memory and the wall time it took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minidist.hardware.cluster import Cluster
from minidist.nn import GPTConfig
from minidist.parallel.config import ParallelConfig
from minidist.parallel.mesh import representatives
from minidist.parallel.options import Backend, Precision
from minidist.parallel.train import train


@dataclass
class ScaleStep:
    """What ``simulate_step`` measured: ``step_time`` simulated seconds, ``peak_memory`` bytes on the fullest
    rank with its ``breakdown`` by ledger category, ``simulated_ranks`` of ``gpus`` run, ``wall_seconds`` of this
    machine's time; ``compute_time``: the busiest rank's seconds of ops (the rest of its step it waits for
    messages and for the pipeline)."""

    model: GPTConfig
    parallel: ParallelConfig
    global_batch: int
    step_time: float
    mfu: float
    tflops_per_gpu: float
    peak_memory: float
    breakdown: dict
    hbm_bytes: float
    num_params: int
    gpus: int
    simulated_ranks: int
    wall_seconds: float
    compute_time: float = 0.0  # the busiest rank's seconds of compute in the step; the rest is waiting
    result: object = field(default=None, repr=False)  # the TrainResult (its trace, for a budget of the step)

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.hbm_bytes

    def __repr__(self) -> str:
        return (f"ScaleStep({self.gpus} GPUs, {self.step_time:.3g} s/step, MFU {self.mfu:.1%}, "
                f"{self.tflops_per_gpu:.0f} TFLOP/s per GPU, {self.peak_memory / 1e9:.1f} GB peak, "
                f"{self.simulated_ranks} ranks run in {self.wall_seconds:.1f} s)")


# a vocabulary that does not split over 8 tensor-parallel ranks is padded as Megatron-LM pads it, to a multiple of
# 128 x tp (--make-vocab-size-divisible-by 128); 1024 covers every tp up to 8
VOCAB_MULTIPLE = 1024
# latent attention's widths not in md.estimate's models (DeepSeek-V3's config: q_lora_rank, qk_nope_head_dim,
# v_head_dim), used wherever a model names an ``mla_latent``
MLA_SHAPE = {"q_latent": 1536, "qk_head_dim": 128, "v_head_dim": 128}


def gpt_config(model, n_layers: int | None = None) -> GPTConfig:
    """The ``GPTConfig`` of a model of ``md.estimate.model(name)`` (layers, hidden, heads, kv_heads, ffn, vocab,
    seq_len, gated, tied): SwiGLU and RMSNorm without biases when ``gated`` (LLaMA), GELU and LayerNorm otherwise.
    Positions are learned (``seq_len x hidden`` more weights, 0.03% of 405B) where LLaMA rotates them, and a
    vocabulary that 8 ranks cannot split is padded to a multiple of ``VOCAB_MULTIPLE`` (GPT-3's 50,257 becomes
    51,200) as Megatron-LM does.
    A mixture of experts (at most one shared expert; the first ``layers - moe_layers`` layers dense, of ``ffn``)
    routes by a balanced plan, the routing a run without values can take. Latent attention (``mla_latent``) takes
    DeepSeek-V3's widths (``MLA_SHAPE``), its decoupled key unrotated. ``n_layers`` cuts the stack (a quick look
    at a few layers; the dense layers stay first)."""
    experts = getattr(model, "experts", 1)
    if getattr(model, "shared_experts", 0) > 1:
        raise ValueError(f"gpt_config: {model.name} has several shared experts, which this GPT does not build")
    dense = model.layers - (model.moe_layers or model.layers) if experts > 1 else 0
    moe = dict(n_experts=experts, top_k=model.top_k, shared_expert=model.shared_experts == 1,
               expert_load="balanced", d_ff=model.expert_ffn or model.ffn, dense_layers=dense,
               dense_d_ff=model.ffn) if experts > 1 else {"d_ff": model.ffn}
    if getattr(model, "mla_latent", None):
        moe.update(MLA_SHAPE, kv_latent=model.mla_latent, rope_dim=model.mla_rope or 0)
    gated = bool(model.gated)
    vocab = model.vocab if model.vocab % 8 == 0 else -(-model.vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return GPTConfig(vocab_size=vocab, seq_len=model.seq_len, d_model=model.hidden,
                     n_layers=model.layers if n_layers is None else max(n_layers, 1), n_heads=model.heads,
                     n_kv_heads=model.kv_heads, **moe, mlp="swiglu" if gated else "gelu",
                     norm="rmsnorm" if gated else "layernorm", bias=not gated, tie_embeddings=bool(model.tied))


def active_params(config: GPTConfig, num_params: int) -> int:
    """The parameters a token uses: all of them, less the experts it is not routed to (``n_experts - top_k``
    expert MLPs per layer)."""
    if not config.n_experts:
        return num_params
    per_expert = (3 if config.mlp == "swiglu" else 2) * config.d_model * config.d_ff
    if config.bias:
        per_expert += config.d_ff * (2 if config.mlp == "swiglu" else 1) + config.d_model
    return num_params - config.n_moe_layers * (config.n_experts - config.top_k) * per_expert


def model_flops_per_token(config: GPTConfig, num_params: int) -> tuple[float, float]:
    """(``6 N``, ``6 N + 12 s h L``): a token's training FLOPs without and with attention's score products, ``N``
    the parameters it uses (``active_params``); latent attention's heads count their own widths,
    ``6 s L H (d_qk + d_v)`` (``12 s h L`` when they are ``h / H``)."""
    six_n = 6.0 * active_params(config, num_params)
    qk = config.head_dim + (config.rope_dim if config.kv_latent is not None else 0)
    v = config.v_head_dim or config.head_dim
    return six_n, six_n + 6.0 * config.seq_len * config.n_heads * (qk + v) * config.n_layers


def simulate_step(model: GPTConfig, parallel: ParallelConfig, global_batch: int, *, cluster: Cluster | None = None,
                  precision: str = "bf16", timeout: float = 3600) -> ScaleStep:
    """Time one training step of ``model`` laid out by ``parallel`` on ``parallel.world_size`` simulated GPUs.

    ``cluster`` sets the GPU, the links and the device model (``md.Cluster(kernels="measured")`` for kernels timed
    as a real GPU runs them, the ideal roofline by default). Shape-only in 2-byte arrays (so activations and
    messages are booked as a bf16 run holds them), products charged at ``precision``'s peak, one representative rank
    per pipeline stage. Raises the ledger's ``OutOfMemoryError`` (naming the rank and the categories) when the
    layout does not fit.
    """
    cluster = Cluster() if cluster is None else cluster
    start = time.perf_counter()
    res = train(model, parallel, steps=1, global_batch=global_batch, cluster=cluster, dtype="float16",
                precision=Precision(precision),
                backend=Backend("inprocess", shape_only=True, representatives=True, timeout=timeout))
    wall = time.perf_counter() - start
    step = float(res.time[0])
    busy = res.trace.busy_within([w[0] for w in res.windows])  # each rank's seconds of compute in its step
    fullest = int(np.argmax(res.peak_memory))
    gpus = parallel.world_size
    tokens = global_batch * model.seq_len
    six_n, with_attention = model_flops_per_token(model, res.num_params)
    peak = cluster.gpu.peak(precision)
    hbm = cluster.gpu.hbm_bytes if cluster.hbm_bytes is None else cluster.hbm_bytes
    return ScaleStep(model=model, parallel=parallel, global_batch=global_batch, step_time=step,
                     mfu=six_n * tokens / (step * gpus * peak),
                     tflops_per_gpu=with_attention * tokens / (step * gpus) / 1e12,
                     peak_memory=float(res.peak_memory[fullest]), breakdown=dict(res.peak_breakdown[fullest]),
                     hbm_bytes=float(hbm), num_params=int(res.num_params), gpus=gpus,
                     simulated_ranks=len(set(representatives(parallel, global_batch))), wall_seconds=wall,
                     compute_time=max(busy, default=0.0), result=res)

