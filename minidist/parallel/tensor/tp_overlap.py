"""Tensor-parallel communication hidden behind the matmul that needs it (chapter 30, lab 22).

Property: a matrix product is separable by blocks of rows, and a sum can be accumulated in any order.

With sequence parallelism (``sequence_parallel.py``) a column-parallel layer all-gathers the sequence
shards and then multiplies, ``Y = [X_0; ...; X_{t-1}] W``, and a row-parallel layer multiplies and
then reduce-scatters, ``Y_j = sum_r X_r[j] W_r``. Done in that order the matmul waits for the whole
collective. But the rows of ``Y`` that come from ``X_c`` need only ``X_c``: on a ring of ``t`` ranks,
at step ``s`` rank ``r`` multiplies the shard it holds, ``X_{(r-s) mod t}``, while passing that shard
on to rank ``r+1``. Every step costs ``max(matmul of one shard, one message)`` instead of their sum,
and the last step's transfer is not needed at all (Wang et al., "Overlap Communication with Dependent
Computation via Decomposition in Large Deep Learning Models", ASPLOS 2023; Megatron-LM and
TransformerEngine ship it as TP communication overlap).

The reduce-scatter side is the same ring run backwards in the dependency sense: at step ``s`` rank
``r`` computes its partial product for block ``b = (r - s - 1) mod t``, adds the running sum that
arrived from rank ``r-1``, and sends it on; after ``t - 1`` steps the block that arrives is its own.
The next block's product is computed while the previous running sum travels.

Each step is an ``isend``/``irecv`` pair and a charged matmul, so the simulated clock shows the
overlap by itself: a send posted before a matmul leaves when the matmul starts, and the receive is
joined after it. The sums are accumulated in ring order rather than the reduce-scatter algorithm's,
so results agree with the unfused layer to rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.autograd import cost
from minidist.autograd.shape_only import c_order
from minidist.collectives import offered

TAG = 3 << 20  # point-to-point tags of the overlapped rings, apart from the pipeline's


def _matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    rows = a.size // a.shape[-1]
    cost.charge("matmul", 2 * rows * w.shape[0] * w.shape[1],
                (a.size + w.size + rows * w.shape[1]) * a.dtype.itemsize, a.dtype, (1, rows, *w.shape))
    return a @ w


def _neighbours(tp) -> tuple[int, int]:
    """Global ranks of the next and previous member of the tensor-parallel ring."""
    nxt, prev = (tp.rank + 1) % tp.size, (tp.rank - 1) % tp.size
    if tp.group is None:  # the whole world: group ranks are global ranks
        return nxt, prev
    return dist.get_global_rank(tp.group, nxt), dist.get_global_rank(tp.group, prev)


def _start(a: np.ndarray, tp, axis: int, gather: bool):
    """Begin an all-gather (``gather``) or a reduce-scatter of ``a`` along ``axis`` in the background;
    ``finish()`` waits and returns the result with the axis back in place."""
    if not gather and a.shape[axis] % tp.size:
        raise ValueError(f"tensor-parallel overlap: dimension {axis} of shape {a.shape} (the sequence) is not "
                         f"divisible by tp={tp.size}")
    src = c_order(np.moveaxis(a, axis, 0))
    rows = src.shape[0] * tp.size if gather else src.shape[0] // tp.size
    out = np.empty((rows,) + src.shape[1:], dtype=a.dtype, like=src)  # a shape-only input: a shape-only result
    if gather:
        work = dist.all_gather_into_tensor(out, src, group=tp.group, async_op=True,
                                           algorithm=offered("all_gather", tp.algorithm))
    else:
        work = dist.reduce_scatter_tensor(out, src, group=tp.group, async_op=True,
                                          algorithm=offered("reduce_scatter", tp.algorithm))

    def finish() -> np.ndarray:
        work.wait()
        return c_order(np.moveaxis(out, 0, axis))
    return finish


def start_all_gather(a: np.ndarray, tp, axis: int):
    """Begin gathering ``a`` along ``axis`` in the background; ``finish()`` waits and returns it."""
    return _start(a, tp, axis, gather=True)


def start_reduce_scatter(a: np.ndarray, tp, axis: int):
    """Begin reduce-scattering ``a`` along ``axis`` in the background; ``finish()`` waits and returns
    this rank's block of the sum."""
    return _start(a, tp, axis, gather=False)


def all_gather_matmul(x: np.ndarray, ws: list[np.ndarray], tp, axis: int = 1) -> tuple[np.ndarray, list]:
    """``all_gather(x) @ w`` for each ``w`` of ``ws``, each shard's product computed while the next
    shard travels. Returns the gathered input and the products (rank order along ``axis``)."""
    t = tp.size
    if t == 1:
        return x, [_matmul(x, w) for w in ws]
    nxt, prev = _neighbours(tp)
    n = x.shape[axis]
    total = np.empty(x.shape[:axis] + (t * n,) + x.shape[axis + 1:], dtype=x.dtype, like=x)
    outs = [np.empty(total.shape[:-1] + (w.shape[1],), dtype=np.result_type(x, w), like=x) for w in ws]
    cur = c_order(x)
    for s in range(t):
        c = (tp.rank - s) % t
        rows = [slice(None)] * x.ndim
        rows[axis] = slice(c * n, (c + 1) * n)
        rows = tuple(rows)
        total[rows] = cur
        work = []
        if s < t - 1:  # pass the shard on before multiplying it: the transfer runs under the matmul
            incoming = np.empty_like(cur)
            work = [dist.isend(cur, nxt, tag=TAG + s), dist.irecv(incoming, prev, tag=TAG + s)]
        for w, out in zip(ws, outs):
            out[rows] = _matmul(cur, w)
        for wk in work:
            wk.wait()
        if work:
            cur = incoming
    return total, outs


def matmul_reduce_scatter(x: np.ndarray, w: np.ndarray, tp, axis: int = 1) -> np.ndarray:
    """``reduce_scatter(x @ w)`` along ``axis``: each block's partial product is computed while the
    running sum of the previous block travels round the ring."""
    t = tp.size
    if t == 1:
        return _matmul(x, w)
    if x.shape[axis] % t:
        raise ValueError(f"tensor-parallel overlap: dimension {axis} of shape {x.shape} (the sequence) is not "
                         f"divisible by tp={t}")
    nxt, prev = _neighbours(tp)
    n = x.shape[axis] // t
    acc, sends = None, []
    for s in range(t):
        b = (tp.rank - s - 1) % t
        rows = [slice(None)] * x.ndim
        rows[axis] = slice(b * n, (b + 1) * n)
        recv = None
        if s > 0:  # the running sum of this block, from the previous rank, arrives under this matmul
            incoming = np.empty_like(acc)
            recv = dist.irecv(incoming, prev, tag=TAG + s)
        acc = _matmul(c_order(x[tuple(rows)]), w)
        if recv is not None:
            recv.wait()
            acc = incoming + acc
        if s < t - 1:
            sends.append(dist.isend(acc, nxt, tag=TAG + s + 1))
    for wk in sends:
        wk.wait()
    return acc
