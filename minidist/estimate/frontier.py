"""Closed forms of the efficiency frontier: gradient compression and reduced precision
(book ch28, ch30; labs 19, 21).

Property: a gradient can be sent as fewer bits (quantisation), fewer entries (sparsification) or a
low-rank product, and each choice has a ratio you can compute before trying it; a 16-bit number
has a range, so a loss scale must lift small gradients above the smallest normal without pushing
the largest past the maximum.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.estimate._check import choice, count, fraction, nonnegative, positive
from minidist.precision.formats import FORMATS as _PRECISION

# (smallest normal, largest finite) of each low-precision format, from the formats md.precision emulates bit for bit
FORMATS = {name: (f.smallest_normal, f.max) for name, f in _PRECISION.items() if f.bits < 32}


def topk_compression_ratio(keep_fraction: float, value_bytes: float = 2, index_bytes: float = 4,
                           dense_bytes: float = 2) -> float:
    """Dense bytes over sparse bytes when sending the top k of d entries with their indices:
    dense / (k/d (value + index))."""
    fn = "topk_compression_ratio"
    k = fraction(fn, "keep_fraction", keep_fraction, open_low=True)
    return positive(fn, "dense_bytes", dense_bytes) / (k * (positive(fn, "value_bytes", value_bytes)
                                                            + nonnegative(fn, "index_bytes", index_bytes)))


def powersgd_compression_ratio(rows: int, cols: int, rank: int) -> float:
    """PowerSGD sends P (m x r) and Q (n x r) instead of M (m x n): ratio m n / (r (m + n))."""
    fn = "powersgd_compression_ratio"
    m, n, r = count(fn, "rows", rows), count(fn, "cols", cols), count(fn, "rank", rank)
    return m * n / (r * (m + n))


def quantization_compression_ratio(bits: float, dense_bits: float = 32) -> float:
    """Ratio of sending ``bits`` per entry instead of ``dense_bits`` (TernGrad's 2 bits: 16x vs fp32);
    the per-tensor scale is negligible for large tensors."""
    fn = "quantization_compression_ratio"
    return positive(fn, "dense_bits", dense_bits) / positive(fn, "bits", bits)


def min_loss_scale(grad_magnitude: float, dtype: str = "fp16") -> float:
    """Smallest power-of-two loss scale that lifts a gradient of this magnitude to the smallest normal
    number of ``dtype``: 2^ceil(log2(min_normal / g)) (fp16: 2^-14 / g), at least 1."""
    fn = "min_loss_scale"
    choice(fn, "dtype", dtype, FORMATS)
    g = positive(fn, "grad_magnitude", grad_magnitude)
    return max(1.0, 2.0 ** math.ceil(math.log2(FORMATS[dtype][0] / g)))


def max_loss_scale(max_grad: float, dtype: str = "fp16") -> float:
    """Largest loss scale that keeps the largest gradient finite: max_finite / max_grad."""
    choice("max_loss_scale", "dtype", dtype, FORMATS)
    return FORMATS[dtype][1] / positive("max_loss_scale", "max_grad", max_grad)


def is_update_swamped(weight: float, update: float, dtype: str = "float16") -> bool:
    """True when weight + update rounds back to weight in ``dtype`` (a numpy dtype name): the reason
    master weights are kept in fp32 (ch30)."""
    choice("is_update_swamped", "dtype", dtype, ("float16", "float32", "float64"))
    t = np.dtype(dtype).type
    return bool(t(weight) + t(update) == t(weight))
