"""Which kernels eager PyTorch launches for one op the autograd charges (book ch2, ch3a; lab 01).

Property: an op is not one kernel. A matrix product's backward is two products (the input's gradient, the
weight's); attention written out is two batched products, a scale, a mask and a softmax forward and seven kernels
backward; a foreach optimizer step is eight multi-tensor kernels. ``split`` turns one charged op into those kernels,
each with its kind, its share of the FLOPs and bytes, and the length that decides how well it runs (a product's inner
dimension, a softmax's row); ``kernels.py`` prices them.
"""

from __future__ import annotations

TRANSCENDENTAL = 4  # FLOPs the autograd charges for exp, tanh, erf, log (autograd/ops.py)

# the kind of kernel each op the autograd charges becomes; anything not listed is elementwise
_KIND = {"matmul": "gemm", "matmul.backward": "gemm", "matmul.backward_input": "gemm",
         "matmul.backward_weight": "gemm", "attention.block": "gemm", "attention.block.backward": "gemm",
         "layer_norm": "norm", "layer_norm.backward": "norm", "rms_norm": "norm", "rms_norm.backward": "norm",
         "softmax": "softmax", "softmax.backward": "softmax", "log_softmax": "softmax",
         "log_softmax.backward": "softmax", "cross_entropy": "softmax", "cross_entropy.backward": "softmax",
         "gelu": "activation", "gelu.backward": "activation", "silu": "activation", "silu.backward": "activation",
         "exp": "activation", "log": "activation", "tanh": "activation", "pow": "activation"}
# PyTorch's softmax keeps a row of up to this many elements in registers; a longer row is read again from memory
ROW_IN_REGISTERS = 1024
# PyTorch's foreach AdamW: eight multi-tensor kernels (weight decay, two moments, sqrt, divide, add eps, update)
OPTIMIZER_KERNELS = 8


def split(name: str, flops: float, nbytes: float, shape: tuple = ()) -> list[tuple[str, float, float, int]]:
    """The kernels ``(kind, flops, bytes, length)`` eager PyTorch launches for one charged op. ``length`` is a
    product's inner (summed) dimension or a softmax's row, 0 where unknown.

    ``shape``: what the autograd reports beside the counts: ``(batch, m, k, n)`` for a matrix product (its
    backward is as many products as it has FLOPs for: the input's gradient sums over n, the weight's over
    batch x m), ``(batch_heads, tq, tk, d, dv)`` for attention, the input's shape for a softmax or a norm.
    """
    kind = _KIND.get(name) or "elementwise"
    if kind == "gemm" and name.startswith("matmul") and len(shape) == 4:
        b, m, k, n = shape
        if name == "matmul":
            return [("gemm", flops, nbytes, k)]
        count = max(1, round(flops / (2 * b * m * k * n))) if flops else 1
        inner = [n, b * m][:count] if name == "matmul.backward" else [n if name.endswith("input") else b * m]
        return [("gemm", flops / count, nbytes / count, i) for i in inner]
    if name.startswith("scaled_dot_product_attention") and len(shape) == 5:
        return _attention(name.endswith("backward"), flops, nbytes, *shape)
    if name == "optimizer.step":
        return [("elementwise", flops / OPTIMIZER_KERNELS, nbytes / OPTIMIZER_KERNELS, 0)] * OPTIMIZER_KERNELS
    if name.startswith("scaled_dot_product_attention"):
        return [("gemm", flops, nbytes, 0)]  # no shape: priced as one fused kernel
    return [(kind, flops, nbytes, shape[-1] if shape and kind == "softmax" else 0)]


def _attention(backward: bool, flops: float, nbytes: float, bh: int, tq: int, tk: int, d: int, dv: int
               ) -> list[tuple[str, float, float]]:
    """Attention written out, as the autograd computes it: q scaled, ``q k^T``, the mask, softmax, ``P v``; the
    backward the two products through ``v``, softmax's backward, the mask's, the two products through ``k``, the
    scale's. Every score pass moves the (tq x tk) matrix of every head; ``e`` is read off the charged bytes."""
    pairs = bh * tq * tk
    q, k, v, o = bh * tq * d, bh * tk * d, bh * tk * dv, bh * tq * dv
    if backward:
        e = nbytes / (q + k + v + 4 * o + 2 * pairs)  # the charge: inputs, P twice, the gradients
        return [("gemm", 2 * pairs * dv, e * (o + v + pairs), dv), ("gemm", 2 * pairs * dv, e * (pairs + o + v), tq),
                ("softmax", 4 * pairs, 3 * e * pairs, tk), ("elementwise", pairs, 2 * e * pairs, 0),
                ("gemm", 2 * pairs * d, e * (pairs + k + q), tk), ("gemm", 2 * pairs * d, e * (pairs + q + k), tq),
                ("elementwise", q, 2 * e * q, 0)]
    e = nbytes / (q + k + v + o)  # the charge: the inputs and the output
    return [("elementwise", q, 2 * e * q, 0), ("gemm", 2 * pairs * d, e * (q + k + pairs), d),
            ("elementwise", pairs, 2 * e * pairs, 0), ("softmax", (TRANSCENDENTAL + 3) * pairs, 2 * e * pairs, tk),
            ("gemm", 2 * pairs * dv, e * (pairs + v + o), tk)]
