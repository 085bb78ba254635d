"""Backward: the chain rule applied as reverse accumulation over the recorded DAG.

Two passes, both iterative (a 10,000-op chain must not hit Python's recursion limit):

1. From the roots, count for every reachable tensor how many recorded uses it has (its
   consumers in this graph).
2. Process tensors whose consumers are all done. Processing a tensor means: its gradient is now
   complete (the sum over all its uses), so run its hooks, then its ``_backward`` closure, and add
   each parent's share into that parent's pending sum. A leaf whose last consumer has been
   processed is *final*: it is accumulated into ``.grad`` at once and its post-accumulate hooks
   fire immediately, while the rest of the backward still runs (this is what lets data
   parallelism overlap the gradient all-reduce of late layers with the backward of early ones).

``Tensor.backward`` is defined here and attached to the class (tensor.py holds the data structure
only). Gradients from closures are ndarrays, or ``Partial`` contributions that touch only part of a
parent (slices, gathered rows, one output of a multi-output op): they are scattered into one
buffer instead of materialising a zero-padded array per use.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Sequence
from typing import Any

import numpy as np

from minidist.autograd.tensor import Tensor


class Partial:
    """A gradient contribution to ``parent[index]`` (``add_at``: indices may repeat)."""

    __slots__ = ("index", "value", "add_at")

    def __init__(self, index: Any, value: np.ndarray, add_at: bool = False) -> None:
        self.index, self.value, self.add_at = index, value, add_at

    def add_into(self, buf: np.ndarray) -> None:
        if self.add_at:
            scatter_add(buf, self.index, self.value)
        else:
            buf[self.index] += self.value


def scatter_add(buf: np.ndarray, index: Any, value: np.ndarray) -> None:
    """``buf[index] += value`` where the indices may repeat (numpy's ``add.at``).

    Rows picked by one integer array (an embedding lookup) are scattered element by element into
    the flattened buffer instead: numpy's ``add.at`` is about three times faster on 1-D operands,
    and every element still receives its contributions in the same order, so the sums are the same.
    """
    if (index.__class__ is np.ndarray and buf.__class__ is np.ndarray and index.dtype.kind in "iu" and buf.ndim > 1
            and buf.flags.c_contiguous
            and value.shape == index.shape + buf.shape[1:]):
        row = buf[0].size
        flat = (index.reshape(-1, 1) * row + np.arange(row)).reshape(-1)
        np.add.at(buf.reshape(-1), flat, value.reshape(-1))
    else:
        np.add.at(buf, index, value)


class Slot:
    """The gradient of output ``i`` of a multi-output node (whose pending gradient is a list)."""

    __slots__ = ("i", "n", "value")

    def __init__(self, i: int, n: int, value: np.ndarray) -> None:
        self.i, self.n, self.value = i, n, value


def _refcount_baseline() -> int:
    entry = [np.empty(1), False]
    g, _owned = entry
    return sys.getrefcount(g)  # entry, g and the argument: 3 on CPython 3.10-3.13


# Adopting a gradient relies on exact reference counts (as numpy's temporary elision does). The
# free-threaded build defers counts and CPython 3.14 borrows some references, so elsewhere every
# possibly shared gradient is simply copied.
_EXACT_REFCOUNT = (sys.implementation.name == "cpython" and sys.version_info < (3, 14)
                   and not sysconfig.get_config_var("Py_GIL_DISABLED") and _refcount_baseline() == 3)


def _freed(_g: Any) -> tuple:
    raise RuntimeError("trying to backward through the graph a second time (or after its buffers were freed); "
                       "pass retain_graph=True to the first backward if you need to")


def _add(entry: list | None, g: Any, t: Tensor) -> list:
    """Add contribution ``g`` into the pending gradient ``entry = [array, owned]`` of ``t``."""
    if isinstance(g, np.ndarray):  # a shape-only array too (shape_only.py)
        if entry is None:
            return [g, False]  # borrowed: may alias another tensor's gradient, so never written in place
        acc, owned = entry
        if owned:
            np.add(acc, g, out=acc)
        else:
            entry[0], entry[1] = acc + g, True
        return entry
    if g.__class__ is Partial:
        if entry is None:
            buf = np.zeros_like(t.data, order="C")  # C order as np.zeros; shape-only data gives a shape-only buffer
            entry = [buf, True]
        elif not entry[1]:
            entry[0], entry[1] = entry[0].astype(t.data.dtype, copy=True), True
        g.add_into(entry[0])
        return entry
    if g.__class__ is Slot:
        if entry is None:
            entry = [[None] * g.n, True]
        slots = entry[0]
        slots[g.i] = g.value if slots[g.i] is None else slots[g.i] + g.value
        return entry
    return _add(entry, np.asanyarray(g), t)  # e.g. a numpy scalar from a reduction


def _run_hooks(t: Tensor, g: np.ndarray) -> np.ndarray:
    for hook in list(t._hooks):
        out = hook(g)
        if out is not None:
            g = out.data if isinstance(out, Tensor) else np.asanyarray(out)
    return g


def _finalize_leaf(t: Tensor, entry: list | None) -> None:
    if entry is None:
        return
    g, owned = entry
    if t._hooks:
        g, owned = _run_hooks(t, g), False
    if g.shape != t.data.shape or g.dtype != t.data.dtype:
        g, owned = np.broadcast_to(g, t.data.shape).astype(t.data.dtype), True
    if t.grad is None:
        # .grad must be memory nobody else can reach, so that later accumulation can be in place.
        # A fresh result (referenced only here: entry, g and getrefcount's argument; or a reshaped
        # view whose whole base only it references) is adopted; a possibly shared one is copied.
        private = owned and g.base is None
        if not private and _EXACT_REFCOUNT and g.flags.writeable and sys.getrefcount(g) <= 3:
            base = g.base
            private = base is None or (base.__class__ is np.ndarray and base.base is None
                                       and base.size == g.size and sys.getrefcount(base) <= 3)
            base = None
        t.grad = g if private else g.copy(order="K")
    else:
        t.grad += g
    if t._post_hooks:
        for hook in list(t._post_hooks):
            hook(t)


def backward(self: Tensor, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

    ``grad`` is the gradient flowing into ``self`` (required unless ``self`` has one element).
    The recorded graph is freed afterwards unless ``retain_graph=True``.
    """
    run_backward((self,), (grad,), retain_graph=retain_graph)


# A method of Tensor defined here, beside the traversal it starts: tensor.py is below this module and does
# not import it (as the operators are attached by ops.py).
Tensor.backward = backward


def run_backward(roots: Sequence[Tensor], grads: Sequence[Any], retain_graph: bool = False) -> None:
    """Backpropagate ``grads`` (None = ones for one-element roots) from ``roots`` to every leaf."""
    pending: dict[int, list] = {}
    for r, g in zip(roots, grads):
        if not isinstance(r, Tensor) or not r.requires_grad:
            raise RuntimeError("backward: tensor does not require grad and has no grad_fn "
                               "(was it computed under no_grad, or from inputs without requires_grad?)")
        if g is None:
            if r.data.size != 1:
                raise RuntimeError(f"backward: grad can be implicitly created only for scalar outputs; this output "
                                   f"has shape {r.shape}, so pass grad= with that shape")
            g = np.ones(r.data.shape, dtype=r.data.dtype)
        else:
            g = np.asanyarray(g.data if isinstance(g, Tensor) else g, dtype=r.data.dtype)
            if g.shape != r.data.shape:
                raise ValueError(f"backward: grad has shape {g.shape} but the output has shape {r.shape}")
        pending[id(r)] = _add(pending.get(id(r)), g, r)

    # pass 1: count recorded uses of every tensor reachable from the roots
    uses: dict[int, int] = {}
    stack = []
    for r in roots:
        if id(r) not in uses:
            uses[id(r)] = 0
            stack.append(r)
    while stack:
        t = stack.pop()
        for p in t._parents:
            if p.requires_grad:
                k = id(p)
                if k in uses:
                    uses[k] += 1
                else:
                    uses[k] = 1
                    if p._backward is not None:
                        stack.append(p)

    # pass 2: process tensors whose every use has contributed its gradient
    ready = []
    seen_roots = set()
    for r in roots:
        if uses[id(r)] == 0 and id(r) not in seen_roots:
            seen_roots.add(id(r))
            ready.append(r)
    while ready:
        t = ready.pop()
        entry = pending.pop(id(t), None)
        if t._backward is None:  # a root that is itself a leaf
            _finalize_leaf(t, entry)
            continue
        g = None if entry is None else entry[0]
        if g is not None and t._hooks:
            g = _run_hooks(t, g)
        if g is not None and t._retains_grad:
            t.grad = g.copy(order="K") if t.grad is None else t.grad + g
        parents = t._parents
        if g is not None:
            pgrads = t._backward(g)
        else:
            pgrads = (None,) * len(parents)
        if not retain_graph:
            t._backward = _freed
            t._parents = ()
        finished = []
        for p, pg in zip(parents, pgrads):
            if not p.requires_grad:
                continue
            k = id(p)
            if pg is not None:
                pending[k] = _add(pending.get(k), pg, p)
            n = uses[k] - 1
            uses[k] = n
            if n == 0:
                if p._backward is None:
                    finished.append((p, pending.pop(k, None)))
                else:
                    ready.append(p)
        # drop this node's references to its gradients first, so a fresh one can be adopted as .grad
        g = entry = pgrads = pg = None
        finished.reverse()
        while finished:
            p, e = finished.pop()
            _finalize_leaf(p, e)
            p = e = None
