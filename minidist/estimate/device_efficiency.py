"""The planner's two efficiency constants read off a device model (book ch3a, ch18; labs 01, 18).

Property: the planner prices a layer's passes as its FLOPs at a fraction ``gemm`` of the peak plus
``overhead_bytes`` of HBM traffic per activation element per pass for everything that is not a matrix product
(``perf.py``). A device model (``md.hardware.KernelModel``) prices the same layer kernel by kernel. For one layer
shape both are sums over the same two groups of work, so a device model *is* such a pair: ``gemm`` is the
products' FLOPs over the time its products take at the peak, and ``overhead_bytes`` the time of every other kernel
(launch costs included) expressed as HBM bytes per activation element and pass. ``device_efficiency`` computes the
pair from the kernels minidist's GPT launches for one layer (``gpt_ops``), so the planner can run on the measured
device, and the two constants fitted on Megatron-LM 2021 (``calibration.py``) can be read as a device of their
own: one whose products and fused elementwise kernels ran as that software ran them.

The host's issue time is left out: at the sizes the planner searches every kernel outlasts it (a layer's
products last milliseconds), and the pair describes the GPU's time.
"""

from __future__ import annotations

from minidist.estimate._check import count
from minidist.estimate.gpt_ops import Shard, block_backward, block_forward
from minidist.estimate.perf import Efficiency
from minidist.hardware import kernels as K
from minidist.hardware.specs import GPU

PASSES = 3  # forward, and the backward's two (the planner's unit: a pass over the layer's activations)


def layer_kernels(kernels: K.KernelModel, shard: Shard, gpu: GPU, fmt: str = "bf16") -> tuple[float, float, float]:
    """``(product FLOPs, product seconds, other seconds)`` of one layer's forward and backward on ``gpu`` priced by
    ``kernels`` (GPU time only), for the micro-batch and tensor-parallel share described by ``shard``."""
    flops = gemm_s = other_s = 0.0
    peak = gpu.peak(fmt)
    for op in block_forward(shard) + block_backward(shard):
        if op.kind != "compute":
            continue
        priced = kernels.kernels(op.name, op.flops, op.nbytes, fmt, peak, gpu.hbm_bw, gpu.peak("fp32"), op.shape)
        if kernels.ideal:  # one charge per op: the products and attention are the FLOPs, the rest is traffic
            product = op.name.startswith(("matmul", "scaled_dot_product_attention"))
            split = [("gemm" if product else "elementwise", op.flops, op.nbytes, 0)]
        else:
            split = K.split(op.name, op.flops, op.nbytes, op.shape)
        for (kind, f, _, _), (_, seconds) in zip(split, priced, strict=True):
            if kind == "gemm":
                flops += f
                gemm_s += seconds
            else:
                other_s += seconds
    return flops, gemm_s, other_s


def device_efficiency(kernels: K.KernelModel, model, gpu: GPU, seq_len: int | None = None, micro_batch: int = 1,
                      tp: int = 1, fmt: str = "bf16") -> Efficiency:
    """The planner's ``Efficiency(gemm, overhead_bytes)`` that prices one layer of ``model`` (an
    ``md.estimate.model``) as ``kernels`` does on ``gpu``: ``micro_batch`` sequences of ``seq_len`` tokens, its
    width split ``tp`` ways, in format ``fmt`` (2 bytes a number)."""
    fn = "device_efficiency"
    s = model.seq_len if seq_len is None else count(fn, "seq_len", seq_len)
    count(fn, "micro_batch", micro_batch)
    count(fn, "tp", tp)
    if model.heads % tp or model.ffn % tp:
        raise ValueError(f"{fn}: tp={tp} must divide the heads ({model.heads}) and the MLP width ({model.ffn})")
    shard = Shard(micro_batch, s, model.hidden, model.heads, model.ffn, model.vocab, tp, 2,
                  kv_heads=model.kv_heads if model.kv_heads != model.heads else 0,
                  mlp="swiglu" if model.gated else "gelu", norm="rmsnorm" if model.gated else "layernorm",
                  bias=not model.gated)
    flops, gemm_s, other_s = layer_kernels(kernels, shard, gpu, fmt)
    elements = PASSES * micro_batch * s * model.hidden / tp  # activation elements the planner counts per layer
    return Efficiency(gemm=flops / (gpu.peak(fmt) * gemm_s), overhead_bytes=other_s * gpu.hbm_bw / elements)
