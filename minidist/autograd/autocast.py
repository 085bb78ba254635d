"""Autocast's mechanism: matrix products computed from rounded operands, everything else untouched
(book ch30, lab 21).

Property: a product of low-precision operands accumulated in high precision loses only what rounding the
operands and the result loses, while sums over many terms (softmax's normaliser, a norm's variance, the
loss) lose far more in low precision. So mixed precision rounds exactly the GEMMs: their operands, their
output, and in the backward the gradients they receive and produce, as a GPU's bf16/fp16 tensor cores with
fp32 accumulation do. The format itself lives in ``minidist.precision`` (``md.precision.autocast``), which
installs its rounding function here; the autograd only knows that a rounding is in force.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Rounding = Callable[[np.ndarray], np.ndarray]

# Read by matmul at every call: None (full precision) or functions rounding an array to the compute format,
# one for the forward's operands and result, one for the gradients (fp8 recipes use E4M3, then E5M2).
_round: Rounding | None = None
_round_grad: Rounding | None = None


def matmul_rounding() -> tuple[Rounding | None, Rounding | None]:
    """The (forward, gradient) roundings matrix products use now (None: none)."""
    return _round, _round_grad


def set_matmul_rounding(forward: Rounding | None, gradient: Rounding | None = None) -> tuple:
    """Install roundings for the matrix products that follow (``gradient`` defaults to ``forward``);
    returns the previous pair, which this function also accepts as ``forward``."""
    global _round, _round_grad
    if isinstance(forward, tuple):
        forward, gradient = forward
    elif gradient is None:
        gradient = forward
    previous = (_round, _round_grad)
    _round, _round_grad = forward, gradient
    return previous
