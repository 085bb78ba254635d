"""Recomputation (activation checkpointing, chapter 21, lab 14): trade one extra forward for memory.

``checkpoint(fn, *args)`` runs ``fn`` with recording off, so none of its intermediate
activations are kept: only the inputs survive. When the backward reaches the result, ``fn`` is
run again with recording on, from the same inputs, and the gradient is backpropagated through
that fresh graph. Because the recomputation repeats the same numpy operations on the same
arrays, the gradients are bitwise equal to those of the plain run.

Randomness must replay too. The default generator (``minidist.autograd.random``, used by
``dropout`` when ``rng`` is None) is saved before the forward and restored for the recomputation
(and put back afterwards). Dropout driven by an integer seed replays by construction. A numpy
``Generator`` passed explicitly is *not* replayed: pass seeds instead.

Unlike torch's reentrant checkpoint, the inputs need not require grad: the parameters used
inside ``fn`` still get their gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minidist.autograd import grad_mode as _gm
from minidist.autograd import random as _random
from minidist.autograd.engine import run_backward
from minidist.autograd.function import attach_outputs
from minidist.autograd.tensor import Tensor, _new


def checkpoint(fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` without storing its activations; they are recomputed during backward.

    Only tensors among the positional ``args`` receive gradients (keyword arguments are passed
    through unchanged, e.g. flags or seeds).
    """
    rng_state = _random.get_rng_state() if preserve_rng_state else None
    previous = _gm.set_grad_enabled(False)
    try:
        result = fn(*args, **kwargs)
    finally:
        _gm.set_grad_enabled(previous)
    if not _gm._enabled:
        return result
    single = isinstance(result, Tensor)
    outs = (result,) if single else tuple(result)
    if not all(isinstance(o, Tensor) for o in outs):
        raise TypeError("checkpoint: fn must return a tensor or a tuple of tensors")
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]
    parents = tuple(args[i] for i in positions)

    def recompute(grads: list) -> tuple:
        inputs = [Tensor(a.data, requires_grad=a.requires_grad) if isinstance(a, Tensor) else a for a in args]
        saved = None
        if rng_state is not None:
            saved = _random.get_rng_state()
            _random.set_rng_state(rng_state)
        try:
            with _gm.enable_grad():
                again = fn(*inputs, **kwargs)
        finally:
            if saved is not None:
                _random.set_rng_state(saved)
        again = (again,) if single else tuple(again)
        roots, seeds = [], []
        for o, g in zip(again, grads):
            if g is not None and o.requires_grad:
                roots.append(o)
                seeds.append(g)
        if roots:
            run_backward(roots, seeds)
        return tuple(inputs[i].grad for i in positions)

    if single:
        return _new(result.data, parents, lambda g: recompute([g]), "checkpoint")
    return tuple(attach_outputs([o.data for o in outs], parents, recompute, "checkpoint"))
