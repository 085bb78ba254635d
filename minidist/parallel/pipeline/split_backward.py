"""Split backward: the input gradient now, the weight gradient later (zero-bubble pipelines, chapter 16).

Property: for ``Y = X W + b`` the backward is two independent products, ``dX = dY W^T`` (which the
previous pipeline stage is waiting for) and ``dW = X^T dY``, ``db = sum dY`` (which nothing waits
for until the optimizer step). Zero-bubble schedules run the first in an ``I`` pass and defer the
second to a ``W`` pass that fills an otherwise idle slot.

How it is done without changing the autograd's API: :meth:`WeightGradStore.wrap` installs, in each
``Linear`` of a stage, an ``affine`` (the module's seam for its product) built on
``autograd.Function``. Its backward returns ``dX`` to the engine as usual. Outside
:meth:`WeightGradStore.capture` it also returns ``dW`` and ``db``, so a plain ``B`` pass is the
ordinary backward (bitwise: the same numpy products as ``Linear``'s own graph). Inside
``capture(key)`` it returns no weight gradient and instead files a closure that holds ``X`` and
``dY``; :meth:`WeightGradStore.flush` runs the closures of ``key`` later, adds the products into
``.grad`` and fires the parameters' post-accumulate hooks as the engine would. Only the
Linear weights are deferred: norm scales and embeddings (O(d) or a row scatter per token) keep
their gradient in the ``I`` pass.

Tensor-parallel layers (``tensor_parallel.py``) defer the same way: their fused functions ask
:func:`weight_grads` for the weight gradients, which computes them at once outside an ``I`` pass and
files them with the store that is capturing inside one. All their collectives (the input gradient's
all-reduce or reduce-scatter, the sequence re-gather) stay in the ``I`` pass, so a ``W`` pass is
local arithmetic only and the ranks of a tensor-parallel group never wait on each other in it.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor, unbroadcast
from minidist.nn.layers import Linear


def _accumulate(p: Tensor, g: np.ndarray) -> None:
    """Add ``g`` into ``p.grad`` like the engine does for a finished leaf, then run its post hooks."""
    g = g.astype(p.data.dtype, copy=False)
    if p.grad is None:
        p.grad = g if g.base is None else g.copy()
    else:
        p.grad += g
    for hook in list(p._post_hooks or ()):
        hook(p)


_capturing: list = []  # the stores whose capture() block is open, innermost last


def weight_grads(params, compute, keep) -> tuple:
    """The weight gradients of ``params``: ``compute()`` now, or inside an ``I`` pass ``None`` for each
    (the engine accumulates nothing) with ``compute`` filed for the ``W`` pass, which adds its results
    into the parameters' ``.grad``. ``keep``: the arrays the deferred work holds alive (for the ledger).
    ``params`` may contain None (a missing bias); ``compute`` returns one gradient per entry."""
    store = _capturing[-1] if _capturing else None
    if store is None or store.key is None:
        return tuple(compute())

    def deferred():
        for p, g in zip(params, compute()):
            if p is not None and g is not None:
                _accumulate(p, g)

    store.pending.setdefault(store.key, []).append((deferred, tuple(keep)))
    return (None,) * len(params)


class WeightGradStore:
    """Deferred weight-gradient work, filed under a key (a micro-batch and chunk) by I passes."""

    def __init__(self) -> None:
        self.key = None
        self.pending: dict[object, list] = {}
        self._wrapped: set[int] = set()

    @contextmanager
    def capture(self, key):
        """Backwards run inside this block defer their Linear weight gradients under ``key``."""
        previous, self.key = self.key, key
        _capturing.append(self)
        try:
            yield self
        finally:
            _capturing.pop()
            self.key = previous

    def stash_bytes(self, key) -> int:
        """Bytes the deferred work of ``key`` keeps alive (the X and dY arrays, each buffer once)."""
        seen: dict[int, int] = {}
        for _, arrays in self.pending.get(key, ()):
            for a in arrays:
                b = a
                while isinstance(b.base, np.ndarray):
                    b = b.base
                seen[id(b)] = b.nbytes
        return sum(seen.values())

    def flush(self, key) -> None:
        """Run the weight-gradient products filed under ``key`` (the W pass)."""
        for fn, _ in self.pending.pop(key, ()):
            fn()

    def split(self, *modules) -> None:
        """Give every ``Linear`` inside ``modules`` a splittable backward, and every column-parallel
        layer's local matmul too (the row-parallel and sequence-gathered column functions of
        ``tensor_parallel.py`` need no wrapping: they call :func:`weight_grads` themselves)."""
        for module in modules:
            for sub in module.modules():
                local = getattr(sub, "splits_local_matmul", False)  # a column-parallel layer's own matmul
                if (isinstance(sub, Linear) or local) and id(sub) not in self._wrapped:
                    self._wrapped.add(id(sub))
                    self.wrap(sub)

    def wrap(self, linear) -> None:
        """Route ``linear``'s product (its ``affine`` seam, ``x @ weight + bias``) through the splittable
        function; the module is otherwise unchanged. A column-parallel layer's ``local`` matmul uses the
        same seam."""

        class SplitLinear(Function):
            @staticmethod
            def forward(ctx, x, w, b):
                xd, wd = x.data, w.data
                k, n = wd.shape
                x2 = xd.reshape(-1, k)
                y = (x2 @ wd).reshape(xd.shape[:-1] + (n,))
                if _cost._hook is not None:
                    _cost.charge("matmul", 2 * x2.shape[0] * k * n, xd.nbytes + wd.nbytes + y.nbytes, y.dtype,
                                     (1, x2.shape[0], k, n))
                if b is not None:
                    y = y + b.data
                    if _cost._hook is not None:
                        _cost.charge("add", y.size, 3 * y.nbytes, y.dtype)
                # a sharded weight (ZeRO-3/FSDP) is gathered again before the backward, not kept
                ctx.save_for_backward(x2, w if getattr(w, "regathered", False) else wd, b)
                return y

            @staticmethod
            def backward(ctx, g):
                x2, wd, b = ctx.saved_tensors
                wd = wd.data if isinstance(wd, Tensor) else wd
                k, n = wd.shape
                g2 = g.data.reshape(-1, n)
                rows = g2.shape[0]
                if _cost._hook is not None:
                    _cost.charge("matmul.backward_input", 2 * rows * k * n, g2.nbytes + wd.nbytes + x2.nbytes, g2.dtype,
                                 (1, rows, k, n))
                gx = (g2 @ wd.T).reshape(g.shape[:-1] + (k,))
                gdata = g.data

                def compute():
                    if _cost._hook is not None:
                        _cost.charge("matmul.backward_weight", 2 * rows * k * n,
                                     g2.nbytes + x2.nbytes + wd.nbytes, g2.dtype, (1, rows, k, n))
                    gw = x2.T @ g2
                    gb = unbroadcast(gdata, (n,)) if b is not None else None
                    return gw, gb

                gw, gb = weight_grads((linear.weight, linear.bias), compute, (x2, g2))
                return gx, gw, gb

        def split_affine(x, weight, bias):
            return SplitLinear.apply(x, weight, bias)

        linear.affine = split_affine
