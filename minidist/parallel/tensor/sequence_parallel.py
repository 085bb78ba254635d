"""Megatron sequence parallelism: the layers between tensor-parallel regions, split along the sequence
(Korthikanti et al. 2022; chapter 17, labs 09 and 11).

With tensor parallelism alone, LayerNorm, dropout and the residual adds run on the whole (B, T, d)
activation on every rank: about 10 of the 34 s b h bytes per layer in Korthikanti's count are not
divided by ``t``. These operations treat every position independently, so each rank can run them
on its own 1/t of the sequence instead. The all-reduce that closed a tensor-parallel region then
splits into its two halves: a reduce-scatter (sum, keep my positions) where the region ends and an
all-gather (rebuild the whole sequence) where the next one begins, the same bytes as the
all-reduce. With the input of each column-parallel matmul also kept only as a shard (gathered again
in the backward, see ``parallel_linear._GatheredColumns``), every activation of the layer is
divided by ``t``.

What changes here:

* :class:`SequenceParallelLayerNorm`, :class:`SequenceParallelRMSNorm`: a norm on the local shard.
  Its scale and shift are replicated but each rank differentiates them over its own positions only,
  so their gradients are partial: :func:`replicated` routes a parameter through a node whose
  backward all-reduces its gradient over the group. :func:`replicated_scope` does that for all
  of a block's such parameters (the norms and the row-parallel biases) in one small all-reduce per
  block and micro-batch. (Megatron defers this to once per step; per micro-batch composes with
  every data-parallel strategy unchanged and costs a few kilobytes.)
* :class:`SequenceParallelDropout`: the mask of the whole sequence is drawn from the generator every
  rank shares (same seed, same draws) and each rank applies its slice, so the result is the
  single-device dropout exactly.
* :class:`SequenceParallelPositions`: position embeddings looked up for the whole sequence, then
  this rank's slice is kept (backward: all-gather, so every rank gets the table's full gradient).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.autograd import Function
from minidist.autograd import functional as F
from minidist.autograd.shape_only import c_order
from minidist.nn.layers import Dropout, Embedding, LayerNorm, RMSNorm
from minidist.parallel.tensor.tensor_parallel import ScatterToSequenceParallel, TPGroup, _all_reduce

_scope: dict[int, object] = {}  # id(parameter) -> the tensor to use for it inside replicated_scope


class _ReplicatedGrads(Function):
    """Identity forward (the parameters, flattened together); backward sums their gradients over the group."""

    @staticmethod
    def forward(ctx, tp, *params):
        ctx.tp, ctx.shapes = tp, [p.shape for p in params]
        return np.concatenate([p.data.reshape(-1) for p in params])

    @staticmethod
    def backward(ctx, g):
        flat = _all_reduce(g.data, ctx.tp)
        parts, start = [], 0
        for shape in ctx.shapes:
            n = int(np.prod(shape))
            parts.append(flat[start:start + n].reshape(shape))
            start += n
        return (None, *parts)


def _synced(tp: TPGroup, params: list) -> list:
    flat = _ReplicatedGrads.apply(tp, *params)
    out, start = [], 0
    for p in params:
        out.append(flat[start:start + p.data.size].reshape(p.shape))
        start += p.data.size
    return out


def _active(tp: TPGroup) -> bool:
    return tp.sequence_parallel and tp.size > 1


def replicated(p, tp: TPGroup):
    """``p`` as used on a sequence shard: its gradient is summed over the group in the backward."""
    if not _active(tp):
        return p
    s = _scope.get(id(p))
    return s if s is not None else _synced(tp, [p])[0]


@contextmanager
def replicated_scope(tp: TPGroup, params):
    """Inside, :func:`replicated` hands out views of one node that reduces all ``params``' gradients at once."""
    params = [p for p in params if p is not None]
    if not (_active(tp) and params):
        yield
        return
    before = {id(p): _scope.get(id(p)) for p in params}
    _scope.update({id(p): v for p, v in zip(params, _synced(tp, params))})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                _scope.pop(k, None)
            else:
                _scope[k] = v


def adopt(cls, module, **attrs):
    """An instance of ``cls`` that takes over ``module``'s parameters and settings (same names)."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    for k, v in attrs.items():
        object.__setattr__(new, k, v)
    return new


class SequenceParallelLayerNorm(LayerNorm):
    """LayerNorm of this rank's positions; scale and shift gradients summed over the group."""

    tp: TPGroup

    def forward(self, x):
        b = None if self.bias is None else replicated(self.bias, self.tp)
        return F.layer_norm(x, replicated(self.weight, self.tp), b, self.eps)


class SequenceParallelRMSNorm(RMSNorm):
    """RMSNorm of this rank's positions; scale gradient summed over the group."""

    tp: TPGroup

    def forward(self, x):
        return F.rms_norm(x, replicated(self.weight, self.tp), self.eps)


def sequence_parallel_norm(norm, tp: TPGroup):
    cls = SequenceParallelRMSNorm if isinstance(norm, RMSNorm) else SequenceParallelLayerNorm
    return adopt(cls, norm, tp=tp)


class SequenceParallelDropout(Dropout):
    """Dropout of a (B, T/t, ...) shard that equals the single-device dropout of the whole (B, T, ...)."""

    tp: TPGroup

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        n = x.shape[1]
        full = (x.shape[0], n * self.tp.size) + tuple(x.shape[2:])
        draw = self.rng.random(full, dtype=np.float64 if x.dtype == np.float64 else np.float32)
        mask = ((draw >= self.p) * (1.0 / (1.0 - self.p))).astype(x.dtype, copy=False)
        lo = self.tp.rank * n
        return x * c_order(mask[:, lo:lo + n])


class SequenceParallelPositions(Embedding):
    """Position embeddings for the whole sequence, then this rank's slice of it (axis 0)."""

    tp: TPGroup

    def forward(self, ids):
        return ScatterToSequenceParallel.apply(super().forward(ids), self.tp, 0)
