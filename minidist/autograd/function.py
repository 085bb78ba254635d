"""Custom differentiable functions with a hand-written backward (torch's ``autograd.Function``).

A ``Function`` pairs a forward with its adjoint. The forward runs with recording off; the
backward may run any numpy or communication code. Tensor parallelism builds its conjugate
operators this way (chapter 15): *f* is the identity forward with an all-reduce backward, *g*
the all-reduce forward with an identity backward.

    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g
    y = Square.apply(x)

``backward`` receives one gradient per output as a ``Tensor`` (zeros for unused outputs) and
returns one gradient per forward argument (None for non-tensors or when not needed), as a tensor,
array or None. The gradients it receives are its own writable copies, so it may reduce them in
place (``all_reduce(g.data)``) without corrupting another tensor's gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import grad_mode as _gm
from minidist.autograd.engine import Slot
from minidist.autograd.tensor import Tensor, _const, _new, unbroadcast


class FunctionCtx:
    """Scratch space shared by one call's forward and backward."""

    def __init__(self) -> None:
        self.saved_tensors: tuple = ()
        self.needs_input_grad: tuple[bool, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors


def _data(x: Any, op: str) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.data
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{op}.forward must return tensors or arrays, got {type(x).__name__}")


def attach_outputs(datas: list[np.ndarray], parents: tuple, backward_all: Any, op: str) -> list[Tensor]:
    """Create recorded outputs for a node with several outputs.

    A hidden node collects one gradient per output (``Slot``s) and calls ``backward_all(grads)``
    once, with ``None`` for outputs that received no gradient.
    """
    n = len(datas)
    hidden = _new(None, parents, backward_all, op)  # type: ignore[arg-type]
    outs = []
    for i, d in enumerate(datas):
        outs.append(_new(d, (hidden,), lambda g, i=i: (Slot(i, n, g),), op))
    return outs


class Function:
    """Subclass with ``@staticmethod forward(ctx, *args)`` and ``backward(ctx, *grads)``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any) -> Any:
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        previous = _gm.set_grad_enabled(False)
        try:
            result = cls.forward(ctx, *args)
        finally:
            _gm.set_grad_enabled(previous)
        single = not isinstance(result, tuple)
        datas = [_data(r, cls.__name__) for r in ((result,) if single else result)]
        if not (_gm._enabled and any(ctx.needs_input_grad)):
            outs = [_const(d) for d in datas]
            return outs[0] if single else tuple(outs)

        positions = [i for i, need in enumerate(ctx.needs_input_grad) if need]
        parents = tuple(args[i] for i in positions)
        name = cls.__name__

        def run(grads: list) -> tuple:
            # private writable copies: a backward may all-reduce its gradient in place
            gs = [_const(np.zeros(d.shape, dtype=d.dtype, like=d) if g is None else
                         np.asanyarray(g).astype(d.dtype, copy=True)) for g, d in zip(grads, datas)]
            previous = _gm.set_grad_enabled(False)  # a backward is not itself differentiated
            try:
                out = cls.backward(ctx, *gs)
            finally:
                _gm.set_grad_enabled(previous)
            out = out if isinstance(out, tuple) else (out,)
            if len(out) < len(args):
                raise ValueError(f"{name}.backward returned {len(out)} gradients for {len(args)} forward arguments")
            result = []
            for i in positions:
                g = out[i]
                if g is None:
                    result.append(None)
                    continue
                g = g.data if isinstance(g, Tensor) else np.asanyarray(g)
                shape = args[i].shape
                if g.shape != shape:
                    try:
                        g = unbroadcast(np.broadcast_to(g, np.broadcast_shapes(g.shape, shape)), shape)
                    except ValueError:
                        raise ValueError(f"{name}.backward: gradient of shape {g.shape} for argument {i} "
                                         f"of shape {shape}") from None
                result.append(g.astype(args[i].dtype, copy=False))
            return tuple(result)

        if single:
            return _new(datas[0], parents, lambda g: run([g]), name)
        return tuple(attach_outputs(datas, parents, run, name))
