"""The vocabulary split across the tensor-parallel group: embedding, output head and cross-entropy
(Megatron; chapter 15, lab 09).

The two largest matrices of a small-d_model GPT are (V, d). Rank ``r`` keeps rows
``[r V/t, (r+1) V/t)`` of the token embedding and the matching columns of the output head.

* Embedding: a lookup is a matmul with a one-hot matrix, so it is linear too. Each rank returns
  the rows it owns and zeros for the others; summing over ranks (``g``, or a reduce-scatter with
  sequence parallelism) gives every token its row.
* Head: column-parallel, each rank scores its slice of the vocabulary; the logits stay split.
* Cross-entropy over split logits: ``loss = log sum_v exp(z_v - m) - (z_target - m)`` needs a
  maximum, a sum and the target's logit, each combined over ranks with scalars per token (an
  all-reduce MAX of N numbers, then one SUM of 2N), never the (N, V) logits. Its gradient
  ``softmax - onehot`` is local to each rank's columns.
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.autograd import Function, cost
from minidist.autograd import functional as F
from minidist.autograd.ops import TRANSCENDENTAL
from minidist.collectives import offered
from minidist.nn.layers import Embedding
from minidist.nn.module import Module, Parameter
from minidist.parallel.tensor.parallel_linear import _GatheredColumns
from minidist.parallel.tensor.tensor_parallel import (
    CopyToTensorParallel,
    ReduceFromTensorParallel,
    ReduceScatterToSequenceParallel,
    TPGroup,
    _all_reduce,
)


class VocabParallelEmbedding(Embedding):
    """This rank's rows of the (V, d) token table; the lookups are summed over the group."""

    shard_axis = 0

    @classmethod
    def from_dense(cls, emb: Embedding, tp: TPGroup) -> VocabParallelEmbedding:
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.num_embeddings, layer.embedding_dim, layer.tp = emb.num_embeddings, emb.embedding_dim, tp
        lo, hi = tp.block(emb.num_embeddings, "VocabParallelEmbedding vocab_size")
        layer.weight = Parameter(emb.weight.data[lo:hi].copy())
        return layer

    def forward(self, ids):
        tp = self.tp
        ids = np.asarray(getattr(ids, "data", ids))
        n = self.num_embeddings // tp.size
        if self.weight.shape != (n, self.embedding_dim):
            raise RuntimeError(f"VocabParallelEmbedding: holds {tuple(self.weight.shape)} but its block of "
                               f"({self.num_embeddings}, {self.embedding_dim}) over tp={tp.size} is "
                               f"{(n, self.embedding_dim)}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise IndexError(f"VocabParallelEmbedding: ids must lie in [0, {self.num_embeddings}), got range "
                             f"[{ids.min()}, {ids.max()}] (ids shape {ids.shape})")
        local = ids - tp.rank * n
        mine = (local >= 0) & (local < n)
        rows = F.embedding(np.where(mine, local, 0), self.weight) * mine[..., None].astype(self.weight.dtype)
        if tp.sequence_parallel:
            return ReduceScatterToSequenceParallel.apply(rows, tp, 1)
        return ReduceFromTensorParallel.apply(rows, tp)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, tp={self.tp.size}, block={tuple(self.weight.shape)}"


class TiedVocabParallelHead(Module):
    """Logits of this rank's vocabulary slice from the (sharded) token embedding: ``x @ wte_block.T``."""

    def __init__(self, embedding: VocabParallelEmbedding) -> None:
        super().__init__()
        object.__setattr__(self, "embedding", embedding)  # not registered: the parameter belongs to wte

    def forward(self, x):
        tp, w = self.embedding.tp, self.embedding.weight.T
        if tp.sequence_parallel:
            return _GatheredColumns.apply(x, tp, w, None)
        return CopyToTensorParallel.apply(x, tp) @ w


class _VocabParallelCrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, targets, tp):
        x = logits.data.reshape(-1, logits.shape[-1])
        t = np.asarray(targets).reshape(-1)
        n, v = x.shape
        if t.shape != (n,):
            raise ValueError(f"vocab_parallel_cross_entropy: logits {tuple(logits.shape)} need {n} targets, "
                             f"got shape {np.shape(targets)}")
        if t.size and (t.min() < 0 or t.max() >= v * tp.size):
            raise IndexError(f"vocab_parallel_cross_entropy: targets must lie in [0, {v * tp.size})")
        m = x.max(axis=1)
        if tp.size > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp.group, algorithm=offered("all_reduce", tp.algorithm))
        e = np.exp(x - m[:, None])
        local = t - tp.rank * v
        mine = (local >= 0) & (local < v)
        rows = np.arange(n)
        picked = np.where(mine, x[rows, np.where(mine, local, 0)] - m, 0.0)
        stats = _all_reduce(np.stack([e.sum(axis=1), picked]), tp)  # sum of exp, shifted target logit
        ctx.probs, ctx.mine, ctx.local, ctx.shape = e / stats[0][:, None], mine, local, logits.shape
        out = np.asanyarray(np.mean(np.log(stats[0]) - stats[1])).astype(x.dtype)
        # the same charge as F.cross_entropy on this rank's block of the vocabulary
        cost.charge("cross_entropy", (TRANSCENDENTAL + 4) * x.size, x.nbytes + t.nbytes + out.nbytes, x.dtype, x.shape)
        return out

    @staticmethod
    def backward(ctx, g):
        cost.charge("cross_entropy.backward", 3 * ctx.probs.size, 2 * ctx.probs.nbytes, ctx.probs.dtype,
                    ctx.probs.shape)
        grad = ctx.probs.copy()
        rows = np.nonzero(ctx.mine)[0]
        grad[rows, ctx.local[rows]] -= 1.0
        grad *= g.data / grad.shape[0]
        return grad.reshape(ctx.shape), None, None


def vocab_parallel_cross_entropy(logits, targets, tp: TPGroup):
    """Mean cross-entropy of logits split by vocabulary (``logits`` (..., V/t), ``targets`` (...))."""
    return _VocabParallelCrossEntropy.apply(logits, np.asarray(getattr(targets, "data", targets)), tp)
