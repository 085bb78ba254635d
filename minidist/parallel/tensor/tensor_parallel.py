"""Tensor parallelism, Megatron style: the linearity of matrix multiplication (chapter 15, lab 09).

Split ``W = [W_1 | ... | W_t]`` by columns and ``Y = XW = [X W_1 | ... | X W_t]``: each of ``t``
ranks computes its own block of outputs from the whole input, with no communication. Split ``W``
by rows and ``X`` by columns to match and ``Y = X_1 W_1 + ... + X_t W_t``: each rank holds one
partial sum and a single all-reduce completes it. Chaining the two (columns, then an elementwise
function on the local block, then rows) costs one all-reduce for two matrices: the Megatron MLP
(fc1 by columns, GELU, fc2 by rows) and attention (q, k, v by heads, ``wo`` by rows).

The communication is written as a pair of conjugate autograd operators, so it is explicit in the
graph and shows up in the trace:

* ``f`` (:class:`CopyToTensorParallel`): identity forward, all-reduce backward. A replicated input
  entering column-parallel matrices gets from each rank only the part of its gradient that flows
  through that rank's columns; the all-reduce adds the parts.
* ``g`` (:class:`ReduceFromTensorParallel`): all-reduce forward, identity backward, where the
  partial sums of row-parallel matrices leave.

A layer therefore costs 2 all-reduces forward (``g`` after attention and after the MLP) and 2
backward (``f`` before each). With sequence parallelism (``sequence_parallel.py``, chapter 17)
the activations between layers are split along the sequence instead of replicated, and each
all-reduce becomes its two halves: an all-gather where ``f`` was, a reduce-scatter where ``g``
was (:class:`GatherFromSequenceParallel`, :class:`ReduceScatterToSequenceParallel`).

The column- and row-parallel layers built from these operators are in ``parallel_linear.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import dist
from minidist.autograd import Function
from minidist.autograd.shape_only import c_order
from minidist.collectives import offered


@dataclass(frozen=True)
class TPGroup:
    """Who this rank is in its tensor-parallel group. ``group`` is a ProcessGroup (None: all ranks);
    with ``size == 1`` nothing is communicated, so the layers also run outside ``md.launch``."""

    group: object = None
    size: int = 1
    rank: int = 0
    sequence_parallel: bool = False
    algorithm: str | None = None  # collective algorithm (None: the runtime's choice)
    overlap: bool = False  # with sequence parallelism: collectives hidden behind the matmuls (tp_overlap.py)

    @classmethod
    def of(cls, group=None, sequence_parallel: bool = False, algorithm: str | None = None) -> TPGroup:
        """The group's size and this rank's place in it (inside ``md.launch``)."""
        return cls(group, dist.get_world_size(group), dist.get_rank(group), sequence_parallel, algorithm)

    def block(self, n: int, what: str) -> tuple[int, int]:
        """``[lo, hi)``: this rank's contiguous 1/size of ``n`` items (which must divide evenly)."""
        if n % self.size:
            raise ValueError(f"tensor parallel: {what}={n} is not divisible by tp={self.size}")
        b = n // self.size
        return self.rank * b, (self.rank + 1) * b


# -- the collectives, on raw arrays --------------------------------------------------------
def _all_reduce(a: np.ndarray, tp: TPGroup, op=None) -> np.ndarray:
    if tp.size > 1:
        dist.all_reduce(a, op=dist.ReduceOp.SUM if op is None else op, group=tp.group,
                        algorithm=offered("all_reduce", tp.algorithm))
    return a


def all_gather_along(a: np.ndarray, tp: TPGroup, axis: int) -> np.ndarray:
    """Concatenate every rank's ``a`` along ``axis`` (rank order)."""
    if tp.size == 1:
        return a
    src = c_order(np.moveaxis(a, axis, 0))
    out = np.empty((tp.size * src.shape[0],) + src.shape[1:], dtype=a.dtype, like=src)
    dist.all_gather_into_tensor(out, src, group=tp.group, algorithm=offered("all_gather", tp.algorithm))
    return c_order(np.moveaxis(out, 0, axis))


def reduce_scatter_along(a: np.ndarray, tp: TPGroup, axis: int) -> np.ndarray:
    """Sum ``a`` over the ranks and keep this rank's 1/size block along ``axis``."""
    if a.shape[axis] % tp.size:
        raise ValueError(f"sequence parallel: dimension {axis} of shape {a.shape} (the sequence) is not divisible "
                         f"by tp={tp.size}")
    if tp.size == 1:
        return a.copy()
    src = c_order(np.moveaxis(a, axis, 0))
    out = np.empty((src.shape[0] // tp.size,) + src.shape[1:], dtype=a.dtype, like=src)
    dist.reduce_scatter_tensor(out, src, group=tp.group, algorithm=offered("reduce_scatter", tp.algorithm))
    return c_order(np.moveaxis(out, 0, axis))


def _own(a: np.ndarray, tp: TPGroup, axis: int) -> np.ndarray:
    lo, hi = tp.block(a.shape[axis], f"dimension {axis} of shape {a.shape}")
    return c_order(np.take(a, np.arange(lo, hi), axis=axis))


# -- the conjugate operators ---------------------------------------------------------------
class CopyToTensorParallel(Function):
    """``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.data

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.data, ctx.tp), None


class ReduceFromTensorParallel(Function):
    """``g``: all-reduce forward (partial sums -> sum), identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        return _all_reduce(x.data.copy(), tp)

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherFromTensorParallel(Function):
    """Concatenate the ranks' blocks along the last axis; backward keeps this rank's block."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return all_gather_along(x.data, tp, x.ndim - 1)

    @staticmethod
    def backward(ctx, g):
        return _own(g.data, ctx.tp, g.ndim - 1), None


class ScatterToTensorParallel(Function):
    """Keep this rank's block of the last axis; backward all-gathers the blocks' gradients."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _own(x.data, tp, x.ndim - 1)

    @staticmethod
    def backward(ctx, g):
        return all_gather_along(g.data, ctx.tp, g.ndim - 1), None


class GatherFromSequenceParallel(Function):
    """Sequence parallelism's ``f``: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, tp, axis=1):
        ctx.tp, ctx.axis = tp, axis
        return all_gather_along(x.data, tp, axis)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_along(g.data, ctx.tp, ctx.axis), None, None


class ReduceScatterToSequenceParallel(Function):
    """Sequence parallelism's ``g``: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, tp, axis=1):
        ctx.tp, ctx.axis = tp, axis
        return reduce_scatter_along(x.data, tp, axis)

    @staticmethod
    def backward(ctx, g):
        return all_gather_along(g.data, ctx.tp, ctx.axis), None, None


class ScatterToSequenceParallel(Function):
    """Keep this rank's block of the sequence (a replicated tensor entering the sequence-parallel
    region); backward all-gathers the blocks' gradients so every rank has the whole gradient."""

    @staticmethod
    def forward(ctx, x, tp, axis=1):
        ctx.tp, ctx.axis = tp, axis
        return _own(x.data, tp, axis)

    @staticmethod
    def backward(ctx, g):
        return all_gather_along(g.data, ctx.tp, ctx.axis), None, None
