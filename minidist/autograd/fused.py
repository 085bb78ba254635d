"""How a fused operation records itself: one node, whatever its internal steps.

A fused op computes its forward with numpy, keeps what its backward needs, and records a single
node whose closure returns one gradient per input (``record``). The helpers here are shared by
the fused ops in ``softmax.py``, ``norms.py``, ``activations.py``, ``attention.py``,
``masking.py`` and ``indexing.py``; ``functional.py`` gathers them under one name.

``blockwise`` is the CPU's version of kernel fusion. A fused elementwise op in numpy is still
several passes (one per ufunc call); run on a whole 4 MB activation, each pass streams it from
memory again. Run on cache-sized blocks, the passes after the first read the block from L2
instead. Every element sees the same operations in the same order, so the result is bitwise the
same as one call on the whole array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from minidist.autograd import grad_mode as _gm
from minidist.autograd.shape_only import ShapeArray
from minidist.autograd.tensor import Tensor, _const, _new


def record(out: np.ndarray, inputs: Sequence[Tensor | None], grads: Callable[[np.ndarray], Sequence],
           name: str) -> Tensor:
    """Record ``out`` as a node over the ``inputs`` that require grad.

    ``grads(g)`` returns one gradient per input (None where not needed or not a tensor).
    """
    if not _gm._enabled:
        return _const(out)
    need = [t is not None and t.requires_grad for t in inputs]
    if not any(need):
        return _const(out)
    parents = tuple(t for t, n in zip(inputs, need) if n)
    if all(need):
        return _new(out, parents, grads, name)
    return _new(out, parents, lambda g: tuple(gr for gr, n in zip(grads(g), need) if n), name)


#: Elements per block in ``blockwise``: the four or five float32 arrays of a kernel's block
#: (256 KiB each) stay within one core's L2 cache.
BLOCK = 65536


def blockwise(kernel: Callable[..., None], *arrays: np.ndarray) -> None:
    """Call ``kernel(*pieces)`` on aligned blocks of same-shape arrays (the kernel writes its outputs in place).

    The blocks are slices of the flattened arrays, so all must be C-contiguous; otherwise (a
    broadcast gradient, a transposed view) the kernel runs once on the whole arrays, as it does on
    shape-only arrays (no values to keep in cache: blocks would only repeat the same bookkeeping).
    """
    if any(isinstance(a, ShapeArray) for a in arrays) or not all(a.flags.c_contiguous for a in arrays):
        kernel(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, flat[0].size, BLOCK):
        kernel(*(f[i:i + BLOCK] for f in flat))


_vecdot = getattr(np, "vecdot", None)  # numpy >= 2


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot products along the last axis, ``sum(a * b, -1)`` without the temporary product."""
    if _vecdot is not None:
        return _vecdot(a, b)
    return np.einsum("...i,...i->...", a, b)


def needs_grad(t: Tensor | None) -> bool:
    return t is not None and t.requires_grad and _gm._enabled


def same_float(op: str, *ts: Tensor | None) -> np.dtype:
    dtypes = {t.data.dtype for t in ts if t is not None}
    if len(dtypes) > 1:
        raise TypeError(f"{op}: cannot mix dtypes {' and '.join(sorted(str(d) for d in dtypes))}; "
                        f"cast with .astype() first")
    return dtypes.pop()


def int_indices(ids: Any, op: str) -> np.ndarray:
    d = ids.data if isinstance(ids, Tensor) else np.asanyarray(ids)
    if d.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got dtype {d.dtype}")
    return d


def bool_mask(mask: Any, op: str) -> np.ndarray:
    m = mask.data if isinstance(mask, Tensor) else np.asanyarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"{op}: the mask/condition must be boolean, got dtype {m.dtype}")
    return m
