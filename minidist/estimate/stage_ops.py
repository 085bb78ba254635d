"""What one pipeline stage of a predicted step computes and holds (book ch6, ch27; lab 18; ``predict.py``).

Property: a rank's step is fixed by its share of the layers. A virtual stage's forward and backward are the op
lists of its blocks (a checkpointed segment runs its forward again before its backward), its activations are
those of its blocks kept from forward to backward, and its gradients finish in the reverse order of its
parameters, which is the order the data-parallel buckets fill. ``predict_train`` walks these lists.
"""

from __future__ import annotations

from minidist.estimate.gpt_ops import (
    Shard,
    activation_bytes,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
)
from minidist.estimate.moe_ops import (
    moe_block_activation_bytes,
    moe_block_backward,
    moe_block_forward,
    moe_head_backward,
    moe_head_forward,
)


def cut_buckets(sizes: list[int], bucket_elems: float, dp: int) -> list[tuple[int, int]]:
    """``data_parallel.make_buckets`` over the parameters in the order their gradients finish (``sizes``):
    cut after the one that fills a bucket. Per bucket: how many parameters it holds, its size padded to a
    multiple of ``dp``."""
    out, count, size = [], 0, 0
    for n in sizes:
        count, size = count + 1, size + n
        if size >= bucket_elems:
            out.append((count, -(-size // dp) * dp))
            count = size = 0
    if count:
        out.append((count, -(-size // dp) * dp))
    return out


def even_cut(layers: int, pieces: int) -> list[tuple[int, int]]:
    size = layers // pieces
    return [(j * size, (j + 1) * size) for j in range(pieces)]


def segments(lo: int, hi: int, every: int | None, first: int | None) -> list[tuple[int, bool]]:
    """``md.parallel.recompute.segments`` as (layers, checkpointed) pairs."""
    if every is None:
        return [(1, False)] * (hi - lo)
    if first is not None:
        return [(1, i < lo + first) for i in range(lo, hi)]
    return [(min(i + every, hi) - i, True) for i in range(lo, hi, every)]


class Stage:
    """What one virtual stage computes, its forward and backward op lists (a checkpointed segment runs its
    forward again before its backward), the activations it keeps from forward to backward and the largest
    segment it rebuilds, and its parameters in the order their gradients finish."""

    def __init__(self, x: Shard, segments: list[tuple[int, bool]], first: bool, last: bool) -> None:
        self.first, self.last = first, last
        acts = activation_bytes(x)
        forward_ops, backward_ops = block_forward, block_backward
        head_fwd, head_bwd = head_forward(x), head_backward(x)
        if x.n_experts:  # every block's MLP is a mixture of experts (moe_ops.py); the loss adds their aux losses
            acts["block"] = moe_block_activation_bytes(x)
            forward_ops, backward_ops = moe_block_forward, moe_block_backward
            head_fwd, head_bwd = moe_head_forward(x, len(segments)), moe_head_backward(x, len(segments))
        fwd, bwd, held, rebuilt, freed, self.rebuilt_after_frees = [], [], 0.0, 0.0, 0.0, 0.0
        for k, checkpointed in segments:
            fwd += forward_ops(x) * k
            bwd = (forward_ops(x) * k if checkpointed else []) + backward_ops(x) * k + bwd
            held += x.t * x.h * x.e if checkpointed else k * acts["block"]  # a checkpoint keeps its output only
            rebuilt = max(rebuilt, k * acts["block"] if checkpointed else 0.0)
        for k, checkpointed in reversed(segments):
            # without a pipeline each segment lets go of its activations once its backward is done, so a
            # segment rebuilt late in the backward finds the later segments' memory already free
            if checkpointed:
                self.rebuilt_after_frees = max(self.rebuilt_after_frees, k * acts["block"] - freed)
            freed += x.t * x.h * x.e if checkpointed else k * acts["block"]
        self.forward = (embed_forward(x) if first else []) + fwd + (head_fwd if last else [])
        self.backward = (head_bwd if last else []) + bwd + (embed_backward(x) if first else [])
        self.held = held + (acts["embed"] if first else 0.0) + (acts["head"] if last else 0.0)
        self.rebuilt = rebuilt
        # the activations alive while each backward op runs: a segment lets go of its memory (and of what it
        # rebuilt) when its input's gradient is in, after the gradients of its weights
        alive, left = [], self.held
        alive += [left] * (len(head_bwd) if last else 0)
        for k, checkpointed in reversed(segments):
            ops = (len(forward_ops(x)) if checkpointed else 0) * k + len(backward_ops(x)) * k
            alive += [left + (k * acts["block"] if checkpointed else 0.0)] * ops
            left -= x.t * x.h * x.e if checkpointed else k * acts["block"]
        alive += [left] * (len(embed_backward(x)) if first else 0)
        self.alive = alive
        self.finish_order = [n for op in self.backward for n in op.grads]
