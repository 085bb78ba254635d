"""Mixed precision in the trainer: matrix products in a low-precision format over an fp32 master copy, the
loss scale agreed by every rank, and the ledger's 2 + 2 + 12 bytes per parameter (book ch30, lab 21).

Property: gradients are linear in the loss, so scaling the loss by ``S`` scales every gradient and every
partial sum the data-parallel reduction forms by ``S`` too; dividing the reduced gradient by ``S`` before the
update gives back exactly the unscaled sum (``S`` is a power of two). The reduction therefore runs on scaled
gradients unchanged, and only the overflow test needs the ranks to talk: each rank sees only its own shard
of the gradient (ZeRO, pipelines, tensor parallelism), so the ranks agree on "some gradient overflowed" with
one all-reduce of a flag before anyone steps, and all skip together.

Memory: a low-precision copy of the weights (2 bytes), low-precision gradients (2 bytes), and an fp32 master
copy with AdamW's two moments (12 bytes) per parameter, sharded by ZeRO as usual. The arrays themselves
stay in the working dtype (numpy has no bf16), holding values of the format: the ledger books what a GPU
would hold, and the links charge what a GPU would send, 2 bytes a number (``wire_scale``): bf16 gradients halve
the data-parallel traffic of fp32 ones.

Time: the clock charges what a GPU running the recipe moves and multiplies (``CHARGES``). Every tensor an op
reads or writes inside the micro-batches is a 2-byte one, so a memory-bound op takes half its fp32 time in any
of the three formats; the matrix products run at the format's peak, and fp8 feeds them 1-byte operands at
twice bf16's peak. fp8's gain over bf16 therefore shows only where the products dominate the step: norms,
softmax and the other elementwise ops stay in bf16. The optimizer's update of the fp32 master copy runs
outside the micro-batches and keeps its fp32 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from minidist import dist
from minidist.autograd.cost import CostHook, cost_hook, get_cost_hook
from minidist.parallel.memory import OPTIMIZER_MOMENTS, state_bytes_per_param
from minidist.precision import LossScaler, autocast
from minidist.runtime import ReduceOp

# what each precision rounds the products to (fp8: E4M3 forward, E5M2 gradients, one scale per tensor, the
# recipe of fp8 training on H100) and the peak it is charged at
RECIPES = {"bf16": dict(fmt="bf16"), "fp16": dict(fmt="fp16"),
           "fp8": dict(fmt="fp8_e4m3", grad_format="fp8_e5m2", scaling="tensor")}
LOW_BYTES = 2  # the weight copy and the gradients (fp8 keeps bf16 weights and casts them per product)
# how the clock charges an op under each recipe: (bytes per element, peak) for the matrix products, then for
# every other op
CHARGES = {"bf16": ((2, "bf16"), (2, "bf16")), "fp16": ((2, "fp16"), (2, "fp16")),
           "fp8": ((1, "fp8"), (2, "bf16"))}


@dataclass(frozen=True)
class MixedPrecision:
    """``precision``: None (the working dtype throughout), "bf16", "fp16" or "fp8". ``loss_scale``: None
    (dynamic for fp16, none otherwise), "dynamic", or a number (static)."""

    precision: str | None = None
    loss_scale: str | float | None = None

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in RECIPES:
            raise ValueError(f"parallel.train: precision must be None or one of {sorted(RECIPES)}, "
                             f"got {self.precision!r}")
        s = self.loss_scale
        number = isinstance(s, (int, float)) and not isinstance(s, bool)
        if not (s is None or s == "dynamic" or number and math.isfinite(s) and s > 0):
            raise ValueError(f"parallel.train: loss_scale must be None, 'dynamic' or a positive number, got {s!r}")
        if s is not None and self.precision is None:
            raise ValueError("parallel.train: loss_scale needs a low precision (precision='fp16', ...)")

    @property
    def active(self) -> bool:
        return self.precision is not None

    @contextmanager
    def context(self) -> Iterator[None]:
        """Where the micro-batches run: under autocast in the chosen format, each op charged to the clock at
        the format's bytes and peak (``CHARGES``)."""
        if not self.active:
            yield
            return
        inner = get_cost_hook()
        with autocast(**RECIPES[self.precision]), cost_hook(self.charging(inner) if inner is not None else None):
            yield

    def charging(self, inner: CostHook) -> CostHook:
        """``inner`` (the rank's cost hook) fed what the op costs in this format: a floating-point op's bytes
        rescaled from the working dtype's itemsize to the format's, and the format's peak named."""
        (mm_size, mm_peak), (size, peak) = CHARGES[self.precision]

        def hook(name: str, flops: float, nbytes: float, dtype, shape: tuple = ()) -> None:
            matmul = name.startswith("matmul")
            want = mm_size if matmul else size
            dtype = np.dtype(dtype)
            if dtype.kind == "f" and dtype.itemsize > want:
                nbytes = nbytes * want / dtype.itemsize
            inner(name, flops, nbytes, mm_peak if matmul else peak, shape)

        return hook

    def scaler(self) -> LossScaler | None:
        s = self.loss_scale if self.loss_scale is not None else "dynamic" if self.precision == "fp16" else None
        if s is None:
            return None
        return LossScaler(2.0**16) if s == "dynamic" else LossScaler(float(s), dynamic=False)

    def wire_scale(self, dtype: str) -> float:
        """Bytes a message of the step puts on the wire per byte of its ``dtype`` array: the gradients, weights and
        activations the ranks exchange are 2-byte numbers under mixed precision."""
        size = np.dtype(dtype).itemsize
        return LOW_BYTES / size if self.active and size > LOW_BYTES else 1.0

    def state_bytes(self, dtype: str, optimizer: str) -> dict[str, int]:
        if not self.active:
            return state_bytes_per_param(dtype, optimizer)
        return {"params": LOW_BYTES, "grads": LOW_BYTES, "optimizer": 4 * (1 + OPTIMIZER_MOMENTS[optimizer])}


def unscale_and_agree(pieces: list[tuple[np.ndarray, np.ndarray]], scaler: LossScaler) -> bool:
    """Unscale this rank's gradient pieces; every rank learns whether any rank overflowed (one all-reduce
    of a flag over the world) and the scale adapts alike everywhere. Returns whether to step."""
    flag = np.array([float(scaler.unscale_arrays(g for _, g in pieces))])
    dist.all_reduce(flag, op=ReduceOp.MAX)
    return scaler.update(bool(flag[0]))
