"""Which kernels eager PyTorch launches for one op the autograd charges (book ch2, ch3a; lab 01).

Property: an op is not one kernel. A matrix product's backward is two products (the input's gradient, the
weight's); attention written out is nine kernels each way (two batched products, the scale, the mask's clone and
fill, softmax, and the copies ``torch.matmul`` makes of the heads' transposed views); a foreach optimizer step is
eight multi-tensor kernels that move 20 arrays' worth of bytes; the loss is ``log_softmax`` and ``nll_loss`` forward,
a zero fill, a scatter and ``log_softmax``'s backward; a norm's backward is two kernels (the input's gradient, then
the weight's and bias's). ``split`` turns one charged op into those kernels,
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
# the arrays each of those kernels reads and writes (torch.optim.AdamW(foreach=True), capturable=False): the weight
# decay p *= 1 - lr wd (p: 2), m.lerp_(g) (m, g, m: 3), v *= beta2 (2), v.addcmul_(g, g) (v, g, v: 3), s = sqrt(v)
# (2), s /= sqrt(bias correction) (2), s += eps (2), p.addcdiv_(m, s) (p, m, s, p: 4); 20 passes over the weights
# where the charge counts a fused update's 7 (``OPTIMIZER_ARRAYS``: read p, g, m, v, write p, m, v)
OPTIMIZER_PASSES = (2, 3, 2, 3, 2, 2, 2, 4)
OPTIMIZER_ARRAYS = 7


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
        return [("elementwise", flops / OPTIMIZER_KERNELS, nbytes * n / OPTIMIZER_ARRAYS, 0) for n in OPTIMIZER_PASSES]
    if name.startswith("cross_entropy") and len(shape) >= 2:
        return _cross_entropy(name.endswith("backward"), flops, nbytes, shape)
    if name == "layer_norm.backward":
        # two kernels: the input's gradient (reads dy and x, writes dx: the charge), then the weight's and the
        # bias's, which read dy and x again and sum them over the rows
        return [("norm", flops * 0.6, nbytes, 0), ("norm", flops * 0.4, nbytes * 2 / 3, 0)]
    if name.startswith("scaled_dot_product_attention"):
        return [("gemm", flops, nbytes, 0)]  # no shape: priced as one fused kernel
    return [(kind, flops, nbytes, shape[-1] if shape and kind == "softmax" else 0)]


def _attention(backward: bool, flops: float, nbytes: float, bh: int, tq: int, tk: int, d: int, dv: int
               ) -> list[tuple[str, float, float]]:
    """Attention written out, as the autograd computes it: q scaled, ``q k^T``, the mask, softmax, ``P v``; the
    backward the two products through ``v``, softmax's backward, the mask's, the two products through ``k``, the
    scale's. Every score pass moves the (tq x tk) matrix of every head; ``e`` is read off the charged bytes.

    As eager PyTorch runs it: ``torch.matmul`` on the heads' views (B, H, T, hd), transposed out of (B, T, H, hd),
    folds batch and heads with a reshape that copies q, k^T and v into contiguous batches (and, backward, the
    output's gradient); ``masked_fill`` is out of place, a clone of the scores and then ``masked_fill_`` on the
    clone, and its backward is ``grad.masked_fill(mask, 0)``: two kernels, four passes over the scores each way."""
    pairs = bh * tq * tk
    q, k, v, o = bh * tq * d, bh * tk * d, bh * tk * dv, bh * tq * dv
    if backward:
        e = nbytes / (q + k + v + 4 * o + 2 * pairs)  # the charge: inputs, P twice, the gradients
        mask = [("elementwise", 0, 2 * e * pairs, 0), ("elementwise", pairs, 2 * e * pairs, 0)]
        return [("elementwise", 0, 2 * e * o, 0), ("gemm", 2 * pairs * dv, e * (o + v + pairs), dv),
                ("gemm", 2 * pairs * dv, e * (pairs + o + v), tq), ("softmax", 4 * pairs, 3 * e * pairs, tk),
                *mask, ("gemm", 2 * pairs * d, e * (pairs + k + q), tk),
                ("gemm", 2 * pairs * d, e * (pairs + q + k), tq), ("elementwise", q, 2 * e * q, 0)]
    e = nbytes / (q + k + v + o)  # the charge: the inputs and the output
    mask = [("elementwise", 0, 2 * e * pairs, 0), ("elementwise", pairs, 2 * e * pairs, 0)]
    return [("elementwise", 0, 2 * e * q, 0), ("elementwise", 0, 2 * e * k, 0), ("elementwise", 0, 2 * e * v, 0),
            ("elementwise", q, 2 * e * q, 0), ("gemm", 2 * pairs * d, e * (q + k + pairs), d), *mask,
            ("softmax", (TRANSCENDENTAL + 3) * pairs, 2 * e * pairs, tk),
            ("gemm", 2 * pairs * dv, e * (pairs + v + o), tk)]


def _cross_entropy(backward: bool, flops: float, nbytes: float, shape: tuple) -> list[tuple[str, float, float, int]]:
    """The loss as eager PyTorch runs it, ``log_softmax`` then ``nll_loss``: forward, ``log_softmax`` reads the
    logits and writes their log-probabilities (twice the charge, which reads the logits once), ``nll_loss`` gathers
    one element a row; backward, ``nll_loss``'s gradient is a zero-filled matrix of the logits' size with one
    element a row then set, and ``log_softmax``'s backward reads it and the saved output and writes the gradient
    (the charge reads and writes the logits: 1/2 and 3/2 of it). Every kernel's bytes are a fixed share of the
    charge, so a format that rescales the charge rescales each kernel alike."""
    n = 1
    for s in shape:
        n *= s
    row = shape[-1]
    if not n:
        return [("softmax", flops, nbytes, row)]
    per_row = nbytes / row  # the charge over one element a row
    if backward:
        return [("elementwise", 0, nbytes / 2, 0), ("elementwise", 0, per_row, 0),
                ("softmax", flops, 3 * nbytes / 2, row)]
    return [("softmax", flops, 2 * nbytes, row), ("elementwise", 0, per_row, 0)]
