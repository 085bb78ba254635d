"""Where to cut a model into pipeline stages (chapter 16, lab 10).

A pipeline is only as fast as its slowest stage, so the cut matters. :func:`partition` cuts a list
of layer costs into contiguous pieces minimising the largest piece: every block costs the same when
the cut is ``"even"``; with ``pp_balance="measured"`` the costs are each block's FLOPs, measured by
:func:`layer_costs` through the autograd's cost hook (the embeddings count with the first block, the
head and the loss with the last, which is where they run). :func:`stage_layout` gives the block
ranges of the ``p v`` virtual stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from minidist.autograd import Tensor, no_grad
from minidist.autograd import cost as _cost
from minidist.autograd import functional as F


def partition(costs: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Cut ``costs`` into ``parts`` contiguous non-empty ranges ``[lo, hi)`` minimising the largest sum.

    Exact dynamic programme over split points (O(n^2 parts)); ties keep earlier pieces larger."""
    n = len(costs)
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"partition: parts must be an int >= 1, got {parts!r}")
    if parts > n:
        raise ValueError(f"partition: cannot cut {n} layers into {parts} non-empty stages "
                         f"(need n_layers >= stages x virtual)")
    if any(c < 0 for c in costs):
        raise ValueError(f"partition: costs must be >= 0, got {list(costs)}")
    return list(_partition(tuple(float(c) for c in costs), parts))


@lru_cache(maxsize=64)
def _partition(costs: tuple, parts: int) -> tuple:
    """The programme itself, remembered: every rank of a launch cuts the same model (126 layers into 64
    stages is a million steps)."""
    n = len(costs)
    pre = np.concatenate([[0.0], np.cumsum(costs, dtype=float)])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]  # best[k][i]: first i layers in k pieces
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i] - 1e-12 * max(1.0, abs(v)):
                    best[k][i], cut[k][i] = v, j
    bounds, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        bounds.append((j, i))
        i = j
    return tuple(bounds[::-1])


def layer_costs(model, idx: np.ndarray, targets: np.ndarray) -> list[float]:
    """FLOPs of forward + backward of each block on one batch, the embeddings counted with block 0 and
    the final norm, head and loss with the last block (measured through the autograd's cost hook)."""
    flops = [0.0]

    def measure(fn) -> float:
        flops[0] = 0.0
        previous = _cost.set_cost_hook(lambda name, f, *_: flops.__setitem__(0, flops[0] + f))
        try:
            fn()
        finally:
            _cost.set_cost_hook(previous)
        return flops[0]

    def backward_from(fn, x=None):
        out = fn() if x is None else fn(Tensor(x.data, requires_grad=True))
        out.backward(np.ones_like(out.data))

    B, T = idx.shape
    costs = [measure(lambda: backward_from(lambda: model.wte(idx) + model.wpe(np.arange(T))))]
    with no_grad():
        h = model.wte(idx) + model.wpe(np.arange(T))
    for block in model.blocks:
        costs.append(measure(lambda: backward_from(block, h)))  # noqa: B023 (called at once)
        with no_grad():
            h = block(h)

    def head(x):
        return F.cross_entropy(model.lm_head(model.ln_f(x)).reshape(B * T, -1), targets.reshape(B * T))

    costs.append(measure(lambda: backward_from(head, h)))
    model.zero_grad()
    emb, *blocks, last = costs
    blocks[0] += emb
    blocks[-1] += last
    return blocks


def stage_layout(n_layers: int, stages: int, virtual: int = 1, costs: Sequence[float] | None = None
                 ) -> list[tuple[int, int]]:
    """Block ranges ``[lo, hi)`` of the ``stages * virtual`` virtual stages (even without ``costs``)."""
    costs = [1.0] * n_layers if costs is None else list(costs)
    if len(costs) != n_layers:
        raise ValueError(f"stage_layout: {len(costs)} costs for {n_layers} layers")
    return partition(costs, stages * virtual)
