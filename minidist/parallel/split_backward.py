"""Split backward: the input gradient now, the weight gradient later (zero-bubble pipelines, chapter 16).

Property: for ``Y = X W + b`` the backward is two independent products, ``dX = dY W^T`` (which the
previous pipeline stage is waiting for) and ``dW = X^T dY``, ``db = sum dY`` (which nothing waits
for until the optimizer step). Zero-bubble schedules run the first in an ``I`` pass and defer the
second to a ``W`` pass that fills an otherwise idle slot.

How it is done without changing the autograd's API: :meth:`WeightGradStore.wrap` gives each
``Linear`` of a stage a forward built on ``autograd.Function``. Its backward returns ``dX`` to the
engine as usual. Outside :meth:`WeightGradStore.capture` it also returns ``dW`` and ``db``, so a
plain ``B`` pass is the ordinary backward (bitwise: the same numpy products as ``Linear``'s own
graph). Inside ``capture(key)`` it returns no weight gradient and instead files a closure that
holds ``X`` and ``dY``; :meth:`WeightGradStore.flush` runs the closures of ``key`` later, adds the
products into ``.grad`` and fires the parameters' post-accumulate hooks as the engine would. Only the
Linear weights are deferred: norm scales and embeddings (O(d) or a row scatter per token) keep
their gradient in the ``I`` pass.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.autograd import cost as _cost
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor, unbroadcast


def _accumulate(p: Tensor, g: np.ndarray) -> None:
    """Add ``g`` into ``p.grad`` like the engine does for a finished leaf, then run its post hooks."""
    g = g.astype(p.data.dtype, copy=False)
    if p.grad is None:
        p.grad = g if g.base is None else g.copy()
    else:
        p.grad += g
    for hook in list(p._post_hooks or ()):
        hook(p)


class WeightGradStore:
    """Deferred weight-gradient work, filed under a key (a micro-batch and chunk) by I passes."""

    def __init__(self) -> None:
        self.key = None
        self.pending: dict[object, list] = {}

    @contextmanager
    def capture(self, key):
        """Backwards run inside this block defer their Linear weight gradients under ``key``."""
        previous, self.key = self.key, key
        try:
            yield self
        finally:
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

    def wrap(self, linear) -> None:
        """Route ``linear``'s forward through the splittable function (the module is otherwise unchanged)."""
        store = self

        class SplitLinear(Function):
            @staticmethod
            def forward(ctx, x, w, b):
                xd, wd = x.data, w.data
                k, n = wd.shape
                x2 = xd.reshape(-1, k)
                y = (x2 @ wd).reshape(xd.shape[:-1] + (n,))
                if _cost._hook is not None:
                    _cost.charge("matmul", 2 * x2.shape[0] * k * n, xd.nbytes + wd.nbytes + y.nbytes, y.dtype)
                if b is not None:
                    y = y + b.data
                    if _cost._hook is not None:
                        _cost.charge("add", y.size, 3 * y.nbytes, y.dtype)
                ctx.save_for_backward(x2, wd, b)
                return y

            @staticmethod
            def backward(ctx, g):
                x2, wd, b = ctx.saved_tensors
                k, n = wd.shape
                g2 = g.data.reshape(-1, n)
                rows = g2.shape[0]
                if _cost._hook is not None:
                    _cost.charge("matmul.backward_input", 2 * rows * k * n, g2.nbytes + wd.nbytes + x2.nbytes, g2.dtype)
                gx = (g2 @ wd.T).reshape(g.shape[:-1] + (k,))
                gdata = g.data

                def weight_grads():
                    if _cost._hook is not None:
                        _cost.charge("matmul.backward_weight", 2 * rows * k * n,
                                     g2.nbytes + x2.nbytes + wd.nbytes, g2.dtype)
                    gw = x2.T @ g2
                    gb = unbroadcast(gdata, (n,)) if b is not None else None
                    return gw, gb

                if store.key is None:
                    gw, gb = weight_grads()
                    return gx, gw, gb

                def deferred():
                    gw, gb = weight_grads()
                    _accumulate(linear.weight, gw)
                    if gb is not None:
                        _accumulate(linear.bias, gb)

                store.pending.setdefault(store.key, []).append((deferred, (x2, g2)))
                return gx, None, None

        def forward(x):
            if x.shape[-1] != linear.in_features:
                raise ValueError(f"Linear: input has last dimension {x.shape[-1]}, expected in_features="
                                 f"{linear.in_features} (input shape {tuple(x.shape)})")
            return SplitLinear.apply(x, linear.weight, linear.bias)

        object.__setattr__(linear, "forward", forward)
