"""Column- and row-parallel linear layers: the two halves of Megatron's split (chapter 15, lab 09).

A column-parallel layer keeps ``W_i``, the ``i``-th block of columns, and computes its block of
outputs from the whole input; a row-parallel layer keeps the matching block of rows and produces a
partial sum that ``g`` (an all-reduce, or with sequence parallelism a reduce-scatter) completes.
The operators they are built from are in ``tensor_parallel.py``.

The fused functions compute their weight gradients through ``split_backward.weight_grads``, so
inside a zero-bubble pipeline's ``I`` pass (chapter 16) those products wait for the ``W`` pass while
every collective still happens in ``I``.

Weights are stored ``(in, out)`` as in ``minidist.nn.Linear``; a parallel layer keeps only its
block and checks on every call that it holds a block of the size its group implies, so it cannot
run as a dense layer by mistake.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import Function, cost
from minidist.nn.layers import Linear, affine
from minidist.nn.module import Module, Parameter
from minidist.parallel.pipeline.split_backward import weight_grads
from minidist.parallel.tensor.sequence_parallel import replicated
from minidist.parallel.tensor.tensor_parallel import (
    CopyToTensorParallel,
    GatherFromTensorParallel,
    ScatterToTensorParallel,
    TPGroup,
    _all_reduce,
    all_gather_along,
    reduce_scatter_along,
)
from minidist.parallel.tensor.tp_overlap import (
    all_gather_matmul,
    matmul_reduce_scatter,
    start_all_gather,
    start_reduce_scatter,
)


def _charge_matmul(rows: int, k: int, n: int, dtype) -> None:
    cost.charge("matmul", 2 * rows * k * n, (rows * k + k * n + rows * n) * np.dtype(dtype).itemsize, dtype,
                (1, rows, k, n))


class _GatheredColumns(Function):
    """All-gather along the sequence, then several column-parallel matmuls sharing that input.

    Fused so that only the sequence shard is kept for the backward (Korthikanti et al.): the
    backward gathers the input again to form the weight gradients, and reduce-scatters the input
    gradient. Output: the matmuls' outputs concatenated along the last axis.
    """

    @staticmethod
    def forward(ctx, x, tp, *wb):
        ctx.tp, ctx.x, ctx.wb = tp, x, wb
        if tp.overlap:  # each shard's products while the next shard travels
            _, ys = all_gather_matmul(x.data, [w.data for w in wb[::2]], tp)
            return np.concatenate([y + b.data if b is not None else y for y, b in zip(ys, wb[1::2])], axis=-1)
        total = all_gather_along(x.data, tp, 1)
        outs = []
        for w, b in zip(wb[::2], wb[1::2]):
            _charge_matmul(total.size // total.shape[-1], w.shape[0], w.shape[1], total.dtype)
            y = total @ w.data
            outs.append(y + b.data if b is not None else y)
        return np.concatenate(outs, axis=-1)

    @staticmethod
    def backward(ctx, gy):
        tp, x, wb = ctx.tp, ctx.x, ctx.wb
        if tp.overlap:  # the extra all-gather runs under the input-gradient matmuls
            gathered = start_all_gather(x.data, tp, 1)
            dx, blocks = _input_grad(gy.data, wb[::2])
            total = gathered()
            scattered = start_reduce_scatter(dx, tp, 1)  # and the reduce-scatter under the weight gradients
            grads = _column_weight_grads(gy.data, total, blocks, wb)
            return (scattered(), None, *grads)
        total = all_gather_along(x.data, tp, 1)  # the extra all-gather: only the shard was kept
        t2 = total.reshape(-1, total.shape[-1])
        dx, start, blocks = np.zeros_like(total), 0, []
        for w in wb[::2]:
            n = w.shape[1]
            g = gy.data[..., start:start + n]
            blocks.append((start, n))
            start += n
            dx += g @ w.data.T
            _charge_matmul(t2.shape[0], n, w.shape[0], total.dtype)

        def compute():  # the weight gradients (deferred to the W pass inside a zero-bubble I pass)
            grads = []
            for (lo, n), w, b in zip(blocks, wb[::2], wb[1::2]):
                g2 = gy.data[..., lo:lo + n].reshape(-1, n)
                grads += [t2.T @ g2, None if b is None else g2.sum(axis=0)]
                _charge_matmul(w.shape[0], t2.shape[0], n, total.dtype)
            return grads

        grads = weight_grads(wb, compute, (t2, gy.data))
        return (reduce_scatter_along(dx, tp, 1), None, *grads)


def _input_grad(gy: np.ndarray, ws) -> tuple[np.ndarray, list]:
    """``sum_j gy_j @ w_j^T`` over the column blocks ``gy_j`` of the fused matmuls; their (start, width)."""
    dx, start, blocks = None, 0, []
    for w in ws:
        n = w.shape[1]
        blocks.append((start, n))
        g = gy[..., start:start + n]
        start += n
        _charge_matmul(g.size // n, n, w.shape[0], gy.dtype)
        dx = g @ w.data.T if dx is None else dx + g @ w.data.T
    return dx, blocks


def _column_weight_grads(gy: np.ndarray, total: np.ndarray, blocks, wb) -> tuple:
    t2 = total.reshape(-1, total.shape[-1])

    def compute():  # deferred to the W pass inside a zero-bubble I pass
        grads = []
        for (lo, n), w, b in zip(blocks, wb[::2], wb[1::2]):
            g2 = gy[..., lo:lo + n].reshape(-1, n)
            grads += [t2.T @ g2, None if b is None else g2.sum(axis=0)]
            _charge_matmul(w.shape[0], t2.shape[0], n, total.dtype)
        return grads

    return weight_grads(wb, compute, (t2, gy))


class _RowParallelMatmul(Function):
    """``x_i @ W_i`` followed by ``g`` (all-reduce), or by a reduce-scatter along the sequence with
    sequence parallelism; fused so the partial sums are not kept once reduced."""

    @staticmethod
    def forward(ctx, x, w, tp):
        ctx.tp, ctx.x, ctx.w = tp, x, w
        if tp.overlap and tp.sequence_parallel:  # each block's partial product while the last sum travels
            return matmul_reduce_scatter(x.data, w.data, tp)
        _charge_matmul(x.size // x.shape[-1], w.shape[0], w.shape[1], x.dtype)
        partial = x.data @ w.data
        if tp.sequence_parallel:
            return reduce_scatter_along(partial, tp, 1)
        return _all_reduce(partial, tp)

    @staticmethod
    def backward(ctx, g):
        tp, x, w = ctx.tp, ctx.x, ctx.w
        if tp.overlap and tp.sequence_parallel:  # the input gradient of each shard while the next travels
            g, (dx,) = all_gather_matmul(g.data, [w.data.T], tp)
        else:
            g = all_gather_along(g.data, tp, 1) if tp.sequence_parallel else g.data
            dx = None
        g2, x2 = g.reshape(-1, g.shape[-1]), x.data.reshape(-1, x.shape[-1])
        if dx is None:
            _charge_matmul(g2.shape[0], w.shape[1], w.shape[0], g.dtype)

        def compute():
            _charge_matmul(w.shape[0], g2.shape[0], w.shape[1], g.dtype)
            return (x2.T @ g2,)

        (gw,) = weight_grads((w,), compute, (x2, g2))  # deferred inside a zero-bubble I pass
        return (g @ w.data.T if dx is None else dx), gw, None


# -- the layers ----------------------------------------------------------------------------
def _check_group(layer: Module, tp: TPGroup) -> None:
    """A parallel layer must hold exactly its block: no silent fallback to a dense (or wrong) one."""
    axis, full = layer.shard_axis, (layer.in_features, layer.out_features)
    want = list(full)
    want[axis] //= tp.size
    if tuple(layer.weight.shape) != tuple(want):
        raise RuntimeError(f"{type(layer).__name__}: holds a weight of shape {tuple(layer.weight.shape)} but its "
                           f"block of a ({full[0]}, {full[1]}) matrix over tp={tp.size} ranks is {tuple(want)}")


class _ParallelLinear(Module):
    shard_axis = 1  # the axis of the (in, out) weight that is split across ranks
    bias_sharded = True
    affine = staticmethod(affine)  # Linear's seam for the local product (see split_backward)

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, bias: bool = True, *,
                 rng=None, init_std: float | None = None, dtype="float32") -> None:
        """Draws the full matrix exactly as ``Linear`` would (same rng, same result), keeps this rank's block."""
        self._adopt(Linear(in_features, out_features, bias, rng=rng, init_std=init_std, dtype=dtype), tp)

    @classmethod
    def from_dense(cls, linear: Linear, tp: TPGroup):
        """This rank's block of an existing ``Linear`` (weights copied, the dense arrays not kept)."""
        layer = cls.__new__(cls)
        layer._adopt(linear, tp)
        return layer

    def _adopt(self, linear: Linear, tp: TPGroup) -> None:
        Module.__init__(self)
        self.in_features, self.out_features, self.tp = linear.in_features, linear.out_features, tp
        name = "out_features" if self.shard_axis == 1 else "in_features"
        lo, hi = tp.block(getattr(linear, name), f"{type(self).__name__} {name}")
        w = linear.weight.data
        self.weight = Parameter((w[:, lo:hi] if self.shard_axis == 1 else w[lo:hi]).copy())
        b = linear.bias
        self.bias = None if b is None else Parameter((b.data[lo:hi] if self.bias_sharded else b.data).copy())

    def local(self, x):
        """This rank's own matmul on an input that is already where it must be."""
        return self.affine(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, tp={self.tp.size}, block={tuple(self.weight.shape)}, "
                f"bias={self.bias is not None}")


def column_parallel(x, layers: list, tp: TPGroup) -> list:
    """Apply column-parallel layers that share one input: ``f`` once (or, with sequence parallelism,
    one all-gather of the sequence shards), then each rank's own matmuls. Returns their outputs."""
    for layer in layers:
        _check_group(layer, tp)
        if x.shape[-1] != layer.in_features:
            raise ValueError(f"{type(layer).__name__}: input has last dimension {x.shape[-1]}, expected "
                             f"in_features={layer.in_features} (input shape {tuple(x.shape)})")
    if not tp.sequence_parallel:
        x = CopyToTensorParallel.apply(x, tp)
        return [layer.local(x) for layer in layers]
    if x.ndim != 3:
        raise ValueError(f"sequence parallel: expected (batch, sequence shard, features), got shape {tuple(x.shape)}")
    wb = [t for layer in layers for t in (layer.weight, layer.bias)]
    y = _GatheredColumns.apply(x, tp, *wb)
    outs, start = [], 0
    for layer in layers:
        n = layer.weight.shape[1]
        outs.append(y[..., start:start + n])
        start += n
    return outs


class ColumnParallelLinear(_ParallelLinear):
    """``Y_i = X W[:, block i] + b[block i]``: each rank computes its block of output features.

    The output stays split (the next layer is usually row-parallel); ``gather_output=True``
    concatenates the blocks so every rank has all of Y.
    """

    shard_axis = 1
    splits_local_matmul = True  # a zero-bubble pipeline defers this layer's weight gradient (split_backward)

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, bias: bool = True, *,
                 gather_output: bool = False, **kw) -> None:
        super().__init__(in_features, out_features, tp, bias, **kw)
        self.gather_output = gather_output

    def _adopt(self, linear: Linear, tp: TPGroup) -> None:
        super()._adopt(linear, tp)
        self.gather_output = getattr(self, "gather_output", False)

    def forward(self, x):
        (y,) = column_parallel(x, [self], self.tp)
        return GatherFromTensorParallel.apply(y, self.tp) if self.gather_output else y


class RowParallelLinear(_ParallelLinear):
    """``Y = sum_i X_i W[block i, :] + b``: each rank holds a block of input features and makes a
    partial sum; the bias is added once, after the reduction (adding it on every rank would count
    it ``t`` times). ``input_is_parallel=False`` first keeps this rank's block of a replicated input."""

    shard_axis = 0
    bias_sharded = False

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, bias: bool = True, *,
                 input_is_parallel: bool = True, **kw) -> None:
        super().__init__(in_features, out_features, tp, bias, **kw)
        self.input_is_parallel = input_is_parallel

    def _adopt(self, linear: Linear, tp: TPGroup) -> None:
        super()._adopt(linear, tp)
        self.input_is_parallel = getattr(self, "input_is_parallel", True)

    def forward(self, x):
        _check_group(self, self.tp)
        if not self.input_is_parallel:
            x = ScatterToTensorParallel.apply(x, self.tp)
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"RowParallelLinear: input has last dimension {x.shape[-1]}, expected this rank's "
                             f"block of in_features={self.in_features} over tp={self.tp.size}: "
                             f"{self.weight.shape[0]} (input shape {tuple(x.shape)})")
        y = _RowParallelMatmul.apply(x, self.weight, self.tp)
        if self.bias is None:
            return y
        return y + replicated(self.bias, self.tp)
